"""Reverse-mode autodiff on programs: `append_backward(loss)` appends the gradient ops.

The op catalog (`transpiler.opcatalog`) says which input slots of each op type are
differentiable and names its grad op, ``T_grad`` for an op of type ``T``. Following Paddle's
default grad-op maker the grad op reads every forward input and output slot plus
``<OutSlot>@GRAD`` for each output whose gradient exists, and writes ``<InSlot>@GRAD`` for each
differentiable input slot (only for vars that need a gradient). The gradient of var ``X`` is
``X@GRAD``; when several grad ops contribute to one gradient, each writes a renamed copy
(``X@GRAD@RENAME@block0@k``) and a `sum` after the last producer adds them into ``X@GRAD``. A
sparse `lookup_table` or `lookup_table_v2` (``is_sparse``) gives its table a ``SELECTED_ROWS`` gradient,
as a sparse `nce` gives its Weight.
"""

from __future__ import annotations

from collections import defaultdict

from .ir import Block, Op, OpRole, Var, VarType, grad_name
from .opcatalog import OPS, grad_input_slots

GRAD_INPUT_SLOTS: dict[str, tuple[str, ...]] = grad_input_slots()
"""Differentiable input slots of each op type (`transpiler.opcatalog`); ops not listed have no
gradient."""

FLOAT_DTYPES = ("float16", "float32", "float64")


SPARSE_GRAD_SLOTS = {"lookup_table": "W", "lookup_table_v2": "W", "nce": "Weight",
                     "hierarchical_sigmoid": "W"}
"""The input slot of each op type whose gradient is SELECTED_ROWS when the op ``is_sparse``."""


def _sparse_grad(op: Op, slot: str) -> bool:
    return SPARSE_GRAD_SLOTS.get(op.type) == slot and bool(op.attr("is_sparse", False))


def _needs_grad(var: Var | None) -> bool:
    return var is not None and not var.stop_gradient and var.dtype in FLOAT_DTYPES


def _forward_requires_grad(block: Block, ops: list[Op], no_grad: set[str]) -> set[str]:
    """Names of vars whose value depends on a var that needs a gradient."""
    live = {v.name for v in block.vars.values() if v.is_parameter and v.trainable} - no_grad
    for op in ops:
        slots = GRAD_INPUT_SLOTS.get(op.type, ())
        if any(n in live for s in slots for n in op.input(s)):
            for name in op.output_arg_names:
                var = block.find_var_recursive(name)
                if _needs_grad(var) and name not in no_grad:
                    live.add(name)
    return live


def _relevant_ops(ops: list[Op], loss_name: str, live: set[str]) -> list[Op]:
    """Ops on a path from a gradient-needing var to the loss, in forward order."""
    needed = {loss_name}
    path: list[Op] = []
    for op in reversed(ops):
        if op.type not in GRAD_INPUT_SLOTS or not any(n in needed for n in op.output_arg_names):
            continue
        diff_inputs = [n for s in GRAD_INPUT_SLOTS[op.type] for n in op.input(s) if n in live]
        if not diff_inputs:
            continue
        path.append(op)
        needed.update(diff_inputs)
    path.reverse()
    return path


def _declare_grad(block: Block, name: str, like: Var, sparse: bool) -> None:
    if block.has_var(name):
        return
    block.create_var(name, shape=like.shape, dtype=like.dtype, lod_level=like.lod_level,
                     type=VarType.SELECTED_ROWS if sparse else VarType.LOD_TENSOR)


