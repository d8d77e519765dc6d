"""The original's transpiler unit tests of releases 1.2 and 1.8 where they differ, as facts of
pslab's programs (docs/transpiler.md §9): `paddle_version` "1.8" (the default) and "1.2" both
fuse every lookup of the distributed table into one prefetch chain at the first lookup's place,
served by one prefetch block, and keep the dense parameters' accumulators in the trainer's
startup, which the table's `fake_init` ends; the pserver programs answer the release's query of
where the parameters went.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from distribute_helpers import (PS1, PS2, basic, build, config, lookup_model,
                                mark_remote_prefetch, pserver, trainer, transpile, types)

import transpiler as T
from transpiler.distribute.config import PADDLE_VERSION_ENV
from transpiler.layers import REMOTE_PREFETCH_ENV
from transpiler.ir import Program
from transpiler.opcatalog import runs_rpc

ADAM_MERGED = ["sum", "scale", "adam", "scale", "scale"]


@pytest.fixture(autouse=True)
def _release_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case sets the release and the remote-prefetch switch it builds under itself."""
    monkeypatch.delenv(PADDLE_VERSION_ENV, raising=False)
    monkeypatch.delenv(REMOTE_PREFETCH_ENV, raising=False)


def three_lookups(padding: tuple[int, int] = (-1, -1),
                  profile_prefetch: bool | None = False) -> tuple[Program, Program]:
    """1.2's and 1.8's table model: title and brand ids looked up in the distributed `shared_w`
    [1000, 64], profile ids in a sparse `profile_emb` of their own; each pooled, concat,
    fc(2), cross entropy, Adam. `padding`: the two `shared_w` lookups' ``padding_idx``;
    `profile_prefetch`: the `profile_emb` lookup's ``remote_prefetch`` (None: the release's
    default; False, the cases' own, keeps the table on the trainer)."""
    def body() -> None:
        pooled = []
        for slot, table, pad in (("title_ids", "shared_w", padding[0]),
                                 ("brand_ids", "shared_w", padding[1]),
                                 ("profile_ids", "profile_emb", -1)):
            ids = T.layers.data(slot, shape=[1], dtype="int64", lod_level=1)
            emb = T.layers.embedding(ids, size=[1000, 64], is_sparse=True,
                                     is_distributed=table == "shared_w", padding_idx=pad
                                     if pad >= 0 else None, param_attr=T.ParamAttr(name=table),
                                     remote_prefetch=None if table == "shared_w"
                                     else profile_prefetch)
            pooled.append(T.layers.sequence_pool(emb, "average"))
        label = T.layers.data("label", shape=[1], dtype="int64")
        pred = T.layers.fc(T.layers.concat(pooled, axis=1), size=2,
                           param_attr=T.ParamAttr(name="fc_w"), bias_attr=T.ParamAttr(name="fc_b"))
        T.optimizer.Adam(0.003).minimize(T.layers.mean(T.layers.cross_entropy(pred, label)))
    return build(body)


def test_the_18_table_lookups_share_one_chain_and_one_prefetch_block() -> None:
    t = transpile(three_lookups())
    ps1, _ = pserver(t, PS1)
    assert [types(b) for b in ps1.blocks] == [
        ["listen_and_serv"], ADAM_MERGED, ADAM_MERGED, ["sum", "sgd"], ["lookup_sparse_table"],
        ["save"]]
    main, _ = trainer(t)
    ops = main.global_block().ops
    assert types(main.global_block())[:7] == ["split_ids", "prefetch", "merge_ids", "sequence_pool",
                                              "sequence_pool", "lookup_table", "sequence_pool"]
    assert ops[0].input("Ids") == ops[2].input("Ids") == ["title_ids", "brand_ids"]
    assert len(ops[2].output("Out")) == 2
    assert types(main.global_block())[-9:] == ["sum", "split_ids", "send", "send_barrier", "recv",
                                               "recv", "recv", "fetch_barrier", "concat"]


def test_the_18_trainer_startup_keeps_the_dense_accumulators_and_ends_with_fake_init() -> None:
    """fc_w, fc_b and profile_emb keep Adam's 4 accumulators each (12), with fc_b's and the
    learning rate's fill_constant: 14; the table's own are gone with its initializer."""
    _, startup = trainer(transpile(three_lookups()))
    assert types(startup.global_block()) == ["fill_constant"] * 14 + [
        "uniform_random", "uniform_random", "recv", "recv", "recv", "fetch_barrier", "concat",
        "fake_init"]


