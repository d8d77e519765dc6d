"""What a program tells the runtime that runs it: the pserver's `listen_and_serv` contract
(`ServeContract`) and the trainer's RPC plan (`TrainContract`).

The transpiler writes everything a pserver needs into the attributes of the program's one
`listen_and_serv` op, and `ServeContract.of` reads them back in one place, so the runtime never
guesses the transpiler's intent from var names or op patterns:

- ``Fanin`` trainers, ``distributed_mode`` (`DistributedMode`) and ``dc_asgd``;
- ``staleness`` (async mode with a staleness bound, SSP, only): how many steps a trainer's read
  of the parameters may run ahead of the slowest trainer, -1 for no bound (`staleness_attr`);
- X: the vars trainers may send; ``grad_to_block_id`` (``"grad:block"``): the block that applies
  each grad; ``optimize_blocks`` and ``lr_decay_block_id``: a sync step's blocks;
- ``trainer_copies`` (``"var:trainer"``): every var of X that one trainer alone sends (sync mode:
  its copy of a grad block, its piece of the distributed table's grad);
- ``fanin_scale_ops`` (``"block:op"``): the `scale` ops that average the trainers' copies after
  their `sum`. Their ``scale`` is 1/``Fanin``; a round that fewer trainers contributed to runs
  them with 1/contributors instead (the runtime passes that as an attribute override to the
  executor; the program itself is never edited).

Names both sides compute alike are shared helpers: `trainer_copy` (`plan`), `bak_name` and
`TRAINER_ID_VAR` (DC-ASGD's per-trainer parameter backups and the var naming whose gradient is
being applied).

`TrainContract.of` reads a trainer program's plan (main or startup) from the attributes the
`rpc_plan` pass wrote on its RPC ops: per protocol, which message carries each barrier, which
are bundled and which GETs ride on SENDs, and which send barriers are local. A program whose
RPC ops lack the plan (built by hand, or edited after the pass) is planned by the same pass
function when read, the program left as it is (`TrainContract.planned` says which).

DESIGN: ``trainer_copies``, ``fanin_scale_ops`` and ``staleness`` are this project's additions to Paddle's
attributes, as are the plan's; the op lists of the programs are unchanged by them.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..ir import Op, Program
from . import rpc_plan as rp
from .config import DistributedMode
from .modes import policy_of
from .rpc_plan import PROTOCOLS, BarrierPlan, Fetch

_ADDED = ("trainer_copies", "fanin_scale_ops")
TRAINER_ID_VAR = "@TRAINER_ID@"
"""DC-ASGD: the int64 var holding the id of the trainer whose gradient is being applied."""


def bak_name(param_block: str, trainer_id: int) -> str:
    """DC-ASGD: the copy of `param_block` that trainer `trainer_id` last fetched."""
    return f"{param_block}.trainer_{trainer_id}_bak"


UNBOUNDED = -1
"""The ``staleness`` attribute of a bounded-staleness server with no bound (``math.inf``)."""


def staleness_attr(staleness: int | float) -> int:
    """The ``staleness`` attribute for a bound (``math.inf``: `UNBOUNDED`)."""
    return UNBOUNDED if staleness == math.inf else int(staleness)


def pair_entries(entries: Mapping[str, int] | list[tuple[str, int]]) -> list[str]:
    """``"name:int"`` attribute entries."""
    items = entries.items() if isinstance(entries, Mapping) else entries
    return [f"{name}:{value}" for name, value in items]


def parse_pairs(entries: list[object]) -> list[tuple[str, int]]:
    """``"a:b"`` attribute entries as (a, int(b)), split at the last colon."""
    out = []
    for entry in entries:
        name, _, value = str(entry).rpartition(":")
        out.append((name, int(value)))
    return out


def parse_pairs_int(entries: list[object]) -> list[tuple[int, int]]:
    """``"a:b"`` attribute entries of two ints."""
    return [(int(a), b) for a, b in parse_pairs(entries)]


@dataclass(frozen=True)
class ServeContract:
    """The attributes of a pserver program's `listen_and_serv` op, parsed and checked."""

    op: Op
    mode: DistributedMode
    trainers: int
    dc_asgd: bool
    received: frozenset[str]
    optimize_blocks: tuple[int, ...]
    lr_block: int
    grad_blocks: Mapping[str, int]
    trainer_copies: Mapping[str, int]
    fanin_scale_ops: tuple[tuple[int, int], ...]
    staleness: int | float | None = None
    """Async with bounded staleness (SSP): the bound (``math.inf``: none); None: not SSP."""
    policy: str = ""
    """The pserver policy that serves the program (`modes.policy_of`, written as
    ``policy``; a program without it gets the one its mode and fields name)."""

    @staticmethod
    def of(program: Program) -> ServeContract:
        """The contract of `program`'s one `listen_and_serv` op (in block 0)."""
        ops = [op for op in program.global_block().ops if op.type == "listen_and_serv"]
        if len(ops) != 1:
            raise ValueError(f"a pserver program has exactly one listen_and_serv op in block 0, "
                             f"found {len(ops)}")
        op = ops[0]
        missing = [a for a in _ADDED if a not in op.attrs]
        if missing:
            raise ValueError(f"listen_and_serv lacks attributes {missing}: the program was not "
                             "written by this transpiler")
        return ServeContract(
            op, DistributedMode(int(op.attr("distributed_mode", 0))), int(op.attr("Fanin", 1)),
            bool(op.attr("dc_asgd", False)), frozenset(op.input("X")),
            tuple(ref.idx for ref in op.attr("optimize_blocks", [])),
            int(op.attr("lr_decay_block_id", -1)),
            dict(parse_pairs(op.attr("grad_to_block_id", []))),
            dict(parse_pairs(op.attr("trainer_copies", []))),
            tuple(parse_pairs_int(op.attr("fanin_scale_ops", []))),
            _staleness(op.attr("staleness", None)), _policy(op))

    @property
    def sync_blocks(self) -> tuple[int, ...]:
        """The blocks of one sync step: the LR block first (`optimize_blocks` lists it first
        already, as the original's did), then the optimize blocks."""
        if self.lr_block < 0 or self.lr_block in self.optimize_blocks:
            return self.optimize_blocks
        return (self.lr_block,) + self.optimize_blocks

    def grad_blocks_of(self, grad: str) -> tuple[int, ...]:
        """The blocks that apply `grad` on its own (asynchronous modes): the LR block, if
        any, then the grad's block; none for a var no block reads (a step counter)."""
        idx = self.grad_blocks.get(grad)
        if idx is None:
            return ()
        return (idx,) if self.lr_block < 0 else (self.lr_block, idx)


