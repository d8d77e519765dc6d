"""Torch kernels of the elementwise binary ops, comparisons and logical ops.

Operands are aligned with the numpy backend's `align` (Paddle's `axis` rule) and cast to the
input types of the numpy ufunc's loop for their dtypes, so results have numpy's dtype (an int
division gives float64, float32 against float64 computes in float64). Gradients are summed over
the broadcast dims and cast to the operand's dtype, as in `numpy_elementwise`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_elementwise import align
from runtime.execution.kernels.torch_common import (Tensor, input_t, kernel, np_dtype, optional_t,
                                                    out_grad_t, put, reshaped, tensor, torch)

BinaryFn = Callable[[Tensor, Tensor], Tensor]
GradFn = Callable[[Tensor, Tensor, Tensor, Any], Tensor]  # (dout, x, y, out or None) -> d operand


class Layout(NamedTuple):
    """How X and Y of a binary op are computed (`_layout`)."""

    x_shape: tuple[int, ...]
    """The shape X is computed in (`_as_given`); likewise `y_shape`."""
    y_shape: tuple[int, ...]
    x_aligned: tuple[int, ...]
    """X's shape aligned to Y's by Paddle's `axis` rule: what its gradient sums back into."""
    y_aligned: tuple[int, ...]
    x_dtype: Any
    """The dtype X is computed in (numpy's loop for the ufunc), None where its own serves."""
    y_dtype: Any


@functools.lru_cache(maxsize=4096)
def _layout(ufunc: np.ufunc, x_shape: tuple[int, ...], y_shape: tuple[int, ...], axis: int,
            x_dtype: Any, y_dtype: Any) -> Layout:
    """The shapes X and Y are computed in (`_as_given`), X's and Y's aligned shapes, and the
    dtypes (numpy's or torch's) they are computed in: the input dtypes of the numpy loop `ufunc`
    runs for them, None where an operand's own serves.

    DESIGN: cached per shapes, axis and dtypes, since a program's ops see the same ones step
    after step; the alignment and dtype resolution are then one look-up, not Python work on
    every call. Bounded, as sequence batches bring new shapes."""
    xs, ys = align(x_shape, y_shape, axis)
    in_x, in_y, _ = ufunc.resolve_dtypes((np_dtype(x_dtype), np_dtype(y_dtype), None))
    return Layout(_as_given(tuple(x_shape), xs), _as_given(tuple(y_shape), ys), xs, ys,
                  None if in_x == np_dtype(x_dtype) else in_x,
                  None if in_y == np_dtype(y_dtype) else in_y)


def _as_given(shape: tuple[int, ...], aligned: tuple[int, ...]) -> tuple[int, ...]:
    """The shape an operand is computed in: its own where its aligned shape only puts 1s before
    it (a bias [D] against [N, D]), since torch broadcasts it so (the same elements meet, no
    reshape needed); else the aligned shape. (`align` keeps the higher-ranked operand as it
    is, so the result's shape stays the aligned one.)"""
    lead = len(aligned) - len(shape)
    return shape if aligned[lead:] == shape and all(d == 1 for d in aligned[:lead]) else aligned


def _operands(ctx: KernelContext, ufunc: np.ufunc, x: Any, y: Any) -> tuple[Tensor, Tensor, Layout]:
    layout = _layout(ufunc, x.shape, y.shape, int(ctx.attr("axis", -1)), x.dtype, y.dtype)
    return (reshaped(tensor(x, layout.x_dtype), layout.x_shape),
            reshaped(tensor(y, layout.y_dtype), layout.y_shape), layout)


def operands(ctx: KernelContext, ufunc: np.ufunc) -> tuple[Tensor, Tensor]:
    """X and Y as tensors that broadcast as Paddle's `axis` rule aligns them (`_as_given`), in
    the dtypes numpy's `ufunc` would compute in."""
    x, y, _ = _operands(ctx, ufunc, ctx.input("X"), ctx.input("Y"))
    return x, y


@functools.lru_cache(maxsize=4096)
def _summed_dims(grad: tuple[int, ...], aligned: tuple[int, ...]) -> tuple[int, ...]:
    """The dims of a gradient shaped `grad` that sum into an operand aligned as `aligned`."""
    return tuple(i for i, (g, a) in enumerate(zip(grad, aligned)) if a == 1 and g != 1)


def unbroadcast(grad: Tensor, aligned: tuple[int, ...], shape: tuple[int, ...]) -> Tensor:
    """Sum `grad` over the dims where `aligned` is 1 and reshape to the operand's `shape`
    (the summed dims dropped rather than kept: the same sums, one reshape fewer where they
    lead, as a bias's do)."""
    dims = _summed_dims(tuple(grad.shape), aligned)
    if dims:
        grad = grad.sum(dim=dims)
    return reshaped(grad, shape)


def _register_binary(op_type: str, ufunc: np.ufunc, fn: BinaryFn, dx: GradFn, dy: GradFn) -> None:
    reads_out = op_type in READS_OUT

    @kernel(op_type)
    def forward(ctx: KernelContext) -> None:
        put(ctx, "Out", fn(*operands(ctx, ufunc)), lod=ctx.lod("X"))

    @kernel(op_type + "_grad")
    def backward(ctx: KernelContext) -> None:
        x0, y0 = ctx.input("X"), ctx.input("Y")
        x, y, layout = _operands(ctx, ufunc, x0, y0)
        out = optional_t(ctx, "Out") if reads_out else None
        g = out_grad_t(ctx)
        if ctx.has_output("X@GRAD"):
            put(ctx, "X@GRAD", unbroadcast(dx(g, x, y, out), layout.x_aligned, x0.shape), dtype=x0.dtype)
        if ctx.has_output("Y@GRAD"):
            put(ctx, "Y@GRAD", unbroadcast(dy(g, x, y, out), layout.y_aligned, y0.shape), dtype=y0.dtype)


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

READS_OUT = frozenset({"elementwise_div", "elementwise_pow"})
"""The binary ops whose gradients read Out (the others' are given None for it)."""

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
