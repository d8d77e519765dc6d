"""Optimizer update ops with Paddle's slots; the update rules are docs/transpiler.md §2.

`LearningRate` (and Adam's / Adamax's `Beta1Pow`, `Beta2Pow`) are [1] arrays. Outputs keep the
parameter's dtype. Each optimizer is one update rule (`Rule`) over the param, its grad and its
accumulators, applied to whole arrays or to the rows a sparse grad touches.

A `Grad` may be a `SelectedRows`. `sgd` scatter-subtracts its rows (repeated rows accumulate)
and `adagrad` updates the merged rows only: for both, a row without gradient is left as it is
by the dense rule too, so this equals dense training exactly. Every other optimizer moves
untouched rows as well (momentum and moments decay), so by default it densifies the merged
rows (Paddle's non-lazy mode, equal to dense training); with the op attribute `lazy_mode`
(Adam's, in Paddle) it applies its rule to the merged rows only and leaves the others alone.

DESIGN: a sparse update costs O(rows touched), not O(table): the rows are gathered, updated and
written back into the param's (and accumulators') own array, which is then the output. That
breaks the scope's rule that stored arrays are never written, so it is done only where nobody
else can see the write: the output is the input var itself, and the array owns its memory, is
writable and is referenced by nothing but the scope (CPython's reference count, against a
baseline measured the same way at import). An array that is shared (a frame being sent, a
view a receiver decoded, a kept backup) or borrowed (decoded from a message) is copied once
first, as before, and the copy is then the scope's own.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from runtime.execution.kernels.common import check_height, dense_like, scalar
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.tensor import SelectedRows

Array = np.ndarray
Rule = Callable[[KernelContext, Array, Array, Any, dict[str, Array]], dict[str, Array]]
"""(ctx, param, grad, learning rate, accumulators by input slot) -> arrays by output slot."""


def _f(ctx: KernelContext, name: str, default: float) -> float:
    return float(ctx.attr(name, default))


def _refs(array: Array) -> int:
    return sys.getrefcount(array)


def _baseline_refs() -> int:
    """References to an array held by a scope only, counted as `_exclusive` counts them."""
    scope = {"var": np.zeros(1)}
    array = scope["var"]
    return _refs(array)


_SCOPE_ONLY = _baseline_refs()


def _exclusive(ctx: KernelContext, slot: str) -> bool:
    """Whether input `slot`'s array may be written in place: nothing but the scope holds it,
    and it owns writable memory."""
    array = ctx.input(slot)
    return bool(isinstance(array, np.ndarray) and array.flags.owndata
                and array.flags.writeable and _refs(array) <= _SCOPE_ONLY)


def _target(ctx: KernelContext, in_slot: str, out_slot: str) -> Array:
    """The array that output `out_slot` becomes, with rows to be written into it: input
    `in_slot`'s own array when the output is the same var and `_exclusive`, else a copy."""
    same = ctx.input_names(in_slot)[:1] == ctx.op.outputs.get(out_slot, [])[:1]
    if same and _exclusive(ctx, in_slot):
        return ctx.input(in_slot)  # type: ignore[no-any-return]
    return np.array(ctx.input(in_slot), copy=True)


def _store(ctx: KernelContext, slot: str, value: Array, like: Array) -> None:
    ctx.set_output(slot, np.asarray(value).astype(like.dtype, copy=False))