def _policy(op: Op) -> str:
    """``listen_and_serv``'s ``policy``, or the one its mode, ``dc_asgd`` and ``staleness``
    name (a program written before the attribute)."""
    policy = op.attr("policy", None)
    if policy is not None:
        return str(policy)
    return policy_of(DistributedMode(int(op.attr("distributed_mode", 0))),
                     bool(op.attr("dc_asgd", False)), op.attr("staleness", None))


def _staleness(attr: object) -> int | float | None:
    """The bound a ``staleness`` attribute states (None: absent)."""
    if attr is None:
        return None
    value = int(attr)  # type: ignore[call-overload]
    if value < UNBOUNDED:
        raise ValueError(f"listen_and_serv: staleness {value} is neither >= 0 nor {UNBOUNDED} "
                         "(no bound)")
    return math.inf if value == UNBOUNDED else value


@dataclass(frozen=True)
class TrainContract:
    """The RPC plan of a trainer program (main or startup, every block), read from the
    attributes of its RPC ops (`rpc_plan`): a `BarrierPlan` per protocol, naming the program's
    ops by their ids."""

    plans: Mapping[str, BarrierPlan]
    """Protocol (`rpc_plan.PROTOCOLS`) -> its plan (per_op's: the local barriers only)."""
    planned: bool
    """Whether the program carried the plan (False: planned by `rpc_plan.plan_attrs` when read,
    a program not written by this transpiler or edited after the pass)."""
    ops: tuple[Op, ...]
    """The ops the plans name (held, so that no other op takes one's id)."""

    @staticmethod
    def of(program: Program) -> TrainContract:
        """The contract of `program`, read once for the program and its ops: every trainer
        running a program (those of one process share them) shares its contract.

        DESIGN: at 1,000 trainers and 100 pservers a plan maps each barrier and carrier to the
        100 endpoints, some 25 KB: 25 MB if each trainer held its own."""
        key = tuple(id(op) for block in program.blocks for op in block.ops)
        entry = _READ.get(id(program))
        if entry is not None and entry[0]() is program and entry[1] == key:
            return entry[2]
        contract = _read(program)
        _READ[id(program)] = (weakref.ref(program, _forget(id(program))), key, contract)
        return contract

    def plan(self, protocol: str) -> BarrierPlan:
        """The plan of `protocol` (one of `rpc_plan.PROTOCOLS`)."""
        if protocol not in self.plans:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        return self.plans[protocol]


