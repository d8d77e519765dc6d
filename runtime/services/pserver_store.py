"""A pserver's values: its `Scope`, read and written only as the protocol allows.

Received values are checked against the program's declarations (name received here, dtype and
shape as declared, rows of the declared height) before anything is stored, so a bad message
leaves the state bit-identical. A dense value is stored as it was decoded, a read-only view of
the message's frame (no kernel writes an input, and one that writes in place first asks whether
the array is its own: `runtime.execution.kernels.buffers`); DESIGN: copying each gradient out
of its frame was a fifth of a pserver's samples on a wide model (py-spy,
`benchmarks/step_split.py`). Rows (SelectedRows) are copied out of the frames, since the table's
code merges them. Phantoms (timing mode) are checked as the tensors they stand for and stored
as they are.

The store is plain in-memory state with no IO: the pserver core reads and writes it directly;
running blocks over it is the IO shell's business (the core asks for it with actions).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from transpiler.distribute.contract import TRAINER_ID_VAR, ServeContract, bak_name
from transpiler.ir import Program, Var, VarType

from runtime.execution.scope import Scope
from runtime.execution.table import (PrefetchBlock, TableShard, TouchedRows, lookup_rows,
                                     remote_tables)
from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, to_dense
from runtime.services.pserver_messages import ProtocolViolation


class Store:
    """The scope of one pserver, with its program's declarations and contract."""

    def __init__(self, program: Program, contract: ServeContract, scope: Scope,
                 timing: bool) -> None:
        self.program = program
        self.contract = contract
        self.scope = scope
        self.timing = timing
        """Timing mode (phantom kernels): there are no values to checkpoint."""
        self.table = TableShard.of(program, contract.op)
        self.remote_tables = remote_tables(program, contract.op)
        self.touched = TouchedRows({}, 1.0)
        """Rows of the table's state written since the last checkpoint (its owner sets which
        vars it tracks); a value stored here counts as wholly written."""
        self._fitting: set[tuple[str, Phantom]] = set()
        """(name, phantom) pairs received and found to fit, which fit again: neither the
        program's declarations nor a phantom change (timing mode sends the same ones every
        step)."""

    # -- sends --------------------------------------------------------------------------------------
    def checked(self, values: dict[str, Any], trainer: int) -> dict[str, Any]:
        """`values` of `trainer` checked against the program's declarations, as they would be
        stored (rows copied out of the receive buffer). A var that is one trainer's own copy (sync
        mode's ``grad.trainer_N``) may come from that trainer only."""
        self._check_owner(values, trainer)
        return {name: self._to_shard(name, self._checked(name, value))
                for name, value in values.items()}

    def check(self, values: dict[str, Any], trainer: int) -> None:
        """Raise as `checked` would, copying nothing (a request held for later: refused now
        rather than held, if it could never be stored)."""
        self._check_owner(values, trainer)
        for name, value in values.items():
            self._checked(name, value, copy=False)

    def put(self, checked: dict[str, Any], merge_add: bool) -> list[str]:
        """Store `checked` values (`merge_add`: added to what is held, as a counter); the names
        stored."""
        for name, value in checked.items():
            if merge_add and self.scope.has(name) and not isinstance(value, Phantom):
                value = to_dense(self.scope.get_tensor(name)) + to_dense(value)
            self.scope.put(name, value)
            self.touched.mark_all(name)
        return list(checked)

    def _check_owner(self, values: dict[str, Any], trainer: int) -> None:
        copies = self.contract.trainer_copies
        for name in values:
            owner = copies.get(name)
            if owner is not None and owner != trainer:
                raise ProtocolViolation(f"trainer {trainer} sent {name!r}, trainer {owner}'s "
                                        "own copy: a trainer writes only its own gradients",
                                        var=name, reason="not_own_var")

    def nonfinite(self, checked: dict[str, Any]) -> dict[str, tuple[int, float]]:
        """The float values among `checked` holding NaN, an infinity or a magnitude beyond
        `out_of_range`: name -> how many such elements, and that bound (empty: every value is
        sound).

        DESIGN: the sound case, nearly every message, costs one pass over each tensor and no
        temporary array (`_surely_sound`, else a min and a max); only an unsound tensor is
        counted element by element."""
        bad: dict[str, tuple[int, float]] = {}
        with np.errstate(over="ignore", invalid="ignore"):  # what it is there to find
            for name, value in checked.items():
                array = _float_data(value)
                if array is None or not array.size:
                    continue
                bound = out_of_range(array.dtype)
                if _surely_sound(array, bound):
                    continue
                low, high = array.min(), array.max()
                if -bound <= low and high <= bound:  # False for a NaN
                    continue
                bad[name] = (int(np.count_nonzero(~(np.abs(array) <= bound))), bound)
        return bad

    def _checked(self, name: str, value: Any, copy: bool = True) -> Any:
        if type(value) is Phantom and (name, value) in self._fitting:
            return value
        var = self.program.global_block().vars.get(name)
        if var is None or name not in self.contract.received:
            raise ProtocolViolation(f"gradient for var {name!r}, which this pserver does not own",
                                    var=name)
        if isinstance(value, Phantom) and not self.timing:
            raise ProtocolViolation(_phantom_refused(name), var=name)
        if isinstance(value, Phantom):
            checked = _checked_phantom(name, var, value)
            if type(value) is Phantom and len(self._fitting) < _FITTING_MAX:
                self._fitting.add((name, value))
            return checked
        if isinstance(value, SelectedRows):
            if value.values.dtype != np.dtype(var.dtype) or value.height != var.shape[0] \
                    or tuple(value.values.shape[1:]) != tuple(var.shape[1:]):
                raise ProtocolViolation(
                    f"var {name!r}: expected rows of {var.dtype}{list(var.shape[1:])} with height "
                    f"{var.shape[0]}, got {value.values.dtype}{list(value.values.shape[1:])} "
                    f"with height {value.height}", var=name)
            return SelectedRows(np.array(value.rows, copy=copy), np.array(value.values, copy=copy),
                                value.height)
        array = value.data if isinstance(value, LoDTensor) else value
        if array.dtype != np.dtype(var.dtype) or not _shape_matches(var.shape, array.shape):
            raise ProtocolViolation(f"var {name!r}: expected {var.dtype}{list(var.shape)}, got "
                                    f"{array.dtype}{list(array.shape)}", var=name)
        return array  # the frame's read-only view: see the module doc

    def _to_shard(self, name: str, value: Any) -> Any:
        """A received table grad piece as rows of this server's shard; other values as they are."""
        if self.table is None or name not in self.table.pieces:
            return value
        return self.table.local_rows(name, value)

    # -- reads ----------------------------------------------------------------------------------------
    def values(self, names: Iterable[str]) -> dict[str, Any]:
        """The held values of `names`, each one this server declares and holds."""
        names = list(names)
        block = self.program.global_block()
        for name in names:
            if name not in block.vars or not self.scope.has(name):
                raise ProtocolViolation(f"GET of var {name!r}, which this pserver does not hold",
                                        var=name)
        return {name: self.scope.get_tensor(name) for name in names}

    def remote_rows(self, table: object, ids: dict[str, Any]) -> dict[str, Any]:
        """Rows of param block `table` by row (remote sparse update)."""
        self._check_ids(ids)
        if not isinstance(table, str) or table not in self.remote_tables:
            raise ProtocolViolation(f"PREFETCH of rows of var {table!r}, which this pserver does "
                                    "not serve by id", var=str(table))
        if set(ids) != {"Ids"}:
            raise ProtocolViolation(f"PREFETCH of rows of var {table!r} carries vars "
                                    f"{sorted(ids)}, not just 'Ids'", var=table)
        return {table: lookup_rows(table, self.scope.get(table), ids["Ids"])}

    def table_ids(self, ids: dict[str, Any]) -> list[tuple[str, Any, PrefetchBlock]]:
        """For each prefetch ids var: its ids made rows of the shard, and its prefetch block
        (the caller sets the var, runs the block, then reads the rows it looked up)."""
        table = self.table
        if table is None:
            raise ProtocolViolation("PREFETCH: this pserver holds no distributed lookup table")
        self._check_ids(ids)
        rows = {name: table.local_ids(name, value) for name, value in ids.items()}
        return [(name, value, table.prefetch[name]) for name, value in rows.items()]

    def _check_ids(self, ids: dict[str, Any]) -> None:
        """Prefetch ids on a numeric server are real ids, not phantoms."""
        for name, value in ids.items():
            if isinstance(value, Phantom) and not self.timing:
                raise ProtocolViolation(_phantom_refused(name), var=name)

    # -- mode-specific writes
    # ---------------------------------------------------------------------------
    def empty_copies(self, trainers: Iterable[int]) -> None:
        """The grad copies of `trainers` (who did not contribute this step) add nothing to the
        sums: zero (dense) or holding no rows (sparse), whether or not they were ever sent.
        The table's pieces are the table's business (`average_table`)."""
        silent = set(trainers)
        pieces = self.table.pieces if self.table is not None else {}
        block = self.program.global_block()
        for name, trainer in self.contract.trainer_copies.items():
            if trainer not in silent or name in pieces:
                continue
            var = block.var(name)
            if var.type is VarType.SELECTED_ROWS:
                empty = np.zeros((0,) + tuple(var.shape[1:]), var.dtype)
                self.scope.put(name, SelectedRows(np.zeros(0, np.int64), empty, var.shape[0]))
            else:
                self.scope.put(name, np.zeros(var.shape, var.dtype))

    def average_table(self, contributors: set[int]) -> None:
        if self.table is not None:
            self.table.average_pieces(self.scope, contributors)

    def set_trainer(self, trainer: int) -> None:
        """DC-ASGD: the trainer whose gradient is applied next."""
        self.scope.put(TRAINER_ID_VAR, np.array([trainer], dtype=np.int64))

    def keep_backups(self, trainer: int, values: dict[str, Any]) -> None:
        """DC-ASGD: `values` are what `trainer` now computes with; keep them as its backups."""
        block = self.program.global_block()
        for name, value in values.items():
            bak = bak_name(name, trainer)
            if bak in block.vars:
                self.scope.put(bak, value)
                self.touched.mark_all(bak)


