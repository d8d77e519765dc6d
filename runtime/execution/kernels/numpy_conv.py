"""Image and normalization ops: `conv2d` and `pool2d` over NCHW images, `batch_norm`,
`layer_norm` and `dropout`, each with its gradient kernel.

DESIGN: the convolution is im2col without copies: `sliding_window_view` of the padded input,
strided by the op's strides and dilations, is a view [N, C, OH, OW, KH, KW] that one `einsum`
contracts with the filter (per group). The filter's gradient goes back through the same view,
one `einsum`; the input's is one matrix product per group, whose rows for each kernel position
are added to the input with one strided add (`_add_taps`: KH x KW slices, never a loop over
pixels). Average pooling uses the same windows; max pooling takes the same KH x KW slices one
elementwise `maximum` at a time (`_max_pool`), and its gradient finds each window's first
maximum slice by slice.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from runtime.execution.kernels.common import dropout_factor, out_grad
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.kernels.shapes import (Window, conv_window, norm_split, pool_kind,
                                              pool_window)

Array = np.ndarray


# -- windows ------------------------------------------------------------------------------------
def _pad(x: Array, win: Window, value: float = 0.0) -> Array:
    t, b, l, r = win.pads
    if not any(win.pads):
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=value)


def _patches(xp: Array, win: Window) -> Array:
    """The windows of padded `xp` as a view [N, C, OH, OW, KH, KW]."""
    (sh, sw), (th, tw), (dh, dw), (oh, ow) = win.span, win.strides, win.dilations, win.out
    view = sliding_window_view(xp, (sh, sw), axis=(2, 3))
    return view[:, :, ::th, ::tw, ::dh, ::dw][:, :, :oh, :ow]


def _fold(cols: Array, x_shape: tuple[int, ...], win: Window) -> Array:
    """Adjoint of `_patches` then `_pad`: add each window element's gradient [N, C, OH, OW, KH,
    KW] back to the input position it was read from; padding is dropped."""
    kw = win.kernel[1]
    return _add_taps(lambda k: cols[..., k // kw, k % kw], x_shape, win, cols.dtype)


def _add_taps(part: Callable[[int], Array], x_shape: tuple[int, ...], win: Window,
              dtype: np.dtype) -> Array:
    """Adjoint of reading the padded image at each kernel position (`_taps`): the input's
    gradient, `part(k)` [N, C, OH, OW] added where position k read; padding is dropped."""
    t, b, l, r = win.pads
    n, c, h, w = x_shape
    dxp = np.zeros((n, c, h + t + b, w + l + r), dtype=dtype)
    for k, tap in enumerate(_taps(win)):
        dxp[tap] += part(k)
    return dxp[:, :, t: t + h, l: l + w]


def _taps(win: Window) -> list[tuple[slice, ...]]:
    """Per kernel position (row-major), the padded image's elements it reads, one per window:
    an index giving a strided view [N, C, OH, OW]."""
    (th, tw), (dh, dw), (oh, ow) = win.strides, win.dilations, win.out
    return [(slice(None), slice(None), slice(i * dh, i * dh + th * (oh - 1) + 1, th),
             slice(j * dw, j * dw + tw * (ow - 1) + 1, tw))
            for i in range(win.kernel[0]) for j in range(win.kernel[1])]


# -- conv2d -------------------------------------------------------------------------------------
def _grouped(x: Array, w: Array, win: Window) -> tuple[Array, Array, int]:
    """The input's windows [N, G, C/G, OH, OW, KH, KW] and the filter [G, F/G, C/G, KH, KW]."""
    groups = x.shape[1] // w.shape[1]
    cols = _patches(_pad(x, win), win)
    n, c = x.shape[:2]
    return (cols.reshape((n, groups, c // groups) + cols.shape[2:]),
            w.reshape((groups, w.shape[0] // groups) + w.shape[1:]), groups)


@register("conv2d")
def conv2d(ctx: KernelContext) -> None:
    x, w = ctx.input("Input"), ctx.input("Filter")
    win = conv_window(ctx, x.shape, w.shape)
    cols, wg, _ = _grouped(x, w, win)
    out = np.einsum("ngchwij,gfcij->ngfhw", cols, wg, optimize=True)
    ctx.set_output("Output", out.reshape((x.shape[0], w.shape[0]) + win.out).astype(
        np.result_type(x, w), copy=False))


@register("conv2d_grad")
def conv2d_grad(ctx: KernelContext) -> None:
    x, w = ctx.input("Input"), ctx.input("Filter")
    win = conv_window(ctx, x.shape, w.shape)
    cols, wg, groups = _grouped(x, w, win)
    g = out_grad(ctx, ctx.input("Output"), "Output@GRAD")
    gg = g.reshape((g.shape[0], groups, w.shape[0] // groups) + win.out)
    if ctx.has_output("Filter@GRAD"):
        dw = np.einsum("ngfhw,ngchwij->gfcij", gg, cols, optimize=True)
        ctx.set_output("Filter@GRAD", dw.reshape(w.shape).astype(w.dtype, copy=False))
    if ctx.has_output("Input@GRAD"):
        ctx.set_output("Input@GRAD", _input_grad(gg, wg, x.shape, win).astype(x.dtype, copy=False))


def _input_grad(gg: Array, wg: Array, x_shape: tuple[int, ...], win: Window) -> Array:
    """The input's gradient from the output's [N, G, F/G, OH, OW] and the filter [G, F/G, C/G,
    KH, KW]: one product per group, [C/G * KH * KW, F/G] by [F/G, N * OH * OW], whose rows for
    each kernel position are an image [C/G, N, OH, OW] added to the strided part of the padded
    input that position read (`_taps`). DESIGN: the windows' gradient as [N, C, OH, OW, KH, KW]
    (one einsum, then `_fold`) took 1.1 to 2.6 times as long on five shapes (the CNN's conv
    layers, a depthwise and a grouped one): `_fold` read each kernel position strided across
    the last two axes."""
    n, groups, fg, oh, ow = gg.shape
    cg, kh, kw = wg.shape[2:]
    rows = wg.reshape(groups, fg, cg * kh * kw).transpose(0, 2, 1)
    grads = gg.transpose(1, 2, 0, 3, 4).reshape(groups, fg, n * oh * ow)
    taps = np.matmul(rows, grads).reshape(groups, cg, kh * kw, n, oh, ow)
    return _add_taps(lambda k: taps[:, :, k].reshape(groups * cg, n, oh, ow).transpose(1, 0, 2, 3),
                     x_shape, win, taps.dtype)


# -- pool2d -------------------------------------------------------------------------------------
def _max_pool(xp: Array, win: Window) -> Array:
    """Each window's maximum, one elementwise `maximum` per kernel position (a NaN wins, as in
    `max`). DESIGN: `max` over the windows' last two axes reduced a few elements at a time: 20
    times as long on a [32, 8, 16, 16] image with 2x2 windows (1.7 ms against 88 us)."""
    taps = _taps(win)
    out = xp[taps[0]].copy()
    for tap in taps[1:]:
        np.maximum(out, xp[tap], out=out)
    return out


def _max_pool_grad(xp: Array, out: Array, g: Array, x_shape: tuple[int, ...],
                   win: Window) -> Array:
    """Each window's gradient to its first largest element (row-major, as `argmax` picks it),
    added back to the input position it was read from (as `_fold` adds, position by
    position)."""
    t, _, l, _ = win.pads
    dxp = np.zeros(xp.shape, dtype=np.result_type(xp, g))
    free = np.ones(out.shape, dtype=bool)  # windows whose maximum no earlier position held
    hit = np.empty(out.shape, dtype=bool)
    apart = all(s >= k for s, k in zip(win.strides, win.span))  # no element in two windows
    for tap in _taps(win):
        np.equal(xp[tap], out, out=hit)
        hit &= free
        if apart:
            np.multiply(g, hit, out=dxp[tap])
        else:
            dxp[tap] += g * hit
        free ^= hit
    return dxp[:, :, t: t + x_shape[2], l: l + x_shape[3]].astype(xp.dtype, copy=False)


def _avg_divisor(ctx: KernelContext, x: Array, win: Window) -> Array | float:
    """Per output position, the elements averaged: the window's real (unpadded) elements with
    ``exclusive`` (Paddle's default), the whole window otherwise."""
    if not ctx.attr("exclusive", True) or not any(win.pads):
        return float(win.kernel[0] * win.kernel[1])
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    return _patches(_pad(ones, win), win).sum(axis=(-2, -1))


@register("pool2d")
def pool2d(ctx: KernelContext) -> None:
    x = ctx.input("X")
    win = pool_window(ctx, x.shape)
    if pool_kind(ctx) == "max":
        out = _max_pool(_pad(x, win, -np.inf), win)
    else:
        out = _patches(_pad(x, win), win).sum(axis=(-2, -1)) / _avg_divisor(ctx, x, win)
    ctx.set_output("Out", out.astype(x.dtype, copy=False))


@register("pool2d_grad")
def pool2d_grad(ctx: KernelContext) -> None:
    """max: each window's gradient to its first largest element; avg: spread evenly."""
    x = ctx.input("X")
    win = pool_window(ctx, x.shape)
    g = out_grad(ctx, ctx.input("Out"))
    kh, kw = win.kernel
    if pool_kind(ctx) == "max":
        xp = _pad(x, win, -np.inf)
        out = _max_pool(xp, win)
        if not np.isnan(out).any():
            ctx.set_output("X@GRAD", _max_pool_grad(xp, out, g, x.shape, win))
            return
        windows = _patches(xp, win)  # a NaN is its window's maximum: argmax finds the first
        picked = windows.reshape(windows.shape[:4] + (kh * kw,)).argmax(axis=-1)
        cols = (picked[..., None] == np.arange(kh * kw)) * g[..., None]
        cols = cols.reshape(g.shape + (kh, kw))
    else:
        share = g / _avg_divisor(ctx, x, win)
        cols = np.broadcast_to(share[..., None, None], g.shape + (kh, kw))
    ctx.set_output("X@GRAD", _fold(cols, x.shape, win).astype(x.dtype, copy=False))


# -- batch_norm ---------------------------------------------------------------------------------
def _channel_axes(x: Array) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The axes batch_norm reduces over (all but C, axis 1) and a shape broadcasting [C] on X."""
    if x.ndim < 2:
        raise ValueError(f"batch_norm: X of shape {list(x.shape)} has no channel axis")
    return (0,) + tuple(range(2, x.ndim)), (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _global_stats(ctx: KernelContext) -> bool:
    return bool(ctx.attr("is_test", False) or ctx.attr("use_global_stats", False))


@register("batch_norm")
def batch_norm(ctx: KernelContext) -> None:
    """Training: normalize by the batch's mean and (biased) variance, and move the running
    MeanOut/VarianceOut toward them by ``momentum``; SavedMean/SavedVariance keep the batch's
    mean and 1/sqrt(var + epsilon) for the gradient. ``is_test`` (or ``use_global_stats``):
    normalize by the running Mean/Variance, which stay as they are."""
    x, scale, bias = ctx.input("X"), ctx.input("Scale"), ctx.input("Bias")
    mean, var = ctx.input("Mean"), ctx.input("Variance")
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    axes, cshape = _channel_axes(x)
    if _global_stats(ctx):
        mu, sigma2 = mean, var
        mean_out, var_out = mean.copy(), var.copy()
    else:
        mu = x.mean(axis=axes)
        sigma2 = np.square(x - mu.reshape(cshape)).mean(axis=axes)
        mean_out = (momentum * mean + (1 - momentum) * mu).astype(mean.dtype, copy=False)
        var_out = (momentum * var + (1 - momentum) * sigma2).astype(var.dtype, copy=False)
    inv = 1.0 / np.sqrt(sigma2 + eps)
    y = (x - mu.reshape(cshape)) * (inv * scale).reshape(cshape) + bias.reshape(cshape)
    ctx.set_output("Y", y.astype(x.dtype, copy=False))
    ctx.set_output("MeanOut", mean_out)
    ctx.set_output("VarianceOut", var_out)
    ctx.set_output("SavedMean", mu.astype(x.dtype, copy=False))
    ctx.set_output("SavedVariance", inv.astype(x.dtype, copy=False))


@register("batch_norm_grad")
def batch_norm_grad(ctx: KernelContext) -> None:
    """From SavedMean/SavedVariance (the running Mean was overwritten in place by then); with
    global stats the normalization is affine in X."""
    x, scale = ctx.input("X"), ctx.input("Scale")
    mu, inv = ctx.input("SavedMean"), ctx.input("SavedVariance")
    axes, cshape = _channel_axes(x)
    g = out_grad(ctx, x, "Y@GRAD")
    xhat = (x - mu.reshape(cshape)) * inv.reshape(cshape)
    dbias, dscale = g.sum(axis=axes), (g * xhat).sum(axis=axes)
    ctx.set_output("Bias@GRAD", dbias.astype(scale.dtype, copy=False))
    ctx.set_output("Scale@GRAD", dscale.astype(scale.dtype, copy=False))
    if _global_stats(ctx):
        dx = g * (scale * inv).reshape(cshape)
    else:
        m = x.size // x.shape[1]
        dx = (scale * inv / m).reshape(cshape) * (
            m * g - dbias.reshape(cshape) - xhat * dscale.reshape(cshape))
    ctx.set_output("X@GRAD", dx.astype(x.dtype, copy=False))


# -- layer_norm ---------------------------------------------------------------------------------
def _affine(ctx: KernelContext, slot: str, right: int, dtype: np.dtype, fill: float) -> Array:
    value = ctx.input(slot)
    return np.full(right, fill, dtype=dtype) if value is None else value.reshape(right)


@register("layer_norm")
def layer_norm(ctx: KernelContext) -> None:
    """X flattened to [left, right] at ``begin_norm_axis``; each row normalized, then scaled and
    shifted by Scale and Bias [right] (either optional). Mean and Variance: [left]."""
    x = ctx.input("X")
    left, right = norm_split(x.shape, int(ctx.attr("begin_norm_axis", 1)))
    x2 = x.reshape(left, right)
    mu, sigma2 = x2.mean(axis=1), x2.var(axis=1)
    xhat = (x2 - mu[:, None]) / np.sqrt(sigma2 + float(ctx.attr("epsilon", 1e-5)))[:, None]
    y = xhat * _affine(ctx, "Scale", right, x.dtype, 1.0) + _affine(ctx, "Bias", right, x.dtype, 0.0)
    ctx.set_output("Y", y.reshape(x.shape).astype(x.dtype, copy=False))
    ctx.set_output("Mean", mu.astype(x.dtype, copy=False))
    ctx.set_output("Variance", sigma2.astype(x.dtype, copy=False))


@register("layer_norm_grad")
def layer_norm_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    left, right = norm_split(x.shape, int(ctx.attr("begin_norm_axis", 1)))
    x2 = x.reshape(left, right)
    inv = 1.0 / np.sqrt(ctx.input("Variance") + float(ctx.attr("epsilon", 1e-5)))[:, None]
    xhat = (x2 - ctx.input("Mean")[:, None]) * inv
    g = out_grad(ctx, x, "Y@GRAD").reshape(left, right)
    scale = _affine(ctx, "Scale", right, x.dtype, 1.0)
    if ctx.has_output("Scale@GRAD"):
        ctx.set_output("Scale@GRAD", (g * xhat).sum(axis=0).astype(scale.dtype, copy=False))
    if ctx.has_output("Bias@GRAD"):
        ctx.set_output("Bias@GRAD", g.sum(axis=0).astype(scale.dtype, copy=False))
    dxhat = g * scale
    dx = inv * (dxhat - dxhat.mean(axis=1, keepdims=True)
                - xhat * (dxhat * xhat).mean(axis=1, keepdims=True))
    ctx.set_output("X@GRAD", dx.reshape(x.shape).astype(x.dtype, copy=False))


# -- dropout ------------------------------------------------------------------------------------
def _dropout_factor(ctx: KernelContext, x: Array) -> Array | float:
    mask, scale = dropout_factor(ctx, x)
    return scale if mask is None else mask * scale


@register("dropout")
def dropout(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", (x * _dropout_factor(ctx, x)).astype(x.dtype, copy=False),
                   lod=ctx.lod("X"))


@register("dropout_grad")
def dropout_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    g = out_grad(ctx, x)
    ctx.set_output("X@GRAD", (g * _dropout_factor(ctx, x)).astype(x.dtype, copy=False))
