"""The pserver service: `listen_and_serv` of a transpiled pserver program, over a `Transport`.

It owns a `Scope` initialized by the pserver's startup program and answers the trainers:

- SEND: gradients (or geo deltas) are checked against this server's vars (name known, dtype and
  shape as declared, rows in range) *before* anything is stored, so a bad message gets an error
  reply that names it and leaves the state bit-identical. Sync mode stores them for the step's
  optimize; the other modes run the gradient's optimize block at once.
- SEND_BARRIER / FETCH_BARRIER (sync): counted by `protocol.SyncRound`. When every live
  trainer's send barrier is in, the LR block and the optimize blocks run (the fan-in average
  divides by the trainers that actually contributed), then deferred GETs are answered.
- GET: the current values of the named vars; in sync mode, the values after this step's update.
- PREFETCH: rows of the distributed table by id (the prefetch blocks; in sync mode a step's
  prefetches read the table as the last step left it), or, with an extra ``table`` field, rows
  of that param block by row (remote sparse update). See `runtime.table`, which also turns the
  table's global ids into rows of this server's shard, and averages the trainers' table grads
  in sync mode: the program sums them, as the original did, which would step N trainers N times
  as far as local training; dividing each trainer's piece by the contributors first is a
  deliberate fix.
- CHECKPOINT_NOTIFY (extra ``dir``): the whole state is saved to ``dir/<server name>/``, the
  table by the program's checkpoint block (see `runtime.checkpoint`); the message is handled in
  one piece, so the checkpoint is one consistent state. ``load_from=dir`` starts a server from
  such a checkpoint, its sync round at the step the checkpoint was taken before.
- Periodic checkpoints: with `ServeConfig.checkpoint_every` k, the state is saved to
  ``checkpoint_dir/<server name>/`` each time the sync round reaches a multiple of k (in the
  asynchronous modes, each time a trainer's step does).
- Recovery (``recovering=True``: this server replaces one that crashed; it starts from the last
  checkpoint if there is one, else from its startup state): in sync mode, a trainer's first
  message for a step at or past the restored one is answered with a REPLY carrying
  ``rewind: <step>``; the trainer abandons its step, fetches the parameters again and redoes the
  steps from there (the other pservers, already past them, acknowledge the redone sends as
  stale), so no update is applied twice on any server and at most k steps are redone.
- COMPLETE: the trainer leaves the fan-in; the server stops when every trainer has completed.
- HEARTBEAT: proof of life. A trainer that has been silent for `heartbeat_timeout` (in sync
  mode, one the round waits for) is dropped from the fan-in and the event is logged; the
  server stops once every trainer has completed or been dropped (and one at least completed).

Timing mode (phantom kernels): trainers send `Phantom`s, checked against the declarations like
tensors and stored as they are; the blocks then compute shapes only, GETs answer phantoms, and
byte counts are what the messages would weigh with data (`wire.charged_size`). Checkpoints need
real values and are refused.

Requests are deduplicated by (sender, message id): a retry gets the first reply again, and a
retry of a request still waiting (deferred until the round moves on) gets a ``pending`` notice,
so the trainer knows this server is alive and waits on rather than timing out on it: a request
times out only on a server that has gone silent, and the error names that one. Any failure in handling one message
becomes an error reply to its sender; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from transpiler.distribute.lookup_table import CHECKPOINT_PATH_VAR
from transpiler.ir import BlockRef, Op, Program, Var, VarType

from . import checkpoint
from .compute import Charge, ComputeModel, Tracer
from .costs import RECEIVES, SENDS, Meter
from .executor import Executor
from .protocol import INITIAL_STEP, Dedupe, Event, Phase, SyncRound, Verdict
from .scope import Scope
from .table import TableShard, lookup_rows, remote_tables
from .tensor import LoDTensor, Phantom, SelectedRows, to_dense
from .transport import Transport, TransportClosed
from .wire import DecodeError, Kind, Message, charged_size, decode, encode, error_reply

log = logging.getLogger(__name__)

SYNC, ASYNC, HALF_ASYNC, GEO = 0, 1, 2, 3
TRAINER_ID_VAR = "@TRAINER_ID@"  # DC-ASGD: whose gradient is being applied


class ProtocolViolation(ValueError):
    """A well-formed message that this server cannot accept; sent back as an error reply."""

    def __init__(self, detail: str, var: str | None = None) -> None:
        super().__init__(detail)
        self.var = var


class PserverFailure(RuntimeError):
    """The server cannot go on (an optimize step failed); names the node and the cause."""

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(f"{node} stopped: {type(cause).__name__}: {cause}")
        self.node = node


@dataclass
class ServerStats:
    """What a pserver reports at the end: bytes in/out, time busy optimizing, events."""

    messages: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    optimize_seconds: float = 0.0
    steps: int = 0
    errors: int = 0
    dropped: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    """Steps at which the periodic checkpoints were taken."""
    restored_step: int | None = None
    """The step this server started from after a crash (its checkpoint's, or 0)."""
    rewinds: int = 0
    heartbeat_bytes: int = 0
    """Bytes in and out of heartbeats and their acknowledgements (their number depends on how
    long the job runs, not on its steps)."""


@dataclass(frozen=True)
class ServeConfig:
    heartbeat_timeout: float = 10.0
    max_message_size: int = 1 << 30
    # After the last trainer completed, go on answering retries (a lost reply to COMPLETE is
    # resent) until the trainers have been quiet this long.
    drain: float = 1.0
    # A trainer never heard from is dropped after this long (processes start slowly; a
    # heartbeat timeout below the start-up time would drop every trainer at once).
    startup_grace: float = 60.0
    checkpoint_every: int | None = None
    checkpoint_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_every is not None and (self.checkpoint_every < 1
                                                  or self.checkpoint_dir is None):
            raise ValueError(f"checkpoint_every must be >= 1 and needs a checkpoint_dir: {self}")


class PserverService:
    def __init__(self, program: Program, startup: Program, transport: Transport,
                 executor: Executor | None = None, config: ServeConfig | None = None,
                 compute: ComputeModel | None = None, tracer: Tracer | None = None,
                 load_from: Path | str | None = None, recovering: bool = False) -> None:
        self.program = program
        self.transport = transport
        self.executor = executor or Executor()
        self.config = config or ServeConfig()
        self.scope = Scope()
        self.executor.run(startup, scope=self.scope)
        self.lsv = _listen_and_serv(program)
        self.mode = int(self.lsv.attr("distributed_mode", SYNC))
        self.trainers = int(self.lsv.attr("Fanin", 1))
        self.round = SyncRound(self.trainers)
        self.dedupe = Dedupe()
        self.stats = ServerStats()
        self.grad_blocks = _grad_to_block(self.lsv)
        self.optimize_blocks = [ref.idx for ref in self.lsv.attr("optimize_blocks", [])]
        self.lr_block = int(self.lsv.attr("lr_decay_block_id", -1))
        self.dc_asgd = bool(self.lsv.attr("dc_asgd", False))
        self.receivable = frozenset(self.lsv.input("X"))  # the vars trainers may SEND here
        self._fanin_scales = _fanin_scale_ops(program, self.optimize_blocks)
        self.table = TableShard.of(program, self.lsv)
        self.remote_tables = remote_tables(program, self.lsv)
        self.state = checkpoint.state_vars(program, startup)
        self._deferred: list[tuple[str, Message]] = []
        self._pending: set[tuple[str, int]] = set()
        self._last_seen: dict[int, float] = {}
        self._serving_since = 0.0
        self._next_step: dict[int, int] = {}  # trainer -> the step after its latest message
        self._progress = 0  # asynchronous modes: the furthest step any trainer reached
        self._resynced: set[int] | None = None  # recovering: trainers told to rewind, or rewound
        self._done = asyncio.Event()
        self._optimizing = False
        self._last_message = 0.0
        self.name = transport.name
        self.charge = Charge(self.name, compute, tracer)
        self.meter: Meter | None = None
        """Measures what each message, round and op costs this node (`runtime profile`)."""
        self._by_kind = self._handlers()
        if load_from is not None:
            self._restore(Path(load_from))
        if recovering:
            self._resynced = set()
            self.stats.restored_step = self._progress = self.round.step

    # -- serving loop ---------------------------------------------------------------------------
    async def serve(self, endpoint: str) -> ServerStats:
        """Bind `endpoint` and answer trainers until every one has completed."""
        await self.transport.bind(endpoint)
        if self.meter is not None:
            self.meter.begin_run()
        loop = asyncio.get_running_loop()
        self._serving_since = loop.time()
        tasks: list[asyncio.Task[Any]] = [
            loop.create_task(self._receive(), name=f"{self.name} receive")]
        tasks.append(loop.create_task(self._watchdog(), name=f"{self.name} watchdog"))
        tasks.append(loop.create_task(self._done.wait(), name=f"{self.name} done"))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if self._done.is_set() and not tasks[0].done():
                await self._drain()
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            if self.meter is not None:
                self.meter.end_run()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:  # an optimize step failed: the server's state is no longer trustworthy
            raise PserverFailure(self.name, failures[0]) from failures[0]
        return self.stats

    async def _drain(self) -> None:
        """Keep answering (retried requests get their first replies again) until no message
        has come for `drain` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            until = self._last_message + self.config.drain  # a message moves it later
            if loop.time() >= until:
                return
            await asyncio.sleep(until - loop.time())

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                peer, frames = await self.transport.recv()
            except TransportClosed:
                self._done.set()
                return
            self._last_message = loop.time()
            self.stats.messages += 1
            nbytes = charged_size(frames)
            self.stats.bytes_in += nbytes
            meter = self.meter
            if meter is None:
                await self._handle_frames(peer, frames)
                continue
            started = meter.start()
            kind = await self._handle_frames(peer, frames)
            meter.stop_message(started, RECEIVES, kind, nbytes)

    async def _handle_frames(self, peer: str, frames: list[Any]) -> str:
        """Decode and handle one message; its kind (for the meter)."""
        try:
            msg = decode(frames, self.config.max_message_size)
        except DecodeError as exc:
            await self._error(peer, exc, None)
            return Kind.ERROR.value
        if msg.kind is Kind.HEARTBEAT:
            self.stats.heartbeat_bytes += charged_size(frames)
        done, reply = self.dedupe.lookup(msg.src, msg.id)
        if done:
            await self._send(peer, reply)
            return msg.kind.value
        if (msg.src, msg.id) in self._pending:  # a retry of a deferred request: still waiting
            await self._send(peer, Message(Kind.REPLY, msg.id, self.name, self.round.step,
                                           extra={"pending": True,
                                                  "server_step": self.round.step}))
            return msg.kind.value
        await self._handle(peer, msg)
        return msg.kind.value

    async def _handle(self, peer: str, msg: Message) -> None:
        try:
            trainer = _trainer_of(msg)
            self._last_seen[trainer] = asyncio.get_running_loop().time()
            if msg.step >= 0 and msg.kind not in (Kind.HEARTBEAT, Kind.COMPLETE):
                self._next_step[trainer] = max(self._next_step.get(trainer, 0), msg.step + 1)
            if self._resynced is not None and self._must_rewind(trainer, msg):
                await self._send(peer, self._rewind(msg))
                return
            handler = self._by_kind[msg.kind]
            start = self.charge.clock()
            reply = handler(peer, msg, trainer)
        except Exception as exc:  # one bad message must not stop the server
            await self._error(peer, exc, msg)
            return
        if reply is None:  # deferred: answered after the next phase change
            self._pending.add((msg.src, msg.id))
            self._deferred.append((peer, msg))
            return
        await self.charge.pay()  # async modes: the update this message caused
        if self.mode != SYNC and msg.kind is Kind.SEND:
            self.stats.optimize_seconds += self.charge.clock() - start
            self.stats.steps = max(self.stats.steps, msg.step + 1)
        await self._answer(peer, msg, reply)
        await self._after_event()

    def _handlers(self) -> dict[Kind, Callable[[str, Message, int], Message | None]]:
        return {Kind.SEND: self._on_send, Kind.SEND_BARRIER: self._on_send_barrier,
                Kind.GET: self._on_get, Kind.FETCH_BARRIER: self._on_fetch_barrier,
                Kind.COMPLETE: self._on_complete, Kind.HEARTBEAT: self._on_heartbeat,
                Kind.JOIN: self._on_join,
                Kind.PREFETCH: self._on_prefetch, Kind.CHECKPOINT_NOTIFY: self._on_checkpoint}

    async def _answer(self, peer: str, msg: Message, reply: Message) -> None:
        self._pending.discard((msg.src, msg.id))
        self.dedupe.remember(msg.src, msg.id, reply)
        nbytes = await self._send(peer, reply)
        if msg.kind is Kind.HEARTBEAT:
            self.stats.heartbeat_bytes += nbytes

    async def _send(self, peer: str, reply: Message) -> int:
        """Send `reply` to `peer`; the bytes it weighs."""
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        frames = encode(reply)
        nbytes = charged_size(frames)
        self.stats.bytes_out += nbytes
        try:
            if not self.transport.send_nowait(peer, frames):
                await self.transport.send(peer, frames)
        except Exception as exc:  # the trainer went away; it will retry or be dropped
            log.warning("%s: cannot reply to %s: %s", self.name, peer, exc)
        if meter is not None:
            meter.stop_message(started, SENDS, reply.kind.value, nbytes)
        return nbytes

    async def _error(self, peer: str, exc: Exception, msg: Message | None) -> None:
        self.stats.errors += 1
        log.warning("%s: rejected a message from %s: %s", self.name, peer, exc)
        reply = error_reply(self.name, exc, request_id=None if msg is None else msg.id,
                            step=0 if msg is None else msg.step)
        if msg is not None:
            self._pending.discard((msg.src, msg.id))
        await self._send(peer, reply)

    # -- round progress ---------------------------------------------------------------------------
    async def _after_event(self) -> None:
        """Run the step's optimize and move the round on while the barriers allow it."""
        if self.mode != SYNC:
            if self.round.finished:
                self._done.set()
            return
        if self._optimizing:  # a message arrived while this step's update is being computed
            return
        progressed = True
        while progressed:
            progressed = False
            if self.round.ready_to_optimize:
                await self._optimize_step()
                progressed = True
            if self.round.take_step_done():
                self.stats.steps += 1
                self._checkpoint_at(self.round.step)
                progressed = True
            if progressed:
                await self._replay_deferred()
        if self.round.finished:
            self._done.set()

    async def _replay_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for peer, msg in deferred:
            self._pending.discard((msg.src, msg.id))
            meter = self.meter
            started = 0.0 if meter is None else meter.start()
            await self._handle(peer, msg)
            if meter is not None:
                meter.stop_message(started, RECEIVES, msg.kind.value, 0, again=True)

    async def _optimize_step(self) -> None:
        start = self.charge.clock()
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        self._optimizing = True
        try:
            contributors = self.round.contributors
            for trainer in set(range(self.trainers)) - contributors:
                self._zero_grads_of(trainer)
            for op in self._fanin_scales:
                op.attrs["scale"] = 1.0 / len(contributors)
            if self.table is not None:
                self.table.average_pieces(self.scope, contributors)
            for idx in self._step_blocks():
                self._run(idx)
            self.charge.add_overhead("round")
            await self.charge.pay()
        finally:
            self._optimizing = False
        self.round.optimized()
        if meter is not None:
            meter.stop_round(started)
        self.stats.optimize_seconds += self.charge.clock() - start

    def _run(self, block_idx: int) -> None:
        """Run one block and charge its ops to this node's modelled compute time."""
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        self.executor.run_block(self.program, block_idx, self.scope)
        if meter is not None:
            meter.stop_ops(started, len(self.program.blocks[block_idx].ops))
        self.charge.step = self.round.step
        for op in self.program.blocks[block_idx].ops:
            self.charge.add(op, self.scope)

    def _step_blocks(self) -> list[int]:
        """The blocks of one sync step: the LR block first (`optimize_blocks` lists it first
        already, as the original's did), then the optimize blocks."""
        if self.lr_block < 0 or self.lr_block in self.optimize_blocks:
            return self.optimize_blocks
        return [self.lr_block] + self.optimize_blocks

    def _zero_grads_of(self, trainer: int) -> None:
        """A trainer that did not contribute this step adds nothing to the sums: its gradient
        copies are zero (dense) or hold no rows (sparse), whether or not it ever sent one."""
        suffix = f".trainer_{trainer}"
        for name, var in self.program.global_block().vars.items():
            if not name.endswith(suffix) or name not in self.receivable:
                continue
            if var.type is VarType.SELECTED_ROWS:
                empty = np.zeros((0,) + tuple(var.shape[1:]), var.dtype)
                self.scope.put(name, SelectedRows(np.zeros(0, np.int64), empty, var.shape[0]))
            else:
                self.scope.put(name, np.zeros(var.shape, var.dtype))

    # -- message kinds ------------------------------------------------------------------------------
    def _verdict(self, event: Event, trainer: int, msg: Message) -> Verdict:
        """What the sync round says of this message (other modes accept everything); a
        message from a trainer outside the job's fan-in is refused with the reason."""
        if self.mode != SYNC:
            return Verdict.ACCEPT
        verdict = self.round.classify(event, trainer, msg.step)
        if verdict is Verdict.REJECT:
            raise ProtocolViolation(self._reject_reason(trainer, msg))
        return verdict

    def _on_send(self, peer: str, msg: Message, trainer: int) -> Message | None:
        verdict = self._verdict(Event.SEND, trainer, msg)
        if verdict is Verdict.DEFER:
            return None
        if verdict is Verdict.STALE:
            return self._ack(msg)
        values = {name: self._to_shard(name, self._checked(name, value))
                  for name, value in msg.vars.items()}
        merge = msg.extra.get("merge_add") is True
        for name, value in values.items():
            if merge and self.scope.has(name) and not isinstance(value, Phantom):
                value = to_dense(self.scope.get_tensor(name)) + to_dense(value)  # a counter
            self.scope.put(name, value)
        if self.mode != SYNC:
            self._checkpoint_at(msg.step + 1)
            if self.dc_asgd:
                self.scope.put(TRAINER_ID_VAR, np.array([trainer], dtype=np.int64))
            for name in values:
                self._run_grad_block(name)
        return self._ack(msg)

    def _run_grad_block(self, name: str) -> None:
        idx = self.grad_blocks.get(name)
        if idx is None:
            return
        if self.lr_block >= 0:
            self._run(self.lr_block)
        self._run(idx)

    def _on_send_barrier(self, peer: str, msg: Message, trainer: int) -> Message | None:
        if self.mode != SYNC:
            return self._ack(msg)
        verdict = self._verdict(Event.SEND_BARRIER, trainer, msg)
        if verdict is Verdict.DEFER:
            return None
        if verdict is Verdict.ACCEPT:
            self.round.send_barrier(trainer)
        return self._ack(msg)

    def _on_get(self, peer: str, msg: Message, trainer: int) -> Message | None:
        names = msg.extra.get("names")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ProtocolViolation("GET needs a list of var names in 'names'")
        if self._verdict(Event.GET, trainer, msg) is Verdict.DEFER:
            return None
        block = self.program.global_block()
        for name in names:
            if name not in block.vars or not self.scope.has(name):
                raise ProtocolViolation(f"GET of var {name!r}, which this pserver does not hold",
                                        var=name)
        values = {name: self.scope.get_tensor(name) for name in names}
        if self.dc_asgd:  # the values this trainer now computes with, for delay compensation
            for name, value in values.items():
                bak = f"{name}.trainer_{trainer}_bak"
                if bak in block.vars:
                    self.scope.put(bak, value)
        return Message(Kind.REPLY, msg.id, self.name, self.round.step, values,
                       self._fanin_state(trainer))

    def _on_fetch_barrier(self, peer: str, msg: Message, trainer: int) -> Message | None:
        if self.mode != SYNC:
            return self._ack(msg)
        verdict = self._verdict(Event.FETCH_BARRIER, trainer, msg)
        if verdict is Verdict.DEFER:
            return None
        if verdict is Verdict.ACCEPT:
            self.round.fetch_barrier(trainer, msg.step)
        return self._ack(msg)

    def _on_prefetch(self, peer: str, msg: Message, trainer: int) -> Message | None:
        if self._verdict(Event.PREFETCH, trainer, msg) is Verdict.DEFER:
            return None
        rows = self._remote_rows(msg) if "table" in msg.extra else self._table_rows(msg)
        return Message(Kind.REPLY, msg.id, self.name, self.round.step, rows,
                       {"server_step": self.round.step})

    def _table_rows(self, msg: Message) -> dict[str, Any]:
        if self.table is None:
            raise ProtocolViolation("PREFETCH: this pserver holds no distributed lookup table")
        ids = {name: self.table.local_ids(name, value) for name, value in msg.vars.items()}
        return self.table.prefetch_rows(ids, self.scope, self._run)

    def _remote_rows(self, msg: Message) -> dict[str, Any]:
        table = msg.extra["table"]
        if not isinstance(table, str) or table not in self.remote_tables:
            raise ProtocolViolation(f"PREFETCH of rows of var {table!r}, which this pserver does "
                                    "not serve by id", var=str(table))
        if set(msg.vars) != {"Ids"}:
            raise ProtocolViolation(f"PREFETCH of rows of var {table!r} carries vars "
                                    f"{sorted(msg.vars)}, not just 'Ids'", var=table)
        return {table: lookup_rows(table, self.scope.get(table), msg.vars["Ids"])}

    def _on_checkpoint(self, peer: str, msg: Message, trainer: int) -> Message | None:
        directory = msg.extra.get("dir")
        if not isinstance(directory, str) or not directory or "\0" in directory:
            raise ProtocolViolation("CHECKPOINT_NOTIFY needs a directory path in 'dir'")
        if self.executor.backend == "phantom":
            raise ProtocolViolation("CHECKPOINT_NOTIFY: this pserver runs in timing mode (phantom "
                                    "kernels) and holds no values to save")
        if self._optimizing:  # the update is applied but the round not moved on: wait for it
            return None
        path = self.save_checkpoint(Path(directory))
        log.info("%s: saved the state before step %d to %s", self.name, self._steps_applied(), path)
        return self._ack(msg)

    def save_checkpoint(self, directory: Path, step: int | None = None) -> Path:
        """Save the whole state to ``directory/<name>/`` (see `runtime.checkpoint`), as the
        state before `step` (default: the sync round's first step not applied)."""
        with checkpoint.Staging(directory / self.name) as stage:
            if self.table is not None and self.table.checkpoint_block >= 0:
                path = stage.file_of(self.table.table)
                self.scope.put(CHECKPOINT_PATH_VAR, np.array(str(path)))
                self._run(self.table.checkpoint_block)
            stage.commit({name: self.scope.get(name) for name in self.state},
                         self._steps_applied() if step is None else step)
        return stage.target

    def _restore(self, directory: Path) -> None:
        saved = checkpoint.load(directory / self.name, self.state)
        for name, value in saved.values.items():
            self.scope.put(name, value)
        self.round = SyncRound(self.trainers, step=saved.step)
        log.info("%s: restored the state before step %d from %s", self.name, saved.step,
                 directory / self.name)

    def _checkpoint_at(self, step: int) -> None:
        """Save the periodic checkpoint if `step` (the sync round's new step, or the step an
        asynchronous trainer moved on to) is the next multiple of `checkpoint_every`."""
        every = self.config.checkpoint_every
        if every is None or self.config.checkpoint_dir is None or step <= self._progress:
            return
        due = step // every > self._progress // every
        self._progress = step
        if due and self.executor.backend != "phantom":
            saved = self._steps_applied() if self.mode == SYNC else step
            self.save_checkpoint(self.config.checkpoint_dir, saved)
            self.stats.checkpoints.append(saved)

    # -- recovery ---------------------------------------------------------------------------------
    def _must_rewind(self, trainer: int, msg: Message) -> bool:
        """Recovering in sync mode: whether `msg` comes from a trainer still at a step this
        server lost (it has to redo the steps from `round.step`). A trainer's first message
        for an earlier step (its fetch of the parameters again) shows it has rewound."""
        resynced = self._resynced
        assert resynced is not None
        if self.mode != SYNC or msg.kind in (Kind.HEARTBEAT, Kind.COMPLETE) \
                or trainer in resynced:
            return False
        if msg.step < self.round.step:
            resynced.add(trainer)
            if len(resynced | self.round.completed) >= self.trainers:
                self._resynced = None  # every trainer is back in step
            return False
        return True

    def _rewind(self, msg: Message) -> Message:
        self.stats.rewinds += 1
        log.info("%s: trainer message %s at step %d: rewind to step %d", self.name, msg.kind,
                 msg.step, self.round.step)
        return Message(Kind.REPLY, msg.id, self.name, self.round.step,
                       extra={"server_step": self.round.step, "rewind": self.round.step})

    def _steps_applied(self) -> int:
        """The first step whose gradients the state has not seen."""
        return self.round.step + (self.round.phase is Phase.PARAMS)

    def _on_complete(self, peer: str, msg: Message, trainer: int) -> Message | None:
        if self.round.leave(trainer, completed=True):
            log.info("%s: trainer %d completed at step %d", self.name, trainer, self.round.step)
        return self._ack(msg)

    def _on_heartbeat(self, peer: str, msg: Message, trainer: int) -> Message | None:
        return self._ack(msg)

    def _on_join(self, peer: str, msg: Message, trainer: int) -> Message | None:
        """A trainer that was not in the fan-in (late, dropped, restarted) takes part from
        step ``entry`` on, or later if this server is past it: the reply says which."""
        entry = msg.extra.get("entry")
        if not isinstance(entry, int) or isinstance(entry, bool):
            raise ProtocolViolation("JOIN needs an int 'entry' step")
        if self.mode == SYNC:
            entry = self.round.join(trainer, entry)
            log.info("%s: trainer %d joins at step %d", self.name, trainer, entry)
        return Message(Kind.REPLY, msg.id, self.name, self.round.step,
                       extra={"server_step": self.round.step, "entry": entry})

    def _fanin_state(self, trainer: int) -> dict[str, Any]:
        """What a trainer learns from a fetch: where this server is and whether it is waited for."""
        in_fanin = self.mode != SYNC or trainer in self.round.live
        return {"server_step": self.round.step, "in_fanin": in_fanin,
                "entry_step": self.round.entry_step(),
                "next_step": self._next_step.get(trainer, 0), "sync": self.mode == SYNC}

    def _ack(self, msg: Message) -> Message:
        return Message(Kind.REPLY, msg.id, self.name, self.round.step,
                       extra={"server_step": self.round.step})

    def _reject_reason(self, trainer: int, msg: Message) -> str:
        if trainer in self.round.completed:
            return f"trainer {trainer} already completed; {msg.kind} refused"
        if not 0 <= trainer < self.trainers:
            return f"trainer {trainer} is not one of the {self.trainers} trainers of this job"
        return (f"trainer {trainer} is not in the fan-in at step {self.round.step} "
                f"(dropped after {self.config.heartbeat_timeout}s of silence?); {msg.kind} refused")

    # -- validation -----------------------------------------------------------------------------
    def _checked(self, name: str, value: Any) -> Any:
        """A received value, checked against this server's declaration and copied out of the
        receive buffer."""
        var = self.program.global_block().vars.get(name)
        if var is None or name not in self.receivable:
            raise ProtocolViolation(f"gradient for var {name!r}, which this pserver does not own",
                                    var=name)
        if isinstance(value, Phantom):
            return _checked_phantom(name, var, value)
        if isinstance(value, SelectedRows):
            if value.values.dtype != np.dtype(var.dtype) or value.height != var.shape[0] \
                    or tuple(value.values.shape[1:]) != tuple(var.shape[1:]):
                raise ProtocolViolation(
                    f"var {name!r}: expected rows of {var.dtype}{list(var.shape[1:])} with height "
                    f"{var.shape[0]}, got {value.values.dtype}{list(value.values.shape[1:])} "
                    f"with height {value.height}", var=name)
            return SelectedRows(np.array(value.rows), np.array(value.values), value.height)
        array = value.data if isinstance(value, LoDTensor) else value
        if array.dtype != np.dtype(var.dtype) or not _shape_matches(var.shape, array.shape):
            raise ProtocolViolation(f"var {name!r}: expected {var.dtype}{list(var.shape)}, got "
                                    f"{array.dtype}{list(array.shape)}", var=name)
        return np.array(array)

    def _to_shard(self, name: str, value: Any) -> Any:
        """A received table grad piece as rows of this server's shard; other values as they are."""
        if self.table is None or name not in self.table.pieces:
            return value
        return self.table.local_rows(name, value)

    # -- liveness -------------------------------------------------------------------------------
    async def _watchdog(self) -> None:
        """Drop trainers that have been silent too long: in sync mode those the round waits
        for; otherwise any that has not completed (so a trainer that died for good does not
        keep the server up)."""
        timeout = self.config.heartbeat_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(timeout, self.config.startup_grace) / 4)
            waited_for = self.round.live if self.mode != SYNC else \
                self.round.live - (self.round.sent if self.round.phase is Phase.GRADS
                                   else self.round.fetched)
            silent = [(t, why) for t in sorted(waited_for)
                      for why in [self._silence(t, loop.time())] if why]
            for trainer, why in silent:
                self.round.leave(trainer, completed=False)
                self.stats.dropped.append(trainer)
                log.warning("%s: dropped trainer %d from the fan-in at step %d: %s", self.name,
                            trainer, self.round.step, why)
            if silent:
                await self._after_event()

    def _silence(self, trainer: int, now: float) -> str | None:
        """Why `trainer` counts as gone (None: it does not): silent for longer than the
        heartbeat timeout, or never heard from within the start-up grace."""
        seen = self._last_seen.get(trainer)
        if seen is None:
            grace = self.config.startup_grace
            return f"not heard from within {grace:g}s of the start" \
                if now - self._serving_since > grace else None
        timeout = self.config.heartbeat_timeout
        return f"silent for more than {timeout:g}s" if now - seen > timeout else None


