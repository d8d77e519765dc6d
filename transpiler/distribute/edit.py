"""Small program-editing helpers the passes share: copy and rename vars and ops, find writers,
declare control vars, drop blocks nothing runs."""

from __future__ import annotations

import copy
from typing import Any, Callable

from ..ir import OP_ROLE_VAR_ATTR, Block, BlockRef, Op, OpRole, Program, Var, VarType


def clone_var(block: Block, var: Var, **overrides: Any) -> Var:
    """Declare `var` (with `overrides`) in `block` unless a var of that name is there."""
    name = overrides.pop("name", var.name)
    if block.has_var(name):
        return block.var(name)
    fields = dict(shape=var.shape, dtype=var.dtype, persistable=var.persistable, type=var.type,
                  lod_level=var.lod_level, stop_gradient=var.stop_gradient)
    fields.update(overrides)
    return block.create_var(name, **fields)


def control_var(block: Block, name: str) -> str:
    """A RAW var that carries no data, only an ordering edge between RPC ops."""
    block.create_var(name, type=VarType.RAW, stop_gradient=True)
    return name


def rpc_attrs(**attrs: Any) -> dict[str, Any]:
    return {**attrs, "op_role": int(OpRole.RPC)}


def copy_op(op: Op, rename: Callable[[str], str]) -> Op:
    """`op` with every input/output name (and its op_role_var) passed through `rename`."""
    attrs = copy.deepcopy(op.attrs)
    if OP_ROLE_VAR_ATTR in attrs:
        attrs[OP_ROLE_VAR_ATTR] = [rename(n) for n in attrs[OP_ROLE_VAR_ATTR]]
    return Op(op.type, {k: [rename(n) for n in v] for k, v in op.inputs.items()},
              {k: [rename(n) for n in v] for k, v in op.outputs.items()}, attrs)


def rename_vars(block: Block, renames: dict[str, str]) -> None:
    """Rename vars of `block` (old -> new) in their declarations and in every op of the block."""
    for old, new in renames.items():
        var = block.vars.pop(old)
        var.name = new
        block.add_var(var)
    for op in block.ops:
        for slots in (op.inputs, op.outputs):
            for names in slots.values():
                names[:] = [renames.get(n, n) for n in names]


def last_writers(block: Block) -> dict[str, int]:
    """Var name -> index of the last op of `block` that writes it."""
    return {name: i for i, op in enumerate(block.ops) for name in op.output_arg_names}


def last_writer(block: Block, name: str) -> int:
    index = last_writers(block).get(name)
    if index is None:
        raise ValueError(f"block {block.idx}: no op writes {name!r}")
    return index


def referenced_names(program: Program) -> set[str]:
    return {n for b in program.blocks for op in b.ops
            for n in op.input_arg_names + op.output_arg_names}


def remove_ops(block: Block, ops: list[Op]) -> None:
    doomed = {id(op) for op in ops}
    block.ops = [op for op in block.ops if id(op) not in doomed]


def prune_unreachable_blocks(program: Program) -> None:
    """Drop the blocks no op of a kept block refers to (transitively from block 0), and renumber
    the rest, their parents and every block reference."""
    keep, todo = {0}, [0]
    while todo:
        for op in program.blocks[todo.pop()].ops:
            for ref in op.sub_block_refs():
                if ref.idx not in keep:
                    keep.add(ref.idx)
                    todo.append(ref.idx)
    new_index = {old: new for new, old in enumerate(sorted(keep))}
    program.blocks = [b for b in program.blocks if b.idx in keep]
    for block in program.blocks:
        block.idx = new_index[block.idx]
        block.parent_idx = new_index.get(block.parent_idx, -1)
        for op in block.ops:
            for key, value in op.attrs.items():
                if isinstance(value, BlockRef):
                    op.attrs[key] = BlockRef(new_index[value.idx])
                elif isinstance(value, list) and value and isinstance(value[0], BlockRef):
                    op.attrs[key] = [BlockRef(new_index[r.idx]) for r in value]
    program.current_block_idx = 0


def append_every_k_steps(program: Program, startup: Program, counter: str, k: int,
                         body: Callable[[Block], None], role: OpRole) -> None:
    """Append ops to block 0 that run `body`'s ops once every `k` steps.

    A persistable int64 step counter `counter` (0 at startup) and its limit ``<counter>@K`` (k)
    are declared in both programs; each step raises the counter, and when it reaches k a
    `conditional_block` resets it to 0 and runs the sub-block that `body` fills.
    """
    limit = counter + "@K"
    for prog in (program, startup):
        for name in (counter, limit):
            prog.global_block().create_var(name, shape=(1,), dtype="int64", persistable=True,
                                           stop_gradient=True)
    for name, value in ((counter, 0), (limit, k)):
        startup.global_block().append_op("fill_constant", {}, {"Out": [name]},
                                         {"shape": [1], "dtype": "int64", "value": float(value),
                                          "force_cpu": True})
    main = program.global_block()
    attrs = {"op_role": int(role)}
    wait, go = counter + "@WAIT", counter + "@GO"
    for name in (wait, go):
        main.create_var(name, shape=(1,), dtype="bool", stop_gradient=True)
    main.append_op("increment", {"X": [counter]}, {"Out": [counter]}, {"step": 1.0, **attrs})
    main.append_op("less_than", {"X": [counter], "Y": [limit]}, {"Out": [wait]}, {"axis": -1, **attrs})
    main.append_op("logical_not", {"X": [wait]}, {"Out": [go]}, dict(attrs))
    sub = program.create_block(0)
    program.current_block_idx = 0
    sub.append_op("fill_constant", {}, {"Out": [counter]},
                  {"shape": [1], "dtype": "int64", "value": 0.0, "force_cpu": True, **attrs})
    body(sub)
    reads = _outer(sub, "inputs")
    writes = _outer(sub, "outputs")
    main.append_op("conditional_block", {"Cond": [go], "Input": reads}, {"Out": writes},
                   {"sub_block": BlockRef(sub.idx), "is_scalar_condition": True, **attrs})


def _outer(block: Block, side: str) -> list[str]:
    """Names the ops of `block` read (or write) that are declared outside it, in first-use order."""
    seen: list[str] = []
    for op in block.ops:
        for name in op.input_arg_names if side == "inputs" else op.output_arg_names:
            if not block.has_var(name) and name not in seen:
                seen.append(name)
    return seen
