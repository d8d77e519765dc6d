"""Unary math and activations, scale/cast/assign/reshape, reductions (mean, sum,
squared_l2_norm), concat, and clipping, with their gradient kernels.

Activation gradients read the forward output where Paddle's do (relu, tanh, sigmoid, exp,
sqrt), otherwise the input (softsign, x / (1 + |x|), too). The activations with attributes (`gelu`, `silu`, `leaky_relu`,
`elu`, `softplus`, `brelu`: Paddle's ops, with its attribute names and defaults) compute as
torch's GELU, SiLU, LeakyReLU, ELU, Softplus and Hardtanh do. `sum` and `scale` also accept
`SelectedRows`, as the pserver sums and averages sparse gradients with them.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from transpiler.ir import strip_grad_suffix

from runtime.execution.kernels.buffers import output_buffer, writable_input
from runtime.execution.kernels.common import out_grad, reduce_axes, reduced_shape, scalar
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.tensor import SelectedRows, copy_value

Array = np.ndarray


def _sigmoid(x: Array) -> Array:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


# op type -> (forward, gradient from (dout, x, out)); gradient None: not differentiable.
_UNARY: dict[str, tuple[Callable[[Array], Array], Callable[[Array, Array, Array], Array] | None]] = {
    "relu": (lambda x: np.maximum(x, 0), lambda g, x, o: g * (o > 0)),
    "tanh": (np.tanh, lambda g, x, o: g * (1 - o * o)),
    "sigmoid": (_sigmoid, lambda g, x, o: g * o * (1 - o)),
    "exp": (np.exp, lambda g, x, o: g * o),
    "log": (np.log, lambda g, x, o: g / x),
    "sqrt": (np.sqrt, lambda g, x, o: g * 0.5 / o),
    "square": (np.square, lambda g, x, o: g * 2 * x),
    "cos": (np.cos, lambda g, x, o: -g * np.sin(x)),
    "softsign": (lambda x: x / (1 + np.abs(x)), lambda g, x, o: g / np.square(1 + np.abs(x))),
    "floor": (np.floor, None),
    "ceil": (np.ceil, None),
    "sign": (np.sign, None),
}


def _register_unary(op_type: str, fn: Callable[[Array], Array],
                    grad: Callable[[Array, Array, Array], Array] | None) -> None:
    @register(op_type)
    def forward(ctx: KernelContext) -> None:
        ctx.set_output("Out", fn(ctx.input("X")), lod=ctx.lod("X"))

    if grad is None:
        return

    @register(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x, out = ctx.input("X"), ctx.input("Out")
        ctx.set_output("X@GRAD", grad(out_grad(ctx, out), x, out).astype(x.dtype, copy=False))


for _op_type, (_fn, _grad) in _UNARY.items():
    _register_unary(_op_type, _fn, _grad)


# -- activations with attributes ------------------------------------------------------------------
Attr = Callable[[str, Any], Any]
"""An op's attribute by name, with its default: `KernelContext.attr`."""

_SQRT_2_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


@functools.cache
def _erf_ufunc() -> Callable[[Array], Array]:
    """erf of each element: scipy's where it is installed, else the standard library's."""
    try:
        from scipy.special import erf
    except ImportError:
        scalar_erf = np.frompyfunc(math.erf, 1, 1)
        return lambda x: np.asarray(scalar_erf(x), dtype=x.dtype)
    return erf  # type: ignore[no-any-return]


def _gelu(x: Array, attr: Attr) -> Array:
    if attr("approximate", False):
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_PI * (x + _GELU_CUBIC * x ** 3)))
    return 0.5 * x * (1.0 + _erf_ufunc()(x / math.sqrt(2.0)))


def _gelu_grad(g: Array, x: Array, o: Array, attr: Attr) -> Array:
    if attr("approximate", False):
        t = np.tanh(_SQRT_2_PI * (x + _GELU_CUBIC * x ** 3))
        slope = _SQRT_2_PI * (1.0 + 3.0 * _GELU_CUBIC * x * x)
        return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * slope)
    cdf = 0.5 * (1.0 + _erf_ufunc()(x / math.sqrt(2.0)))
    return g * (cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi))


def _silu_grad(g: Array, x: Array, o: Array, attr: Attr) -> Array:
    s = _sigmoid(x)
    return g * s * (1.0 + x * (1.0 - s))


