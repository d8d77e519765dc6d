"""Paddle 2.x's names (``import runtime.paddle as paddle``, ``from runtime.paddle import
base``) build fluid's programs, and the distribute transpiler reached through
``paddle.distributed.transpiler`` writes the 2.x programs (docs/transpiler.md §9): trainer
0 of 2, pservers 127.0.0.1:6174 and :6175, sync; an fc(1000) on a 1000-wide input, square
error, and its variants (a large minimum block, no slicing, LR schedules, Momentum with L2
weight decay, RMSProp, one parameter), and the lookup-table model with a distributed
`shared_w`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import runtime.paddle as paddle
from runtime.paddle import base
from transpiler.distribute.config import PADDLE_VERSION_ENV
from transpiler.ir import Block, Program

PS1, PS2 = "127.0.0.1:6174", "127.0.0.1:6175"
Optimizer = Callable[[], object]


@pytest.fixture(autouse=True)
def _no_version_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(PADDLE_VERSION_ENV, raising=False)
    monkeypatch.delenv("PADDLE_ENABLE_REMOTE_PREFETCH", raising=False)
    yield


def ops(block: Block) -> list[str]:
    return [op.type for op in block.ops]


def regression(optimizer: Optimizer, bias: bool = True) -> Callable[[], None]:
    """x [-1, 1000] -> fc(1000) named fc_w (and fc_b) -> square error against y -> mean."""
    def body() -> None:
        x = paddle.static.data(name="x", shape=[-1, 1000], dtype="float32")
        y_hat = paddle.static.nn.fc(x, size=1000, weight_attr=base.ParamAttr(name="fc_w"),
                                    bias_attr=base.ParamAttr(name="fc_b") if bias else False)
        y = paddle.static.data(name="y", shape=[-1, 1], dtype="float32")
        loss = paddle.mean(paddle.nn.functional.square_error_cost(input=y_hat, label=y))
        optimizer().minimize(loss)  # type: ignore[attr-defined]
    return body


def tables() -> None:
    """title and brand ids in the distributed `shared_w` [1000, 64], profile ids in a sparse
    `profile_emb`; each averaged per sequence, concat, fc(2), cross entropy, Adam."""
    def pooled(ids: object, table: str, distributed: bool) -> object:
        emb = paddle.static.nn.embedding(input=ids, size=[1000, 64], param_attr=table,
                                         is_sparse=True, is_distributed=distributed)
        return paddle.static.nn.sequence_lod.sequence_pool(input=emb, pool_type="average")
    slots = [paddle.static.data(name=n, shape=[-1, 1], dtype="int64")
             for n in ("title_ids", "brand_ids", "profile_ids")]
    features = paddle.concat([pooled(slots[0], "shared_w", True),
                              pooled(slots[1], "shared_w", True),
                              pooled(slots[2], "profile_emb", False)], axis=1)
    predict = paddle.static.nn.fc(x=features, size=2, weight_attr=base.ParamAttr(name="fc_w"),
                                  bias_attr=base.ParamAttr(name="fc_b"))
    label = paddle.static.data(name="label", shape=[-1, 1], dtype="int64")
    cost = paddle.nn.functional.cross_entropy(input=predict, label=label, reduction="none",
                                              use_softmax=False)
    paddle.optimizer.Adam(learning_rate=0.003).minimize(paddle.mean(cost))


def transpile(body: Callable[[], None], config: object = None, sync: bool = True,
              ) -> tuple[object, Program, Program]:
    """(transpiler, main, startup) of `body` built under 2.x's names and transpiled."""
    main, startup = base.Program(), base.Program()
    with base.unique_name.guard(), base.program_guard(main, startup):
        paddle.seed(1)
        body()
    t = paddle.distributed.transpiler.DistributeTranspiler(config=config)
    t.transpile(0, program=main, pservers=f"{PS1},{PS2}", trainers=2, sync_mode=sync,
                startup_program=startup)
    return t, main, startup


def sgd() -> object:
    return paddle.optimizer.SGD(learning_rate=0.1)


def test_the_2x_modules_are_fluids_names() -> None:
    assert base is paddle.fluid and importlib.import_module("runtime.paddle.base") is base
    module = importlib.import_module("runtime.paddle.distributed.transpiler")
    assert module.DistributeTranspiler is paddle.distributed.transpiler.DistributeTranspiler
    assert importlib.import_module("runtime.paddle.optimizer.lr") is paddle.optimizer.lr
    assert paddle.distributed.transpiler.DistributeTranspilerConfig().paddle_version == "2.x"
    assert base.DistributeTranspilerConfig().paddle_version == "1.8"


