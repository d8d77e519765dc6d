"""The torch kernels of the optimizer update ops: `optim_rules`' rules on tensors, with torch's
functions (`OPS`), as `numpy_optim` applies them on ndarrays.

`LearningRate`, `Beta1Pow` and `Beta2Pow` are read on the host as numpy scalars (`host_input`,
`host_scalar`: one initialized as numpy stays numpy, so a step on a GPU neither uploads it nor
waits to read it back), and the scalar math (Adam's bias correction, say) is done there exactly
as the numpy kernel does it. The arrays are converted in the dtype numpy computes the update in
(the promotion of every input, so a float64 learning rate makes float32 math float64 as under
NEP 50) and the scalars enter torch as Python numbers (`OPS.operand`), which torch applies
without a broadcast. Outputs keep the parameter's dtype.

A `SelectedRows` grad is handled as `numpy_optim` handles it: `sgd` scatter-adds its rows
(repeated rows accumulate), `adagrad` always and every other optimizer under `lazy_mode`
applies its rule to the merged rows only, and otherwise the grad is densified on the device
(non-lazy momentum and moments move every row, as in dense training).

DESIGN: as in `numpy_optim`, a sparse update costs O(rows touched): the rows are written into
the scope's own tensor (`index_add_`, `index_copy_`), which is then the output, only where
nobody else can see the write (`torch_buffers.exclusive`: the scope's value of the output var,
referenced by nothing else, alone on memory a torch kernel allocated); otherwise the tensor is
copied once first and the copy is the scope's own from then on. A dense sgd writes the
parameter in place the same way. So no function here may hold the param or an accumulator
while it asks `_target` for it (`_Update.release` lets go of the inputs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.execution.kernels.common import check_height
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.optim_rules import (SCALAR_SLOTS, Ops, Rule, Step, on_rows,
                                                   register_rules, state_slots, written_slots)
from runtime.execution.kernels.torch_buffers import exclusive, large, own, writable_input
from runtime.execution.kernels.torch_common import (Tensor, densify, host_scalar, kernel,
                                                    put, result_dtype, tensor, torch, torch_dtype,
                                                    zeros)
from runtime.execution.tensor import SelectedRows


HOST_SLOTS = SCALAR_SLOTS
"""Scalars read on the host, in numpy form (`KernelContext.host_input`): never uploaded to the
device, never read back from it."""


def _descend(p: Tensor, lr: Any, g: Tensor) -> Tensor:
    """numpy's ``p - lr * g`` as one fused op and one new tensor; rounding may differ from
    numpy's by an ulp. (A dense sgd in the parameter's dtype runs the same op in place where
    nothing else holds the parameter: `_descend_own`.)"""
    return torch.add(p, g, alpha=-float(lr))


OPS = Ops(sqrt=torch.sqrt, square=torch.square, sum=torch.sum, abs=torch.abs, sign=torch.sign,
          maximum=torch.maximum, where=torch.where, operand=float, descend=_descend)
"""torch's functions; a host scalar enters tensor math as a Python float."""


def _target(ctx: KernelContext, in_slot: str, out_slot: str) -> Tensor:
    """The tensor that output `out_slot` becomes, with rows to be written into it: input
    `in_slot`'s own tensor when the output is the same var and `exclusive`, else a copy."""
    same = ctx.input_names(in_slot)[:1] == ctx.op.outputs.get(out_slot, [])[:1]
    if same and exclusive(ctx, in_slot):
        return tensor(ctx.input(in_slot))
    return own(tensor(ctx.input(in_slot)).clone(memory_format=torch.contiguous_format))


