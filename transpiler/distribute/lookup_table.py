"""Embeddings served by the pservers: the distributed lookup table and remote sparse update.

Both lookups count: `lookup_table` and `lookup_table_v2` (Paddle's ``fluid.embedding``, whose
Out keeps the ids' trailing 1); the ops that stand in for a lookup (`merge_ids`,
`distributed_lookup_table`) carry ``lookup_table_version``, the lookup's type, so that their Out
is shaped as the lookup's was, as the original's `distributed_lookup_table` did.

**Distributed lookup table** (an embedding with ``is_distributed``; one such table per
program). The table never lives on a trainer. Pserver k owns the global ids
``[k*R, (k+1)*R)`` with ``R = ceil(rows / pservers)``: its table var has R rows (type
SELECTED_ROWS; global id i is row ``i - k*R``, k being ``listen_and_serv``'s ``pserver_id``) and
is initialized by the table's own initializer at shape [R, dim]; on the trainer the
initializer becomes `fake_init`. Ids and grad rows travel as global ids.

- Trainer: the table's lookups become prefetch chains, `split_ids` (ids by owner, attr
  ``height_sections``) -> `prefetch` (one request per pserver, ``epmap``) -> `merge_ids`
  (rows back in the order of the ids): one chain for every lookup of the table, at the first
  lookup's place, as the original fused and placed them from 1.1 on (each lookup's ids an
  input of `split_ids` and `merge_ids`, each out an output of `merge_ids`), or later where a
  later lookup's ids are written after that place; where the lookups differ in
  ``padding_idx`` or type or an out is read before that point, one chain per lookup, in its
  place. The table's grad goes through `split_ids` into one
  SELECTED_ROWS piece per pserver and one `send` (``<grad>.trainer_{t}.pserver_{k}`` in sync
  mode, ``<grad>.pserver_{k}`` otherwise).
- Pserver: a table-optimize block (sync: `sum` of the trainers' pieces; then `sgd` at the
  table optimizer's learning rate: as in the original, the table runs plain SGD whatever the
  dense optimizer is, and the pieces are summed, not averaged; the runtime averages them, see
  `runtime.execution.table`), one prefetch block per chain (`lookup_sparse_table`, in 2.x's
  programs `lookup_sparse_table_read`, of the ids var ``prefetch_var_name_to_block_id``
  names), and a checkpoint block (`save` of the table to the
  file named by the RAW var ``kLookupTablePath``, which the runtime fills when a checkpoint
  notification comes). The pserver's blocks work on rows of its table var: the runtime turns
  the global ids it receives (prefetch ids, grad rows) into rows, and the prefetch op's
  ``padding_idx`` is the padding id's row on this pserver, or -1 where it holds none.

**Remote sparse update** (an ``is_sparse`` embedding whose `lookup_table` has
``remote_prefetch``, or a sparse `nce` with ``remote_prefetch``): the table is cut and placed
like any parameter, but the trainer never fetches it: its lookups become a
`distributed_lookup_table` (in the 1.8 and 2.x programs one for all of them, after the last op
writing their ids), which splits the ids by ``height_sections``, asks ``endpoints[i]`` for rows
``id - offset_i`` of var ``table_names[i]``, and puts the rows back in order in each lookup's
output; in the 1.2 programs each lookup stays a `lookup_table` in its place, with those
attributes (``epmap`` for ``endpoints``), and the runtime serves it the same way; an `nce`
keeps its place and gets those attributes, and the trainer fetches the rows of its true and
sampled classes before it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Block, Op, OpRole, Program, VarType, grad_name
from ..opcatalog import LOOKUPS, REMOTE_PREFETCH_SLOTS, optimizer_types
from .analysis import OptimizeSection, is_optimizer_op
from .config import PADDLE_VERSION_2X, DistributeTranspilerConfig
from .edit import clone_var, control_var, copy_op, last_writer, rpc_attrs
from .plan import Plan

CHECKPOINT_PATH_VAR = "kLookupTablePath"
# The table's pserver runs sgd; the catalog marks the update ops (first-order steps) it may
# stand in for.
TABLE_OPTIMIZERS = frozenset(optimizer_types(table=True))


def find_distributed_table(program: Program) -> str | None:
    """The one table looked up with ``is_distributed``; ValueError if there are several or if
    the table is also looked up without it."""
    lookups = [op for op in program.global_block().ops if op.type in LOOKUPS]
    tables = sorted({op.input("W")[0] for op in lookups if op.attr("is_distributed")})
    if len(tables) > 1:
        raise ValueError(f"program: only one distributed lookup table is supported, found {tables}")
    if not tables:
        return None
    if any(op.input("W") == tables and not op.attr("is_distributed") for op in lookups):
        raise ValueError(f"program: table {tables[0]!r} is looked up both with and without "
                         "is_distributed")
    if any(op.type == "nce" and op.input("Weight") == tables for op in program.global_block().ops):
        raise ValueError(f"program: nce reads the distributed lookup table {tables[0]!r} as its "
                         "weight, which never lives on a trainer; give nce a weight of its own "
                         "(remote_prefetch fetches only the rows it samples)")
    return tables[0]


def remote_prefetch_ops(program: Program) -> list[tuple[Op, str]]:
    """The ops of `program` marked ``remote_prefetch``, each with its table: in the pserver
    modes but geo, a trainer fetches the rows they read from the pservers."""
    return [(op, op.input(REMOTE_PREFETCH_SLOTS[op.type])[0])
            for op in program.global_block().ops
            if op.type in REMOTE_PREFETCH_SLOTS and op.attr("remote_prefetch")]


def remote_sparse_params(program: Program, section: OptimizeSection) -> set[str]:
    """Params whose lookups are marked ``remote_prefetch``; they must be sparse, not
    distributed, and trained."""
    trained = {pg.param for pg in section.params_grads}
    table = find_distributed_table(program)
    params = set()
    for op, w in remote_prefetch_ops(program):
        if not op.attr("is_sparse") or op.attr("is_distributed") or w not in trained \
                or w == table:
            raise ValueError(f"program: {op.type} of {w!r} has remote_prefetch, which needs "
                             "is_sparse, no is_distributed (nor the distributed lookup table), "
                             "and an optimizer for the table")
        params.add(w)
    return params


def check_table_optimizer(section: OptimizeSection, table: str) -> None:
    op = section.optimizer_op(table)
    if op.type not in TABLE_OPTIMIZERS:
        raise ValueError(f"program: distributed lookup table {table!r} is optimized by "
                         f"{op.type!r}; the table's pserver runs sgd at the optimizer's learning "
                         f"rate, which can stand in only for {sorted(TABLE_OPTIMIZERS)}")


def table_rows_per_pserver(rows: int, pservers: int) -> int:
    """R: the rows of the table var on each pserver."""
    return math.ceil(rows / pservers)


def table_sections(rows: int, pservers: int) -> list[int]:
    """Ids each pserver owns: R of them, the last pservers fewer (or none)."""
    per = table_rows_per_pserver(rows, pservers)
    return [max(0, min(per, rows - k * per)) for k in range(pservers)]


def table_grad_pieces(plan: Plan, trainer_id: int) -> list[str]:
    assert plan.table is not None
    grad = grad_name(plan.table)
    prefix = f"{grad}.trainer_{trainer_id}" if plan.sync else grad
    return [f"{prefix}.pserver_{k}" for k in range(len(plan.cluster.pservers))]


@dataclass(frozen=True)
class Lookup:
    """Prefetch chain j of the distributed table: the lookups it stands in for (their ids and
    outs, in program order) and the names of its per-pserver prefetch vars: one chain for
    every lookup of the table, or one per lookup where they cannot share one
    (`table_lookups`)."""

    index: int
    ids: tuple[str, ...]
    outs: tuple[str, ...]
    padding_idx: int
    version: str
    """The lookups' op type, `lookup_table` or `lookup_table_v2`."""

    def ids_piece(self, table: str, k: int) -> str:
        return f"{table}.prefetch_ids_{self.index}.pserver_{k}"

    def rows_piece(self, table: str, k: int) -> str:
        return f"{table}.prefetch_rows_{self.index}.pserver_{k}"

    def declare_pieces(self, block: Block, origin: Block, table: str, k: int) -> None:
        """Declare pserver k's ids and rows pieces in `block`, shaped as they travel: a column
        of ids, [-1, 1], and a row of the table per id (whatever the lookup's own shapes). A
        fused chain's pieces are LoD vars, whatever its ids: they hold the ids of several
        lookups of an example, so the bounds on what a pserver takes count them as a
        sequence's (`runtime.services.inbound`)."""
        ids, out = origin.var(self.ids[0]), origin.var(self.outs[0])
        width = tuple(origin.var(table).shape[1:])
        lod = max(ids.lod_level, 1) if len(self.ids) > 1 else ids.lod_level
        clone_var(block, ids, name=self.ids_piece(table, k), shape=(-1, 1), lod_level=lod)
        clone_var(block, out, name=self.rows_piece(table, k), shape=(-1,) + width, lod_level=lod)


