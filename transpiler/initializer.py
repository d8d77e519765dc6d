"""Parameter initializers: each prepends one op to the startup block that fills the var.

constant -> `fill_constant`, uniform -> `uniform_random`, normal -> `gaussian_random`,
truncated normal -> `truncated_gaussian_random`; Xavier picks uniform or normal with the
fan-in/fan-out scale of Glorot & Bengio; given values -> `assign_value` (`Assign`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .ir import Block, Var


class Initializer:
    def __call__(self, var: Var, block: Block) -> None:
        raise NotImplementedError

    @staticmethod
    def _prepend(block: Block, type: str, var: Var, **attrs: object) -> None:
        attrs = {"shape": list(var.shape), "dtype": var.dtype, **attrs}
        block.prepend_op(type, outputs={"Out": [var.name]}, attrs=attrs)


@dataclass
class Constant(Initializer):
    value: float = 0.0

    def __call__(self, var: Var, block: Block) -> None:
        self._prepend(block, "fill_constant", var, value=float(self.value))


@dataclass
class Uniform(Initializer):
    low: float = -1.0
    high: float = 1.0
    seed: int = 0

    def __call__(self, var: Var, block: Block) -> None:
        self._prepend(block, "uniform_random", var, min=float(self.low), max=float(self.high),
                      seed=self.seed)


@dataclass
class Normal(Initializer):
    loc: float = 0.0
    scale: float = 1.0
    seed: int = 0

    def __call__(self, var: Var, block: Block) -> None:
        self._prepend(block, "gaussian_random", var, mean=float(self.loc), std=float(self.scale),
                      seed=self.seed)


@dataclass
class TruncatedNormal(Initializer):
    """Normal, redrawn outside two standard deviations."""

    loc: float = 0.0
    scale: float = 1.0
    seed: int = 0

    def __call__(self, var: Var, block: Block) -> None:
        self._prepend(block, "truncated_gaussian_random", var, mean=float(self.loc),
                      std=float(self.scale), seed=self.seed)


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[0] * receptive, shape[1] * receptive


@dataclass
class Xavier(Initializer):
    uniform: bool = True
    fan_in: int | None = None
    fan_out: int | None = None
    seed: int = 0

    def __call__(self, var: Var, block: Block) -> None:
        fin, fout = _fans(var.shape)
        fin = self.fan_in if self.fan_in is not None else fin
        fout = self.fan_out if self.fan_out is not None else fout
        if self.uniform:
            limit = math.sqrt(6.0 / (fin + fout))
            Uniform(-limit, limit, self.seed)(var, block)
        else:
            Normal(0.0, math.sqrt(2.0 / (fin + fout)), self.seed)(var, block)


VALUE_ATTRS = {"float32": "fp32_values", "float64": "fp64_values", "int32": "int32_values",
               "int64": "int64_values"}
"""`assign_value`'s attribute holding the values, by the var's dtype (Paddle's names)."""


@dataclass
class Assign(Initializer):
    """The var starts from `values`, its elements in row-major order (Paddle's `assign_value`:
    the values travel in the op's attribute, so the program alone says where training starts).

    DESIGN: a list of Python numbers, not an array, keeps the transpiler free of numpy; the
    program grows by one number per element, which suits models of up to some millions of
    parameters."""

    values: Sequence[float]

    def __call__(self, var: Var, block: Block) -> None:
        if var.dtype not in VALUE_ATTRS:
            raise TypeError(f"Assign: var {var.name!r} has dtype {var.dtype}; one of "
                            f"{sorted(VALUE_ATTRS)} can be assigned")
        if len(self.values) != math.prod(var.shape) or -1 in var.shape:
            raise ValueError(f"Assign: var {var.name!r} of shape {list(var.shape)} cannot take "
                             f"{len(self.values)} values")
        self._prepend(block, "assign_value", var, **{VALUE_ATTRS[var.dtype]: list(self.values)})


ConstantInitializer = Constant
UniformInitializer = Uniform
NormalInitializer = Normal
TruncatedNormalInitializer = TruncatedNormal
XavierInitializer = Xavier
