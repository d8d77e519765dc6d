"""Building one pserver's program (docs/transpiler.md §7).

Block 0 declares everything the server holds (its param blocks, the merged grad blocks, in sync
mode every trainer's copy, accumulators, learning-rate vars) and runs one op, `listen_and_serv`:
its X lists the vars trainers send here, ``Fanin`` how many trainers there are,
``grad_to_block_id`` (``"grad:block"``) which block applies which (merged) grad, and
``distributed_mode`` when: in sync mode, once every trainer's send_barrier is in, the LR block
(``lr_decay_block_id``) and then the other ``optimize_blocks``; otherwise a grad's block as soon
as it arrives. The blocks:

- an LR block (parent 0) with the learning-rate ops, when there are any; each
  `conditional_block` sub-block is cloned into a child block of it; in async modes the step
  counter's `increment` becomes a `sum` of the trainers' counters (see `trainer`);
- one optimize block per param block placed here, in program order of the optimizer ops, all
  with the same parent (the last block made before them): sync mode with several trainers
  first `sum`s the trainers' copies into the merged grad and `scale`s it by 1/trainers; then
  the param's clip and weight-decay ops, then (DC-ASGD) the delay compensation, then the update
  op, then the param's post-update ops (Adam's beta-pow `scale`s), all renamed to the block;
- the distributed table's blocks (see `lookup_table`);
- one empty optimize block when there is nothing else (Paddle issue 13073).

Renaming: the param and its grad take their block names; an accumulator keeps its name with
the block's shape (the name gets ``.block{i}`` only when this server holds several blocks of the
param, so that each has its own); the param's temporaries get the same suffix rule.
Empty optional input slots are copied as empty (the original indexed ``[0]`` into every slot).

DC-ASGD (async): before the update op, ``ref_by_trainer_id`` picks ``<param block>.trainer_{i}_bak``
by the int64 var ``@TRAINER_ID@``, which the runtime sets to the id of the trainer whose
grad is being applied; the runtime also copies the param block into that trainer's bak var when
it serves the trainer a `recv` of it.

What the runtime reads of all this is `listen_and_serv`'s attributes (see `contract`): among
them ``trainer_copies`` (which trainer sends which copy) and ``fanin_scale_ops`` (the `scale`
after each `sum` of the copies), so that it neither parses names nor matches op patterns.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..ir import Block, BlockRef, Op, OpRole, Program, Var, VarType
from ..lr import LR_COUNTER
from .analysis import is_optimizer_op
from .config import DistributedMode
from .contract import TRAINER_ID_VAR, bak_name, pair_entries, staleness_attr
from .edit import clone_var, copy_op
from .lookup_table import TableBlocks, build_table_blocks, table_rows_per_pserver
from .modes import policy_of
from .plan import DistVar, Plan, trainer_copy

FANIN_SCALE_OP = 1
"""In sync mode with several trainers, op 1 of a param's optimize block is the `scale` that
averages the trainers' copies (op 0 is their `sum`; see `build_param_block`)."""
_NOT_ACCUMULATORS = ("Param", "Grad", "LearningRate")


@dataclass(frozen=True)
class PlacedVar:
    """A var a pserver holds for the trainers' program: a param block or an accumulator."""

    name: str
    origin: str
    kind: str
    endpoint: str
    index: int
    row_offset: int
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "origin": self.origin, "kind": self.kind,
                "endpoint": self.endpoint, "index": self.index, "row_offset": self.row_offset,
                "shape": list(self.shape)}