def _apply(ctx: KernelContext, rule: Rule, states: dict[str, str], exact_sparse: bool = False) -> None:
    """Run `rule` (`states`: accumulator input slot -> its output slot) on the whole arrays,
    or, for a sparse grad when that is exact or `lazy_mode` asks for it, on the touched rows."""
    p, g = ctx.input("Param"), ctx.input("Grad")
    lr = scalar(ctx.input("LearningRate"))
    present = {s: o for s, o in states.items() if ctx.has_input(s)}
    if isinstance(g, SelectedRows) and (exact_sparse or ctx.attr("lazy_mode", False)):
        check_height(g, p.shape[0], "Grad", "Param")
        merged, dtype = g.merged(), p.dtype
        rows = merged.rows
        new = rule(ctx, p[rows], merged.values, lr, {s: ctx.input(s)[rows] for s in present})
        del p, g
        slots = {"ParamOut": "Param", **{o: s for s, o in present.items()}}
        for out_slot, values in new.items():
            target = _target(ctx, slots[out_slot], out_slot)
            target[rows] = np.asarray(values).astype(dtype, copy=False)
            ctx.set_output(out_slot, target)
        return
    g = dense_like(g, p.shape[0], "Grad")
    for out_slot, values in rule(ctx, p, g, lr, {s: ctx.input(s) for s in present}).items():
        _store(ctx, out_slot, values, p)


ROW_LOCAL = frozenset({"sgd", "adagrad"})
"""Optimizers whose update with a sparse grad writes the grad's rows only, `lazy_mode` or not
(others do so only under `lazy_mode`). `runtime.execution.table.rows_written` relies on it."""


@register("sgd")
def sgd(ctx: KernelContext) -> None:
    p, g = ctx.input("Param"), ctx.input("Grad")
    lr = scalar(ctx.input("LearningRate"))
    if isinstance(g, SelectedRows):
        check_height(g, p.shape[0], "Grad", "Param")
        del p
        out = _target(ctx, "Param", "ParamOut")
        np.subtract.at(out, g.rows, (lr * g.values).astype(out.dtype, copy=False))
        ctx.set_output("ParamOut", out)
    else:
        _store(ctx, "ParamOut", p - lr * g, p)


