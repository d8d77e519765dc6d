"""Spec section 9: the original's own unit-test expectations, asserted as written there.

Common setup: trainer 0 of 2, pservers 127.0.0.1:6174 (ps1) and 127.0.0.1:6175 (ps2), sync,
random_seed 1. Every program produced is `verify`-ed by the helpers.
"""

from __future__ import annotations

import pytest
from distribute_helpers import (PS1, PS2, basic, config, listen, lookup_model, pserver,
                                trainer, transpile, types)

import transpiler as T
from transpiler.ir import BlockRef, Program, VarType

BASIC_TRAINER = ["mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant",
                 "mean_grad", "square_grad", "elementwise_sub_grad", "elementwise_add_grad", "send",
                 "mul_grad", "split_byref", "send", "send_barrier", "recv", "recv",
                 "fetch_barrier", "concat"]


def _strip_suffix(name: str) -> str:
    return name.split(".block")[0]


def test_basic() -> None:
    t = transpile(basic())
    main, startup = trainer(t)
    assert types(main.global_block()) == BASIC_TRAINER
    assert types(startup.global_block()) == ["fill_constant", "fill_constant", "uniform_random",
                                             "recv", "recv", "fetch_barrier", "concat"]
    ps1, ps1_startup = pserver(t, PS1)
    assert ps1.num_blocks == 3
    assert types(ps1.block(0)) == ["listen_and_serv"]
    assert types(ps1.block(1)) == ["sum", "scale", "sgd"]
    assert types(ps1_startup.global_block()) == ["fill_constant", "fill_constant", "uniform_random"]
    assert ps1_startup.global_block().var("fc_w.block1").shape == (500, 1000)
    ps2, _ = pserver(t, PS2)
    params = {_strip_suffix(n) for ps in (ps1, ps2) for b in ps.blocks for op in b.ops
              for n in op.input("Param")}
    original, _ = basic()
    assert params == {n for op in original.global_block().ops for n in op.input("Param")}


def test_basic_placement_follows_spec_example() -> None:
    t = transpile(basic())
    ps1, _ = pserver(t, PS1)
    ps2, _ = pserver(t, PS2)
    assert [op.input("Param") for op in ps1.block(1).ops + ps1.block(2).ops if op.type == "sgd"] \
        == [["fc_b"], ["fc_w.block1"]]
    assert [op.input("Param") for op in ps2.block(1).ops if op.type == "sgd"] == [["fc_w.block0"]]


def test_min_block_size_keeps_fc_w_whole() -> None:
    t = transpile(basic(), config(min_block_size=1048576))
    main, _ = trainer(t)
    assert types(main.global_block()) == [
        op for op in BASIC_TRAINER if op not in ("split_byref", "concat")]
    ps1, _ = pserver(t, PS1)
    assert ps1.num_blocks == 2
    ps2, _ = pserver(t, PS2)
    assert ps2.global_block().var("fc_w").shape == (1000, 1000)


def test_no_slicing_keeps_fc_w_whole() -> None:
    t = transpile(basic(), config(slice_var_up=False))
    holders = [ps for ps in (pserver(t, PS1)[0], pserver(t, PS2)[0])
               if ps.global_block().has_var("fc_w")]
    assert len(holders) == 1
    assert holders[0].global_block().var("fc_w").shape == (1000, 1000)


def test_exponential_decay_lr_block() -> None:
    t = transpile(basic(lambda: T.optimizer.SGD(T.lr.exponential_decay(1.0, 2100, 0.1, True))))
    ps1, _ = pserver(t, PS1)
    assert ps1.num_blocks == 4
    assert types(ps1.block(1)) == ["increment", "cast", "fill_constant", "elementwise_div", "floor",
                                   "fill_constant", "elementwise_pow", "fill_constant",
                                   "elementwise_mul"]
    assert listen(ps1).attr("lr_decay_block_id") == 1


def test_piecewise_decay_clones_conditional_sub_blocks() -> None:
    t = transpile(basic(lambda: T.optimizer.SGD(
        T.lr.piecewise_decay([10000, 20000], [1.0, 0.5, 1.0]))))
    ps1, _ = pserver(t, PS1)
    assert ps1.num_blocks == 7
    assert types(ps1.block(1)) == [
        "increment", "cast", "fill_constant", "fill_constant", "less_than", "logical_not",
        "conditional_block", "fill_constant", "fill_constant", "less_than", "logical_not",
        "logical_and", "logical_and", "conditional_block", "fill_constant", "conditional_block"]
    optimize = {ref.idx for ref in listen(ps1).attr("optimize_blocks")}
    for block in ps1.blocks[1:]:
        if block.idx not in optimize:
            assert types(block) == ["assign"]
            assert block.parent_idx == 1
    subs = [op.attr("sub_block") for op in ps1.block(1).ops if op.type == "conditional_block"]
    assert subs == [BlockRef(2), BlockRef(3), BlockRef(4)]


def test_l2_decay_and_clip_move_to_pservers() -> None:
    model = basic(lambda: T.optimizer.SGD(0.1, grad_clip=T.clip.GradientClipByValue(0.1)),
                  w_attr=T.ParamAttr(name="fc_w", regularizer=T.regularizer.L2Decay(1e-4)))
    ps1, _ = pserver(transpile(model), PS1)
    assert ps1.num_blocks == 3
    assert types(ps1.block(1)) == ["sum", "scale", "clip", "sgd"]
    assert types(ps1.block(2)) == ["sum", "scale", "clip", "scale", "sum", "sgd"]
    decay = ps1.block(2).ops[3]
    assert decay.input("X") == ["fc_w.block1"] and decay.attr("scale") == pytest.approx(1e-4)
    assert ps1.block(2).ops[2].input("X") == ["fc_w@GRAD.block1"]


