"""Torch kernels of the optimizer update ops: `numpy_optim` op for op, expression for expression.

`LearningRate`, `Beta1Pow` and `Beta2Pow` are read on the host as numpy scalars (`host_input`,
`host_scalar`: one initialized as numpy stays numpy, so a step on a GPU neither uploads it nor
waits to read it back), and the scalar math (Adam's bias correction, say) is done there exactly
as the numpy kernel does it. The arrays
are converted in the dtype numpy computes the update in (the promotion of every input, so a
float64 learning rate makes float32 math float64 as under NEP 50) and the scalars enter torch as
Python numbers, which torch applies without a broadcast. Each update keeps the numpy kernel's
order of operations. A `SelectedRows` grad is scatter-subtracted by `sgd` (repeated rows
accumulate) and densified on the device by every other optimizer. Outputs keep the parameter's
dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_optim import lars_local_lr
from runtime.execution.kernels.torch_common import (Tensor, densify, host_scalar, kernel, put,
                                                    result_dtype, tensor, torch)
from runtime.execution.tensor import SelectedRows


HOST_SLOTS = frozenset({"LearningRate", "Beta1Pow", "Beta2Pow"})
"""Scalars read on the host, in numpy form (`KernelContext.host_input`): never uploaded to the
device, never read back from it."""


class _Update:
    """An optimizer op's inputs as `compute` (numpy's dtype for the update) tensors, the
    learning rate as a numpy scalar, and the parameter's dtype for the outputs. Each input is
    read from the scope once."""

    def __init__(self, ctx: KernelContext) -> None:
        self.ctx = ctx
        self.values = {slot: ctx.host_input(slot) if slot in HOST_SLOTS else ctx.input(slot)
                       for slot in ctx.op.inputs}
        self.compute = result_dtype(*(v.dtype for v in self.values.values() if v is not None))
        param = self.values["Param"]
        self.dtype = param.dtype
        self.p = tensor(param, self.compute)
        self.g = self._dense_grad(param.shape[0])
        self.lr = host_scalar(self.values["LearningRate"])

    def _dense_grad(self, height: int) -> Tensor:
        g = self.values["Grad"]
        if not isinstance(g, SelectedRows):
            return tensor(g, self.compute)
        if g.height != height:
            raise ValueError(f"Grad: SelectedRows height {g.height} != {height} rows")
        return densify(g).to(self.p.dtype)

    def state(self, slot: str) -> Tensor:
        """An accumulator input (Moment, Velocity, ...) in the compute dtype."""
        return tensor(self.values.get(slot), self.compute)

    def scalar(self, slot: str) -> Any:
        return host_scalar(self.values.get(slot))

    def attr(self, name: str, default: float) -> float:
        return float(self.ctx.attr(name, default))

    def store(self, slot: str, value: Tensor) -> None:
        put(self.ctx, slot, value, dtype=self.dtype)


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
    if g.height != p.shape[0]:
        raise ValueError(f"Grad: SelectedRows height {g.height} != {p.shape[0]} rows of Param")
    step = float(lr) * tensor(g.values, result_dtype(g.dtype, lr.dtype))
    out = tensor(p).clone()
    put(ctx, "ParamOut", out.index_add_(0, tensor(g.rows), step.to(out.dtype), alpha=-1))


@kernel("momentum")
def momentum(ctx: KernelContext) -> None:
    u = _Update(ctx)
    mu = u.attr("mu", 0.9)
    v = mu * u.state("Velocity") + u.g
    step = u.g + mu * v if ctx.attr("use_nesterov", False) else v
    u.store("ParamOut", u.p - float(u.lr) * step)
    u.store("VelocityOut", v)


@kernel("lars_momentum")
def lars_momentum(ctx: KernelContext) -> None:
    """`numpy_optim.lars_momentum`: the norms are read back to the host, where the layer-wise
    rate is computed as the numpy kernel computes it."""
    u = _Update(ctx)
    mu, coeff = u.attr("mu", 0.9), u.attr("lars_coeff", 0.001)
    decay = u.attr("lars_weight_decay", 0.0005)
    p_norm = float(torch.sqrt(torch.sum(torch.square(u.p))))
    g_norm = float(torch.sqrt(torch.sum(torch.square(u.g))))
    local_lr = lars_local_lr(float(u.lr), p_norm, g_norm, coeff, decay)
    v = mu * u.state("Velocity") + local_lr * (u.g + decay * u.p)
    u.store("ParamOut", u.p - v)
    u.store("VelocityOut", v)


@kernel("adam")
def adam(ctx: KernelContext) -> None:
    u = _Update(ctx)
    b1, b2, eps = u.attr("beta1", 0.9), u.attr("beta2", 0.999), u.attr("epsilon", 1e-8)
    m1 = b1 * u.state("Moment1") + (1 - b1) * u.g
    m2 = b2 * u.state("Moment2") + (1 - b2) * u.g * u.g
    correction = np.sqrt(1 - u.scalar("Beta2Pow"))
    lr_t = u.lr * correction / (1 - u.scalar("Beta1Pow"))
    u.store("ParamOut", u.p - float(lr_t) * m1 / (torch.sqrt(m2) + float(eps * correction)))
    u.store("Moment1Out", m1)
    u.store("Moment2Out", m2)


@kernel("adagrad")
def adagrad(ctx: KernelContext) -> None:
    u = _Update(ctx)
    m = u.state("Moment") + u.g * u.g
    u.store("ParamOut", u.p - float(u.lr) * u.g / (torch.sqrt(m) + u.attr("epsilon", 1e-6)))
    u.store("MomentOut", m)


@kernel("decayed_adagrad")
def decayed_adagrad(ctx: KernelContext) -> None:
    u = _Update(ctx)
    decay = u.attr("decay", 0.95)
    m = decay * u.state("Moment") + (1 - decay) * u.g * u.g
    u.store("ParamOut", u.p - float(u.lr) * u.g / (torch.sqrt(m) + u.attr("epsilon", 1e-6)))
    u.store("MomentOut", m)


@kernel("adamax")
def adamax(ctx: KernelContext) -> None:
    u = _Update(ctx)
    b1, b2, eps = u.attr("beta1", 0.9), u.attr("beta2", 0.999), u.attr("epsilon", 1e-8)
    m = b1 * u.state("Moment") + (1 - b1) * u.g
    inf_norm = torch.maximum(b2 * u.state("InfNorm") + eps, torch.abs(u.g))
    u.store("ParamOut", u.p - float(u.lr / (1 - u.scalar("Beta1Pow"))) * m / inf_norm)
    u.store("MomentOut", m)
    u.store("InfNormOut", inf_norm)


@kernel("rmsprop")
def rmsprop(ctx: KernelContext) -> None:
    u = _Update(ctx)
    rho, eps, mu = u.attr("decay", 0.95), u.attr("epsilon", 1e-6), u.attr("momentum", 0.0)
    ms = rho * u.state("MeanSquare") + (1 - rho) * u.g * u.g
    if ctx.attr("centered", False):
        mg = rho * u.state("MeanGrad") + (1 - rho) * u.g
        denom = torch.sqrt(ms - mg * mg + eps)
        u.store("MeanGradOut", mg)
    else:
        denom = torch.sqrt(ms + eps)
    mom = mu * u.state("Moment") + float(u.lr) * u.g / denom
    u.store("ParamOut", u.p - mom)
    u.store("MomentOut", mom)
    u.store("MeanSquareOut", ms)


@kernel("ftrl")
def ftrl(ctx: KernelContext) -> None:
    u = _Update(ctx)
    l1, l2, power = u.attr("l1", 0.0), u.attr("l2", 0.0), u.attr("lr_power", -0.5)
    lr = float(u.lr)
    n = u.state("SquaredAccumulator")
    n_new = n + u.g * u.g
    if power == -0.5:
        root_new, root_old = torch.sqrt(n_new), torch.sqrt(n)
    else:
        root_new, root_old = n_new ** -power, n ** -power
    z = u.state("LinearAccumulator") + u.g - (root_new - root_old) / lr * u.p
    shrunk = (l1 * torch.sign(z) - z) / (root_new / lr + 2 * l2)
    u.store("ParamOut", torch.where(torch.abs(z) > l1, shrunk, 0))
    u.store("SquaredAccumOut", n_new)
    u.store("LinearAccumOut", z)