def slice_renames(plan: Plan, d: DistVar, i: int, several: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    """origin name -> (pserver name, shape) for every var the ops of param block i touch."""
    origin = plan.origin.global_block()
    param, pblock, gblock = origin.var(d.param), d.params[i], d.grads[i]
    ops = plan.section.ops_of(d.param)
    accumulators = {n for slot, names in plan.section.optimizer_op(d.param).inputs.items()
                    if slot not in _NOT_ACCUMULATORS for n in names}
    written = {n for op in ops for n in op.output_arg_names}
    suffix = f".block{i}" if several else ""
    renames = {d.param: (pblock.name, pblock.shape), d.grad: (gblock.name, gblock.shape)}
    for name in (n for op in ops for n in op.input_arg_names + op.output_arg_names):
        var = _origin_var(plan, name)
        if name in renames:
            continue
        if name in accumulators or (name in written and not var.persistable):
            shape = pblock.shape if var.shape == param.shape else var.shape
            renames[name] = (name + suffix, shape)
        else:
            renames[name] = (name, var.shape)
    return renames


def _origin_var(plan: Plan, name: str) -> Var:
    var = plan.origin.global_block().find_var_recursive(name)
    if var is None:
        raise ValueError(f"program: var {name!r} used by an optimize op is not declared")
    return var


def ordered_blocks(plan: Plan, endpoint: str) -> list[tuple[DistVar, int, bool]]:
    """(pair, block index, several blocks of it here) in program order of the update ops."""
    here = plan.on(endpoint)
    order = {pg.param: n for n, pg in enumerate(plan.section.params_grads)}
    counts = Counter(d.param for d, _ in here)
    return [(d, i, counts[d.param] > 1) for d, i in sorted(here, key=lambda t: (order[t[0].param], t[1]))]


def placed_vars(plan: Plan, endpoint: str) -> list[PlacedVar]:
    """The param blocks, accumulators (none in geo mode) and table rows `endpoint` holds, with
    their origin and first row."""
    out = _table_rows(plan, endpoint)
    for d, i, several in ordered_blocks(plan, endpoint):
        block = d.params[i]
        out.append(PlacedVar(block.name, d.param, "Param", endpoint, i, block.row_offset, block.shape))
        if plan.mode is DistributedMode.GEO:
            continue
        renames = slice_renames(plan, d, i, several)
        opt = plan.section.optimizer_op(d.param)
        for slot, names in opt.inputs.items():
            for name in names if slot not in _NOT_ACCUMULATORS else ():
                new, shape = renames[name]
                sliced = shape == block.shape and d.is_split
                out.append(PlacedVar(new, name, "Optimizer", endpoint, i if sliced else 0,
                                     block.row_offset if sliced else 0, shape))
    return out


def _table_rows(plan: Plan, endpoint: str) -> list[PlacedVar]:
    if plan.table is None:
        return []
    k = plan.cluster.pserver_index(endpoint)
    shape = plan.origin.global_block().var(plan.table).shape
    rows = table_rows_per_pserver(shape[0], len(plan.cluster.pservers))
    return [PlacedVar(plan.table, plan.table, "Table", endpoint, k, k * rows, (rows,) + shape[1:])]


# -- blocks ----------------------------------------------------------------------------------------

def _declare_received(gblock: Block, plan: Plan, endpoint: str) -> list[str]:
    """Param and grad blocks of this server; returns the vars trainers send to it."""
    origin = plan.origin.global_block()
    received = []
    here = plan.on(endpoint)
    for d, i in here:
        clone_var(gblock, origin.var(d.param), name=d.params[i].name, shape=d.params[i].shape,
                  persistable=True, is_parameter=False, stop_gradient=False)
    for d, i in here:
        grad, block = origin.var(d.grad), d.grads[i]
        clone_var(gblock, grad, name=block.name, shape=block.shape, persistable=True)
        copies = [plan.sent_name(block.name, t) for t in range(plan.cluster.trainers)] \
            if plan.per_trainer_grads else [block.name]
        for name in copies:
            clone_var(gblock, grad, name=name, shape=block.shape, persistable=name == block.name)
        received += copies
    return received


def _clone_ops(program: Program, target: Block, source: Block, ops: list[Op]) -> None:
    """Copy `ops` of `source` into `target`, their sub-blocks into new children of `target`."""
    for op in ops:
        for name in op.input_arg_names + op.output_arg_names:
            local = source.idx != 0 and source.has_var(name)
            var = source.find_var_recursive(name)
            if var is None:
                raise ValueError(f"program: var {name!r} of op {op.type!r} is not declared")
            clone_var(target if local else program.global_block(), var)
        new = copy_op(op, str)
        target.ops.append(new)
        for key, ref in [(k, v) for k, v in new.attrs.items() if isinstance(v, BlockRef)]:
            sub = program.create_block(target.idx)
            origin_sub = source.program.block(ref.idx)
            _clone_ops(program, sub, origin_sub, origin_sub.ops)
            new.attrs[key] = BlockRef(sub.idx)


def build_lr_block(program: Program, plan: Plan) -> tuple[int, list[str]]:
    """The LR block (parent 0), or -1; and the per-trainer step counters it sums (async)."""
    if not plan.section.lr_ops:
        return -1, []
    block = program.create_block(0)
    counters: list[str] = []
    for op in plan.section.lr_ops:
        if not plan.sync and op.type == "increment" and op.input("X") == [LR_COUNTER]:
            counters = _sum_trainer_counters(block, plan)
        else:
            _clone_ops(program, block, plan.origin.global_block(), [op])
    return block.idx, counters


def _sum_trainer_counters(block: Block, plan: Plan) -> list[str]:
    gblock = block.program.global_block()
    counter = plan.origin.global_block().var(LR_COUNTER)
    clone_var(gblock, counter)
    names = [trainer_copy(LR_COUNTER, t) for t in range(plan.cluster.trainers)]
    for name in names:
        clone_var(gblock, counter, name=name)
    block.append_op("sum", {"X": names}, {"Out": [LR_COUNTER]}, {"op_role": int(OpRole.LRSched)})
    return names


def build_param_block(program: Program, plan: Plan, d: DistVar, i: int, several: bool,
                      parent: int) -> Block:
    gblock = program.global_block()
    block = program.create_block(parent)
    renames = slice_renames(plan, d, i, several)
    for name, (target, shape) in renames.items():
        clone_var(gblock, _origin_var(plan, name), name=target, shape=shape, is_parameter=False)
    merged, pname = d.grads[i].name, d.params[i].name
    role = {"op_role": int(OpRole.Optimize), "op_role_var": [pname, merged]}
    if plan.per_trainer_grads:
        copies = [plan.sent_name(merged, t) for t in range(plan.cluster.trainers)]
        block.append_op("sum", {"X": copies}, {"Out": [merged]}, dict(role))
        block.append_op("scale", {"X": [merged]}, {"Out": [merged]},
                        {"scale": 1.0 / plan.cluster.trainers, "bias": 0.0,
                         "bias_after_scale": True, **role})
    for op in plan.section.ops_of(d.param):
        new = copy_op(op, lambda n: renames[n][0])
        if is_optimizer_op(op) and plan.config.enable_dc_asgd:
            new.inputs["Grad"] = [_append_dc_asgd(block, plan, pname, new.input("Grad")[0])]
        block.ops.append(new)
    return block


def _append_dc_asgd(block: Block, plan: Plan, param: str, grad: str) -> str:
    """g + g*g*(w - w_bak): the delay-compensated grad (Zheng et al., 2017)."""
    gblock = block.program.global_block()
    pvar = gblock.var(param)
    gblock.create_var(TRAINER_ID_VAR, shape=(1,), dtype="int64")
    baks = [bak_name(param, t) for t in range(plan.cluster.trainers)]
    for name in baks:
        clone_var(gblock, pvar, name=name, persistable=True)
    tmp = [f"{param}@DC_ASGD.tmp_{n}" for n in range(5)]
    for name in tmp:  # the optimize block's own: they live only while it runs
        clone_var(block, pvar, name=name, persistable=False)
    role = {"op_role": int(OpRole.Optimize)}
    block.append_op("ref_by_trainer_id", {"X": baks, "TrainerId": [TRAINER_ID_VAR]},
                    {"Out": [tmp[0]]}, dict(role))
    block.append_op("elementwise_sub", {"X": [param], "Y": [tmp[0]]}, {"Out": [tmp[1]]}, dict(role))
    block.append_op("elementwise_mul", {"X": [tmp[1]], "Y": [grad]}, {"Out": [tmp[2]]}, dict(role))
    block.append_op("elementwise_mul", {"X": [tmp[2]], "Y": [grad]}, {"Out": [tmp[3]]}, dict(role))
    block.append_op("elementwise_add", {"X": [grad], "Y": [tmp[3]]}, {"Out": [tmp[4]]}, dict(role))
    return tmp[4]


def dc_asgd_baks(plan: Plan, endpoint: str) -> list[tuple[str, str]]:
    """(param block, bak var) of every DC-ASGD backup `endpoint` holds."""
    if not plan.config.enable_dc_asgd:
        return []
    return [(d.params[i].name, bak_name(d.params[i].name, t))
            for d, i in plan.on(endpoint) for t in range(plan.cluster.trainers)]


# -- the program -----------------------------------------------------------------------------------

def build_pserver_program(plan: Plan, endpoint: str) -> Program:
    """The program `endpoint` runs (docs/transpiler.md §7)."""
    pserver_id = plan.cluster.pserver_index(endpoint)
    program = Program()
    program.random_seed = plan.origin.random_seed
    received = _declare_received(program.global_block(), plan, endpoint)
    lr_block, counters = build_lr_block(program, plan)
    parent = program.num_blocks - 1
    optimize, grad_to_block, sparse = [lr_block] if lr_block >= 0 else [], [], []
    copies: list[tuple[str, int]] = []
    scales: list[str] = []
    for d, i, several in ordered_blocks(plan, endpoint):
        block = build_param_block(program, plan, d, i, several, parent)
        optimize.append(block.idx)
        grad_to_block.append(f"{d.grads[i].name}:{block.idx}")
        if d.grad_type is VarType.SELECTED_ROWS:
            sparse.append(f"{d.grads[i].name}:{d.params[i].name}")
        if plan.per_trainer_grads:
            copies += [(plan.sent_name(d.grads[i].name, t), t) for t in range(plan.cluster.trainers)]
            scales.append(f"{block.idx}:{FANIN_SCALE_OP}")
    table = build_table_blocks(program, plan, endpoint, parent) if plan.table else None
    if table is not None:
        optimize.append(table.optimize_block)
        grad_to_block.append(table.grad_to_block_id)
        sparse.append(table.sparse_grad_to_param)
        received += table.received
        copies += table.trainer_copies
    if not optimize:
        optimize.append(program.create_block(program.num_blocks - 1).idx)
    attrs = listen_and_serv_attrs(plan, endpoint, pserver_id, optimize, grad_to_block, sparse,
                                  lr_block, table)
    attrs.update(trainer_copies=pair_entries(copies), fanin_scale_ops=scales)
    program.global_block().append_op("listen_and_serv", {"X": received + counters}, {}, attrs)
    program.current_block_idx = 0
    return program


def listen_and_serv_attrs(plan: Plan, endpoint: str, pserver_id: int, optimize: list[int],
                  grad_to_block: list[str], sparse: list[str], lr_block: int,
                  table: TableBlocks | None) -> dict[str, object]:
    """The attributes of `listen_and_serv` (see `contract`); no trainer copies and no fan-in
    scales, which `build_pserver_program` adds in sync mode. Bounded-staleness async adds
    ``staleness`` (`contract.staleness_attr`)."""
    attrs: dict[str, object] = {
        "optimize_blocks": [BlockRef(i) for i in optimize],
        "endpoint": endpoint,
        "pserver_id": pserver_id,
        "Fanin": plan.cluster.trainers,
        "distributed_mode": int(plan.mode),
        "grad_to_block_id": grad_to_block,
        "sparse_grad_to_param": sparse,
        "lr_decay_block_id": lr_block,
        "prefetch_var_name_to_block_id": table.prefetch_var_name_to_block_id if table else [],
        "checkpint_block_id": table.checkpoint_block_id if table else -1,
        "dc_asgd": plan.config.enable_dc_asgd,
        "policy": policy_of(plan.mode, plan.config.enable_dc_asgd, plan.config.staleness),
        "trainer_copies": [],
        "fanin_scale_ops": [],
        **plan.server.listen_and_serv_attrs(),
        "op_role": int(OpRole.RPC),
    }
    if plan.config.staleness is not None:
        attrs["staleness"] = staleness_attr(plan.config.staleness)
    return attrs
