"""Fault injection in the simulator: the scenario's `faults:` (see `runtime.faults`) on the
virtual clock, deterministic by seed.

Two parts:

- `MessageFaults` is what the `Network` asks about every message as it leaves its sender's NIC
  (`Network._deliver`): whether a partition cuts its link, and what the active link rules do to
  it: drop, duplicate (a second copy right behind it), reorder (held back until the next message
  on its link has gone, or `REORDER_WAIT` passed) or delay (by ``delay_by``; later messages on
  the link queue behind it, as on a TCP connection). The draws come from one `random.Random` per
  directed link, seeded by the run's seed and the link, four draws per message and matching rule
  in a fixed order, so a run's fates do not depend on how traffic on other links interleaves.
  A partition acts on messages sent while it holds (one already on the wire arrives).
- `FaultInjector` fires the faults at their triggers: a time (``loop.call_at``) or a trainer's
  progress (`on_step`, called as each trainer finishes a step): crash and restart through
  `runtime.cluster.LocalCluster`, partitions and link rules switched on and off in
  `MessageFaults`, slowdowns in `Slowdowns`, which multiplies the compute model's cost for the
  slowed nodes. Each fault is drawn on the trace as a span of category ``fault`` on the node it
  hits (``fault`` track of `sim.trace`), and listed in `events` for the metrics.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import NamedTuple

from runtime.cluster import LocalCluster
from runtime.compute import ComputeModel, Tracer
from runtime.faults import Crash, LinkFaults, Partition, Slow, describe, fault_kind
from runtime.scope import Scope
from transpiler.ir import Op

__all__ = ["Fate", "FaultEvent", "FaultInjector", "MessageFaults", "REORDER_WAIT", "Slowdowns"]

REORDER_WAIT = 0.005
"""Seconds a message held back for reordering waits for the next one on its link."""

AnyFault = Crash | Partition | LinkFaults | Slow


class Fate(NamedTuple):
    """What happens to one message: `lost` (dropped, or `cut` by a partition), else delivered
    `copies` times, `delay` seconds late, after the link's next message if `reorder`."""

    lost: bool = False
    cut: bool = False
    copies: int = 1
    delay: float = 0.0
    reorder: bool = False


