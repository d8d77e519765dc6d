"""fluid 1.x names that fluid's ``dist_mnist.py`` and its harness (``test_dist_base.py``) use
beyond those of tests/transpiler/test_fluid_script_names.py: ``Variable.is_data`` (how the
harness finds the feeds of the trainer program), ``fluid.layers.accuracy`` (a `top_k` op, then
an `accuracy` op), ``fluid.nets.simple_img_conv_pool`` and the keyword arguments of
``Executor.run`` that pslab has no use for. Each is checked for what it computes, exactly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from program_helpers import build

import runtime.paddle.fluid as fluid
from runtime.execution.executor import Executor as KernelExecutor
from runtime.execution.kernels.errors import KernelError
from transpiler.ir import Program, Var, dumps_json, loads_json, op_types

SCORES = np.array([[0.1, 0.5, 0.3, 0.1],    # best 1, then 2
                   [0.9, 0.0, 0.05, 0.05],  # best 0, then 2 (tied with 3: lower index first)
                   [0.2, 0.2, 0.5, 0.1]], np.float32)  # best 2, then 0 (tied with 1)
LABELS = np.array([[2], [3], [0]], np.int64)


# -- Variable.is_data ------------------------------------------------------------------------------

def mnist_like() -> tuple[Program, Program, Var]:
    """dist_mnist's model, small: conv-pool, fc softmax, cross entropy, accuracy into a
    created total, Momentum."""
    def body() -> Var:
        images = fluid.layers.data(name="pixel", shape=[1, 8, 8], dtype="float32")
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        conv_pool = fluid.nets.simple_img_conv_pool(
            input=images, filter_size=3, num_filters=2, pool_size=2, pool_stride=2, act="relu",
            param_attr=fluid.ParamAttr(initializer=fluid.initializer.Constant(value=0.01)))
        predict = fluid.layers.fc(input=conv_pool, size=3, act="softmax")
        avg_cost = fluid.layers.mean(fluid.layers.cross_entropy(input=predict, label=label))
        total = fluid.layers.create_tensor(dtype="int64")
        fluid.layers.accuracy(input=predict, label=label, total=total)
        fluid.optimizer.Momentum(learning_rate=0.1, momentum=0.9).minimize(avg_cost)
        return avg_cost
    return build(body, seed=1)


def feed_names(program: Program) -> list[str]:
    """What test_dist_base feeds: ``[v for v in block.vars.values() if v.is_data]``."""
    return [v.name for v in program.global_block().vars.values() if v.is_data]


def test_only_vars_of_layers_data_are_data_and_stay_so_in_copies() -> None:
    main, startup, _ = mnist_like()
    assert feed_names(main) == ["pixel", "label"] and feed_names(startup) == []
    assert not main.global_block().var("create_tensor_0").is_data
    for copy in (main.clone(), main.clone(for_test=True), loads_json(dumps_json(main))):
        assert feed_names(copy) == ["pixel", "label"]
    assert main.global_block().var("pixel").to_dict()["is_data"] is True
    assert "is_data" not in main.global_block().var("fc_0.w_0").to_dict()


def test_the_transpiled_trainer_program_keeps_its_feeds_marked() -> None:
    main, startup, _ = mnist_like()
    t = fluid.DistributeTranspiler()
    t.transpile(0, program=main, pservers="127.0.0.1:6170,127.0.0.1:6171", trainers=2,
                startup_program=startup)
    assert feed_names(t.get_trainer_program()) == ["pixel", "label"]
    for program in t.get_pserver_programs("127.0.0.1:6170"):
        assert feed_names(program) == []


# -- fluid.layers.accuracy -------------------------------------------------------------------------

def accuracy_program(k: int) -> tuple[Program, tuple[Var, Var, Var]]:
    def body() -> tuple[Var, Var, Var]:
        x = fluid.layers.data("x", shape=[4])
        y = fluid.layers.data("y", shape=[1], dtype="int64")
        correct = fluid.layers.create_tensor(dtype="int64")
        total = fluid.layers.create_tensor(dtype="int64")
        return fluid.layers.accuracy(x, y, k=k, correct=correct, total=total), correct, total
    main, _, out = build(body)
    return main, out


def test_accuracy_is_fluids_top_k_then_accuracy_op() -> None:
    main, (acc, correct, total) = accuracy_program(2)
    top_k, accuracy = main.global_block().ops
    assert (top_k.type, top_k.attr("k"), top_k.inputs) == ("top_k", 2, {"X": ["x"]})
    values, indices = top_k.output("Out")[0], top_k.output("Indices")[0]
    assert [main.global_block().var(n).shape for n in (values, indices)] == [(-1, 2), (-1, 2)]
    assert main.global_block().var(indices).dtype == "int64"
    assert accuracy.type == "accuracy"
    assert accuracy.inputs == {"Out": [values], "Indices": [indices], "Label": ["y"]}
    assert accuracy.outputs == {"Accuracy": [acc.name], "Correct": [correct.name],
                                "Total": [total.name]}
    assert (acc.shape, acc.dtype) == ((1,), "float32")


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("k", "right"), [(1, 0), (2, 2), (4, 3)])
def test_accuracy_counts_the_samples_whose_label_is_in_their_top_k(backend: str, k: int,
                                                                   right: int) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    main, fetch = accuracy_program(k)
    acc, correct, total = KernelExecutor(backend).run(main, {"x": SCORES, "y": LABELS},
                                                      [v.name for v in fetch], fluid.Scope())
    assert acc.dtype == np.float32 and acc.tolist() == [np.float32(right) / np.float32(3)]
    assert (correct.dtype, correct.tolist(), total.dtype, total.tolist()) == \
        (np.int32, [right], np.int32, [3])


def test_top_k_gives_the_largest_values_first_and_their_positions() -> None:
    def body() -> tuple[Var, Var]:
        return fluid.layers.topk(fluid.layers.data("x", shape=[4]), k=3)
    main, _, (values, indices) = build(body)
    got = fluid.Executor().run(main, feed={"x": SCORES}, fetch_list=[values, indices],
                               scope=fluid.Scope())
    np.testing.assert_array_equal(got[1], [[1, 2, 0], [0, 2, 3], [2, 0, 1]])
    np.testing.assert_array_equal(got[0], np.take_along_axis(SCORES, got[1], axis=1))
    assert got[1].dtype == np.int64


def test_accuracy_refuses_a_negative_label_and_a_k_past_the_classes() -> None:
    main, fetch = accuracy_program(1)
    exe = fluid.Executor()
    with pytest.raises(KernelError, match=r"op 1 \(accuracy\): ValueError: label -1 is negative"):
        exe.run(main, feed={"x": SCORES, "y": LABELS - 1}, fetch_list=list(fetch),
                scope=fluid.Scope())
    too_many, fetch = accuracy_program(5)
    with pytest.raises(KernelError, match=r"op 0 \(top_k\): ValueError: k = 5 is not in \[1, 4\]"):
        exe.run(too_many, feed={"x": SCORES, "y": LABELS}, fetch_list=list(fetch),
                scope=fluid.Scope())


def test_an_empty_batch_has_accuracy_zero() -> None:
    main, fetch = accuracy_program(1)
    got = fluid.Executor().run(main, feed={"x": SCORES[:0], "y": LABELS[:0]},
                               fetch_list=list(fetch), scope=fluid.Scope())
    assert [v.tolist() for v in got] == [[0.0], [0], [0]]


def test_a_model_with_accuracy_trains_and_its_test_clone_keeps_it() -> None:
    main, startup, loss = mnist_like()
    assert "top_k_grad" not in op_types(main.global_block())
    test = main.clone(for_test=True)
    assert op_types(test.global_block())[-2:] == ["top_k", "accuracy"]
    scope, exe = fluid.Scope(), fluid.Executor()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(0)
    feed = {"pixel": rng.uniform(-1, 1, (4, 1, 8, 8)).astype(np.float32),
            "label": np.array([[0], [1], [2], [1]], np.int64)}
    acc_name = test.global_block().ops[-1].output("Accuracy")[0]
    losses = [float(exe.run(main, feed=feed, fetch_list=[loss], scope=scope)[0][0])
              for _ in range(3)]
    assert losses[2] < losses[0]
    acc, total = exe.run(test, feed=feed, fetch_list=[acc_name, "create_tensor_0"], scope=scope)
    assert total.tolist() == [4] and acc[0] in (0.0, 0.25, 0.5, 0.75, 1.0)


# -- fluid.nets.simple_img_conv_pool ---------------------------------------------------------------

def test_simple_img_conv_pool_is_conv2d_then_pool2d() -> None:
    def nets() -> Var:
        image = fluid.layers.data("pixel", shape=[1, 28, 28])
        first = fluid.nets.simple_img_conv_pool(image, num_filters=20, filter_size=5,
                                                pool_size=2, pool_stride=2, act="relu")
        return fluid.nets.simple_img_conv_pool(first, 50, 5, 2, 2, act="relu", conv_padding=1,
                                               pool_type="avg", use_cudnn=False)

    def layers() -> Var:
        image = fluid.layers.data("pixel", shape=[1, 28, 28])
        conv = fluid.layers.conv2d(image, num_filters=20, filter_size=5, act="relu")
        first = fluid.layers.pool2d(conv, pool_size=2, pool_stride=2)
        conv = fluid.layers.conv2d(first, 50, 5, padding=1, act="relu")
        return fluid.layers.pool2d(conv, pool_size=2, pool_type="avg", pool_stride=2)
    (main, startup, out), (want_main, want_startup, want) = build(nets), build(layers)
    assert (main, startup) == (want_main, want_startup)
    assert out.shape == want.shape == (-1, 50, 5, 5)
    assert op_types(main.global_block()) == ["conv2d", "elementwise_add", "relu", "pool2d"] * 2


# -- Executor.run's keyword arguments --------------------------------------------------------------

def test_executor_run_takes_paddles_feed_and_fetch_names_and_program_cache() -> None:
    main, startup, loss = mnist_like()
    feed = {"pixel": np.ones((2, 1, 8, 8), np.float32), "label": np.array([[0], [2]])}
    runs = []
    paddles: dict[str, Any] = {"feed_var_name": "feed", "fetch_var_name": "fetch",
                               "use_program_cache": True}
    for kwargs in ({}, paddles):
        scope, exe = fluid.Scope(), fluid.Executor(fluid.CPUPlace())
        exe.run(startup, None, None, scope)  # scope stays fourth, as callers pass it
        runs.append([exe.run(main, feed, [loss], scope, True, **kwargs)[0] for _ in range(2)])
    np.testing.assert_array_equal(runs[0], runs[1])
    paddles_order: list[Any] = [main, feed, [loss], "feed", "fetch", fluid.Scope()]
    with pytest.raises(TypeError):  # refused, rather than taking "feed" for the scope
        fluid.Executor().run(*paddles_order)
