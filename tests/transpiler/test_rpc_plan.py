"""The RPC plan pass (`transpiler.distribute.rpc_plan`) and `TrainContract`: the exact plan
each mode's trainer program carries on its RPC ops, compact and bundled, and what a program
without one gives.

Common setup (docs/transpiler.md §9): trainer 0 of 2, pservers PS1 and PS2; `basic` cuts fc_w
in two blocks, fc_w.block0 on PS2 and fc_w.block1 and fc_b on PS1."""

from __future__ import annotations

from typing import Any

import pytest
from distribute_helpers import PS1, PS2, basic, lookup_model, trainer, transpile

import transpiler as T
from transpiler.distribute.checkpoint import CheckpointConfig, append_checkpoint_notify
from transpiler.distribute.contract import TrainContract
from transpiler.distribute.rpc_plan import PLAN_ATTRS, plan_attrs, rpc_plan_pass
from transpiler.ir import Op, Program


def plans(program: Program) -> list[tuple[int, int, str, dict[str, Any]]]:
    """(block, op index, type, plan attributes) of every op that carries plan attributes."""
    return [(block.idx, i, op.type, {k: v for k, v in op.attrs.items() if k in PLAN_ATTRS})
            for block in program.blocks for i, op in enumerate(block.ops)
            if any(k in op.attrs for k in PLAN_ATTRS)]


def config(**fields: Any) -> T.DistributeTranspilerConfig:
    c = T.DistributeTranspilerConfig()
    c.sync_mode = False
    for name, value in fields.items():
        setattr(c, name, value)
    return c


def pairs(**counts: int) -> list[str]:
    """``"endpoint:n"`` entries, PS1 as ``ps1``, PS2 as ``ps2``."""
    return [f"{ {'ps1': PS1, 'ps2': PS2}[ep]}:{n}" for ep, n in counts.items()]


def stripped(program: Program) -> Program:
    """A copy of `program` without any plan attribute."""
    copy = program.clone()
    for block in copy.blocks:
        for op in block.ops:
            for name in PLAN_ATTRS:
                op.attrs.pop(name, None)
    return copy


HELD_PS1 = {"barrier_counts": [], "bundled_held": [PS1]}
"""fc_b's send (recv): its var travels in fc_w's message to PS1 (bundled)."""
FETCH_ALL = {"bundled_fetch_epmap": [PS1, PS1, PS2],
             "bundled_fetch_varnames": ["fc_b", "fc_w.block1", "fc_w.block0"]}


def test_sync_step_carries_both_barriers_and_its_gets_ride_on_the_sends() -> None:
    main, startup = trainer(transpile(basic()))
    assert plans(main) == [
        (0, 10, "send", HELD_PS1),
        (0, 13, "send", {"barrier_counts": pairs(ps1=2, ps2=1),
                         "bundled_barrier_counts": pairs(ps1=1, ps2=1), **FETCH_ALL,
                         "bundled_fetch_takers": pairs(ps1=1, ps2=1),
                         "bundled_fetch_barrier": [PS1, PS2]}),
        (0, 14, "send_barrier", {"carried_endpoints": [PS1, PS2], "local_barrier": False}),
        (0, 15, "recv", HELD_PS1),
        (0, 16, "recv", {"barrier_counts": pairs(ps1=2, ps2=1), "bundled_fetched": [PS2, PS1]}),
        (0, 17, "fetch_barrier", {"carried_endpoints": [PS1, PS2]}),
    ]
    assert plans(startup) == [  # nothing was sent: the GETs carry the fetch barrier
        (0, 3, "recv", HELD_PS1),
        (0, 4, "recv", {"barrier_counts": pairs(ps1=2, ps2=1),
                        "bundled_barrier_counts": pairs(ps1=1, ps2=1)}),
        (0, 5, "fetch_barrier", {"carried_endpoints": [PS1, PS2]}),
    ]


ASYNC = [
    (0, 10, "send", HELD_PS1),
    (0, 12, "send", {"barrier_counts": [], **FETCH_ALL,
                     "bundled_fetch_takers": pairs(ps1=2, ps2=1), "bundled_fetch_barrier": []}),
    (0, 13, "recv", {"barrier_counts": [], "bundled_fetched": [PS1]}),
    (0, 14, "recv", {"barrier_counts": [], "bundled_fetched": [PS2, PS1]}),
]
"""Async (runtime split): no barrier; each pserver's GETs ride on the step's SEND there, fc_w
fetched block by block taking its block apart from fc_b (PS1's reply has two takers)."""


@pytest.mark.parametrize("fields", [{}, {"staleness": 2}], ids=["async", "ssp"])
def test_async_and_ssp_gets_ride_on_the_sends_without_a_barrier(fields: dict[str, Any]) -> None:
    main, _ = trainer(transpile(basic(), config(runtime_split_send_recv=True, **fields),
                                sync_mode=False))
    assert main.attrs["_distributed_mode"] == T.DistributedMode.ASYNC
    assert plans(main) == ASYNC


