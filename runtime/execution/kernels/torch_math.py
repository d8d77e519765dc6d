"""Torch kernels of the unary math and activations, scale/cast/assign/reshape, reductions (mean,
sum, squared_l2_norm, reduce_sum, reduce_mean), concat and clipping, with their gradients: `numpy_math` op for op.

Formulas are the numpy backend's own (sigmoid as ``0.5 * (1 + tanh(x / 2))``, for one), so the
two backends differ only by rounding. Where numpy would compute integers in float64 (tanh of an
int, an int scaled by a float) the tensor is promoted to float64 first (`as_float`). The
activations with attributes (`gelu`, `silu`, `leaky_relu`, `elu`, `softplus`, `brelu`) run
torch's own kernels and their aten gradients, which compute numpy_math's formulas. `sum` and
`scale` also take `SelectedRows`, whose rows stay numpy (they index; they are not computed on)
and whose values are tensors.
"""

from __future__ import annotations

from typing import Callable

import math
from typing import Any

import numpy as np

from runtime.execution.kernels.common import reduce_axes, reduced_shape
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_math import grad_sources, reshape_target
from runtime.execution.kernels.torch_buffers import output_buffer, own, writable_input
from runtime.execution.kernels.torch_common import (Tensor, as_float, device, host_scalar,
                                                    input_t, kernel, np_dtype, out_grad_t, put,
                                                    result_dtype, tensor, torch, torch_dtype)
from runtime.execution.tensor import SelectedRows

UnaryFn = Callable[[Tensor], Tensor]
UnaryGrad = Callable[[Tensor, Tensor, Tensor], Tensor]  # (dout, x, out) -> dx


def _sigmoid(x: Tensor) -> Tensor:
    return 0.5 * (1.0 + torch.tanh(0.5 * x))


def _relu_grad(g: Tensor, out: Tensor) -> Tensor:
    """numpy's ``g * (out > 0)``: where dtypes and shapes agree, torch's fused relu gradient (g
    where out > 0, else 0: one pass, no mask tensor), which differs only where g is inf or NaN
    and out is 0 (0 there, not NaN); else ``g * sign(out)`` (out >= 0, so sign(out) is the
    mask, and a float mask multiplies faster than a bool one)."""
    if g.dtype == out.dtype and g.shape == out.shape:
        return torch.ops.aten.threshold_backward(g, out, 0)
    return g * torch.sign(out)


# op type -> (forward, gradient from (dout, x, out)); gradient None: not differentiable.
_UNARY: dict[str, tuple[UnaryFn, UnaryGrad | None]] = {
    "relu": (torch.relu, lambda g, x, o: _relu_grad(g, o)),
    "tanh": (lambda x: torch.tanh(as_float(x)), lambda g, x, o: g * (1 - o * o)),
    "sigmoid": (lambda x: _sigmoid(as_float(x)), lambda g, x, o: g * o * (1 - o)),
    "exp": (lambda x: torch.exp(as_float(x)), lambda g, x, o: g * o),
    "log": (lambda x: torch.log(as_float(x)), lambda g, x, o: g / x),
    "sqrt": (lambda x: torch.sqrt(as_float(x)), lambda g, x, o: g * 0.5 / o),
    "square": (torch.square, lambda g, x, o: g * 2 * x),
    "cos": (lambda x: torch.cos(as_float(x)), lambda g, x, o: -g * torch.sin(x)),
    "softsign": (lambda x: as_float(x) / (1 + torch.abs(as_float(x))),
                 lambda g, x, o: g / torch.square(1 + torch.abs(x))),
    "floor": (torch.floor, None),
    "ceil": (torch.ceil, None),
    "sign": (torch.sign, None),
}