def test_the_18_async_table_blocks() -> None:
    ps1, _ = pserver(transpile(three_lookups(), sync_mode=False), PS1)
    assert [types(b) for b in ps1.blocks[1:]] == [
        ["adam", "scale", "scale"], ["adam", "scale", "scale"], ["sgd"], ["lookup_sparse_table"],
        ["save"]]


def test_lookups_that_differ_in_padding_keep_a_chain_each() -> None:
    main, _ = trainer(transpile(three_lookups(padding=(0, 5))))
    assert types(main.global_block()).count("prefetch") == 2


def test_the_12_table_lookups_share_one_chain_and_one_prefetch_block(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1.2's transpiler fused the lookups as 1.8's did (from 1.1 on), the one chain where the
    first lookup was: the 1.8 program's chain, op for op; sync and async. Built with 1.2's
    layers, whose sparse `profile_emb` stays on the trainer by default."""
    monkeypatch.setenv(PADDLE_VERSION_ENV, "1.2")
    for sync, blocks in ((True, [ADAM_MERGED, ADAM_MERGED, ["sum", "sgd"]]),
                         (False, [["adam", "scale", "scale"]] * 2 + [["sgd"]])):
        t = transpile(three_lookups(profile_prefetch=None), config(paddle_version="1.2"),
                      sync_mode=sync)
        ps1, _ = pserver(t, PS1)
        assert [types(b) for b in ps1.blocks] == [
            ["listen_and_serv"], *blocks, ["lookup_sparse_table"], ["save"]]
        main, _ = trainer(t)
        ops = main.global_block().ops
        assert types(main.global_block())[:7] == [
            "split_ids", "prefetch", "merge_ids", "sequence_pool", "sequence_pool",
            "lookup_table", "sequence_pool"]
        assert ops[0].input("Ids") == ops[2].input("Ids") == ["title_ids", "brand_ids"]
        assert len(ops[2].output("Out")) == 2


def test_the_12_trainer_startup_keeps_the_dense_accumulators_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1.2's case lists the same startup as 1.8's: 14 `fill_constant`s, the dense parameters'
    accumulators among them (1.2's layers: `profile_emb` received by default)."""
    monkeypatch.setenv(PADDLE_VERSION_ENV, "1.2")
    _, startup = trainer(transpile(three_lookups(profile_prefetch=None),
                                   config(paddle_version="1.2")))
    assert types(startup.global_block()) == ["fill_constant"] * 14 + [
        "uniform_random", "uniform_random", "recv", "recv", "recv", "fetch_barrier", "concat",
        "fake_init"]


def test_the_version_comes_from_the_environment_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PADDLE_VERSION_ENV, "1.2")
    assert T.DistributeTranspilerConfig().paddle_version == "1.2"
    monkeypatch.setenv(PADDLE_VERSION_ENV, "2.0")
    with pytest.raises(ValueError, match="paddle_version"):
        T.DistributeTranspilerConfig()


def rmsprop() -> T.DistributeTranspiler:
    return transpile(basic(lambda: T.optimizer.RMSProp(0.1)))


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def test_the_18_query_of_the_vars_on_each_pserver_adds_up_to_the_origins() -> None:
    t = rmsprop()
    query = t.get_pserver_program(PS1)._parameters_on_pservers
    mine, theirs = query.get_distributed_vars_by_ep(PS1), query.get_distributed_vars_by_ep(PS2)
    assert {v.origin.name for v in mine if v.is_slice} == {v.origin.name for v in theirs
                                                           if v.is_slice}
    for v in mine:
        other = [o for o in theirs if o.origin.name == v.origin.name and v.is_slice]
        assert numel(v.origin.shape) == numel(v.slice.shape) + sum(numel(o.slice.shape)
                                                                   for o in other)
    assert {v.vtype for v in mine} == {"Param", "Optimizer"}