def _momentum(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    mu = _f(ctx, "mu", 0.9)
    v = mu * acc["Velocity"] + g
    step = g + mu * v if ctx.attr("use_nesterov", False) else v
    return {"ParamOut": p - lr * step, "VelocityOut": v}


@register("momentum")
def momentum(ctx: KernelContext) -> None:
    _apply(ctx, _momentum, {"Velocity": "VelocityOut"})


def lars_local_lr(lr: float, p_norm: float, g_norm: float, coeff: float, decay: float) -> float:
    """LARS's layer-wise rate ``lr * coeff * |p| / (|g| + decay * |p|)``; `lr` itself when
    either norm is 0 (a zero parameter or gradient), as Paddle's kernel guards it."""
    if p_norm > 0 and g_norm > 0:
        return lr * coeff * p_norm / (g_norm + decay * p_norm)
    return lr


def _lars_momentum(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    mu, coeff = _f(ctx, "mu", 0.9), _f(ctx, "lars_coeff", 0.001)
    decay = _f(ctx, "lars_weight_decay", 0.0005)
    p_norm, g_norm = float(np.sqrt(np.sum(np.square(p)))), float(np.sqrt(np.sum(np.square(g))))
    local_lr = lars_local_lr(float(lr), p_norm, g_norm, coeff, decay)
    v = mu * acc["Velocity"] + local_lr * (g + decay * p)
    return {"ParamOut": p - v, "VelocityOut": v}


@register("lars_momentum")
def lars_momentum(ctx: KernelContext) -> None:
    """Layer-wise adaptive rate scaling (You et al., 2017) on momentum: the norms are over the
    whole parameter and gradient (a sparse grad is densified first)."""
    _apply(ctx, _lars_momentum, {"Velocity": "VelocityOut"})


def _adam(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    b1, b2, eps = _f(ctx, "beta1", 0.9), _f(ctx, "beta2", 0.999), _f(ctx, "epsilon", 1e-8)
    b1p, b2p = scalar(ctx.input("Beta1Pow")), scalar(ctx.input("Beta2Pow"))
    m1 = b1 * acc["Moment1"] + (1 - b1) * g
    m2 = b2 * acc["Moment2"] + (1 - b2) * g * g
    correction = np.sqrt(1 - b2p)
    lr_t = lr * correction / (1 - b1p)
    return {"ParamOut": p - lr_t * m1 / (np.sqrt(m2) + eps * correction),
            "Moment1Out": m1, "Moment2Out": m2}


@register("adam")
def adam(ctx: KernelContext) -> None:
    _apply(ctx, _adam, {"Moment1": "Moment1Out", "Moment2": "Moment2Out"})


def _adagrad(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    m = acc["Moment"] + g * g
    return {"ParamOut": p - lr * g / (np.sqrt(m) + _f(ctx, "epsilon", 1e-6)), "MomentOut": m}


@register("adagrad")
def adagrad(ctx: KernelContext) -> None:
    _apply(ctx, _adagrad, {"Moment": "MomentOut"}, exact_sparse=True)


def _decayed_adagrad(ctx: KernelContext, p: Array, g: Array, lr: Any,
                     acc: dict[str, Array]) -> dict[str, Array]:
    decay = _f(ctx, "decay", 0.95)
    m = decay * acc["Moment"] + (1 - decay) * g * g
    return {"ParamOut": p - lr * g / (np.sqrt(m) + _f(ctx, "epsilon", 1e-6)), "MomentOut": m}


@register("decayed_adagrad")
def decayed_adagrad(ctx: KernelContext) -> None:
    _apply(ctx, _decayed_adagrad, {"Moment": "MomentOut"})


def _adamax(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    b1, b2, eps = _f(ctx, "beta1", 0.9), _f(ctx, "beta2", 0.999), _f(ctx, "epsilon", 1e-8)
    m = b1 * acc["Moment"] + (1 - b1) * g
    u = np.maximum(b2 * acc["InfNorm"] + eps, np.abs(g))
    return {"ParamOut": p - lr / (1 - scalar(ctx.input("Beta1Pow"))) * m / u,
            "MomentOut": m, "InfNormOut": u}


@register("adamax")
def adamax(ctx: KernelContext) -> None:
    _apply(ctx, _adamax, {"Moment": "MomentOut", "InfNorm": "InfNormOut"})


def _rmsprop(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    rho, eps, mu = _f(ctx, "decay", 0.95), _f(ctx, "epsilon", 1e-6), _f(ctx, "momentum", 0.0)
    ms = rho * acc["MeanSquare"] + (1 - rho) * g * g
    out: dict[str, Array] = {}
    if ctx.attr("centered", False):
        mg = rho * acc["MeanGrad"] + (1 - rho) * g
        denom = np.sqrt(ms - mg * mg + eps)
        out["MeanGradOut"] = mg
    else:
        denom = np.sqrt(ms + eps)
    mom = mu * acc["Moment"] + lr * g / denom
    return {"ParamOut": p - mom, "MomentOut": mom, "MeanSquareOut": ms, **out}


@register("rmsprop")
def rmsprop(ctx: KernelContext) -> None:
    centered = {"MeanGrad": "MeanGradOut"} if ctx.attr("centered", False) else {}
    _apply(ctx, _rmsprop, {"MeanSquare": "MeanSquareOut", "Moment": "MomentOut", **centered})


def _ftrl(ctx: KernelContext, p: Array, g: Array, lr: Any, acc: dict[str, Array]) -> dict[str, Array]:
    l1, l2, power = _f(ctx, "l1", 0.0), _f(ctx, "l2", 0.0), _f(ctx, "lr_power", -0.5)
    n = acc["SquaredAccumulator"]
    n_new = n + g * g
    if power == -0.5:
        root_new, root_old = np.sqrt(n_new), np.sqrt(n)
    else:
        root_new, root_old = n_new ** -power, n ** -power
    z = acc["LinearAccumulator"] + g - (root_new - root_old) / lr * p
    shrunk = (l1 * np.sign(z) - z) / (root_new / lr + 2 * l2)
    return {"ParamOut": np.where(np.abs(z) > l1, shrunk, 0), "SquaredAccumOut": n_new,
            "LinearAccumOut": z}


@register("ftrl")
def ftrl(ctx: KernelContext) -> None:
    _apply(ctx, _ftrl, {"SquaredAccumulator": "SquaredAccumOut",
                        "LinearAccumulator": "LinearAccumOut"})
