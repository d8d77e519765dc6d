"""The optimizer update rules, each written once for both kernel backends (docs/transpiler.md §2).

A rule (`Formula`) maps the param, its grad and its accumulators (by input slot) to the new
values (by output slot). It computes with Python operators and the few array functions of
`Ops`, which each backend gives for its own arrays: `numpy_optim` numpy's functions on ndarrays,
`torch_optim` torch's on tensors. What a rule reads besides arrays comes through `Step`: the
op's attributes, and the learning rate and beta powers as numpy scalars on the host (both
backends read them so); their scalar math (Adam's bias correction) is numpy's in both, and
`Ops.operand` says how such a scalar then enters array math. Which accumulators an optimizer has
is the op catalog's (`transpiler.opcatalog`): `state_slots` reads them there.

The backends keep what differs between them: reading and placing arrays, the dtype the update
is computed in, a sparse grad's rows, and writing the scope's own arrays in place. Each hands
its `apply` (op context and rule: one update) to `register_rules`, which makes every rule of
`RULES` a kernel; `on_rows`, `state_slots` and `written_slots` are the decisions they share.

DESIGN: each rule keeps the exact sequence of operations both backends had, since floating
point results depend on it (tests/execution/test_optim_rules.py holds them to the bit). They differed in
two places only, both in `Ops`: a host scalar is used as it is by numpy (a numpy scalar, which
promotes by NEP 50) and as a Python float by torch (which applies it without a broadcast, in
the tensor's dtype: torch computes in numpy's promoted dtype from the start); and sgd's step is
numpy's ``p - lr * g`` but torch's single fused ``torch.add(p, g, alpha=-lr)`` (one new tensor;
its rounding may differ from numpy's by an ulp), so that step is `Ops.descend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import Kernel
from runtime.execution.tensor import SelectedRows
from transpiler.opcatalog import op_def, optimizer_types

Array = Any
"""A backend's array: an ndarray for numpy, a tensor for torch."""


@dataclass(frozen=True, slots=True)
class Ops:
    """The array functions the rules use, for one backend's arrays (numpy's and torch's have the
    same names and meaning for these)."""

    sqrt: Callable[[Array], Array]
    square: Callable[[Array], Array]
    sum: Callable[[Array], Array]
    abs: Callable[[Array], Array]
    sign: Callable[[Array], Array]
    maximum: Callable[[Array, Array], Array]
    where: Callable[[Array, Array, Any], Array]
    operand: Callable[[Any], Any]
    """A host numpy scalar as an operand of array math."""
    descend: Callable[[Array, Any, Array], Array]
    """sgd's step ``p - lr * g`` (param, host learning rate, grad)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What a rule reads besides the arrays: the op's context (attributes), its backend's `Ops`,
    the learning rate as a host numpy scalar and `scalar`, any other [1] input (Beta1Pow) so."""

    ctx: KernelContext
    ops: Ops
    lr: Any
    scalar: Callable[[str], Any]

    def attr(self, name: str, default: float) -> float:
        return float(self.ctx.attr(name, default))

    def flag(self, name: str) -> bool:
        return bool(self.ctx.attr(name, False))

    def rate(self) -> Any:
        """The learning rate as an operand of array math."""
        return self.ops.operand(self.lr)


Formula = Callable[[Step, Array, Array, dict[str, Array]], dict[str, Array]]
"""(step, param, grad, accumulators by input slot) -> arrays by output slot."""


