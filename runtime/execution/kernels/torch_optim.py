"""Torch kernels of the optimizer update ops: `numpy_optim` op for op, expression for expression.

`LearningRate`, `Beta1Pow` and `Beta2Pow` are read on the host as numpy scalars (`host_input`,
`host_scalar`: one initialized as numpy stays numpy, so a step on a GPU neither uploads it nor
waits to read it back), and the scalar math (Adam's bias correction, say) is done there exactly
as the numpy kernel does it. The arrays
are converted in the dtype numpy computes the update in (the promotion of every input, so a
float64 learning rate makes float32 math float64 as under NEP 50) and the scalars enter torch as
Python numbers, which torch applies without a broadcast. Each update keeps the numpy kernel's
order of operations. Outputs keep the parameter's dtype.

A `SelectedRows` grad is handled as `numpy_optim` handles it: `sgd` scatter-adds its rows
(repeated rows accumulate), `adagrad` always and every other optimizer under `lazy_mode`
applies its rule (`Rule`) to the merged rows only, and otherwise the grad is densified on the
device (non-lazy momentum and moments move every row, as in dense training).

DESIGN: as in `numpy_optim`, a sparse update costs O(rows touched): the rows are written into
the scope's own tensor (`index_add_`, `index_copy_`), which is then the output, only where
nobody else can see the write (`_exclusive`); otherwise the tensor is copied once first and
the copy is the scope's own from then on. A tensor is exclusive when it is the scope's value
of the output var, nothing but the scope references it (CPython's reference count, against a
baseline measured at import) and it owns its memory alone: it is such a copy (`_OWN`; a tensor
made from a numpy array views the array's memory, which others may hold, and torch cannot
tell) and no other tensor shares its storage (a view, or the numpy view `Scope.get` hands the
wire: torch's storage use count).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import numpy as np

from runtime.execution.kernels.common import check_height
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.optim_rules import lars_local_lr
from runtime.execution.kernels.torch_common import (Tensor, densify, host_scalar, kernel,
                                                    put, result_dtype, tensor, torch, torch_dtype,
                                                    zeros)
from runtime.execution.tensor import SelectedRows


HOST_SLOTS = frozenset({"LearningRate", "Beta1Pow", "Beta2Pow"})
"""Scalars read on the host, in numpy form (`KernelContext.host_input`): never uploaded to the
device, never read back from it."""


# -- writing in place ---------------------------------------------------------------------------
def _refs(t: Tensor) -> int:
    return sys.getrefcount(t)


def _storage_users(t: Tensor) -> int | None:
    """How many tensors (and storage objects) share `t`'s memory; None where this torch cannot
    tell (then nothing is written in place)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else int(count(t.untyped_storage()._cdata))


def _baseline() -> tuple[int, int | None]:
    """References to a tensor held by a scope only, and users of its storage, counted as
    `_exclusive` counts them."""
    scope = {"var": torch.zeros(1)}
    t = scope["var"]
    return _refs(t), _storage_users(t)


_SCOPE_ONLY, _STORAGE_ONLY = _baseline()
_OWN: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
"""The copies `_target` made, by id: tensors whose memory nothing outside torch can hold."""


def _exclusive(ctx: KernelContext, slot: str) -> bool:
    """Whether input `slot`'s tensor may be written in place: it is the scope's stored value on
    the kernel's device, contiguous, referenced by nothing but the scope, and alone on memory
    this module allocated."""
    t = ctx.input(slot)
    if not (type(t) is Tensor and tensor(t) is t and t.is_contiguous() and t._base is None
            and ctx.scope.raw(ctx.input_names(slot)[0]) is t):
        return False
    users = _storage_users(t)
    return bool(users is not None and _STORAGE_ONLY is not None and users <= _STORAGE_ONLY
                and _OWN.get(id(t)) is t and _refs(t) <= _SCOPE_ONLY)


def _target(ctx: KernelContext, in_slot: str, out_slot: str) -> Tensor:
    """The tensor that output `out_slot` becomes, with rows to be written into it: input
    `in_slot`'s own tensor when the output is the same var and `_exclusive`, else a copy."""
    same = ctx.input_names(in_slot)[:1] == ctx.op.outputs.get(out_slot, [])[:1]
    if same and _exclusive(ctx, in_slot):
        return tensor(ctx.input(in_slot))
    copy = tensor(ctx.input(in_slot)).clone(memory_format=torch.contiguous_format)
    _OWN[id(copy)] = copy
    return copy


