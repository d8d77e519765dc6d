"""The numpy kernels of the optimizer update ops with Paddle's slots: `optim_rules`' rules on
ndarrays, with numpy's functions (`OPS`).

`LearningRate` (and Adam's / Adamax's `Beta1Pow`, `Beta2Pow`) are [1] arrays, read as numpy
scalars. Outputs keep the parameter's dtype. Each rule is applied to whole arrays or to the
rows a sparse grad touches, as its `Rule.sparse` says.

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
writable and is referenced by nothing but the scope (`runtime.execution.kernels.buffers`).
An array that is shared (a frame being sent, a view a receiver decoded, a kept backup) or
borrowed (decoded from a message) is copied once first, as before, and the copy is then the
scope's own. So no function here may hold the param
or an accumulator while it asks `_target` for it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from runtime.execution.kernels.buffers import MIN_BYTES, exclusive, writable_input
from runtime.execution.kernels.common import check_height, dense_like, scalar
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.optim_rules import (ROW_LOCAL, Ops, Rule, Step, on_rows,
                                                   register_rules, state_slots, written_slots)
from runtime.execution.kernels.registry import register
from runtime.execution.tensor import SelectedRows

Array = np.ndarray


def _descend(p: Array, lr: Any, g: Array) -> Array:
    return p - lr * g


def _as_is(value: Any) -> Any:
    return value


OPS = Ops(sqrt=np.sqrt, square=np.square, sum=np.sum, abs=np.abs, sign=np.sign,
          maximum=np.maximum, where=np.where, operand=_as_is, descend=_descend)
"""numpy's functions; a host scalar enters array math as the numpy scalar it is."""


def _exclusive(ctx: KernelContext, slot: str) -> bool:
    """Whether input `slot`'s array may be written in place (`buffers.exclusive`)."""
    array = ctx.input(slot)  # a local, as `exclusive` counts references
    return exclusive(array)


def _target(ctx: KernelContext, in_slot: str, out_slot: str) -> Array:
    """The array that output `out_slot` becomes, with rows to be written into it: input
    `in_slot`'s own array when the output is the same var and `_exclusive`, else a copy."""
    same = ctx.input_names(in_slot)[:1] == ctx.op.outputs.get(out_slot, [])[:1]
    if same and _exclusive(ctx, in_slot):
        return ctx.input(in_slot)  # type: ignore[no-any-return]
    return np.array(ctx.input(in_slot), copy=True)


def _store(ctx: KernelContext, slot: str, value: Array, like: Array) -> None:
    ctx.set_output(slot, np.asarray(value).astype(like.dtype, copy=False))


def _scalar_input(ctx: KernelContext, slot: str) -> Any:
    return scalar(ctx.input(slot))


def _step(ctx: KernelContext, lr: Any) -> Step:
    return Step(ctx, OPS, lr, partial(_scalar_input, ctx))


def _apply(ctx: KernelContext, rule: Rule) -> None:
    """Run `rule` on the whole arrays, or on a sparse grad's rows as `rule.sparse` says."""
    p, g = ctx.input("Param"), ctx.input("Grad")
    lr = scalar(ctx.input("LearningRate"))
    if on_rows(ctx, rule, g):
        check_height(g, p.shape[0], "Grad", "Param")
        del p  # written in place where nothing else holds it (`_target`)
        (_scatter if rule.sparse == "scatter" else _update_rows)(ctx, rule, g, lr)
        return
    g = dense_like(g, p.shape[0], "Grad")
    if ctx.op.type == "sgd" and p.nbytes >= MIN_BYTES and \
            np.result_type(p, lr, g) == p.dtype:
        del p  # written in place where nothing else holds it (`_descend_own`)
        _descend_own(ctx, lr, g)
        return
    acc = {s: ctx.input(s) for s in state_slots(ctx, rule)}
    for out_slot, values in rule.formula(_step(ctx, lr), p, g, acc).items():
        _store(ctx, out_slot, values, p)


def _descend_own(ctx: KernelContext, lr: Any, g: Array) -> None:
    """sgd's ``p - lr * g`` into the parameter's own array where it is exclusive (the same two
    operations, so the same numbers), else into a new one. DESIGN: a pserver's sgd of a
    [1024, 2048] block made two new 8 MB arrays a step, whose first writes fault page by page;
    in place it makes one, the product."""
    own = writable_input(ctx, "Param", "ParamOut")
    if own is None:
        ctx.set_output("ParamOut", _descend(ctx.input("Param"), lr, g))
        return
    ctx.set_output("ParamOut", np.subtract(own, lr * g, out=own))


def _scatter(ctx: KernelContext, rule: Rule, g: SelectedRows, lr: Any) -> None:
    """Subtract each of the grad's rows, times `lr`, from its param row (sgd)."""
    out = _target(ctx, "Param", "ParamOut")
    np.subtract.at(out, g.rows, (lr * g.values).astype(out.dtype, copy=False))
    ctx.set_output("ParamOut", out)


def _update_rows(ctx: KernelContext, rule: Rule, g: SelectedRows, lr: Any) -> None:
    """Apply `rule` to the merged rows of the grad, and write them into the param and its
    accumulators."""
    p, merged, present = ctx.input("Param"), g.merged(), state_slots(ctx, rule)
    rows, dtype = merged.rows, p.dtype
    acc = {s: ctx.input(s)[rows] for s in present}
    new = rule.formula(_step(ctx, lr), p[rows], merged.values, acc)
    del p, acc
    slots = written_slots(present)
    for out_slot, values in new.items():
        target = _target(ctx, slots[out_slot], out_slot)
        target[rows] = np.asarray(values).astype(dtype, copy=False)
        ctx.set_output(out_slot, target)


register_rules(_apply, register)

__all__ = ["OPS", "ROW_LOCAL"]
