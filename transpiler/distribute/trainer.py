"""Rewriting the trainer program (docs/transpiler.md §6).

The trainer keeps forward and backward and loses every optimize and learning-rate op (and the
vars only they used): the pservers update the parameters. Global-norm clipping's ops stay (they
need every gradient, which only the trainer has), re-roled Backward as the original did, so each
grad is sent clipped. In place of the rest it gets, in order:

1. after the last op writing each grad: `split_byref` (dense) or `split_selected_rows` (sparse)
   when the grad is cut in blocks, then a `send` of the blocks (``epmap`` one endpoint per
   block); with ``runtime_split_send_recv`` the `send` takes the whole grad and the block
   ``sections`` and ``send_varnames`` instead, and the runtime cuts it;
2. sync: one `send_barrier` after all sends (``half_async`` False); with ``config.half_async``
   and ``runtime_split_send_recv`` (as in the original, not with half_async alone): a
   `send_barrier` with ``half_async`` True, which only waits for this trainer's own sends to
   leave;
3. one `recv` per parameter into its blocks (after the barrier in sync mode, after that grad's
   send otherwise); sync: a `fetch_barrier`; then a `concat` (axis 0) per cut parameter.

What the ops mean to a runtime:

- `send`: send ``X[i]`` to ``epmap[i]``; with ``send_varnames``, cut ``X[0]`` into ``sections``
  rows and send piece i as ``send_varnames[i]``; with ``merge_add`` the pserver adds the value
  into its var instead of replacing it; with ``compress`` (``topk``, ``fp16``, ``int8``; top-k
  keeping ``compress_ratio`` of the values) pack each piece with error feedback, the receiver
  getting the dense gradient back (`config.compression`; only a dense grad's send has them).
- `recv`: fetch ``Out[i]`` from ``epmap[i]``; with ``recv_varnames``, fetch those and concatenate
  them (axis 0) into ``Out[0]``.
- `send_barrier` / `fetch_barrier`: tell every pserver of ``endpoints`` that this trainer's sends
  / fetches of the step are done (``half_async``: only wait until this trainer's sends left).
- `split_byref` / `split_selected_rows`: cut along rows by ``sections`` / ``height_sections``
  (selected rows re-based to the first row of their section).

Every RPC op carries ``trainer_id`` and the endpoints it talks to, so a runtime can tag requests,
count fan-in per step, and drop or re-admit a trainer without guessing (docs/transpiler.md §10).
Send and barrier ops write RAW control vars (``@SEND@<grad>``, ``@SEND_BARRIER@``) that order them;
`fetch_barrier` lists the received params as outputs, as in the original, so that nothing reads
them before it.
"""

from __future__ import annotations

from collections import defaultdict

from ..clip import is_global_norm_clip_op
from ..ir import Block, Op, OpRole, Program, VarType
from ..lr import LR_COUNTER
from .analysis import is_lr_op, is_optimize_op
from .config import compression_settings
from .edit import (clone_var, control_var, last_writers, prune_unreachable_blocks,
                   referenced_names, remove_ops, rename_vars, rpc_attrs)
from .lookup_table import (append_table_grad_send, replace_remote_sparse_lookups,
                           replace_table_lookups)
from .plan import DistVar, Plan, trainer_copy

SEND_BARRIER = "@SEND_BARRIER@"


def strip_optimize_ops(program: Program) -> None:
    """Remove the optimize and LR ops, the blocks only they ran, and the vars only they used."""
    block = program.global_block()
    doomed = [op for op in block.ops if is_optimize_op(op) or is_lr_op(op)]
    used_before = {n for op in doomed for n in op.input_arg_names + op.output_arg_names}
    remove_ops(block, doomed)
    prune_unreachable_blocks(program)
    still_used = referenced_names(program)
    for name in sorted(used_before - still_used):
        if block.has_var(name) and not block.var(name).is_parameter:
            block.remove_var(name)