def test_the_version_of_a_2x_config_still_comes_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PADDLE_VERSION_ENV, "1.8")
    assert paddle.distributed.transpiler.DistributeTranspilerConfig().paddle_version == "1.8"


def test_static_data_keeps_its_shape_and_seed_sets_the_programs() -> None:
    main, startup = base.Program(), base.Program()
    with base.program_guard(main, startup):
        x = paddle.static.data(name="x", shape=[None, 3], dtype="float32")
        assert paddle.seed(7) == 7
    assert x.shape == (-1, 3) and main.random_seed == startup.random_seed == 7


def test_the_basic_model_splits_fc_w_over_both_pservers() -> None:
    t, main, startup = transpile(regression(sgd))
    assert ops(startup.global_block()) == ["fill_constant", "fill_constant", "uniform_random",
                                           "recv", "recv", "fetch_barrier", "concat"]
    assert {"fc_w.block0", "fc_w.block1", "fc_w", "fc_b"} <= set(startup.global_block().vars)
    assert ops(t.get_trainer_program(wait_port=False).global_block()) == [  # type: ignore[attr-defined]
        "mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant",
        "mean_grad", "square_grad", "elementwise_sub_grad", "elementwise_add_grad", "send",
        "mul_grad", "split_byref", "send", "send_barrier", "recv", "recv", "fetch_barrier",
        "concat"]
    ps = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    ps_startup = t.get_startup_program(PS1, ps)  # type: ignore[attr-defined]
    assert len(ps.blocks) == 3 and ops(ps.blocks[0]) == ["listen_and_serv"]
    assert ops(ps.blocks[1]) == ["sum", "scale", "sgd"]
    assert ops(ps_startup.global_block()) == ["fill_constant", "fill_constant", "uniform_random"]
    assert ps_startup.global_block().var("fc_w.block1").shape == (500, 1000)


def test_a_large_min_block_size_keeps_fc_w_whole() -> None:
    config = paddle.distributed.transpiler.DistributeTranspilerConfig()
    config.min_block_size = 1048576
    t, _, _ = transpile(regression(sgd), config)
    assert ops(t.get_trainer_program(wait_port=False).global_block())[-6:] == [  # type: ignore[attr-defined]
        "mul_grad", "send", "send_barrier", "recv", "recv", "fetch_barrier"]
    ps1 = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    assert len(ps1.blocks) == 2 and ops(ps1.blocks[1]) == ["sum", "scale", "sgd"]
    ps2 = t.get_pserver_program(PS2)  # type: ignore[attr-defined]
    assert t.get_startup_program(PS2, ps2).global_block().var("fc_w").shape == (1000, 1000)  # type: ignore[attr-defined]


def test_exponential_decay_is_the_pservers_lr_block() -> None:
    t, _, _ = transpile(regression(lambda: paddle.optimizer.SGD(
        learning_rate=paddle.optimizer.lr.ExponentialDecay(learning_rate=1.0, gamma=0.1))))
    ps = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    assert len(ps.blocks) == 4
    assert ops(ps.blocks[1]) == ["increment", "cast", "fill_constant", "elementwise_div",
                                 "floor", "fill_constant", "elementwise_pow", "fill_constant",
                                 "elementwise_mul"]


def test_a_scheduler_still_steps_in_python() -> None:
    decay = paddle.optimizer.lr.ExponentialDecay(learning_rate=1.0, gamma=0.5)
    decay.step()
    decay.step()
    assert decay.last_epoch == 2 and decay() == pytest.approx(0.25)
    assert paddle.optimizer.SGD(learning_rate=decay).get_lr() == pytest.approx(0.25)


CASE = ["fill_constant", "fill_constant", "less_than", "logical_not", "logical_and",
        "logical_and", "conditional_block"]


def test_piecewise_decay_gives_each_case_its_own_block() -> None:
    t, _, _ = transpile(regression(lambda: paddle.optimizer.SGD(
        learning_rate=paddle.optimizer.lr.piecewise_decay([10000, 20000], [1.0, 0.5, 1.0]))))
    ps = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    assert len(ps.blocks) == 7
    assert ops(ps.blocks[1]) == (["increment", "cast", "fill_constant", "fill_constant",
                                  "less_than", "logical_not", "conditional_block"] + CASE
                                 + ["fill_constant", "conditional_block"])
    served = {b.idx for b in ps.blocks[0].ops[0].attr("optimize_blocks")}
    assert all(ops(b) == ["assign"] for b in ps.blocks if b.idx and b.idx not in served)


