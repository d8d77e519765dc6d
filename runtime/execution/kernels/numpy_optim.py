"""Optimizer update ops with Paddle's slots; the update rules are docs/transpiler.md §2.

`LearningRate` (and Adam's / Adamax's `Beta1Pow`, `Beta2Pow`) are [1] arrays. A `Grad` may be a
`SelectedRows`: `sgd` scatter-subtracts its rows (repeated rows accumulate); every other
optimizer densifies the merged rows first, which makes sparse training equal dense training
(Paddle's non-lazy mode). Outputs keep the parameter's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.execution.kernels.common import dense_like, scalar
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.tensor import SelectedRows

Array = np.ndarray


def _param_grad_lr(ctx: KernelContext) -> tuple[Array, Array, Any]:
    p = ctx.input("Param")
    g = dense_like(ctx.input("Grad"), p.shape[0], "Grad")
    return p, g, scalar(ctx.input("LearningRate"))


def _store(ctx: KernelContext, slot: str, value: Array, like: Array) -> None:
    ctx.set_output(slot, np.asarray(value).astype(like.dtype, copy=False))


def _f(ctx: KernelContext, name: str, default: float) -> float:
    return float(ctx.attr(name, default))


@register("sgd")
def sgd(ctx: KernelContext) -> None:
    p, g = ctx.input("Param"), ctx.input("Grad")
    lr = scalar(ctx.input("LearningRate"))
    if isinstance(g, SelectedRows):
        if g.height != p.shape[0]:
            raise ValueError(f"Grad: SelectedRows height {g.height} != {p.shape[0]} rows of Param")
        out = p.copy()
        np.subtract.at(out, g.rows, (lr * g.values).astype(p.dtype, copy=False))
        ctx.set_output("ParamOut", out)
    else:
        _store(ctx, "ParamOut", p - lr * g, p)


@register("momentum")
def momentum(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    mu = _f(ctx, "mu", 0.9)
    v = mu * ctx.input("Velocity") + g
    step = g + mu * v if ctx.attr("use_nesterov", False) else v
    _store(ctx, "ParamOut", p - lr * step, p)
    _store(ctx, "VelocityOut", v, p)


@register("adam")
def adam(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    b1, b2, eps = _f(ctx, "beta1", 0.9), _f(ctx, "beta2", 0.999), _f(ctx, "epsilon", 1e-8)
    b1p, b2p = scalar(ctx.input("Beta1Pow")), scalar(ctx.input("Beta2Pow"))
    m1 = b1 * ctx.input("Moment1") + (1 - b1) * g
    m2 = b2 * ctx.input("Moment2") + (1 - b2) * g * g
    correction = np.sqrt(1 - b2p)
    lr_t = lr * correction / (1 - b1p)
    _store(ctx, "ParamOut", p - lr_t * m1 / (np.sqrt(m2) + eps * correction), p)
    _store(ctx, "Moment1Out", m1, p)
    _store(ctx, "Moment2Out", m2, p)


@register("adagrad")
def adagrad(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    m = ctx.input("Moment") + g * g
    _store(ctx, "ParamOut", p - lr * g / (np.sqrt(m) + _f(ctx, "epsilon", 1e-6)), p)
    _store(ctx, "MomentOut", m, p)


@register("decayed_adagrad")
def decayed_adagrad(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    decay = _f(ctx, "decay", 0.95)
    m = decay * ctx.input("Moment") + (1 - decay) * g * g
    _store(ctx, "ParamOut", p - lr * g / (np.sqrt(m) + _f(ctx, "epsilon", 1e-6)), p)
    _store(ctx, "MomentOut", m, p)


@register("adamax")
def adamax(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    b1, b2, eps = _f(ctx, "beta1", 0.9), _f(ctx, "beta2", 0.999), _f(ctx, "epsilon", 1e-8)
    m = b1 * ctx.input("Moment") + (1 - b1) * g
    u = np.maximum(b2 * ctx.input("InfNorm") + eps, np.abs(g))
    _store(ctx, "ParamOut", p - lr / (1 - scalar(ctx.input("Beta1Pow"))) * m / u, p)
    _store(ctx, "MomentOut", m, p)
    _store(ctx, "InfNormOut", u, p)


@register("rmsprop")
def rmsprop(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    rho, eps, mu = _f(ctx, "decay", 0.95), _f(ctx, "epsilon", 1e-6), _f(ctx, "momentum", 0.0)
    ms = rho * ctx.input("MeanSquare") + (1 - rho) * g * g
    if ctx.attr("centered", False):
        mg = rho * ctx.input("MeanGrad") + (1 - rho) * g
        denom = np.sqrt(ms - mg * mg + eps)
        _store(ctx, "MeanGradOut", mg, p)
    else:
        denom = np.sqrt(ms + eps)
    mom = mu * ctx.input("Moment") + lr * g / denom
    _store(ctx, "ParamOut", p - mom, p)
    _store(ctx, "MomentOut", mom, p)
    _store(ctx, "MeanSquareOut", ms, p)


@register("ftrl")
def ftrl(ctx: KernelContext) -> None:
    p, g, lr = _param_grad_lr(ctx)
    l1, l2, power = _f(ctx, "l1", 0.0), _f(ctx, "l2", 0.0), _f(ctx, "lr_power", -0.5)
    n = ctx.input("SquaredAccumulator")
    n_new = n + g * g
    if power == -0.5:
        root_new, root_old = np.sqrt(n_new), np.sqrt(n)
    else:
        root_new, root_old = n_new ** -power, n ** -power
    z = ctx.input("LinearAccumulator") + g - (root_new - root_old) / lr * p
    shrunk = (l1 * np.sign(z) - z) / (root_new / lr + 2 * l2)
    _store(ctx, "ParamOut", np.where(np.abs(z) > l1, shrunk, 0), p)
    _store(ctx, "SquaredAccumOut", n_new, p)
    _store(ctx, "LinearAccumOut", z, p)