def keep_global_norm_clip(block: Block) -> None:
    """The global-norm clipping ops the trainer keeps run as backward ops: the gradients they
    clip are the ones it sends."""
    for op in block.ops:
        if is_global_norm_clip_op(op):
            op.attrs["op_role"] = int(OpRole.Backward)


def sent_grad_names(plan: Plan, d: DistVar) -> list[str]:
    return [plan.sent_name(g.name) for g in d.grads]


def _declare_slices(block: Block, origin: str, names: list[str],
                    shapes: list[tuple[int, ...]]) -> None:
    var = block.var(origin)
    for name, shape in zip(names, shapes):
        clone_var(block, var, name=name, shape=shape, persistable=False, is_parameter=False)


def _grad_send_ops(block: Block, plan: Plan, d: DistVar, grad: str) -> tuple[list[Op], str]:
    """The split (if any) and the send of one grad (now named `grad`), and the send's
    control var."""
    names = sent_grad_names(plan, d)
    runtime_split = plan.config.runtime_split_send_recv
    ops = []
    if d.is_split and not runtime_split:
        _declare_slices(block, d.grad, names, [g.shape for g in d.grads])
        sparse = d.grad_type is VarType.SELECTED_ROWS
        ops.append(Op("split_selected_rows" if sparse else "split_byref", {"X": [grad]},
                      {"Out": names},
                      {"height_sections" if sparse else "sections": [g.shape[0] for g in d.grads],
                       "op_role": int(OpRole.Dist)}))
    done = control_var(block, f"@SEND@{d.grad}")
    ops.append(Op("send", {"X": [grad] if runtime_split or not d.is_split else names},
                  {"Out": [done]},
                  rpc_attrs(epmap=[g.endpoint for g in d.grads],
                            sections=[g.shape[0] for g in d.grads] if runtime_split else [],
                            send_varnames=names if runtime_split else [],
                            trainer_id=plan.cluster.trainer_id, op_role_var=[d.param, grad],
                            **_compression_attrs(plan, d))))
    return ops, done


def _compression_attrs(plan: Plan, d: DistVar) -> dict[str, object]:
    """The send's ``compress`` and ``compress_ratio`` when the config compresses and the grad
    is dense (a SelectedRows grad is sparse already); none otherwise, so that a program without
    compression is the same as before it existed."""
    method, ratio = compression_settings(plan.config)
    if method == "none" or d.grad_type is VarType.SELECTED_ROWS:
        return {}
    return {"compress": method, "compress_ratio": ratio}


def insert_grad_sends(block: Block, plan: Plan) -> dict[str, str]:
    """Step 1 for every grad, in dispatch order: a grad kept whole is renamed to the name it is
    sent under, and its split and send go right after its last writer. Returns grad -> the
    send's control var."""
    renames = {d.grad: sent_grad_names(plan, d)[0] for d in plan.dist_vars if not d.is_split}
    rename_vars(block, {old: new for old, new in renames.items() if old != new})
    writers = last_writers(block)
    after: dict[int, list[Op]] = defaultdict(list)
    sends = {}
    for d in plan.dist_vars:
        grad = renames.get(d.grad, d.grad)
        if grad not in writers:
            raise ValueError(f"program: no op writes the grad {grad!r} of {d.param!r}")
        ops, sends[d.grad] = _grad_send_ops(block, plan, d, grad)
        after[writers[grad]] += ops
    block.ops = [new for i, op in enumerate(block.ops) for new in [op] + after.get(i, [])]
    return sends


def sends_lr_counter(plan: Plan) -> bool:
    return not plan.sync and any(op.type == "increment" and op.input("X") == [LR_COUNTER]
                                 for op in plan.section.lr_ops)


