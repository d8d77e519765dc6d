"""Torch kernels of the elementwise binary ops, comparisons and logical ops.

Operands are aligned with the numpy backend's `align` (Paddle's `axis` rule) and cast to the
input types of the numpy ufunc's loop for their dtypes, so results have numpy's dtype (an int
division gives float64, float32 against float64 computes in float64). Gradients are summed over
the broadcast dims and cast to the operand's dtype, as in `numpy_elementwise`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_elementwise import align
from runtime.execution.kernels.torch_common import (Tensor, input_t, kernel, np_dtype, optional_t,
                                                    out_grad_t, put, tensor, torch)

BinaryFn = Callable[[Tensor, Tensor], Tensor]
GradFn = Callable[[Tensor, Tensor, Tensor, Any], Tensor]  # (dout, x, y, out or None) -> d operand


@functools.lru_cache(maxsize=4096)
def _layout(ufunc: np.ufunc, x_shape: tuple[int, ...], y_shape: tuple[int, ...], axis: int,
            x_dtype: Any, y_dtype: Any) -> tuple[tuple[int, ...], tuple[int, ...], Any, Any]:
    """X's and Y's aligned shapes and the dtypes (numpy's or torch's) they are computed in: the
    input dtypes of the numpy loop `ufunc` runs for them, None where an operand's own serves.

    DESIGN: cached per shapes, axis and dtypes, since a program's ops see the same ones step
    after step; the alignment and dtype resolution are then one look-up, not Python work on
    every call. Bounded, as sequence batches bring new shapes."""
    xs, ys = align(x_shape, y_shape, axis)
    in_x, in_y, _ = ufunc.resolve_dtypes((np_dtype(x_dtype), np_dtype(y_dtype), None))
    return (xs, ys, None if in_x == np_dtype(x_dtype) else in_x,
            None if in_y == np_dtype(y_dtype) else in_y)


def operands(ctx: KernelContext, ufunc: np.ufunc) -> tuple[Tensor, Tensor]:
    """X and Y as tensors of aligned shapes and the dtypes numpy's `ufunc` would compute in."""
    x, y = ctx.input("X"), ctx.input("Y")
    xs, ys, dx, dy = _layout(ufunc, x.shape, y.shape, int(ctx.attr("axis", -1)), x.dtype, y.dtype)
    tx, ty = tensor(x, dx), tensor(y, dy)
    return (tx if tx.shape == xs else tx.reshape(xs)), (ty if ty.shape == ys else ty.reshape(ys))


def unbroadcast(grad: Tensor, aligned: tuple[int, ...], shape: tuple[int, ...]) -> Tensor:
    """Sum `grad` over the dims where `aligned` is 1 and reshape to the operand's `shape`."""
    dims = [i for i, (g, a) in enumerate(zip(grad.shape, aligned)) if a == 1 and g != 1]
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.reshape(shape)


def _register_binary(op_type: str, ufunc: np.ufunc, fn: BinaryFn, dx: GradFn, dy: GradFn) -> None:
    @kernel(op_type)
    def forward(ctx: KernelContext) -> None:
        put(ctx, "Out", fn(*operands(ctx, ufunc)), lod=ctx.lod("X"))

    @kernel(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x0, y0 = ctx.input("X"), ctx.input("Y")
        x, y = operands(ctx, ufunc)
        out = optional_t(ctx, "Out")
        g = out_grad_t(ctx)
        if ctx.has_output("X@GRAD"):
            put(ctx, "X@GRAD", unbroadcast(dx(g, x, y, out), tuple(x.shape), x0.shape), dtype=x0.dtype)
        if ctx.has_output("Y@GRAD"):
            put(ctx, "Y@GRAD", unbroadcast(dy(g, x, y, out), tuple(y.shape), y0.shape), dtype=y0.dtype)


_BINARY: dict[str, tuple[np.ufunc, BinaryFn, GradFn, GradFn]] = {
    "elementwise_add": (np.add, torch.add, lambda g, x, y, o: g, lambda g, x, y, o: g),
    "elementwise_sub": (np.subtract, torch.sub, lambda g, x, y, o: g, lambda g, x, y, o: -g),
    "elementwise_mul": (np.multiply, torch.mul, lambda g, x, y, o: g * y, lambda g, x, y, o: g * x),
    "elementwise_div": (np.divide, torch.div, lambda g, x, y, o: g / y,
                        lambda g, x, y, o: -g * o / y),
    "elementwise_max": (np.maximum, torch.maximum, lambda g, x, y, o: g * (x > y),
                        lambda g, x, y, o: g * (x <= y)),
    "elementwise_min": (np.minimum, torch.minimum, lambda g, x, y, o: g * (x < y),
                        lambda g, x, y, o: g * (x >= y)),
    "elementwise_pow": (np.power, torch.pow, lambda g, x, y, o: g * y * torch.pow(x, y - 1),
                        lambda g, x, y, o: g * o * torch.log(x)),
}

for _op_type, (_ufunc, _fn, _dx, _dy) in _BINARY.items():
    _register_binary(_op_type, _ufunc, _fn, _dx, _dy)


def _register_predicate(op_type: str, ufunc: np.ufunc, fn: BinaryFn) -> None:
    @kernel(op_type)
    def forward(ctx: KernelContext) -> None:
        put(ctx, "Out", fn(*operands(ctx, ufunc)))


for _op_type, (_ufunc, _fn) in {"less_than": (np.less, torch.lt),
                                "logical_and": (np.logical_and, torch.logical_and),
                                "logical_or": (np.logical_or, torch.logical_or),
                                "logical_xor": (np.logical_xor, torch.logical_xor)}.items():
    _register_predicate(_op_type, _ufunc, _fn)


@kernel("logical_not")
def logical_not(ctx: KernelContext) -> None:
    put(ctx, "Out", torch.logical_not(input_t(ctx, "X")))
