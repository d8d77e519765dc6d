"""fluid 1.x names of the text scripts (``dist_text_classification.py``, ``dist_simnet_bow.py``):
``DataFeeder`` of LoD vars, ``fluid.nets.sequence_conv_pool``, ``layers.sequence_conv``,
``softsign``, ``cos_sim`` and ``auc``: the ops each writes, and what the programs compute when
run (the kernels' own values and gradients: tests/execution/test_kernels_text.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from program_helpers import build

import runtime.paddle.fluid as fluid
import transpiler as T
from runtime import LoDTensor, Scope
from runtime.execution.executor import Executor
from runtime.execution.tensor import phantom_of
from transpiler.ir import op_types


# -- DataFeeder -----------------------------------------------------------------------------------
def feeder_program() -> tuple[T.Program, T.Program, Any]:
    def net() -> Any:
        words = fluid.layers.data("words", [1], dtype="int64", lod_level=1)
        pairs = fluid.layers.data("pairs", [2], dtype="float32", lod_level=2)
        label = fluid.layers.data("label", [1], dtype="int64")
        return words, pairs, label, fluid.layers.sequence_pool(pairs, "sum")
    return build(net)


def test_a_feeder_joins_each_lod_vars_sequences_with_their_offsets() -> None:
    main, _, (words, pairs, label, _) = feeder_program()
    feeder = fluid.DataFeeder([words, pairs, label], fluid.CPUPlace(), program=main)
    feed = feeder.feed([([4, 2, 7], [[[1, 2]], [[3, 4], [5, 6]]], 1), ([9], [[[7, 8]]], 0)])
    assert isinstance(feed["words"], fluid.LoDTensor)
    assert np.array(feed["words"]).tolist() == [[4], [2], [7], [9]]
    assert np.array(feed["words"]).dtype == np.int64 and feed["words"].lod() == [[0, 3, 4]]
    assert feed["pairs"].lod() == [[0, 2, 3], [0, 1, 3, 4]]
    assert np.array(feed["pairs"]).shape == (4, 2)
    assert feed["label"].tolist() == [[1], [0]]
    with pytest.raises(ValueError, match="sequences 2 deep"):
        feeder.feed([([1], [1.0, 2.0], 0)])


def test_a_fed_sequence_runs_as_the_runtimes_lod_tensor() -> None:
    main, startup, (words, pairs, label, pooled) = feeder_program()
    feeder = fluid.DataFeeder([pairs], program=main)
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.core.Scope()
    exe.run(startup, scope=scope)
    got, = exe.run(main, feed=feeder.feed([([[[1, 2]], [[3, 4], [5, 6]]],), ([[[7, 8]]],)]),
                   fetch_list=[pooled], scope=scope)
    assert got.tolist() == [[1, 2], [8, 10], [7, 8]]  # a row per inner sequence


# -- layers ---------------------------------------------------------------------------------------
def text_net(act: str = "tanh") -> Any:
    words = fluid.layers.data("words", [1], dtype="int64", lod_level=1)
    label = fluid.layers.data("label", [1], dtype="int64")
    emb = fluid.layers.embedding(words, [30, 4])
    pooled = fluid.nets.sequence_conv_pool(emb, num_filters=5, filter_size=3, act=act)
    predict = fluid.layers.fc(pooled, 2, act="softmax")
    loss = fluid.layers.mean(fluid.layers.cross_entropy(predict, label))
    return words, label, pooled, predict, loss


def test_sequence_conv_pool_writes_fluids_ops() -> None:
    main, _, (_, _, pooled, _, _) = build(text_net)
    block = main.global_block()
    assert op_types(block)[:5] == ["lookup_table", "sequence_conv", "elementwise_add", "tanh",
                                   "sequence_pool"]
    conv = block.ops[1]
    assert [conv.attr(a) for a in ("contextStride", "contextStart", "contextLength")] == [1, -1, 3]
    assert block.var(conv.input("Filter")[0]).shape == (12, 5)
    assert block.ops[2].attr("axis") == 1 and block.ops[4].attr("pooltype") == "MAX"
    assert pooled.shape == (-1, 5)


def test_sequence_conv_takes_fluids_arguments_and_refuses_a_dense_input() -> None:
    def net() -> Any:
        x = fluid.layers.data("x", [6], lod_level=1)
        return fluid.layers.sequence_conv(x, 2, filter_size=4, padding_start=0, bias_attr=False)
    main, _, out = build(net)
    assert op_types(main.global_block()) == ["sequence_conv"]
    assert main.global_block().ops[0].attr("contextStart") == 0 and out.lod_level == 1
    with pytest.raises(ValueError, match="with LoD"):
        build(lambda: fluid.layers.sequence_conv(fluid.layers.data("x", [6]), 2))


def words_feed() -> dict[str, Any]:
    ids = np.array([[3], [1], [4], [1], [5], [9], [2]], np.int64)
    return {"words": LoDTensor(ids, [[0, 3, 4, 7]]), "label": np.array([[0], [1], [1]], np.int64)}


@pytest.mark.parametrize("backend", ["numpy", "torch", "phantom"])
def test_a_text_classifier_trains_on_every_backend(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    main, startup, (_, _, pooled, _, loss) = build(text_net, seed=3)
    with T.program_guard(main, startup):
        T.optimizer.SGD(0.5).minimize(loss)
    exe, scope = Executor(backend), Scope()
    exe.run(startup, scope=scope)
    feed = words_feed()
    if backend == "phantom":
        feed = {name: phantom_of(value) for name, value in feed.items()}
    losses = [exe.run(main, feed=feed, fetch_list=[loss, pooled], scope=scope) for _ in range(3)]
    if backend == "phantom":
        assert losses[0][1].shape == (3, 5)
        return
    assert losses[0][1].shape == (3, 5)
    assert losses[2][0][0] < losses[0][0][0]


def test_softsign_and_cos_sim_write_their_ops() -> None:
    def net() -> Any:
        x = fluid.layers.data("x", [3])
        y = fluid.layers.data("y", [1, 3], append_batch_size=False)
        return fluid.layers.softsign(x), fluid.layers.cos_sim(x, y)
    main, startup, (soft, cos) = build(net)
    assert op_types(main.global_block()) == ["softsign", "cos_sim"]
    assert cos.shape == (-1, 1)
    x, y = np.array([[1.0, 2.0, 2.0], [0.0, 3.0, 4.0]], np.float32), np.array([[0.0, 0.0, 1.0]],
                                                                           np.float32)
    got = Executor().run(main, feed={"x": x, "y": y}, fetch_list=[soft, cos], scope=Scope())
    np.testing.assert_allclose(got[0], x / (1 + np.abs(x)))
    np.testing.assert_allclose(got[1], [[2 / 3], [0.8]], rtol=1e-6)


# -- auc ------------------------------------------------------------------------------------------
def auc_net() -> Any:
    predict = fluid.layers.data("predict", [2])
    label = fluid.layers.data("label", [1], dtype="int64")
    return fluid.layers.auc(predict, label, num_thresholds=99)


def test_auc_returns_fluids_tuple_over_zeroed_persistable_counts() -> None:
    main, startup, (auc, batch_auc, stats) = build(auc_net)
    assert op_types(main.global_block()) == ["auc", "auc"]
    assert [op.attr("slide_steps") for op in main.global_block().ops] == [1, 0]
    assert [s.shape for s in stats] == [(201,), (201,), (1, 100), (1, 100)]
    assert all(s.persistable and s.dtype == "int64" for s in stats)
    assert auc.dtype == batch_auc.dtype == "float64"
    assert op_types(startup.global_block()) == ["fill_constant"] * 4
    with pytest.raises(ValueError, match="only ROC"):
        build(lambda: fluid.layers.auc(fluid.layers.data("p", [2]),
                                       fluid.layers.data("l", [1], dtype="int64"), curve="PR"))


def test_auc_counts_every_batch_and_the_batch_auc_the_last_one() -> None:
    main, startup, (auc, batch_auc, _) = build(auc_net)
    exe, scope = Executor(), Scope()
    exe.run(startup, scope=scope)
    first = {"predict": np.array([[0.2, 0.8], [0.7, 0.3]], np.float32),
             "label": np.array([[1], [0]], np.int64)}
    second = {"predict": np.array([[0.1, 0.9], [0.6, 0.4]], np.float32),
              "label": np.array([[0], [1]], np.int64)}
    assert [v[0] for v in exe.run(main, feed=first, fetch_list=[auc, batch_auc],
                                  scope=scope)] == [1.0, 1.0]
    global_auc, last = exe.run(main, feed=second, fetch_list=[auc, batch_auc], scope=scope)
    assert last[0] == 0.0  # the second batch ranks its negative first
    assert global_auc[0] == pytest.approx(0.5)  # 2 of the 4 pairs ordered


# -- a simnet-bow tower pair, as dist_simnet_bow.py builds it --------------------------------------
def simnet_net() -> Any:
    """Query and title towers (summed embeddings, softsign, fc) and the hinge loss and
    accuracy of their cosines, fluid's script's layers in small."""
    def tower(name: str) -> tuple[Any, Any]:
        ids = fluid.layers.data(name, [1], dtype="int64", lod_level=1)
        emb = fluid.layers.embedding(ids, [20, 6], is_sparse=True,
                                     param_attr=fluid.ParamAttr(name="__emb__"))
        pooled = fluid.layers.softsign(fluid.layers.sequence_pool(emb, "sum"))
        return ids, fluid.layers.fc(pooled, 4, param_attr=fluid.ParamAttr(name=f"{name}.w"))
    (q, q_fc), (pt, pt_fc), (nt, nt_fc) = tower("q"), tower("pt"), tower("nt")
    pos, neg = fluid.layers.cos_sim(q_fc, pt_fc), fluid.layers.cos_sim(q_fc, nt_fc)
    margin = fluid.layers.fill_constant_batch_size_like(pos, [-1, 1], "float32", 1.0)
    hinge = fluid.layers.elementwise_add(fluid.layers.elementwise_sub(margin, pos), neg)
    zero = fluid.layers.fill_constant_batch_size_like(hinge, [-1, 1], "float32", 0.0)
    loss = fluid.layers.mean(fluid.layers.elementwise_max(zero, hinge))
    right = fluid.layers.reduce_sum(fluid.layers.cast(fluid.layers.less_than(neg, pos), "float64"))
    acc = fluid.layers.elementwise_div(right, fluid.layers.fill_constant([1], "float64", 3.0),
                                       name="simnet_acc")
    fluid.optimizer.SGD(0.2).minimize(loss)
    return [q, pt, nt], loss, acc


def test_a_simnet_bow_step_runs_from_fed_sequences() -> None:
    main, startup, (feeds, loss, acc) = build(simnet_net, seed=2)
    assert acc.name.startswith("simnet_acc")
    assert op_types(main.global_block()).count("cos_sim_grad") == 2
    exe, scope = fluid.Executor(fluid.CPUPlace()), fluid.core.Scope()
    exe.run(startup, scope=scope)
    feeder = fluid.DataFeeder(feeds, program=main)
    batch = [([1, 2, 3], [1, 2], [7, 8, 9, 10]), ([4], [4, 5], [11]), ([6, 6], [6], [12, 13])]
    got = [exe.run(main, feed=feeder.feed(batch), fetch_list=[loss, acc], scope=scope)
           for _ in range(4)]
    assert all(np.isfinite(v[0][0]) and 0 <= v[1][0] <= 1 for v in got)
    assert got[-1][0][0] < got[0][0][0]


@pytest.mark.parametrize("backend", ["numpy", "torch", "phantom"])
def test_reshape_keeps_the_lod_where_the_first_dim_stays_as_fluids_does(backend: str) -> None:
    """``dist_simnet_bow.py`` reshapes ``fluid.embedding``'s [N, 1, D] LoD output to [N, D]
    and sequence-pools it: reshape2, squeeze2 and unsqueeze2 keep X's LoD (lod_level when
    built, the offsets when run) where Out's first dim is X's, as fluid's InferShape shares
    it; other shapes, and transpose2, keep none."""
    if backend == "torch":
        pytest.importorskip("torch")

    def net() -> Any:
        words = fluid.layers.data("words", [1], dtype="int64", lod_level=1)
        emb = fluid.embedding(words, size=[20, 3],
                              param_attr=fluid.ParamAttr(name="emb", initializer=(
                                  fluid.initializer.Uniform(-1.0, 1.0))))
        rows = fluid.layers.reshape(emb, [-1, 3])
        squeezed = fluid.layers.squeeze(emb, [1])
        flat = fluid.layers.reshape(emb, [1, -1])
        swapped = fluid.layers.transpose(rows, [1, 0])
        return emb, rows, squeezed, flat, swapped, fluid.layers.sequence_pool(rows, "sum")
    main, startup, (emb, rows, squeezed, flat, swapped, pooled) = build(net, seed=4)
    assert emb.shape == (-1, 1, 3) and emb.lod_level == 1
    assert (rows.lod_level, squeezed.lod_level, flat.lod_level, swapped.lod_level) == (1, 1, 0, 0)
    exe, scope = Executor(backend), Scope()
    exe.run(startup, scope=scope)
    ids = np.array([[4], [2], [7], [9], [4]], dtype=np.int64)
    feed: dict[str, Any] = {"words": LoDTensor(ids, [[0, 3, 4, 5]])}
    if backend == "phantom":
        feed = {name: phantom_of(value) for name, value in feed.items()}
    exe.run(main, feed=feed, scope=scope)
    lods = [scope.get_tensor(v.name).lod for v in (rows, squeezed)]
    assert [list(map(list, lod)) for lod in lods] == [[[0, 3, 4, 5]]] * 2
    for v in (flat, swapped):
        assert not getattr(scope.get_tensor(v.name), "lod", None)
    if backend == "phantom":
        assert tuple(scope.get_tensor(pooled.name).shape) == (3, 3)
        return
    table = scope.get("emb")
    want = [table[[4, 2, 7]].sum(0), table[9], table[4]]
    np.testing.assert_allclose(scope.get(pooled.name), want, rtol=1e-6)