def test_the_12_slice_list_pairs_each_cut_param_s_blocks() -> None:
    t = rmsprop()
    ps1, ps2 = t.get_pserver_program(PS1), t.get_pserver_program(PS2)
    (a,), (b,) = ps1._slice_vars_and_attrs, ps2._slice_vars_and_attrs
    assert a[0] == b[0] and (a[0].name, a[0].shape) == ("fc_w", (1000, 1000))
    assert (a[1], a[2].name, tuple(a[2].shape)) == (500, "fc_w.block1", (500, 1000))
    assert (b[1], b[2].name) == (0, "fc_w.block0")


def test_weight_decay_adds_its_term_with_sum() -> None:
    """Momentum with L2Decay on every param: the decay term joins the grad by `sum` in 1.2's
    blocks as in 1.8's (1.2's regularizer wrote `sum`; 1.1's had written `elementwise_add`)."""
    model = basic(lambda: T.optimizer.Momentum(
        T.lr.piecewise_decay([1, 10, 20, 30], [1.0, 0.1, 0.01, 0.001, 0.0001]), 0.9,
        regularization=T.regularizer.L2Decay(1e-4)))
    for version in ("1.8", "1.2"):
        ps1, _ = pserver(transpile(model, config(paddle_version=version)), PS1)
        assert [types(ps1.block(i)) for i in (7, 8)] == \
            [["sum", "scale", "scale", "sum", "momentum"]] * 2


@pytest.mark.parametrize("switch", [None, "1"])
def test_with_remote_prefetch_the_18_table_model_holds_neither_table(
        monkeypatch: pytest.MonkeyPatch, switch: str | None) -> None:
    """Remote prefetch on, by 1.8's default (its `embedding` marked every sparse lookup that is
    not distributed) or by the switch: the trainer receives only fc_w and fc_b, in its main
    program and in its startup, and the startup ends with a `fake_init` of each sparse table,
    the distributed `shared_w` and the remote `profile_emb`, as 1.8's transpiler
    fake-initialized every sparse table. 1.8's test lists the main program's receives so but
    one `fake_init` only."""
    if switch is not None:
        monkeypatch.setenv(REMOTE_PREFETCH_ENV, switch)
    main, startup = trainer(transpile(three_lookups(profile_prefetch=None)))
    for program in (main, startup):
        assert [op.output("Out") for op in program.global_block().ops if op.type == "recv"] == \
            [["fc_b"], ["fc_w"]]
    assert types(main.global_block())[-4:] == ["send_barrier", "recv", "recv", "fetch_barrier"]
    ops = startup.global_block().ops
    assert [(op.type, op.output("Out")) for op in ops[-2:]] == [
        ("fake_init", ["profile_emb"]), ("fake_init", ["shared_w"])]
    assert not any(t in op.output_arg_names for op in ops[:-2] for t in ("shared_w", "profile_emb"))


def nce_model() -> tuple[Program, Program]:
    """1.8's remote nce case: a sparse nce of 20 classes over a 10-wide input, weight
    `nce_w` and bias `nce_b`, Adam."""
    def body() -> None:
        x = T.layers.data("input", shape=[10])
        label = T.layers.data("label", shape=[1], dtype="int64")
        cost = T.layers.nce(x, label, 20, param_attr="nce_w", bias_attr="nce_b", seed=1,
                            num_neg_samples=5, is_sparse=True)
        T.optimizer.Adam(0.003).minimize(T.layers.mean(cost))
    return build(body)


def received(model: tuple[Program, Program]) -> set[str]:
    main, _ = trainer(transpile(model))
    return {n for op in main.global_block().ops if op.type == "recv" for n in op.output("Out")}


@pytest.mark.parametrize("release", [None, "1.2", "1.8", "2.x"])
@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_a_sparse_layer_prefetches_remotely_by_its_release_unless_the_switch_says(
        monkeypatch: pytest.MonkeyPatch, release: str | None, switch: str | None) -> None:
    """Left to the default, a sparse lookup that is not distributed and a sparse nce prefetch
    their rows from the pservers as the release in force when the layers are built did:
    1.8 (also when none is set) and 2.x on, 1.2 off. ``PADDLE_ENABLE_REMOTE_PREFETCH`` wins
    in every release: "0" off, "1" on. On, the nce's weight is never received (its bias is)
    and the lookups are marked; off, the trainer receives both of nce's parameters."""
    for env, value in ((PADDLE_VERSION_ENV, release), (REMOTE_PREFETCH_ENV, switch)):
        if value is not None:
            monkeypatch.setenv(env, value)
    on = switch == "1" if switch is not None else release != "1.2"
    main, _ = lookup_model(remote_prefetch=None)
    assert [op.attr("remote_prefetch") for op in main.global_block().ops
            if op.type == "lookup_table"] == [on, on]
    assert {"nce_w", "nce_b"} & received(nce_model()) == ({"nce_b"} if on else {"nce_w", "nce_b"})


