"""Startup programs of the distributed roles (docs/transpiler.md, sections 6.8 and 7).

- Trainer: the original startup (so every var a trainer computes with is created) less the
  initializers of the distributed table's accumulators (the original's trainer startup kept
  the dense parameters', in 1.2 as in 1.8), less the distributed table's initializer, then a
  `recv` of every parameter's blocks from the pservers, a `fetch_barrier` and a `concat` per
  cut parameter, so that all trainers start from the pservers' values, and last the table's
  `fake_init`, where the original's `get_trainer_program` appended it.
- Pserver: the original initializers of the vars this server holds, in the original order, each
  writing the server's block of the var with its ``shape`` attribute set to the block's shape;
  then the async step-counter copies (the sum of the copies starts at the counter's own start
  value, carried by trainer 0's copy, so the first step sees the same step as local training),
  and, with DC-ASGD, an `assign` of each param block into every trainer's backup.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from ..ir import Op, OpRole, Program, Var
from ..lr import LR_COUNTER
from .edit import clone_var, control_var, copy_op, rpc_attrs
from .lookup_table import fake_init_table
from .plan import DistVar, Plan, trainer_copy
from .pserver import PlacedVar, dc_asgd_baks, placed_vars

INIT_OPS = ("fill_constant", "uniform_random", "gaussian_random", "truncated_gaussian_random",
            "assign_value")
FETCH_BARRIER = "@FETCH_BARRIER@"


def build_trainer_startup(plan: Plan, params: Iterable[DistVar], lr_counter: bool,
                          optimizes_locally: bool = False) -> Program:
    """The trainer's startup: original initializers, then fetch `params` from the pservers;
    `lr_counter` adds this trainer's constant step (async LR, see `trainer`). A trainer that
    does not run the optimizer itself (`optimizes_locally` False; geo's does) loses the
    initializers of the optimizer's own state."""
    startup = plan.startup.clone()
    block = startup.global_block()
    if not optimizes_locally:
        drop_optimizer_state(startup, pserver_state_ops(plan))
    # tables the trainer only reads rows of from the pservers (the distributed table, the
    # remote-sparse ones) are neither fetched nor initialized here: a `fake_init` stands in
    remote = sorted(plan.remote_sparse)
    fake_inits = [fake_init_table(startup, t) for t in remote]
    if plan.table is not None:
        fake_inits.append(fake_init_table(startup, plan.table))
    params = [d for d in params if d.param not in plan.remote_sparse]
    for d in params:
        for p in d.params if d.is_split else ():
            clone_var(block, plan.origin.global_block().var(d.param), name=p.name, shape=p.shape,
                      persistable=False, is_parameter=False)
        block.append_op("recv", {"X": []}, {"Out": [p.name for p in d.params]},
                        rpc_attrs(epmap=[p.endpoint for p in d.params], recv_varnames=[],
                                  trainer_id=plan.cluster.trainer_id))
    block.append_op("fetch_barrier", {}, {"Out": [control_var(block, FETCH_BARRIER)]},
                    rpc_attrs(endpoints=list(plan.cluster.pservers),
                              trainer_id=plan.cluster.trainer_id))
    for d in params:
        if d.is_split:
            block.append_op("concat", {"X": [p.name for p in d.params]}, {"Out": [d.param]},
                            {"axis": 0, "op_role": int(OpRole.Dist)})
    if lr_counter:
        mine = trainer_copy(LR_COUNTER, plan.cluster.trainer_id)
        block.create_var(mine, shape=(1,), dtype="int64", persistable=True)
        block.append_op("fill_constant", {}, {"Out": [mine]},
                        {"shape": [1], "dtype": "int64", "value": 1.0, "force_cpu": True})
    block.ops.extend(fake_inits)
    return startup


def pserver_state_ops(plan: Plan) -> list[Op]:
    """The optimize ops whose accumulators leave the trainer's startup: the distributed
    table's (docs/transpiler.md §6, item 8)."""
    return list(plan.section.ops_of(plan.table)) if plan.table is not None else []


def optimizer_state(optimize_ops: Iterable[Op]) -> set[str]:
    """What the optimize ops read besides their (param, grad) pairs and learning rates: the
    accumulators (moments, beta powers, ...).

    DESIGN: the original's ``need_delete_optimize_vars`` also names the learning rate, yet its
    own acceptance case for a plain SGD model keeps the learning rate's ``fill_constant`` in
    the trainer's startup (docs/transpiler.md §6, item 8), and that case is this transpiler's
    contract; a trainer never reads the var, so keeping its initializer costs one scalar."""
    ops = list(optimize_ops)
    kept = {name for op in ops for name in [*op.role_var, *op.input("LearningRate")]}
    return {name for op in ops for name in op.input_arg_names} - kept


def drop_optimizer_state(startup: Program, optimize_ops: Iterable[Op]) -> None:
    """Delete from `startup` every op that writes optimizer state, and those vars."""
    state = optimizer_state(optimize_ops)
    block = startup.global_block()
    block.ops = [op for op in block.ops if not state.intersection(op.output_arg_names)]
    for name in state:
        block.vars.pop(name, None)


def build_pserver_startup(plan: Plan, endpoint: str, pserver_program: Program) -> Program:
    """The startup of the pserver at `endpoint`, whose main program is `pserver_program`."""
    startup = Program()
    startup.random_seed = plan.startup.random_seed
    block = startup.global_block()
    held = pserver_program.global_block().vars
    for var in held.values():
        clone_var(block, var)
    placed = {pv.name: pv for pv in placed_vars(plan, endpoint)}
    targets: dict[str, list[str]] = defaultdict(list)
    for name in held:
        targets[placed[name].origin if name in placed else name].append(name)
    for op in plan.startup.global_block().ops:
        block.ops += _initializers_of(op, targets, held, block.vars)
    _mark_slices(block.ops, placed, plan.startup.global_block().vars)
    block.ops += _counter_inits(plan, held)
    for param, bak in dc_asgd_baks(plan, endpoint):
        block.append_op("assign", {"X": [param]}, {"Out": [bak]})
    return startup


def _initializers_of(op: Op, targets: dict[str, list[str]], held: dict[str, Var],
                     declared: dict[str, Var]) -> list[Op]:
    """Copies of startup `op` writing each var of this server it initializes."""
    outs = set(op.output_arg_names)
    if len(outs) != 1 or not all(n in declared for n in op.input_arg_names):
        return []
    (origin,) = outs
    copies = []
    for name in targets.get(origin, []):
        new = copy_op(op, lambda n: name if n == origin else n)
        if op.type in INIT_OPS:
            new.attrs["shape"] = list(held[name].shape)
        copies.append(new)
    return copies


def _mark_slices(ops: list[Op], placed: dict[str, PlacedVar], origins: dict[str, Var]) -> None:
    """Random initializers (and `assign_value`, which carries the whole var's values) of a
    block say which rows of which var they draw (``origin_name``, ``origin_shape``,
    ``row_offset``), so the runtime draws exactly the rows that the whole var's initializer
    would: a sliced job starts from the same values as local training. A
    block is any var held at another shape or offset than its origin's, whatever its name: a
    param block, an accumulator of one, or a shard of the distributed table (which keeps the
    table's name; the last shard may run past the table's last row)."""
    for op in ops:
        name = op.output_arg_names[0] if op.output_arg_names else ""
        pv = placed.get(name)
        if op.type in INIT_OPS[1:] and pv is not None and pv.origin in origins \
                and (pv.row_offset or tuple(pv.shape) != tuple(origins[pv.origin].shape)):
            op.attrs.update(origin_name=pv.origin, origin_shape=list(origins[pv.origin].shape),
                            row_offset=pv.row_offset)


def _counter_inits(plan: Plan, held: dict[str, Var]) -> list[Op]:
    copies = [trainer_copy(LR_COUNTER, t) for t in range(plan.cluster.trainers)]
    if copies[0] not in held:
        return []
    start = next((op.attr("value", -1.0) for op in plan.startup.global_block().ops
                  if op.output_arg_names == [LR_COUNTER]), -1.0)
    return [Op("fill_constant", {}, {"Out": [name]},
               {"shape": [1], "dtype": "int64", "value": float(start) if t == 0 else 0.0,
                "force_cpu": True})
            for t, name in enumerate(copies)]
