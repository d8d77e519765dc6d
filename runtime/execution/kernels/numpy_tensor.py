"""Tensor products and shaping ops: `matmul` and `matmul_v2` (transposes, batched, broadcast),
`reshape2`, `transpose2`, `squeeze2`, `unsqueeze2`, `split`, `slice`, `gather`, and the
`sigmoid_cross_entropy_with_logits` loss, each with its gradient kernel.

The ``*2`` shaping ops also write Paddle's XShape: an empty array of shape [0] + X's shape
(`shapes.xshape`). Their gradients read X's shape from X itself, which the grad op receives too.
"""

from __future__ import annotations

import numpy as np

from transpiler.ir import grad_name

from runtime.execution.kernels.common import out_grad
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.kernels.shapes import (matmul_flags, matmul_shape, reshaped,
                                              shared_lod, slice_bounds, split_sizes,
                                              transpose_perm, xshape)

Array = np.ndarray


# -- matmul -------------------------------------------------------------------------------------
def _t(a: Array, flag: bool) -> Array:
    return np.swapaxes(a, -1, -2) if flag and a.ndim >= 2 else a


def unbroadcast(d: Array, shape: tuple[int, ...]) -> Array:
    """`d`, the gradient of a value of `shape` broadcast up to d's shape, summed back to it."""
    lead = d.ndim - len(shape)
    d = d.sum(axis=tuple(range(lead))) if lead > 0 else d
    ones = tuple(i for i, n in enumerate(shape) if n == 1 and d.shape[i] != 1)
    return d.sum(axis=ones, keepdims=True) if ones else d


def matrices(x: Array, y: Array) -> tuple[Array, Array]:
    """X and Y with a 1-D operand made a matrix: X a row [1, K], Y a column [K, 1]."""
    return (x[None, :] if x.ndim == 1 else x), (y[:, None] if y.ndim == 1 else y)


@register("matmul")
@register("matmul_v2")
def matmul(ctx: KernelContext) -> None:
    x, y = ctx.input("X"), ctx.input("Y")
    tx, ty, alpha = matmul_flags(ctx)
    shape = matmul_shape(x.shape, y.shape, tx, ty)
    out = np.matmul(_t(x, tx), _t(y, ty))
    ctx.set_output("Out", (out * alpha if alpha != 1.0 else out).reshape(shape))


@register("matmul_grad")
@register("matmul_v2_grad")
def matmul_grad(ctx: KernelContext) -> None:
    x, y = ctx.input("X"), ctx.input("Y")
    tx, ty, alpha = matmul_flags(ctx)
    x2, y2 = matrices(x, y)
    a, b = _t(x2, tx), _t(y2, ty)
    g = out_grad(ctx, ctx.input("Out")).reshape(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                                                 + (a.shape[-2], b.shape[-1]))
    g = g * alpha if alpha != 1.0 else g
    if ctx.has_output("X@GRAD"):
        da = unbroadcast(np.matmul(g, np.swapaxes(b, -1, -2)), a.shape)
        ctx.set_output("X@GRAD", _t(da, tx).reshape(x.shape).astype(x.dtype, copy=False))
    if ctx.has_output("Y@GRAD"):
        db = unbroadcast(np.matmul(np.swapaxes(a, -1, -2), g), b.shape)
        ctx.set_output("Y@GRAD", _t(db, ty).reshape(y.shape).astype(y.dtype, copy=False))


# -- reshape2, transpose2, squeeze2, unsqueeze2 -------------------------------------------------
def _reshaped(ctx: KernelContext, shape: tuple[int, ...]) -> None:
    """Out: X's data in `shape` (with X's LoD where the first dim stays, `shared_lod`);
    XShape: [0] + X's shape."""
    x = ctx.input("X")
    ctx.set_output("Out", x.reshape(shape), lod=shared_lod(ctx, x.shape, shape))
    ctx.set_output("XShape", np.empty(xshape(x.shape), dtype=x.dtype))


