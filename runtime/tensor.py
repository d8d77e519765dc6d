"""Runtime tensor values: dense numpy arrays, `LoDTensor` (an array with sequence offsets) and
`SelectedRows` (a sparse set of rows of a taller tensor).

A scope stores one of these three per variable name. Kernels mostly see plain arrays: the
kernel context unwraps a `LoDTensor` to its data and hands the LoD over separately, so only ops
that care about sequences (`sequence_pool`, ops that pass the LoD on) look at it.

LoD follows Paddle's offset form: ``[[0, 2, 5]]`` is two sequences of 2 and 3 rows. With several
levels, the offsets of level ``k`` index the sequences of level ``k + 1`` and the last level
indexes rows of the data.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import numpy.typing as npt

LoD = list[list[int]]


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

    def __init__(self, data: np.ndarray, lod: Sequence[Sequence[int]] = ()) -> None:
        data = np.asarray(data)
        if lod and data.ndim == 0:
            raise TensorError("a LoDTensor with a LoD needs at least one dimension")
        self.data = data
        self.lod: LoD = validate_lod(lod, data.shape[0]) if lod else []

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype:
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

    def __init__(self, rows: np.ndarray | Sequence[int], values: np.ndarray, height: int) -> None:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        values = np.asarray(values)
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
    def dtype(self) -> np.dtype:
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


Value = np.ndarray | LoDTensor | SelectedRows
"""What a scope holds for one variable."""


def copy_value(value: Value | npt.ArrayLike) -> Value:
    """A deep copy; anything that is not a LoDTensor or SelectedRows becomes a numpy array."""
    if isinstance(value, LoDTensor):
        return LoDTensor(value.data.copy(), value.lod)
    if isinstance(value, SelectedRows):
        return SelectedRows(value.rows.copy(), value.values.copy(), value.height)
    return np.array(value, copy=True)


def to_dense(value: Value) -> np.ndarray:
    """The dense array of any value: a LoDTensor's data, SelectedRows scattered into zeros."""
    if isinstance(value, LoDTensor):
        return value.data
    if isinstance(value, SelectedRows):
        return value.to_dense()
    return value


def lod_of(value: Value) -> LoD:
    """The LoD of a value; empty for anything but a LoDTensor with sequences."""
    return value.lod if isinstance(value, LoDTensor) else []


__all__ = ["LoD", "LoDTensor", "SelectedRows", "TensorError", "Value", "copy_value", "lod_of",
           "to_dense", "validate_lod"]