def _elu(x: Array, attr: Attr) -> Array:
    alpha = float(attr("alpha", 1.0))
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _elu_grad(g: Array, x: Array, o: Array, attr: Attr) -> Array:
    return np.where(x > 0, g, g * float(attr("alpha", 1.0)) * np.exp(np.minimum(x, 0)))


def _softplus(x: Array, attr: Attr) -> Array:
    beta, threshold = float(attr("beta", 1.0)), float(attr("threshold", 20.0))
    return np.where(x * beta > threshold, x, np.logaddexp(0, x * beta) / beta)


def _softplus_grad(g: Array, x: Array, o: Array, attr: Attr) -> Array:
    beta, threshold = float(attr("beta", 1.0)), float(attr("threshold", 20.0))
    return np.where(x * beta > threshold, g, g * _sigmoid(x * beta))


def _brelu_grad(g: Array, x: Array, o: Array, attr: Attr) -> Array:
    inside = (x > float(attr("t_min", 0.0))) & (x < float(attr("t_max", 24.0)))
    return g * inside


# op type -> (forward from (x, attr), gradient from (dout, x, out, attr))
_ACTIVATIONS: dict[str, tuple[Callable[[Array, Attr], Array],
                              Callable[[Array, Array, Array, Attr], Array]]] = {
    "gelu": (_gelu, _gelu_grad),
    "silu": (lambda x, attr: x * _sigmoid(x), _silu_grad),
    "leaky_relu": (lambda x, attr: np.where(x > 0, x, float(attr("alpha", 0.02)) * x),
                   lambda g, x, o, attr: np.where(x > 0, g, float(attr("alpha", 0.02)) * g)),
    "elu": (_elu, _elu_grad),
    "softplus": (_softplus, _softplus_grad),
    "brelu": (lambda x, attr: np.clip(x, float(attr("t_min", 0.0)), float(attr("t_max", 24.0))),
              _brelu_grad),
}


