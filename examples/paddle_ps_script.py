"""A classic PaddlePaddle parameter-server training script, ported to pslab by changing only its
two import lines (README, "Porting a Paddle script").

An MLP (64 -> 32 relu -> 10 softmax) on the 8x8 handwritten digits, SGD. Each process is one
node, named by Paddle's environment variables:

    PADDLE_TRAINING_ROLE (or TRAINING_ROLE)   PSERVER or TRAINER; unset: train locally
    PADDLE_PSERVER_ENDPOINTS                  ip:port,ip:port (or PADDLE_PSERVERS_IP_PORT_LIST)
    PADDLE_TRAINERS_NUM                       the number of trainers
    PADDLE_TRAINER_ID                         a trainer's index
    PADDLE_CURRENT_ENDPOINT                   a pserver's own ip:port (or POD_IP and PADDLE_PORT)

Two pservers and two trainers on this host (each line in a shell of its own; on loopback the
executor runs without CurveZMQ and warns, see docs/architecture.md "Paddle scripts"):

    export PADDLE_PSERVER_ENDPOINTS=127.0.0.1:6170,127.0.0.1:6171 PADDLE_TRAINERS_NUM=2
    PADDLE_TRAINING_ROLE=PSERVER PADDLE_CURRENT_ENDPOINT=127.0.0.1:6170 python examples/paddle_ps_script.py
    PADDLE_TRAINING_ROLE=PSERVER PADDLE_CURRENT_ENDPOINT=127.0.0.1:6171 python examples/paddle_ps_script.py
    PADDLE_TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=0 python examples/paddle_ps_script.py out/params
    PADDLE_TRAINING_ROLE=TRAINER PADDLE_TRAINER_ID=1 python examples/paddle_ps_script.py

Each trainer prints its loss per step; trainer 0 saves the final parameters to the directory
given as its argument (one .npy per parameter). The trainers take turns at the batches of
BATCH_SIZE examples, so a step of the job trains on BATCH_SIZE x trainers consecutive
examples: in sync mode, the same steps as local training with that batch size.
"""

import os
import sys

import runtime.paddle as paddle  # was: import paddle
import runtime.paddle.fluid as fluid  # was: import paddle.fluid as fluid

BATCH_SIZE = 16
STEPS = 20
LEARNING_RATE = 0.1


def network():
    x = fluid.layers.data(name="x", shape=[64], dtype="float32")
    label = fluid.layers.data(name="label", shape=[1], dtype="int64")
    hidden = fluid.layers.fc(input=x, size=32, act="relu")
    prediction = fluid.layers.fc(input=hidden, size=10, act="softmax")
    cost = fluid.layers.cross_entropy(input=prediction, label=label)
    avg_cost = fluid.layers.mean(cost)
    fluid.optimizer.SGD(learning_rate=LEARNING_RATE).minimize(avg_cost)
    return x, label, avg_cost


def train_loop(exe, main_program, feed_list, avg_cost, trainer_id, trainers, save_dirname):
    place = fluid.CPUPlace()
    feeder = fluid.DataFeeder(place=place, feed_list=feed_list)
    exe.run(fluid.default_startup_program())
    train_reader = paddle.batch(paddle.dataset.digits.train(), batch_size=BATCH_SIZE)
    for batch_id, data in enumerate(train_reader()):
        step, turn = divmod(batch_id, trainers)
        if step == STEPS:
            break
        if turn != trainer_id:  # the other trainers' batches
            continue
        (loss,) = exe.run(main_program, feed=feeder.feed(data), fetch_list=[avg_cost])
        print("step %d loss %r" % (step, float(loss.reshape(-1)[0])), flush=True)
    if save_dirname and trainer_id == 0:
        fluid.io.save_params(exe, save_dirname, main_program)


def main():
    x, label, avg_cost = network()
    save_dirname = sys.argv[1] if len(sys.argv) > 1 else None
    exe = fluid.Executor(fluid.CPUPlace())
    role = os.getenv("PADDLE_TRAINING_ROLE", os.getenv("TRAINING_ROLE", ""))
    if not role:
        train_loop(exe, fluid.default_main_program(), [x, label], avg_cost, 0, 1, save_dirname)
        return
    pserver_endpoints = os.getenv("PADDLE_PSERVER_ENDPOINTS",
                                  os.getenv("PADDLE_PSERVERS_IP_PORT_LIST", ""))
    trainers = int(os.getenv("PADDLE_TRAINERS_NUM", "1"))
    trainer_id = int(os.getenv("PADDLE_TRAINER_ID", "0"))
    current_endpoint = os.getenv("PADDLE_CURRENT_ENDPOINT",
                                 "%s:%s" % (os.getenv("POD_IP", ""), os.getenv("PADDLE_PORT", "")))

    t = fluid.DistributeTranspiler()
    t.transpile(trainer_id, pservers=pserver_endpoints, trainers=trainers)
    if role == "PSERVER":
        pserver_prog = t.get_pserver_program(current_endpoint)
        pserver_startup = t.get_startup_program(current_endpoint, pserver_prog)
        exe.run(pserver_startup)
        exe.run(pserver_prog)
    elif role == "TRAINER":
        trainer_prog = t.get_trainer_program()
        train_loop(exe, trainer_prog, [x, label], avg_cost, trainer_id, trainers, save_dirname)
        exe.close()
    else:
        raise SystemExit("PADDLE_TRAINING_ROLE must be PSERVER or TRAINER, got %r" % role)


if __name__ == "__main__":
    main()