def test_what_a_layer_is_told_wins_and_only_a_sparse_lookup_prefetches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit `remote_prefetch` overrides the default either way (the built-in models
    pass False); a dense lookup, the distributed table's lookups, a dense nce and a frozen
    sparse table or nce weight (no optimizer to run on the pservers) never prefetch by
    default, so a program with a frozen sparse table still transpiles, the table kept on
    the trainer; asking it of a dense lookup or of the distributed table is refused."""
    monkeypatch.setenv(REMOTE_PREFETCH_ENV, "1")
    main, _ = lookup_model(remote_prefetch=False)
    assert not any(op.attr("remote_prefetch") for op in main.global_block().ops
                   if op.type == "lookup_table")
    monkeypatch.setenv(REMOTE_PREFETCH_ENV, "0")
    main, _ = lookup_model(remote_prefetch=True)
    assert all(op.attr("remote_prefetch") for op in main.global_block().ops
               if op.type == "lookup_table")
    monkeypatch.delenv(REMOTE_PREFETCH_ENV)
    main, _ = lookup_model(is_distributed=True, remote_prefetch=None)
    assert not any(op.attr("remote_prefetch") for op in main.global_block().ops)

    def body() -> None:
        ids = T.layers.data("ids", shape=[1], dtype="int64")
        x = T.layers.embedding(ids, size=[10, 4])
        frozen = T.layers.embedding(ids, size=[10, 4], is_sparse=True,
                                    param_attr=T.ParamAttr(name="frozen", trainable=False))
        cost = T.layers.nce(x, ids, 10)
        kept = T.layers.nce(frozen, ids, 10, is_sparse=True,
                            param_attr=T.ParamAttr(trainable=False))
        for sparse, distributed in ((False, False), (True, True)):
            with pytest.raises(ValueError, match="remote_prefetch needs is_sparse"):
                T.layers.embedding(ids, size=[10, 4], is_sparse=sparse,
                                   is_distributed=distributed, remote_prefetch=True)
        T.optimizer.SGD(0.1).minimize(T.layers.mean(T.layers.sums([cost, kept])))
    main, startup = build(body)
    assert not any(op.attr("remote_prefetch") for op in main.global_block().ops
                   if op.type in ("lookup_table", "nce"))
    trained, _ = trainer(transpile((main, startup)))
    assert "lookup_table" in types(trained.global_block())


def test_a_fused_chain_goes_after_the_last_op_writing_its_ids() -> None:
    """The second lookup's ids come from a `reshape` after the first lookup: the one chain
    goes after the reshape, where both ids exist (the original's, at the first lookup's place,
    read them unwritten)."""
    def body() -> None:
        first = T.layers.data("first", shape=[1], dtype="int64")
        second = T.layers.data("second", shape=[2], dtype="int64")
        embs = [T.layers.embedding(first, size=[100, 4], is_sparse=True, is_distributed=True,
                                   param_attr=T.ParamAttr(name="shared_w"))]
        ids = T.layers.reshape(second, shape=[-1, 1])
        embs.append(T.layers.embedding(ids, size=[100, 4], is_sparse=True, is_distributed=True,
                                       param_attr=T.ParamAttr(name="shared_w")))
        loss = T.layers.mean(T.layers.concat(embs, axis=0))
        T.optimizer.SGD(0.1).minimize(loss)
    for version in ("1.8", "1.2"):
        main, _ = trainer(transpile(build(body), config(paddle_version=version)))
        assert types(main.global_block())[:4] == ["reshape2", "split_ids", "prefetch",
                                                  "merge_ids"], version


def test_the_chain_goes_where_the_first_lookup_was() -> None:
    """A `scale` of a dense input comes before the lookups, whose ids are fed: the chain goes
    where the first lookup was, after the scale, not to the top, as the original's (1.1 to
    1.8) did; the 1.8 original put a remote-prefetch table's op after the last ids writer."""
    def body() -> None:
        x = T.layers.scale(T.layers.data("x", shape=[4], dtype="float32"), scale=2.0)
        embs = [T.layers.embedding(T.layers.data(slot, shape=[1], dtype="int64"),
                                   size=[100, 4], is_sparse=True, is_distributed=True,
                                   param_attr=T.ParamAttr(name="shared_w"))
                for slot in ("first", "second")]
        loss = T.layers.mean(T.layers.concat([x, *embs], axis=1))
        T.optimizer.SGD(0.1).minimize(loss)
    chains = {}
    for version in ("1.8", "1.2"):
        main, _ = trainer(transpile(build(body), config(paddle_version=version)))
        chains[version] = types(main.global_block())[:4]
        merge = main.global_block().ops[chains[version].index("merge_ids")]
        assert merge.input("Ids") == ["first", "second"] and len(merge.output("Out")) == 2
    assert chains == {version: ["scale", "split_ids", "prefetch", "merge_ids"]
                      for version in ("1.8", "1.2")}


