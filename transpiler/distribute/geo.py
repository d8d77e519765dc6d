"""Geo-SGD (docs/transpiler.md §8): trainers train locally and push parameter deltas now and then.

Each trainer keeps its whole program (forward, backward, optimizer, LR ops) and the last
parameter values it pulled, ``<param>@GEO_OLD``. Every ``geo_sgd_need_push_nums`` steps a
`conditional_block` (see `edit.append_every_k_steps`, counter ``@GEO_STEP@``) runs, per parameter:

- dense: ``delta = (param - param@GEO_OLD) * (1/trainers)`` (`elementwise_sub`, `scale`);
- sparse (its grad is SELECTED_ROWS): `sparse_delta` (X=param, Y=param@GEO_OLD, attr
  ``scale``) writes a SELECTED_ROWS var with only the rows where X and Y differ, each
  ``(X - Y) * scale``: rows no step touched are not pushed;
- the delta is cut like the parameter (``<block>.delta``) and sent to the blocks' pservers,
  then the parameter is pulled back (`recv`, `concat`) and copied into ``param@GEO_OLD``.

A pserver holds its param blocks; its optimize block for block ``b`` is
``sum(b, b.delta) -> b``, keyed ``b.delta`` in ``grad_to_block_id`` (sparse deltas also in
``sparse_grad_to_param``), and ``distributed_mode`` is GEO. The trainer's startup fetches the
parameters from the pservers like any trainer's, then fills ``@GEO_OLD``.

``distribute_update_vars``: an op whose kernel updates parameters itself, without an optimizer
op (Paddle's ``pyramid_hash``, whose gradient kernel writes its own table), names them in this
comma-separated string attribute. As in the original's ``_get_distribute_update_vars``, each
named var becomes a ``(var, var)`` pair after the optimizer ops' pairs, so geo pushes its
delta and pulls it back like any parameter's (`with_distribute_update_vars`). Every op of every
block is read; names are taken in the order they first appear (the original's went through a
set, in no fixed order) and a var that has an optimizer op already keeps its one pair. A name
that is not a persistable var of the global block is an error, and so is the attribute in the
other pserver modes, which have no pserver op to apply such a var.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import Block, OpRole, Program, VarType
from .analysis import OptimizeSection, ParamGrad
from .config import DistributedMode
from .edit import append_every_k_steps, clone_var, control_var, rpc_attrs
from .plan import DistVar, Plan
from .pserver import listen_and_serv_attrs, ordered_blocks
from .startup import build_trainer_startup

GEO_STEP = "@GEO_STEP@"
UPDATE_VARS_ATTR = "distribute_update_vars"


def old_name(param: str) -> str:
    return f"{param}@GEO_OLD"


def delta_name(name: str) -> str:
    return f"{name}.delta"


def _is_sparse(d: DistVar) -> bool:
    return d.grad_type is VarType.SELECTED_ROWS


def with_distribute_update_vars(section: OptimizeSection, program: Program,
                                mode: DistributedMode) -> OptimizeSection:
    """`section` with a ``(var, var)`` pair for each var an op's ``distribute_update_vars``
    names that has no pair yet (GEO only; see the module's docstring)."""
    named = [(op.type, name.strip()) for block in program.blocks for op in block.ops
             for name in str(op.attr(UPDATE_VARS_ATTR) or "").split(",") if name.strip()]
    if not named:
        return section
    if mode is not DistributedMode.GEO:
        raise ValueError(f"program: op {named[0][0]!r} names {UPDATE_VARS_ATTR} "
                         f"{named[0][1]!r}, which only geo_sgd_mode pushes (the mode is "
                         f"{mode.name})")
    pairs, paired = list(section.params_grads), {pg.param for pg in section.params_grads}
    for op_type, name in named:
        var = program.global_block().vars.get(name)
        if var is None or not var.persistable:
            raise ValueError(f"program: op {op_type!r} names {UPDATE_VARS_ATTR} {name!r}, "
                             f"which is {'no var' if var is None else 'not persistable'} in the "
                             "global block; it must name parameters")
        if name not in paired:
            paired.add(name)
            pairs.append(ParamGrad(name, name))
    return replace(section, params_grads=tuple(pairs))


def rewrite_geo_trainer(plan: Plan) -> tuple[Program, Program]:
    """The geo trainer's main and startup programs."""
    trainer = plan.origin.clone()
    startup = build_trainer_startup(plan, plan.in_param_order(), lr_counter=False,
                                    optimizes_locally=True)
    main, sblock = trainer.global_block(), startup.global_block()
    for d in plan.dist_vars:
        param = main.var(d.param)
        for block in (main, sblock):
            clone_var(block, param, name=old_name(d.param), persistable=True, is_parameter=False)
        sblock.append_op("assign", {"X": [d.param]}, {"Out": [old_name(d.param)]})
    append_every_k_steps(trainer, startup, GEO_STEP, plan.config.geo_sgd_need_push_nums,
                         lambda sub: _push_and_pull(sub, plan), OpRole.Dist)
    return trainer, startup


def _push_and_pull(sub: Block, plan: Plan) -> None:
    sends = {d.param: _push_delta(sub, plan, d) for d in plan.dist_vars}
    for d in plan.in_param_order():
        _pull(sub, plan, d, sends[d.param])


def _push_delta(sub: Block, plan: Plan, d: DistVar) -> str:
    main = sub.program.global_block()
    param, delta = main.var(d.param), delta_name(d.param)
    kind = VarType.SELECTED_ROWS if _is_sparse(d) else VarType.LOD_TENSOR
    clone_var(main, param, name=delta, type=kind, persistable=False, is_parameter=False)
    scale = 1.0 / plan.cluster.trainers
    role = {"op_role": int(OpRole.Dist)}
    if _is_sparse(d):
        sub.append_op("sparse_delta", {"X": [d.param], "Y": [old_name(d.param)]}, {"Out": [delta]},
                      {"scale": scale, **role})
    else:
        sub.append_op("elementwise_sub", {"X": [d.param], "Y": [old_name(d.param)]},
                      {"Out": [delta]}, {"axis": -1, **role})
        sub.append_op("scale", {"X": [delta]}, {"Out": [delta]},
                      {"scale": scale, "bias": 0.0, "bias_after_scale": True, **role})
    pieces = [delta_name(p.name) for p in d.params]
    if d.is_split:
        for p, name in zip(d.params, pieces):
            clone_var(main, param, name=name, shape=p.shape, type=kind, persistable=False,
                      is_parameter=False)
        split = "split_selected_rows" if _is_sparse(d) else "split_byref"
        sections = "height_sections" if _is_sparse(d) else "sections"
        sub.append_op(split, {"X": [delta]}, {"Out": pieces},
                      {sections: [p.shape[0] for p in d.params], **role})
    done = control_var(main, f"@SEND@{delta}")
    sub.append_op("send", {"X": pieces}, {"Out": [done]},
                  rpc_attrs(epmap=[p.endpoint for p in d.params], sections=[], send_varnames=[],
                            trainer_id=plan.cluster.trainer_id, op_role_var=[d.param, delta]))
    return done


def _pull(sub: Block, plan: Plan, d: DistVar, after: str) -> None:
    main = sub.program.global_block()
    slices = [p.name for p in d.params]
    for p in d.params if d.is_split else ():
        clone_var(main, main.var(d.param), name=p.name, shape=p.shape, persistable=False,
                  is_parameter=False)
    sub.append_op("recv", {"X": [after]}, {"Out": slices},
                  rpc_attrs(epmap=[p.endpoint for p in d.params], recv_varnames=[],
                            trainer_id=plan.cluster.trainer_id))
    if d.is_split:
        sub.append_op("concat", {"X": slices}, {"Out": [d.param]},
                      {"axis": 0, "op_role": int(OpRole.Dist)})
    sub.append_op("assign", {"X": [d.param]}, {"Out": [old_name(d.param)]},
                  {"op_role": int(OpRole.Dist)})


def build_geo_pserver_program(plan: Plan, endpoint: str) -> Program:
    """The program of the pserver at `endpoint` in geo mode."""
    program = Program()
    program.random_seed = plan.origin.random_seed
    gblock, origin = program.global_block(), plan.origin.global_block()
    optimize, grad_to_block, sparse, received = [], [], [], []
    for d, i, _ in ordered_blocks(plan, endpoint):
        block_var, delta = d.params[i], delta_name(d.params[i].name)
        kind = VarType.SELECTED_ROWS if _is_sparse(d) else VarType.LOD_TENSOR
        clone_var(gblock, origin.var(d.param), name=block_var.name, shape=block_var.shape,
                  persistable=True, is_parameter=False, stop_gradient=False)
        clone_var(gblock, origin.var(d.param), name=delta, shape=block_var.shape, type=kind,
                  persistable=False, is_parameter=False)
        block = program.create_block(0)
        block.append_op("sum", {"X": [block_var.name, delta]}, {"Out": [block_var.name]},
                        {"op_role": int(OpRole.Optimize)})
        optimize.append(block.idx)
        grad_to_block.append(f"{delta}:{block.idx}")
        received.append(delta)
        if _is_sparse(d):
            sparse.append(f"{delta}:{block_var.name}")
    if not optimize:
        optimize.append(program.create_block(0).idx)
    program.current_block_idx = 0
    pserver_id = plan.cluster.pserver_index(endpoint)
    gblock.append_op("listen_and_serv", {"X": received}, {},
                     listen_and_serv_attrs(plan, endpoint, pserver_id, optimize, grad_to_block,
                                           sparse, -1, None))
    return program
