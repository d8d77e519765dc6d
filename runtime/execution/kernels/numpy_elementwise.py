"""Elementwise binary ops with Paddle broadcasting, and comparison / logical ops.

Paddle aligns Y to X's dims starting at `axis` (-1: aligned to X's trailing dims); trailing
1-dims of Y that would run past X's rank are dropped. After alignment both operands have X's
rank and numpy broadcasting applies (so X may broadcast too). A gradient is summed over the dims
its operand was broadcast along, then given the operand's own shape.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from runtime.execution.kernels.common import out_grad
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register

Array = np.ndarray
GradFn = Callable[[Array, Array, Array, Array], Array]  # (dout, x, y, out) -> d operand


def _pad(shape: tuple[int, ...], rank: int, axis: int) -> tuple[int, ...]:
    dims = list(shape)
    if axis < 0:
        axis = rank - len(dims)
    while dims and dims[-1] == 1 and axis + len(dims) > rank:
        dims.pop()
    if axis < 0 or axis + len(dims) > rank:
        raise ValueError(f"cannot align shape {list(shape)} at axis {axis} within rank {rank}")
    return (1,) * axis + tuple(dims) + (1,) * (rank - axis - len(dims))


def align(x_shape: tuple[int, ...], y_shape: tuple[int, ...],
          axis: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of equal rank that X and Y take for numpy broadcasting under Paddle's rule."""
    if len(x_shape) >= len(y_shape):
        return tuple(x_shape), _pad(y_shape, len(x_shape), axis)
    return _pad(x_shape, len(y_shape), axis), tuple(y_shape)


def unbroadcast(grad: Array, aligned: tuple[int, ...], shape: tuple[int, ...]) -> Array:
    """Sum `grad` over the dims where `aligned` is 1 and reshape to the operand's `shape`."""
    axes = tuple(i for i, (g, a) in enumerate(zip(grad.shape, aligned)) if a == 1 and g != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad.reshape(shape)


def operands(ctx: KernelContext) -> tuple[Array, Array]:
    """X and Y reshaped so that numpy broadcasting follows Paddle's `axis` rule."""
    x, y = ctx.input("X"), ctx.input("Y")
    xs, ys = align(x.shape, y.shape, int(ctx.attr("axis", -1)))
    return x.reshape(xs), y.reshape(ys)


def _register_binary(op_type: str, fn: Callable[[Array, Array], Array], dx: GradFn,
                     dy: GradFn) -> None:
    @register(op_type)
    def forward(ctx: KernelContext) -> None:
        x, y = operands(ctx)
        ctx.set_output("Out", fn(x, y), lod=ctx.lod("X"))

    @register(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x0, y0 = ctx.input("X"), ctx.input("Y")
        x, y = operands(ctx)
        out = ctx.input("Out")
        g = out_grad(ctx, out)
        if ctx.has_output("X@GRAD"):
            ctx.set_output("X@GRAD", unbroadcast(dx(g, x, y, out), x.shape, x0.shape).astype(x0.dtype))
        if ctx.has_output("Y@GRAD"):
            ctx.set_output("Y@GRAD", unbroadcast(dy(g, x, y, out), y.shape, y0.shape).astype(y0.dtype))


_BINARY: dict[str, tuple[Callable[[Array, Array], Array], GradFn, GradFn]] = {
    "elementwise_add": (np.add, lambda g, x, y, o: g, lambda g, x, y, o: g),
    "elementwise_sub": (np.subtract, lambda g, x, y, o: g, lambda g, x, y, o: -g),
    "elementwise_mul": (np.multiply, lambda g, x, y, o: g * y, lambda g, x, y, o: g * x),
    "elementwise_div": (np.divide, lambda g, x, y, o: g / y, lambda g, x, y, o: -g * o / y),
    "elementwise_max": (np.maximum, lambda g, x, y, o: g * (x > y), lambda g, x, y, o: g * (x <= y)),
    "elementwise_min": (np.minimum, lambda g, x, y, o: g * (x < y), lambda g, x, y, o: g * (x >= y)),
    "elementwise_pow": (np.power, lambda g, x, y, o: g * y * np.power(x, y - 1),
                        lambda g, x, y, o: g * o * np.log(x)),
}

for _op_type, (_fn, _dx, _dy) in _BINARY.items():
    _register_binary(_op_type, _fn, _dx, _dy)


def _register_predicate(op_type: str, fn: Callable[[Array, Array], Array]) -> None:
    @register(op_type)
    def forward(ctx: KernelContext) -> None:
        x, y = operands(ctx)
        ctx.set_output("Out", fn(x, y))


for _op_type, _fn in {"less_than": np.less, "logical_and": np.logical_and,
                      "logical_or": np.logical_or, "logical_xor": np.logical_xor}.items():
    _register_predicate(_op_type, _fn)


@register("logical_not")
def logical_not(ctx: KernelContext) -> None:
    ctx.set_output("Out", np.logical_not(ctx.input("X")))
