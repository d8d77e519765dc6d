"""Paddle 2.x's ``paddle.nn`` names a static-graph script takes (``import runtime.paddle as
paddle``): ``paddle.nn.functional`` (``square_error_cost``, ``cross_entropy``,
``binary_cross_entropy_with_logits``, ``relu``, ``sigmoid``, ``softmax``), the gradient clips
``ClipGradByValue``, ``ClipGradByNorm``, ``ClipGradByGlobalNorm`` (fluid's
``GradientClipBy*``, with 2.x's ``need_clip`` filter), ``paddle.nn.initializer``
(``Constant``, ``Uniform``, ``Normal`` with 2.x's ``mean``/``std``, ``XavierUniform``) and the
loss layer ``HSigmoidLoss``. Each writes the ops of its fluid equivalent (`transpiler.layers`).

Layers: a facade on top of `transpiler`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from transpiler import initializer as _init
from transpiler import layers
from transpiler.clip import (GradientClipByGlobalNorm, GradientClipByNorm, GradientClipByValue,
                             NeedClip)
from transpiler.framework import ParamAttr
from transpiler.ir import Var

__all__ = ["ClipGradByGlobalNorm", "ClipGradByNorm", "ClipGradByValue", "HSigmoidLoss",
           "functional", "initializer"]

REDUCTIONS = ("none", "mean", "sum")


def _reduce(loss: Var, reduction: str, layer: str) -> Var:
    """2.x's `reduction` of a per-element loss: as is, `mean` or `reduce_sum` of all."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"{layer}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if reduction == "mean":
        return layers.mean(loss)
    return layers.reduce_sum(loss) if reduction == "sum" else loss


def square_error_cost(input: Var, label: Var) -> Var:
    """(input - label)^2 per element: `elementwise_sub` and `square`."""
    return layers.square_error_cost(input, label)


def cross_entropy(input: Var, label: Var, weight: Var | None = None, ignore_index: int = -100,
                  reduction: str = "mean", soft_label: bool = False, axis: int = -1,
                  use_softmax: bool = True, name: str | None = None) -> Var:
    """Cross entropy of `input` against `label`, then `reduction`: with `use_softmax`,
    `softmax_with_cross_entropy` of logits; without, `cross_entropy` of probabilities.
    `weight` and an `axis` other than the last are not supported."""
    if weight is not None:
        raise NotImplementedError("cross_entropy: weight is not supported")
    if axis not in (-1, len(input.shape) - 1):
        raise NotImplementedError(f"cross_entropy: only the last axis is supported, got {axis}")
    if use_softmax:
        loss = layers.softmax_with_cross_entropy(input, label, soft_label, ignore_index)
    else:
        loss = layers.cross_entropy(input, label, soft_label, ignore_index)
    return _reduce(loss, reduction, "cross_entropy")


def binary_cross_entropy_with_logits(logit: Var, label: Var, weight: Var | None = None,
                                     reduction: str = "mean", pos_weight: Var | None = None,
                                     name: str | None = None) -> Var:
    """The logistic loss of `logit` against `label` (`sigmoid_cross_entropy_with_logits`),
    then `reduction`. `weight` and `pos_weight` are not supported."""
    if weight is not None or pos_weight is not None:
        raise NotImplementedError("binary_cross_entropy_with_logits: weight and pos_weight "
                                  "are not supported")
    loss = layers.sigmoid_cross_entropy_with_logits(logit, label)
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def softmax(x: Var, axis: int = -1, name: str | None = None) -> Var:
    """`softmax` over `axis`."""
    return layers.softmax(x, axis)


functional = SimpleNamespace(
    square_error_cost=square_error_cost, cross_entropy=cross_entropy,
    binary_cross_entropy_with_logits=binary_cross_entropy_with_logits, softmax=softmax,
    relu=layers.relu, sigmoid=layers.sigmoid, tanh=layers.tanh)
"""``paddle.nn.functional``."""


def ClipGradByValue(max: float, min: float | None = None,
                    need_clip: NeedClip | None = None) -> GradientClipByValue:
    """2.x's name of fluid's ``GradientClipByValue``: each gradient clipped to [min, max]
    (min -max when None), only those of parameters `need_clip` accepts."""
    return GradientClipByValue(max, min, need_clip)


def ClipGradByNorm(clip_norm: float, need_clip: NeedClip | None = None) -> GradientClipByNorm:
    """2.x's name of fluid's ``GradientClipByNorm``."""
    return GradientClipByNorm(clip_norm, need_clip)


def ClipGradByGlobalNorm(clip_norm: float, group_name: str = "default_group",
                         need_clip: NeedClip | None = None) -> GradientClipByGlobalNorm:
    """2.x's name of fluid's ``GradientClipByGlobalNorm``."""
    return GradientClipByGlobalNorm(clip_norm, group_name, need_clip)


def Normal(mean: float = 0.0, std: float = 1.0, name: str | None = None) -> _init.Normal:
    """2.x's ``initializer.Normal(mean, std)``: a `gaussian_random` op."""
    return _init.Normal(loc=mean, scale=std)


def Uniform(low: float = -1.0, high: float = 1.0, name: str | None = None) -> _init.Uniform:
    """2.x's ``initializer.Uniform(low, high)``: a `uniform_random` op."""
    return _init.Uniform(low, high)


def Constant(value: float = 0.0) -> _init.Constant:
    """2.x's ``initializer.Constant(value)``: a `fill_constant` op."""
    return _init.Constant(value)


initializer = SimpleNamespace(Constant=Constant, Uniform=Uniform, Normal=Normal,
                              XavierUniform=_init.Xavier)
"""``paddle.nn.initializer``."""


class HSigmoidLoss:
    """2.x's ``paddle.nn.HSigmoidLoss`` in a static program: called on (input, label[,
    path_table, path_code]) it appends fluid's ``layers.hsigmoid`` (one
    `hierarchical_sigmoid` op) with this layer's settings."""

    def __init__(self, feature_size: int, num_classes: int, weight_attr: Any = None,
                 bias_attr: ParamAttr | str | bool | None = None, is_custom: bool = False,
                 is_sparse: bool = False, name: str | None = None) -> None:
        self.feature_size, self.num_classes = int(feature_size), int(num_classes)
        self.weight_attr, self.bias_attr, self.name = weight_attr, bias_attr, name
        self.is_custom, self.is_sparse = bool(is_custom), bool(is_sparse)

    def __call__(self, input: Var, label: Var, path_table: Var | None = None,
                 path_code: Var | None = None) -> Var:
        if int(input.shape[-1]) != self.feature_size:
            raise ValueError(f"HSigmoidLoss: input {input.name!r} has {input.shape[-1]} "
                             f"features, the layer {self.feature_size}")
        return layers.hsigmoid(input, label, self.num_classes, self.weight_attr,
                               self.bias_attr, self.name, path_table, path_code,
                               self.is_custom, self.is_sparse)