def _lookup_ops(ops: list[Op], table: str) -> list[Op]:
    return [op for op in ops if op.type in LOOKUPS and op.input("W") == [table]]


def fusion_point(ops: list[Op], lookups: list[Op], at_first: bool = False
                 ) -> tuple[int, list[str]]:
    """Where one op standing in for all of `lookups` goes once they are taken out of `ops`:
    right after the last op that writes any of their ids (at the top where none does), as the
    1.8 original placed a remote-prefetch table's `distributed_lookup_table`; with `at_first`,
    at the first lookup's place, as the original (1.1 to 1.8) put a distributed table's fused
    prefetch chain, or later where a later lookup's ids are written after that place (its chain
    would have read them unwritten there). Also the outs of `lookups` that an op before that
    point already reads, in the lookups' order (none where the place serves them all)."""
    ids = {op.input("Ids")[0] for op in lookups}
    rest = [op for op in ops if all(op is not lookup for lookup in lookups)]
    at = 1 + max((i for i, op in enumerate(rest) if ids & set(op.output_arg_names)), default=-1)
    if at_first:  # no lookup of the group precedes the first: its index is the same in `rest`
        at = max(at, min(i for i, op in enumerate(ops) if any(op is old for old in lookups)))
    read = {name for op in rest[:at] for name in op.input_arg_names}
    return at, [op.output("Out")[0] for op in lookups if op.output("Out")[0] in read]