Sparse = Literal["scatter", "rows", "lazy"]
"""How an optimizer takes a SelectedRows grad: `scatter` subtracts each of its rows' steps from
the param one by one (sgd: repeated rows accumulate); `rows` applies the formula to the merged
rows only, `lazy_mode` or not, since a row without gradient is left as it is by the dense rule
too (adagrad); `lazy` does so only under `lazy_mode` (Paddle's Adam has it) and otherwise
densifies the grad (Paddle's non-lazy mode: momentum and moments move every row)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """An optimizer's `formula`, how it takes a sparse grad (`sparse`), and the accumulators its
    formula uses only when an attribute is set (`only_if`: rmsprop's MeanGrad, when centered)."""

    formula: Formula
    sparse: Sparse = "lazy"
    only_if: dict[str, str] = field(default_factory=dict)


def _scalar_slots() -> frozenset[str]:
    slots = {"LearningRate"}
    for op_type in optimizer_types():
        update = op_def(op_type).update
        assert update is not None
        slots |= {s.slot for s in update.state if not s.param_shaped}
    return frozenset(slots)


SCALAR_SLOTS = _scalar_slots()
"""Every optimizer's [1]-shaped inputs: the learning rate and the catalog's scalar state (the
beta powers), which both backends read as host numpy scalars."""


def state_slots(ctx: KernelContext, rule: Rule) -> dict[str, str]:
    """The accumulators `rule` reads and writes in this op, input slot -> output slot: the
    catalog's param-shaped state that the op has (and that `rule.only_if` lets in)."""
    update = op_def(ctx.op.type).update
    assert update is not None, f"{ctx.op.type} is not an optimizer in the op catalog"
    return {s.slot: s.out for s in update.state
            if s.out is not None and ctx.has_input(s.slot)
            and (s.slot not in rule.only_if or ctx.attr(rule.only_if[s.slot], False))}


def on_rows(ctx: KernelContext, rule: Rule, grad: Any) -> bool:
    """Whether `rule` updates only the rows of `grad` (scattered or merged, `rule.sparse`) rather
    than whole arrays (a dense grad, or a sparse one densified)."""
    return isinstance(grad, SelectedRows) and (rule.sparse != "lazy"
                                               or bool(ctx.attr("lazy_mode", False)))


def written_slots(states: dict[str, str]) -> dict[str, str]:
    """Output slot -> the input slot it updates, for the param and `states` (`state_slots`)."""
    return {"ParamOut": "Param", **{out: slot for slot, out in states.items()}}


def register_rules(apply: Callable[[KernelContext, Rule], None],
                   register: Callable[[str], Callable[[Kernel], Kernel]]) -> None:
    """Register, for every rule of `RULES`, a kernel that runs `apply` (a backend's) on it."""
    for op_type, rule in RULES.items():
        register(op_type)(_kernel(op_type, rule, apply))


def _kernel(op_type: str, rule: Rule, apply: Callable[[KernelContext, Rule], None]) -> Kernel:
    def run(ctx: KernelContext) -> None:
        apply(ctx, rule)
    run.__name__ = run.__qualname__ = op_type
    return run


# -- the rules ----------------------------------------------------------------------------------
def _sgd(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    return {"ParamOut": s.ops.descend(p, s.lr, g)}


def _momentum(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    mu = s.attr("mu", 0.9)
    v = mu * acc["Velocity"] + g
    step = g + mu * v if s.flag("use_nesterov") else v
    return {"ParamOut": p - s.rate() * step, "VelocityOut": v}


def lars_local_lr(lr: float, p_norm: float, g_norm: float, coeff: float, decay: float) -> float:
    """LARS's layer-wise rate ``lr * coeff * |p| / (|g| + decay * |p|)``; `lr` itself when
    either norm is 0 (a zero parameter or gradient), as Paddle's kernel guards it."""
    if p_norm > 0 and g_norm > 0:
        return lr * coeff * p_norm / (g_norm + decay * p_norm)
    return lr


def _norm(ops: Ops, x: Array) -> float:
    """The L2 norm of the whole array, on the host."""
    return float(ops.sqrt(ops.sum(ops.square(x))))


def _lars_momentum(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    """Layer-wise adaptive rate scaling (You et al., 2017) on momentum: the norms are over the
    whole parameter and gradient, read back to the host (a sparse grad is densified first)."""
    mu, coeff = s.attr("mu", 0.9), s.attr("lars_coeff", 0.001)
    decay = s.attr("lars_weight_decay", 0.0005)
    p_norm, g_norm = _norm(s.ops, p), _norm(s.ops, g)
    local_lr = lars_local_lr(float(s.lr), p_norm, g_norm, coeff, decay)
    v = mu * acc["Velocity"] + local_lr * (g + decay * p)
    return {"ParamOut": p - v, "VelocityOut": v}


def _adam(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    b1, b2, eps = s.attr("beta1", 0.9), s.attr("beta2", 0.999), s.attr("epsilon", 1e-8)
    b1p, b2p = s.scalar("Beta1Pow"), s.scalar("Beta2Pow")
    m1 = b1 * acc["Moment1"] + (1 - b1) * g
    m2 = b2 * acc["Moment2"] + (1 - b2) * g * g
    correction = np.sqrt(1 - b2p)
    lr_t = s.lr * correction / (1 - b1p)
    operand = s.ops.operand
    return {"ParamOut": p - operand(lr_t) * m1 / (s.ops.sqrt(m2) + operand(eps * correction)),
            "Moment1Out": m1, "Moment2Out": m2}


def _adagrad(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    m = acc["Moment"] + g * g
    return {"ParamOut": p - s.rate() * g / (s.ops.sqrt(m) + s.attr("epsilon", 1e-6)),
            "MomentOut": m}


def _decayed_adagrad(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    decay = s.attr("decay", 0.95)
    m = decay * acc["Moment"] + (1 - decay) * g * g
    return {"ParamOut": p - s.rate() * g / (s.ops.sqrt(m) + s.attr("epsilon", 1e-6)),
            "MomentOut": m}


def _adamax(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    b1, b2, eps = s.attr("beta1", 0.9), s.attr("beta2", 0.999), s.attr("epsilon", 1e-8)
    m = b1 * acc["Moment"] + (1 - b1) * g
    u = s.ops.maximum(b2 * acc["InfNorm"] + eps, s.ops.abs(g))
    return {"ParamOut": p - s.ops.operand(s.lr / (1 - s.scalar("Beta1Pow"))) * m / u,
            "MomentOut": m, "InfNormOut": u}


def _rmsprop(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    rho, eps, mu = s.attr("decay", 0.95), s.attr("epsilon", 1e-6), s.attr("momentum", 0.0)
    ms = rho * acc["MeanSquare"] + (1 - rho) * g * g
    out: dict[str, Array] = {}
    if s.flag("centered"):
        mg = rho * acc["MeanGrad"] + (1 - rho) * g
        denom = s.ops.sqrt(ms - mg * mg + eps)
        out["MeanGradOut"] = mg
    else:
        denom = s.ops.sqrt(ms + eps)
    mom = mu * acc["Moment"] + s.rate() * g / denom
    return {"ParamOut": p - mom, "MomentOut": mom, "MeanSquareOut": ms, **out}


def _ftrl(s: Step, p: Array, g: Array, acc: dict[str, Array]) -> dict[str, Array]:
    l1, l2, power = s.attr("l1", 0.0), s.attr("l2", 0.0), s.attr("lr_power", -0.5)
    lr, ops = s.rate(), s.ops
    n = acc["SquaredAccumulator"]
    n_new = n + g * g
    if power == -0.5:
        root_new, root_old = ops.sqrt(n_new), ops.sqrt(n)
    else:
        root_new, root_old = n_new ** -power, n ** -power
    z = acc["LinearAccumulator"] + g - (root_new - root_old) / lr * p
    shrunk = (l1 * ops.sign(z) - z) / (root_new / lr + 2 * l2)
    return {"ParamOut": ops.where(ops.abs(z) > l1, shrunk, 0), "SquaredAccumOut": n_new,
            "LinearAccumOut": z}


RULES: dict[str, Rule] = {
    "sgd": Rule(_sgd, sparse="scatter"),
    "momentum": Rule(_momentum),
    "lars_momentum": Rule(_lars_momentum),
    "adam": Rule(_adam),
    "adagrad": Rule(_adagrad, sparse="rows"),
    "decayed_adagrad": Rule(_decayed_adagrad),
    "adamax": Rule(_adamax),
    "rmsprop": Rule(_rmsprop, only_if={"MeanGrad": "centered"}),
    "ftrl": Rule(_ftrl),
}
"""Every optimizer op's rule, by op type."""

ROW_LOCAL = frozenset(t for t, rule in RULES.items() if rule.sparse != "lazy")
"""Optimizers whose update with a sparse grad writes the grad's rows only, `lazy_mode` or not
(others do so only under `lazy_mode`). `runtime.execution.table.rows_written` relies on it."""

__all__ = ["RULES", "ROW_LOCAL", "SCALAR_SLOTS", "Formula", "Ops", "Rule", "Sparse", "Step",
           "lars_local_lr", "on_rows", "register_rules", "state_slots", "written_slots"]
