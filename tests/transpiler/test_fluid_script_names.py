"""fluid 1.x names that fluid's distributed test scripts (``dist_mnist.py``, ``dist_word2vec.py``,
``dist_ctr.py``) and their harness (``test_dist_base.py``) reach for beyond a classic script's:
``fluid.core.LoDTensor``, ``fluid.profiler``, ``ParallelExecutor`` and ``CompiledProgram``,
``Program.clone(for_test=True)``, ``paddle.compat``, ``paddle.reader``, ``memory_optimize``,
``layers.create_tensor``. Each is checked for what it computes, exactly."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from program_helpers import build

import runtime.paddle as paddle
import runtime.paddle.fluid as fluid
from runtime.paddle import profiler
from runtime.services import paddle_compat
from transpiler.framework import ParamAttr
from transpiler.ir import Program, Var, op_types

X = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
Y = np.array([[0], [1], [2], [0], [1], [2]], dtype=np.int64)
FORWARD = ["mul", "elementwise_add", "relu", "dropout", "mul", "elementwise_add", "softmax",
           "cross_entropy2", "mean"]


def mlp() -> tuple[Program, Program, Var]:
    """x[4] -> fc(8, relu) -> dropout -> fc(3, softmax) -> cross_entropy with y -> mean, trained
    by Momentum."""
    def body() -> Var:
        x = fluid.layers.data("x", shape=[4])
        y = fluid.layers.data("y", shape=[1], dtype="int64")
        hidden = fluid.layers.dropout(fluid.layers.fc(x, size=8, act="relu"), 0.5)
        predict = fluid.layers.fc(hidden, size=3, act="softmax")
        loss = fluid.layers.mean(fluid.layers.cross_entropy(predict, y))
        fluid.optimizer.Momentum(0.1, momentum=0.9).minimize(loss)
        return loss
    return build(body, seed=1)


def started(startup: Program) -> tuple[fluid.Scope, fluid.Executor]:
    scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace())
    exe.run(startup, scope=scope)
    return scope, exe


# -- fluid.core ------------------------------------------------------------------------------------

def test_core_holds_the_places_the_scope_and_lod_tensor() -> None:
    assert fluid.core.CPUPlace is fluid.CPUPlace and fluid.core.CUDAPlace is fluid.CUDAPlace
    assert fluid.core.Scope is fluid.Scope and fluid.core.LoDTensor is fluid.LoDTensor
    assert fluid.core.is_compiled_with_cuda() in (True, False)


def test_a_lod_tensor_round_trips_its_array_and_lod() -> None:
    t = fluid.core.LoDTensor()
    t.set(np.arange(10, dtype=np.float32).reshape(5, 2), fluid.CPUPlace())
    t.set_recursive_sequence_lengths([[2, 3]])
    assert t.lod() == [[0, 2, 5]] and t.recursive_sequence_lengths() == [[2, 3]]
    assert t.shape() == [5, 2] and t.has_valid_recursive_sequence_lengths()
    np.testing.assert_array_equal(np.array(t), np.arange(10, dtype=np.float32).reshape(5, 2))
    t.set_lod([[0, 1, 5]])
    assert t.recursive_sequence_lengths() == [[1, 4]]
    with pytest.raises(ValueError, match="invalid LoD"):
        t.set_lod([[0, 2, 4]])  # 4 rows named, 5 held
    t.set(np.zeros((3, 2)), fluid.CPUPlace())  # the LoD stays, and no longer fits
    assert not t.has_valid_recursive_sequence_lengths()


def test_the_executor_takes_and_returns_lod_tensors() -> None:
    def body() -> Var:
        x = fluid.layers.data("x", shape=[2], lod_level=1)
        return fluid.layers.sequence_pool(x, "sum")
    main, _, pooled = build(body)
    t = fluid.LoDTensor()
    t.set(np.arange(10, dtype=np.float32).reshape(5, 2), fluid.CPUPlace())
    t.set_lod([[0, 2, 5]])
    fed, out = fluid.Executor().run(main, feed={"x": t}, fetch_list=["x", pooled],
                                    scope=fluid.Scope(), return_numpy=False)
    assert isinstance(fed, fluid.LoDTensor) and fed.lod() == [[0, 2, 5]]
    np.testing.assert_array_equal(np.array(out), [[2, 4], [18, 21]])


# -- fluid.profiler --------------------------------------------------------------------------------

def table(printed: str) -> dict[str, int]:
    """Op type -> calls, from the profiler's rows (in their order)."""
    rows = printed.split("Ratio.\n", 1)[1].splitlines()
    return {row.split()[0]: int(row.split()[1]) for row in rows}


