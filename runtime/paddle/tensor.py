"""Paddle 2.x's tensor functions at the top of ``paddle`` (``paddle.mean``, ``paddle.reshape``,
``paddle.add``, ``paddle.multiply``, ``paddle.sum``, ``paddle.matmul``, ``paddle.concat``,
``paddle.full``, ``paddle.seed``) for a static-graph script ported with ``import
runtime.paddle as paddle``: each appends to the current block the ops fluid's layer of the
same meaning writes (`transpiler.layers`), so a 2.x program reads op for op like its fluid
twin: ``paddle.mean(x)`` is one `mean` op, ``paddle.add`` an `elementwise_add`,
``paddle.sum`` a `reduce_sum`, ``paddle.reshape`` a `reshape2`, ``paddle.full`` a
`fill_constant`.

Layers: a facade on top of `transpiler` (`runtime.paddle`).
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

from transpiler import layers
from transpiler.framework import default_main_program, default_startup_program
from transpiler.ir import Var

__all__ = ["add", "concat", "divide", "full", "matmul", "mean", "multiply", "reshape", "seed",
           "subtract", "sum"]


def _axes(axis: int | Sequence[int] | None) -> int | list[int] | None:
    if axis is None or isinstance(axis, int):
        return axis
    return [int(a) for a in axis]


def mean(x: Var, axis: int | Sequence[int] | None = None, keepdim: bool = False,
         name: str | None = None) -> Var:
    """The mean of `x`: over every element (one `mean` op, a [1] var, as fluid's
    ``layers.mean``) when `axis` is None, else over `axis` (`reduce_mean`)."""
    if axis is None and not keepdim:
        return layers.mean(x)
    return layers.reduce_mean(x, _axes(axis), keepdim, name)


def sum(x: Var, axis: int | Sequence[int] | None = None, dtype: str | None = None,
        keepdim: bool = False, name: str | None = None) -> Var:
    """The sum of `x` over `axis` (every axis when None): a `reduce_sum`, then a `cast` when
    `dtype` differs from x's."""
    out = layers.reduce_sum(x, _axes(axis), keepdim, name)
    return layers.cast(out, dtype) if dtype is not None and dtype != out.dtype else out


def reshape(x: Var, shape: Sequence[int], name: str | None = None) -> Var:
    """`reshape2` of `x` to `shape` (0 keeps that dim of x, one -1 is inferred)."""
    return layers.reshape(x, shape, name=name)


def add(x: Var, y: Var, name: str | None = None) -> Var:
    """x + y, broadcast from the trailing dims: `elementwise_add` (axis -1)."""
    return layers.elementwise_add(x, y, name=name)


def subtract(x: Var, y: Var, name: str | None = None) -> Var:
    """x - y: `elementwise_sub` (axis -1)."""
    return layers.elementwise_sub(x, y, name=name)


def multiply(x: Var, y: Var, name: str | None = None) -> Var:
    """x * y elementwise: `elementwise_mul` (axis -1)."""
    return layers.elementwise_mul(x, y, name=name)


def divide(x: Var, y: Var, name: str | None = None) -> Var:
    """x / y elementwise: `elementwise_div` (axis -1)."""
    return layers.elementwise_div(x, y, name=name)


def matmul(x: Var, y: Var, transpose_x: bool = False, transpose_y: bool = False,
           name: str | None = None) -> Var:
    """The (batched) matrix product of `x` and `y`, each transposed on request: `matmul`."""
    return layers.matmul(x, y, transpose_x, transpose_y, name=name)


def concat(x: Sequence[Var], axis: int = 0, name: str | None = None) -> Var:
    """`x` joined along `axis`: one `concat` op."""
    return layers.concat(x, axis)


def full(shape: Sequence[int], fill_value: float, dtype: str = "float32",
         name: str | None = None) -> Var:
    """A var of `shape` holding `fill_value`: one `fill_constant` op."""
    return layers.fill_constant([int(d) for d in shape], dtype, fill_value)


def seed(value: int) -> int:
    """Paddle's ``paddle.seed``: the random seed of the current main and startup programs
    (`Program.random_seed`, which random ops without a seed of their own draw from), and of
    Python's and numpy's generators. Returns `value`."""
    value = int(value)
    default_main_program().random_seed = value
    default_startup_program().random_seed = value
    random.seed(value)
    np.random.seed(value % 2 ** 32)
    return value