# -- the update rules ---------------------------------------------------------------------------
class _Update:
    """An optimizer op's scalars and attributes: the learning rate (and `scalar`'s) as numpy
    scalars, numpy's dtype for the update (`compute`) and the parameter's dtype for the
    outputs. Each input is read from the scope once; `release` lets go of them, so that the
    scope's tensors may be written in place."""

    def __init__(self, ctx: KernelContext) -> None:
        self.ctx = ctx
        self.values = {slot: ctx.host_input(slot) if slot in HOST_SLOTS else ctx.input(slot)
                       for slot in ctx.op.inputs}
        self.compute = result_dtype(*(v.dtype for v in self.values.values() if v is not None))
        self.dtype = self.values["Param"].dtype
        self.lr = host_scalar(self.values["LearningRate"])

    def state(self, slot: str) -> Tensor:
        """An input (Param, Moment, Velocity, ...) in the compute dtype."""
        return tensor(self.values.get(slot), self.compute)

    def scalar(self, slot: str) -> Any:
        return host_scalar(self.values.get(slot))

    def attr(self, name: str, default: float) -> float:
        return float(self.ctx.attr(name, default))

    def release(self) -> None:
        self.values = {s: v for s, v in self.values.items() if s in HOST_SLOTS}


Rule = Callable[[_Update, Tensor, Tensor, dict[str, Tensor]], dict[str, Tensor]]
"""(update, param, grad, accumulators by input slot) -> tensors by output slot."""


def _merged(grad: SelectedRows) -> tuple[Tensor, Tensor]:
    """`SelectedRows.merged` on the device: the sorted unique rows, and the values of repeated
    rows summed (in the grad's dtype)."""
    unique, inverse = np.unique(grad.rows, return_inverse=True)
    values = tensor(grad.values)
    summed = zeros((unique.shape[0],) + tuple(values.shape[1:]), values.dtype)
    return tensor(unique), summed.index_add_(0, tensor(inverse.reshape(-1)), values)


def _apply(ctx: KernelContext, rule: Rule, states: dict[str, str],
           exact_sparse: bool = False) -> None:
    """Run `rule` (`states`: accumulator input slot -> its output slot) on the whole tensors,
    or, for a sparse grad when that is exact or `lazy_mode` asks for it, on the touched rows."""
    u = _Update(ctx)
    param, grad = u.values["Param"], u.values["Grad"]
    present = {s: o for s, o in states.items() if u.values.get(s) is not None}
    if not (isinstance(grad, SelectedRows) and (exact_sparse or ctx.attr("lazy_mode", False))):
        g = _dense_grad(grad, param.shape[0], u.compute)
        new = rule(u, u.state("Param"), g, {s: u.state(s) for s in present})
        for out_slot, value in new.items():
            put(ctx, out_slot, value, dtype=u.dtype)
        return
    check_height(grad, param.shape[0], "Grad", "Param")
    rows, values = _merged(grad)
    compute = torch_dtype(u.compute)
    gathered = {s: tensor(u.values[s])[rows].to(compute) for s in ["Param", *present]}
    new = rule(u, gathered.pop("Param"), values.to(compute), gathered)
    del param, grad, gathered
    u.release()
    slots = {"ParamOut": "Param", **{o: s for s, o in present.items()}}
    for out_slot, value in new.items():
        target = _target(ctx, slots[out_slot], out_slot)
        target.index_copy_(0, rows, value.to(torch_dtype(u.dtype)).to(target.dtype))
        ctx.set_output(out_slot, target)


def _dense_grad(g: Any, height: int, compute: np.dtype) -> Tensor:
    if not isinstance(g, SelectedRows):
        return tensor(g, compute)
    check_height(g, height, "Grad")
    return densify(g).to(torch_dtype(compute))


@kernel("sgd")
def sgd(ctx: KernelContext) -> None:
    p, g = ctx.input("Param"), ctx.input("Grad")
    lr = host_scalar(ctx.host_input("LearningRate"))
    if not isinstance(g, SelectedRows):
        compute = result_dtype(p.dtype, g.dtype, lr.dtype)
        # numpy's p - lr * g as one fused op and one new tensor (the parameter is a value of the
        # scope, never updated in place); rounding may differ from numpy's by an ulp
        step = torch.add(tensor(p, compute), tensor(g, compute), alpha=-float(lr))
        put(ctx, "ParamOut", step, dtype=p.dtype)
        return
    check_height(g, p.shape[0], "Grad", "Param")
    del p
    step = float(lr) * tensor(g.values, result_dtype(g.dtype, lr.dtype))
    out = _target(ctx, "Param", "ParamOut")
    put(ctx, "ParamOut", out.index_add_(0, tensor(g.rows), step.to(out.dtype), alpha=-1))


