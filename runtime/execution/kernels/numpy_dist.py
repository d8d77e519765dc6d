"""Kernels of the compute ops the distribute transpiler adds around RPC ops.

- `split_byref`: cut a dense grad along rows into blocks of ``sections`` rows.
- `split_selected_rows`: cut a `SelectedRows` grad by row range (``height_sections``); each
  piece's rows are re-based to its block (row ``r`` of block ``i`` is global row
  ``offset_i + r``), as the pserver holds the block as a var of its own.
- `ref_by_trainer_id`: DC-ASGD's pick of one trainer's parameter backup.
- `sparse_delta`: geo's delta of a sparse table, ``(X - Y) * scale`` as a `SelectedRows` of only
  the rows where X and Y differ (sorted, each once).

The distributed lookup table (see `transpiler.distribute.lookup_table`; ids are global):

- `split_ids`: ids, or the table's `SelectedRows` grad, cut by owner (``height_sections``: the
  ids each pserver owns, in order). Ids go out unique and sorted, as ``[n, 1]`` int64, so each
  row is fetched once; grad pieces keep their global rows and the table's height.
- `merge_ids`: the rows the pservers answered, put back in the order of the ids.
- `lookup_sparse_table` (`lookup_sparse_table_read` in the 2.x programs): a pserver's lookup
  of rows of its table shard (the runtime has turned the ids into rows of the shard);
  `lookup_table`'s own kernel.
- `fake_init`: the trainer's placeholder for the table: zeros of its shape that take no memory.
- `save`: a var to a ``.npy`` file (no pickle), where a pserver's checkpoint block writes the
  table.

They only move data, so the torch backend shares these kernels (see `torch_control`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from transpiler.distribute.lookup_table import CHECKPOINT_PATH_VAR

from runtime.config.atomic import atomic_open
from runtime.execution.kernels import numpy_nn
from runtime.execution.kernels.common import lookup_lead, lookup_version
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.tensor import SelectedRows, to_dense


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


@register("sparse_delta")
def sparse_delta(ctx: KernelContext) -> None:
    x, y = to_dense(ctx.input("X")), to_dense(ctx.input("Y"))
    if x.shape != y.shape:
        raise ValueError(f"X {list(x.shape)} and Y {list(y.shape)} differ in shape")
    diff = x - y
    rows = np.flatnonzero((diff != 0).reshape(diff.shape[0], -1).any(axis=1))
    ctx.set_output("Out", SelectedRows(rows, diff[rows] * ctx.attr("scale", 1.0), x.shape[0]))


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


# -- the distributed lookup table -----------------------------------------------------------------
def _ids(value: np.ndarray, rows: int) -> np.ndarray:
    """Int ids of any shape, flat, checked against a table of `rows` rows."""
    if not np.issubdtype(value.dtype, np.integer):
        raise TypeError(f"Ids must be integer ids or a SelectedRows grad, got {value.dtype}")
    ids = value.reshape(-1).astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise IndexError(f"Ids {ids.min()}..{ids.max()} outside the table's {rows} rows")
    return ids


@register("split_ids")
def split_ids(ctx: KernelContext) -> None:
    """Out[i] = what of Ids falls in pserver i's id range (see the module docstring)."""
    x = ctx.input("Ids")
    sections = [int(s) for s in ctx.attr("height_sections")]
    if isinstance(x, SelectedRows):
        starts = _offsets(sections, x.height, "height_sections")
        for i in range(len(sections)):
            mine = (x.rows >= starts[i]) & (x.rows < starts[i + 1])
            ctx.set_output("Out", SelectedRows(x.rows[mine], x.values[mine], x.height), index=i)
        return
    starts = _offsets(sections, sum(sections), "height_sections")
    unique = np.unique(_ids(x, starts[-1]))
    bounds = np.searchsorted(unique, starts)
    for i in range(len(sections)):
        ctx.set_output("Out", unique[bounds[i]:bounds[i + 1]].reshape(-1, 1), index=i)


@register("merge_ids")
def merge_ids(ctx: KernelContext) -> None:
    """Out[j] = the row answered for Ids[j]: pserver i was asked for ids Rows[i] and answered
    the rows X[i], in that order. Out is shaped like the lookup's it stands in for
    (``lookup_table_version``: `lookup_table`'s by default) and keeps the Ids' LoD."""
    ids_in = ctx.input("Ids")
    ids = ids_in.reshape(-1).astype(np.int64, copy=False)
    asked = np.concatenate([r.reshape(-1) for r in ctx.inputs("Rows")]).astype(np.int64)
    answered = np.concatenate(ctx.inputs("X"))
    if asked.shape[0] != answered.shape[0]:
        raise ValueError(f"merge_ids: {asked.shape[0]} ids asked (Rows) but {answered.shape[0]} "
                         "rows answered (X)")
    order = np.argsort(asked, kind="stable")
    at = np.minimum(np.searchsorted(asked[order], ids), max(asked.size - 1, 0))
    missing = ids[asked[order][at] != ids] if asked.size else ids
    if missing.size:
        raise ValueError(f"merge_ids: ids {np.unique(missing)[:8].tolist()} were asked of no "
                         "pserver (Rows)")
    lead = lookup_lead(ids_in.shape, lookup_version(ctx))
    out = answered[order[at]].reshape(lead + answered.shape[1:])
    ctx.set_output("Out", out, lod=ctx.lod("Ids"))


register("lookup_sparse_table")(numpy_nn.lookup_table)
register("lookup_sparse_table_read")(numpy_nn.lookup_table)  # its name in 2.x's programs


@register("fake_init")
def fake_init(ctx: KernelContext) -> None:
    """Zeros of ``shape`` and ``dtype`` as a read-only broadcast view: the shape is all a trainer
    reads of the table (its lookups go to the pservers), so it costs no memory."""
    shape = tuple(int(d) for d in ctx.attr("shape"))
    ctx.set_output("Out", np.broadcast_to(np.zeros((), np.dtype(ctx.attr("dtype", "float32"))), shape))


@register("save")
def save(ctx: KernelContext) -> None:
    """Write the dense X to the ``.npy`` file ``file_path`` (no pickle); where that is "none" (a
    pserver's checkpoint block), to the path the RAW var ``kLookupTablePath`` holds, which the
    runtime sets when a checkpoint notification comes."""
    (name,) = ctx.input_names("X")
    x = ctx.input("X")
    if isinstance(x, SelectedRows):
        raise TypeError(f"save: X {name!r} is SelectedRows; only dense values are saved")
    path = str(ctx.attr("file_path", "none"))
    if path == "none":
        if not ctx.scope.has(CHECKPOINT_PATH_VAR):
            raise ValueError(f"save: file_path is 'none' and {CHECKPOINT_PATH_VAR} holds no path "
                             "(a checkpoint notification sets it)")
        path = str(ctx.scope.get(CHECKPOINT_PATH_VAR).item())
    with atomic_open(Path(path), binary=True) as f:
        np.save(f, np.ascontiguousarray(x), allow_pickle=False)
