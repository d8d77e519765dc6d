"""The trainer side of a distributed job: RPC ops as requests, and the per-step training loop.

`RpcOps` runs the trainer program's RPC ops over an `RpcClient`:

- `send`: the op's vars, grouped by endpoint (``epmap``), one SEND message per endpoint. Sends
  run in the background; `send_barrier` (and any `recv`) first waits until every one is
  acknowledged, so gradients travel while backward goes on. A send with ``compress`` packs each
  dense block with error feedback (`runtime.network.compression`: the residual of each block
  stays with this trainer, across rewinds too). A trainer that runs another's program (sync
  trainers in one process, `Job.programs_to_run`) sends under its own names (`RpcOps.renames`).
- `send_barrier` / `fetch_barrier`: one request per pserver (``endpoints``), all at once, in the
  ``per_op`` protocol (Paddle's: a message per op). In the ``compact`` and ``bundled``
  protocols the barrier travels on the round's last SEND (last GET) to each pserver instead,
  carrying how many messages of the round it closes and the id of the first (see docs/wire.md);
  a pserver with no such message still gets its own barrier request. A local send barrier
  (half-async) only waits until this trainer's sends have left.
- `recv`: one GET per endpoint for the vars placed there; the values land in the scope when the
  reply comes, and a compute op that reads one waits for it first.
- bundling (the ``bundled`` protocol, the default): a run of send ops (recv ops) makes one SEND
  (GET) per endpoint, which the run's last op to that endpoint sends with the vars the earlier
  ones held back (`BarrierPlan.held`); in a sync step the GET rides on the SEND that carried
  the send barrier (``fetch``), whose reply brings the values (`BarrierPlan.fetches`): a sync
  step is one request and one reply per pserver; in an async step each endpoint's GETs ride on
  the SEND there in the same way, without the fetch barrier.
- `prefetch` (distributed lookup table): one PREFETCH per pserver with the ids `split_ids` cut
  for it; its rows land in the scope like a `recv`'s values, for `merge_ids`.
- `distributed_lookup_table` (remote sparse update): the ids of all the lookups it serves (one
  op per table in the 1.8 and 2.x programs) split by the table's blocks, one PREFETCH per block
  for its rows (each asked once), merged back into each output in the order of its ids; a 1.2
  program's lookup with ``epmap`` (`transpiler.opcatalog.runs_rpc`) is served the same way.
- an `nce` with ``remote_prefetch`` and ``epmap`` (remote sparse update of its weight) is a
  compute op, but before its kernel runs the trainer draws its sample labels and fetches their
  rows the same way (`RpcOps.prefetch_classes`).
- `checkpoint_notify`: once everything sent is in, every pserver saves its state to ``dir``.
- the collective ops of nccl2 and collective modes (`runtime.services.collective`), trainer to
  trainer; `c_allreduce_sum` runs in the background like a `recv`.

Which message carries which barrier, what is bundled, which GET rides on which SEND and which
send barrier is local is the program's plan (`RpcOps.plan`, for the trainer's protocol), which
the transpiler wrote on its RPC ops (`transpiler.distribute.rpc_plan`); the trainer reads it
through `TrainContract` and never works it out from the order of the ops.

Every message carries the trainer's id and step (`INITIAL_STEP` while running the startup
program). A pserver that restarted from a checkpoint answers a message of a step it lost with
``rewind: <step>`` (`Rewind`): the trainer abandons what is in flight, fetches the parameters
again and redoes the steps from there (`TrainerReport.redone` counts them). A trainer that
starts when the job is under way (late, or restarted after a crash) joins it: in sync mode at
the first step every pserver admits it, otherwise at the step after the latest the pservers saw
from it. In timing mode (phantom kernels) the values sent and received are `Phantom`s, cut and
joined by shape alone, and the loss reported is NaN; remote sparse update needs real ids and
is refused there. What the replies mean, where the rounds' barriers start, and where to go on
after a rewind or a drop are decided by `TrainerCore` (`runtime.services.trainer_core`, no IO);
`RpcOps` and `Trainer` carry its actions out. `run_program` runs a block with compute ops through the executor's kernels and RPC
ops awaited, letting the loop turn within a long run of compute ops (`HOLD_LIMIT`: heartbeats
go on); `Trainer.run` is the loop: startup, then `steps` steps on this trainer's shard of each
global batch, reporting loss and step time, then COMPLETE to every pserver and, once answered, BYE.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping

import numpy as np

from transpiler.distribute.contract import PROTOCOLS, BarrierPlan, TrainContract
from transpiler.distribute.rpc_plan import DEFAULT_PROTOCOL
from transpiler.distribute.startup import INIT_OPS
from transpiler.distribute.lookup_table import table_sections
from transpiler.ir import Op, Program
from transpiler.opcatalog import REMOTE_PREFETCH_SLOTS, prefetches_rows

from runtime.execution.compute import Charge, ComputeModel, Tracer, virtual_clock
from runtime.execution.executor import Executor, check_feed, run_step
from runtime.execution.kernels.common import lookup_lead
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.sampling import sample_labels
from runtime.execution.scope import Scope
from runtime.execution.tensor import (LoDTensor, Phantom, SelectedRows, Value, concat_rows,
                                     slice_rows, to_dense)
from runtime.network.compression import Codec, ErrorFeedback
from runtime.network.rpc import RpcClient
from runtime.network.wire import Kind, Message
from runtime.services.collective import Collective, CollectiveOps
from runtime.services.messages import (BYE, COMPLETE, FETCH_BARRIER, HEARTBEAT, SEND_BARRIER,
                                       CheckpointRequest, GetRequest, JoinRequest,
                                       PrefetchRequest, Request, SendRequest, ServerState)
from runtime.services.protocol import INITIAL_STEP, Closes
from runtime.services.trainer_core import BadReply as BadReply
from runtime.services.trainer_core import Dropped as Dropped
from runtime.services.trainer_core import (Fail, GiveUp, JoinAll, Refetch, Train,
                                           TrainerCore)
from runtime.services.trainer_core import Rewind as Rewind
from runtime.services.trainer_core import StepMismatch as StepMismatch

log = logging.getLogger(__name__)


class RpcOps:
    """The RPC ops of one trainer, and the requests they are in flight with."""

    def __init__(self, client: RpcClient, trainer_id: int, charge: Charge | None = None,
                 protocol: str = DEFAULT_PROTOCOL, collective: Collective | None = None,
                 renames: Mapping[str, str] | None = None) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self.protocol = protocol
        self.plan = BarrierPlan()
        """The plan of `protocol` of the programs `learn` was given (`TrainContract`)."""
        self._learned: set[int] = set()
        self.client = client
        self.core = TrainerCore(trainer_id, client.labels)
        """The decisions: what replies mean, the rounds' barriers, where to take part."""
        self.charge = charge or Charge(client.name, None)
        self.trainer_id = trainer_id
        self.renames = renames or {}
        """Var names of the program -> the names its sends put them on the wire under (a
        program shared with another trainer, `Job.programs_to_run`; empty: its own)."""
        self._residual_step: int | None = None
        """The step that owed the RPC residual last (`owe_rpc_residual`)."""
        self._sends: list[asyncio.Future[Message]] = []
        self._unacked: list[asyncio.Future[Message]] = []
        """Bundled protocol: the SENDs of a round whose send barrier they all carried; the GETs
        go out without waiting for their acknowledgements, which the fetch barrier awaits."""
        self.feedback = ErrorFeedback()
        """The residuals of the gradient blocks sent compressed, by wire name."""
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.handlers: dict[str, Callable[[Op, Scope], Awaitable[None]]] = {
            "send": self.send, "send_barrier": self.send_barrier, "recv": self.recv,
            "fetch_barrier": self.fetch_barrier, "prefetch": self.prefetch,
            "distributed_lookup_table": self.distributed_lookup_table,
            "lookup_table": self.remote_lookup, "lookup_table_v2": self.remote_lookup,
            "checkpoint_notify": self.checkpoint_notify, "c_allreduce_sum": self.allreduce,
        }
        self.collective: Collective = collective or CollectiveOps(client, client.policy.deadline)
        """The collective ops' backend: the ring over `client`'s transport unless given."""
        self.handlers.update(self.collective.handlers())

    @property
    def step(self) -> int:
        """The step this trainer's requests carry (`TrainerCore.step`)."""
        return self.core.step

    @step.setter
    def step(self, step: int) -> None:
        self.core.begin_step(step)

    @property
    def server_state(self) -> dict[str, ServerState]:
        """Endpoint -> what its last fetch reply said of its fan-in."""
        return self.core.server_state

    def learn(self, program: Program) -> None:
        """Take `program`'s plan for this trainer's protocol from its `TrainContract` (once
        per program): where its barriers travel, which messages are bundled, which send
        barriers are local."""
        if id(program) in self._learned:
            return
        self._learned.add(id(program))
        found = TrainContract.of(program).plan(self.protocol)
        self.plan.carriers.update(found.carriers)
        self.plan.covered.update(found.covered)
        self.plan.held.update(found.held)
        self.plan.fetches.update(found.fetches)
        self.plan.fetched.update(found.fetched)
        self.plan.local |= found.local

    def call(self, endpoint: str, request: Request,
             deadline: float | None = None) -> asyncio.Future[Message]:
        """`request` of this trainer at its current step, sent now; its reply comes in the
        future, which raises `Rewind` when the pserver asks for the steps it lost to be
        redone."""
        return self.client.start(endpoint, request.kind, self.step, request.vars,
                                 request.header(self.trainer_id), deadline, self._check_reply)

    def _closes(self, kind: Kind, endpoint: str, count: int | None) -> Closes | None:
        """The barrier a SEND (GET) to `endpoint`, about to leave, carries (`TrainerCore.closes`)."""
        return self.core.closes(kind, endpoint, self.client.next_id, count)

    async def tell(self, endpoint: str, request: Request) -> None:
        """`request` of this trainer at its current step, wanting no reply (`BYE`)."""
        await self.client.tell(endpoint, request.kind, self.step,
                               request.header(self.trainer_id))

    def _check_reply(self, endpoint: str, reply: Message) -> None:
        """Raise what a reply (or a pending notice) means beyond its answer
        (`TrainerCore.on_reply`): `Rewind` or `Dropped` to give the step up, `StepMismatch`."""
        action = self.core.on_reply(endpoint, reply)
        if action is not None:
            raise action.notice if isinstance(action, GiveUp) else action.error

    def _var(self, endpoint: str, reply: Message, name: str) -> Any:
        """Var `name` of `reply` (to a GET or PREFETCH sent to `endpoint`); `BadReply` if the
        reply does not carry it."""
        try:
            return reply.vars[name]
        except KeyError:
            raise BadReply(f"trainer {self.trainer_id}: the reply of "
                           f"{self.client.labels.get(endpoint, endpoint)} to {reply.id} lacks "
                           f"var {name!r}") from None

    def owe_rpc_residual(self) -> None:
        """Owe the step's share of the event loop's unseen work around RPCs (the model's
        "rpc_step" overhead), once per step, at its first RPC op that waits for an answer
        (`run_block`: not a `SENDING_OPS` one): a step that makes none (geo's local steps) runs
        no loop around requests and owes none.

        DESIGN: charged once the step's requests are out, the work overlaps the pservers' on
        a free core, as a real trainer's loop does while it waits; charged at the first send
        it delayed the requests, and a 1x1 bundled job came out 56% slow (+13% now)."""
        if self._residual_step != self.step:
            self._residual_step = self.step
            self.charge.add_overhead("rpc_step")

    async def run(self, op: Op, scope: Scope) -> None:
        handler = self.handlers.get(op.type)
        if handler is None:
            raise NotImplementedError(f"RPC op {op.type!r} is not supported by this trainer yet")
        await handler(op, scope)

    async def send(self, op: Op, scope: Scope) -> None:
        """One SEND per endpoint. A single X with ``sections`` (async mode: whole grads) is cut
        into its row blocks here; ``merge_add`` asks the server to add into what it holds."""
        names = op.input("X")
        endpoints = op.attr("epmap")
        wire_names = op.attr("send_varnames") or names
        if self.renames:
            wire_names = [self.renames.get(wire, wire) for wire in wire_names]
        values: list[Any] = [scope.get_tensor(n) for n in names]
        if len(names) == 1 and len(endpoints) > 1 and not op.attr("merge_add"):
            values = _row_blocks(_dense(values[0]), op.attr("sections"), op)
        elif len(values) == 1 and len(wire_names) > 1:
            values = values * len(wire_names)
        if not len(values) == len(wire_names) == len(endpoints):
            raise ValueError(f"send op: {len(values)} values, {len(wire_names)} names and "
                             f"{len(endpoints)} endpoints do not line up: {op}")
        codec = op.attr("compress")
        if codec is not None:
            ratio = op.attr("compress_ratio", 1.0)
            values = [self.feedback.compress(wire, value, Codec(codec), ratio)
                      for value, wire in zip(values, wire_names)]
        by_endpoint: dict[str, dict[str, Any]] = defaultdict(dict)
        for value, wire, ep in zip(values, wire_names, endpoints):
            by_endpoint[ep][wire] = value
        merge_add = bool(op.attr("merge_add"))
        carries = self.plan.carriers.get(id(op), {})
        held = self.plan.held.get(id(op), frozenset())
        fetches = self.plan.fetches.get(id(op), {})
        for ep, mine in by_endpoint.items():
            vars = self.core.bundle_send(ep, mine, ep in held)
            if vars is None:
                continue
            fetch = fetches.get(ep)
            future = self.call(ep, SendRequest(
                vars, merge_add, None if fetch is None else fetch.names,
                fetch is not None and fetch.barrier,
                self._closes(Kind.SEND, ep, carries.get(ep))))
            self._sends.append(future)
            if fetch is not None:
                self.core.rides(ep, future, fetch.takers)

    async def flush_sends(self) -> None:
        self.core.sends_left()
        sends, self._sends = self._sends, []
        if sends:
            await asyncio.gather(*sends)

    async def send_barrier(self, op: Op, scope: Scope) -> None:
        """Wait until every send is acknowledged, then a barrier request to each pserver no
        send carried it to. In the bundled protocol, where the sends carried it to every
        pserver, nothing waits: the round's GETs leave at once, and a pserver, which defers
        them until the round's update is done, has taken the sends by then.

        DESIGN: not waiting for the acknowledgements saves a round trip per step and lets a
        pserver take a trainer's SEND and GET in one wake-up."""
        local = id(op) in self.plan.local
        if self.protocol == "bundled" and not local and not self._uncovered(op):
            self.core.sends_left()
            self._unacked += self._sends
            self._sends = []
            self._end_round(Kind.SEND)
            return
        await self.flush_sends()
        self._end_round(Kind.SEND)
        if local:  # only this trainer's sends must have left
            return
        await asyncio.gather(*(self.call(ep, SEND_BARRIER) for ep in self._uncovered(op)))

    def _uncovered(self, op: Op) -> list[str]:
        """The endpoints of barrier `op` that no message of its round carried it to."""
        covered = self.plan.covered.get(id(op), frozenset())
        return [ep for ep in op.attr("endpoints") if ep not in covered]

    def _end_round(self, kind: Kind) -> None:
        """The round of SENDs (GETs) is over: the next such request starts the next one."""
        self.core.end_round(kind)

    async def recv(self, op: Op, scope: Scope) -> None:
        """One GET per endpoint; values land in the scope when the reply comes. A single Out
        with several endpoints (async mode) is fetched block by block and joined here."""
        await self.flush_sends()
        outs = op.output("Out")
        endpoints = op.attr("epmap")
        wire_names = op.attr("recv_varnames") or outs
        loop = asyncio.get_running_loop()
        carries = self.plan.carriers.get(id(op), {})
        fetched = self.plan.fetched.get(id(op), frozenset())
        if len(outs) == 1 and len(endpoints) > 1:
            blocks = list(zip(wire_names, endpoints))
            rode = {i: self.core.ridden(ep) for i, (_, ep) in enumerate(blocks)
                    if ep in fetched}
            self.pending[outs[0]] = loop.create_task(
                self._get_blocks(outs[0], blocks, scope, carries, rode))
            return
        by_endpoint: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for name, wire, ep in zip(outs, wire_names, endpoints):
            by_endpoint[ep].append((name, wire))
        held = self.plan.held.get(id(op), frozenset())
        for ep, mine in by_endpoint.items():
            pairs = self.core.bundle_get(ep, mine, ep in held)
            if pairs is None:
                continue
            if ep in fetched:  # the GET rode on the round's SEND
                reply = self.core.ridden(ep)
            else:
                reply = self.call(ep, GetRequest([wire for _, wire in pairs],
                                                 self._closes(Kind.GET, ep, carries.get(ep))))
            landed = _Landed(self, ep, pairs, scope, reply)
            for name, _ in pairs:
                self.pending[name] = landed

    def _took(self, endpoint: str, reply: Message, pairs: list[tuple[str, str]],
              scope: Scope) -> None:
        """Put the values `reply` (to a GET, or a SEND carrying one) answered into `scope`."""
        self.core.on_fetched(endpoint, reply)
        for name, wire in pairs:  # read-only views of the reply's frames: no kernel writes an
            scope.put(name, _dense(self._var(endpoint, reply, wire)))  # input, concat copies

    async def _get_blocks(self, name: str, blocks: list[tuple[str, str]], scope: Scope,
                          carries: Mapping[str, int],
                          rode: Mapping[int, asyncio.Future[Message]]) -> None:
        """Fetch var `name` block by block ((wire name, endpoint) each) and join it: a GET per
        block, but for the blocks whose GET rode on a SEND (`rode`, by index)."""
        last = {ep: i for i, (_, ep) in enumerate(blocks)}  # each endpoint's last block
        replies = await asyncio.gather(*(
            rode[i] if i in rode else
            self.call(ep, GetRequest([wire], self._closes(
                Kind.GET, ep, carries.get(ep) if last[ep] == i else None)))
            for i, (wire, ep) in enumerate(blocks)))
        scope.put(name, concat_rows([_dense(self._var(ep, r, wire))
                                     for r, (wire, ep) in zip(replies, blocks)]))

    async def wait_for(self, names: Iterable[str]) -> None:
        self.core.gets_left()
        tasks = {self.pending.pop(n) for n in names if n in self.pending}
        if tasks:
            await asyncio.gather(*tasks)

    async def fetch_barrier(self, op: Op, scope: Scope) -> None:
        await self.wait_for(list(self.pending))
        await self._acknowledged()
        self._end_round(Kind.GET)
        await asyncio.gather(*(self.call(ep, FETCH_BARRIER) for ep in self._uncovered(op)))

    async def prefetch(self, op: Op, scope: Scope) -> None:
        """PREFETCH of ids X[i] from ``epmap[i]``; the rows answered land in Out[i]."""
        ids, rows, endpoints = op.input("X"), op.output("Out"), op.attr("epmap")
        if not len(ids) == len(rows) == len(endpoints):
            raise ValueError(f"prefetch op: {len(ids)} ids, {len(rows)} rows and "
                             f"{len(endpoints)} endpoints do not line up: {op}")
        loop = asyncio.get_running_loop()
        for x, out, ep in zip(ids, rows, endpoints):
            self.pending[out] = loop.create_task(self._prefetch(ep, x, out, scope))

    async def _prefetch(self, endpoint: str, ids: str, rows: str, scope: Scope) -> None:
        reply = await self.call(endpoint, PrefetchRequest({ids: scope.get(ids)}))
        scope.put(rows, _owned(self._var(endpoint, reply, rows)))

    async def distributed_lookup_table(self, op: Op, scope: Scope) -> None:
        """Rows of the table's blocks (``table_names``, ``height_sections`` rows each, on
        ``endpoints``) for the ids of every lookup the op serves (Ids[i] -> Outputs[i]), asked
        for in one round; each output is shaped and ordered like the lookup's it replaced
        (``lookup_table_version``)."""
        outs = op.output("Outputs")
        task = asyncio.get_running_loop().create_task(self._lookup_remote(op, scope))
        for out in outs:
            self.pending[out] = task

    async def remote_lookup(self, op: Op, scope: Scope) -> None:
        """A lookup of a 1.2 program that reads its table's rows from the pservers (``epmap``,
        `transpiler.opcatalog.runs_rpc`): served as a `distributed_lookup_table` of that one
        lookup is."""
        await self.distributed_lookup_table(Op(
            "distributed_lookup_table", {"Ids": op.input("Ids"), "W": op.input("W")},
            {"Outputs": op.output("Out")},
            {"endpoints": op.attr("epmap"), "table_names": op.attr("table_names"),
             "height_sections": op.attr("height_sections"),
             "padding_idx": op.attr("padding_idx", -1), "trainer_id": op.attr("trainer_id"),
             "lookup_table_version": op.type}), scope)

    async def _lookup_remote(self, op: Op, scope: Scope) -> None:
        names, outs = op.input("Ids"), op.output("Outputs")
        if len(names) != len(outs):
            raise ValueError(f"distributed_lookup_table: {len(names)} Ids and {len(outs)} "
                             f"Outputs do not line up: {op}")
        values = [scope.get_tensor(name) for name in names]
        for name, value in zip(names, values):
            if isinstance(value, Phantom):
                raise NotImplementedError(f"distributed_lookup_table: Ids {name!r} is a "
                                          "phantom; remote sparse update needs real ids "
                                          "(numeric mode)")
        dense = [to_dense(value) for value in values]
        ids = [d.reshape(-1).astype(np.int64) for d in dense]
        unique, rows = await self._remote_rows(op, "endpoints", np.concatenate(ids),
                                               "Ids " + ", ".join(map(repr, names)))
        pad = int(op.attr("padding_idx", -1))
        version = str(op.attr("lookup_table_version", "lookup_table") or "lookup_table")
        for out, value, shaped, flat in zip(outs, values, dense, ids):
            found = rows[np.searchsorted(unique, flat)]
            found[flat == pad] = 0
            found = found.reshape(lookup_lead(shaped.shape, version) + rows.shape[1:])
            scope.put(out, LoDTensor(found, value.lod)
                      if isinstance(value, LoDTensor) and value.lod else found)

    async def _remote_rows(self, op: Op, endpoints: str, ids: np.ndarray,
                           what: str) -> tuple[np.ndarray, np.ndarray]:
        """The sorted unique `ids` and their rows, asked of the table's blocks (``table_names``,
        ``height_sections`` rows each, on the endpoints of attribute `endpoints`): one PREFETCH
        per block, by row of the block."""
        starts = np.cumsum([0] + [int(h) for h in op.attr("height_sections")])
        if ids.size and (ids.min() < 0 or ids.max() >= starts[-1]):
            raise ValueError(f"{op.type}: {what} hold {ids.min()}..{ids.max()}, outside the "
                             f"table's {starts[-1]} rows")
        asked = [np.unique(ids[(ids >= lo) & (ids < hi)]) for lo, hi in zip(starts, starts[1:])]
        tables, eps = op.attr("table_names"), op.attr(endpoints)
        replies = await asyncio.gather(*(
            self.call(ep, PrefetchRequest({"Ids": (mine - lo).reshape(-1, 1)}, table))
            for table, ep, lo, mine in zip(tables, eps, starts, asked)))
        rows = np.concatenate([to_dense(self._var(ep, r, t)) for r, t, ep in
                               zip(replies, tables, eps)])
        return np.concatenate(asked), rows

    async def prefetch_classes(self, op: Op, scope: Scope, program: Program) -> None:
        """Before an `nce` with ``remote_prefetch`` and ``epmap`` runs: draw its sample labels
        as its kernel will (`sampling.sample_labels`: the same function of the same inputs),
        fetch the rows of those classes from the weight's blocks, and put them in the scope as
        the Weight, a SelectedRows of those rows only, which the op and its grad read (the
        original's nce kernel prefetched into ``Weight@Prefetch`` in the same way)."""
        (weight,) = op.input("Weight")
        (label,) = op.input("Label")
        if isinstance(scope.get_tensor(label), Phantom):
            raise NotImplementedError(f"nce: Label {label!r} is a phantom; remote prefetch "
                                      "needs real labels (numeric mode)")
        classes = sample_labels(KernelContext(op, scope, program=program)).reshape(-1)
        unique, rows = await self._remote_rows(op, "epmap", classes, "sample labels")
        scope.put(weight, SelectedRows(unique, rows, int(sum(op.attr("height_sections")))))

    async def allreduce(self, op: Op, scope: Scope) -> None:
        """c_allreduce_sum in the background (`CollectiveOps.allreduce`): an op that reads Out
        waits for it, as for a `recv`'s value."""
        await self.wait_for(op.input("X"))
        self.collective.step = self.step
        self.pending[op.output("Out")[0]] = self.collective.allreduce(op, scope)

    async def checkpoint_notify(self, op: Op, scope: Scope) -> None:
        """Once what this trainer sent is in, every pserver (``epmap``) saves its whole state to
        ``dir``/<its name>/."""
        await self.settle()
        await asyncio.gather(*(self.call(ep, CheckpointRequest(op.attr("dir")))
                               for ep in op.attr("epmap")))

    async def pull_tables(self, program: Program, scope: Scope) -> None:
        """Fetch the final rows of the tables that `program` only looks rows up in (the
        distributed lookup table, remote-sparse tables) from the pservers into `scope`, where
        the trainer holds a placeholder or its startup values, so that a run can report every
        parameter."""
        blocks = _served_tables(program)
        replies = await asyncio.gather(*(
            asyncio.gather(*(self.call(ep, GetRequest([wire], self._closes(Kind.GET, ep, None)))
                             for ep, wire, _ in parts))
            for parts in blocks.values()))
        for (table, parts), answers in zip(blocks.items(), replies):
            scope.put(table, concat_rows([slice_rows(_dense(self._var(ep, r, wire)), 0, rows)
                                          for r, (ep, wire, rows) in zip(answers, parts)]))

    async def _acknowledged(self) -> None:
        """Wait for the acknowledgements of the sends `send_barrier` did not wait for."""
        unacked, self._unacked = self._unacked, []
        if unacked:
            await asyncio.gather(*unacked)

    async def settle(self) -> None:
        """Wait for everything still in flight (the end of a program run)."""
        await self.flush_sends()
        await self._acknowledged()
        await self.wait_for(list(self.pending))

    async def abandon(self) -> None:
        """Cancel every request in flight (a step given up) and forget what it owed."""
        tasks = [*self._sends, *self._unacked, *self.pending.values()]
        self._sends, self._unacked, self.pending = [], [], {}
        self.core.abandoned()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.charge.owed, self.charge.ops = 0.0, []


