"""Bounded-staleness async (SSP, Stale Synchronous Parallel; Ho et al., 2013).

Gradients are applied as they arrive, as in async mode; what SSP adds is a bound on how far
ahead of the others a trainer may read the parameters. Each trainer has a clock here, the
steps it has completed, and a read of the parameters for step r (a GET of step r-1, a PREFETCH
of step r) is held back until the slowest live trainer's clock, the floor, is at least
r - `staleness`: the reader then sees every trainer's updates of the steps before r - staleness.
Staleness 0 waits, for every read, until every trainer has completed the step before (sync's
information, though each gradient is applied on its own rather than averaged); an unbounded
staleness never holds a read (async).

A trainer's clock is what its messages show (the trainer sends nothing more than async's):

- a SEND or PREFETCH of step s: it is in step s, so it completed s steps;
- a GET of step s: it completed s + 1, since a trainer fetches only once every SEND of its step
  is acknowledged (`trainer.RpcOps.recv`), on every pserver, or (bundled protocol) the GET
  rides on its SEND of the step here; its startup fetch (step -1) shows 0.

Trainers that complete or are dropped (silent for the heartbeat timeout, as in async) leave the
floor, and the reads that waited only for them are released; a dropped trainer that speaks again
is waited for again. What the policy measures goes to the server's stats: the most steps a read
it served ran ahead of the floor (``read_staleness_max``, at most `staleness`) and, per trainer,
the time its reads were held here (``blocked_seconds``; overlapping holds counted once, a hold
still open when the server stops not at all).

DESIGN: holding a read, not the trainer's next SEND, bounds what a trainer computes with:
the parameters it reads for step r. The held request is deferred like a sync GET (a retry gets a
pending notice, which keeps the trainer's deadline from running out); `advance` asks for the
deferred requests to be replayed only when the floor has risen, so a replay can release one.
"""

from __future__ import annotations

import logging
import math
from typing import ClassVar

from runtime.network.wire import Message
from runtime.services.protocol import Event, Verdict
from runtime.services.pserver_actions import Tally, Work
from runtime.services.pserver_async import AsyncPolicy
from runtime.services.pserver_policy import PolicyCore

log = logging.getLogger("runtime.services.pserver")


class SspPolicy(AsyncPolicy):
    name: ClassVar[str] = "ssp"

    def __init__(self, core: PolicyCore) -> None:
        super().__init__(core)
        bound = self.contract.staleness
        if bound is None:
            raise ValueError(f"{core.name}: the ssp policy needs a program with a staleness bound")
        self.staleness: int | float = bound
        self.clocks: dict[int, int] = dict.fromkeys(range(self.contract.trainers), 0)
        """Trainer -> the steps it has completed, as far as its messages here show."""
        self.released_at = self.floor()
        """The floor when the deferred reads were last replayed."""
        self.held: dict[int, set[int]] = {}
        """Trainer -> the ids of its reads held now."""
        self.held_since: dict[int, float] = {}
        """Trainer -> when the first of its reads held now was held."""

    # -- clocks ---------------------------------------------------------------------------------
    def floor(self) -> int | float:
        """The slowest live trainer's clock (infinite when no trainer is live)."""
        return min((self.clocks[t] for t in self.round.live), default=math.inf)

    def _saw(self, trainer: int, clock: int) -> None:
        """`trainer` has completed `clock` steps at least; one dropped is waited for again."""
        self.clocks[trainer] = max(self.clocks[trainer], clock)
        if trainer not in self.round.live and trainer not in self.round.completed:
            self.round.live.add(trainer)
            log.info("%s: trainer %d is back at step %d; its clock counts again", self.core.name,
                     trainer, self.clocks[trainer])

    # -- events ---------------------------------------------------------------------------------
    def verdict(self, event: Event, trainer: int, msg: Message) -> Verdict:
        """A SEND of step s: its trainer is in step s; applied at once."""
        self._saw(trainer, max(msg.step, 0))
        return Verdict.ACCEPT

    def read(self, event: Event, trainer: int, msg: Message) -> Work:
        """A GET (reading for the step after its own) or PREFETCH (for its own): served once
        the floor is within `staleness` of the step it reads for, else held."""
        reads_for = msg.step + 1 if event is Event.GET else max(msg.step, 0)
        self._saw(trainer, reads_for)
        floor = self.floor()
        if floor < reads_for - self.staleness:
            self._hold(trainer, msg.id)
            return Verdict.DEFER
        yield from self._release(trainer, msg.id)
        yield Tally("read_staleness_max", max(0, int(reads_for - min(floor, reads_for))),
                    peak=True)
        return Verdict.ACCEPT

    def idle(self) -> bool:
        return False  # `advance` notes the floor each time

    def advance(self) -> Work:
        """Replay the held reads when the floor has risen since they were last replayed."""
        floor = self.floor()
        risen, self.released_at = floor > self.released_at, floor
        return risen and bool(self.core.deferred)
        yield

    # -- what the holds cost --------------------------------------------------------------------
    def _hold(self, trainer: int, msg_id: int) -> None:
        held = self.held.setdefault(trainer, set())
        if not held:
            self.held_since[trainer] = self.core.clock()
        held.add(msg_id)

    def _release(self, trainer: int, msg_id: int) -> Work:
        held = self.held.get(trainer)
        if held is None or msg_id not in held:
            return
        held.discard(msg_id)
        if not held:
            since = self.held_since.pop(trainer)
            yield Tally("blocked_seconds", self.core.clock() - since, key=trainer)