def test_half_async_bundles_its_cut_gets_into_one_that_rides_on_the_send() -> None:
    main, _ = trainer(transpile(basic(), config(half_async=True), sync_mode=False))
    assert main.attrs["_distributed_mode"] == T.DistributedMode.HALF_ASYNC
    assert plans(main) == [
        (0, 10, "send", HELD_PS1),
        (0, 13, "send", {"barrier_counts": [], **FETCH_ALL,
                         "bundled_fetch_takers": pairs(ps1=1, ps2=1), "bundled_fetch_barrier": []}),
        (0, 14, "recv", HELD_PS1),
        (0, 15, "recv", {"barrier_counts": [], "bundled_fetched": [PS2, PS1]}),
    ]


def test_the_half_async_send_barrier_is_local_by_the_modes_table() -> None:
    """With runtime split (async mode, not synchronous), the original's ``half_async`` send
    barrier only waits for this trainer's sends: carried nowhere, and it ends the run of sends,
    so no GET rides on them."""
    main, _ = trainer(transpile(basic(), config(half_async=True, runtime_split_send_recv=True),
                                sync_mode=False))
    assert plans(main) == [
        (0, 10, "send", HELD_PS1),
        (0, 12, "send", {"barrier_counts": []}),
        (0, 13, "send_barrier", {"carried_endpoints": [], "local_barrier": True}),
        (0, 14, "recv", {"barrier_counts": []}),
        (0, 15, "recv", {"barrier_counts": []}),
    ]
    barrier = main.global_block().ops[13]
    contract = TrainContract.of(main)
    assert all(contract.plan(p).local == {id(barrier)} for p in ("bundled", "compact", "per_op"))


def test_geo_plans_the_push_and_pull_in_their_own_block() -> None:
    main, _ = trainer(transpile(basic(), config(geo_sgd_mode=True), sync_mode=False))
    assert plans(main) == [
        (1, 3, "send", HELD_PS1),
        (1, 7, "send", {"barrier_counts": [], "bundled_fetch_epmap": [PS1],
                        "bundled_fetch_varnames": ["fc_b"],
                        "bundled_fetch_takers": pairs(ps1=1), "bundled_fetch_barrier": []}),
        (1, 8, "recv", {"barrier_counts": [], "bundled_fetched": [PS1]}),
        (1, 10, "recv", {"barrier_counts": []}),  # after a compute op: its own GETs
    ]


def test_a_distributed_table_s_prefetches_carry_nothing() -> None:
    """The table's lookups prefetch (their own requests, no plan; one chain for both lookups,
    at the first's place in the 1.2 programs); its grad's send, to every pserver, is the
    step's last and carries the send barrier and the GETs."""
    main, _ = trainer(transpile(lookup_model(is_distributed=True),
                                T.DistributeTranspilerConfig(paddle_version="1.2")))
    ops = main.global_block().ops
    assert [i for i, op in enumerate(ops) if op.type == "prefetch"] == [1]
    assert plans(main) == [
        (0, 16, "send", HELD_PS1),
        (0, 18, "send", {"barrier_counts": [], "bundled_held": [PS2]}),
        (0, 26, "send", {"barrier_counts": pairs(ps1=2, ps2=2),
                         "bundled_barrier_counts": pairs(ps1=1, ps2=1),
                         "bundled_fetch_epmap": [PS1, PS2], "bundled_fetch_varnames": ["fc_b", "fc_w"],
                         "bundled_fetch_takers": pairs(ps1=1, ps2=1),
                         "bundled_fetch_barrier": [PS1, PS2]}),
        (0, 27, "send_barrier", {"carried_endpoints": [PS1, PS2], "local_barrier": False}),
        (0, 28, "recv", {"barrier_counts": pairs(ps1=1), "bundled_fetched": [PS1]}),
        (0, 29, "recv", {"barrier_counts": pairs(ps2=1), "bundled_fetched": [PS2]}),
        (0, 30, "fetch_barrier", {"carried_endpoints": [PS1, PS2]}),
    ]
    assert ops[26].input("X") == [f"shared_w@GRAD.trainer_0.pserver_{i}" for i in (0, 1)]