# -- applying the rules -------------------------------------------------------------------------
class _Update:
    """An optimizer op's inputs and dtypes: the learning rate (and `scalar`'s) as numpy
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

    def step(self) -> Step:
        return Step(self.ctx, OPS, self.lr, self.scalar)

    def release(self) -> None:
        self.values = {s: v for s, v in self.values.items() if s in HOST_SLOTS}


def _merged(grad: SelectedRows) -> tuple[Tensor, Tensor]:
    """`SelectedRows.merged` on the device: the sorted unique rows, and the values of repeated
    rows summed (in the grad's dtype)."""
    unique, inverse = np.unique(grad.rows, return_inverse=True)
    values = tensor(grad.values)
    summed = zeros((unique.shape[0],) + tuple(values.shape[1:]), values.dtype)
    return tensor(unique), summed.index_add_(0, tensor(inverse.reshape(-1)), values)


def _apply(ctx: KernelContext, rule: Rule) -> None:
    """Run `rule` on the whole tensors, or on a sparse grad's rows as `rule.sparse` says."""
    if ctx.op.type == "sgd" and _dense_sgd(ctx):
        return
    u = _Update(ctx)
    param, grad = u.values["Param"], u.values["Grad"]
    if on_rows(ctx, rule, grad):
        check_height(grad, param.shape[0], "Grad", "Param")
        del param  # written in place where nothing else holds it (`_target`)
        (_scatter if rule.sparse == "scatter" else _update_rows)(u, rule, grad)
        return
    g = _dense_grad(grad, param.shape[0], u.compute)
    if ctx.op.type == "sgd" and param.dtype == torch_dtype(u.compute):
        del param  # written in place where nothing else holds it (`_descend_own`)
        lr = -float(u.lr)
        u.release()
        _descend_own(ctx, lr, g)
        return
    acc = {s: u.state(s) for s in state_slots(ctx, rule)}
    for out_slot, value in rule.formula(u.step(), u.state("Param"), g, acc).items():
        put(ctx, out_slot, value, dtype=u.dtype)


SGD_SLOTS = frozenset({"Param", "Grad", "LearningRate"})


def _dense_sgd(ctx: KernelContext) -> bool:
    """The usual sgd (a dense tensor grad; Param, Grad and LearningRate only; computed in the
    parameter's dtype) as `_apply` runs it, `_descend_own`, without `_Update`'s bookkeeping for
    every rule and input; False, having done nothing, for any other. DESIGN: an sgd per
    parameter runs every step, and for a bias the bookkeeping cost several times the update."""
    if ctx.op.inputs.keys() != SGD_SLOTS:
        return False
    param, grad, rate = ctx.input("Param"), ctx.input("Grad"), ctx.host_input("LearningRate")
    if type(param) is not Tensor or type(grad) is not Tensor or rate is None:
        return False
    compute = result_dtype(param.dtype, grad.dtype, rate.dtype)
    if param.dtype != torch_dtype(compute):
        return False
    del param  # written in place where nothing else holds it (`_descend_own`)
    _descend_own(ctx, -float(host_scalar(rate)), tensor(grad, compute))
    return True


def _descend_own(ctx: KernelContext, lr: float, g: Tensor) -> None:
    """sgd on a dense grad into the parameter's own tensor where it is exclusive (the same
    fused op, in place: the same rounding), else into a new tensor that is then torch's own
    (`torch_buffers.own`), so that the next step may write it. DESIGN: into a new tensor, the
    sgd of a [1024, 1024] parameter took 1.6 times as long as in place (350 us against 218 a
    step, the medians of 9 rounds of 50 on the development machine): one pass over memory
    instead of two places' worth."""
    own_param = writable_input(ctx, "Param", "ParamOut")
    if own_param is not None:
        put(ctx, "ParamOut", own_param.add_(g, alpha=lr))
        return
    new = torch.add(tensor(ctx.input("Param")), g, alpha=lr)
    put(ctx, "ParamOut", own(new) if large(new) else new)  # small ones are never written


def _scatter(u: _Update, rule: Rule, grad: SelectedRows) -> None:
    """Subtract each of the grad's rows, times the learning rate, from its param row (sgd)."""
    lr = u.lr
    u.release()
    step = float(lr) * tensor(grad.values, result_dtype(grad.dtype, lr.dtype))
    out = _target(u.ctx, "Param", "ParamOut")
    put(u.ctx, "ParamOut", out.index_add_(0, tensor(grad.rows), step.to(out.dtype), alpha=-1))


def _update_rows(u: _Update, rule: Rule, grad: SelectedRows) -> None:
    """Apply `rule` to the merged rows of the grad, and write them into the param and its
    accumulators."""
    ctx, present = u.ctx, state_slots(u.ctx, rule)
    rows, values = _merged(grad)
    compute = torch_dtype(u.compute)
    gathered = {s: tensor(u.values[s])[rows].to(compute) for s in ["Param", *present]}
    new = rule.formula(u.step(), gathered.pop("Param"), values.to(compute), gathered)
    del gathered
    u.release()
    slots = written_slots(present)
    for out_slot, value in new.items():
        target = _target(ctx, slots[out_slot], out_slot)
        target.index_copy_(0, rows, value.to(torch_dtype(u.dtype)).to(target.dtype))
        ctx.set_output(out_slot, target)


def _dense_grad(g: Any, height: int, compute: np.dtype) -> Tensor:
    if not isinstance(g, SelectedRows):
        return tensor(g, compute)
    check_height(g, height, "Grad")
    return densify(g).to(torch_dtype(compute))


register_rules(_apply, kernel)

__all__ = ["HOST_SLOTS", "OPS"]