def _grad_as_x(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("X@GRAD", out_grad(ctx, ctx.input("Out")).reshape(x.shape))


@register("reshape2")
@register("squeeze2")
@register("unsqueeze2")
def reshape2(ctx: KernelContext) -> None:
    """reshape2, squeeze2, unsqueeze2: X's data in a new shape (`shapes.reshaped`)."""
    _reshaped(ctx, reshaped(ctx, ctx.input("X").shape))


for _op_type in ("reshape2_grad", "squeeze2_grad", "unsqueeze2_grad"):
    register(_op_type)(_grad_as_x)


@register("transpose2")
def transpose2(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", np.ascontiguousarray(x.transpose(transpose_perm(ctx, x.ndim))))
    ctx.set_output("XShape", np.empty(xshape(x.shape), dtype=x.dtype))


@register("transpose2_grad")
def transpose2_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    back = np.argsort(transpose_perm(ctx, x.ndim))
    g = out_grad(ctx, ctx.input("Out"))
    ctx.set_output("X@GRAD", np.ascontiguousarray(g.transpose(back)))


# -- split, slice, gather -----------------------------------------------------------------------
@register("split")
def split(ctx: KernelContext) -> None:
    x = ctx.input("X")
    axis, sizes = split_sizes(ctx, x.shape)
    for i, piece in enumerate(np.split(x, np.cumsum(sizes)[:-1], axis=axis)):
        ctx.set_output("Out", np.ascontiguousarray(piece), index=i)


def out_grads_by_output(ctx: KernelContext) -> list[Array | None]:
    """Per forward Out var, its gradient, None where the grad op has none (backward lists
    only the gradients that exist; they are matched to the outputs by name)."""
    outs, grads = ctx.input_names("Out"), ctx.inputs("Out@GRAD")
    if len(grads) == len(outs):
        return list(grads)
    by_name = dict(zip(ctx.input_names("Out@GRAD"), grads))
    return [by_name.get(grad_name(name)) for name in outs]


@register("split_grad")
def split_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    pieces = [np.zeros_like(out) if g is None else g
              for out, g in zip(ctx.inputs("Out"), out_grads_by_output(ctx))]
    axis, _ = split_sizes(ctx, x.shape)
    ctx.set_output("X@GRAD", np.concatenate(pieces, axis=axis).astype(x.dtype, copy=False))


@register("slice")
def slice_(ctx: KernelContext) -> None:
    x = ctx.input("Input")
    index, shape = slice_bounds(ctx, x.shape)
    ctx.set_output("Out", np.ascontiguousarray(x[index]).reshape(shape))


@register("slice_grad")
def slice_grad(ctx: KernelContext) -> None:
    x = ctx.input("Input")
    index, _ = slice_bounds(ctx, x.shape)
    dx = np.zeros_like(x)
    dx[index] = out_grad(ctx, ctx.input("Out")).reshape(dx[index].shape)
    ctx.set_output("Input@GRAD", dx)


def gather_index(ctx: KernelContext, rows: int) -> Array:
    """gather's Index ([K] or [K, 1]) as int64 ids, each checked against X's `rows`."""
    ids = ctx.input("Index").reshape(-1).astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise IndexError(f"gather: Index {ids.min()}..{ids.max()} outside X's {rows} rows")
    return ids


def last_of_each(ids: Array) -> Array:
    """Positions of the last occurrence of each distinct id (what ``overwrite`` keeps)."""
    _, first_from_end = np.unique(ids[::-1], return_index=True)
    return np.sort(ids.size - 1 - first_from_end)


@register("gather")
def gather(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", x[gather_index(ctx, x.shape[0])])


@register("gather_grad")
def gather_grad(ctx: KernelContext) -> None:
    """Rows of Out@GRAD back to the rows they were read from: added up where an id repeats, or,
    with ``overwrite`` (Paddle's default), the last of them kept."""
    x = ctx.input("X")
    ids = gather_index(ctx, x.shape[0])
    g = out_grad(ctx, ctx.input("Out")).reshape((ids.size,) + x.shape[1:])
    dx = np.zeros_like(x)
    if ctx.attr("overwrite", True):
        keep = last_of_each(ids)
        dx[ids[keep]] = g[keep]
    else:
        np.add.at(dx, ids, g)
    ctx.set_output("X@GRAD", dx)


# -- sigmoid_cross_entropy_with_logits ----------------------------------------------------------
def _kept(ctx: KernelContext, label: Array) -> tuple[Array, float]:
    """The mask of elements whose label is not ``ignore_index``, and what the loss is divided by
    (their count with ``normalize``, else 1)."""
    keep = label != float(ctx.attr("ignore_index", -100))
    norm = max(int(keep.sum()), 1) if ctx.attr("normalize", False) else 1
    return keep, float(norm)


@register("sigmoid_cross_entropy_with_logits")
def sigmoid_cross_entropy_with_logits(ctx: KernelContext) -> None:
    """Per element: max(x, 0) - x * label + log(1 + exp(-|x|)), 0 where ignored."""
    x, label = ctx.input("X"), ctx.input("Label")
    keep, norm = _kept(ctx, label)
    loss = np.maximum(x, 0) - x * label + np.log1p(np.exp(-np.abs(x)))
    ctx.set_output("Out", (np.where(keep, loss, 0) / norm).astype(x.dtype, copy=False),
                   lod=ctx.lod("X"))


@register("sigmoid_cross_entropy_with_logits_grad")
def sigmoid_cross_entropy_with_logits_grad(ctx: KernelContext) -> None:
    x, label = ctx.input("X"), ctx.input("Label")
    keep, norm = _kept(ctx, label)
    g = out_grad(ctx, x)
    sig = 0.5 * (1.0 + np.tanh(0.5 * x))
    ctx.set_output("X@GRAD", (np.where(keep, (sig - label) * g, 0) / norm).astype(x.dtype,
                                                                                   copy=False))