def test_the_profiler_counts_every_op_each_run_ran(capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    main, startup, loss = mlp()
    scope, exe = started(startup)
    with profiler.profiler("CPU", profile_path=tmp_path / "profile"):
        for _ in range(3):
            exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss], scope=scope)
    printed = capsys.readouterr().out
    ran = op_types(main.global_block())
    # every op type, in the order of its first call, three times each of its ops
    assert table(printed) == {op: 3 * ran.count(op) for op in dict.fromkeys(ran)}
    assert re.search(r"^Event +Calls +Total +Min\. +Max\. +Ave\. +Ratio\.$", printed, re.M)
    assert (tmp_path / "profile").read_text() == printed
    assert exe._kernels_now() is exe.kernels  # stopped: the kernels run untimed again
    exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss], scope=scope)
    assert capsys.readouterr().out == ""


def test_the_profiler_sorts_resets_and_checks_its_arguments(
        capsys: pytest.CaptureFixture[str]) -> None:
    main, startup, loss = mlp()
    scope, exe = started(startup)
    profiler.start_profiler("All")
    exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss], scope=scope)
    profiler.reset_profiler()
    for _ in range(2):
        exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss], scope=scope)
    profiler.stop_profiler("calls")
    calls = table(capsys.readouterr().out)
    assert calls["momentum"] == 8 and calls["mul"] == 4 and calls["softmax"] == 2
    assert list(calls.values()) == sorted(calls.values(), reverse=True)
    profiler.stop_profiler()  # not running: nothing
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="state"):
        profiler.start_profiler("TPU")
    with pytest.raises(ValueError, match="sorted_key"):
        profiler.stop_profiler("fastest")
    with pytest.raises(ValueError, match="'kvp' or 'csv'"), profiler.cuda_profiler("out", "xml"):
        pass
    with profiler.cuda_profiler("out", "csv"):
        pass


# -- ParallelExecutor, CompiledProgram, the strategies -------------------------------------------

def three_losses(step) -> list[float]:  # type: ignore[no-untyped-def]
    return [float(np.asarray(step()[0]).reshape(-1)[0]) for _ in range(3)]


def test_parallel_executor_and_compiled_program_train_as_the_executor_does() -> None:
    main, startup, loss = mlp()
    feed = {"x": X, "y": Y}
    scope, exe = started(startup)
    alone = three_losses(lambda: exe.run(main, feed=feed, fetch_list=[loss], scope=scope))
    strategy, build_strategy = fluid.ExecutionStrategy(), fluid.BuildStrategy()
    strategy.num_threads, strategy.allow_op_delay = 1, False
    build_strategy.reduce_strategy = fluid.BuildStrategy.ReduceStrategy.Reduce
    scope, _ = started(startup)
    pe = fluid.ParallelExecutor(False, loss_name=loss.name, main_program=main, scope=scope,
                                exec_strategy=strategy, build_strategy=build_strategy)
    parallel = three_losses(lambda: pe.run([loss.name], feed=[feed]))
    scope, exe = started(startup)
    compiled = fluid.compiler.CompiledProgram(main).with_data_parallel(loss_name=loss.name)
    assert compiled is not None and fluid.CompiledProgram is fluid.compiler.CompiledProgram
    from_compiled = three_losses(lambda: exe.run(compiled, feed=feed, fetch_list=[loss],
                                                 scope=scope))
    assert alone == parallel == from_compiled and len(set(alone)) == 3
    assert pe.device_count == 1 and build_strategy.num_trainers == 1
    with pytest.raises(ValueError, match="one device"):
        pe.run([loss.name], feed=[feed, feed])
    with pytest.raises(ValueError, match="one place"):
        fluid.compiler.CompiledProgram(main).with_data_parallel(
            places=[fluid.CPUPlace(), fluid.CPUPlace()])


def test_the_strategies_hold_paddles_attributes_and_no_others() -> None:
    build_strategy, strategy = fluid.BuildStrategy(), fluid.ExecutionStrategy()
    assert build_strategy.reduce_strategy == fluid.BuildStrategy.ReduceStrategy.AllReduce == 0
    assert fluid.BuildStrategy.ReduceStrategy.Reduce == 1
    assert (build_strategy.fuse_all_reduce_ops, build_strategy.enable_inplace,
            build_strategy.memory_optimize) == (False, False, None)
    assert (strategy.num_threads, strategy.num_iteration_per_drop_scope,
            strategy.allow_op_delay) == (0, 100, False)
    with pytest.raises(AttributeError):
        build_strategy.fuse_everything = True  # type: ignore[attr-defined]