_READ: dict[int, tuple[weakref.ref[Program], tuple[int, ...], TrainContract]] = {}
"""id of a live program -> (it, the ids of its ops, its contract) (`TrainContract.of`)."""


def _forget(key: int) -> Callable[[weakref.ref[Program]], None]:
    def drop(ref: weakref.ref[Program]) -> None:
        if key in _READ and _READ[key][0] is ref:
            del _READ[key]
    return drop


def _carries_plan(op: Op) -> bool:
    return (rp.CARRIED if op.type in ("send_barrier", "fetch_barrier") else rp.COUNTS) in op.attrs


def _read(program: Program) -> TrainContract:
    """`program`'s contract, from its ops' plan attributes, or planned now if any lacks them."""
    ops = tuple(op for block in program.blocks for op in block.ops if op.type in rp.PLANNED_OPS)
    planned = all(_carries_plan(op) for op in ops)
    found: dict[int, tuple[Op, Mapping[str, Any]]] = {id(op): (op, op.attrs) for op in ops} \
        if planned else dict(rp.plan_attrs(program))
    compact, bundled = BarrierPlan(), BarrierPlan()
    local = set()
    for key, (op, attrs) in found.items():
        if op.type in ("send_barrier", "fetch_barrier"):
            compact.covered[key] = bundled.covered[key] = frozenset(attrs.get(rp.CARRIED, ()))
            if attrs.get(rp.LOCAL):
                local.add(key)
            continue
        for plan, name in ((compact, rp.COUNTS), (bundled, rp.BUNDLED_COUNTS)):
            if attrs.get(name):
                plan.carriers[key] = dict(parse_pairs(attrs[name]))
        if attrs.get(rp.HELD):
            bundled.held[key] = frozenset(attrs[rp.HELD])
        if attrs.get(rp.FETCHED):
            bundled.fetched[key] = frozenset(attrs[rp.FETCHED])
        if attrs.get(rp.FETCH_TAKERS):
            bundled.fetches[key] = _fetches(attrs)
    compact.local = bundled.local = frozenset(local)
    plans = {"compact": compact, "bundled": bundled, "per_op": BarrierPlan(local=frozenset(local))}
    return TrainContract(plans, planned, tuple(op for op, _ in found.values()))


def _fetches(attrs: Mapping[str, Any]) -> dict[str, Fetch]:
    """A send's ``bundled_fetch_*`` attributes: endpoint -> the GET riding on its SEND there."""
    names: dict[str, list[str]] = {}
    for ep, name in zip(attrs.get(rp.FETCH_EPMAP, ()), attrs.get(rp.FETCH_VARNAMES, ())):
        names.setdefault(str(ep), []).append(str(name))
    barrier = set(attrs.get(rp.FETCH_BARRIER, ()))
    return {ep: Fetch(names.get(ep, []), ep in barrier, takers)
            for ep, takers in parse_pairs(attrs[rp.FETCH_TAKERS])}
