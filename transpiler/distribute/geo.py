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
"""

from __future__ import annotations

from ..ir import Block, OpRole, Program, VarType
from .edit import append_every_k_steps, clone_var, control_var, rpc_attrs
from .plan import DistVar, Plan
from .pserver import listen_and_serv_attrs, ordered_blocks
from .startup import build_trainer_startup

GEO_STEP = "@GEO_STEP@"


def old_name(param: str) -> str:
    return f"{param}@GEO_OLD"


def delta_name(name: str) -> str:
    return f"{name}.delta"


def _is_sparse(d: DistVar) -> bool:
    return d.grad_type is VarType.SELECTED_ROWS


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
