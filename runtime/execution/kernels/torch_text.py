"""Torch kernels of the ops of fluid's text models: `sequence_conv` and `cos_sim` with their
gradients, `numpy_text` op for op (each window's row index is found on the host, shared with
the numpy kernel: `common.context_index`; gathers and an `index_add_` replace numpy's fancy
indexing and `add.at`), and `auc` (the numpy kernel: counts on the host).
"""

from __future__ import annotations

from runtime.execution.kernels import numpy_text
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_text import cos_shapes
from runtime.execution.kernels.torch_common import (Tensor, input_t, kernel, on_host, out_grad_t,
                                                    put, tensor, torch, zeros)


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in the two operands' promoted dtype, as numpy computes it."""
    dtype = torch.promote_types(a.dtype, b.dtype)
    return torch.mm(a.to(dtype), b.to(dtype))


# -- sequence_conv ------------------------------------------------------------------------------
def _window(ctx: KernelContext) -> tuple[Tensor, Tensor, Tensor]:
    """X, Filter and each row's window index (`numpy_text`'s checks), on the device."""
    x, w, index = numpy_text.sequence_window(ctx)
    return tensor(x), tensor(w), tensor(index)


def _columns(x: Tensor, index: Tensor) -> Tensor:
    """`numpy_text.context_columns`: X's rows at `index`, one past X a row of zeros."""
    padded = torch.cat([x, torch.zeros((1, x.shape[1]), dtype=x.dtype, device=x.device)])
    return padded[index].reshape(x.shape[0], -1)


@kernel("sequence_conv")
def sequence_conv(ctx: KernelContext) -> None:
    x, w, index = _window(ctx)
    put(ctx, "Out", _mm(_columns(x, index), w), lod=ctx.lod("X"))


@kernel("sequence_conv_grad")
def sequence_conv_grad(ctx: KernelContext) -> None:
    x, w, index = _window(ctx)
    g = out_grad_t(ctx)
    if ctx.has_output("Filter@GRAD"):
        put(ctx, "Filter@GRAD", _mm(_columns(x, index).T, g), dtype=w.dtype)
    if ctx.has_output("X@GRAD"):
        dx = zeros((x.shape[0] + 1, x.shape[1]), x.dtype)
        spread = _mm(g, w.T).reshape(-1, x.shape[1]).to(dx.dtype)
        put(ctx, "X@GRAD", dx.index_add_(0, index.reshape(-1), spread)[:-1])


# -- cos_sim ------------------------------------------------------------------------------------
def _operands(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """X and Y flattened to rows (`numpy_text.cos_shapes`)."""
    x2, y2 = cos_shapes(tuple(x.shape), tuple(y.shape))
    return x.reshape(x2), y.reshape(y2)


def _norm(rows: Tensor) -> Tensor:
    return torch.sqrt((rows * rows).sum(dim=1, keepdim=True))


@kernel("cos_sim")
def cos_sim(ctx: KernelContext) -> None:
    x2, y2 = _operands(input_t(ctx, "X"), input_t(ctx, "Y"))
    xn, yn = _norm(x2), _norm(y2)
    put(ctx, "Out", (x2 * y2).sum(dim=1, keepdim=True) / (xn * yn), lod=ctx.lod("X"))
    put(ctx, "XNorm", xn)
    put(ctx, "YNorm", yn)


@kernel("cos_sim_grad")
def cos_sim_grad(ctx: KernelContext) -> None:
    x, y = input_t(ctx, "X"), input_t(ctx, "Y")
    x2, y2 = _operands(x, y)
    xn, yn, out = input_t(ctx, "XNorm"), input_t(ctx, "YNorm"), input_t(ctx, "Out")
    g = out_grad_t(ctx)
    if ctx.has_output("X@GRAD"):
        dx = g * (y2 / (xn * yn) - out * x2 / (xn * xn))
        put(ctx, "X@GRAD", dx.reshape(x.shape), dtype=x.dtype)
    if ctx.has_output("Y@GRAD"):
        dy = g * (x2 / (xn * yn) - out * y2 / (yn * yn))
        if y2.shape[0] != x2.shape[0]:
            dy = dy.sum(dim=0, keepdim=True)
        put(ctx, "Y@GRAD", dy.reshape(y.shape), dtype=y.dtype)


kernel("auc")(on_host(numpy_text.auc))
