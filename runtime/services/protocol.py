"""The pserver's side of the PS protocol as state machines with no IO (the h11 idea).

`SyncRound` is the bookkeeping of one sync-mode pserver: which trainers are in the fan-in,
which step it is, and whether it is collecting gradients (`Phase.GRADS`, until every live
trainer's send_barrier) or serving parameters (`Phase.PARAMS`, until every live trainer's
fetch_barrier). Each event returns a `Verdict` telling the service what to do with the message;
`ready_to_optimize` and `take_step_done` say when the round moves on. Trainers that finish
(COMPLETE) or fall silent (dropped after the heartbeat timeout) leave the fan-in, and a barrier
that was waiting only for them completes; a trainer that arrives late joins at the next step.

`Dedupe` remembers the replies to recent requests per sender, so a retried request (same sender,
same message id) gets the same answer without being applied twice.

The transition rules are tables (`_GRADS_RULES`, `_PARAMS_RULES`), not chains of ifs.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
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
        return _RULES[self.phase][(event, relation)]

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

    @property
    def ready_to_optimize(self) -> bool:
        """Every live trainer's send barrier for this step has arrived (and one at least)."""
        return self.phase is Phase.GRADS and bool(self.sent) and self.live <= self.sent

    def optimized(self) -> None:
        if not self.ready_to_optimize:
            raise RuntimeError(f"step {self.step}: optimized before every send barrier arrived")
        self.phase = Phase.PARAMS

    def take_step_done(self) -> bool:
        """If every live trainer fetched, start the next step (admitting its joiners) and say so."""
        if self.phase is not Phase.PARAMS or not self.live <= self.fetched:
            return False
        self.step += 1
        self.phase = Phase.GRADS
        self.sent.clear()
        self.fetched.clear()
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
        actual = max(entry, self.entry_step())
        self.joining[trainer] = actual
        self._admit()
        return actual

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


class Dedupe:
    """Replies to the last `window` requests of each sender, keyed by message id."""

    def __init__(self, window: int = 4096) -> None:
        self.window = window
        self._seen: dict[str, OrderedDict[int, Any]] = {}

    def lookup(self, src: str, msg_id: int) -> tuple[bool, Any]:
        seen = self._seen.get(src)
        if seen is not None and msg_id in seen:
            return True, seen[msg_id]
        return False, None

    def remember(self, src: str, msg_id: int, reply: Any) -> None:
        seen = self._seen.get(src)
        if seen is None:
            seen = self._seen[src] = OrderedDict()
        seen[msg_id] = reply
        while len(seen) > self.window:
            seen.popitem(last=False)