class _Landed(asyncio.Future[None]):
    """Done once the values that `reply` (to a GET, or to a SEND carrying one) answers are in
    `scope`; it fails as the request does, and cancelling it cancels the request, as for a
    task that awaits it.

    DESIGN: a future with a callback, not a task per GET: a sync round holds every trainer's
    GET to every pserver until its last send barrier (1,000 trainers x 100 pservers: 100,000
    at once), and a task with its coroutine, its scheduled step and its weak reference costs
    about twice as much."""

    __slots__ = ("_rpc", "_endpoint", "_pairs", "_scope", "_reply")

    def __init__(self, rpc: RpcOps, endpoint: str, pairs: list[tuple[str, str]], scope: Scope,
                 reply: asyncio.Future[Message]) -> None:
        super().__init__(loop=reply.get_loop())
        self._rpc, self._endpoint, self._pairs, self._scope = rpc, endpoint, pairs, scope
        self._reply = reply
        reply.add_done_callback(self._land)

    def cancel(self, msg: Any | None = None) -> bool:
        self._reply.cancel()
        return super().cancel(msg)

    def _land(self, reply: asyncio.Future[Message]) -> None:
        if self.done():
            return
        if reply.cancelled():
            super().cancel()
            return
        try:
            self._rpc._took(self._endpoint, reply.result(), self._pairs, self._scope)
        except Exception as exc:  # the request's error, or a reply that lacks a var
            self.set_exception(exc)
        else:
            self.set_result(None)


