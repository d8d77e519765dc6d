"""Torch kernels of the image and normalization ops: `conv2d`, `pool2d`, `batch_norm`,
`layer_norm`, `dropout`, with their gradients: `numpy_conv` op for op.

Shapes and attributes come from `shapes` (as for numpy); the dropout mask is drawn on the host by
the numpy backend's `dropout_mask`, so both backends drop the same elements. Forward passes are
torch's own (`F.conv2d`, `F.max_pool2d` on the explicitly padded image); each gradient is the
vector-Jacobian product of that forward (`vjp`), so it cannot drift from it.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch.nn.functional as F

from runtime.execution.kernels.common import dropout_factor
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.shapes import (Window, conv_window, norm_split, pool_kind,
                                              pool_window)
from runtime.execution.kernels.torch_common import (Tensor, host, input_t, kernel, optional_t,
                                                    out_grad_t, put, tensor, torch)


def vjp(fn: Callable[..., Tensor], primals: Sequence[Tensor], cotangent: Tensor) -> list[Tensor]:
    """The gradients of ``sum(cotangent * fn(*primals))`` with respect to each primal."""
    leaves = [p.detach().requires_grad_(True) for p in primals]
    with torch.enable_grad():
        out = fn(*leaves)
        grads = torch.autograd.grad(out, leaves, cotangent.to(out.dtype), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.contiguous() for p, g in zip(leaves, grads)]


def _padded(x: Tensor, win: Window, value: float = 0.0) -> Tensor:
    t, b, l, r = win.pads
    return F.pad(x, (l, r, t, b), value=value) if any(win.pads) else x


# -- conv2d -------------------------------------------------------------------------------------
def _conv(ctx: KernelContext, win: Window) -> Callable[[Tensor, Tensor], Tensor]:
    groups = int(ctx.attr("groups", 1) or 1)
    return lambda x, w: F.conv2d(_padded(x, win), w, stride=win.strides,
                                 dilation=win.dilations, groups=groups)


@kernel("conv2d")
def conv2d(ctx: KernelContext) -> None:
    x, w = input_t(ctx, "Input"), input_t(ctx, "Filter")
    put(ctx, "Output", _conv(ctx, conv_window(ctx, tuple(x.shape), tuple(w.shape)))(x, w))


@kernel("conv2d_grad")
def conv2d_grad(ctx: KernelContext) -> None:
    x, w = input_t(ctx, "Input"), input_t(ctx, "Filter")
    fn = _conv(ctx, conv_window(ctx, tuple(x.shape), tuple(w.shape)))
    dx, dw = vjp(fn, [x, w], out_grad_t(ctx, "Output", "Output@GRAD"))
    put(ctx, "Input@GRAD", dx)
    put(ctx, "Filter@GRAD", dw)


# -- pool2d -------------------------------------------------------------------------------------
def _pool(ctx: KernelContext, shape: tuple[int, ...]) -> Callable[[Tensor], Tensor]:
    win = pool_window(ctx, shape)
    if pool_kind(ctx) == "max":
        return lambda x: F.max_pool2d(_padded(x, win, -np.inf), win.kernel, win.strides)
    full = win.kernel[0] * win.kernel[1]

    def avg(x: Tensor) -> Tensor:
        sums = F.avg_pool2d(_padded(x, win), win.kernel, win.strides, divisor_override=1)
        if not ctx.attr("exclusive", True) or not any(win.pads):
            return sums / full
        ones = torch.ones((1, 1) + shape[2:], dtype=x.dtype, device=x.device)
        return sums / F.avg_pool2d(_padded(ones, win), win.kernel, win.strides,
                                   divisor_override=1)
    return avg


@kernel("pool2d")
def pool2d(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    put(ctx, "Out", _pool(ctx, tuple(x.shape))(x).contiguous())


@kernel("pool2d_grad")
def pool2d_grad(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    (dx,) = vjp(_pool(ctx, tuple(x.shape)), [x], out_grad_t(ctx))
    put(ctx, "X@GRAD", dx)


# -- batch_norm ---------------------------------------------------------------------------------
def _channels(x: Tensor) -> tuple[list[int], tuple[int, ...]]:
    if x.dim() < 2:
        raise ValueError(f"batch_norm: X of shape {list(x.shape)} has no channel axis")
    return [0] + list(range(2, x.dim())), (1, x.shape[1]) + (1,) * (x.dim() - 2)


def _global_stats(ctx: KernelContext) -> bool:
    return bool(ctx.attr("is_test", False) or ctx.attr("use_global_stats", False))


def _batch_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    axes, cshape = _channels(x)
    mu = x.mean(dim=axes)
    return mu, (x - mu.reshape(cshape)).square().mean(dim=axes)


def _bn(ctx: KernelContext, mean: Tensor, var: Tensor) -> Callable[..., Tensor]:
    """Y of (X, Scale, Bias), by the batch's statistics or the running ones."""
    eps = float(ctx.attr("epsilon", 1e-5))

    def y(x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
        _, cshape = _channels(x)
        mu, sigma2 = (mean, var) if _global_stats(ctx) else _batch_stats(x)
        inv = 1.0 / torch.sqrt(sigma2 + eps)
        return (x - mu.reshape(cshape)) * (inv * scale).reshape(cshape) + bias.reshape(cshape)
    return y


@kernel("batch_norm")
def batch_norm(ctx: KernelContext) -> None:
    x, scale, bias = input_t(ctx, "X"), input_t(ctx, "Scale"), input_t(ctx, "Bias")
    mean, var = input_t(ctx, "Mean"), input_t(ctx, "Variance")
    momentum = float(ctx.attr("momentum", 0.9))
    if _global_stats(ctx):
        mu, sigma2, mean_out, var_out = mean, var, mean.clone(), var.clone()
    else:
        mu, sigma2 = _batch_stats(x)
        mean_out = (momentum * mean + (1 - momentum) * mu).to(mean.dtype)
        var_out = (momentum * var + (1 - momentum) * sigma2).to(var.dtype)
    put(ctx, "Y", _bn(ctx, mean, var)(x, scale, bias))
    put(ctx, "MeanOut", mean_out)
    put(ctx, "VarianceOut", var_out)
    put(ctx, "SavedMean", mu.to(x.dtype))
    put(ctx, "SavedVariance", (1.0 / torch.sqrt(sigma2 + float(ctx.attr("epsilon", 1e-5))))
        .to(x.dtype))


@kernel("batch_norm_grad")
def batch_norm_grad(ctx: KernelContext) -> None:
    x, scale, bias = input_t(ctx, "X"), input_t(ctx, "Scale"), input_t(ctx, "Bias")
    fn = _bn(ctx, input_t(ctx, "Mean"), input_t(ctx, "Variance"))
    dx, dscale, dbias = vjp(fn, [x, scale, bias], out_grad_t(ctx, "X", "Y@GRAD"))
    put(ctx, "X@GRAD", dx)
    put(ctx, "Scale@GRAD", dscale)
    put(ctx, "Bias@GRAD", dbias)


# -- layer_norm ---------------------------------------------------------------------------------
def _layer_norm(ctx: KernelContext, shape: tuple[int, ...]) -> Callable[..., Tensor]:
    left, right = norm_split(shape, int(ctx.attr("begin_norm_axis", 1)))
    eps = float(ctx.attr("epsilon", 1e-5))

    def y(x: Tensor, *affine: Tensor | None) -> Tensor:
        x2 = x.reshape(left, right)
        mu = x2.mean(dim=1, keepdim=True)
        out = (x2 - mu) / torch.sqrt((x2 - mu).square().mean(dim=1, keepdim=True) + eps)
        scale, bias = affine
        out = out if scale is None else out * scale.reshape(right)
        out = out if bias is None else out + bias.reshape(right)
        return out.reshape(shape)
    return y


@kernel("layer_norm")
def layer_norm(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    left, right = norm_split(tuple(x.shape), int(ctx.attr("begin_norm_axis", 1)))
    x2 = x.reshape(left, right)
    mu = x2.mean(dim=1)
    put(ctx, "Y", _layer_norm(ctx, tuple(x.shape))(x, optional_t(ctx, "Scale"),
                                                  optional_t(ctx, "Bias")))
    put(ctx, "Mean", mu)
    put(ctx, "Variance", (x2 - mu[:, None]).square().mean(dim=1))


@kernel("layer_norm_grad")
def layer_norm_grad(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    present = [s for s in ("Scale", "Bias") if ctx.has_input(s)]
    primals = [x] + [input_t(ctx, s) for s in present]
    fn = _layer_norm(ctx, tuple(x.shape))

    def y(x: Tensor, *given: Tensor) -> Tensor:
        by_slot = dict(zip(present, given))
        return fn(x, by_slot.get("Scale"), by_slot.get("Bias"))

    grads = vjp(y, primals, out_grad_t(ctx, "X", "Y@GRAD"))
    for slot, g in zip(["X"] + present, grads):
        put(ctx, slot + "@GRAD", g)


# -- dropout ------------------------------------------------------------------------------------
def _dropout_factor(ctx: KernelContext, x: Tensor) -> Tensor | float:
    """The mask is drawn on the host from X's bytes (`common.dropout_mask`), as numpy does."""
    mask, scale = dropout_factor(ctx, host(x))
    return scale if mask is None else tensor(mask).to(tensor(x).dtype) * scale


@kernel("dropout")
def dropout(ctx: KernelContext) -> None:
    x = ctx.input("X")
    put(ctx, "Out", tensor(x) * _dropout_factor(ctx, x), lod=ctx.lod("X"), dtype=x.dtype)


@kernel("dropout_grad")
def dropout_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    put(ctx, "X@GRAD", out_grad_t(ctx, "X") * _dropout_factor(ctx, x), dtype=x.dtype)