def _momentum(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    mu = u.attr("mu", 0.9)
    v = mu * acc["Velocity"] + g
    step = g + mu * v if u.ctx.attr("use_nesterov", False) else v
    return {"ParamOut": p - float(u.lr) * step, "VelocityOut": v}


@kernel("momentum")
def momentum(ctx: KernelContext) -> None:
    _apply(ctx, _momentum, {"Velocity": "VelocityOut"})


def _lars_momentum(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    mu, coeff = u.attr("mu", 0.9), u.attr("lars_coeff", 0.001)
    decay = u.attr("lars_weight_decay", 0.0005)
    p_norm = float(torch.sqrt(torch.sum(torch.square(p))))
    g_norm = float(torch.sqrt(torch.sum(torch.square(g))))
    local_lr = lars_local_lr(float(u.lr), p_norm, g_norm, coeff, decay)
    v = mu * acc["Velocity"] + local_lr * (g + decay * p)
    return {"ParamOut": p - v, "VelocityOut": v}


@kernel("lars_momentum")
def lars_momentum(ctx: KernelContext) -> None:
    """`numpy_optim.lars_momentum`: the norms are read back to the host, where the layer-wise
    rate is computed as the numpy kernel computes it."""
    _apply(ctx, _lars_momentum, {"Velocity": "VelocityOut"})


def _adam(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    b1, b2, eps = u.attr("beta1", 0.9), u.attr("beta2", 0.999), u.attr("epsilon", 1e-8)
    m1 = b1 * acc["Moment1"] + (1 - b1) * g
    m2 = b2 * acc["Moment2"] + (1 - b2) * g * g
    correction = np.sqrt(1 - u.scalar("Beta2Pow"))
    lr_t = u.lr * correction / (1 - u.scalar("Beta1Pow"))
    return {"ParamOut": p - float(lr_t) * m1 / (torch.sqrt(m2) + float(eps * correction)),
            "Moment1Out": m1, "Moment2Out": m2}


@kernel("adam")
def adam(ctx: KernelContext) -> None:
    _apply(ctx, _adam, {"Moment1": "Moment1Out", "Moment2": "Moment2Out"})


def _adagrad(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    m = acc["Moment"] + g * g
    return {"ParamOut": p - float(u.lr) * g / (torch.sqrt(m) + u.attr("epsilon", 1e-6)),
            "MomentOut": m}


@kernel("adagrad")
def adagrad(ctx: KernelContext) -> None:
    _apply(ctx, _adagrad, {"Moment": "MomentOut"}, exact_sparse=True)


def _decayed_adagrad(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    decay = u.attr("decay", 0.95)
    m = decay * acc["Moment"] + (1 - decay) * g * g
    return {"ParamOut": p - float(u.lr) * g / (torch.sqrt(m) + u.attr("epsilon", 1e-6)),
            "MomentOut": m}


@kernel("decayed_adagrad")
def decayed_adagrad(ctx: KernelContext) -> None:
    _apply(ctx, _decayed_adagrad, {"Moment": "MomentOut"})


def _adamax(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    b1, b2, eps = u.attr("beta1", 0.9), u.attr("beta2", 0.999), u.attr("epsilon", 1e-8)
    m = b1 * acc["Moment"] + (1 - b1) * g
    inf_norm = torch.maximum(b2 * acc["InfNorm"] + eps, torch.abs(g))
    return {"ParamOut": p - float(u.lr / (1 - u.scalar("Beta1Pow"))) * m / inf_norm,
            "MomentOut": m, "InfNormOut": inf_norm}


@kernel("adamax")
def adamax(ctx: KernelContext) -> None:
    _apply(ctx, _adamax, {"Moment": "MomentOut", "InfNorm": "InfNormOut"})


def _rmsprop(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    rho, eps, mu = u.attr("decay", 0.95), u.attr("epsilon", 1e-6), u.attr("momentum", 0.0)
    ms = rho * acc["MeanSquare"] + (1 - rho) * g * g
    out: dict[str, Tensor] = {}
    if u.ctx.attr("centered", False):
        mg = rho * acc["MeanGrad"] + (1 - rho) * g
        denom = torch.sqrt(ms - mg * mg + eps)
        out["MeanGradOut"] = mg
    else:
        denom = torch.sqrt(ms + eps)
    mom = mu * acc["Moment"] + float(u.lr) * g / denom
    return {"ParamOut": p - mom, "MomentOut": mom, "MeanSquareOut": ms, **out}


@kernel("rmsprop")
def rmsprop(ctx: KernelContext) -> None:
    centered = {"MeanGrad": "MeanGradOut"} if ctx.attr("centered", False) else {}
    _apply(ctx, _rmsprop, {"MeanSquare": "MeanSquareOut", "Moment": "MomentOut", **centered})


def _ftrl(u: _Update, p: Tensor, g: Tensor, acc: dict[str, Tensor]) -> dict[str, Tensor]:
    l1, l2, power = u.attr("l1", 0.0), u.attr("l2", 0.0), u.attr("lr_power", -0.5)
    lr = float(u.lr)
    n = acc["SquaredAccumulator"]
    n_new = n + g * g
    if power == -0.5:
        root_new, root_old = torch.sqrt(n_new), torch.sqrt(n)
    else:
        root_new, root_old = n_new ** -power, n ** -power
    z = acc["LinearAccumulator"] + g - (root_new - root_old) / lr * p
    shrunk = (l1 * torch.sign(z) - z) / (root_new / lr + 2 * l2)
    return {"ParamOut": torch.where(torch.abs(z) > l1, shrunk, 0), "SquaredAccumOut": n_new,
            "LinearAccumOut": z}


@kernel("ftrl")
def ftrl(ctx: KernelContext) -> None:
    _apply(ctx, _ftrl, {"SquaredAccumulator": "SquaredAccumOut",
                        "LinearAccumulator": "LinearAccumOut"})
