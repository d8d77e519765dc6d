"""Kernels of the compute ops the distribute transpiler adds around RPC ops.

- `split_byref`: cut a dense grad along rows into blocks of ``sections`` rows.
- `split_selected_rows`: cut a `SelectedRows` grad by row range (``height_sections``); each
  piece's rows are re-based to its block (row ``r`` of block ``i`` is global row
  ``offset_i + r``), as the pserver holds the block as a var of its own.
- `ref_by_trainer_id`: DC-ASGD's pick of one trainer's parameter backup.

They only move data, so the torch backend shares these kernels (see `torch_control`).
"""

from __future__ import annotations

import numpy as np

from ..tensor import SelectedRows, to_dense
from .context import KernelContext
from .registry import register


def _offsets(sections: list[int], total: int, what: str) -> list[int]:
    if sum(sections) != total:
        raise ValueError(f"{what} {sections} add up to {sum(sections)}, not {total} rows")
    return [0] + list(np.cumsum(sections))


@register("split_byref")
def split_byref(ctx: KernelContext) -> None:
    x = to_dense(ctx.input("X"))
    sections = [int(s) for s in ctx.attr("sections")]
    starts = _offsets(sections, x.shape[0], "sections")
    for i in range(len(sections)):
        ctx.set_output("Out", x[starts[i]:starts[i + 1]], index=i)


@register("split_selected_rows")
def split_selected_rows(ctx: KernelContext) -> None:
    x = ctx.input("X")
    if not isinstance(x, SelectedRows):
        raise TypeError(f"X must be SelectedRows, got {type(x).__name__}")
    sections = [int(s) for s in ctx.attr("height_sections")]
    starts = _offsets(sections, x.height, "height_sections")
    for i in range(len(sections)):
        mine = (x.rows >= starts[i]) & (x.rows < starts[i + 1])
        ctx.set_output("Out", SelectedRows(x.rows[mine] - starts[i], x.values[mine], sections[i]),
                       index=i)


@register("ref_by_trainer_id")
def ref_by_trainer_id(ctx: KernelContext) -> None:
    """Out = X[TrainerId]: DC-ASGD's backup of the parameter the trainer last fetched."""
    xs = ctx.inputs("X")
    trainer = int(np.asarray(ctx.input("TrainerId")).reshape(-1)[0])
    if not 0 <= trainer < len(xs):
        raise ValueError(f"TrainerId {trainer} is outside the {len(xs)} backups")
    ctx.set_output("Out", xs[trainer])
