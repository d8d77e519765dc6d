"""Runtime tensor values: dense numpy arrays, `LoDTensor` (an array with sequence offsets),
`SelectedRows` (a sparse set of rows of a taller tensor) and `Phantom` (a value's shape and dtype
without its data, for timing mode).

A scope stores one of these per variable name. Kernels mostly see plain arrays: the kernel
context unwraps a `LoDTensor` to its data and hands the LoD over separately, so only ops that
care about sequences (`sequence_pool`, ops that pass the LoD on) look at it. Only the phantom
kernels (`runtime.execution.kernels.phantom`) make phantoms, and `shape_of` / `nbytes_of` describe
any value alike, which is all a cost model needs.

LoD follows Paddle's offset form: ``[[0, 2, 5]]`` is two sequences of 2 and 3 rows. With several
levels, the offsets of level ``k`` index the sequences of level ``k + 1`` and the last level
indexes rows of the data.

Native values: a kernel backend with tensors of its own (torch) registers their type with
`register_native`, and the scope then holds them as they are: a dense value may be such a tensor,
a `LoDTensor`'s data and a `SelectedRows`' values may be one too (its rows stay numpy: they are
host-side bookkeeping). `host_value` turns any value into its numpy form through the backend's
converter; that is what every reader outside the kernels sees (`Scope.get`), so conversions happen
only where bytes leave the kernels (wire, fetches, checkpoints). This module never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import numpy.typing as npt

LoD = list[list[int]]
_ROW_INDEX = np.dtype(np.int64)

Dense = Any
"""A dense array: numpy, or a backend tensor registered with `register_native`."""
ToHost = Callable[[Any], np.ndarray]
_to_host: dict[type, ToHost] = {}
"""Native tensor type -> its converter to a numpy array (`register_native`)."""


def register_native(kind: type, to_host: ToHost) -> None:
    """Let the scope hold values of type `kind` (a backend's tensor) as they are; `to_host`
    gives one's numpy array."""
    _to_host[kind] = to_host


def is_native(value: object) -> bool:
    """Whether `value` is a registered backend tensor (not numpy)."""
    return type(value) in _to_host


def host_array(value: Any) -> Any:
    """A native tensor as a numpy array; anything else as it is."""
    convert = _to_host.get(type(value))
    return value if convert is None else convert(value)


class TensorError(ValueError):
    """A malformed tensor value (bad LoD, rows out of range, mismatched lengths)."""


def validate_lod(lod: Sequence[Sequence[int]], num_rows: int) -> LoD:
    """Check `lod` against data of `num_rows` rows and return it as a list of int lists."""
    levels = [[int(o) for o in level] for level in lod]
    for k, level in enumerate(levels):
        if not level or level[0] != 0:
            raise TensorError(f"LoD level {k} must start at 0, got {level}")
        if any(b < a for a, b in zip(level, level[1:])):
            raise TensorError(f"LoD level {k} must be non-decreasing, got {level}")
        end = num_rows if k == len(levels) - 1 else len(levels[k + 1]) - 1
        if level[-1] != end:
            what = "the number of rows" if k == len(levels) - 1 else f"the sequences of level {k + 1}"
            raise TensorError(f"LoD level {k} must end at {end} ({what}), got {level}")
    return levels


class LoDTensor:
    """A dense array whose rows are grouped into sequences by `lod`."""

    __slots__ = ("data", "lod")

    def __init__(self, data: Dense, lod: Sequence[Sequence[int]] = ()) -> None:
        data = data if type(data) in _to_host else np.asarray(data)
        if lod and data.ndim == 0:
            raise TensorError("a LoDTensor with a LoD needs at least one dimension")
        self.data = data
        self.lod: LoD = validate_lod(lod, data.shape[0]) if lod else []

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> Any:
        """The data's dtype (a numpy dtype, or the native tensor's own)."""
        return self.data.dtype

    def sequence_lengths(self, level: int = -1) -> list[int]:
        offsets = self.lod[level]
        return [b - a for a, b in zip(offsets, offsets[1:])]

    def __repr__(self) -> str:
        return f"LoDTensor(shape={self.shape}, dtype={self.dtype}, lod={self.lod})"


class SelectedRows:
    """Rows `rows` of a [height, ...] tensor, with `values[i]` the contents of row `rows[i]`.

    Rows may repeat (their values add up) and need not be sorted; `merged()` normalizes both.
    """

    __slots__ = ("rows", "values", "height")

    def __init__(self, rows: np.ndarray | Sequence[int], values: Dense, height: int) -> None:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        values = values if type(values) in _to_host else np.asarray(values)
        if values.ndim == 0 or values.shape[0] != rows.shape[0]:
            raise TensorError(f"SelectedRows: {rows.shape[0]} rows but values of shape {values.shape}")
        height = int(height)
        if rows.size and (rows.min() < 0 or rows.max() >= height):
            raise TensorError(f"SelectedRows: rows must lie in [0, {height}), got {rows.min()}..{rows.max()}")
        self.rows = rows
        self.values = values
        self.height = height

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the dense tensor these rows belong to."""
        return (self.height,) + tuple(self.values.shape[1:])

    @property
    def dtype(self) -> Any:
        """The values' dtype (a numpy dtype, or the native tensor's own)."""
        return self.values.dtype

    def to_dense(self) -> np.ndarray:
        dense = np.zeros(self.shape, dtype=self.values.dtype)
        np.add.at(dense, self.rows, self.values)
        return dense

    def merged(self) -> "SelectedRows":
        """Sorted unique rows, the values of repeated rows summed."""
        unique, inverse = np.unique(self.rows, return_inverse=True)
        values = np.zeros((unique.shape[0],) + self.values.shape[1:], dtype=self.values.dtype)
        np.add.at(values, inverse, self.values)
        return SelectedRows(unique, values, self.height)

    def __repr__(self) -> str:
        return (f"SelectedRows(height={self.height}, rows={self.rows.tolist()}, "
                f"values_shape={tuple(self.values.shape)}, dtype={self.dtype})")


@dataclass(frozen=True)
class Phantom:
    """A value's shape and dtype without its data, for timing-only simulation at scale.

    It stands for a dense array of `shape`, or, with a `height`, for a `SelectedRows` whose
    values have `shape` (``shape[0]`` rows of a tensor `height` rows tall); `lod` is the LoD a
    `LoDTensor` of that shape would have. Phantoms are immutable, so they are never copied.
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    height: int | None = None
    lod: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        shape = self.shape
        if type(shape) is not tuple or not all(type(dim) is int for dim in shape):
            shape = tuple(int(dim) for dim in shape)
            object.__setattr__(self, "shape", shape)
        if shape and min(shape) < 0:
            raise TensorError(f"Phantom: shape {list(shape)} has a negative dimension")
        if not isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.height is None and not self.lod:  # a dense phantom, the common case: done
            return
        if not shape:
            raise TensorError("Phantom: rows or a LoD need a shape of rank >= 1")
        if self.height is not None and int(self.height) < 0:
            raise TensorError(f"Phantom: height {self.height} is negative")
        lod = validate_lod(self.lod, shape[0]) if self.lod else []
        object.__setattr__(self, "height", None if self.height is None else int(self.height))
        object.__setattr__(self, "lod", tuple(tuple(level) for level in lod))

    def __hash__(self) -> int:
        """The hash of the fields (the dataclass's), worked out once: phantoms key the caches
        of op costs and wire entries, which hash them at every op and message."""
        known = self.__dict__.get("_hash")
        if known is None:
            known = hash((self.shape, self.dtype, self.height, self.lod))
            object.__setattr__(self, "_hash", known)
        return known

    @property
    def is_rows(self) -> bool:
        """Whether it stands for a `SelectedRows`."""
        return self.height is not None

    def __str__(self) -> str:
        rows = f" rows of height {self.height}" if self.height is not None else ""
        lod = f" lod {[list(level) for level in self.lod]}" if self.lod else ""
        return f"phantom {self.dtype}{list(self.shape)}{rows}{lod}"

    def dense(self) -> "Phantom":
        """The phantom of its dense form (`to_dense`): rows become the whole `height` tall
        tensor, the LoD goes (itself if it is dense already: phantoms never change)."""
        if self.height is None:
            if not self.lod:
                return self
            return shared_phantom(self.shape, self.dtype)
        return shared_phantom((self.height,) + self.shape[1:], self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes its data would take: the values, and the int64 row indices of rows."""
        rows = self.shape[0] * _ROW_INDEX.itemsize if self.height is not None else 0
        return math.prod(self.shape) * self.dtype.itemsize + rows


Value = np.ndarray | LoDTensor | SelectedRows | Phantom
"""What a scope holds for one variable."""

_SHARED: dict[tuple[Any, ...], Phantom] = {}
SHARED_MAX = 1 << 12
"""Most phantoms `shared_phantom` keeps (later new ones are made afresh, not kept)."""


def shared_phantom(shape: Sequence[int], dtype: npt.DTypeLike,
                   lod: tuple[tuple[int, ...], ...] = ()) -> Phantom:
    """`Phantom(shape, dtype, lod=lod)`, one object for all equal ones: the same value, made once.

    DESIGN: timing mode makes a phantom for every op output and every block it sends, step
    after step, and nearly all are of the few shapes of the program; a phantom is immutable,
    so equal ones may be one object. That saves building and checking each (a frozen
    dataclass's `__init__` is costly), and those who compare or hash phantoms (the compute
    model's cache of op costs) find identical ones at once. Phantoms made by `Phantom(...)`
    stay as good: equality, not identity, is what every reader relies on."""
    shape = tuple(shape)
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    key = (shape, dtype, lod)
    try:
        phantom = _SHARED.get(key)
    except TypeError:  # a LoD given as lists: not a key, but a phantom all the same
        return Phantom(shape, dtype, lod=lod)
    if phantom is None:
        phantom = Phantom(shape, dtype, lod=lod)
        if len(_SHARED) < SHARED_MAX:
            _SHARED[key] = phantom
    return phantom


def shape_of(value: Value) -> tuple[int, ...]:
    """The shape of the data `value` holds: an array's or a LoDTensor's shape, a SelectedRows'
    values' shape (rows present, then the row's dims; not the dense height), a phantom's shape."""
    if isinstance(value, LoDTensor):
        return tuple(value.data.shape)
    if isinstance(value, SelectedRows):
        return tuple(value.values.shape)
    return tuple(value.shape)


def nbytes_of(value: Value) -> int:
    """Bytes of the data `value` holds (for a phantom: would hold); a SelectedRows counts its
    values and its int64 row indices, as the wire carries them."""
    if isinstance(value, LoDTensor):
        return int(value.data.nbytes)
    if isinstance(value, SelectedRows):
        return int(value.values.nbytes + value.rows.nbytes)
    return int(value.nbytes)


def phantom_of(value: Value) -> Phantom:
    """The phantom of a value: its shape, dtype, LoD and (for rows) height, without the data."""
    if isinstance(value, Phantom):
        return value
    if isinstance(value, LoDTensor):
        return Phantom(value.data.shape, value.data.dtype, lod=tuple(map(tuple, value.lod)))
    if isinstance(value, SelectedRows):
        return Phantom(value.values.shape, value.values.dtype, value.height)
    return Phantom(value.shape, value.dtype)


def slice_rows(value: np.ndarray | Phantom, start: int, stop: int) -> np.ndarray | Phantom:
    """Rows [start, stop) of a dense array or a dense phantom."""
    if isinstance(value, Phantom):
        rows = max(0, min(stop, value.shape[0]) - start)
        return shared_phantom((rows,) + value.shape[1:], value.dtype)
    return value[start:stop]


def concat_rows(values: Sequence[np.ndarray | Phantom]) -> np.ndarray | Phantom:
    """Dense arrays stacked along their rows; a phantom if any of them is one."""
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    if len(arrays) < len(values):
        rows = sum(shape_of(v)[0] for v in values)
        return shared_phantom((rows,) + shape_of(values[0])[1:], values[0].dtype)
    return np.concatenate(arrays, axis=0)


def host_value(value: Any) -> Any:
    """`value` with every native tensor in it (dense, a LoDTensor's data, a SelectedRows'
    values) as numpy; a value that holds none is returned as it is."""
    kind = type(value)
    if kind is np.ndarray:
        return value
    if kind in _to_host:
        return _to_host[kind](value)
    if kind is LoDTensor and type(value.data) in _to_host:
        return LoDTensor(host_array(value.data), value.lod)
    if kind is SelectedRows and type(value.values) in _to_host:
        return SelectedRows(value.rows, host_array(value.values), value.height)
    return value


def copy_value(value: Value | npt.ArrayLike) -> Value:
    """A deep copy (a phantom is itself); anything that is not a LoDTensor, SelectedRows or
    Phantom becomes a numpy array."""
    if isinstance(value, Phantom):
        return value
    value = host_value(value)
    if isinstance(value, LoDTensor):
        return LoDTensor(value.data.copy(), value.lod)
    if isinstance(value, SelectedRows):
        return SelectedRows(value.rows.copy(), value.values.copy(), value.height)
    return np.array(value, copy=True)


def to_dense(value: Value) -> np.ndarray:
    """The dense array of any value: a LoDTensor's data, SelectedRows scattered into zeros (a
    phantom has none: TypeError)."""
    if isinstance(value, Phantom):
        raise TypeError(f"a phantom {value} has no data (timing mode); nothing reads its values")
    if isinstance(value, LoDTensor):
        return value.data
    if isinstance(value, SelectedRows):
        return value.to_dense()
    return value


def lod_of(value: Value) -> LoD:
    """The LoD of a value; empty for anything but a LoDTensor with sequences."""
    return value.lod if isinstance(value, LoDTensor) else []


__all__ = ["Dense", "LoD", "LoDTensor", "Phantom", "SelectedRows", "TensorError", "ToHost", "Value",
           "concat_rows", "copy_value", "host_array", "host_value", "is_native", "lod_of",
           "nbytes_of", "phantom_of", "register_native", "shape_of", "shared_phantom",
           "slice_rows", "to_dense", "validate_lod"]
