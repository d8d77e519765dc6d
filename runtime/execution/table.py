"""The pserver's side of embeddings looked up by id: its shard of the distributed lookup table,
and rows of the param blocks that remote sparse update reads.

Trainers speak global ids (see `transpiler.distribute.lookup_table`). Pserver k owns the ids
``[k*R, k*R + owned)`` and keeps id i as row ``i - k*R`` of its table var, which has R rows (the
last pserver may own fewer ids than it has rows). `TableShard` converts at the boundary, so the
pserver program's blocks work on rows of the shard:

- PREFETCH: the ids of each prefetch block's ids var (``prefetch_var_name_to_block_id``) become
  rows, the block (`lookup_sparse_table`) runs, and the rows it looked up are the reply
  (`prefetch`: the pserver core runs the blocks).
- SEND of a table grad piece (a `SelectedRows` of global ids, as tall as the whole table): its
  rows become rows of the shard (height R) before it is stored.
- Sync mode (`average_pieces`): the program's table-optimize block `sum`s the trainers' pieces
  and has no `scale` by 1/trainers after it, as in the original, so N trainers would step the
  table N times as far as local training on the same global batch. Before the block runs, each
  contributing trainer's piece is therefore scaled by 1/contributors (as the dense blocks'
  fan-in `scale` is) and a non-contributor's emptied. Which trainer sends which piece is the
  program's ``trainer_copies`` attribute (`transpiler.distribute.contract`). This is a deliberate
  fix of the original: sync training with a distributed table equals local training.

Remote sparse update needs no conversion: the trainer asks for rows of a param block by row
(`lookup_rows`). Anything out of range, and a PREFETCH of a var that is no prefetch block's ids,
gets a `TableRequestError` naming the var, raised before anything is stored.

Rows written since the last checkpoint (`TouchedRows`): the pserver marks, after each block it
runs, the rows each op wrote of the shard's row-aligned state vars (the table and its optimizer
accumulators): a sparse optimizer update the rows of its grad where its rule writes those only
(`rows_written`), any other write to such a var every row; so does any other writer (a SEND
storing one, a restore). A checkpoint then writes only those rows (`runtime.services.checkpoint`).

Timing mode: phantom prefetch ids and grad pieces are checked by shape (which ids they hold is
unknown, so ownership is not), re-based by taking the shard's height, and not scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from transpiler.distribute.contract import parse_pairs
from transpiler.ir import Op, Program, Var, VarType

from runtime.execution.kernels.numpy_optim import ROW_LOCAL
from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, host_value

class TableRequestError(ValueError):
    """Ids or rows that this pserver cannot serve or store; names the var."""

    def __init__(self, detail: str, var: str) -> None:
        super().__init__(detail)
        self.var = var


@dataclass(frozen=True)
class PrefetchBlock:
    """A prefetch block and the var its lookup writes."""

    block: int
    rows: str


@dataclass(frozen=True)
class TableShard:
    table: str
    offset: int
    rows: int
    owned: int
    width: tuple[int, ...]
    dtype: np.dtype
    pieces: Mapping[str, int | None]  # grad piece -> the trainer that sends it (None: any)
    prefetch: Mapping[str, PrefetchBlock]  # ids var -> its prefetch block
    checkpoint_block: int

    @staticmethod
    def of(program: Program, lsv: Op) -> TableShard | None:
        """The shard `listen_and_serv` op `lsv` serves, or None if its program has no table."""
        block0 = program.global_block()
        tables = [(grad, param) for grad, param in _pairs(lsv.attr("sparse_grad_to_param", []))
                  if block0.var(param).type is VarType.SELECTED_ROWS]
        if not tables:
            return None
        if len(tables) > 1:
            raise ValueError(f"listen_and_serv serves several distributed tables {tables}; a "
                             "program has one at most")
        ((grad, table),) = tables
        var = block0.var(table)
        rows, offset = var.shape[0], int(lsv.attr("pserver_id")) * var.shape[0]
        block = int(dict(_pairs(lsv.attr("grad_to_block_id", [])))[grad])
        reads = {n for op in program.block(block).ops for n in op.input_arg_names}
        copies = dict(parse_pairs(lsv.attr("trainer_copies", [])))
        prefetch = {ids: PrefetchBlock(int(idx), program.block(int(idx)).ops[0].output("Out")[0])
                    for ids, idx in _pairs(lsv.attr("prefetch_var_name_to_block_id", []))}
        return TableShard(table, offset, rows, max(0, min(rows, block0.var(grad).shape[0] - offset)),
                          tuple(var.shape[1:]), np.dtype(var.dtype),
                          {n: copies.get(n) for n in lsv.input("X") if n in reads}, prefetch,
                          int(lsv.attr("checkpint_block_id", -1)))

    # -- ids and rows in
    # ----------------------------------------------------------------------------
    def local_ids(self, name: str, value: Any) -> np.ndarray | Phantom:
        """The prefetch ids var `name`'s global ids as ``[n, 1]`` rows of the shard."""
        if name not in self.prefetch:
            raise TableRequestError(f"PREFETCH of var {name!r}, which is not the ids var of a "
                                    "prefetch block of this pserver", name)
        if isinstance(value, Phantom):
            return Phantom((_phantom_ids(name, value), 1), np.dtype(np.int64))
        ids = _int_ids(name, value)
        self._check_owned(name, ids)
        return (ids - self.offset).reshape(-1, 1)

    def local_rows(self, name: str, value: Any) -> SelectedRows | Phantom:
        """Grad piece `name`, its global rows made rows of the shard."""
        if isinstance(value, Phantom) and value.is_rows:
            return Phantom(value.shape, value.dtype, self.rows)
        if not isinstance(value, SelectedRows):
            raise TableRequestError(f"var {name!r}: a table grad piece is SelectedRows, got "
                                    f"{type(value).__name__}", name)
        self._check_owned(name, value.rows)
        return SelectedRows(value.rows - self.offset, value.values, self.rows)

    def _check_owned(self, name: str, ids: np.ndarray) -> None:
        outside = ids[(ids < self.offset) | (ids >= self.offset + self.owned)]
        if outside.size:
            raise TableRequestError(
                f"var {name!r}: ids {np.unique(outside)[:8].tolist()} are not on this pserver, "
                f"which owns ids [{self.offset}, {self.offset + self.owned}) of table "
                f"{self.table!r}", name)

    # -- blocks
    # -------------------------------------------------------------------------------------
    def average_pieces(self, scope: Scope, contributors: set[int]) -> None:
        """Sync mode, before the table-optimize block: contributors' pieces scaled by
        1/contributors, the other trainers' pieces emptied (see the module docstring)."""
        scale = 1.0 / len(contributors)
        for name, trainer in self.pieces.items():
            if trainer in contributors:
                piece = scope.get_tensor(name)
                if isinstance(piece, Phantom):
                    continue
                assert isinstance(piece, SelectedRows)
                values = (piece.values * scale).astype(piece.values.dtype, copy=False)
                scope.put(name, SelectedRows(piece.rows, values, piece.height))
            else:
                scope.put(name, SelectedRows(np.zeros(0, np.int64),
                                             np.zeros((0,) + self.width, self.dtype), self.rows))