def test_an_executor_without_a_trainer_hands_rpc_programs_to_the_one_with_it() -> None:
    """test_dist_base runs the trainer's startup with one executor and its steps with a
    ParallelExecutor: the second runs them through the first's trainer."""
    scope, owner, other = fluid.Scope(), fluid.Executor(), fluid.Executor()
    assert other._trainer_owner(scope) is other
    owner._trainer = object()  # type: ignore[assignment]  # a trainer in that scope
    paddle_compat._TRAINERS[id(scope)] = owner
    try:
        assert other._trainer_owner(scope) is owner and owner._trainer_owner(scope) is owner
        assert other._trainer_owner(fluid.Scope()) is other
    finally:
        del paddle_compat._TRAINERS[id(scope)]
        owner._trainer = None


# -- Program.clone(for_test=True) -----------------------------------------------------------------

def test_clone_for_test_keeps_the_forward_pass_in_test_mode() -> None:
    main, _, loss = mlp()
    before = main.clone()
    test = main.clone(for_test=True)
    assert op_types(test.global_block()) == FORWARD
    assert [op.attr("is_test") for op in test.global_block().ops if op.type == "dropout"] == [True]
    kept = set(test.global_block().vars)
    assert {"x", "y", loss.name, "fc_0.w_0", "fc_1.b_0"} <= kept
    assert not any("@GRAD" in name or "velocity" in name for name in kept)
    assert main == before and main.clone() == before  # the original and a plain clone: unchanged
    forward, _, _ = build(lambda: fluid.layers.dropout(fluid.layers.data("x", shape=[4]), 0.5))
    kept_all = forward.clone(for_test=True)  # no backward pass: every op stays
    assert op_types(kept_all.global_block()) == ["dropout"]
    assert kept_all.global_block().ops[0].attr("is_test") is True


# -- memory_optimize, create_tensor, param_attr ---------------------------------------------------

def test_memory_optimize_and_release_memory_leave_the_program_as_it_is() -> None:
    main, _, _ = mlp()
    before = main.clone()
    fluid.memory_optimize(main, skip_grads=True)
    fluid.release_memory(main)
    assert main == before
    assert fluid.transpiler.memory_optimize is fluid.memory_optimize
    with pytest.raises(ValueError, match="opt_level"):
        fluid.memory_optimize(main, level=2)


def test_create_tensor_declares_a_var_and_param_attr_holds_param_attr() -> None:
    def body() -> tuple[Var, Var]:
        return (fluid.layers.create_tensor(dtype="int64"),
                fluid.layers.create_tensor(np.float32, name="total", persistable=True))
    main, _, (counted, total) = build(body)
    assert (counted.name, counted.dtype, counted.persistable) == ("create_tensor_0", "int64", False)
    assert (total.name, total.dtype, total.persistable) == ("total", "float32", True)
    assert main.global_block().var("total") is total
    assert fluid.param_attr.ParamAttr is fluid.ParamAttr is ParamAttr


# -- paddle.compat ---------------------------------------------------------------------------------

def test_compat_converts_text_and_rounds_halves_away_from_zero() -> None:
    cpt = paddle.compat
    assert cpt.to_text(b"loss") == "loss" and cpt.to_text("loss") == "loss"
    assert cpt.to_text([b"a", "b", None]) == ["a", "b", None]
    assert cpt.to_text({b"k": b"v"}) == {"k": "v"} and cpt.to_text({b"a"}) == {"a"}
    items = [b"x"]
    assert cpt.to_text(items, inplace=True) is items and items == ["x"]
    assert cpt.to_bytes("é") == b"\xc3\xa9" and cpt.to_bytes(["a", b"b"]) == [b"a", b"b"]
    assert cpt.to_text(3) == 3 and cpt.to_bytes(None) is None
    assert [cpt.round(v) for v in (2.5, -2.5, 0.5, 1.4, -1.6)] == [3.0, -3.0, 1.0, 1.0, -2.0]
    assert cpt.round(1.25, 1) == 1.3 and str(cpt.round(-0.0)) == "-0.0"
    assert cpt.floor_division(7, 2) == 3 and cpt.floor_division(-7, 2) == -4
    assert cpt.get_exception_message(ValueError("bad step")) == "bad step"


# -- paddle.reader ---------------------------------------------------------------------------------

def numbers(n: int, start: int = 0):  # type: ignore[no-untyped-def]
    return lambda: iter(range(start, start + n))