SENDING_OPS = frozenset({"send", "send_barrier"})
"""RPC ops that wait for no answer to go on (their requests leave in the background)."""

HOLD_LIMIT = 0.02
"""Seconds a run of compute ops may hold the event loop before `run_block` lets it turn
between two of them. The kernels run on the loop's thread, so while they run this node
sends no heartbeat, and a pserver would drop it after ``train.heartbeat_timeout`` of a long
forward or backward pass; a few tens of milliseconds also keep the background sends, replies
and acknowledgements moving, and a turn of the loop costs microseconds. A single kernel op
longer than the timeout still holds it throughout."""


def without_unread_state(startup: Program, main: Program) -> Program:
    """`startup` less the initializers of vars that no op of `main` and no later op of
    `startup` reads; `startup` itself where there are none. DESIGN: the programs keep the
    dense parameters' optimizer accumulators in a trainer's startup, as the original's did
    (docs/transpiler.md, section 6), but the pservers update the parameters and read them: a
    trainer would allocate an Adam job's two moments of every parameter for nothing. The
    program stays as the transpiler wrote it; the trainer just does not run those ops."""
    read = {name for block in main.blocks for op in block.ops for name in op.input_arg_names}
    ops = startup.global_block().ops
    keep = [True] * len(ops)
    for i in range(len(ops) - 1, -1, -1):  # `read` gains what the later startup ops read
        op = ops[i]
        outputs = op.output_arg_names
        if op.type in INIT_OPS and outputs and read.isdisjoint(outputs):
            keep[i] = False
        else:
            read.update(op.input_arg_names)
    if all(keep):
        return startup
    pruned = startup.clone()
    pruned.global_block().ops = [op for op, kept in zip(pruned.global_block().ops, keep)
                                 if kept]
    return pruned


