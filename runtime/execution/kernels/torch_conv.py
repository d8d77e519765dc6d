"""Torch kernels of the image and normalization ops: `conv2d`, `pool2d`, `batch_norm`,
`layer_norm`, `dropout`, with their gradients: `numpy_conv` op for op.

Shapes and attributes come from `shapes` (as for numpy); the dropout mask is drawn on the host by
the numpy backend's `dropout_mask`, so both backends drop the same elements. Forward passes are
torch's own (`F.conv2d`, `F.max_pool2d`, `F.batch_norm`), padding by themselves where the
padding is even and on an explicitly padded image where not. The gradients of `conv2d`, max
pooling and `batch_norm` are torch's own backward kernels, given what the forward left (the
maxima's indices, `MAXIMA`; `batch_norm`'s SavedMean/SavedVariance), so no forward runs twice;
the others are the vector-Jacobian product of their forward (`vjp`), so they cannot drift from
it. DESIGN: a small CNN's step (`benchmarks/torch_backend.py --model cnn`) took 2.5 times as long
as torch's own training of the same layers when every gradient ran its forward again under
autograd.
"""

from __future__ import annotations

import weakref
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
def _even_pads(win: Window) -> tuple[int, int] | None:
    """(rows, cols) of padding where the window pads each side alike (torch pads by itself, with
    no padded copy of the image), else None."""
    t, b, l, r = win.pads
    return (t, l) if t == b and l == r else None


def _conv_input(x: Tensor, win: Window) -> tuple[Tensor, list[int]]:
    """The image the convolution reads and the padding torch adds to it: `x` itself where the
    padding is even, else `x` padded here."""
    pads = _even_pads(win)
    return (x, list(pads)) if pads is not None else (_padded(x, win), [0, 0])


@kernel("conv2d")
def conv2d(ctx: KernelContext) -> None:
    x, w = input_t(ctx, "Input"), input_t(ctx, "Filter")
    win = conv_window(ctx, tuple(x.shape), tuple(w.shape))
    image, pads = _conv_input(x, win)
    put(ctx, "Output", F.conv2d(image, w, stride=win.strides, padding=pads,
                                dilation=win.dilations, groups=int(ctx.attr("groups", 1) or 1)))


@kernel("conv2d_grad")
def conv2d_grad(ctx: KernelContext) -> None:
    """torch's own convolution backward, for the gradients asked for only; the forward is not
    run again."""
    x, w = input_t(ctx, "Input"), input_t(ctx, "Filter")
    win = conv_window(ctx, tuple(x.shape), tuple(w.shape))
    image, pads = _conv_input(x, win)
    dy = out_grad_t(ctx, "Output", "Output@GRAD").to(x.dtype)
    wants = [ctx.has_output("Input@GRAD"), ctx.has_output("Filter@GRAD"), False]
    dx, dw, _ = torch.ops.aten.convolution_backward(
        dy, image, w, None, list(win.strides), pads, list(win.dilations), False, [0, 0],
        int(ctx.attr("groups", 1) or 1), wants)
    if wants[0]:
        if image is not x:  # the gradient of the padded copy: crop the padding off
            t, _, l, _ = win.pads
            dx = dx[:, :, t:t + x.shape[2], l:l + x.shape[3]]
        put(ctx, "Input@GRAD", dx.contiguous())
    if wants[1]:
        put(ctx, "Filter@GRAD", dw)


# -- pool2d -------------------------------------------------------------------------------------
def _max_pads(win: Window) -> tuple[int, int] | None:
    """The padding torch's max pool adds by itself (it never picks a pad), where it can: even,
    and at most half the window."""
    pads = _even_pads(win)
    if pads is None or any(2 * p > k for p, k in zip(pads, win.kernel)):
        return None
    return pads


CHANNELS_LAST_POOL = 8
"""On a CPU, a max pool over an image of at least this many channels runs on a channels-last
copy. DESIGN: torch's channels-last max pool took half the time of its NCHW one, copies both
ways included, on [32, 8, 16, 16] and [8, 64, 56, 56] images (2x2 and 3x3 windows), and longer
on 1 or 3 channels (0.2-0.8 times as fast); both give the same indices."""


def _pool_input(x: Tensor, win: Window) -> tuple[Tensor, list[int]]:
    """The image a max pool reads (`x`, or `x` padded by -inf here where torch cannot pad it)
    and the padding torch adds to it."""
    pads = _max_pads(win)
    return (x, list(pads)) if pads is not None else (_padded(x, win, -np.inf), [0, 0])


def _max_pool(image: Tensor, padding: list[int], win: Window) -> tuple[Tensor, Tensor]:
    """Out, and the flat index of each window's maximum in `image` (`_pool_input`'s)."""
    if image.device.type == "cpu" and image.shape[1] >= CHANNELS_LAST_POOL:
        out, where = F.max_pool2d(image.contiguous(memory_format=torch.channels_last),
                                  win.kernel, win.strides, padding, return_indices=True)
        return out.contiguous(), where.contiguous()
    return F.max_pool2d(image, win.kernel, win.strides, padding, return_indices=True)


class _Maxima:
    """Where each window's maximum lay, kept from a max pool's forward for its gradient, by the
    input image (held weakly: an entry goes with its image). DESIGN: the gradient reads the same
    X, and no kernel writes an input, so the indices stand; finding them again costs the
    forward's pass, a fifth of a small CNN's step on a CPU."""

    def __init__(self) -> None:
        self._by_image: dict[int, tuple[weakref.ref[Tensor], Window, Tensor]] = {}

    def keep(self, x: Tensor, win: Window, where: Tensor) -> None:
        key = id(x)

        def forget(_: weakref.ref[Tensor]) -> None:
            self._by_image.pop(key, None)
        self._by_image[key] = (weakref.ref(x, forget), win, where)

    def find(self, x: Tensor, win: Window) -> Tensor | None:
        held = self._by_image.get(id(x))
        if held is None or held[0]() is not x or held[1] != win:
            return None
        return held[2]