class MessageFaults:
    """The message faults in force now, consulted by the network for each message."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.partitions: list[Partition] = []
        self.rules: list[LinkFaults] = []
        self._rngs: dict[tuple[str, str], random.Random] = {}

    def fate(self, src: str, dst: str) -> Fate | None:
        """The fate of a message from `src` to `dst` sent now; None: delivered as usual."""
        if any(p.cuts(src, dst) for p in self.partitions):
            return Fate(lost=True, cut=True)
        rules = [r for r in self.rules if r.matches(src, dst)]
        if not rules:
            return None
        rng = self._rng(src, dst)
        lost, copies, delay, reorder = False, 1, 0.0, False
        for rule in rules:
            drop, dup, late, swap = rng.random(), rng.random(), rng.random(), rng.random()
            lost = lost or drop < rule.drop
            copies += dup < rule.duplicate
            reorder = reorder or swap < rule.reorder
            delay += rule.delay_by if late < rule.delay else 0.0
        return Fate(lost=lost, copies=copies, delay=delay, reorder=reorder)

    def _rng(self, src: str, dst: str) -> random.Random:
        rng = self._rngs.get((src, dst))
        if rng is None:
            rng = self._rngs[src, dst] = random.Random(f"{self.seed}:faults:{src}->{dst}")
        return rng


class Slowdowns:
    """A compute model whose cost is the wrapped model's, times the factors of the slowdowns
    in force on the node."""

    def __init__(self, inner: ComputeModel) -> None:
        self.inner = inner
        self.active: list[Slow] = []

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        seconds = self.inner.cost(node, op, scope, step)
        for slow in self.active:
            if fnmatchcase(node, slow.slow):
                seconds *= slow.slowdown
        return seconds


@dataclass
class FaultEvent:
    """One fault as it happened: when it began and (if it did) ended, in simulated seconds."""

    index: int
    kind: str
    what: str
    start: float
    end: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {"fault": self.index, "kind": self.kind, "what": self.what, "start": self.start,
                "end": self.end}


@dataclass
class FaultInjector:
    """Fires a scenario's faults at their triggers during one simulated run."""

    faults: list[AnyFault]
    cluster: LocalCluster
    messages: MessageFaults
    slowdowns: Slowdowns | None
    tracer: Tracer | None = None
    events: list[FaultEvent] = field(default_factory=list)
    _by_step: list[tuple[int, int, AnyFault]] = field(default_factory=list)

    def start(self) -> None:
        """Schedule the time-triggered faults (call inside the running loop, at time 0)."""
        loop = asyncio.get_running_loop()
        for index, fault in enumerate(self.faults):
            trigger = fault.at
            if trigger is None:
                self._fire(index, fault)
            elif trigger.step is not None:
                self._by_step.append((trigger.step, index, fault))
            else:
                loop.call_at(trigger.seconds or 0.0, self._fire, index, fault)

    def on_step(self, trainer: int, step: int) -> None:
        """A trainer finished `step`: fire the faults due after step + 1 steps."""
        due = [(i, f) for n, i, f in self._by_step if step + 1 >= n]
        self._by_step = [(n, i, f) for n, i, f in self._by_step if step + 1 < n]
        for index, fault in due:
            self._fire(index, fault)

    # -- firing -----------------------------------------------------------------------------------
    def _fire(self, index: int, fault: AnyFault) -> None:
        now = asyncio.get_running_loop().time()
        event = FaultEvent(index, fault_kind(fault), describe(fault), now)
        self.events.append(event)
        if isinstance(fault, Crash):
            self._crash(fault, event)
        elif isinstance(fault, Partition):
            self._window(event, fault.heal_after, self.messages.partitions, fault)
        elif isinstance(fault, LinkFaults):
            self._window(event, fault.duration, self.messages.rules, fault)
        elif self.slowdowns is not None:
            self._window(event, fault.duration, self.slowdowns.active, fault)

    def _crash(self, fault: Crash, event: FaultEvent) -> None:
        if not self.cluster.crash(fault.crash, fault.restart_after):
            event.what += " (already ended: nothing to crash)"
            event.end = event.start
            return
        if fault.restart_after is not None:
            event.end = event.start + fault.restart_after
        self._trace(fault.crash, f"down ({event.what})", event.start,
                    event.end if event.end is not None else event.start)

    def _window(self, event: FaultEvent, duration: float | None, active: list,
                fault: AnyFault) -> None:
        active.append(fault)
        if duration is None:
            self._trace_nodes(fault, event.what, event.start, event.start)
            return
        event.end = event.start + duration
        self._trace_nodes(fault, event.what, event.start, event.end)
        asyncio.get_running_loop().call_later(duration, active.remove, fault)

    def _trace_nodes(self, fault: AnyFault, what: str, start: float, end: float) -> None:
        patterns = _patterns_of(fault)
        for node in self._nodes():
            if any(fnmatchcase(node, p) for p in patterns):
                self._trace(node, what, start, end)

    def _trace(self, node: str, what: str, start: float, end: float) -> None:
        if self.tracer is not None:
            self.tracer.span(node, what, start, end, "fault")

    def _nodes(self) -> list[str]:
        job = self.cluster.job
        return [f"pserver:{j}" for j in range(len(job.endpoints))] + \
            [f"trainer:{i}" for i in range(job.trainers)]


def _patterns_of(fault: AnyFault) -> list[str]:
    if isinstance(fault, Crash):
        return [fault.crash]
    if isinstance(fault, Partition):
        return [*fault.partition[0], *fault.partition[1]]
    if isinstance(fault, LinkFaults):
        return list(fault.links)
    return [fault.slow]