def test_the_18_table_model_computes_its_loss_with_cross_entropy2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1.8's layer writes the hard-label loss as `cross_entropy2` and its grad op as
    `cross_entropy_grad2`; 1.2's as `cross_entropy` and `cross_entropy_grad`. The whole
    trainer of the distributed-table model; pslab's last three ops (profile_emb received and
    joined: `profile_emb` kept on the trainer) are where it differs from 1.8's test, which
    expects the sparse table prefetched, as 1.8's default does (above)."""
    main, _ = trainer(transpile(three_lookups()))
    assert types(main.global_block()) == [
        "split_ids", "prefetch", "merge_ids", "sequence_pool", "sequence_pool", "lookup_table",
        "sequence_pool", "concat", "mul", "elementwise_add", "cross_entropy2", "mean",
        "fill_constant", "mean_grad", "cross_entropy_grad2", "elementwise_add_grad", "send",
        "mul_grad", "send", "concat_grad", "sequence_pool_grad", "lookup_table_grad",
        "split_selected_rows", "send", "sequence_pool_grad", "lookup_table_grad",
        "sequence_pool_grad", "lookup_table_grad", "sum", "split_ids", "send", "send_barrier",
        "recv", "recv", "recv", "fetch_barrier", "concat"]
    monkeypatch.setenv(PADDLE_VERSION_ENV, "1.2")
    main, _ = three_lookups()
    assert [t for t in types(main.global_block()) if t.startswith("cross_entropy")] == \
        ["cross_entropy", "cross_entropy_grad"]


def word2vec_fake_init() -> tuple[Program, Program]:
    """1.8's fake-init case: word2vec with negative sampling over a 10000-word vocabulary, 8
    wide, 5 negatives: sparse tables `emb` (the input word), `emb_w` and `emb_b` (looked up for
    the true word and for the negatives each); logits by a row product and a batched matmul,
    sigmoid cross entropy against ones and zeros, SGD with an exponentially decayed rate."""
    def body() -> None:
        vocab, dim, neg = 10000, 8, 5
        word, true, negs = (T.layers.data(n, shape=[1], dtype="int64", lod_level=1)
                            for n in ("input_word", "true_label", "neg_label"))

        def table(ids: Any, name: str, width: int, init: Any = None) -> Any:
            return T.layers.embedding(ids, size=[vocab, width], is_sparse=True,
                                      param_attr=T.ParamAttr(name=name, initializer=init))
        width = 0.5 / dim
        word_emb = table(word, "emb", dim, T.initializer.Uniform(-width, width))
        true_w = table(true, "emb_w", dim, T.initializer.Constant(0.0))
        true_b = table(true, "emb_b", 1, T.initializer.Constant(0.0))
        neg_ids = T.layers.reshape(negs, shape=[-1, 1])
        neg_ids.stop_gradient = True
        neg_w = T.layers.reshape(table(neg_ids, "emb_w", dim), shape=[-1, neg, dim])
        neg_b = T.layers.reshape(table(neg_ids, "emb_b", 1), shape=[-1, neg])
        true_logits = T.layers.elementwise_add(T.layers.reduce_sum(
            T.layers.elementwise_mul(word_emb, true_w), dim=1, keep_dim=True), true_b)
        neg_logits = T.layers.elementwise_add(T.layers.reshape(T.layers.matmul(
            T.layers.reshape(word_emb, shape=[-1, 1, dim]), neg_w, transpose_y=True),
            shape=[-1, neg]), neg_b)
        ones = T.layers.fill_constant_batch_size_like(true_logits, [-1, 1], "float32", 1.0)
        zeros = T.layers.fill_constant_batch_size_like(true_logits, [-1, neg], "float32", 0.0)
        cost = T.layers.elementwise_add(
            T.layers.reduce_sum(T.layers.sigmoid_cross_entropy_with_logits(true_logits, ones),
                                dim=1),
            T.layers.reduce_sum(T.layers.sigmoid_cross_entropy_with_logits(neg_logits, zeros),
                                dim=1))
        T.optimizer.SGD(T.lr.exponential_decay(1.0, 2100, 0.1, staircase=True)).minimize(
            T.layers.reduce_mean(cost))
    return build(body)