def fused_position(ops: list[Op], lookups: list[Op]) -> int | None:
    """The place of the distributed table's one prefetch chain for `lookups`: `fusion_point`
    with `at_first`, or None when an op before it reads one of the outs."""
    at, early = fusion_point(ops, lookups, at_first=True)
    return None if early else at


def _fusable(block: Block, lookups: list[Op]) -> bool:
    """One chain can serve all `lookups`: they agree on padding, type and the ids' trailing
    dims (their ids are cut together), and fit in one place."""
    return (len({int(op.attr("padding_idx", -1)) for op in lookups}) == 1
            and len({op.type for op in lookups}) == 1
            and len({tuple(block.var(op.input("Ids")[0]).shape[1:]) for op in lookups}) == 1
            and fused_position(block.ops, lookups) is not None)


def table_lookups(program: Program, table: str) -> list[Lookup]:
    """The prefetch chains of `table`: one for all its lookups when they can share it (the
    same ``padding_idx`` and type, and no out read before the chain's place,
    `fused_position`), else one per lookup."""
    ops = _lookup_ops(program.global_block().ops, table)
    if ops and _fusable(program.global_block(), ops):
        groups = [ops]
    else:
        groups = [[op] for op in ops]
    return [Lookup(j, tuple(op.input("Ids")[0] for op in group),
                   tuple(op.output("Out")[0] for op in group),
                   int(group[0].attr("padding_idx", -1)), group[0].type)
            for j, group in enumerate(groups)]


def fuses_lookups(plan: Plan) -> bool:
    """Whether a remote-prefetch table's lookups share one `distributed_lookup_table` (1.8 and
    2.x; 1.2's transpiler left each in its place), docs/transpiler.md §6."""
    return plan.config.paddle_version != "1.2"