def test_momentum_with_weight_decay_and_piecewise_decay() -> None:
    bounds = [1, 10, 20, 30]
    t, _, _ = transpile(regression(lambda: paddle.optimizer.Momentum(
        learning_rate=paddle.optimizer.lr.piecewise_decay(
            boundaries=bounds, values=[0.1 ** i for i in range(len(bounds) + 1)]),
        momentum=0.9, weight_decay=paddle.regularizer.L2Decay(1e-4))))
    ps = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    assert len(ps.blocks) == 9
    assert ops(ps.blocks[1]).count("conditional_block") == 5
    assert ops(ps.blocks[7]) == ops(ps.blocks[8]) == ["sum", "scale", "scale", "sum", "momentum"]


def test_rmsprop_splits_its_moment_with_fc_w() -> None:
    t, _, _ = transpile(regression(lambda: paddle.optimizer.RMSProp(learning_rate=0.1)))
    ps = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    assert len(ps.blocks) == 3 and ops(ps.blocks[1]) == ["sum", "scale", "rmsprop"]
    startup = t.get_startup_program(PS1, ps).global_block()  # type: ignore[attr-defined]
    assert startup.var("fc_w.block1").shape == startup.var("momentum_1").shape == (500, 1000)


def test_a_pserver_without_parameters_keeps_an_empty_optimize_block() -> None:
    config = paddle.distributed.transpiler.DistributeTranspilerConfig()
    config.slice_var_up = False
    t, _, _ = transpile(regression(lambda: paddle.optimizer.SGD(learning_rate=1.0),
                                   bias=False), config)
    ps = t.get_pserver_program(PS2)  # type: ignore[attr-defined]
    assert len(ps.blocks) == 2 and ps.blocks[1].ops == []


@pytest.mark.parametrize("version, lookup", [("2.x", "lookup_sparse_table_read"),
                                             ("1.8", "lookup_sparse_table")])
def test_the_table_pserver_names_its_prefetch_op_as_the_release_did(version: str,
                                                                    lookup: str) -> None:
    config = paddle.distributed.transpiler.DistributeTranspilerConfig(paddle_version=version)
    t, _, _ = transpile(tables, config)
    ps = t.get_pserver_program(PS1)  # type: ignore[attr-defined]
    assert [ops(b) for b in ps.blocks] == [
        ["listen_and_serv"], ["sum", "scale", "adam", "scale", "scale"],
        ["sum", "scale", "adam", "scale", "scale"], ["sum", "sgd"], [lookup], ["save"]]
    assert ps.global_block().var(t.table_name).shape[0] == math.ceil(1000 / 2)  # type: ignore[attr-defined]
    trainer = t.get_trainer_program(wait_port=False)  # type: ignore[attr-defined]
    assert trainer._is_distributed and trainer._is_chief
    assert trainer._distributed_lookup_table == "shared_w"
    assert trainer._endpoints == [PS1, PS2]


def test_the_numpy_and_timing_backends_run_the_2x_prefetch_op() -> None:
    from runtime.execution.kernels import registry
    assert "lookup_sparse_table_read" in registry.registered_ops("phantom")
    assert registry.get_kernel("lookup_sparse_table_read") is \
        registry.get_kernel("lookup_sparse_table")


def test_a_2x_program_trains_on_the_executor() -> None:
    """fc(1) on 4 features with 2.x's names, a decaying learning rate, float weight decay and
    a value clip: five steps of `base.Executor` lower the loss every step."""
    main, startup = base.Program(), base.Program()
    with base.unique_name.guard(), base.program_guard(main, startup):
        paddle.seed(3)
        x = paddle.static.data(name="x", shape=[-1, 4], dtype="float32")
        y = paddle.static.data(name="y", shape=[-1, 1], dtype="float32")
        h = paddle.static.nn.fc(x, size=1, weight_attr=base.ParamAttr(name="w"))
        loss = paddle.mean(paddle.nn.functional.square_error_cost(input=h, label=y))
        paddle.optimizer.SGD(learning_rate=paddle.optimizer.lr.ExponentialDecay(0.1, 0.9),
                             weight_decay=1e-4,
                             grad_clip=paddle.nn.ClipGradByValue(1.0)).minimize(loss)
    assert {"clip", "sgd", "elementwise_pow"} <= set(ops(main.global_block()))
    exe = base.Executor(base.CPUPlace())
    exe.run(startup)
    xs = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    feed = {"x": xs, "y": xs.sum(1, keepdims=True)}
    losses = [float(exe.run(main, feed=feed, fetch_list=[loss])[0][0]) for _ in range(5)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
