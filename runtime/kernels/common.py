"""Small helpers shared by the numpy kernel modules."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..tensor import SelectedRows
from .context import KernelContext


def out_grad(ctx: KernelContext, like: np.ndarray, slot: str = "Out@GRAD") -> np.ndarray:
    """The gradient flowing into an output; a missing one means zero."""
    g = ctx.input(slot)
    return np.zeros_like(like) if g is None else g


def scalar(value: np.ndarray) -> Any:
    """The single element of a [1]-shaped array, as a numpy scalar (keeps its dtype)."""
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"expected a single element, got shape {np.shape(value)}")
    return flat[0]


def dense_like(value: np.ndarray | SelectedRows, rows: int, what: str) -> np.ndarray:
    """`value` as a dense array; a SelectedRows must have `rows` as its height."""
    if isinstance(value, SelectedRows):
        if value.height != rows:
            raise ValueError(f"{what}: SelectedRows height {value.height} != {rows} rows")
        return value.to_dense()
    return value


__all__ = ["dense_like", "out_grad", "scalar"]