# -- trainer ---------------------------------------------------------------------------------------

def replace_table_lookups(block: Block, plan: Plan) -> None:
    """The table's lookups become split_ids -> prefetch -> merge_ids chains (`table_lookups`):
    a lone lookup's chain takes its place, a fused chain the first lookup's, or later where
    a later lookup's ids are written after it (`fused_position`)."""
    assert plan.table is not None
    table, pservers = plan.table, list(plan.cluster.pservers)
    sections = table_sections(block.var(table).shape[0], len(pservers))
    for lookup in table_lookups(plan.origin, table):
        ops = [op for op in block.ops if op.type in LOOKUPS and op.output("Out")[0] in lookup.outs]
        at = block.ops.index(ops[0]) if len(ops) == 1 else fused_position(block.ops, ops)
        if at is None:
            raise ValueError(f"program: no place for one prefetch chain of table {table!r}")
        ids = [lookup.ids_piece(table, k) for k in range(len(pservers))]
        rows = [lookup.rows_piece(table, k) for k in range(len(pservers))]
        for k in range(len(pservers)):
            lookup.declare_pieces(block, block, table, k)
        block.ops[:] = [op for op in block.ops if all(op is not old for old in ops)]
        block.ops[at:at] = [
            Op("split_ids", {"Ids": list(lookup.ids)}, {"Out": ids}, {"height_sections": sections}),
            Op("prefetch", {"X": ids}, {"Out": rows},
               {"epmap": pservers, "trainer_id": plan.cluster.trainer_id}),
            Op("merge_ids", {"Ids": list(lookup.ids), "Rows": ids, "X": rows},
               {"Out": list(lookup.outs)}, {"lookup_table_version": lookup.version}),
        ]


def append_table_grad_send(block: Block, plan: Plan) -> str:
    """split_ids + send of the table's grad after its last writer; returns the send's control var."""
    assert plan.table is not None
    grad = grad_name(plan.table)
    pieces = table_grad_pieces(plan, plan.cluster.trainer_id)
    for name in pieces:
        clone_var(block, block.var(grad), name=name)
    sections = table_sections(block.var(plan.table).shape[0], len(pieces))
    done = control_var(block, f"@SEND@{grad}")
    index = last_writer(block, grad) + 1
    block.ops[index:index] = [
        Op("split_ids", {"Ids": [grad]}, {"Out": pieces},
           {"height_sections": sections, "op_role": int(OpRole.Dist)}),
        Op("send", {"X": pieces}, {"Out": [done]},
           rpc_attrs(epmap=list(plan.cluster.pservers), sections=[], send_varnames=[],
                     trainer_id=plan.cluster.trainer_id, op_role_var=[plan.table, grad])),
    ]
    return done