def test_the_reader_decorators_yield_paddles_samples() -> None:
    r = paddle.reader
    assert list(r.chain(numbers(2), numbers(2, 10))()) == [0, 1, 10, 11]
    assert list(r.firstn(numbers(10), 3)()) == [0, 1, 2]
    assert list(r.map_readers(lambda a, b: a * b, numbers(3), numbers(3, 1))()) == [0, 2, 6]
    pairs = lambda: iter([(1, 2), (3, 4)])  # noqa: E731
    assert list(r.compose(pairs, numbers(2))()) == [(1, 2, 0), (3, 4, 1)]
    with pytest.raises(r.ComposeNotAligned):
        list(r.compose(numbers(2), numbers(3))())
    assert list(r.compose(numbers(2), numbers(3), check_alignment=False)()) == [(0, 0), (1, 1)]
    assert list(r.buffered(numbers(50), 4)()) == list(range(50))
    assert list(r.xmap_readers(lambda v: v + 100, numbers(5), 2, 4)()) == [100, 101, 102, 103, 104]
    read: list[int] = []

    def once():  # type: ignore[no-untyped-def]
        read.append(1)
        return iter([7, 8])
    cached = r.cache(once)
    assert read == [1] and list(cached()) == list(cached()) == [7, 8] and read == [1]
    assert list(paddle.batch(r.firstn(numbers(5), 5), 2)()) == [[0, 1], [2, 3], [4]]


def test_shuffle_permutes_within_each_buffer_as_random_is_seeded() -> None:
    shuffled = paddle.reader.shuffle(numbers(10), 4)
    random.seed(3)
    first = list(shuffled())
    random.seed(3)
    assert list(shuffled()) == first != list(range(10))
    assert [sorted(first[i:i + 4]) for i in (0, 4, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_buffered_hands_a_readers_error_to_its_consumer() -> None:
    def failing():  # type: ignore[no-untyped-def]
        yield 1
        raise OSError("disk gone")
    got = paddle.reader.buffered(failing, 2)()
    assert next(got) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(got)


def test_log_helper_is_importable_as_a_submodule_of_fluid() -> None:
    """``from paddle.fluid.log_helper import get_logger``, as Paddle's CTR reader writes it:
    one handler however often it is asked for, not passed on to the root logger."""
    import logging

    from runtime.paddle.fluid.log_helper import get_logger

    logger = get_logger("pslab-test-reader", logging.INFO, fmt="%(message)s")
    assert get_logger("pslab-test-reader", logging.DEBUG) is logger
    assert len(logger.handlers) == 1 and not logger.propagate
    assert logger.level == logging.DEBUG


def test_the_harness_imports_import_and_fluid_names_pslab_does_not_port_say_why() -> None:
    """``test_dist_base.py``'s imports, as a ported copy writes them: fluid's profiler and
    compiler are pslab's modules; fluid's imperative mode and fleet's collective training
    import, and each of their names raises `NotPorted` naming itself and the reason when
    used (the harness uses them only on its dygraph and NCCL paths)."""
    import runtime.paddle.fluid.compiler as fluid_compiler
    import runtime.paddle.fluid.dygraph as dygraph
    import runtime.paddle.fluid.incubate.fleet.base.role_maker as role_maker
    import runtime.paddle.fluid.profiler as fluid_profiler
    from runtime.paddle.fluid.dygraph.base import to_variable
    from runtime.paddle.fluid.dygraph.parallel import DataParallel
    from runtime.paddle.fluid.incubate.fleet.collective import DistributedStrategy, fleet

    assert fluid_profiler is profiler is fluid.profiler
    assert fluid_compiler is fluid.compiler
    assert fluid.dygraph is dygraph and dygraph.base.to_variable is to_variable
    assert fluid.incubate.fleet.base.role_maker is role_maker
    assert issubclass(fluid.NotPorted, NotImplementedError)
    imperative = "fluid's imperative mode (dygraph) is not ported to pslab"
    collective = "fleet's collective (NCCL all-reduce) training is not ported to pslab"
    calls = [(lambda: to_variable(X), "fluid.dygraph.base.to_variable", imperative),
             (lambda: dygraph.guard(fluid.CPUPlace()), "fluid.dygraph.guard", imperative),
             (lambda: DataParallel(None, None), "fluid.dygraph.parallel.DataParallel",
              imperative),
             (lambda: DistributedStrategy(), "fluid.incubate.fleet.collective."
              "DistributedStrategy", collective),
             (lambda: fleet.init(None), "fluid.incubate.fleet.collective.fleet.init",
              collective),
             (lambda: fleet.main_program, "fluid.incubate.fleet.collective.fleet.main_program",
              collective),
             (lambda: role_maker.PaddleCloudRoleMaker(is_collective=True),
              "fluid.incubate.fleet.base.role_maker.PaddleCloudRoleMaker", collective)]
    for call, name, why in calls:
        with pytest.raises(fluid.NotPorted, match=f"^{re.escape(name)}: {re.escape(why)}"):
            call()
    assert not hasattr(fleet, "__len__")