def append_backward(loss: Var, parameter_list: list[str] | None = None,
                    no_grad_set: set[str] | None = None) -> list[tuple[Var, Var]]:
    """Append the backward ops of `loss` to its block; return [(param, grad)] in name order."""
    block = loss.block
    if block is None:
        raise ValueError(f"append_backward: loss {loss.name!r} is not declared in a block")
    no_grad = set(no_grad_set or ())
    if loss.numel != 1:
        raise ValueError(f"append_backward: loss {loss.name!r} must hold one element, shape {loss.shape}")
    forward_ops = list(block.ops)
    loss_op = next((op for op in reversed(forward_ops) if loss.name in op.output_arg_names), None)
    if loss_op is None:
        raise ValueError(f"append_backward: no op in block {block.idx} produces loss {loss.name!r}")
    loss_op.role = int(OpRole.Forward | OpRole.Loss)

    live = _forward_requires_grad(block, forward_ops, no_grad)
    path = _relevant_ops(forward_ops, loss.name, live)

    loss_grad = grad_name(loss.name)
    _declare_grad(block, loss_grad, loss, False)
    block.append_op("fill_constant", outputs={"Out": [loss_grad]},
                    attrs={"shape": list(loss.shape) or [1], "dtype": loss.dtype, "value": 1.0,
                           "op_role": int(OpRole.Backward | OpRole.Loss)})

    available = {loss_grad}
    # grad name -> every (grad op, output slot, position) that writes a contribution to it
    producers: dict[str, list[tuple[Op, str, int]]] = defaultdict(list)
    grad_ops: list[Op] = []
    for op in reversed(path):
        out_grads = {f"{s}@GRAD": [grad_name(n) for n in names]
                     for s, names in op.outputs.items()
                     if any(grad_name(n) in available for n in names)}
        if not out_grads:
            continue
        in_grads: dict[str, list[str]] = {}
        for slot in GRAD_INPUT_SLOTS[op.type]:
            names = [grad_name(n) for n in op.input(slot) if n in live]
            if names:
                in_grads[f"{slot}@GRAD"] = names
        inputs = {**op.inputs, **op.outputs}
        # Grad slots list only the grads that exist (outputs) or are needed (inputs); kernels
        # match them to forward vars by name, and treat a missing output grad as zero.
        inputs.update({k: [n for n in v if n in available] for k, v in out_grads.items()})
        attrs = {k: v for k, v in op.attrs.items() if k not in ("op_role", "op_role_var")}
        attrs["op_role"] = int(OpRole.Backward)
        grad_type = OPS[op.type].grad_type
        assert grad_type is not None
        gop = Op(grad_type, inputs, in_grads, attrs)
        for slot, names in in_grads.items():
            fwd_slot = slot[: -len("@GRAD")]
            for pos, (fwd_name, gname) in enumerate(zip([n for n in op.input(fwd_slot) if n in live],
                                                        names)):
                fwd_var = block.find_var_recursive(fwd_name)
                assert fwd_var is not None
                _declare_grad(block, gname, fwd_var, _sparse_grad(op, fwd_slot))
                producers[gname].append((gop, slot, pos))
                available.add(gname)
        grad_ops.append(gop)

    block.ops.extend(grad_ops)
    _sum_repeated_grads(block, producers)
    return _params_and_grads(block, parameter_list, no_grad)


def _sum_repeated_grads(block: Block, producers: dict[str, list[tuple[Op, str, int]]]) -> None:
    """Give each contribution to a gradient its own name and add them up after the last one.

    Contributions are renamed per output position, so an op that reads a var twice
    (``elementwise_mul(h, h)``) gets two distinct grad outputs."""
    for gname, writes in producers.items():
        if len(writes) < 2:
            continue
        var = block.var(gname)
        renamed = []
        for k, (op, slot, pos) in enumerate(writes):
            new = f"{gname}@RENAME@block{block.idx}@{k}"
            block.create_var(new, shape=var.shape, dtype=var.dtype, type=var.type,
                             lod_level=var.lod_level)
            op.outputs[slot][pos] = new
            renamed.append(new)
        last = max(_index_of(block, op) for op, _, _ in writes)
        block.insert_op(last + 1, "sum", inputs={"X": renamed}, outputs={"Out": [gname]},
                        attrs={"op_role": int(OpRole.Backward)})


def _index_of(block: Block, op: Op) -> int:
    return next(i for i, candidate in enumerate(block.ops) if candidate is op)


def _params_and_grads(block: Block, parameter_list: list[str] | None,
                      no_grad: set[str]) -> list[tuple[Var, Var]]:
    params = sorted((p for p in block.program.global_block().all_parameters()
                     if p.trainable and p.name not in no_grad), key=lambda p: p.name)
    if parameter_list is not None:
        wanted = set(parameter_list)
        params = [p for p in params if p.name in wanted]
    pairs = []
    last_writer = {name: op for op in block.ops for name in op.output_arg_names}
    for param in params:
        gname = grad_name(param.name)
        if not block.has_var(gname):
            continue
        pairs.append((param, block.var(gname)))
        # op_role_var on the op that finally writes the gradient lets the transpiler find it.
        op = last_writer[gname]
        op.attrs["op_role_var"] = list(op.attrs.get("op_role_var", [])) + [param.name, gname]
    return pairs