def replace_remote_sparse_lookups(block: Block, plan: Plan, params: set[str]) -> None:
    """The lookups of each remote-sparse table become one `distributed_lookup_table` in the
    1.8 and 2.x programs (`remote_lookup_groups`), right after the last op writing any of
    their ids (`fusion_point`; a ValueError naming the out read before that point, as the
    original raised there); in the 1.2 programs each lookup keeps its place and type, and gets
    the blocks' ``epmap``, ``table_names``, ``height_sections`` and ``trainer_id``, as 1.2's
    `_update_remote_sparse_update_op` gave it (the runtime asks for its rows by id:
    `transpiler.opcatalog.runs_rpc`). An `nce` of one gets the same attributes in every
    release: the trainer then prefetches the rows of the classes it samples before the op
    runs (`runtime.services.trainer`)."""
    for op in block.ops:
        if op.type == "nce" and op.input("Weight")[0] in params:
            d = plan.dist_var(op.input("Weight")[0])
            op.attrs.update({"epmap": [p.endpoint for p in d.params],
                             "table_names": [p.name for p in d.params],
                             "height_sections": [p.shape[0] for p in d.params],
                             "trainer_id": plan.cluster.trainer_id})
    if not fuses_lookups(plan):  # 1.2: each lookup stays, told where the table's blocks are
        for op in block.ops:
            if op.type in LOOKUPS and op.input("W")[0] in params:
                d = plan.dist_var(op.input("W")[0])
                op.attrs.update({"epmap": [p.endpoint for p in d.params],
                                 "table_names": [p.name for p in d.params],
                                 "height_sections": [p.shape[0] for p in d.params],
                                 "trainer_id": plan.cluster.trainer_id})
        return
    for group in remote_lookup_groups(block.ops, params):
        first, table = group[0], group[0].input("W")[0]
        at, early = fusion_point(block.ops, group)
        block.ops[:] = [op for op in block.ops if all(op is not old for old in group)]
        if early:
            raise ValueError(
                f"program: {early[0]!r}, the Out of a lookup of remote-prefetch table {table!r}, "
                "is read before the last op writing the ids of the table's lookups; the one "
                "distributed_lookup_table serving them all goes after that op, so compute "
                "every ids var of the table before reading any of its lookups' outs")
        d = plan.dist_var(table)
        block.ops.insert(at, Op(
            "distributed_lookup_table",
            {"Ids": [op.input("Ids")[0] for op in group], "W": [table]},
            {"Outputs": [op.output("Out")[0] for op in group]},
            {"table_names": [p.name for p in d.params],
             "height_sections": [p.shape[0] for p in d.params],
             "endpoints": [p.endpoint for p in d.params],
             "padding_idx": first.attr("padding_idx", -1),
             "trainer_id": plan.cluster.trainer_id,
             "lookup_table_version": first.type}))


def remote_lookup_groups(ops: list[Op], params: set[str]) -> list[list[Op]]:
    """The lookups of the remote-sparse tables `params` that one `distributed_lookup_table`
    serves (1.8, 2.x), in program order of their first: all the lookups of a table that share
    its first lookup's type and ``padding_idx`` (the op carries one of each; the original fused
    the first's type only, leaving other lookups unreplaced, and gave them all the first's
    padding)."""
    groups: dict[tuple[str, str, int], list[Op]] = {}
    for op in ops:
        if op.type in LOOKUPS and op.input("W")[0] in params:
            key = (op.input("W")[0], op.type, int(op.attr("padding_idx", -1)))
            groups.setdefault(key, []).append(op)
    return list(groups.values())


def fake_init_table(startup: Program, table: str) -> Op:
    """The trainer holds no table: its initializer leaves `startup`; returns the `fake_init`
    (same shape and dtype) that stands in for it, for the caller to append."""
    block = startup.global_block()
    inits = [i for i, op in enumerate(block.ops) if table in op.output_arg_names]
    if len(inits) != 1:
        raise ValueError(f"startup_program: table {table!r} needs exactly one initializer, "
                         f"found {len(inits)}")
    old = block.ops.pop(inits[0])
    return Op("fake_init", {}, {"Out": [table]},
              {"shape": old.attr("shape"), "dtype": old.attr("dtype", "float32")})


# -- pserver ---------------------------------------------------------------------------------------

@dataclass
class TableBlocks:
    """What the table adds to a pserver's `listen_and_serv`."""

    optimize_block: int
    received: list[str]
    grad_to_block_id: str
    sparse_grad_to_param: str
    prefetch_var_name_to_block_id: list[str]
    checkpoint_block_id: int
    trainer_copies: list[tuple[str, int]]
    """Sync mode: each trainer's grad piece and the trainer (`contract`'s ``trainer_copies``)."""