async def run_program(executor: Executor, program: Program, scope: Scope, rpc: RpcOps,
                      feed: Mapping[str, Any] | None = None,
                      fetch: Iterable[str] = ()) -> list[Any]:
    """Run block 0 of `program`: compute ops by kernel, RPC ops awaited through `rpc`."""
    block = program.global_block()
    for name, value in (feed or {}).items():
        scope.put(name, check_feed(block, name, value))
    await run_block(executor, program, 0, scope, rpc)
    await rpc.charge.pay()
    await rpc.settle()
    return [scope.get(name) for name in fetch]


async def run_block(executor: Executor, program: Program, idx: int, scope: Scope,
                    rpc: RpcOps) -> None:
    """Run one block; a `conditional_block` whose sub-block holds RPC ops (geo's periodic
    push and pull) is run here too, awaiting its RPC ops."""
    plan = executor.plans.get(program, idx)
    rpc.learn(program)

    def run_sub(sub: int) -> None:
        executor.run_block(program, sub, scope)

    # DESIGN: the loop counts as held since this block began or last yielded, awaits
    # included: one that did not suspend (a send, a value already there) let nothing run.
    # A virtual clock (the simulator) never moves while the loop is held, only across
    # awaits: there is nothing to bound, and a yield would reorder its events.
    loop = asyncio.get_running_loop()
    clock = loop.time
    bounded = not virtual_clock(loop)
    turned = clock()
    for step in plan.steps:
        if step.kernel is None:
            if step.op.type not in SENDING_OPS:
                rpc.owe_rpc_residual()
            await rpc.charge.pay()
            start = asyncio.get_running_loop().time()
            await rpc.run(step.op, scope)
            rpc.charge.span(step.op.type, start, "rpc")
            continue
        if rpc.pending:
            await rpc.wait_for(step.op.input_arg_names)
        if prefetches_classes(step.op):
            await rpc.prefetch_classes(step.op, scope, program)
        sub = _rpc_sub_block(executor, program, step.op)
        if sub is None:
            meter = rpc.client.meter
            started = 0.0 if meter is None else meter.start()
            run_step(step, scope, program, run_sub)
            rpc.charge.add(step.op, scope)
            if meter is not None:
                meter.stop_ops(started, 1)
            if bounded and clock() - turned > HOLD_LIMIT:
                await asyncio.sleep(0)
                turned = clock()
        elif _condition_holds(step.op, scope):
            await run_block(executor, program, sub, scope, rpc)