class TouchedRows:
    """The rows of each tracked var written since checkpoint `since` (None: no checkpoint, so
    every row counts as written). A var whose written rows pass `limit` of its rows counts as
    wholly written: a checkpoint writes it whole then anyway, and the set stays bounded."""

    def __init__(self, tracked: Mapping[str, int], limit: float) -> None:
        self.tracked = dict(tracked)  # var -> its rows
        self.limit = limit
        self.since: str | None = None
        self._rows: dict[str, set[int] | None] = dict.fromkeys(self.tracked)

    def mark(self, name: str, rows: np.ndarray) -> None:
        held = self._rows.get(name)
        if held is None:  # untracked, or already wholly written
            return
        held.update(np.asarray(rows).reshape(-1).tolist())
        if len(held) > self.limit * self.tracked[name]:
            self._rows[name] = None

    def mark_all(self, name: str) -> None:
        if name in self._rows:
            self._rows[name] = None

    def rows(self, name: str) -> np.ndarray | None:
        """The sorted rows of `name` written since `since`; None: any may have been."""
        held = self._rows[name]
        return None if held is None else np.array(sorted(held), np.int64)

    def reset(self, since: str | None) -> None:
        """Nothing written since checkpoint `since` (just saved or loaded)."""
        self.since = since
        self._rows = {name: (set() if since is not None else None) for name in self.tracked}

    def mark_block(self, ops: list[Op], scope: Scope) -> None:
        """Mark what `ops`, just run in `scope` (their block's vars still there), wrote."""
        if not self.tracked:
            return
        for op in ops:
            written = [n for n in op.output_arg_names if n in self._rows]
            if not written:
                continue
            rows = rows_written(op, scope)
            for name in written:
                if rows is None:
                    self.mark_all(name)
                else:
                    self.mark(name, rows)


