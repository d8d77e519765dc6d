"""The pserver service: `listen_and_serv` of a transpiled pserver program, over a `Transport`.

It owns a `Scope` initialized by the pserver's startup program and answers the trainers:

- SEND: gradients (or geo deltas) are checked against this server's vars (name known, dtype and
  shape as declared, rows in range) *before* anything is stored, so a bad message gets an error
  reply that names it and leaves the state bit-identical. Sync mode stores them for the step's
  optimize; the other modes run the gradient's optimize block at once. A SEND with ``fetch``
  (the bundled protocol) also carries the round's GET, and is answered as that GET.
- SEND_BARRIER / FETCH_BARRIER (sync): counted by `protocol.SyncRound`. When every live
  trainer's send barrier is in, the LR block and the optimize blocks run (the fan-in average
  divides by the trainers that actually contributed), then deferred GETs are answered.
- GET: the current values of the named vars; in sync mode, the values after this step's update.
- PREFETCH: rows of the distributed table by id (the prefetch blocks; in sync mode a step's
  prefetches read the table as the last step left it), or, with an extra ``table`` field, rows
  of that param block by row (remote sparse update). See `runtime.execution.table`, which also turns
  the table's global ids into rows of this server's shard, and averages the trainers' table grads
  in sync mode: the program sums them, as the original did, which would step N trainers N times
  as far as local training; dividing each trainer's piece by the contributors first is a
  deliberate fix.
- CHECKPOINT_NOTIFY (extra ``dir``, which must name the configured ``checkpoint_dir``: a message
  never chooses where a pserver writes): the whole state is saved to ``dir/<server name>/``, the
  table by the program's checkpoint block (see `runtime.services.checkpoint`); the message is
  handled in one piece, so the checkpoint is one consistent state. ``load_from=dir`` starts a server
  from such a checkpoint, its sync round at the step the checkpoint was taken before.
- Periodic checkpoints: with `ServeConfig.checkpoint_every` k, the state is saved to
  ``checkpoint_dir/<server name>/`` each time the sync round reaches a multiple of k (in the
  asynchronous modes, each time a trainer's step does).
- Recovery (``recovering=True``: this server replaces one that crashed; it starts from the last
  checkpoint if there is one, else from its startup state): in sync mode, a trainer's first
  message for a step at or past the restored one is answered with a REPLY carrying
  ``rewind: <step>``; the trainer abandons its step, fetches the parameters again and redoes the
  steps from there (the other pservers, already past them, acknowledge the redone sends as
  stale), so no update is applied twice on any server and at most k steps are redone.
- COMPLETE: the trainer leaves the fan-in; the server stops when every trainer has completed,
  after answering retries of lost acknowledgements for `ServeConfig.drain` seconds of quiet,
  or at once when every completed trainer has said BYE (it has its acknowledgement and sends
  nothing more).
- HEARTBEAT: proof of life. A trainer that has been silent for `heartbeat_timeout` (in sync
  mode, one the round waits for) is dropped from the fan-in and the event is logged; the time
  the server itself was not running (its watchdog woke late) is nobody's silence. A dropped sync
  trainer that speaks again is told to join again (``rejoin: <step>``). The server stops once
  every trainer has completed or been dropped (and one at least completed).
  A server on its own (`ServeConfig.give_up_without_trainers`) also stops, raising
  `TrainersGone`, when no trainer has been heard from for `heartbeat_timeout` and none
  completed: nobody is left to restart them.

Timing mode (phantom kernels): trainers send `Phantom`s, checked against the declarations like
tensors and stored as they are; the blocks then compute shapes only, GETs answer phantoms, and
byte counts are what the messages would weigh with data (`wire.charged_size`). Checkpoints need
real values and are refused.

Layers: this module is the IO shell. The protocol itself is `pserver_core.PserverCore`, which
takes events (a decoded request, a watchdog tick, the end of an action) and yields actions
(`pserver_actions`: reply, run blocks, optimize, save a checkpoint, stop, ...) with no IO; what
differs between the modes is one `ModePolicy` per mode (`pserver_sync`, `pserver_async`,
`pserver_half_async`, `pserver_geo`, `pserver_dc_asgd`); the values live in a `Store`; what the
program asks of the server is its `listen_and_serv` contract
(`transpiler.distribute.contract`). The shell receives frames, decodes them, feeds the core,
performs its actions (replies through the `Transport`, blocks through the `Executor` with their
compute charged, checkpoints) and keeps the stats and the cost meter.

Requests are deduplicated by (sender, message id): a retry gets the first reply again, and a
retry of a request still waiting (deferred until the round moves on) gets a ``pending`` notice,
so the trainer knows this server is alive and waits on rather than timing out on it: a request
times out only on a server that has gone silent, and the error names that one. Any failure in
handling one message becomes an error reply to its sender; the server keeps serving.

Identity: over an authenticating transport (CURVE, `runtime.network.curve`) the peer is the
owner of the key the message came with, and a request whose header names another sender (its
``src``, or its ``trainer`` id) is refused with an error reply before the core sees it, and
counted in `ServerStats.refused`: a trainer's key speaks for that trainer only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Awaitable
from typing import Any

import numpy as np

from transpiler.distribute.contract import ServeContract
from transpiler.distribute.lookup_table import CHECKPOINT_PATH_VAR
from transpiler.ir import BlockRef, Program

from runtime.config.metrics import PserverCounters
from runtime.config.nodes import claimed_trainer
from runtime.execution.compute import Charge, ComputeModel, Tracer
from runtime.execution.costs import RECEIVES, SENDS, Meter
from runtime.execution.executor import AttrOverrides, Executor, block_locals
from runtime.execution.scope import Scope
from runtime.execution.table import TouchedRows, tracked_rows
from runtime.network.refusals import RefusalLog
from runtime.network.transport import Frame, Transport, TransportClosed
from runtime.network.wire import (DEFAULT_MAX_HEADER_SIZE, MAX_DETAIL, DecodeError, Kind,
                                  Message, WireError, charged_size, clip, decode, encode,
                                  error_reply)
from runtime.services import checkpoint
from runtime.services.messages import TRAINER_FIELD
from runtime.services.protocol import INITIAL_STEP, SyncRound
from runtime.services.pserver_actions import (Action, Begin, Optimize, Pay, Reject, Replay, Reply,
                                              RunBlocks, SaveCheckpoint, Stop, Tally, Work)
from runtime.services.pserver_core import PserverCore
from runtime.services.pserver_messages import ProtocolViolation
from runtime.services.pserver_store import Store

log = logging.getLogger(__name__)


class TrainersGone(RuntimeError):
    """A server with `ServeConfig.give_up_without_trainers` stopped: no trainer is left."""

    def __init__(self, node: str, why: str) -> None:
        super().__init__(f"{node} gave up: its trainers are gone: {why}")
        self.node = node


class PserverFailure(RuntimeError):
    """The server cannot go on (an optimize step failed); names the node and the cause."""

    def __init__(self, node: str, cause: BaseException) -> None:
        super().__init__(f"{node} stopped: {type(cause).__name__}: {cause}")
        self.node = node


class ServerStats(PserverCounters):
    """What a pserver counts as it serves (`PserverCounters`: the fields of its run record),
    and how an action's `Tally` counts into it. The node adds what its transport refused
    (``refused``, ``unauthenticated``) at the end."""

    def tally(self, stat: str, value: int | float, key: int | None, peak: bool) -> None:
        """Count `value` into `stat` (see `pserver_actions.Tally`)."""
        counted = getattr(self, stat)
        if peak:
            setattr(self, stat, value if counted is None else max(counted, value))
        elif key is not None:
            table = {} if counted is None else counted
            table[key] = table.get(key, 0) + value
            setattr(self, stat, table)
        elif isinstance(counted, list):
            counted.append(value)
        else:
            setattr(self, stat, counted + value)


@dataclass(frozen=True)
class ServeConfig:
    heartbeat_timeout: float = 10.0
    max_message_size: int = 1 << 30
    """Largest message (all its frames) decoded; a larger one gets an error reply."""
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    """Largest header frame decoded (checked before msgpack parses it)."""
    trainer_names: tuple[str, ...] | None = None
    """The job's trainers' node names, by trainer id: a request of trainer i must come from
    `trainer_names[i]`. None: each trainer id is bound to the name its first request came
    from."""
    # After the last trainer completed, go on answering retries (a lost reply to COMPLETE is
    # resent) until the trainers have been quiet this long.
    drain: float = 1.0
    # A trainer never heard from is dropped after this long (processes start slowly; a
    # heartbeat timeout below the start-up time would drop every trainer at once).
    startup_grace: float = 60.0
    checkpoint_every: int | None = None
    checkpoint_dir: Path | None = None
    # On its own (no supervisor to restart the trainers: `runtime up --role`, a pod), a server
    # whose trainers are all gone (`PserverCore.trainers_gone`) stops with `TrainersGone`
    # instead of waiting for them until its deadline.
    give_up_without_trainers: bool = False
    on_nonfinite: str = "refuse"
    """What a SEND holding NaN, infinities or out-of-range values gets: an error reply
    (``refuse``), its step's update skipped (``skip_step``), or applied (``allow``)."""

    def __post_init__(self) -> None:
        if self.checkpoint_every is not None and (self.checkpoint_every < 1
                                                  or self.checkpoint_dir is None):
            raise ValueError(f"checkpoint_every must be >= 1 and needs a checkpoint_dir: {self}")