def _register_activation(op_type: str, fn: Callable[[Array, Attr], Array],
                         grad: Callable[[Array, Array, Array, Attr], Array]) -> None:
    @register(op_type)
    def forward(ctx: KernelContext) -> None:
        x = ctx.input("X")
        x = x if x.dtype.kind == "f" else x.astype(np.float64)  # as np.tanh promotes an int
        ctx.set_output("Out", fn(x, ctx.attr), lod=ctx.lod("X"))

    @register(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x, out = ctx.input("X"), ctx.input("Out")
        dx = grad(out_grad(ctx, out), x, out, ctx.attr)
        ctx.set_output("X@GRAD", dx.astype(x.dtype, copy=False))


for _op_type, (_act, _act_grad) in _ACTIVATIONS.items():
    _register_activation(_op_type, _act, _act_grad)


# -- scale, cast, assign, reshape ---------------------------------------------------------------
def _scale(x: Array, scale: float, bias: float, bias_after_scale: bool,
           out: Array | None = None) -> Array:
    """``x * scale + bias`` (or ``(x + bias) * scale``), into `out` where given; a zero bias
    is not added (it would only turn -0.0 into 0.0, at the cost of a pass and an array)."""
    if bias and not bias_after_scale:
        x = np.add(x, bias, out=out)
    x = np.multiply(x, scale, out=out)
    if bias and bias_after_scale:
        x = np.add(x, bias, out=x)  # x is out, or the product just made
    return x


@register("scale")
def scale(ctx: KernelContext) -> None:
    args = (float(ctx.attr("scale", 1.0)), float(ctx.attr("bias", 0.0)),
            bool(ctx.attr("bias_after_scale", True)))
    own = writable_input(ctx, "X", "Out")  # a pserver's scale of its summed gradient
    if own is not None and own.dtype.kind == "f":
        ctx.set_output("Out", _scale(own, *args, out=own), lod=ctx.lod("X"))
        return
    x = ctx.input("X")
    if isinstance(x, SelectedRows):
        ctx.set_output("Out", SelectedRows(x.rows, _scale(x.values, *args), x.height))
    else:
        ctx.set_output("Out", _scale(x, *args), lod=ctx.lod("X"))


@register("scale_grad")
def scale_grad(ctx: KernelContext) -> None:
    g = out_grad(ctx, ctx.input("X"))
    ctx.set_output("X@GRAD", g * float(ctx.attr("scale", 1.0)))


@register("cast")
def cast(ctx: KernelContext) -> None:
    dtype = np.dtype(ctx.attr("out_dtype"))
    ctx.set_output("Out", ctx.input("X").astype(dtype), lod=ctx.lod("X"))


@register("cast_grad")
def cast_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("X@GRAD", out_grad(ctx, ctx.input("Out")).astype(x.dtype))


@register("assign")
def assign(ctx: KernelContext) -> None:
    ctx.set_output("Out", copy_value(ctx.input("X")), lod=ctx.lod("X"))


@register("assign_grad")
def assign_grad(ctx: KernelContext) -> None:
    ctx.set_output("X@GRAD", copy_value(out_grad(ctx, ctx.input("Out"))))


def reshape_target(spec: list[int], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Paddle's reshape: 0 copies the input dim at that position, one -1 is inferred."""
    dims = [shape[i] if d == 0 else int(d) for i, d in enumerate(spec)]
    size = math.prod(shape)
    if dims.count(-1) > 1:
        raise ValueError(f"reshape: shape {spec} has more than one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot infer -1 in {spec} for {size} elements of {list(shape)}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise ValueError(f"reshape: shape {spec} does not hold the {size} elements of {list(shape)}")
    return tuple(dims)


@register("reshape")
def reshape(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", x.reshape(reshape_target(list(ctx.attr("shape")), x.shape)))


@register("reshape_grad")
def reshape_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("X@GRAD", out_grad(ctx, ctx.input("Out")).reshape(x.shape))


# -- reductions ---------------------------------------------------------------------------------
@register("mean")
def mean(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", np.asarray(x.mean(), dtype=x.dtype).reshape(1))


@register("mean_grad")
def mean_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    g = scalar(out_grad(ctx, ctx.input("Out")))
    ctx.set_output("X@GRAD", np.full(x.shape, g / x.size, dtype=x.dtype))


def _reduce_plan(ctx: KernelContext, x: Array) -> tuple[tuple[int, ...], bool, tuple[int, ...]]:
    axes, keep = reduce_axes(ctx, x.ndim)
    return axes, keep, reduced_shape(x.shape, axes, keep)


@register("reduce_sum")
def reduce_sum(ctx: KernelContext) -> None:
    """fluid's reduce_sum: X summed over ``dim`` (every axis with ``reduce_all``)."""
    x = ctx.input("X")
    axes, keep, shape = _reduce_plan(ctx, x)
    ctx.set_output("Out", np.asarray(x.sum(axis=axes, keepdims=keep), dtype=x.dtype).reshape(shape))


@register("reduce_mean")
def reduce_mean(ctx: KernelContext) -> None:
    """fluid's reduce_mean: X averaged over ``dim`` (every axis with ``reduce_all``)."""
    x = ctx.input("X")
    axes, keep, shape = _reduce_plan(ctx, x)
    ctx.set_output("Out", np.asarray(x.mean(axis=axes, keepdims=keep), dtype=x.dtype).reshape(shape))


def _spread(ctx: KernelContext, x: Array, axes: tuple[int, ...]) -> Array:
    """Out@GRAD broadcast back over the reduced axes to X's shape."""
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    g = out_grad(ctx, ctx.input("Out"))
    return np.broadcast_to(np.asarray(g).reshape(kept), x.shape)


@register("reduce_sum_grad")
def reduce_sum_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    axes, _, _ = _reduce_plan(ctx, x)
    ctx.set_output("X@GRAD", _spread(ctx, x, axes).astype(x.dtype, copy=True))


@register("reduce_mean_grad")
def reduce_mean_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    axes, _, _ = _reduce_plan(ctx, x)
    count = math.prod(x.shape[a] for a in axes)
    ctx.set_output("X@GRAD", (_spread(ctx, x, axes) / max(count, 1)).astype(x.dtype, copy=False))


@register("squared_l2_norm")
def squared_l2_norm(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", np.asarray(np.vdot(x, x), dtype=x.dtype).reshape(1))


@register("squared_l2_norm_grad")
def squared_l2_norm_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    g = scalar(out_grad(ctx, ctx.input("Out")))
    ctx.set_output("X@GRAD", x * (2 * g))


def sum_values(values: list[Array | SelectedRows],
               out: Array | None = None) -> Array | SelectedRows:
    """All SelectedRows: their rows and values concatenated; otherwise the dense sum, into
    `out` where given (an array of the first dense value's shape and dtype)."""
    if not values:
        raise ValueError("sum: no inputs")
    sparse = [v for v in values if isinstance(v, SelectedRows)]
    if len(sparse) == len(values):
        heights = {v.height for v in sparse}
        if len(heights) != 1:
            raise ValueError(f"sum: SelectedRows inputs of different heights {sorted(heights)}")
        return SelectedRows(np.concatenate([v.rows for v in sparse]),
                            np.concatenate([v.values for v in sparse]), sparse[0].height)
    dense = [v for v in values if not isinstance(v, SelectedRows)]
    total = np.empty_like(dense[0]) if out is None else out
    if len(dense) > 1:  # one pass over the first two, not a copy and an add: a pserver's sum
        np.add(dense[0], dense[1], out=total, casting="same_kind")  # of two trainers' grads
    else:
        np.copyto(total, dense[0])
    for value in dense[2:]:
        total += value
    for rows in sparse:
        np.add.at(total, rows.rows, rows.values)
    return total


@register("sum")
def sum_(ctx: KernelContext) -> None:
    values = ctx.inputs("X")
    first, out = values[0] if values else None, None
    if isinstance(first, np.ndarray) and all(
            type(v) is np.ndarray and v.shape == first.shape for v in values):
        out = output_buffer(ctx, "Out", first.shape, first.dtype)  # last run's array
    ctx.set_output("Out", sum_values(values, out), lod=ctx.lod("X"))


@register("sum_grad")
def sum_grad(ctx: KernelContext) -> None:
    g = ctx.input("Out@GRAD")
    for i in range(len(ctx.output_names("X@GRAD"))):
        ctx.set_output("X@GRAD", g, index=i)


# -- concat -------------------------------------------------------------------------------------
@register("concat")
def concat(ctx: KernelContext) -> None:
    xs = ctx.inputs("X")
    axis = int(ctx.attr("axis", 0))
    out = None
    if xs and all(type(x) is np.ndarray and x.dtype == xs[0].dtype for x in xs):
        shape = list(xs[0].shape)
        if shape:
            shape[axis] = sum(x.shape[axis] for x in xs)  # a mismatch: numpy's own error below
            out = output_buffer(ctx, "Out", tuple(shape), xs[0].dtype)
    ctx.set_output("Out", np.concatenate(xs, axis=axis, out=out))


def grad_sources(ctx: KernelContext, slot: str) -> list[list[int]]:
    """For each var of `slot@GRAD`, the positions in `slot` whose gradient it is.

    The grad op lists gradients only for inputs that need one, so when some are left out the
    positions are recovered from the names (``x@GRAD`` and its renames belong to ``x``).
    """
    fwd = ctx.input_names(slot)
    grads = ctx.output_names(slot + "@GRAD")
    if len(grads) == len(fwd):
        return [[i] for i in range(len(fwd))]
    owners = [strip_grad_suffix(g) for g in grads]
    return [[i for i, name in enumerate(fwd) if name == owner] for owner in owners]


@register("concat_grad")
def concat_grad(ctx: KernelContext) -> None:
    xs = ctx.inputs("X")
    axis = int(ctx.attr("axis", 0)) % xs[0].ndim
    g = out_grad(ctx, ctx.input("Out"))
    pieces = np.split(g, np.cumsum([x.shape[axis] for x in xs])[:-1], axis=axis)
    for j, positions in enumerate(grad_sources(ctx, "X")):
        if not positions:
            raise ValueError(f"concat_grad: {ctx.output_names('X@GRAD')[j]!r} matches no input of X")
        ctx.set_output("X@GRAD", np.sum([pieces[i] for i in positions], axis=0, dtype=g.dtype),
                       index=j)


# -- clipping -----------------------------------------------------------------------------------
@register("clip")
def clip(ctx: KernelContext) -> None:
    x = ctx.input("X")
    out = np.clip(x, float(ctx.attr("min")), float(ctx.attr("max"))).astype(x.dtype, copy=False)
    ctx.set_output("Out", out, lod=ctx.lod("X"))


@register("clip_grad")
def clip_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    inside = (x > float(ctx.attr("min"))) & (x < float(ctx.attr("max")))
    ctx.set_output("X@GRAD", out_grad(ctx, x) * inside)


@register("clip_by_norm")
def clip_by_norm(ctx: KernelContext) -> None:
    x = ctx.input("X")
    max_norm = float(ctx.attr("max_norm"))
    norm = float(np.sqrt(np.vdot(x, x)))
    ctx.set_output("Out", x * (max_norm / norm) if norm > max_norm else x.copy())