def out_of_range(dtype: np.dtype[Any]) -> float:
    """The largest gradient magnitude a pserver takes in `dtype`: the square root of the
    dtype's largest value (1.8e19 in float32), since optimizers square gradients (Adam's second
    moment) and a larger one would overflow to infinity; float16, whose root is 255, only
    refuses infinities and NaN."""
    info = np.finfo(dtype)
    return float(info.max) if info.bits < 32 else float(np.sqrt(info.max))


def _surely_sound(array: np.ndarray, bound: float) -> bool:
    """True only if no element of `array` is NaN or beyond `bound` in magnitude, decided by one
    BLAS pass: the dot product of the array with itself, in its own dtype (float32 or float64;
    False, undecided, for others and for arrays not contiguous).

    Why it cannot pass a bad array: every term x*x and every partial sum is rounded to nearest,
    which is monotone, and all are non-negative, so the computed sum is at least each computed
    square. If the sum is at most bound**2 / 4, each square is too (within an ulp), so each |x|
    is at most about bound / 2. A NaN makes the sum NaN, which fails the comparison; a square
    that overflows makes it infinite. False leaves the decision to the exact min and max: any
    element beyond bound / 2 (nothing a sound gradient holds) costs that second look."""
    if array.dtype.itemsize < 4 or not array.flags.c_contiguous:
        return False
    flat = array.reshape(-1)
    return bool(np.dot(flat, flat) <= bound * bound / 4)