def prefetches_classes(op: Op) -> bool:
    """An `nce` whose weight's rows come from the pservers (remote sparse update)."""
    return op.type == "nce" and prefetches_rows(op)


def _rpc_sub_block(executor: Executor, program: Program, op: Op) -> int | None:
    if op.type != "conditional_block":
        return None
    idx = op.attr("sub_block").idx
    return idx if executor.plans.get(program, idx).rpc_steps else None


def _condition_holds(op: Op, scope: Scope) -> bool:
    """As `conditional_block` decides; a phantom condition (timing mode) is taken to hold."""
    conds = [scope.get(n) for n in op.input("Cond")]
    if any(isinstance(c, Phantom) for c in conds):
        return True
    if op.attr("is_scalar_condition", False):
        return bool(np.asarray(conds[0]).reshape(-1)[0])
    return all(np.asarray(c).size > 0 for c in conds)


def _served_tables(program: Program) -> dict[str, list[tuple[str, str, int]]]:
    """Table -> (endpoint, var there, rows of it that are the table's) of each of its blocks, for
    the tables `program` reads only by id."""
    tables = {}
    table = program.attrs.get("_distributed_lookup_table")
    if table:
        endpoints = list(program.attrs["_endpoints"])
        owned = table_sections(program.global_block().var(table).shape[0], len(endpoints))
        tables[table] = [(ep, table, rows) for ep, rows in zip(endpoints, owned)]
    for op in program.global_block().ops:
        if op.type == "distributed_lookup_table":
            tables[op.input("W")[0]] = list(zip(op.attr("endpoints"), op.attr("table_names"),
                                                op.attr("height_sections")))
        elif prefetches_rows(op):
            # an nce's weight, or a 1.2 program's lookup: their table's blocks as ``epmap`` says
            tables[op.input(REMOTE_PREFETCH_SLOTS[op.type])[0]] = list(zip(
                op.attr("epmap"), op.attr("table_names"), op.attr("height_sections")))
    return tables