def build_table_blocks(program: Program, plan: Plan, endpoint: str, parent: int) -> TableBlocks:
    """The table-optimize block (parent `parent`), then its prefetch and checkpoint blocks."""
    assert plan.table is not None
    table, k = plan.table, plan.cluster.pserver_index(endpoint)
    gblock, origin = program.global_block(), plan.origin.global_block()
    var = origin.var(table)
    rows = table_rows_per_pserver(var.shape[0], len(plan.cluster.pservers))
    clone_var(gblock, var, shape=(rows,) + var.shape[1:], type=VarType.SELECTED_ROWS,
              persistable=True, is_parameter=False)
    block = program.create_block(parent)
    grad, received = _table_grad(block, plan, table, k)
    lr = _table_lr(block, plan, table)
    block.append_op("sgd", {"Param": [table], "Grad": [grad], "LearningRate": [lr]},
                    {"ParamOut": [table]},
                    {"op_role": int(OpRole.Optimize), "op_role_var": [table, grad]})
    prefetch = [_prefetch_block(program, plan, table, lookup, k, block.idx)
                for lookup in table_lookups(plan.origin, table)]
    copies = list(zip(received, range(plan.cluster.trainers))) if plan.sync else []
    return TableBlocks(block.idx, received, f"{grad}:{block.idx}", f"{grad}:{table}",
                       prefetch, _checkpoint_block(program, table, block.idx), copies)


def _table_grad(block: Block, plan: Plan, table: str, k: int) -> tuple[str, list[str]]:
    """The grad the table's sgd reads, and the pieces the trainers send this pserver."""
    gblock = block.program.global_block()
    grad_var = plan.origin.global_block().var(grad_name(table))
    pieces = [table_grad_pieces(plan, t)[k] for t in range(plan.cluster.trainers)] \
        if plan.sync else [table_grad_pieces(plan, 0)[k]]
    for name in pieces:
        clone_var(gblock, grad_var, name=name, persistable=not plan.sync)
    if not plan.sync:
        return pieces[0], pieces
    clone_var(gblock, grad_var, persistable=True)
    block.append_op("sum", {"X": pieces}, {"Out": [grad_var.name]},
                    {"op_role": int(OpRole.Optimize)})
    return grad_var.name, pieces


def _table_lr(block: Block, plan: Plan, table: str) -> str:
    """The table optimizer's learning rate, with the table's own ops that compute it (a
    per-parameter learning-rate scale)."""
    gblock, origin = block.program.global_block(), plan.origin.global_block()
    lr = plan.section.optimizer_op(table).input("LearningRate")[0]
    for op in plan.section.ops_of(table):
        if lr in op.output_arg_names and not is_optimizer_op(op):
            for name in op.input_arg_names + op.output_arg_names:
                clone_var(gblock, origin.var(name))
            block.ops.append(copy_op(op, str))
    clone_var(gblock, origin.var(lr))
    return lr


def _prefetch_block(program: Program, plan: Plan, table: str, lookup: Lookup, k: int,
                    parent: int) -> str:
    gblock, origin = program.global_block(), plan.origin.global_block()
    ids, rows = lookup.ids_piece(table, k), lookup.rows_piece(table, k)
    lookup.declare_pieces(gblock, origin, table, k)
    block = program.create_block(parent)
    per = gblock.var(table).shape[0]
    block.append_op(prefetch_block_op(plan.config), {"Ids": [ids], "W": [table]}, {"Out": [rows]},
                    {"is_sparse": True, "is_distributed": True,
                     "padding_idx": local_padding_idx(lookup.padding_idx, k * per, per)})
    return f"{ids}:{block.idx}"


def prefetch_block_op(config: DistributeTranspilerConfig) -> str:
    """The op type of a prefetch block's lookup: `lookup_sparse_table`, which 2.x's programs
    call `lookup_sparse_table_read` (``paddle_version`` "2.x"; the same kernel)."""
    return "lookup_sparse_table_read" if config.paddle_version == PADDLE_VERSION_2X \
        else "lookup_sparse_table"


def local_padding_idx(padding_idx: int, offset: int, rows: int) -> int:
    """The row of the shard holding ids ``[offset, offset + rows)`` that the padding id
    `padding_idx` is, or -1 when that shard does not hold it (or there is none)."""
    return padding_idx - offset if padding_idx >= 0 and offset <= padding_idx < offset + rows else -1


def _checkpoint_block(program: Program, table: str, parent: int) -> int:
    program.global_block().create_var(CHECKPOINT_PATH_VAR, type=VarType.RAW, persistable=True)
    block = program.create_block(parent)
    block.append_op("save", {"X": [table]}, {}, {"file_path": "none"})
    return block.idx