def _register_unary(op_type: str, fn: UnaryFn, grad: UnaryGrad | None) -> None:
    @kernel(op_type)
    def forward(ctx: KernelContext) -> None:
        put(ctx, "Out", fn(input_t(ctx, "X")), lod=ctx.lod("X"))

    if grad is None:
        return

    @kernel(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x, out = ctx.input("X"), input_t(ctx, "Out")
        put(ctx, "X@GRAD", grad(out_grad_t(ctx), tensor(x), out), dtype=x.dtype)


for _op_type, (_fn, _grad) in _UNARY.items():
    _register_unary(_op_type, _fn, _grad)


# -- activations with attributes: torch's own kernels, attributes as numpy_math reads them --------
Attr = Callable[[str, Any], Any]
aten = torch.ops.aten


def _gelu_mode(attr: Attr) -> str:
    return "tanh" if attr("approximate", False) else "none"


def _elu_grad(g: Tensor, x: Tensor, alpha: float) -> Tensor:
    return torch.where(x > 0, g, g * alpha * torch.exp(torch.clamp(x, max=0)))


def _alpha(attr: Attr, default: float) -> float:
    return float(attr("alpha", default))


def _softplus_args(attr: Attr) -> tuple[float, float]:
    return float(attr("beta", 1.0)), float(attr("threshold", 20.0))


def _bounds(attr: Attr) -> tuple[float, float]:
    return float(attr("t_min", 0.0)), float(attr("t_max", 24.0))


# op type -> (forward from (x, attr), gradient from (dout, x, out, attr))
_ACTIVATIONS: dict[str, tuple[Callable[[Tensor, Attr], Tensor],
                              Callable[[Tensor, Tensor, Tensor, Attr], Tensor]]] = {
    "gelu": (lambda x, a: torch.nn.functional.gelu(x, approximate=_gelu_mode(a)),
             lambda g, x, o, a: aten.gelu_backward(g, x, approximate=_gelu_mode(a))),
    "silu": (lambda x, a: torch.nn.functional.silu(x),
             lambda g, x, o, a: aten.silu_backward(g, x)),
    "leaky_relu": (lambda x, a: torch.nn.functional.leaky_relu(x, _alpha(a, 0.02)),
                   lambda g, x, o, a: aten.leaky_relu_backward(g, x, _alpha(a, 0.02), False)),
    "elu": (lambda x, a: torch.nn.functional.elu(x, _alpha(a, 1.0)),
            lambda g, x, o, a: _elu_grad(g, x, _alpha(a, 1.0))),
    "softplus": (lambda x, a: torch.nn.functional.softplus(x, *_softplus_args(a)),
                 lambda g, x, o, a: aten.softplus_backward(g, x, *_softplus_args(a))),
    "brelu": (lambda x, a: torch.nn.functional.hardtanh(x, *_bounds(a)),
              lambda g, x, o, a: aten.hardtanh_backward(g, x, *_bounds(a))),
}


def _register_activation(op_type: str, fn: Callable[[Tensor, Attr], Tensor],
                         grad: Callable[[Tensor, Tensor, Tensor, Attr], Tensor]) -> None:
    @kernel(op_type)
    def forward(ctx: KernelContext) -> None:
        put(ctx, "Out", fn(as_float(input_t(ctx, "X")), ctx.attr), lod=ctx.lod("X"))

    @kernel(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x, out = ctx.input("X"), input_t(ctx, "Out")
        dx = grad(out_grad_t(ctx), as_float(tensor(x)), out, ctx.attr)
        put(ctx, "X@GRAD", dx, dtype=x.dtype)


for _op_type, (_act, _act_grad) in _ACTIVATIONS.items():
    _register_activation(_op_type, _act, _act_grad)


# -- scale, cast, assign, reshape ---------------------------------------------------------------
def _scale(x: Tensor, scale: float, bias: float, bias_after_scale: bool) -> Tensor:
    x = as_float(x)
    return x * scale + bias if bias_after_scale else (x + bias) * scale


def _scale_into(x: Tensor, scale: float, bias: float, bias_after_scale: bool) -> Tensor:
    """`_scale` computed into `x` itself: the same two operations in the same order."""
    if bias_after_scale:
        return x.mul_(scale).add_(bias)
    return x.add_(bias).mul_(scale)


@kernel("scale")
def scale(ctx: KernelContext) -> None:
    args = (float(ctx.attr("scale", 1.0)), float(ctx.attr("bias", 0.0)),
            bool(ctx.attr("bias_after_scale", True)))
    mine = writable_input(ctx, "X", "Out")  # a pserver's scale of its summed gradient
    if mine is not None and mine.is_floating_point():
        put(ctx, "Out", _scale_into(mine, *args), lod=ctx.lod("X"))
        return
    del mine
    x = ctx.input("X")
    if isinstance(x, SelectedRows):
        ctx.set_output("Out", SelectedRows(x.rows, _scale(tensor(x.values), *args), x.height))
    else:
        put(ctx, "Out", _scale(tensor(x), *args), lod=ctx.lod("X"))


@kernel("scale_grad")
def scale_grad(ctx: KernelContext) -> None:
    g = out_grad_t(ctx, "X")
    put(ctx, "X@GRAD", g * float(ctx.attr("scale", 1.0)))


@kernel("cast")
def cast(ctx: KernelContext) -> None:
    put(ctx, "Out", input_t(ctx, "X"), lod=ctx.lod("X"), dtype=np.dtype(ctx.attr("out_dtype")))


@kernel("cast_grad")
def cast_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    put(ctx, "X@GRAD", out_grad_t(ctx), dtype=x.dtype)


def _copy(value: Any) -> Tensor | SelectedRows:
    if isinstance(value, SelectedRows):
        return SelectedRows(value.rows.copy(), tensor(value.values).clone(), value.height)
    return tensor(value).clone()


@kernel("assign")
def assign(ctx: KernelContext) -> None:
    ctx.set_output("Out", _copy(ctx.input("X")), lod=ctx.lod("X"))


@kernel("assign_grad")
def assign_grad(ctx: KernelContext) -> None:
    g = ctx.input("Out@GRAD")
    ctx.set_output("X@GRAD", out_grad_t(ctx) if g is None else _copy(g))


@kernel("reshape")
def reshape(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    put(ctx, "Out", x.reshape(reshape_target(list(ctx.attr("shape")), tuple(x.shape))))


@kernel("reshape_grad")
def reshape_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    put(ctx, "X@GRAD", out_grad_t(ctx).reshape(x.shape))


# -- reductions ---------------------------------------------------------------------------------
@kernel("mean")
def mean(ctx: KernelContext) -> None:
    x = ctx.input("X")
    put(ctx, "Out", as_float(tensor(x)).mean().reshape(1), dtype=x.dtype)


@kernel("mean_grad")
def mean_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    share = _out_grad_scalar(ctx) / math.prod(x.shape)
    put(ctx, "X@GRAD", torch.full(x.shape, share.item(), dtype=torch_dtype(x.dtype), device=device()))


def _out_grad_scalar(ctx: KernelContext) -> Any:
    """The single element of Out@GRAD as a numpy scalar; zero (of Out's dtype) when missing."""
    g = ctx.host_input("Out@GRAD")
    return np_dtype(ctx.input("Out").dtype).type(0) if g is None else host_scalar(g)


def _reduce_plan(ctx: KernelContext, rank: int) -> tuple[tuple[int, ...], bool]:
    return reduce_axes(ctx, rank)


@kernel("reduce_sum")
def reduce_sum(ctx: KernelContext) -> None:
    x = ctx.input("X")
    axes, keep = _reduce_plan(ctx, len(x.shape))
    out = torch.sum(input_t(ctx, "X"), dim=axes, keepdim=keep) if axes else input_t(ctx, "X")
    put(ctx, "Out", out.reshape(reduced_shape(tuple(x.shape), axes, keep)), dtype=x.dtype)


@kernel("reduce_mean")
def reduce_mean(ctx: KernelContext) -> None:
    x = ctx.input("X")
    axes, keep = _reduce_plan(ctx, len(x.shape))
    t = as_float(input_t(ctx, "X"))
    out = torch.mean(t, dim=axes, keepdim=keep) if axes else t
    put(ctx, "Out", out.reshape(reduced_shape(tuple(x.shape), axes, keep)), dtype=x.dtype)


def _spread_t(ctx: KernelContext, shape: tuple[int, ...], axes: tuple[int, ...]) -> Tensor:
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    return out_grad_t(ctx).reshape(kept).expand(shape)


@kernel("reduce_sum_grad")
def reduce_sum_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    shape = tuple(x.shape)
    axes, _ = _reduce_plan(ctx, len(shape))
    put(ctx, "X@GRAD", _spread_t(ctx, shape, axes).contiguous(), dtype=x.dtype)


@kernel("reduce_mean_grad")
def reduce_mean_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    shape = tuple(x.shape)
    axes, _ = _reduce_plan(ctx, len(shape))
    count = max(math.prod(shape[a] for a in axes), 1)
    put(ctx, "X@GRAD", _spread_t(ctx, shape, axes) / count, dtype=x.dtype)


@kernel("squared_l2_norm")
def squared_l2_norm(ctx: KernelContext) -> None:
    x = ctx.input("X")
    t = tensor(x).reshape(-1)
    put(ctx, "Out", torch.dot(t, t).reshape(1), dtype=x.dtype)


@kernel("squared_l2_norm_grad")
def squared_l2_norm_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    twice = 2 * _out_grad_scalar(ctx)
    put(ctx, "X@GRAD", tensor(x, result_dtype(x.dtype, twice.dtype)) * float(twice))


def sum_values(values: list[Any], out: Tensor | None = None) -> Tensor | SelectedRows:
    """All SelectedRows: their rows and values concatenated; otherwise the dense sum, into `out`
    where given (a tensor of the first dense value's shape, dtype and device)."""
    if not values:
        raise ValueError("sum: no inputs")
    sparse = [v for v in values if isinstance(v, SelectedRows)]
    if len(sparse) == len(values):
        heights = {v.height for v in sparse}
        if len(heights) != 1:
            raise ValueError(f"sum: SelectedRows inputs of different heights {sorted(heights)}")
        merged = torch.cat([tensor(v.values) for v in sparse])
        return SelectedRows(np.concatenate([v.rows for v in sparse]), merged, sparse[0].height)
    dense = [tensor(v) for v in values if not isinstance(v, SelectedRows)]
    total = own(dense[0].clone()) if out is None else out.copy_(dense[0])
    for value in dense[1:]:
        total += value
    for rows in sparse:
        total.index_add_(0, tensor(rows.rows), tensor(rows.values).to(total.dtype))
    return total


@kernel("sum")
def sum_(ctx: KernelContext) -> None:
    values = [tensor(v) if not isinstance(v, SelectedRows) else v for v in ctx.inputs("X")]
    first, out = values[0] if values else None, None
    if isinstance(first, Tensor) and all(
            isinstance(v, Tensor) and v.shape == first.shape and v.dtype == first.dtype
            for v in values):
        out = output_buffer(ctx, "Out", tuple(first.shape), first.dtype, first.device)
    ctx.set_output("Out", sum_values(values, out), lod=ctx.lod("X"))


# -- concat -------------------------------------------------------------------------------------
@kernel("concat")
def concat(ctx: KernelContext) -> None:
    xs = [tensor(x) for x in ctx.inputs("X")]
    axis = int(ctx.attr("axis", 0))
    out = None
    if xs and xs[0].dim() and all(x.dtype == xs[0].dtype and x.dim() == xs[0].dim() for x in xs):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)  # a mismatch: torch's own error below
        out = output_buffer(ctx, "Out", tuple(shape), xs[0].dtype, xs[0].device)
    put(ctx, "Out", torch.cat(xs, dim=axis, out=out) if out is not None
        else own(torch.cat(xs, dim=axis)))


@kernel("concat_grad")
def concat_grad(ctx: KernelContext) -> None:
    xs = ctx.inputs("X")
    axis = int(ctx.attr("axis", 0)) % xs[0].ndim
    g = out_grad_t(ctx)
    pieces = torch.split(g, [x.shape[axis] for x in xs], dim=axis)
    for j, positions in enumerate(grad_sources(ctx, "X")):
        if not positions:
            raise ValueError(f"concat_grad: {ctx.output_names('X@GRAD')[j]!r} matches no input of X")
        put(ctx, "X@GRAD", torch.stack([pieces[i] for i in positions]).sum(dim=0), index=j)


# -- clipping -----------------------------------------------------------------------------------
@kernel("clip")
def clip(ctx: KernelContext) -> None:
    x = ctx.input("X")
    out = torch.clamp(as_float(tensor(x)), float(ctx.attr("min")), float(ctx.attr("max")))
    put(ctx, "Out", out, lod=ctx.lod("X"), dtype=x.dtype)


@kernel("clip_grad")
def clip_grad(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    inside = (x > float(ctx.attr("min"))) & (x < float(ctx.attr("max")))
    put(ctx, "X@GRAD", out_grad_t(ctx, "X") * inside)


@kernel("clip_by_norm")
def clip_by_norm(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    max_norm = float(ctx.attr("max_norm"))
    flat = x.reshape(-1)
    norm = float(np.sqrt(host_scalar(torch.dot(flat, flat))))  # sqrt in x's dtype, as numpy does
    put(ctx, "Out", x * (max_norm / norm) if norm > max_norm else x.clone())