MAXIMA = _Maxima()


def _avg_pool(ctx: KernelContext, shape: tuple[int, ...]) -> Callable[[Tensor], Tensor]:
    win = pool_window(ctx, shape)
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
    if pool_kind(ctx) == "max":
        win = pool_window(ctx, tuple(x.shape))
        out, where = _max_pool(*_pool_input(x, win), win)
        MAXIMA.keep(x, win, where)
    else:
        out = _avg_pool(ctx, tuple(x.shape))(x)
    put(ctx, "Out", out.contiguous())


@kernel("pool2d_grad")
def pool2d_grad(ctx: KernelContext) -> None:
    """Max pooling: torch's own backward from the maxima's indices (the forward's, or found
    again); average pooling: the vector-Jacobian product."""
    x, dy = input_t(ctx, "X"), out_grad_t(ctx)
    if pool_kind(ctx) != "max":
        (dx,) = vjp(_avg_pool(ctx, tuple(x.shape)), [x], dy)
        put(ctx, "X@GRAD", dx)
        return
    win = pool_window(ctx, tuple(x.shape))
    image, padding = _pool_input(x, win)
    where = MAXIMA.find(x, win)
    if where is None:
        where = _max_pool(image, padding, win)[1]
    dx = torch.ops.aten.max_pool2d_with_indices_backward(
        dy.to(x.dtype).contiguous(), image, list(win.kernel), list(win.strides), padding,
        [1, 1], False, where)
    if image is not x:
        t, _, l, _ = win.pads
        dx = dx[:, :, t:t + x.shape[2], l:l + x.shape[3]]
    put(ctx, "X@GRAD", dx.contiguous())


# -- batch_norm ---------------------------------------------------------------------------------
def _channels(x: Tensor) -> tuple[list[int], tuple[int, ...]]:
    if x.dim() < 2:
        raise ValueError(f"batch_norm: X of shape {list(x.shape)} has no channel axis")
    return [0] + list(range(2, x.dim())), (1, x.shape[1]) + (1,) * (x.dim() - 2)


def _global_stats(ctx: KernelContext) -> bool:
    return bool(ctx.attr("is_test", False) or ctx.attr("use_global_stats", False))


def _batch_stats(x: Tensor) -> tuple[Tensor, Tensor]:
    """The batch's mean and (biased) variance per channel. DESIGN: two passes; torch's one-pass
    `var_mean` took 7 times as long on a CPU (490 us against 71 on a [32, 8, 16, 16] image)."""
    axes, cshape = _channels(x)
    mu = x.mean(dim=axes)
    return mu, (x - mu.reshape(cshape)).square().mean(dim=axes)


@kernel("batch_norm")
def batch_norm(ctx: KernelContext) -> None:
    x, scale, bias = input_t(ctx, "X"), input_t(ctx, "Scale"), input_t(ctx, "Bias")
    mean, var = input_t(ctx, "Mean"), input_t(ctx, "Variance")
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    if _global_stats(ctx):
        mu, sigma2, mean_out, var_out = mean, var, mean.clone(), var.clone()
    else:
        mu, sigma2 = _batch_stats(x)
        mean_out = (momentum * mean + (1 - momentum) * mu).to(mean.dtype)
        var_out = (momentum * var + (1 - momentum) * sigma2).to(var.dtype)
    # normalizing by given statistics is torch's inference batch norm: one pass over X
    put(ctx, "Y", F.batch_norm(x, mu.to(x.dtype), sigma2.to(x.dtype), scale.to(x.dtype),
                               bias.to(x.dtype), False, 0.0, eps))
    put(ctx, "MeanOut", mean_out)
    put(ctx, "VarianceOut", var_out)
    put(ctx, "SavedMean", mu.to(x.dtype))
    put(ctx, "SavedVariance", torch.rsqrt(sigma2 + eps).to(x.dtype))


@kernel("batch_norm_grad")
def batch_norm_grad(ctx: KernelContext) -> None:
    """From SavedMean/SavedVariance (the batch's mean and 1/sqrt(var + epsilon)), as numpy's:
    torch's own batch norm backward; with global statistics the normalization is affine in X."""
    x, scale = input_t(ctx, "X"), input_t(ctx, "Scale")
    mu, inv = input_t(ctx, "SavedMean", x.dtype), input_t(ctx, "SavedVariance", x.dtype)
    dy = out_grad_t(ctx, "X", "Y@GRAD").to(x.dtype)
    if _global_stats(ctx):
        axes, cshape = _channels(x)
        dbias, dscale = dy.sum(dim=axes), (dy * ((x - mu.reshape(cshape)) * inv.reshape(cshape)))\
            .sum(dim=axes)
        dx = dy * (scale * inv).reshape(cshape).to(x.dtype)
    else:
        dx, dscale, dbias = torch.ops.aten.native_batch_norm_backward(
            dy.contiguous(), x, scale.to(x.dtype), None, None, mu, inv, True,
            float(ctx.attr("epsilon", 1e-5)), [True, True, True])
    put(ctx, "X@GRAD", dx)
    put(ctx, "Scale@GRAD", dscale.to(scale.dtype))
    put(ctx, "Bias@GRAD", dbias.to(scale.dtype))


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
