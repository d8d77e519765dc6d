"""pslab's runner for training scripts written as Paddle's distributed unit-test scripts are
(fluid 1.x's ``dist_*.py`` and their harness): a script subclasses `TestDistRunnerBase`, defines
``get_model(batch_size)`` returning ``(test_program, avg_cost, train_reader, test_reader,
batch_acc, predict)`` built in the default programs, and ends with
``runtime_main(TheRunner)``. It imports only what a fluid script would (``import
runtime.paddle as paddle``, ``import runtime.paddle.fluid as fluid``).

Each process runs the script with its role in argv:

    --role local                       train alone on whole batches
    --role pserver --endpoints A,B --current_endpoint A --trainers 2
    --role trainer --endpoints A,B --trainer_id 0 --trainers 2

common: ``--steps N`` (5), ``--batch_size B`` (8), ``--out FILE`` (default: stdout),
``--params DIR`` (after training, a local run saves its parameters there and a pserver every
persistable var it holds: its blocks of the parameters, one ``.npy`` each).

A trainer or a local run writes one JSON line per step, ``{"step": i, "loss": x}`` (and
``"acc"`` where the model has a batch accuracy). The reader yields batches of B examples; the
local run trains on each whole batch, trainer t on the examples at positions t, t+T, ... of it
(T trainers), so in sync mode the mean of the trainers' losses at a step is the local loss at
that step (B a multiple of T). A pserver serves until its trainers are done and writes nothing.

Security: no keys are set up here; the executor runs unauthenticated on loopback endpoints and
warns (`runtime.services.paddle_compat.key_directory`); a caller may set ``PSLAB_KEYS``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Iterator, Sequence, TextIO

import runtime.paddle as paddle  # noqa: F401  (a fluid script's imports)
import runtime.paddle.fluid as fluid

RUN_STEP = 5
DEFAULT_BATCH_SIZE = 8
SEED = 1
"""The random seed of the main and startup programs, the same in every process."""

Model = tuple[Any, Any, Callable[[], Iterator[Any]], Any, Any, Any]
"""What `TestDistRunnerBase.get_model` returns: (test_program, avg_cost, train_reader,
test_reader, batch_acc, predict); train_reader is a reader of batches (lists of samples)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="run a dist_*.py model as one node")
    parser.add_argument("--role", choices=("local", "pserver", "trainer"), default="local")
    parser.add_argument("--endpoints", default="", help="every pserver's ip:port, comma-separated")
    parser.add_argument("--current_endpoint", default="", help="a pserver's own ip:port")
    parser.add_argument("--trainer_id", type=int, default=0)
    parser.add_argument("--trainers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=RUN_STEP)
    parser.add_argument("--batch_size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--out", default="", help="write the JSON lines here (default: stdout)")
    parser.add_argument("--params", default="", help="save the parameters here after training "
                                                     "(a local run or a pserver)")
    args = parser.parse_args(argv)
    if args.role != "local" and not args.endpoints:
        parser.error(f"--role {args.role} needs --endpoints")
    if args.role == "pserver" and not args.current_endpoint:
        parser.error("--role pserver needs --current_endpoint")
    if not 0 <= args.trainer_id < args.trainers:
        parser.error(f"--trainer_id {args.trainer_id} is not one of {args.trainers} trainers")
    return args


class TestDistRunnerBase:
    """One model run as a local trainer, a pserver or a trainer of a 2x2 job (`run_local`,
    `run_pserver`, `run_trainer`); subclasses define `get_model`."""

    def get_model(self, batch_size: int = DEFAULT_BATCH_SIZE) -> Model:
        raise NotImplementedError("get_model is the model script's")

    def build(self, batch_size: int) -> Model:
        """The model in the default programs, seeded alike in every process."""
        fluid.default_main_program().random_seed = SEED
        fluid.default_startup_program().random_seed = SEED
        return self.get_model(batch_size)

    @staticmethod
    def get_transpiler(args: argparse.Namespace) -> Any:
        t = fluid.DistributeTranspiler()
        t.transpile(args.trainer_id, program=fluid.default_main_program(),
                    pservers=args.endpoints, trainers=args.trainers, sync_mode=True,
                    startup_program=fluid.default_startup_program())
        return t

    def run_pserver(self, args: argparse.Namespace) -> None:
        self.build(args.batch_size)
        t = self.get_transpiler(args)
        pserver_prog = t.get_pserver_program(args.current_endpoint)
        startup_prog = t.get_startup_program(args.current_endpoint, pserver_prog)
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(startup_prog)
        exe.run(pserver_prog)  # until every trainer is done
        if args.params:
            fluid.io.save_persistables(exe, args.params, pserver_prog)

    def run_trainer(self, args: argparse.Namespace, out: TextIO) -> None:
        _, avg_cost, train_reader, _, batch_acc, _ = self.build(args.batch_size)
        t = self.get_transpiler(args)
        self.train(t.get_trainer_program(), avg_cost, train_reader, batch_acc, args, out)

    def run_local(self, args: argparse.Namespace, out: TextIO) -> None:
        _, avg_cost, train_reader, _, batch_acc, _ = self.build(args.batch_size)
        self.train(fluid.default_main_program(), avg_cost, train_reader, batch_acc, args, out)

    def train(self, program: Any, avg_cost: Any, train_reader: Callable[[], Iterator[Any]],
              batch_acc: Any, args: argparse.Namespace, out: TextIO) -> None:
        """Startup, then `args.steps` steps on this node's share of each batch."""
        exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fluid.default_startup_program())
        feed_vars = [v for v in program.global_block().vars.values() if v.is_data]
        feeder = fluid.DataFeeder(feed_vars, fluid.CPUPlace(), program=program)
        fetch = [avg_cost] + ([batch_acc] if batch_acc is not None else [])
        batches = train_reader()
        for step in range(args.steps):
            batch = next(batches)
            share = batch[args.trainer_id::args.trainers] if args.role == "trainer" else batch
            values = exe.run(program, feed=feeder.feed(share), fetch_list=fetch)
            record = {"step": step, "loss": float(values[0].reshape(-1)[0])}
            if batch_acc is not None:
                record["acc"] = float(values[1].reshape(-1)[0])
            out.write(json.dumps(record) + "\n")
            out.flush()
        if args.params and args.role == "local":
            fluid.io.save_params(exe, args.params, program)
        exe.close()


def runtime_main(runner_class: type[TestDistRunnerBase],
                 argv: Sequence[str] | None = None) -> None:
    """Run `runner_class`'s model in the role argv names."""
    args = parse_args(argv)
    runner = runner_class()
    if args.role == "pserver":
        runner.run_pserver(args)
        return
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        if args.role == "trainer":
            runner.run_trainer(args, out)
        else:
            runner.run_local(args, out)
    finally:
        if out is not sys.stdout:
            out.close()