def test_momentum_piecewise_decay_and_l2_for_every_param() -> None:
    t = transpile(basic(lambda: T.optimizer.Momentum(
        T.lr.piecewise_decay([1, 10, 20, 30], [1.0, 0.1, 0.01, 0.001, 0.0001]), 0.9,
        regularization=T.regularizer.L2Decay(1e-4))))
    ps1, _ = pserver(t, PS1)
    assert ps1.num_blocks == 9
    assert types(ps1.block(7)) == ["sum", "scale", "scale", "sum", "momentum"]
    assert types(ps1.block(8)) == ["sum", "scale", "scale", "sum", "momentum"]


def test_rmsprop() -> None:
    t = transpile(basic(lambda: T.optimizer.RMSProp(0.1)))
    ps1, startup = pserver(t, PS1)
    assert ps1.num_blocks == 3
    assert types(ps1.block(1)) == ["sum", "scale", "rmsprop"]
    assert startup.global_block().var("momentum_1").shape == (500, 1000)


@pytest.mark.parametrize("opt", [lambda: T.optimizer.DecayedAdagrad(0.1),
                                 lambda: T.optimizer.Ftrl(0.1)], ids=["decayed_adagrad", "ftrl"])
def test_decayed_adagrad_and_ftrl_transpile(opt) -> None:  # type: ignore[no-untyped-def]
    t = transpile(basic(opt))
    trainer(t)
    for ep in (PS1, PS2):
        pserver(t, ep)


def test_no_bias_unsliced_leaves_ps2_an_empty_block() -> None:
    t = transpile(basic(lambda: T.optimizer.SGD(1.0), bias=False), config(slice_var_up=False))
    ps2, _ = pserver(t, PS2)
    assert ps2.num_blocks == 2
    assert types(ps2.block(1)) == []
    assert listen(ps2).attr("optimize_blocks") == [BlockRef(1)]


def test_local_sparse_lookup_table() -> None:
    ps1, _ = pserver(transpile(lookup_model()), PS1)
    assert types(ps1.block(1)) == ["sum", "scale", "adam", "scale", "scale"]
    assert types(ps1.block(2)) == ["sum", "scale", "adam", "scale", "scale"]


def test_distributed_lookup_table() -> None:
    """The 1.2 programs of the two-lookup table model: both lookups of `shared_w` share one
    prefetch chain at the first lookup's place, served by one prefetch block on each pserver
    (5 blocks), as the original fused them from 1.1 on (1.1's case of this model; the 1.8
    programs are the same: tests/transpiler/test_upstream_cases.py)."""
    t = transpile(lookup_model(is_distributed=True), config(paddle_version="1.2"))
    ps1, _ = pserver(t, PS1)
    assert ps1.num_blocks == 5
    assert [types(b) for b in ps1.blocks[1:]] == [
        ["sum", "scale", "adam", "scale", "scale"], ["sum", "sgd"], ["lookup_sparse_table"],
        ["save"]]
    assert ps1.global_block().var("shared_w").shape[0] == 500
    main, _ = trainer(t)
    ops = types(main.global_block())
    assert ops[:6] == ["split_ids", "prefetch", "merge_ids", "sequence_pool", "sequence_pool",
                       "concat"]
    assert main.global_block().ops[2].input("Ids") == ["title_ids", "brand_ids"]
    assert ops[-7:] == ["sum", "split_ids", "send", "send_barrier", "recv", "recv", "fetch_barrier"]


def test_async_lookup_tables_have_no_merge_and_no_barriers() -> None:
    ps1, _ = pserver(transpile(lookup_model(), sync_mode=False), PS1)
    assert types(ps1.block(1)) == ["adam", "scale", "scale"]
    assert types(ps1.block(2)) == ["adam", "scale", "scale"]
    t = transpile(lookup_model(is_distributed=True), config(paddle_version="1.2"), sync_mode=False)
    ps1, _ = pserver(t, PS1)
    assert [types(b) for b in ps1.blocks[1:]] == [
        ["adam", "scale", "scale"], ["sgd"], ["lookup_sparse_table"], ["save"]]
    main, _ = trainer(t)
    ops = types(main.global_block())
    assert "send_barrier" not in ops and "fetch_barrier" not in ops
    assert ops[-5:] == ["sum", "split_ids", "send", "recv", "recv"]


def test_trainer_program_attributes() -> None:
    main, _ = trainer(transpile(lookup_model(is_distributed=True)))
    assert main.attrs["_is_distributed"] is True
    assert main.attrs["_is_chief"] is True
    assert main.attrs["_distributed_lookup_table"] == "shared_w"
    assert main.attrs["_endpoints"] == [PS1, PS2]


def test_nccl2_startup_ends_with_gen_nccl_id() -> None:
    main, startup = basic()
    t = T.DistributeTranspiler(config(mode="nccl2"))
    t.transpile(0, program=main, trainers=f"{PS1},{PS2}", startup_program=startup,
                current_endpoint=PS1, in_place=False)
    _, nccl_startup = trainer(t)
    assert nccl_startup.global_block().ops[-1].type == "gen_nccl_id"
    assert nccl_startup.global_block().var("NCCLID").type is VarType.RAW


def test_transpile_leaves_the_callers_programs_alone() -> None:
    main, startup = basic()
    before = (main.to_dict(), startup.to_dict())
    transpile((main, startup))
    assert (main.to_dict(), startup.to_dict()) == before
    assert isinstance(main, Program)