def _listen_and_serv(program: Program) -> Op:
    ops = [op for op in program.global_block().ops if op.type == "listen_and_serv"]
    if len(ops) != 1:
        raise ValueError(f"a pserver program has exactly one listen_and_serv op in block 0, "
                         f"found {len(ops)}")
    return ops[0]


def _grad_to_block(lsv: Op) -> dict[str, int]:
    table = {}
    for entry in lsv.attr("grad_to_block_id", []):
        grad, _, idx = str(entry).rpartition(":")
        table[grad] = int(idx)
    return table


def _fanin_scale_ops(program: Program, blocks: list[int]) -> list[Op]:
    """The `scale` ops that average the trainers' gradients: right after a `sum` of
    ``.trainer_N`` copies, scaling its output in place."""
    found = []
    for idx in blocks:
        ops = program.blocks[idx].ops
        for first, second in zip(ops, ops[1:]):
            if first.type == "sum" and second.type == "scale" \
                    and all(".trainer_" in n for n in first.input("X")) \
                    and second.input("X") == second.output("Out") == first.output("Out"):
                found.append(second)
    return found


def _trainer_of(msg: Message) -> int:
    trainer = msg.extra.get("trainer")
    if not isinstance(trainer, int) or isinstance(trainer, bool):
        raise ProtocolViolation(f"{msg.kind} from {msg.src!r} lacks an int 'trainer' field")
    return trainer


def _checked_phantom(name: str, var: Var, value: Phantom) -> Phantom:
    """A received phantom, checked as the tensor it stands for would be: the declared dtype,
    and rows of the declared height and width, or the declared shape."""
    if value.is_rows:
        fits = value.height == var.shape[0] and value.shape[1:] == tuple(var.shape[1:])
    else:
        fits = _shape_matches(var.shape, value.shape)
    if not fits or value.dtype != np.dtype(var.dtype):
        raise ProtocolViolation(f"var {name!r}: expected {var.dtype}{list(var.shape)}, got {value}",
                                var=name)
    return value


def _shape_matches(declared: tuple[int, ...], actual: tuple[int, ...]) -> bool:
    return len(declared) == len(actual) and all(d in (-1, a) for d, a in zip(declared, actual))


__all__ = ["INITIAL_STEP", "PserverService", "ProtocolViolation", "ServeConfig", "ServerStats",
           "BlockRef"]