class PserverService:
    """The IO shell of a pserver: frames in, the core's actions performed (see the module)."""

    def __init__(self, program: Program, startup: Program, transport: Transport,
                 executor: Executor | None = None, config: ServeConfig | None = None,
                 compute: ComputeModel | None = None, tracer: Tracer | None = None,
                 load_from: Path | str | None = None, recovering: bool = False,
                 scope: Scope | None = None) -> None:
        """`scope`: one that `startup` already ran in (a Paddle script runs the pserver's
        startup program itself before serving), used as it is; by default a fresh one that
        `startup` runs in here."""
        self.program = program
        self.transport = transport
        self.executor = executor or Executor()
        self.config = config or ServeConfig()
        if scope is None:
            scope = Scope()
            self.executor.run(startup, scope=scope)
        self.scope = scope
        self.contract = ServeContract.of(program)
        self.store = Store(program, self.contract, self.scope, self.executor.backend == "phantom")
        self.state = checkpoint.state_vars(program, startup)
        self.store.touched = TouchedRows(tracked_rows(self.store.table, self.state),
                                         checkpoint.COMPACT_AT)
        self.stats = ServerStats()
        self.name = transport.name
        self.refusals = RefusalLog(log, self.name)
        """The refused requests, logged so that no peer can flood the log; its counts by reason
        are the run record's (one dict)."""
        self.stats.refusals = self.refusals.counts
        self.charge = Charge(self.name, compute, tracer)
        self.meter: Meter | None = None
        """Measures what each message, round and op costs this node (`runtime profile`)."""
        every = self.config.checkpoint_every if self.config.checkpoint_dir is not None else None
        self.core = PserverCore(
            self.store, name=self.name, clock=_loop_time,
            heartbeat_timeout=self.config.heartbeat_timeout,
            startup_grace=self.config.startup_grace, checkpoint_every=every,
            start_step=0 if load_from is None else self._restore(Path(load_from)),
            recovering=recovering, checkpoint_dir=self.config.checkpoint_dir,
            trainer_names=self.config.trainer_names, on_nonfinite=self.config.on_nonfinite,
            held_bytes=2 * self.config.max_message_size)
        if recovering:
            self.stats.restored_step = self.core.round.step
        self._done = asyncio.Event()
        self._departed = asyncio.Event()
        """Every completed trainer said BYE: nothing to drain."""
        self._last_message = 0.0
        self._began = 0.0  # when the request being handled began (its update's start)
        self._replays: list[float] = []  # meter starts of the replays under way

    @property
    def receivable(self) -> frozenset[str]:
        """The vars trainers may SEND here."""
        return self.contract.received

    @property
    def round(self) -> SyncRound:
        """The fan-in and the step this server is at."""
        return self.core.round

    # -- serving loop ---------------------------------------------------------------------------
    async def serve(self, endpoint: str) -> ServerStats:
        """Bind `endpoint` and answer trainers until every one has completed."""
        await self.transport.bind(endpoint)
        if self.meter is not None:
            self.meter.begin_run()
        loop = asyncio.get_running_loop()
        self.charge.bind(loop)
        self.core.clock = loop.time  # the loop's own clock, not asked for at every request
        self.refusals.clock = loop.time
        self.core.start()
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
            self.refusals.flush()
            if self.meter is not None:
                self.meter.end_run()
        failures = [r for r in results if isinstance(r, Exception)]
        if failures and isinstance(failures[0], TrainersGone):
            raise failures[0]
        if failures:  # an optimize step failed: the server's state is no longer trustworthy
            raise PserverFailure(self.name, failures[0]) from failures[0]
        return self.stats

    async def _drain(self) -> None:
        """Keep answering (retried requests get their first replies again) until no message
        has come for `drain` seconds, or every completed trainer has said BYE."""
        loop = asyncio.get_running_loop()
        while not self._departed.is_set():
            until = self._last_message + self.config.drain  # a message moves it later
            if loop.time() >= until:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(until):
                    await self._departed.wait()

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
                rest = self._handle_now(peer, frames)[1]
                if rest is not None:
                    await rest
                continue
            started = meter.start()
            kind, rest = self._handle_now(peer, frames)
            if rest is not None:
                await rest
            meter.stop_message(started, RECEIVES, kind, nbytes)

    def _handle_now(self, peer: str, frames: list[Any]) -> tuple[str, Awaitable[None] | None]:
        """Decode one message and feed it to the core, as far as that needs no wait: its kind
        (for the meter), and what is left to await (None: nothing)."""
        try:
            msg = decode(frames, self.config.max_message_size, self.config.max_header_size)
        except DecodeError as exc:
            return Kind.ERROR.value, self._reject(Reject(peer, exc, None))
        if msg.src != peer:  # a node speaks for itself only: its state is kept under its name
            self.stats.refused += 1
            return Kind.ERROR.value, self._reject(Reject(peer, ProtocolViolation(
                f"{msg.kind} says it is from {msg.src!r} but came from {peer!r}"), msg))
        if self.transport.authenticated:
            claim = impersonation(peer, msg)
            if claim is not None:
                self.stats.refused += 1
                return Kind.ERROR.value, self._reject(Reject(peer, ProtocolViolation(claim), msg))
        kind = msg.kind._value_  # `.value` is a property: a Python call each time
        by_kind = self.stats.messages_by_kind
        by_kind[kind] = by_kind.get(kind, 0) + 1
        if msg.kind is Kind.HEARTBEAT:
            self.stats.heartbeat_bytes += charged_size(frames)
        return kind, self._drive_now(self.core.on_message(peer, msg))

    async def _watchdog(self) -> None:
        """Have the core drop the trainers silent too long, four times per timeout. A wake-up
        later than asked is time this server was not running (the machine paused or
        overloaded): the core does not count it as the trainers' silence."""
        period = min(self.config.heartbeat_timeout, self.config.startup_grace) / 4
        clock = asyncio.get_running_loop().time
        while True:
            due = clock() + period
            await asyncio.sleep(period)
            await self._drive(self.core.on_tick(paused=max(0.0, clock() - due)))
            if self.config.give_up_without_trainers and (why := self.core.trainers_gone()):
                raise TrainersGone(self.name, why)

    # -- performing the core's actions -----------------------------------------------------------
    async def _drive(self, work: Work) -> None:
        """Perform `work`'s actions one by one, resuming it with each one's result, or
        throwing into it what the action raised."""
        rest = self._drive_now(work)
        if rest is not None:
            await rest

    def _drive_now(self, work: Work) -> Awaitable[None] | None:
        """`_drive` as far as the actions need no wait: None, `work` is done; else what is
        left of it, to await. A message whose handling never waits (most) costs no
        coroutine."""
        rest = self._advance(work, None, None)
        return None if rest is None else self._drive_after(work, rest)

    async def _drive_after(self, work: Work, rest: Awaitable[Any]) -> None:
        """Drive `work` on once `rest`, the action under way, is done."""
        waiting: Awaitable[Any] | None = rest
        while waiting is not None:
            result: Any = None
            failure: Exception | None = None
            try:
                result = await waiting
            except Exception as exc:
                failure = exc
            waiting = self._advance(work, result, failure)

    def _advance(self, work: Work, result: Any,
                 failure: Exception | None) -> Awaitable[Any] | None:
        """Resume `work` with `result` (or throw `failure` into it) and perform its actions
        until one needs a wait: None, `work` is done; else that action's rest, to await."""
        while True:
            try:
                action = work.send(result) if failure is None else work.throw(failure)
            except StopIteration:
                return None
            result, failure = None, None
            try:
                rest = self._perform_now(action)
            except Exception as exc:
                failure = exc
                continue
            if rest is not None:
                return rest

    def _perform_now(self, action: Action) -> Awaitable[Any] | None:
        """Perform `action` as `_perform` would, as far as it needs no wait: None, it is done
        (its result is None); else what is left of it, to await for its result. Most actions
        need no wait (a reply the transport takes at once, bookkeeping, a request that owes no
        compute), and a coroutine for each would cost every message."""
        kind = type(action)
        if kind is Begin:
            self._began = self.charge.clock()
        elif kind is Reply:  # measured or not, the same path: a profile prices this one
            assert isinstance(action, Reply)
            meter = self.meter
            started = 0.0 if meter is None else meter.start()
            frames = self._encode_reply(action.peer, action.message)
            if frames is None:
                if meter is not None:
                    meter.discard(started)
                return None
            nbytes = self._count_out(frames)
            if not self._send_nowait(action.peer, frames):
                return self._reply_later(action, frames, nbytes, started)
            if meter is not None:
                meter.stop_message(started, SENDS, action.message.kind.value, nbytes)
            if action.heartbeat:
                self.stats.heartbeat_bytes += nbytes
        elif kind is Pay and self.charge.owed <= 0:  # nothing to wait for on the clock
            assert isinstance(action, Pay)
            self._paid(action.update_step)
        elif kind is RunBlocks or kind is Tally or kind is Replay or kind is Stop:
            self._bookkeep(action)
        else:
            return self._perform(action)
        return None

    async def _perform(self, action: Action) -> Any:
        """Perform an action that may wait (what `_perform_now` leaves)."""
        match action:
            case Reject():
                await self._reject(action)
            case Pay(update_step=step):
                await self.charge.pay()  # the compute this request's handling caused
                self._paid(step)
            case Optimize():
                await self._optimize(action)
            case SaveCheckpoint(step=step, directory=None):  # a periodic checkpoint
                return self._periodic_checkpoint(step)
            case SaveCheckpoint(step=step, directory=Path() as directory):
                return self.save_checkpoint(directory, step)
        return None

    def _paid(self, update_step: int | None) -> None:
        """A request's compute is paid; one that applied an update counts as optimize time."""
        if update_step is not None:
            self.stats.optimize_seconds += self.charge.clock() - self._began
            self.stats.steps = max(self.stats.steps, update_step)

    def _bookkeep(self, action: Action) -> None:
        """Perform a bookkeeping action (blocks run, a tally, a replay metered, the stop)."""
        match action:
            case RunBlocks(blocks=blocks):
                for idx in blocks:
                    self._run(idx)
            case Tally(stat=stat, value=value, key=key, peak=peak):
                self.stats.tally(stat, value, key, peak)
            case Replay():
                self._meter_replay(action)
            case Stop(drain=drain):
                self._done.set()
                if not drain:
                    self._departed.set()

    def _encode_reply(self, peer: str, reply: Message) -> list[Frame] | None:
        """The frames of `reply`; None (logged) if it cannot be encoded."""
        try:
            return encode(reply)
        except WireError as exc:  # a reply this server cannot encode is its own bug: say so
            log.error("%s: cannot encode its reply to %s: %s", self.name, clip(peer, 256), exc)
            return None

    def _count_out(self, frames: list[Frame]) -> int:
        """Count the reply `frames` in the bytes out; the bytes they weigh."""
        nbytes = charged_size(frames)
        self.stats.bytes_out += nbytes
        return nbytes

    def _send_nowait(self, peer: str, frames: list[Frame]) -> bool:
        """Send `frames` to `peer` if the transport can without waiting (or it failed: logged);
        False: it cannot, `_send_later`."""
        try:
            return self.transport.send_nowait(peer, frames)
        except Exception as exc:  # the trainer went away; it will retry or be dropped
            log.warning("%s: cannot reply to %s: %s", self.name, peer, exc)
            return True

    async def _reply_later(self, action: Reply, frames: list[Frame], nbytes: int,
                           started: float) -> None:
        """The rest of a reply the transport could not take at once (`_perform_now`)."""
        await self._send_later(action.peer, frames, nbytes if action.heartbeat else 0)
        if self.meter is not None:
            self.meter.stop_message(started, SENDS, action.message.kind.value, nbytes)

    async def _send_later(self, peer: str, frames: list[Frame], heartbeat_bytes: int = 0) -> None:
        """Send `frames` to `peer`, waiting as the transport needs; `heartbeat_bytes`: the bytes
        of a heartbeat's acknowledgement, counted once it is sent."""
        try:
            await self.transport.send(peer, frames)
        except Exception as exc:  # the trainer went away; it will retry or be dropped
            log.warning("%s: cannot reply to %s: %s", self.name, peer, exc)
        self.stats.heartbeat_bytes += heartbeat_bytes

    async def _reject(self, action: Reject) -> None:
        msg = action.request
        reply = error_reply(self.name, action.error, request_id=None if msg is None else msg.id,
                            step=0 if msg is None else msg.step)
        reason = reply.extra["error"]["reason"]
        self.refusals.refused(action.peer, reason, f"rejected a message from "
                              f"{clip(action.peer, 256)}: {clip(str(action.error), MAX_DETAIL)}")
        if not action.answered:
            return
        self.stats.errors += 1
        rest = self._perform_now(Reply(action.peer, reply))  # sent as every reply is
        if rest is not None:
            await rest

    async def _optimize(self, action: Optimize) -> None:
        """A sync round's update: its blocks, the round's overhead, then their compute."""
        start = self.charge.clock()
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        for idx in action.blocks:
            self._run(idx, action.overrides)
        self.charge.add_overhead("round")
        await self.charge.pay()
        if meter is not None:
            meter.stop_round(started)
        self.stats.optimize_seconds += self.charge.clock() - start

    def _run(self, block_idx: int, overrides: AttrOverrides | None = None) -> None:
        """Run one block and charge its ops to this node's modelled compute time."""
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        block = self.program.blocks[block_idx]
        self.executor.run_block(self.program, block_idx, self.scope, overrides, keep_locals=True)
        if meter is not None:
            meter.stop_ops(started, len(block.ops))
        self.charge.step = self.core.round.step
        for op in block.ops:  # priced by the values they wrote, the block's own vars included
            self.charge.add(op, self.scope)
        self.store.touched.mark_block(block.ops, self.scope)
        if block_idx != 0:
            self.scope.drop(block_locals(block))

    def _meter_replay(self, action: Replay) -> None:
        """Meter a deferred request's handling again, from its replay to its `done`."""
        meter = self.meter
        if meter is None:
            return
        if not action.done:
            self._replays.append(meter.start())
        else:
            meter.stop_message(self._replays.pop(), RECEIVES, action.kind, 0, again=True)

    # -- checkpoints ------------------------------------------------------------------------------
    def save_checkpoint(self, directory: Path, step: int | None = None) -> Path:
        """Save the whole state to ``directory/<name>/`` (see `runtime.services.checkpoint`), as the
        state before `step` (default: the sync round's first step not applied). The table's
        state is written as the rows written since the previous checkpoint where it can be;
        else whole, the table by the program's checkpoint block."""
        table, touched = self.store.table, self.store.touched
        with checkpoint.Staging(directory / self.name) as stage:
            deltas = {name for name in touched.tracked
                      if stage.write_delta(name, self.scope.get(name), touched.rows(name),
                                           touched.since)}
            if table is not None and table.checkpoint_block >= 0 and table.table not in deltas:
                path = stage.file_of(table.table)
                self.scope.put(CHECKPOINT_PATH_VAR, np.array(str(path)))
                self._run(table.checkpoint_block)
            stage.commit({name: self.scope.get(name) for name in self.state},
                         self.core.steps_applied() if step is None else step)
        touched.reset(stage.id)
        return stage.target

    def _periodic_checkpoint(self, step: int) -> Path | None:
        """Save the periodic checkpoint before `step`; where the disk refuses (full, or any
        `OSError`), skip it with a warning: the previous checkpoint stays whole and in place,
        and the server serves on (a lost checkpoint costs redone steps after a crash, not the
        job)."""
        assert self.config.checkpoint_dir is not None
        try:
            path = self.save_checkpoint(self.config.checkpoint_dir, step)
        except Exception as exc:
            cause = disk_error(exc)
            if cause is None:
                raise
            log.warning("%s: checkpoint before step %d skipped, the previous one kept: %s",
                        self.name, step, cause)
            return None
        self.stats.checkpoints.append(step)
        return path

    def _restore(self, directory: Path) -> int:
        """Load the state saved in ``directory/<name>/``; the step it was saved before."""
        saved = checkpoint.load(directory / self.name, self.state)
        for name, value in saved.values.items():
            self.scope.put(name, value)
        self.store.touched.reset(saved.id)
        log.info("%s: restored the state before step %d from %s", self.name, saved.step,
                 directory / self.name)
        return saved.step


def disk_error(exc: BaseException) -> OSError | None:
    """The `OSError` behind `exc` (itself, or a cause it wraps, as a kernel's error wraps a
    `save` op's), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__
    return None


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


__all__ = ["INITIAL_STEP", "PserverService", "ProtocolViolation", "ServeConfig", "ServerStats",
           "BlockRef"]


def impersonation(peer: str, msg: Message) -> str | None:
    """Why `msg`, which came with the key of `peer`, claims to be another node's; None if it
    does not. The ``trainer`` field is checked where present (the core refuses a request
    without one)."""
    if msg.src != peer:
        return f"message claims sender {msg.src!r} but comes with the key of {peer!r}"
    trainer = msg.extra.get(TRAINER_FIELD)
    if trainer is not None and claimed_trainer(trainer) != peer:
        return f"message claims trainer id {trainer!r} but comes with the key of {peer!r}"
    return None
