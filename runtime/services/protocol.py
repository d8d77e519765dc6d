"""The pserver's side of the PS protocol as state machines with no IO (the h11 idea).

`SyncRound` is the bookkeeping of one sync-mode pserver: which trainers are in the fan-in,
which step it is, and whether it is collecting gradients (`Phase.GRADS`, until every live
trainer's send_barrier) or serving parameters (`Phase.PARAMS`, until every live trainer's
fetch_barrier). Each event returns a `Verdict` telling the service what to do with the message;
`ready_to_optimize` and `take_step_done` say when the round moves on. Trainers that finish
(COMPLETE) or fall silent (dropped after the heartbeat timeout) leave the fan-in, and a barrier
that was waiting only for them completes; a trainer that arrives late joins at the next step.

A barrier may also travel on a trainer's last SEND (or GET) of the round to this server, as
`Closes` (the compact protocol): the round then closes that trainer's barrier when it has taken
`Closes.count` distinct messages of the kind from it in the current step, with ids from
`Closes.first` to the carrier's (`arrive`), so a retried, duplicated or reordered carrier never
closes a round before the messages it stands for are in. In the bundled protocol the round's
GET may ride on the SEND too (`messages.FETCH_FIELD`), carrying the fetch barrier
(`messages.FETCH_BARRIER_FIELD`).

`Dedupe` remembers the replies to recent requests per sender, so a retried request (same sender,
same message id) gets the same answer without being applied twice. It holds what a retry can
still ask for: a bounded window per sender, and the values of a sender's GET replies of its
latest step only; a retry of a request it no longer holds is `Recall.FORGOTTEN`.

The transition rules are tables (`_GRADS_RULES`, `_PARAMS_RULES`), not chains of ifs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Phase(enum.Enum):
    GRADS = "grads"    # collecting gradients and send barriers of `step`
    PARAMS = "params"  # optimized: serving gets of `step` until every fetch barrier


class Verdict(enum.Enum):
    ACCEPT = "accept"  # act on the message now
    DEFER = "defer"    # keep it; hand it back after the next phase change
    STALE = "stale"    # it belongs to a finished step: acknowledge, do not apply
    REJECT = "reject"  # the sender is not part of this job


class Event(enum.Enum):
    SEND = "send"
    SEND_BARRIER = "send_barrier"
    GET = "get"
    FETCH_BARRIER = "fetch_barrier"
    PREFETCH = "prefetch"  # rows of the distributed table, read during a step's forward pass


@dataclass(frozen=True)
class Closes:
    """A barrier carried by a request: it closes the sender's barrier of the request's step once
    `count` distinct requests of its kind (this one included) with ids in [`first`, this one's]
    have been taken."""

    count: int
    first: int


INITIAL_STEP = -1
"""The step of a trainer's startup fetch: served at once, never counted in a barrier."""

# (event, relation of the message's step to the round's) -> verdict, per phase.
_GRADS_RULES: dict[tuple[Event, str], Verdict] = {
    (Event.SEND, "now"): Verdict.ACCEPT,
    (Event.SEND_BARRIER, "now"): Verdict.ACCEPT,
    (Event.GET, "now"): Verdict.DEFER,            # params of this step are not ready yet
    (Event.FETCH_BARRIER, "now"): Verdict.DEFER,
    (Event.SEND, "past"): Verdict.STALE,
    (Event.SEND_BARRIER, "past"): Verdict.STALE,
    (Event.GET, "past"): Verdict.ACCEPT,          # a retried get: current params are the answer
    (Event.FETCH_BARRIER, "past"): Verdict.STALE,
    (Event.SEND, "future"): Verdict.DEFER,
    (Event.SEND_BARRIER, "future"): Verdict.DEFER,
    (Event.GET, "future"): Verdict.DEFER,
    (Event.FETCH_BARRIER, "future"): Verdict.DEFER,
    (Event.PREFETCH, "now"): Verdict.ACCEPT,      # the table is as the last step left it
    (Event.PREFETCH, "past"): Verdict.ACCEPT,
    (Event.PREFETCH, "future"): Verdict.DEFER,
}
_PARAMS_RULES: dict[tuple[Event, str], Verdict] = {
    (Event.SEND, "now"): Verdict.STALE,           # a retry of an applied gradient
    (Event.SEND_BARRIER, "now"): Verdict.STALE,
    (Event.GET, "now"): Verdict.ACCEPT,
    (Event.FETCH_BARRIER, "now"): Verdict.ACCEPT,
    (Event.SEND, "past"): Verdict.STALE,
    (Event.SEND_BARRIER, "past"): Verdict.STALE,
    (Event.GET, "past"): Verdict.ACCEPT,
    (Event.FETCH_BARRIER, "past"): Verdict.STALE,
    (Event.SEND, "future"): Verdict.DEFER,        # a fast trainer already in the next step
    (Event.SEND_BARRIER, "future"): Verdict.DEFER,
    (Event.GET, "future"): Verdict.DEFER,
    (Event.FETCH_BARRIER, "future"): Verdict.DEFER,
    (Event.PREFETCH, "now"): Verdict.ACCEPT,
    (Event.PREFETCH, "past"): Verdict.ACCEPT,
    (Event.PREFETCH, "future"): Verdict.ACCEPT,   # the next step reads the table just updated
}
_RULES = {Phase.GRADS: _GRADS_RULES, Phase.PARAMS: _PARAMS_RULES}
_VERDICTS = {phase: {(event._value_, relation): verdict
                     for (event, relation), verdict in rules.items()}
             for phase, rules in _RULES.items()}
"""`_RULES` keyed by the events' values: strings hash in C, an enum member in Python."""
_GRADS_VERDICTS, _PARAMS_VERDICTS = _VERDICTS[Phase.GRADS], _VERDICTS[Phase.PARAMS]


@dataclass
class SyncRound:
    """Fan-in and barrier bookkeeping of a sync-mode pserver."""

    trainers: int
    step: int = 0
    phase: Phase = Phase.GRADS
    live: set[int] = field(default_factory=set)
    joining: dict[int, int] = field(default_factory=dict)  # trainer -> step it enters at
    completed: set[int] = field(default_factory=set)
    sent: set[int] = field(default_factory=set)
    fetched: set[int] = field(default_factory=set)
    arrived: dict[tuple[Event, int], tuple[int, ...]] = field(default_factory=dict)
    """(SEND or GET, trainer) -> ids of its requests of the kind taken in this step (a tuple,
    each id once: mostly one or two, for each trainer, on every pserver)."""
    closing: dict[tuple[Event, int], tuple[Closes, int]] = field(default_factory=dict)
    """(SEND or GET, trainer) -> a carried barrier not yet closed, and its carrier's id."""

    def __post_init__(self) -> None:
        if self.trainers < 1:
            raise ValueError(f"trainers must be >= 1, got {self.trainers}")
        if not self.live:
            self.live = set(range(self.trainers))

    # -- classification -------------------------------------------------------------------------
    def classify(self, event: Event, trainer: int, step: int) -> Verdict:
        if not 0 <= trainer < self.trainers or trainer in self.completed:
            return Verdict.REJECT
        if step == INITIAL_STEP:
            return Verdict.ACCEPT if event in (Event.GET, Event.FETCH_BARRIER) else Verdict.REJECT
        if trainer not in self.live:
            return self._classify_joiner(event, trainer, step)
        relation = "now" if step == self.step else ("past" if step < self.step else "future")
        rules = _GRADS_VERDICTS if self.phase is Phase.GRADS else _PARAMS_VERDICTS
        return rules[event._value_, relation]

    def _classify_joiner(self, event: Event, trainer: int, step: int) -> Verdict:
        """A trainer joining at step E fetches the parameters step E-1 leaves (its fetch
        barrier is not counted) and takes part from E on."""
        entry = self.joining.get(trainer)
        if entry is None or step < entry - 1:
            return Verdict.REJECT
        if step >= entry:
            return Verdict.DEFER
        if event is Event.GET:
            relation = "now" if step == self.step else ("past" if step < self.step else "future")
            return _RULES[self.phase][(event, relation)]
        return Verdict.STALE if event is Event.FETCH_BARRIER else Verdict.REJECT

    # -- barrier events (call only for accepted messages) -----------------------------------------
    def send_barrier(self, trainer: int) -> None:
        self.sent.add(trainer)

    def fetch_barrier(self, trainer: int, step: int) -> None:
        if step != INITIAL_STEP:
            self.fetched.add(trainer)

    def arrive(self, event: Event, trainer: int, msg_id: int, closes: Closes | None) -> bool:
        """A SEND or GET of this step from `trainer`, taken (call only when its barrier would be
        accepted), carrying the round's barrier or not; returns whether the barrier closed."""
        closed = self.would_close(event, trainer, msg_id, closes)
        key = (event, trainer)
        ids = self.arrived.get(key, ())
        if msg_id not in ids:
            self.arrived[key] = ids + (msg_id,)
        if not closed:
            if closes is not None:
                self.closing[key] = (closes, msg_id)
            return False
        self.closing.pop(key, None)
        if event is Event.SEND:
            self.send_barrier(trainer)
        else:
            self.fetch_barrier(trainer, self.step)
        return True

    def would_close(self, event: Event, trainer: int, msg_id: int,
                    closes: Closes | None) -> bool:
        """Whether `arrive` of these would close `trainer`'s barrier (changing nothing): the
        barrier carried (this one, or one carried before) counts enough distinct messages with
        ids from its first to its carrier's, this one included."""
        key = (event, trainer)
        due = (closes, msg_id) if closes is not None else self.closing.get(key)
        if due is None:
            return False
        wanted, last = due
        ids = self.arrived.get(key, ())
        taken = sum(1 for i in ids if wanted.first <= i <= last)
        if msg_id not in ids and wanted.first <= msg_id <= last:
            taken += 1
        return taken >= wanted.count

    def _forget_arrivals(self, trainer: int | None = None) -> None:
        """Forget the requests counted toward carried barriers (of `trainer`; None: all)."""
        for table in (self.arrived, self.closing):
            for key in [k for k in table if trainer is None or k[1] == trainer]:
                del table[key]

    @property
    def ready_to_optimize(self) -> bool:
        """Every live trainer's send barrier for this step has arrived (and one at least)."""
        return self.phase is Phase.GRADS and bool(self.sent) and self.live <= self.sent

    def optimized(self) -> None:
        if not self.ready_to_optimize:
            raise RuntimeError(f"step {self.step}: optimized before every send barrier arrived")
        self.phase = Phase.PARAMS

    @property
    def fetched_all(self) -> bool:
        """The round is optimized and every live trainer's fetch barrier is in: the next step
        may begin (`take_step_done`)."""
        return self.phase is Phase.PARAMS and self.live <= self.fetched

    @property
    def passes_unused(self) -> bool:
        """Nobody can take part in this step: no trainer is live, and those joining enter at
        the next one, where another pserver already is (the servers of a sync job are at
        most a step apart). Nobody will send this step's gradients, so waiting for them would
        hang; the step may pass with no update here (`take_step_done(unused=True)`)."""
        return (self.phase is Phase.GRADS and not self.live and not self.sent
                and bool(self.joining) and min(self.joining.values()) == self.step + 1)

    def take_step_done(self, unused: bool = False) -> bool:
        """If every live trainer fetched (or, with `unused`, nobody can take part in this
        step: `passes_unused`), start the next step (admitting its joiners) and say so."""
        if not (self.fetched_all or (unused and self.passes_unused)):
            return False
        self.step += 1
        self.phase = Phase.GRADS
        self.sent.clear()
        self.fetched.clear()
        self._forget_arrivals()
        self._admit()
        return True

    # -- fan-in changes ---------------------------------------------------------------------------
    def entry_step(self) -> int:
        """The first step a trainer joining now can take part in on this server."""
        return self.step if self.phase is Phase.GRADS and not self.sent else self.step + 1

    def join(self, trainer: int, entry: int) -> int:
        """`trainer` (new, dropped or restarted) takes part from step `entry` on, or from the
        first step this server can still admit it at if that is later; returns the step.
        Joining again moves the entry (the trainer is not waited for before it)."""
        if not 0 <= trainer < self.trainers or trainer in self.completed:
            raise ValueError(f"trainer {trainer} cannot join (of {self.trainers}, completed "
                             f"{sorted(self.completed)})")
        self.live.discard(trainer)
        self.sent.discard(trainer)
        self.fetched.discard(trainer)
        self._forget_arrivals(trainer)
        actual = max(entry, self.entry_step())
        self.joining[trainer] = actual
        self._admit()
        return actual

    def dropped(self, trainer: int) -> bool:
        """`trainer` is of this job and has not completed, but is neither in the fan-in nor
        joining it: it was dropped (silent for too long) and has not asked to join again."""
        return (0 <= trainer < self.trainers and trainer not in self.completed
                and trainer not in self.live and trainer not in self.joining)

    def _admit(self) -> None:
        due = [t for t, entry in self.joining.items() if entry == self.step]
        for t in due:
            del self.joining[t]
            self.live.add(t)

    def leave(self, trainer: int, completed: bool) -> bool:
        """A trainer finished (`completed`) or was dropped; True if it was in the fan-in."""
        was_live = trainer in self.live
        self.live.discard(trainer)
        self.joining.pop(trainer, None)
        self.sent.discard(trainer)
        self.fetched.discard(trainer)
        self._forget_arrivals(trainer)
        if completed:
            self.completed.add(trainer)
        return was_live

    @property
    def finished(self) -> bool:
        """Every trainer has completed, or some have and the others were dropped and are not
        joining again: the server may stop."""
        return bool(self.completed) and not self.live and not self.joining

    @property
    def contributors(self) -> set[int]:
        """The trainers whose gradients this step's optimize sums."""
        return set(self.sent)


class Recall(enum.Enum):
    NEW = "new"              # not answered yet: handle it
    ANSWERED = "answered"    # a retry: send the reply held
    FORGOTTEN = "forgotten"  # a retry of a request whose reply is no longer held
    OUTRUN = "outrun"        # a late copy of a request its sender has moved past: none waits


DEDUPE_WINDOW = 256
"""Replies held per sender. A trainer retries only a request it is still waiting for, and it
waits for every reply of a step before it moves on, so a retry can only ask for one of its last
few dozen requests (a step's messages and the heartbeats of the wait)."""


_DROPPED = object()
"""A held reply whose values were let go: its id is known, its answer no longer."""
_OUTRUN = object()
"""The same, let go because its sender moved past its step (`Recall.OUTRUN`)."""


class Dedupe:
    """Replies to recent requests, per sender, keyed by message id: what a retry can still ask.

    - The last `window` replies of each sender are held; an older one is dropped, and every id
      at or below the newest dropped (the sender's floor) is `Recall.FORGOTTEN`, unless it is
      still held (a deferred request answered late). The caller asks about requests it still
      holds deferred before it asks here.
    - A reply that carries parameter values (`remember(..., values_of=step)`: a GET's) holds
      them only while it answers the sender's latest step: once the sender sends a request
      of a later step (`moved_on`) or is answered values of another step, its older value
      replies are dropped. A trainer moves on only once every request of its step is
      answered, so when a sync round's update runs, every trainer having sent its requests of
      the round, no reply pins the values the round before left, and the update may write the
      parameters in place.

    - A reply to a request of step s (`remember(..., step=s)`) is held only while the
      sender's latest request is of step s + 1 at most: a trainer moves on to a step once every
      request of the step before is answered, so a request of step s + 2 means it will never
      retry one of step s (the step before it is kept for a heartbeat still on its way). Without
      this a pserver held every reply of a run of fewer than `window` steps' messages: at 1,000
      trainers, hundreds of megabytes of acknowledgements nobody could ask for again.

    - A request whose reply was let go because its sender moved past it is `Recall.OUTRUN`:
      the sender cannot be waiting for it, so what asks is a copy the network delivered late
      (a duplicate, or one reordered behind later messages), to be ignored, not refused as an
      error. Any other request whose reply is gone is FORGOTTEN.

    DESIGN: a forgotten request is answered with an error that names it, never with a guess;
    ids are only compared per sender, whose ids grow (a restarted node's too). What is held of
    a sender is one `_Sender`, its replies in a plain dict (oldest first, as dicts keep keys):
    a pserver of a 1,000-trainer job holds a thousand of them.
    """

    def __init__(self, window: int = DEDUPE_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"Dedupe window must be >= 1, got {window}")
        self.window = window
        self._senders: dict[str, _Sender] = {}

    def lookup(self, src: str, msg_id: int) -> tuple[Recall, Any]:
        sender = self._senders.get(src)
        if sender is None:
            return Recall.NEW, None
        seen = sender.seen
        if msg_id in seen:
            reply = seen[msg_id]
            if reply is _OUTRUN:
                return Recall.OUTRUN, None
            return (Recall.FORGOTTEN, None) if reply is _DROPPED else (Recall.ANSWERED, reply)
        if sender.floor is not None and msg_id <= sender.floor:
            outrun = sender.outrun is not None and msg_id <= sender.outrun
            return Recall.OUTRUN if outrun else Recall.FORGOTTEN, None
        return Recall.NEW, None

    def remember(self, src: str, msg_id: int, reply: Any, values_of: int | None = None,
                 step: int | None = None) -> None:
        sender = self._senders.get(src)
        if sender is None:
            sender = self._senders[src] = _Sender()
        seen = sender.seen
        seen[msg_id] = reply
        if values_of is not None:
            sender.hold_values(msg_id, values_of)
        if step is not None:
            sender.hold_step(msg_id, step)
        while len(seen) > self.window:
            oldest = next(iter(seen))
            sender.drop(oldest, outrun=seen.pop(oldest) is _OUTRUN)

    def moved_on(self, src: str, step: int) -> None:
        """`src` sent a request of `step`: let go of its value replies of earlier steps."""
        sender = self._senders.get(src)
        if sender is not None and sender.values_step is not None and sender.values_step < step:
            sender.drop_values(_OUTRUN)

    def held(self, src: str) -> list[int]:
        """The ids whose replies are held for `src`, oldest first."""
        sender = self._senders.get(src)
        return [] if sender is None else [i for i, reply in sender.seen.items()
                                          if reply is not _DROPPED and reply is not _OUTRUN]


class _Sender:
    """What a `Dedupe` holds of one sender: its replies by id (`seen`, oldest first), the
    newest id dropped (`floor`) and of those the newest dropped for a step it moved past
    (`outrun`), the ids of the replies holding values of step `values_step` (`values`), and
    the ids held under each step (`steps`: step, id, step, id, ..., flat, as a sender has a
    few of them: two steps' worth)."""

    __slots__ = ("seen", "floor", "outrun", "values_step", "values", "steps")

    def __init__(self) -> None:
        self.seen: dict[int, Any] = {}
        self.floor: int | None = None
        self.outrun: int | None = None
        self.values_step: int | None = None
        self.values: list[int] = []
        self.steps: list[int] = []

    def hold_step(self, msg_id: int, step: int) -> None:
        """Hold `msg_id` under `step`; on the first of a step, forget the replies of steps
        before `step` - 1."""
        steps = self.steps
        if step not in steps[::2]:
            gone = [steps[i + 1] for i in range(0, len(steps), 2) if steps[i] < step - 1]
            if gone:
                self.steps = steps = [v for i in range(0, len(steps), 2)
                                      if steps[i] >= step - 1 for v in steps[i:i + 2]]
                seen = self.seen
                for old in gone:
                    if seen.pop(old, None) is not None:
                        self.drop(old, outrun=True)
        steps += (step, msg_id)

    def hold_values(self, msg_id: int, step: int) -> None:
        if self.values_step is not None and self.values_step != step:
            self.drop_values()
        self.values_step = step
        if msg_id not in self.values:
            self.values.append(msg_id)

    def drop_values(self, mark: object = _DROPPED) -> None:
        """Let go of the values of every value reply held; their ids stay known, as `mark`:
        `_DROPPED` (a retry of one is refused) or `_OUTRUN` (the sender moved past them)."""
        seen = self.seen
        for old in self.values:
            seen[old] = mark
        self.values = []
        self.values_step = None

    def drop(self, msg_id: int, outrun: bool = False) -> None:
        """Forget `msg_id`'s reply; `outrun`: because the sender moved past its step."""
        self.floor = msg_id if self.floor is None else max(self.floor, msg_id)
        if outrun:
            self.outrun = msg_id if self.outrun is None else max(self.outrun, msg_id)
        if msg_id in self.values:
            self.values.remove(msg_id)