def _float_data(value: Any) -> np.ndarray | None:
    """The float array a received value carries (a phantom or an int tensor: none)."""
    if isinstance(value, SelectedRows):
        value = value.values
    elif isinstance(value, LoDTensor):
        value = value.data
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        return None
    return value


_FITTING_MAX = 1 << 14
"""Most (name, phantom) pairs a `Store` remembers as fitting."""


def _phantom_refused(name: str) -> str:
    """Why a phantom cannot come to a numeric server (its optimizer needs values)."""
    return (f"var {name!r}: a phantom (shape only, timing mode) sent to a pserver that computes "
            "with values")


def _checked_phantom(name: str, var: Var, value: Phantom) -> Phantom:
    """A received phantom, checked as the tensor it stands for would be: the declared dtype,
    and rows of the declared height and width, or the declared shape."""
    if value.is_rows:
        fits = value.height == var.shape[0] and value.shape[1:] == tuple(var.shape[1:])
    else:
        fits = _shape_matches(var.shape, value.shape)
    if not fits or value.dtype != np.dtype(var.dtype):
        raise ProtocolViolation(f"var {name!r}: expected {var.dtype}{list(var.shape)}, got {value}",
                                var=name)
    return value


def _shape_matches(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(d in (-1, a) for d, a in zip(declared, actual))