def _dense(value: Value) -> np.ndarray | Phantom:
    """`to_dense`, of a phantom too (timing mode)."""
    return value.dense() if isinstance(value, Phantom) else to_dense(value)


def _owned(value: Value) -> np.ndarray | Phantom:
    """A received value as a dense array of its own (decoded arrays view the frames)."""
    return value.dense() if isinstance(value, Phantom) else to_dense(value).copy()


def _loss(value: Value) -> float:
    """The step's loss; NaN in timing mode, where it is a phantom."""
    return float("nan") if isinstance(value, Phantom) else float(to_dense(value).reshape(-1)[0])


def _row_blocks(value: np.ndarray | Phantom, sections: list[int],
                op: Op) -> list[np.ndarray | Phantom]:
    if sum(sections) != value.shape[0]:
        raise ValueError(f"send op: sections {sections} do not add up to {value.shape[0]} rows: {op}")
    bounds = np.cumsum([0] + list(sections))
    return [slice_rows(value, a, b) for a, b in zip(bounds, bounds[1:])]


@dataclass
class TrainerReport:
    trainer_id: int
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    """Each completed step's duration. A step given up (a pserver restarted and rewound it,
    or the pservers dropped this trainer) counts into the next one completed: that one lasts
    from the start of the first attempt given up, the recovery included."""
    first_step: int = 0
    """The step it started at (later than 0 when it joined a job under way, e.g. restarted)."""
    redone: int = 0
    """Steps it took again because a pserver restarted from an earlier checkpoint."""
    resends: int = 0
    """Requests it sent again (`RpcClient.resends`), startup and finish included."""


