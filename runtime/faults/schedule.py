"""One schedule of a scenario's faults, for `sim run` and `runtime up` alike: when each fault
begins and ends, acted out on a `FaultTarget`.

The schedule turns the `faults:` list (`runtime.config.faults`) into timed actions on the running
asyncio loop's clock, virtual in the simulator, real in runtime up:

- a fault without ``at`` (a link rule) begins at `arm`, before the first message;
- ``at: 1.5s`` begins that long after `start` (the simulator starts at time 0; runtime up once
  every node has been started);
- ``at: "step N"`` begins when a trainer first reports N steps done (`on_progress`; the
  simulator reports each step as it ends, runtime up as the trainers' progress reaches it);
- it ends `lasting()` seconds after it began (``restart_after``, ``heal_after``, ``for``), or
  never; `close` ends, without waiting, those the end of the run ends (`reverted_at_close`).

What beginning and ending do is the fault class's (`begin`, `end`), in terms of the target's
methods; what those do is the target's: `sim.faults.SimTarget` acts on the simulated network,
cluster and compute model, `runtime.faults.inject.RuntimeTarget` on processes and fault proxies.
Each fault becomes a `ScheduleEvent` in `events`, shown by the target as it begins (`fired`) and
ends (`ended`); the run record lists each as a `runtime.config.metrics.FaultEvent`.

DESIGN: the schedule keeps the faults in force, in the order they began, and hands a target
the whole set of partitions or link rules in force after each change (`set_partitions`,
`set_link_rules`): a link's fate depends on every rule that matches it, a proxy's cut on every
partition, so both targets would otherwise keep the same bookkeeping. The order is kept so that
a simulated run draws its fates the same way every time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from runtime.config.faults import AnyFault, FaultActions, _Fault
from runtime.config.metrics import FaultEvent as MetricsEvent
from runtime.config.nodes import no_node, trainer_name

F = TypeVar("F", bound=_Fault)


class FaultTarget(FaultActions, Protocol):
    """What a run offers the schedule to act on: what its faults do to it (`FaultActions`), and
    hearing of each fault as it begins and ends."""

    def fired(self, event: ScheduleEvent) -> None:
        """`event` has just begun (its `end` is when it is due to end)."""

    def ended(self, event: ScheduleEvent) -> None:
        """`event` has just ended."""


@dataclass
class ScheduleEvent(MetricsEvent):
    """One fault as it happened on the schedule (its record, `runtime.config.metrics.FaultEvent`,
    and the nodes it acts on), in seconds since the schedule started; `detail` says why it
    fired and what the target did."""

    nodes: tuple[str, ...] = ()
    """The nodes it acts on (none: it found nothing to act on)."""


@dataclass
class ScheduleFiring:
    """The `runtime.config.faults.Firing` that a fault's `begin` and `end` act through: the
    schedule's target, the nodes the fault acts on, the faults in force, its event's detail."""

    schedule: FaultSchedule
    event: ScheduleEvent
    nodes: list[str]

    @property
    def target(self) -> FaultTarget:
        return self.schedule.target

    def in_force(self, kind: type[F]) -> tuple[F, ...]:
        """The faults of `kind` in force now, in the order they began."""
        return tuple(f for f in self.schedule.in_force if isinstance(f, kind))

    def note(self, text: str) -> None:
        """Add `text` to the event's detail (once)."""
        if text and text not in self.event.detail.split("; "):
            self.event.detail = f"{self.event.detail}; {text}" if self.event.detail else text

    def nothing(self, why: str) -> None:
        """The fault found nothing to act on: it ends as it begins, and says `why`."""
        self.event.what += f" ({why})"
        self.event.end = self.event.start
        self.event.nodes = ()


@dataclass
class FaultSchedule:
    """Fires a scenario's faults at their triggers on `target` during one run; `nodes` are the
    cluster's node names (pservers, then trainers)."""

    faults: Sequence[AnyFault]
    target: FaultTarget
    nodes: Sequence[str]
    events: list[ScheduleEvent] = field(default_factory=list)
    in_force: list[AnyFault] = field(default_factory=list)
    """The faults begun and not ended, in the order they began."""
    _by_step: list[tuple[int, int]] = field(default_factory=list)
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)
    _origin: float | None = None
    _armed: bool = False

    def arm(self) -> None:
        """Before the job starts: begin the faults without ``at``."""
        if self._armed:
            return
        self._armed = True
        for index, fault in enumerate(self.faults):
            if fault.at is None:
                self._fire(index, "from the start")

    def start(self) -> None:
        """The job has started: the clock of ``at: <seconds>`` starts now (arming first if
        `arm` was not called)."""
        self.arm()
        loop = asyncio.get_running_loop()
        self._origin = loop.time()
        for index, fault in enumerate(self.faults):
            at = fault.at
            if at is None:
                continue
            if at.step is not None:
                self._by_step.append((at.step, index))
            else:
                seconds = at.seconds or 0.0
                self._timers.append(loop.call_at(self._origin + seconds, self._fire, index,
                                                 f"at {seconds:g}s", context=no_node()))

    def on_progress(self, trainer: int, done: int, who: str | None = None) -> None:
        """Trainer `trainer` reports `done` steps finished (or the node `who`, a pserver
        reporting its updates in role mode): begin the faults due."""
        due = [index for step, index in self._by_step if done >= step]
        if not due:
            return
        self._by_step = [(step, index) for step, index in self._by_step if done < step]
        for index in due:  # not in the reporting trainer's context: a pause of that very
            # trainer would hold its own end (the simulator holds what a paused node runs)
            no_node().run(self._fire, index, f"{who or trainer_name(trainer)} reported step {done}")

    def close(self) -> None:
        """The run is ending: cancel what has not happened yet, and end the faults in force
        that the end of the run ends (a slowed node is resumed; a crashed one stays down). A
        fault still in force that was due to end later (a trainer whose restart the end of the
        job made moot) lasted until the end: its event's `end` becomes null, and its detail
        says so."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._by_step.clear()
        now = self._now()
        for fault in list(self.in_force):
            event = next(e for e in reversed(self.events) if self.faults[e.fault] is fault)
            if fault.reverted_at_close:
                self.in_force.remove(fault)
                fault.end(self._firing(event, fault))
            elif event.end is not None and event.end > now:
                self._firing(event, fault).note(
                    f"the run ended at {now:.3f}s, before its end was due at {event.end:.3f}s")
                event.end = None

    # -- beginning and ending ------------------------------------------------------------------
    def _now(self) -> float:
        return 0.0 if self._origin is None else asyncio.get_running_loop().time() - self._origin

    def _firing(self, event: ScheduleEvent, fault: AnyFault) -> ScheduleFiring:
        return ScheduleFiring(self, event, fault.nodes(self.nodes))

    def _fire(self, index: int, why: str) -> None:
        fault = self.faults[index]
        event = ScheduleEvent(index, fault.kind, fault.describe(), self._now(), detail=why,
                           nodes=tuple(fault.nodes(self.nodes)))
        self.events.append(event)
        self.in_force.append(fault)
        if not fault.begin(self._firing(event, fault)):
            self.in_force.remove(fault)
        else:
            lasting = fault.lasting()
            if lasting is not None:
                event.end = event.start + lasting
                self._timers.append(asyncio.get_running_loop().call_later(
                    lasting, self._end, event, fault, context=no_node()))
        self.target.fired(event)

    def _end(self, event: ScheduleEvent, fault: AnyFault) -> None:
        self.in_force.remove(fault)
        fault.end(self._firing(event, fault))
        self.target.ended(event)

