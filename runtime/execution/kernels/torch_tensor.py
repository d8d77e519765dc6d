"""Torch kernels of the products and shaping ops: `matmul`, `matmul_v2`, `reshape2`,
`transpose2`, `squeeze2`, `unsqueeze2`, `split`, `slice`, `gather` and
`sigmoid_cross_entropy_with_logits`, with their gradients: `numpy_tensor` op for op.

Shapes come from `shapes`, ids are checked and deduplicated on the host (`gather_index`,
`last_of_each`), as numpy does, so both backends agree on what goes where.
"""

from __future__ import annotations

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_tensor import (gather_index, last_of_each,
                                                    out_grads_by_output)
from runtime.execution.kernels.shapes import (matmul_flags, matmul_shape, reshaped,
                                              shared_lod, slice_bounds, split_sizes,
                                              transpose_perm, xshape)
from runtime.execution.kernels.torch_common import (Tensor, dtype_of, input_t, kernel, out_grad_t,
                                                    put, tensor, torch)
from runtime.execution.kernels.torch_conv import vjp


# -- matmul -------------------------------------------------------------------------------------
def _product(ctx: KernelContext, x: Tensor, y: Tensor) -> Tensor:
    tx, ty, alpha = matmul_flags(ctx)
    t = lambda a, flag: a.transpose(-1, -2) if flag and a.dim() >= 2 else a  # noqa: E731
    dtype = torch.promote_types(x.dtype, y.dtype)
    out = torch.matmul(t(x.to(dtype), tx), t(y.to(dtype), ty))
    out = out * alpha if alpha != 1.0 else out
    return out.reshape(matmul_shape(tuple(x.shape), tuple(y.shape), tx, ty))


@kernel("matmul")
@kernel("matmul_v2")
def matmul(ctx: KernelContext) -> None:
    put(ctx, "Out", _product(ctx, input_t(ctx, "X"), input_t(ctx, "Y")).contiguous())


@kernel("matmul_grad")
@kernel("matmul_v2_grad")
def matmul_grad(ctx: KernelContext) -> None:
    x, y = input_t(ctx, "X"), input_t(ctx, "Y")
    dx, dy = vjp(lambda a, b: _product(ctx, a, b), [x, y], out_grad_t(ctx))
    put(ctx, "X@GRAD", dx)
    put(ctx, "Y@GRAD", dy)


# -- reshape2, transpose2, squeeze2, unsqueeze2 -------------------------------------------------
def _reshaped(ctx: KernelContext, shape: tuple[int, ...]) -> None:
    x = ctx.input("X")
    put(ctx, "Out", tensor(x).reshape(shape), lod=shared_lod(ctx, x.shape, shape))
    ctx.set_output("XShape", np.empty(xshape(x.shape), dtype=dtype_of(x)))


def _grad_as_x(ctx: KernelContext) -> None:
    put(ctx, "X@GRAD", out_grad_t(ctx).reshape(ctx.input("X").shape))


@kernel("reshape2")
@kernel("squeeze2")
@kernel("unsqueeze2")
def reshape2(ctx: KernelContext) -> None:
    """reshape2, squeeze2, unsqueeze2: X's data in a new shape (`shapes.reshaped`)."""
    _reshaped(ctx, reshaped(ctx, ctx.input("X").shape))


for _op_type in ("reshape2_grad", "squeeze2_grad", "unsqueeze2_grad"):
    kernel(_op_type)(_grad_as_x)


@kernel("transpose2")
def transpose2(ctx: KernelContext) -> None:
    x = ctx.input("X")
    put(ctx, "Out", tensor(x).permute(transpose_perm(ctx, x.ndim)).contiguous())
    ctx.set_output("XShape", np.empty(xshape(x.shape), dtype=dtype_of(x)))


@kernel("transpose2_grad")
def transpose2_grad(ctx: KernelContext) -> None:
    back = np.argsort(transpose_perm(ctx, ctx.input("X").ndim)).tolist()
    put(ctx, "X@GRAD", out_grad_t(ctx).permute(back).contiguous())


# -- split, slice, gather -----------------------------------------------------------------------
@kernel("split")
def split(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    axis, sizes = split_sizes(ctx, tuple(x.shape))
    for i, piece in enumerate(torch.split(x, sizes, dim=axis)):
        put(ctx, "Out", piece.contiguous(), index=i)


@kernel("split_grad")
def split_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    pieces = [torch.zeros_like(tensor(out)) if g is None else tensor(g)
              for out, g in zip(ctx.inputs("Out"), out_grads_by_output(ctx))]
    axis, _ = split_sizes(ctx, x.shape)
    put(ctx, "X@GRAD", torch.cat(pieces, dim=axis), dtype=x.dtype)


def _slice_index(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """Python slices with negative steps or ends resolved (torch refuses negative steps)."""
    return tuple(slice(*s.indices(n)) for s, n in zip(index, shape))


@kernel("slice")
def slice_(ctx: KernelContext) -> None:
    x = input_t(ctx, "Input")
    index, shape = slice_bounds(ctx, tuple(x.shape))
    put(ctx, "Out", x[_slice_index(index, tuple(x.shape))].reshape(shape).contiguous())


@kernel("slice_grad")
def slice_grad(ctx: KernelContext) -> None:
    x = input_t(ctx, "Input")
    index, _ = slice_bounds(ctx, tuple(x.shape))
    index = _slice_index(index, tuple(x.shape))
    dx = torch.zeros_like(x)
    dx[index] = out_grad_t(ctx, "Out").reshape(dx[index].shape)
    put(ctx, "Input@GRAD", dx)


@kernel("gather")
def gather(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    put(ctx, "Out", x.index_select(0, tensor(gather_index(ctx, x.shape[0]))))


@kernel("gather_grad")
def gather_grad(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    ids = gather_index(ctx, x.shape[0])
    g = out_grad_t(ctx).reshape((ids.size,) + tuple(x.shape[1:]))
    dx = torch.zeros_like(x)
    if ctx.attr("overwrite", True):
        keep = last_of_each(ids)
        dx.index_copy_(0, tensor(ids[keep]), g[tensor(keep)])
    else:
        dx.index_add_(0, tensor(ids), g)
    put(ctx, "X@GRAD", dx)


# -- sigmoid_cross_entropy_with_logits ----------------------------------------------------------
def _kept(ctx: KernelContext, label: Tensor) -> tuple[Tensor, float]:
    keep = label != float(ctx.attr("ignore_index", -100))
    norm = max(int(keep.sum()), 1) if ctx.attr("normalize", False) else 1
    return keep, float(norm)


@kernel("sigmoid_cross_entropy_with_logits")
def sigmoid_cross_entropy_with_logits(ctx: KernelContext) -> None:
    x, label = input_t(ctx, "X"), input_t(ctx, "Label")
    keep, norm = _kept(ctx, label)
    loss = torch.clamp(x, min=0) - x * label + torch.log1p(torch.exp(-x.abs()))
    put(ctx, "Out", torch.where(keep, loss, 0) / norm, lod=ctx.lod("X"), dtype=ctx.input("X").dtype)


@kernel("sigmoid_cross_entropy_with_logits_grad")
def sigmoid_cross_entropy_with_logits_grad(ctx: KernelContext) -> None:
    x, label = input_t(ctx, "X"), input_t(ctx, "Label")
    keep, norm = _kept(ctx, label)
    sig = 0.5 * (1.0 + torch.tanh(0.5 * x))
    grad = torch.where(keep, (sig - label) * out_grad_t(ctx), 0) / norm
    put(ctx, "X@GRAD", grad, dtype=ctx.input("X").dtype)
