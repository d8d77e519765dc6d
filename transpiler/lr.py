"""Learning-rate schedules as ops (role LRSched) that compute a [1] float32 var per step.

Every schedule reads the global step counter ``@LR_DECAY_COUNTER@``: a persistable int64 that
starts at -1 and is raised by an `increment` put first in the main program, so the first step
sees 0 (noam counts from 1). The returned var is passed to an optimizer as `learning_rate`; the
distribute transpiler moves these ops into the pserver's LR block.
"""

from __future__ import annotations

import math
from typing import Sequence

from . import layers
from .framework import op_role_guard
from .ir import OpRole, Var

LR_COUNTER = "@LR_DECAY_COUNTER@"


def _step(begin: int = 0) -> Var:
    counter = layers.autoincreased_step_counter(LR_COUNTER, begin=begin, step=1)
    return layers.cast(counter, "float32")


def _const(value: float) -> Var:
    return layers.fill_constant([1], "float32", float(value))


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def _ratio(step: Var, decay_steps: float, staircase: bool) -> Var:
    div = layers.elementwise_div(step, _const(decay_steps))
    return layers.floor(div) if staircase else div


def exponential_decay(learning_rate: float, decay_steps: int, decay_rate: float,
                      staircase: bool = False) -> Var:
    """lr * decay_rate ^ (step / decay_steps), the exponent floored when `staircase`."""
    _positive("exponential_decay: decay_steps", decay_steps)
    with op_role_guard(OpRole.LRSched):
        div = _ratio(_step(), decay_steps, staircase)
        decayed = layers.elementwise_pow(_const(decay_rate), div)
        return layers.elementwise_mul(decayed, _const(learning_rate))


def natural_exp_decay(learning_rate: float, decay_steps: int, decay_rate: float,
                      staircase: bool = False) -> Var:
    """lr * exp(-decay_rate * step / decay_steps)."""
    _positive("natural_exp_decay: decay_steps", decay_steps)
    with op_role_guard(OpRole.LRSched):
        div = _ratio(_step(), decay_steps, staircase)
        decayed = layers.exp(layers.scale(div, -float(decay_rate)))
        return layers.elementwise_mul(decayed, _const(learning_rate))


def inverse_time_decay(learning_rate: float, decay_steps: int, decay_rate: float,
                       staircase: bool = False) -> Var:
    """lr / (1 + decay_rate * step / decay_steps)."""
    _positive("inverse_time_decay: decay_steps", decay_steps)
    with op_role_guard(OpRole.LRSched):
        div = _ratio(_step(), decay_steps, staircase)
        denom = layers.scale(div, float(decay_rate), bias=1.0)
        return layers.elementwise_div(_const(learning_rate), denom)


def polynomial_decay(learning_rate: float, decay_steps: int, end_learning_rate: float = 0.0001,
                     power: float = 1.0, cycle: bool = False) -> Var:
    """(lr - end) * (1 - step / decay_steps) ^ power + end; with `cycle` the horizon grows to
    the next multiple of decay_steps instead of the step being capped."""
    _positive("polynomial_decay: decay_steps", decay_steps)
    with op_role_guard(OpRole.LRSched):
        step = _step()
        if cycle:
            periods = layers.elementwise_max(layers.ceil(layers.elementwise_div(step, _const(decay_steps))),
                                             _const(1.0))
            horizon = layers.scale(periods, float(decay_steps))
        else:
            horizon = _const(decay_steps)
            step = layers.elementwise_min(step, horizon)
        remaining = layers.scale(layers.elementwise_div(step, horizon), -1.0, bias=1.0)
        decayed = layers.elementwise_pow(remaining, _const(power))
        return layers.scale(decayed, float(learning_rate - end_learning_rate),
                            bias=float(end_learning_rate))


def piecewise_decay(boundaries: Sequence[float], values: Sequence[float]) -> Var:
    """values[i] for the first boundary with step < boundaries[i], else the last value: a
    `Switch` of `conditional_block`s, each assigning one value (Paddle's op sequence)."""
    if len(values) != len(boundaries) + 1:
        raise ValueError(f"piecewise_decay: values needs len(boundaries) + 1 = {len(boundaries) + 1} "
                         f"entries, got {len(values)}")
    if list(boundaries) != sorted(boundaries):
        raise ValueError(f"piecewise_decay: boundaries must be increasing, got {list(boundaries)}")
    with op_role_guard(OpRole.LRSched):
        step = _step()
        lr = layers.create_global_var([1], 0.0, "float32", persistable=True, name="learning_rate")
        with layers.Switch() as switch:
            for boundary, value in zip(boundaries, values):
                bound = _const(boundary)
                val = _const(value)
                with switch.case(layers.less_than(step, bound)):
                    layers.assign(val, lr)
            last = _const(values[-1])
            with switch.default():
                layers.assign(last, lr)
        return lr


def noam_decay(d_model: int, warmup_steps: int, learning_rate: float = 1.0) -> Var:
    """lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    _positive("noam_decay: warmup_steps", warmup_steps)
    with op_role_guard(OpRole.LRSched):
        step = _step(begin=1)
        a = layers.elementwise_pow(step, _const(-0.5))
        b = layers.scale(step, float(warmup_steps) ** -1.5)
        return layers.scale(layers.elementwise_min(a, b), float(learning_rate) * d_model ** -0.5)


def cosine_decay(learning_rate: float, step_each_epoch: int, epochs: int) -> Var:
    """lr * 0.5 * (cos(epoch * pi / epochs) + 1) with epoch = floor(step / step_each_epoch)."""
    _positive("cosine_decay: step_each_epoch", step_each_epoch)
    _positive("cosine_decay: epochs", epochs)
    with op_role_guard(OpRole.LRSched):
        epoch = _ratio(_step(), step_each_epoch, staircase=True)
        cos = layers.cos(layers.scale(epoch, math.pi / epochs))
        return layers.scale(cos, 0.5 * learning_rate, bias=0.5 * learning_rate)


__all__ = ["LR_COUNTER", "cosine_decay", "exponential_decay", "inverse_time_decay",
           "natural_exp_decay", "noam_decay", "piecewise_decay", "polynomial_decay"]