def test_remote_prefetched_tables_are_fake_initialized_on_the_trainer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With remote prefetch (1.8's default), none of the three sparse tables lives on the
    trainer: its startup receives none of them and ends with a `fake_init` of each, of the
    table's shape. With the switch "0" (docs/transpiler.md §9) the trainer receives all
    three."""
    def startup() -> Program:
        return trainer(transpile(word2vec_fake_init()))[1]
    monkeypatch.setenv(REMOTE_PREFETCH_ENV, "0")
    received = {n for op in startup().global_block().ops if op.type == "recv"
                for n in op.output("Out")}
    assert {n.split(".block")[0] for n in received} >= {"emb", "emb_w", "emb_b"}
    monkeypatch.delenv(REMOTE_PREFETCH_ENV)
    ops = startup().global_block().ops
    assert [(op.type, op.output("Out"), op.attr("shape")) for op in ops[-3:]] == [
        ("fake_init", ["emb"], [10000, 8]), ("fake_init", ["emb_b"], [10000, 1]),
        ("fake_init", ["emb_w"], [10000, 8])]
    assert not any(op.type == "recv" and n.startswith("emb") for op in ops for n in op.output("Out"))


def two_remote_tables() -> tuple[Program, Program]:
    """Title ids and brand ids (computed: a `scale` of a data var, after the title lookup)
    looked up in the remote-prefetch `shared_w` [1000, 64], profile ids in the remote
    `profile_emb`; then each pooled, concat, fc(2), cross entropy, SGD."""
    def body() -> None:
        def lookup(ids: Any, table: str) -> Any:
            return T.layers.embedding(ids, size=[1000, 64], is_sparse=True,
                                      param_attr=T.ParamAttr(name=table))
        title = T.layers.data("title_ids", shape=[1], dtype="int64", lod_level=1)
        raw = T.layers.data("brand_raw", shape=[1], dtype="int64", lod_level=1)
        profile = T.layers.data("profile_ids", shape=[1], dtype="int64", lod_level=1)
        embs = [lookup(title, "shared_w")]
        brand = T.layers.scale(raw, scale=1.0, bias=1.0)
        embs += [lookup(brand, "shared_w"), lookup(profile, "profile_emb")]
        pooled = [T.layers.sequence_pool(emb, "average") for emb in embs]
        label = T.layers.data("label", shape=[1], dtype="int64")
        pred = T.layers.fc(T.layers.concat(pooled, axis=1), size=2,
                           param_attr=T.ParamAttr(name="fc_w"), bias_attr=T.ParamAttr(name="fc_b"))
        T.optimizer.SGD(0.1).minimize(T.layers.mean(T.layers.cross_entropy(pred, label)))
    main, startup = build(body)
    mark_remote_prefetch(main, "lookup_table")
    return main, startup


def test_the_18_remote_lookups_of_a_table_become_one_distributed_lookup_table() -> None:
    """One `distributed_lookup_table` per remote table, serving all its lookups: Ids and
    Outputs in the lookups' order, right after the last op writing any of its ids (the scale
    of brand ids for `shared_w`; none for `profile_emb`, whose op goes to the top), with the
    table's blocks and the first lookup's padding and type, as 1.8's transpiler wrote it."""
    main, _ = trainer(transpile(two_remote_tables()))
    block = main.global_block()
    assert types(block) == [
        "distributed_lookup_table", "scale", "distributed_lookup_table", "sequence_pool",
        "sequence_pool", "sequence_pool", "concat", "mul", "elementwise_add", "cross_entropy2",
        "mean", "fill_constant", "mean_grad", "cross_entropy_grad2", "elementwise_add_grad",
        "send", "mul_grad", "send", "concat_grad", "sequence_pool_grad", "sequence_pool_grad",
        "sequence_pool_grad", "lookup_table_grad", "split_selected_rows", "send",
        "lookup_table_grad", "lookup_table_grad", "sum", "split_selected_rows", "send",
        "send_barrier", "recv", "recv", "fetch_barrier"]
    profile, shared = block.ops[0], block.ops[2]
    assert (profile.input("Ids"), profile.input("W")) == (["profile_ids"], ["profile_emb"])
    assert (shared.input("Ids"), shared.input("W")) == (
        ["title_ids", block.ops[1].output("Out")[0]], ["shared_w"])
    assert shared.output("Outputs") == [op.input("X")[0] for op in block.ops[3:5]]
    assert profile.output("Outputs") == block.ops[5].input("X")
    assert {k: shared.attr(k) for k in ("table_names", "height_sections", "endpoints",
                                        "padding_idx", "trainer_id", "lookup_table_version")} == {
        "table_names": ["shared_w.block0", "shared_w.block1"], "height_sections": [500, 500],
        "endpoints": [PS1, PS2], "padding_idx": -1, "trainer_id": 0,
        "lookup_table_version": "lookup_table"}