def append_lr_counter_send(block: Block, plan: Plan) -> list[str]:
    """Async with LR ops: send this trainer's step (a constant 1, filled by its startup) to
    every pserver with ``merge_add``: the pserver adds it into its copy for this trainer and its
    LR block sums the copies into the global step (docs/transpiler.md §6.7)."""
    if not sends_lr_counter(plan):
        return []
    mine = trainer_copy(LR_COUNTER, plan.cluster.trainer_id)
    block.create_var(mine, shape=(1,), dtype="int64", persistable=True, stop_gradient=True)
    done = control_var(block, f"@SEND@{LR_COUNTER}")
    pservers = list(plan.cluster.pservers)
    block.append_op("send", {"X": [mine] * len(pservers)}, {"Out": [done]},
                    rpc_attrs(epmap=pservers, sections=[], send_varnames=[], merge_add=True,
                              trainer_id=plan.cluster.trainer_id, op_role_var=[mine, mine]))
    return [done]


def append_send_barrier(block: Block, plan: Plan, sends: list[str]) -> str | None:
    # the original appends the local barrier only when the sends are split at run time too
    half_async = (not plan.sync and plan.config.half_async
                  and plan.config.runtime_split_send_recv)
    if not (plan.sync or half_async):
        return None
    control_var(block, SEND_BARRIER)
    block.append_op("send_barrier", {"X": sends}, {"Out": [SEND_BARRIER]},
                    rpc_attrs(endpoints=list(plan.cluster.pservers),
                              trainer_id=plan.cluster.trainer_id, half_async=half_async))
    return SEND_BARRIER


def append_recv(block: Block, plan: Plan, d: DistVar, after: str) -> list[str]:
    """One recv of a parameter's blocks; returns the vars it writes."""
    runtime_split = plan.config.runtime_split_send_recv
    slices = [p.name for p in d.params]
    outputs = [d.param] if runtime_split else slices
    if d.is_split and not runtime_split:
        _declare_slices(block, d.param, slices, [p.shape for p in d.params])
    grad_role = d.grad if d.is_split else sent_grad_names(plan, d)[0]
    block.append_op("recv", {"X": [after]}, {"Out": outputs},
                    rpc_attrs(epmap=[p.endpoint for p in d.params],
                              recv_varnames=slices if runtime_split else [],
                              trainer_id=plan.cluster.trainer_id,
                              op_role_var=[d.param, grad_role]))
    return outputs


def append_fetch_barrier(block: Block, plan: Plan, barrier: str, received: list[str]) -> None:
    block.append_op("fetch_barrier", {"X": [barrier]}, {"Out": received},
                    rpc_attrs(endpoints=list(plan.cluster.pservers),
                              trainer_id=plan.cluster.trainer_id))


def append_concat(block: Block, d: DistVar) -> None:
    block.append_op("concat", {"X": [p.name for p in d.params]}, {"Out": [d.param]},
                    {"axis": 0, "op_role": int(OpRole.Dist)})


def recv_and_merge(block: Block, plan: Plan, sends: dict[str, str], barrier: str | None,
                   fetched: list[DistVar]) -> None:
    """Steps 3 and 4: recv every fetched parameter, fetch_barrier (sync), concat."""
    received: list[str] = []
    for d in fetched:
        received += append_recv(block, plan, d, barrier or sends[d.grad])
    if plan.sync:
        assert barrier is not None
        append_fetch_barrier(block, plan, barrier, received)
    if not plan.config.runtime_split_send_recv:
        for d in fetched:
            if d.is_split:
                append_concat(block, d)


def rewrite_trainer(plan: Plan) -> Program:
    """The trainer program of `plan` (docs/transpiler.md §6), built from a copy of the origin."""
    program = plan.origin.clone()
    block = program.global_block()
    strip_optimize_ops(program)
    keep_global_norm_clip(block)
    sends = insert_grad_sends(block, plan)
    extra = [append_table_grad_send(block, plan)] if plan.table else []
    extra += append_lr_counter_send(block, plan)
    barrier = append_send_barrier(block, plan, list(sends.values()) + extra)
    fetched = [d for d in plan.in_param_order() if d.param not in plan.remote_sparse]
    recv_and_merge(block, plan, sends, barrier, fetched)
    if plan.table:
        replace_table_lookups(block, plan)
    replace_remote_sparse_lookups(block, plan, set(plan.remote_sparse))
    return program