class Trainer:
    def __init__(self, trainer_id: int, main: Program, startup: Program, client: RpcClient,
                 endpoints: list[str], executor: Executor | None = None,
                 heartbeat_interval: float = 2.0, compute: ComputeModel | None = None,
                 tracer: Tracer | None = None, protocol: str = DEFAULT_PROTOCOL,
                 collective: Collective | None = None,
                 renames: Mapping[str, str] | None = None) -> None:
        self.trainer_id = trainer_id
        self.main, self.startup = main, without_unread_state(startup, main)
        self.client = client
        self.endpoints = endpoints
        self.executor = executor or Executor()
        self.scope = Scope()
        self.rpc = RpcOps(client, trainer_id, Charge(client.name, compute, tracer), protocol,
                          collective, renames)
        self.rpc.collective.trainer_endpoints = tuple(main.attrs.get("_trainers_endpoints", ()))
        self.heartbeat_interval = heartbeat_interval
        self.report = TrainerReport(trainer_id)
        """What it has done so far (all of it once `run` returns)."""
        self._beat: asyncio.Task[None] | None = None
        self.training = False
        """In `run`'s steps: started and not yet finishing. One still training once every
        pserver has finished the job was dropped by them and has nobody left to train with."""

    async def start(self) -> int:
        """Connect to the pservers, start the heartbeat, run the startup program and join the
        job: the first step this trainer takes part in. `run` starts with it; a caller driving
        the steps itself (`runtime.services.paddle_compat`) calls `start`, then `finish` and
        `stop`."""
        loop = asyncio.get_running_loop()
        self.rpc.charge.bind(loop)
        await self.client.connect(self.endpoints)
        self._beat = loop.create_task(self._heartbeat())
        self.rpc.step = INITIAL_STEP
        await run_program(self.executor, self.startup, self.scope, self.rpc)
        return await self._join_if_late()

    async def finish(self) -> None:
        """The steps are done: the chief fetches the tables it only looked rows up in, and
        every pserver hears COMPLETE."""
        if self.main.attrs.get("_is_chief"):
            await self.rpc.pull_tables(self.main, self.scope)
        await self._complete()
        await self.rpc.collective.finish()

    async def stop(self) -> None:
        """Stop the heartbeat and abandon whatever is still in flight (after `finish`, or on a
        failure)."""
        await self._stop_heartbeat()
        await self.rpc.abandon()
        self.rpc.collective.close()

    async def run(self, batches: Callable[[int], Mapping[str, Any]], steps: int, loss: str,
                  on_step: Callable[[int, float, float], None] | None = None) -> TrainerReport:
        if self.client.meter is not None:
            self.client.meter.begin_run()
        report = self.report = TrainerReport(self.trainer_id)
        try:
            step = report.first_step = await self.start()
            charge, meter = self.rpc.charge, self.client.meter
            self.training = True
            given_up: float | None = None  # when the first attempt given up since began
            while step < steps:
                self.rpc.step = charge.step = step
                start = charge.clock() if given_up is None else given_up
                started = 0.0 if meter is None else meter.start()
                feed = batches(step)
                charge.add_overhead("step")
                if meter is not None:
                    meter.add_step_time(started)
                try:
                    (value,) = await run_program(self.executor, self.main, self.scope, self.rpc,
                                                 feed, [loss])
                except (Rewind, Dropped) as notice:
                    if isinstance(notice, Rewind):
                        report.redone += step - notice.step
                    given_up = start  # the recovery counts into the next step completed
                    step = await self._recover(notice)
                    continue
                given_up = None
                elapsed = charge.clock() - start
                started = 0.0 if meter is None else meter.start()
                report.losses.append(_loss(value))
                report.step_times.append(elapsed)
                if on_step is not None:
                    on_step(step, report.losses[-1], elapsed)
                if meter is not None:
                    meter.stop_step(started)
                step += 1
            self.training = False
            await self.finish()
        finally:
            await self.stop()
            report.resends = self.client.resends
            if self.client.meter is not None:
                self.client.meter.end_run()
        return report

    async def _recover(self, notice: Rewind | Dropped) -> int:
        """Give up the step in flight and go on where the pservers can take this trainer
        (`TrainerCore.gave_up`): the step to go on from. A notice that comes while recovering
        is followed in the same way, merged with those before it."""
        while True:
            await self.rpc.abandon()
            try:
                return await self._carry(self.rpc.core.gave_up(notice))
            except (Rewind, Dropped) as other:
                notice = other

    async def _join_if_late(self) -> int:
        """The first step this trainer takes part in (`TrainerCore.started`): joining the job
        first if it started late, was dropped or restarted, or the job resumed."""
        return await self._carry(self.rpc.core.started(self.endpoints))

    async def _carry(self, action: Train | Refetch | JoinAll | Fail) -> int:
        """Carry out `action` of the core's and those it leads to: JOIN every pserver until
        all admit one step, fetch the parameters again; the step to take part from."""
        while isinstance(action, JoinAll):
            replies = await asyncio.gather(*(self.rpc.call(ep, JoinRequest(action.entry))
                                             for ep in self.endpoints))
            action = self.rpc.core.joined(action, list(zip(self.endpoints, replies)))
        if isinstance(action, Fail):
            raise action.error
        if isinstance(action, Refetch):
            await run_program(self.executor, self.startup, self.scope, self.rpc)
        return action.step

    async def _complete(self) -> None:
        """Tell every pserver this trainer is done (COMPLETE), then that it has the
        acknowledgements and will send nothing more (BYE), so a pserver whose trainers have all
        said so stops at once rather than waiting for retries. The work is finished either
        way: a pserver whose acknowledgement never comes (lost, or it stopped once every
        trainer had completed) is reported, not treated as a failure."""
        policy = self.client.policy
        deadline = min(policy.deadline, 7 * policy.first_retry)  # three sends, with backoff
        results = await asyncio.gather(
            *(self.rpc.call(ep, COMPLETE, deadline=deadline) for ep in self.endpoints),
            return_exceptions=True)
        for ep, result in zip(self.endpoints, results):
            failed = self.rpc.core.completed(
                ep, result if isinstance(result, BaseException) else None)
            if failed is not None:
                raise failed.error
        await self._stop_heartbeat()
        await asyncio.gather(*(self.rpc.tell(ep, BYE) for ep in self.endpoints))

    async def _stop_heartbeat(self) -> None:
        beat, self._beat = self._beat, None
        if beat is not None:
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)

    async def _heartbeat(self) -> None:
        """Prove this trainer alive to every pserver each interval, to all of them at once: a
        pserver slow to answer (paused, overloaded, gone) holds back its own heartbeats only,
        never the others', which would drop this trainer for a silence not its own. A
        heartbeat still being retried is not sent again beside itself. Stopped, it cancels
        the heartbeats still waiting, so that none is resent after this trainer's BYE."""
        beating: dict[str, asyncio.Future[Message]] = {}
        try:
            while True:
                await asyncio.sleep(self.heartbeat_interval)
                for ep in self.endpoints:
                    last = beating.get(ep)
                    if last is None or last.done():
                        beat = beating[ep] = self.rpc.call(ep, HEARTBEAT)
                        beat.add_done_callback(self._beaten)
        finally:
            for beat in beating.values():
                beat.cancel()

    def _beaten(self, beat: asyncio.Future[Message]) -> None:
        """A heartbeat's end: a missed one is the server's business, logged only."""
        if not beat.cancelled() and (exc := beat.exception()) is not None:
            log.debug("trainer %d: a heartbeat failed: %s", self.trainer_id, exc)