def test_the_contract_reads_each_protocol_s_plan() -> None:
    main, _ = trainer(transpile(basic()))
    ops = main.global_block().ops
    contract = TrainContract.of(main)
    assert contract.planned
    compact, bundled, per_op = (contract.plan(p) for p in ("compact", "bundled", "per_op"))
    assert compact.carriers == {id(ops[13]): {PS1: 2, PS2: 1}, id(ops[16]): {PS1: 2, PS2: 1}}
    assert compact.held == compact.fetches == compact.fetched == {}
    assert bundled.carriers == {id(ops[13]): {PS1: 1, PS2: 1}}
    assert bundled.held == {id(ops[10]): {PS1}, id(ops[15]): {PS1}}
    assert {ep: (f.names, f.barrier, f.takers) for ep, f in bundled.fetches[id(ops[13])].items()} \
        == {PS1: (["fc_b", "fc_w.block1"], True, 1), PS2: (["fc_w.block0"], True, 1)}
    assert bundled.fetched == {id(ops[16]): {PS1, PS2}}
    assert compact.covered == bundled.covered == {id(ops[14]): {PS1, PS2}, id(ops[17]): {PS1, PS2}}
    assert per_op.carriers == per_op.covered == {} and per_op.local == frozenset()
    with pytest.raises(ValueError, match="protocol must be one of"):
        contract.plan("batched")


def test_a_program_without_the_plan_is_planned_when_read_and_left_as_it_is() -> None:
    main, _ = trainer(transpile(basic()))
    bare = stripped(main)
    before = bare.to_dict()
    read, written = TrainContract.of(bare), TrainContract.of(main)
    assert not read.planned and written.planned
    assert bare.to_dict() == before
    index = {id(a): id(b) for a, b in zip(bare.global_block().ops, main.global_block().ops)}
    for protocol in ("bundled", "compact", "per_op"):
        mine, theirs = read.plan(protocol), written.plan(protocol)
        for field in ("carriers", "covered", "held", "fetched", "fetches"):
            assert {index[k]: v for k, v in getattr(mine, field).items()} == getattr(theirs, field)
    assert rpc_plan_pass(bare) == main  # the pass writes what the contract planned


def test_a_program_edited_after_the_pass_is_planned_afresh() -> None:
    """One planned op without its plan (an op added or replaced later) makes the contract plan
    the whole program as it is now."""
    main, _ = trainer(transpile(basic()))
    block = main.global_block()
    extra = Op("send", {"X": ["fc_b@GRAD.trainer_0"]}, {"Out": []}, {"epmap": [PS2]})
    block.ops.insert(14, extra)  # before the send barrier: it now closes PS2's round
    contract = TrainContract.of(main)
    assert not contract.planned
    assert contract.plan("compact").carriers[id(extra)] == {PS2: 2}
    bundled = contract.plan("bundled")
    assert bundled.held[id(block.ops[13])] == {PS2}  # no longer the last to PS2
    assert list(bundled.fetches[id(block.ops[13])]) == [PS1]
    assert list(bundled.fetches[id(extra)]) == [PS2]


@pytest.mark.parametrize("mode,local", [(None, [True, False]),
                                        (T.DistributedMode.SYNC, [False, False]),
                                        (T.DistributedMode.ASYNC, [True, True])])
def test_a_send_barrier_is_local_by_the_program_s_mode_else_by_its_half_async(
        mode: T.DistributedMode | None, local: list[bool]) -> None:
    """The modes table decides where the program states its mode (`_distributed_mode`); a
    hand-built program that states none is taken at each op's ``half_async``."""
    program = Program()
    if mode is not None:
        program.attrs["_distributed_mode"] = int(mode)
    block = program.global_block()
    for flag in (True, False):
        block.ops.append(Op("send_barrier", {}, {}, {"endpoints": [PS1], "half_async": flag}))
    found = TrainContract.of(program).plan("compact").local
    assert [id(op) in found for op in block.ops] == local
    assert [attrs["local_barrier"] for _, attrs in plan_attrs(program).values()] == local


def test_the_pass_is_deterministic_idempotent_and_adds_attributes_only() -> None:
    main, startup = trainer(transpile(basic()))
    again, _ = trainer(transpile(basic()))
    assert main == again
    assert rpc_plan_pass(main.clone()) == main
    for program in (main, startup):
        bare = stripped(program)
        assert [op.type for op in bare.global_block().ops] == \
            [op.type for op in program.global_block().ops]
        for op, attrs in plan_attrs(bare).values():
            assert not set(attrs) - set(PLAN_ATTRS) and not set(attrs) & set(op.attrs)


def test_a_checkpoint_notice_is_planned_with_the_program() -> None:
    main, startup = trainer(transpile(basic()))
    append_checkpoint_notify(main, startup, CheckpointConfig("/tmp/ckpt", 3))
    assert main.global_block().ops[-1].type == "conditional_block"
    written = {key: attrs for key, (_, attrs) in plan_attrs(main).items()}
    assert written == {id(op): {k: v for k, v in op.attrs.items() if k in PLAN_ATTRS}
                       for block in main.blocks for op in block.ops if id(op) in written}
    assert TrainContract.of(main).planned