def test_an_out_read_before_the_last_ids_of_its_table_is_refused_naming_it() -> None:
    """The first lookup's out is read (scaled) before the second lookup's ids are computed:
    no one place serves both, as in 1.8's transpiler, which raised there."""
    def body() -> None:
        first = T.layers.data("first", shape=[1], dtype="int64")
        emb = T.layers.embedding(first, size=[100, 4], is_sparse=True,
                                 param_attr=T.ParamAttr(name="shared_w"))
        early = T.layers.scale(emb, scale=2.0)
        ids = T.layers.scale(T.layers.data("second", shape=[1], dtype="int64"), bias=1.0)
        late = T.layers.embedding(ids, size=[100, 4], is_sparse=True,
                                  param_attr=T.ParamAttr(name="shared_w"))
        T.optimizer.SGD(0.1).minimize(T.layers.mean(T.layers.concat([early, late], axis=0)))
    main, startup = build(body)
    mark_remote_prefetch(main, "lookup_table")
    out = main.global_block().ops[0].output("Out")[0]
    with pytest.raises(ValueError, match=f"'{out}'.*'shared_w'.*read before"):
        transpile((main, startup))
    trainer(transpile((main, startup), config(paddle_version="1.2")))  # a lookup each: no clash


def test_the_12_remote_lookups_prefetch_each_in_its_place() -> None:
    """1.2's transpiler left each remote lookup where it was, a `lookup_table` told where its
    table's blocks are (its `_update_remote_sparse_update_op`), and so does pslab's."""
    main, _ = trainer(transpile(two_remote_tables(), config(paddle_version="1.2")))
    block = main.global_block()
    assert types(block)[:7] == [
        "lookup_table", "scale", "lookup_table", "lookup_table", "sequence_pool",
        "sequence_pool", "sequence_pool"]
    remote = [op for op in block.ops if op.type == "lookup_table"]
    assert [(op.input("Ids"), op.input("W")) for op in remote] == [
        (["title_ids"], ["shared_w"]), ([block.ops[1].output("Out")[0]], ["shared_w"]),
        (["profile_ids"], ["profile_emb"])]
    assert {k: remote[0].attr(k) for k in ("epmap", "table_names", "height_sections",
                                           "trainer_id", "remote_prefetch")} == {
        "epmap": [PS1, PS2], "table_names": ["shared_w.block0", "shared_w.block1"],
        "height_sections": [500, 500], "trainer_id": 0, "remote_prefetch": True}
    assert all(runs_rpc(op) for op in remote)  # the runtime asks for their rows