def tracked_rows(table: TableShard | None, state: Mapping[str, Var]) -> dict[str, int]:
    """The state vars whose rows are the table shard's: the table and its row-aligned
    accumulators (vars of the shard's height), each with its rows."""
    if table is None:
        return {}
    return {name: table.rows for name, var in state.items()
            if len(var.shape) >= 1 and var.shape[0] == table.rows}


def rows_written(op: Op, scope: Scope) -> np.ndarray | None:
    """The rows `op`, just run, wrote of its outputs: those of its sparse `Grad` where it is an
    optimizer that writes no others (`numpy_optim.ROW_LOCAL`, or `lazy_mode`); None: any."""
    if op.type not in ROW_LOCAL and not op.attr("lazy_mode", False):
        return None
    grads = op.input("Grad")
    grad = scope.raw(grads[0]) if len(grads) == 1 and scope.has(grads[0]) else None
    return host_value(grad.rows) if isinstance(grad, SelectedRows) else None


def remote_tables(program: Program, lsv: Op) -> frozenset[str]:
    """The param blocks trainers may read rows of by id (remote sparse update): those updated
    by sparse grads, the distributed table aside (it is read through its prefetch blocks)."""
    block0 = program.global_block()
    return frozenset(param for _, param in _pairs(lsv.attr("sparse_grad_to_param", []))
                     if block0.var(param).type is not VarType.SELECTED_ROWS)


def lookup_rows(name: str, table: np.ndarray, value: Any) -> np.ndarray:
    """Rows `value` (ids, any shape) of param block `name`, whose value is `table`."""
    ids = _int_ids(name, value)
    outside = ids[(ids < 0) | (ids >= table.shape[0])]
    if outside.size:
        raise TableRequestError(f"var {name!r}: rows {np.unique(outside)[:8].tolist()} are "
                                f"outside its {table.shape[0]} rows", name)
    return table[ids]


def _int_ids(name: str, value: Any) -> np.ndarray:
    """Ids of shape [n] or [n, 1], flat."""
    array = value.data if isinstance(value, LoDTensor) else value
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.integer):
        raise TableRequestError(f"var {name!r}: ids must be a dense integer tensor, got "
                                f"{getattr(array, 'dtype', type(array).__name__)}", name)
    if array.ndim not in (1, 2) or array.shape[1:] not in ((), (1,)):
        raise TableRequestError(f"var {name!r}: ids must be of shape [n] or [n, 1], got "
                                f"{list(array.shape)}", name)
    return array.reshape(-1).astype(np.int64)


def _phantom_ids(name: str, value: Phantom) -> int:
    """How many ids a phantom of ids (of shape [n] or [n, 1]) stands for."""
    shape = value.shape
    if len(shape) not in (1, 2) or shape[1:] not in ((), (1,)) or \
            not np.issubdtype(value.dtype, np.integer):
        raise TableRequestError(f"var {name!r}: ids must be integers of shape [n] or [n, 1], got "
                                f"{value}", name)
    return shape[0]


def _pairs(entries: list[Any]) -> list[tuple[str, str]]:
    """``"a:b"`` attribute entries as (a, b), split at the last colon."""
    return [(a, b) for a, _, b in (str(e).rpartition(":") for e in entries)]
