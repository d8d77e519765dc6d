"""Executor and Scope: feeding and fetching with checks, errors that name the op and var,
conditional sub-blocks, plan caching, deterministic initialization, and whole programs from the
front end trained for a few steps against hand-computed numbers."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import transpiler as T
from runtime import (AsyncOpError, ExecutionError, Executor, FeedError, FetchError, KernelError,
                     KernelNotFound, LoDTensor, MissingInputError, Scope, SelectedRows,
                     global_scope)
from runtime.execution.executor import check_feed
from runtime.execution.tensor import lod_of
from transpiler.ir import BlockRef, Program

from program_helpers import build, double_program


# -- scope --------------------------------------------------------------------------------------
def test_scope_set_copies_and_get_unwraps() -> None:
    scope = Scope()
    a = np.array([1.0, 2.0])
    scope.set("a", a)
    a[0] = 99.0
    assert scope.get("a").tolist() == [1.0, 2.0]
    scope.set("seq", LoDTensor(np.ones((3, 1)), [[0, 1, 3]]))
    assert isinstance(scope.get("seq"), np.ndarray) and scope.get("seq").shape == (3, 1)
    assert lod_of(scope.get_tensor("seq")) == [[0, 1, 3]]
    scope.set("rows", SelectedRows([1], np.ones((1, 2)), 4))
    assert isinstance(scope.get("rows"), SelectedRows)
    scope.set("lst", [1, 2])
    assert isinstance(scope.get("lst"), np.ndarray)
    assert scope.has("a") and "seq" in scope and "b" not in scope
    assert sorted(scope.names()) == ["a", "lst", "rows", "seq"]
    with pytest.raises(KeyError, match="'b'"):
        scope.get("b")


# -- small hand-built programs --------------------------------------------------------------------


def test_run_feeds_and_fetches_by_name_or_var() -> None:
    prog = double_program()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out, = Executor().run(prog, feed={"x": x}, fetch_list=["out"], scope=Scope())
    assert out.tolist() == (2 * x).tolist()
    out, = Executor().run(prog, feed={"x": x}, fetch_list=[prog.global_block().var("out")], scope=Scope())
    assert out.dtype == np.float32


def test_fetched_arrays_are_copies() -> None:
    scope = Scope()
    out, = Executor().run(double_program(), feed={"x": np.ones((1, 3), np.float32)},
                          fetch_list=["out"], scope=scope)
    out[:] = 0
    assert scope.get("out").tolist() == [[2.0, 2.0, 2.0]]


def test_without_scope_the_global_scope_is_used() -> None:
    Executor().run(double_program(), feed={"x": np.ones((1, 3), np.float32)})
    assert global_scope().get("out").tolist() == [[2.0, 2.0, 2.0]]


@pytest.mark.parametrize("feed,message", [
    ({"y": np.ones((1, 3), np.float32)}, "feed var 'y' is not declared"),
    ({"x": np.ones((2, 4), np.float32)}, r"feed var 'x': expected shape \[-1, 3\] \(-1: any\), got \[2, 4\]"),
    ({"x": np.ones(3, np.float32)}, r"feed var 'x': expected shape \[-1, 3\] \(-1: any\), got \[3\]"),
    ({"x": np.ones((2, 3))}, "feed var 'x': expected dtype float32, got float64"),
    ({"x": (np.ones((2, 3), np.float32), [[0, 1]])}, "feed var 'x': LoD level 0 must end at 2"),
])
def test_feed_errors_name_the_var(feed: dict[str, Any], message: str) -> None:
    with pytest.raises(FeedError, match=message):
        Executor().run(double_program(), feed=feed, scope=Scope())


def test_feed_accepts_lists_lod_tensors_and_lod_tuples() -> None:
    block = double_program().global_block()
    assert check_feed(block, "x", [[1, 2, 3]]).dtype == np.float32
    value = check_feed(block, "x", (np.ones((3, 3), np.float32), [[0, 1, 3]]))
    assert isinstance(value, LoDTensor) and value.lod == [[0, 1, 3]]
    value = check_feed(block, "x", LoDTensor(np.ones((2, 3), np.float32), [[0, 2]]))
    assert isinstance(value, LoDTensor) and value.lod == [[0, 2]]


def test_fetch_errors_name_the_var() -> None:
    prog = double_program()
    feed = {"x": np.ones((1, 3), np.float32)}
    with pytest.raises(FetchError, match="fetch var 'nope' is not declared"):
        Executor().run(prog, feed=feed, fetch_list=["nope"], scope=Scope())
    prog.global_block().create_var("never_written", shape=(1,))
    with pytest.raises(FetchError, match="fetch var 'never_written' has no value"):
        Executor().run(prog, feed=feed, fetch_list=["never_written"], scope=Scope())


def test_return_numpy_false_keeps_lod_and_rows() -> None:
    prog = Program()
    block = prog.global_block()
    block.create_var("ids", shape=(-1, 1), dtype="int64", lod_level=1)
    block.create_var("w", shape=(4, 2), persistable=True)
    block.create_var("emb", shape=(-1, 2))
    block.append_op("lookup_table", {"W": ["w"], "Ids": ["ids"]}, {"Out": ["emb"]})
    scope = Scope()
    scope.set("w", np.arange(8, dtype=np.float32).reshape(4, 2))
    emb, = Executor().run(prog, feed={"ids": (np.array([[3], [0], [1]]), [[0, 2, 3]])},
                          fetch_list=["emb"], scope=scope, return_numpy=False)
    assert isinstance(emb, LoDTensor) and emb.lod == [[0, 2, 3]]
    assert emb.data.tolist() == [[6, 7], [0, 1], [2, 3]]


def test_missing_kernel_names_op_type_and_index() -> None:
    prog = double_program()
    prog.global_block().append_op("frobnicate", {"X": ["out"]}, {"Out": ["out"]})
    message = r"block 0, op 1 \(frobnicate\): no numpy kernel for op type 'frobnicate'"
    with pytest.raises(KernelNotFound, match=message):
        Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)}, scope=Scope())


def test_missing_input_names_block_op_slot_and_var() -> None:
    prog = double_program()
    block = prog.global_block()
    block.create_var("bias", shape=(3,))
    block.append_op("elementwise_add", {"X": ["out"], "Y": ["bias"]}, {"Out": ["out"]})
    with pytest.raises(MissingInputError,
                       match=r"block 0, op 1 \(elementwise_add\): input Y var 'bias' has no value"):
        Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)}, scope=Scope())


def test_kernel_failure_is_wrapped_with_the_op_and_keeps_the_cause() -> None:
    prog = double_program()
    block = prog.global_block()
    block.create_var("y", shape=(5,))
    block.append_op("elementwise_add", {"X": ["out"], "Y": ["y"]}, {"Out": ["out"]})
    scope = Scope()
    scope.set("y", np.ones(5, np.float32))
    with pytest.raises(KernelError, match=r"block 0, op 1 \(elementwise_add\): ValueError") as info:
        Executor().run(prog, feed={"x": np.ones((2, 3), np.float32)}, scope=scope)
    assert isinstance(info.value.__cause__, ValueError)
    assert isinstance(info.value, ExecutionError)


@pytest.mark.parametrize("op_type", ["send", "recv", "listen_and_serv", "fetch_barrier"])
def test_rpc_ops_need_the_async_runtime(op_type: str) -> None:
    prog = double_program()
    prog.global_block().append_op(op_type, {"X": ["out"]}, {})
    scope = Scope()
    with pytest.raises(AsyncOpError, match=rf"block 0, op 1 \({op_type}\): RPC ops need the async runtime"):
        Executor().run(prog, feed={"x": np.ones((1, 3), np.float32)}, scope=scope)
    assert "out" not in scope  # refused before running anything


def test_mutated_program_is_replanned_and_renames_need_no_replan() -> None:
    prog = double_program()
    exe, scope = Executor(), Scope()
    feed = {"x": np.ones((1, 3), np.float32)}
    assert exe.run(prog, feed=feed, fetch_list=["out"], scope=scope)[0].tolist() == [[2, 2, 2]]
    block = prog.global_block()
    block.append_op("scale", {"X": ["out"]}, {"Out": ["out"]}, {"scale": 5.0})
    assert exe.run(prog, feed=feed, fetch_list=["out"], scope=scope)[0].tolist() == [[10, 10, 10]]
    block.ops[1].type = "relu"
    assert exe.run(prog, feed=feed, fetch_list=["out"], scope=scope)[0].tolist() == [[2, 2, 2]]
    block.create_var("out2", shape=(-1, 3))
    block.ops[1].rename_output("out", "out2")
    block.ops[0].attrs["scale"] = 3.0
    exe.run(prog, feed=feed, scope=scope)
    assert scope.get("out2").tolist() == [[3, 3, 3]]


# -- conditional_block ----------------------------------------------------------------------------
def conditional_program() -> Program:
    """lr = 0.5 if step < 3 else 0.1, via two conditional_blocks (what piecewise_decay builds)."""
    prog = Program()
    g = prog.global_block()
    g.create_var("step", shape=(1,), dtype="float32")
    for name, dtype in [("bound", "float32"), ("cond", "bool"), ("not_cond", "bool"),
                        ("lr", "float32"), ("hi", "float32"), ("lo", "float32")]:
        g.create_var(name, shape=(1,), dtype=dtype)
    g.append_op("fill_constant", {}, {"Out": ["bound"]}, {"shape": [1], "dtype": "float32", "value": 3.0})
    g.append_op("fill_constant", {}, {"Out": ["hi"]}, {"shape": [1], "dtype": "float32", "value": 0.5})
    g.append_op("fill_constant", {}, {"Out": ["lo"]}, {"shape": [1], "dtype": "float32", "value": 0.1})
    g.append_op("less_than", {"X": ["step"], "Y": ["bound"]}, {"Out": ["cond"]})
    g.append_op("logical_not", {"X": ["cond"]}, {"Out": ["not_cond"]})
    for cond, value in [("cond", "hi"), ("not_cond", "lo")]:
        sub = prog.create_block(parent_idx=0)
        sub.append_op("assign", {"X": [value]}, {"Out": ["lr"]})
        prog.rollback()
        g.append_op("conditional_block", {"Cond": [cond], "Input": [value]}, {"Out": ["lr"]},
                    {"sub_block": BlockRef(sub.idx), "is_scalar_condition": True})
    return prog


def test_conditional_block_runs_its_sub_block_only_when_cond_holds() -> None:
    prog, exe = conditional_program(), Executor()
    lrs = []
    for step in range(5):
        out, = exe.run(prog, feed={"step": np.array([step], np.float32)}, fetch_list=["lr"], scope=Scope())
        lrs.append(round(float(out[0]), 6))
    assert lrs == [0.5, 0.5, 0.5, 0.1, 0.1]


def test_conditional_block_without_scalar_condition_needs_non_empty_conds() -> None:
    prog = Program()
    g = prog.global_block()
    g.create_var("c", shape=(-1,), dtype="bool")
    g.create_var("v", shape=(1,))
    sub = prog.create_block(parent_idx=0)
    sub.append_op("fill_constant", {}, {"Out": ["v"]}, {"shape": [1], "dtype": "float32", "value": 7.0})
    prog.rollback()
    g.append_op("conditional_block", {"Cond": ["c"], "Input": []}, {"Out": ["v"]},
                {"sub_block": BlockRef(1), "is_scalar_condition": False})
    scope = Scope()
    Executor().run(prog, feed={"c": np.zeros(0, bool)}, scope=scope)
    assert "v" not in scope
    Executor().run(prog, feed={"c": np.array([False])}, scope=scope)
    assert scope.get("v").tolist() == [7.0]


def test_error_in_sub_block_names_the_sub_block() -> None:
    prog = conditional_program()
    prog.blocks[1].ops[0].inputs["X"] = ["undefined"]
    with pytest.raises(MissingInputError, match=r"block 1, op 0 \(assign\): input X var 'undefined'"):
        Executor().run(prog, feed={"step": np.array([0], np.float32)}, scope=Scope())


# -- programs from the front end
# --------------------------------------------------------------------


def linear_model(optimizer: Callable[[], Any], **fc_kwargs: Any) -> Callable[[], Any]:
    def body() -> Any:
        x = T.layers.data("x", shape=[4])
        y = T.layers.data("y", shape=[1])
        pred = T.layers.fc(x, size=1, param_attr=T.ParamAttr(name="w"),
                           bias_attr=T.ParamAttr(name="b"), **fc_kwargs)
        loss = T.layers.mean(T.layers.square_error_cost(pred, y))
        optimizer().minimize(loss)
        return loss
    return body


def regression_data(n: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.3).astype(np.float32)
    return {"x": x, "y": y}


def test_random_init_is_the_same_in_every_process_and_scope() -> None:
    values = []
    for seed in (0, 0, 1):
        _, startup, _ = build(linear_model(lambda: T.optimizer.SGD(0.1)), seed=seed)
        scope = Scope()
        Executor().run(startup, scope=scope)
        values.append(scope.get("w").copy())
    np.testing.assert_array_equal(values[0], values[1])
    assert not np.array_equal(values[0], values[2])
    limit = np.sqrt(6.0 / (4 + 1))  # Xavier uniform for a [4, 1] weight
    assert np.abs(values[0]).max() <= limit and values[0].dtype == np.float32


def manual_sgd(data: dict[str, np.ndarray], w: np.ndarray, b: np.ndarray, lr: float, steps: int,
               l2: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    x, y = data["x"].astype(np.float64), data["y"].astype(np.float64)
    w, b = w.astype(np.float64), b.astype(np.float64)
    for _ in range(steps):
        dpred = 2 * (x @ w + b - y) / len(x)
        w, b = w - lr * (x.T @ dpred + l2 * w), b - lr * (dpred.sum(axis=0) + l2 * b)
    return w, b


@pytest.mark.parametrize("l2", [0.0, 0.1])
def test_linear_regression_matches_hand_computed_sgd(l2: float) -> None:
    reg = T.regularizer.L2Decay(l2) if l2 else None
    main, startup, loss = build(linear_model(lambda: T.optimizer.SGD(0.1, regularization=reg)))
    exe, scope, data = Executor(), Scope(), regression_data()
    exe.run(startup, scope=scope)
    w0, b0 = scope.get("w").copy(), scope.get("b").copy()
    assert b0.tolist() == [0.0]
    for _ in range(5):
        exe.run(main, feed=data, fetch_list=[loss], scope=scope)
    w, b = manual_sgd(data, w0, b0, 0.1, 5, l2)
    np.testing.assert_allclose(scope.get("w"), w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scope.get("b"), b, rtol=1e-4, atol=1e-5)


def test_global_norm_clip_scales_the_step() -> None:
    clip = T.clip.GradientClipByGlobalNorm(0.01)
    main, startup, _ = build(linear_model(lambda: T.optimizer.SGD(1.0, grad_clip=clip)))
    exe, scope, data = Executor(), Scope(), regression_data()
    exe.run(startup, scope=scope)
    w0, b0 = scope.get("w").copy(), scope.get("b").copy()
    exe.run(main, feed=data, scope=scope)
    step = np.concatenate([(w0 - scope.get("w")).ravel(), b0 - scope.get("b")])
    assert np.linalg.norm(step) == pytest.approx(0.01, rel=1e-4)


@pytest.mark.parametrize("name", sorted(T.optimizer.OPTIMIZERS))
def test_every_optimizer_trains_the_linear_model(name: str) -> None:
    lr = {"sgd": 0.1, "momentum": 0.05, "adam": 0.1, "adagrad": 0.5, "decayed_adagrad": 0.1,
          "adamax": 0.2, "rmsprop": 0.05, "ftrl": 0.5, "lars_momentum": 0.1}[name]
    # LARS's default coefficient (0.001) scales the weights' steps down a thousandfold
    kwargs = {"lars_coeff": 0.5} if name == "lars_momentum" else {}
    main, startup, loss = build(linear_model(lambda: T.optimizer.OPTIMIZERS[name](lr, **kwargs)))
    exe, scope, data = Executor(), Scope(), regression_data()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed=data, fetch_list=[loss], scope=scope)[0][0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_piecewise_decay_learning_rate_per_step() -> None:
    def body() -> Any:
        lr = T.lr.piecewise_decay([2, 4], [1.0, 0.5, 0.1])
        linear_model(lambda: T.optimizer.SGD(lr))()
        return lr
    main, startup, lr = build(body)
    exe, scope, data = Executor(), Scope(), regression_data()
    exe.run(startup, scope=scope)
    seen = [float(exe.run(main, feed=data, fetch_list=[lr], scope=scope)[0][0]) for _ in range(6)]
    assert seen == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.1, 0.1])


def test_exponential_decay_staircase() -> None:
    def body() -> Any:
        lr = T.lr.exponential_decay(2.0, decay_steps=2, decay_rate=0.5, staircase=True)
        linear_model(lambda: T.optimizer.SGD(lr))()
        return lr
    main, startup, lr = build(body)
    exe, scope, data = Executor(), Scope(), regression_data()
    exe.run(startup, scope=scope)
    seen = [float(exe.run(main, feed=data, fetch_list=[lr], scope=scope)[0][0]) for _ in range(5)]
    assert seen == pytest.approx([2.0, 2.0, 1.0, 1.0, 0.5])


def bag_of_words(sparse: bool, optimizer: Callable[[], Any]) -> Callable[[], Any]:
    def body() -> Any:
        words = T.layers.data("words", shape=[1], dtype="int64", lod_level=1)
        label = T.layers.data("label", shape=[1], dtype="int64")
        emb = T.layers.embedding(words, size=[20, 8], is_sparse=sparse, padding_idx=0,
                                 param_attr=T.ParamAttr(name="emb"))
        pooled = T.layers.sequence_pool(emb, "average")
        hidden = T.layers.fc(pooled, size=8, act="tanh")
        logits = T.layers.fc(hidden, size=3)
        loss = T.layers.mean(T.layers.softmax_with_cross_entropy(logits, label))
        optimizer().minimize(loss)
        return loss
    return body


def text_batch(rng: np.random.Generator) -> dict[str, Any]:
    lengths = [3, 1, 0, 4, 2]
    ids = rng.integers(0, 20, (sum(lengths), 1)).astype(np.int64)
    lod = [list(np.concatenate([[0], np.cumsum(lengths)]).astype(int))]
    return {"words": (ids, lod), "label": rng.integers(0, 3, (len(lengths), 1)).astype(np.int64)}


@pytest.mark.parametrize("make_opt", [lambda: T.optimizer.SGD(0.5), lambda: T.optimizer.Adam(0.05)],
                         ids=["sgd", "adam"])
def test_sparse_embedding_trains_like_dense(make_opt: Callable[[], Any]) -> None:
    finals, losses = [], []
    for sparse in (False, True):
        main, startup, loss = build(bag_of_words(sparse, make_opt))
        exe, scope, rng = Executor(), Scope(), np.random.default_rng(4)
        exe.run(startup, scope=scope)
        batch = text_batch(rng)
        run_losses = [float(exe.run(main, feed=batch, fetch_list=[loss], scope=scope)[0][0])
                      for _ in range(15)]
        finals.append(scope.get("emb").copy())
        losses.append(run_losses)
    np.testing.assert_allclose(finals[0], finals[1], rtol=1e-5, atol=1e-6)
    assert losses[1][-1] < losses[1][0]
