"""The pserver's protocol with no IO: events in, actions out (the h11 idea, for a server).

Events are method calls, each returning a stream of actions (`pserver_actions`) that the IO
shell (`pserver.PserverService`) performs one at a time, resuming the stream after each:

- `on_message(peer, msg)`: a decoded request from a trainer;
- `on_tick()`: the watchdog's check for trainers silent too long;
- the end of an action: resuming the stream after `Optimize` is the completed optimize, after
  `SaveCheckpoint` it carries the path written; an action that failed is thrown into the
  stream (a request's failure becomes its error reply; a failed optimize ends the server).

The core holds what every mode shares: the fan-in (`protocol.SyncRound`), replies to recent
requests (`protocol.Dedupe`), the requests deferred until the round moves on, the trainers'
liveness, recovery after a crash, periodic checkpoints, and the pserver's values (`Store`,
plain in-memory state). What the modes do differently is asked of the server's `ModePolicy`
(`POLICIES`: sync, async, half_async, geo, dc_asgd, ssp).

DESIGN: deferred requests are replayed by one loop over a stack of levels (`_settle`), in
the order a recursive "after each answer, move the round on and replay what waited" gives:
a replayed request that is answered opens a level of its own (the round may move on again),
which ends before the next deferred request is replayed. The order of replies, and so the
traces of a run, are those of that recursion, without the recursion.

DESIGN: the streams are generators, resumed by the shell only after it performed the last
action (awaiting a send or the modelled compute), so every effect on the values and the
clock happens in the same order as in a handler that awaited its IO in place.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from transpiler.distribute.contract import ServeContract

from runtime.execution.tensor import Phantom, nbytes_of
from runtime.network.wire import Kind, Message
from runtime.services.messages import (ENTRY_FIELD, FANIN_FIELDS, FETCH_FIELD, PENDING_FIELD,
                                       REJOIN_FIELD, REWIND_FIELD, SERVER_STEP_FIELD,
                                       TRAINER_FIELD)
from runtime.services.protocol import Dedupe, Event, Phase, Recall, SyncRound, Verdict
from runtime.services.pserver_actions import (Begin, Pay, Reject, Replay, Reply, RunBlocks,
                                              SaveCheckpoint, Stop, Tally, Work)
from runtime.services.pserver_async import AsyncPolicy
from runtime.services.pserver_dc_asgd import DcAsgdPolicy
from runtime.services.pserver_geo import GeoPolicy
from runtime.services.pserver_half_async import HalfAsyncPolicy
from runtime.services.pserver_messages import (CheckpointNotify, Get, Join, NotInFanIn, Payload,
                                               Prefetch, ProtocolViolation, Send, parse,
                                               trainer_of)
from runtime.services.pserver_policy import ModePolicy
from runtime.services.pserver_ssp import SspPolicy
from runtime.services.pserver_store import Store
from runtime.services.pserver_sync import SyncPolicy

log = logging.getLogger("runtime.services.pserver")

POLICIES: dict[str, type[ModePolicy]] = {
    p.name: p for p in (SyncPolicy, AsyncPolicy, HalfAsyncPolicy, GeoPolicy, DcAsgdPolicy,
                        SspPolicy)}


def policy_name(contract: ServeContract) -> str:
    """The policy that serves `contract`'s program, as the transpiler named it
    (`transpiler.distribute.modes`)."""
    return contract.policy


DROPS_SUSPECT = 3
"""Drops of one trainer after which the heartbeat timeout is suspected too short."""

_BEGIN = Begin()
_PAY = Pay()
"""The actions most requests yield, made once (they are immutable)."""
_DRAIN = Stop(drain=True)
_NOW = Stop(drain=False)
"""The stops: after answering late retries, or at once (every completed trainer said BYE)."""


@dataclass
class _Level:
    """One pass of "move the round on, replay what waited"; `replayed`: the deferred request
    whose answer opened it (None: the event's own)."""

    replayed: str | None
    batch: deque[tuple[str, Message]] = field(default_factory=deque)


class PserverCore:
    def __init__(self, store: Store, *, name: str, clock: Callable[[], float],
                 heartbeat_timeout: float, startup_grace: float,
                 checkpoint_every: int | None = None, start_step: int = 0,
                 recovering: bool = False, checkpoint_dir: Path | None = None,
                 trainer_names: tuple[str, ...] | None = None,
                 on_nonfinite: str = "refuse", held_bytes: int = 1 << 30) -> None:
        self.store = store
        self.on_nonfinite = on_nonfinite
        """What a SEND holding NaN, infinities or out-of-range values gets (`_sound`)."""
        self.held_budget = (held_messages(store.contract), held_bytes)
        """The most requests, and bytes of values, one sender may have deferred here
        (`_check_budget`)."""
        self.holding: dict[str, tuple[int, int]] = {}
        """Sender -> the requests and bytes of values it has deferred here now."""
        self.name = name
        self.clock = clock
        self.heartbeat_timeout = heartbeat_timeout
        self.startup_grace = startup_grace
        self.checkpoint_every = checkpoint_every
        self.checkpoint_dir = checkpoint_dir
        """Where every checkpoint goes, the job's choice; a message cannot move it."""
        self.round = SyncRound(store.contract.trainers, step=start_step)
        self.dedupe = Dedupe()
        self.deferred: list[tuple[str, Message]] = []
        self.taken: set[tuple[str, int]] = set()
        """The deferred SENDs whose gradients are in, held for the GET they carry: replayed,
        they are answered as that GET and not applied again, whatever the mode's verdict."""
        self.pending: set[tuple[str, int]] = set()
        self.last_seen: dict[int, float] = {}
        self.senders: dict[int, str] = dict(enumerate(trainer_names or ()))
        """Trainer -> the node name it speaks under (the job's, or its first request's)."""
        self.serving_since = 0.0
        self.drops: dict[int, int] = {}
        """Trainer -> how often it was dropped (`_count_drop`)."""
        self._said_timeout = False
        self.departed: set[int] = set()
        """Completed trainers that said BYE: they will send nothing more."""
        self.next_step: dict[int, int] = {}  # trainer -> the step after its latest message
        self.progress = 0  # the furthest step reached (asynchronous: by any trainer)
        self.resynced: set[int] | None = None  # recovering: trainers told to rewind, or rewound
        self.optimizing = False
        self._last_fanin: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
        """The fields of the latest fetch reply, and the dict made of them (`_fanin_state`)."""
        self._last_values: dict[str, Any] = {}
        """The values of the latest fetch reply (`_shared_values`)."""
        self.policy = POLICIES[policy_name(store.contract)](self)
        if recovering:
            self.resynced = set()
            self.progress = self.round.step

    # -- events ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Serving begins: trainers never heard from are dropped after the start-up grace."""
        self.serving_since = self.clock()

    def on_message(self, peer: str, msg: Message) -> Work:
        if msg.kind is Kind.BYE:  # wants no reply: neither remembered nor answered
            yield from self._on_bye(msg)
            return
        recall, held = self.dedupe.lookup(msg.src, msg.id)
        if recall is Recall.ANSWERED:  # a retry: the first reply again
            self._heard(msg)
            yield Reply(peer, self._recalled(msg, held))
            return
        if (msg.src, msg.id) in self.pending:  # a retry of a deferred request: still waiting
            self._heard(msg)
            yield Reply(peer, Message.of(Kind.REPLY, msg.id, self.name, self.round.step, extra={
                PENDING_FIELD: True, SERVER_STEP_FIELD: self.round.step}))
            return
        if recall is not Recall.NEW:  # its reply is gone
            if msg.kind is Kind.HEARTBEAT:  # it changes nothing: answered again, not an error
                yield Reply(peer, self._reply(msg), heartbeat=True)
            elif recall is Recall.OUTRUN:  # a late copy: its sender is past it, waits for none
                yield Tally("late_copies")
            else:
                yield Reject(peer, self._forgotten(msg), msg)
            return
        answered = yield from self._handle(peer, msg)
        if answered or (msg.kind is Kind.SEND and FETCH_FIELD in msg.extra):
            yield from self._settle()  # a SEND deferred as its GET may have closed the round

    def on_tick(self, paused: float = 0.0) -> Work:
        """Drop the trainers silent too long among those the policy waits for. `paused`: how
        long since the previous tick this server was itself not running (its watchdog woke
        that late: the machine paused or overloaded).

        DESIGN: silence is counted in time the server was listening. What a trainer sent while
        the server was paused waits unread, so that time is no evidence against it; a server
        that counted it would drop every trainer after a pause longer than the timeout."""
        if paused > 0:
            self._excuse(paused)
        now = self.clock()
        silent = [(t, why) for t in sorted(self.policy.waited_for())
                  for why in [self._silence(t, now)] if why]
        for trainer, why in silent:
            self.round.leave(trainer, completed=False)
            yield Tally("dropped", trainer)
            log.warning("%s: dropped trainer %d from the fan-in at step %d: %s", self.name,
                        trainer, self.round.step, why)
            self._count_drop(trainer)
        if silent:
            yield from self._settle()

    # -- one request
    # ----------------------------------------------------------------------------------
    def _handle(self, peer: str, msg: Message) -> Work:
        """Handle `msg`; returns whether it was answered (not deferred, refused or rewound)."""
        trainer_known = False
        try:
            handler = _HANDLERS.get(msg.kind)
            if handler is None:
                raise ProtocolViolation(f"{msg.kind} is not a request a pserver serves (a reply, "
                                        "an error or a trainer-to-trainer message)",
                                        reason="not_a_request")
            trainer = trainer_of(msg)
            self._check_sender(trainer, msg)
            trainer_known = True
            self.last_seen[trainer] = self.clock()
            before = self.next_step.get(trainer)
            if msg.step >= 0 and msg.kind not in (Kind.HEARTBEAT, Kind.COMPLETE):
                self.next_step[trainer] = max(before or 0, msg.step + 1)
                self.dedupe.moved_on(msg.src, msg.step)  # its older values: see `Dedupe`
            if self.resynced is not None and self._must_rewind(trainer, msg):
                yield Tally("rewinds")
                log.info("%s: trainer message %s at step %d: rewind to step %d", self.name,
                         msg.kind, msg.step, self.round.step)
                yield Reply(peer, self._reply(msg, {REWIND_FIELD: self.round.step}))
                return False
            yield _BEGIN
            reply = yield from handler(self, msg, trainer, parse(msg))
            if reply is None:
                self._check_budget(msg)
        except Exception as exc:  # one bad message must not stop the server, nor count
            self.pending.discard((msg.src, msg.id))
            self.taken.discard((msg.src, msg.id))
            if trainer_known:
                _restore(self.next_step, trainer, before)
            if isinstance(exc, NotInFanIn):  # dropped, yet alive: it is to join again
                log.info("%s: trainer %d, dropped, is alive: %s at step %d answered with a "
                         "notice to join again", self.name, trainer, msg.kind, msg.step)
                yield Reply(peer, self._reply(msg, {REJOIN_FIELD: self.round.entry_step()}))
            else:
                yield Reject(peer, exc, msg)
            return False
        if reply is None:  # deferred: answered after the next phase change
            self.pending.add((msg.src, msg.id))
            self.deferred.append((peer, msg))
            self._count_held(msg.src, msg, 1)
            return False
        update_step = self.policy.update_step(msg)
        yield _PAY if update_step is None else Pay(update_step)
        self.pending.discard((msg.src, msg.id))
        self.dedupe.remember(msg.src, msg.id, self._held(msg, reply),
                             values_of=msg.step if _fetches(msg) else None, step=msg.step)
        yield Reply(peer, reply, heartbeat=msg.kind is Kind.HEARTBEAT)
        return True

    def _settle(self) -> Work:
        """Move the round on while the policy can, replaying the deferred requests after each
        move (see the module's DESIGN note); Stop once every trainer is done."""
        if self.optimizing:  # a request came while the round's update is being computed
            return
        if self.policy.idle():  # as the loop below with nothing to replay, less its cost
            if self.round.finished:
                yield self._stop()
            return
        levels = [_Level(None)]
        while levels:
            level = levels[-1]
            if level.batch:
                peer, msg = level.batch.popleft()
                self._count_held(msg.src, msg, -1)
                self.pending.discard((msg.src, msg.id))
                yield Replay(msg.kind.value, done=False)
                if (yield from self._handle(peer, msg)) and not self.optimizing:
                    levels.append(_Level(msg.kind.value))
                else:
                    yield Replay(msg.kind.value, done=True)
            elif (yield from self.policy.advance()):
                level.batch, self.deferred = deque(self.deferred), []
            else:
                levels.pop()
                if self.round.finished:
                    yield self._stop()
                if level.replayed is not None:
                    yield Replay(level.replayed, done=True)

    def _check_budget(self, msg: Message) -> None:
        """Refuse to defer `msg` if its sender would then hold more requests or bytes here than
        `held_budget` allows: a trainer defers at most a step's requests (those of the step
        ahead, or reads waiting for the round), so more is a sender that does not follow the
        protocol, and holding it would cost memory without bound."""
        count, nbytes = self.holding.get(msg.src, (0, 0))
        most, budget = self.held_budget
        size = _values_nbytes(msg)
        if count + 1 > most or nbytes + size > budget:
            raise ProtocolViolation(
                f"{msg.kind} of step {msg.step} from {msg.src!r} not held: it would hold "
                f"{count + 1} requests ({nbytes + size} bytes) here waiting for later steps, "
                f"more than a step's {most} ({budget} bytes)", reason="held_too_much")

    def _count_held(self, sender: str, msg: Message, sign: int) -> None:
        """Count `msg` in (`sign` 1) or out of (-1) what `sender` has deferred here."""
        count, nbytes = self.holding.get(sender, (0, 0))
        count, nbytes = count + sign, nbytes + sign * _values_nbytes(msg)
        if count:
            self.holding[sender] = (count, nbytes)
        else:
            self.holding.pop(sender, None)

    # -- request kinds
    # -------------------------------------------------------------------------------
    def _on_send(self, msg: Message, trainer: int, send: Send) -> Work:
        """Take the gradients (unless stale); a SEND carrying the round's GET (`Send.fetch`)
        is then answered as that GET: deferred while the mode holds the read (a sync round's
        update, ssp's bound), and replayed then without taking its gradients again (`taken`)."""
        key = (msg.src, msg.id)
        if key not in self.taken:
            verdict = self.policy.verdict(Event.SEND, trainer, msg)
            if verdict is Verdict.DEFER:
                self.store.check(send.values, trainer)
                return None
            if verdict is not Verdict.STALE:
                checked = self.store.checked(send.values, trainer)
                self.policy.check_send(trainer, msg, list(checked), send.closes)
                if (yield from self._sound(msg, trainer, checked)):
                    names = self.store.put(checked, send.merge_add)
                    yield from self.policy.applied(trainer, msg, names)
                else:
                    self.policy.skipped(trainer, msg, list(checked))
                self.policy.arrived(Event.SEND, trainer, msg, send.closes)
        if send.fetch is None:
            return self._reply(msg)
        reply = yield from self._on_get(msg, trainer, send.fetch)
        if reply is None:
            self.taken.add(key)
        else:
            self.taken.discard(key)
        return reply

    def _sound(self, msg: Message, trainer: int, checked: dict[str, Any]) -> Work:
        """Whether `checked` values may be applied: True unless one holds NaN, an infinity or
        an out-of-range magnitude (`Store.nonfinite`), which is counted and then refused (an
        error reply naming the var) or, with ``on_nonfinite: skip_step``, acknowledged and
        left out (False: the policy skips the update it belonged to)."""
        if self.on_nonfinite == "allow":
            return True
        bad = self.store.nonfinite(checked)
        if not bad:
            return True
        yield Tally("nonfinite", key=trainer)
        name, (count, bound) = next(iter(bad.items()))
        what = (f"{msg.kind} of step {msg.step} from trainer {trainer}: {count} NaN, infinite or "
                f"out-of-range (beyond {bound:.3g}) value(s) in {name!r}")
        if self.on_nonfinite == "refuse":
            raise ProtocolViolation(f"{what}; refused (train.on_nonfinite: refuse)", var=name,
                                    reason="nonfinite")
        log.warning("%s: %s; the update it belongs to is skipped (train.on_nonfinite: "
                    "skip_step)", self.name, what)
        return False

    def _on_barrier(self, msg: Message, trainer: int, _: Payload) -> Work:
        event = Event.SEND_BARRIER if msg.kind is Kind.SEND_BARRIER else Event.FETCH_BARRIER
        if self.policy.barrier(event, trainer, msg) is Verdict.DEFER:
            return None
        return self._reply(msg)
        yield

    def _on_get(self, msg: Message, trainer: int, get: Get) -> Work:
        if (yield from self.policy.read(Event.GET, trainer, msg)) is Verdict.DEFER:
            return None
        values = self._shared_values(self.store.values(get.names))
        self.policy.served(trainer, values)
        self.policy.arrived(Event.GET, trainer, msg, get.closes)
        return Message.of(Kind.REPLY, msg.id, self.name, self.round.step, values,
                          self._fanin_state(trainer))

    def _on_prefetch(self, msg: Message, trainer: int, prefetch: Prefetch) -> Work:
        if (yield from self.policy.read(Event.PREFETCH, trainer, msg)) is Verdict.DEFER:
            return None
        if prefetch.by_row:
            rows = self.store.remote_rows(prefetch.table, prefetch.ids)
        else:
            rows = {}
            for name, ids, block in self.store.table_ids(prefetch.ids):
                self.store.scope.put(name, ids)
                yield RunBlocks((block.block,))
                rows[block.rows] = self.store.scope.get(block.rows)
        return Message.of(Kind.REPLY, msg.id, self.name, self.round.step, rows,
                          {SERVER_STEP_FIELD: self.round.step})

    def _on_checkpoint(self, msg: Message, trainer: int, notify: CheckpointNotify) -> Work:
        if self.store.timing:
            raise ProtocolViolation("CHECKPOINT_NOTIFY: this pserver runs in timing mode (phantom "
                                    "kernels) and holds no values to save")
        if self.optimizing:  # the update is applied but the round not moved on: wait for it
            return None
        path = yield SaveCheckpoint(self.steps_applied(), self.notified_dir(notify.directory))
        log.info("%s: saved the state before step %d to %s", self.name, self.steps_applied(), path)
        return self._reply(msg)

    def _on_complete(self, msg: Message, trainer: int, _: Payload) -> Work:
        if self.round.leave(trainer, completed=True):
            log.info("%s: trainer %d completed at step %d", self.name, trainer, self.round.step)
        return self._reply(msg)
        yield

    def _on_bye(self, msg: Message) -> Work:
        """A completed trainer has its reply to COMPLETE and will send nothing more. Once every
        completed trainer has said so, no retry can come: the server stops without draining
        (`Stop(drain=False)`). A BYE from anyone else (a trainer whose COMPLETE never came
        here, a stranger) changes nothing and, wanting no reply, gets no error either."""
        trainer = msg.extra.get(TRAINER_FIELD)
        if type(trainer) is not int or self.senders.get(trainer) != msg.src \
                or trainer not in self.round.completed:
            yield Reject(msg.src, ProtocolViolation(
                f"BYE as trainer {trainer!r} ignored: not a completed trainer of this job under "
                "that name", reason="bye_ignored"), msg, answered=False)
            return
        self.departed.add(trainer)
        if self.round.finished and self.round.completed <= self.departed:
            yield _NOW

    def _stop(self) -> Stop:
        """The round is finished: stop, draining unless every completed trainer said BYE."""
        return _NOW if self.round.completed <= self.departed else _DRAIN

    def _on_heartbeat(self, msg: Message, trainer: int, _: Payload) -> Work:
        return self._reply(msg)
        yield

    def _on_join(self, msg: Message, trainer: int, join: Join) -> Work:
        """A trainer that was not in the fan-in (late, dropped, restarted) takes part from
        step ``entry`` on, or later if this server is past it: the reply says which."""
        entry = self.policy.join(trainer, join.entry)
        if self.policy.sync:
            log.info("%s: trainer %d joins at step %d", self.name, trainer, entry)
        return self._reply(msg, {ENTRY_FIELD: entry})
        yield

    def _check_sender(self, trainer: int, msg: Message) -> None:
        """Refuse a request from a trainer outside this job, or under another name than the
        trainer's (its first message names it): only the job's trainers hold state here (their
        liveness, their replies remembered), at most one name each.

        DESIGN: a job's servers are told its trainers' names; a server that is not (a test's)
        binds each trainer id to the name of its first request. Either way a node restarted
        under the same name speaks as before."""
        if not 0 <= trainer < self.round.trainers:
            raise ProtocolViolation(f"trainer {trainer} is not one of the {self.round.trainers} "
                                    f"trainers of this job; {msg.kind} refused")
        known = self.senders.get(trainer)
        if known is None:
            if msg.src in self.senders.values():
                raise ProtocolViolation(f"{msg.src!r} already speaks for another trainer; "
                                        f"{msg.kind} as trainer {trainer} refused")
            self.senders[trainer] = msg.src
        elif known != msg.src:
            raise ProtocolViolation(f"trainer {trainer} is {known!r} on this server, not "
                                    f"{msg.src!r}; {msg.kind} refused")

    # -- replies ----------------------------------------------------------------------------------
    def _reply(self, msg: Message, extra: Mapping[str, Any] | None = None) -> Message:
        """An acknowledgement of `msg` saying where this server is, with `extra` fields."""
        return Message.of(Kind.REPLY, msg.id, self.name, self.round.step,
                          extra={SERVER_STEP_FIELD: self.round.step, **(extra or {})})

    def _held(self, msg: Message, reply: Message) -> Message | int:
        """What the dedupe holds of `reply` to `msg`: a plain acknowledgement (`_reply` without
        fields) as its step alone, which `_recalled` makes the same message again; any other
        reply as it is.

        DESIGN: a sync pserver holds each trainer's replies of its latest two steps, mostly
        acknowledgements: at 1,000 trainers and 100 pservers, 200,000 messages of 400 bytes
        each for a reply nobody asks for again unless a message is lost."""
        if (type(reply.step) is int and reply.kind is Kind.REPLY and reply.id == msg.id
                and reply.src == self.name and not reply.vars and len(reply.extra) == 1
                and type(reply.extra.get(SERVER_STEP_FIELD)) is int
                and reply.extra[SERVER_STEP_FIELD] == reply.step):
            return reply.step
        return reply

    def _recalled(self, msg: Message, held: Message | int) -> Message:
        """The reply to `msg` that the dedupe held as `held` (see `_held`)."""
        if isinstance(held, Message):
            return held
        return Message.of(Kind.REPLY, msg.id, self.name, held, extra={SERVER_STEP_FIELD: held})

    def _shared_values(self, values: dict[str, Any]) -> dict[str, Any]:
        """`values`, or the map the latest fetch was answered with if it holds the very same
        tensors under the same names, in order (a map never changed once made). DESIGN: the
        dedupe holds each trainer's latest fetch reply: at 1,000 trainers a sync pserver would
        hold a thousand equal maps per round, 18 MB at 100 pservers."""
        last = self._last_values
        if len(last) == len(values) and all(
                name == held and value is same
                for (name, value), (held, same) in zip(values.items(), last.items())):
            return last
        self._last_values = values
        return values

    def updating(self) -> None:
        """A sync round's update is about to run: let go of the latest fetch's map, whose
        values every trainer holds by now, so that it does not pin the parameters the update
        may write in place (`runtime.execution.kernels.buffers`)."""
        self._last_values = {}

    def _fanin_state(self, trainer: int) -> dict[str, Any]:
        """What a trainer learns from a fetch: where this server is and whether it is waited for.
        The same fields as the last fetch's are the same dict (never changed once made): a
        sync pserver holds each trainer's latest fetch reply, mostly with equal fields."""
        state = (self.round.step, self.policy.in_fanin(trainer), self.round.entry_step(),
                 self.next_step.get(trainer, 0), self.policy.sync)
        if state != self._last_fanin[0]:
            self._last_fanin = (state, dict(zip(FANIN_FIELDS, state)))
        return self._last_fanin[1]

    def _forgotten(self, msg: Message) -> ProtocolViolation:
        """The error for a retry of `msg` whose reply is no longer held (see `Dedupe`)."""
        return ProtocolViolation(
            f"{msg.kind} id {msg.id} from {msg.src!r} (step {msg.step}): a retry of a request "
            f"whose reply is no longer held (older than the last {self.dedupe.window} replies to "
            f"that sender, or values since replaced by another step's); not handled again")

    def reject_reason(self, trainer: int, msg: Message) -> str:
        if trainer in self.round.completed:
            return f"trainer {trainer} already completed; {msg.kind} refused"
        if not 0 <= trainer < self.round.trainers:
            return f"trainer {trainer} is not one of the {self.round.trainers} trainers of this job"
        return (f"trainer {trainer} is not in the fan-in at step {self.round.step} "
                f"(dropped after {self.heartbeat_timeout:g}s of silence?); {msg.kind} refused")

    # -- checkpoints and recovery
    # -------------------------------------------------------------------
    def steps_applied(self) -> int:
        """The first step whose gradients the state has not seen."""
        return self.round.step + (self.round.phase is Phase.PARAMS)

    def notified_dir(self, asked: str) -> Path:
        """The directory a CHECKPOINT_NOTIFY saves to: the configured one, which the message's
        ``dir`` must name (relative paths taken from this process's working directory).

        DESIGN: the job (scenario, config or command line) fixes where a pserver writes; a
        peer that could name any directory could make it overwrite any file it may write."""
        configured = self.checkpoint_dir
        if configured is None:
            raise ProtocolViolation(f"CHECKPOINT_NOTIFY to {asked!r} refused: {self.name} has no "
                                    "checkpoint directory (train.checkpoint_dir, or the node's "
                                    "--out) and saves nowhere a message names")
        if os.path.abspath(asked) != os.path.abspath(configured):
            raise ProtocolViolation(f"CHECKPOINT_NOTIFY to {asked!r} refused: {self.name} saves "
                                    f"its checkpoints only to its configured directory "
                                    f"{str(configured)!r}")
        return configured

    def checkpoint_at(self, step: int) -> Work:
        """Save the periodic checkpoint if `step` (the sync round's new step, or the step an
        asynchronous trainer moved on to) is the next multiple of `checkpoint_every`."""
        every = self.checkpoint_every
        if every is None or step <= self.progress:
            return
        due = step // every > self.progress // every
        self.progress = step
        if due and not self.store.timing:
            yield SaveCheckpoint(self.policy.checkpoint_step(step))

    def _must_rewind(self, trainer: int, msg: Message) -> bool:
        """Recovering: whether `msg` comes from a trainer still at a step this server lost (it
        has to redo the steps from `round.step`). A trainer's first message for an earlier step
        (its fetch of the parameters again) shows it has rewound."""
        resynced = self.resynced
        assert resynced is not None
        if not self.policy.rewinds or msg.kind in (Kind.HEARTBEAT, Kind.COMPLETE) \
                or trainer in resynced:
            return False
        if msg.step < self.round.step:
            resynced.add(trainer)
            if len(resynced | self.round.completed) >= self.round.trainers:
                self.resynced = None  # every trainer is back in step
            return False
        return True

    # -- liveness
    # -------------------------------------------------------------------------------------
    def trainers_gone(self) -> str | None:
        """Why this server has no trainer left to serve (None: it may still have one): no
        trainer heard from within the start-up grace, or none for the heartbeat timeout since
        the last message of any (a live trainer heartbeats well within it), while the job is
        not finished. A supervisor could still restart them; a server on its own gives up."""
        if self.round.finished:
            return None
        now = self.clock()
        if not self.last_seen:
            grace = self.startup_grace
            return f"no trainer heard from within {grace:g}s of the start" \
                if now - self.serving_since > grace else None
        trainer, seen = max(self.last_seen.items(), key=lambda item: item[1])
        if now - seen <= self.heartbeat_timeout:
            return None
        return (f"every trainer silent for more than {self.heartbeat_timeout:g}s (the last "
                f"heard from, trainer {trainer}, {now - seen:.1f}s ago), none completed, at "
                f"step {self.round.step}")

    def _count_drop(self, trainer: int) -> None:
        """Say once when a trainer is dropped for the `DROPS_SUSPECT`th time: each time it came
        back, so it was alive, and the timeout is shorter than a live trainer's silences here
        (a round trip on a loaded machine, a pause): a sync job then mostly drops and rejoins."""
        drops = self.drops[trainer] = self.drops.get(trainer, 0) + 1
        if drops == DROPS_SUSPECT and not self._said_timeout:
            self._said_timeout = True
            log.warning("%s: trainer %d dropped %d times, back each time: the heartbeat timeout "
                        "(%gs, train.heartbeat_timeout) is shorter than a live trainer's "
                        "silences here; raise it", self.name, trainer, drops,
                        self.heartbeat_timeout)

    def _excuse(self, paused: float) -> None:
        """Move every trainer's last message (and the start, for those never heard from)
        `paused` seconds later: the time this server was not running is nobody's silence."""
        self.serving_since += paused
        for trainer in self.last_seen:
            self.last_seen[trainer] += paused

    def _heard(self, msg: Message) -> None:
        """A retry proves its trainer alive as any message does (it passed `_check_sender`
        the first time, under the same name)."""
        trainer = msg.extra.get(TRAINER_FIELD)
        if type(trainer) is int and self.senders.get(trainer) == msg.src:
            self.last_seen[trainer] = self.clock()

    def _silence(self, trainer: int, now: float) -> str | None:
        """Why `trainer` counts as gone (None: it does not): silent for longer than the
        heartbeat timeout, or never heard from within the start-up grace."""
        seen = self.last_seen.get(trainer)
        if seen is None:
            grace = self.startup_grace
            return f"not heard from within {grace:g}s of the start" \
                if now - self.serving_since > grace else None
        timeout = self.heartbeat_timeout
        return f"silent for more than {timeout:g}s" if now - seen > timeout else None


def _restore(steps: dict[int, int], trainer: int, before: int | None) -> None:
    """Put back what `steps` said of `trainer` before a refused message."""
    if before is None:
        steps.pop(trainer, None)
    else:
        steps[trainer] = before


_HANDLERS: dict[Kind, Callable[[PserverCore, Message, int, Any], Work]] = {
    Kind.SEND: PserverCore._on_send, Kind.SEND_BARRIER: PserverCore._on_barrier,
    Kind.GET: PserverCore._on_get, Kind.FETCH_BARRIER: PserverCore._on_barrier,
    Kind.PREFETCH: PserverCore._on_prefetch, Kind.CHECKPOINT_NOTIFY: PserverCore._on_checkpoint,
    Kind.COMPLETE: PserverCore._on_complete, Kind.HEARTBEAT: PserverCore._on_heartbeat,
    Kind.JOIN: PserverCore._on_join}


HELD_SLACK = 8
"""Requests a sender may have deferred beyond the vars it exchanges with a server: barriers,
a COMPLETE, a checkpoint notice, retries."""


def held_messages(contract: ServeContract) -> int:
    """The most requests one sender may have deferred at a server of `contract`: one per var
    it sends there (the compact protocol's SEND per grad: the received vars, every trainer's
    copies counted) or reads (a GET per param block: one optimize block each), and
    `HELD_SLACK`, twice (a step's requests, and the next step's that wait behind them)."""
    return 2 * (len(contract.received) + len(contract.optimize_blocks) + HELD_SLACK)


def _values_nbytes(msg: Message) -> int:
    """Bytes the values `msg` carries hold in memory (a phantom: none)."""
    total = 0
    for value in msg.vars.values():
        if type(value) is not Phantom:
            total += nbytes_of(value)
    return total


def _fetches(msg: Message) -> bool:
    """Whether the reply to `msg` carries the values of a step: a GET's, or a SEND's that
    carries its round's GET."""
    return msg.kind is Kind.GET or (msg.kind is Kind.SEND and FETCH_FIELD in msg.extra)
