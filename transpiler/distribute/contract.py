"""What a pserver program tells the runtime that serves it: the `listen_and_serv` contract.

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

DESIGN: ``trainer_copies``, ``fanin_scale_ops`` and ``staleness`` are this project's additions to Paddle's
attributes; the op lists of the programs are unchanged by them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..ir import Op, Program
from .config import DistributedMode
from .modes import policy_of

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
