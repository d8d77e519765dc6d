"""Fault injection for `runtime up`: a scenario's `faults:` (`runtime.faults`) on real processes.

The simulator injects faults into its own network, cost model and task set (`sim.faults`); on
real processes the launcher does the same with what the operating system and a proxy offer:

- crash: SIGKILL to the node's process group, without warning. With ``restart_after`` the
  launcher starts the node again that long after the kill: a pserver with ``--recover`` (from
  its last checkpoint; the trainers redo the steps it lost), a trainer with ``--incarnation N``
  (so that its message ids differ from its earlier lives'). A node killed for good is not a
  failure of the run by itself: the other nodes and the expect block decide.
- partition, links: one `FaultProxy` listens at each pserver's endpoint, which the trainers
  connect to, and forwards to the address the pserver really serves at (``--bind``). Each
  (trainer, pserver) connection is one link of that proxy, named by the trainer's ZeroMQ
  identity, and gets the faults of the rules that match the pair in either order, combined
  (`link_faults`); a partition drops the messages of the links between its two groups, as a
  cut cable under live TCP connections, until it heals. Only trainer-pserver connections exist,
  so a pattern pair that matches no such pair has nothing to act on (`runtime.launch` says so
  in its notes). The proxies draw from generators seeded by the scenario's seed, the trainer
  and the pserver's name. Under ``runtime up --netns`` the proxies also hold every message for
  the network's latency of its link (`Injector.base`); a rule's delays add to it.
- slow: the node's process group is paused (SIGSTOP) for ``1 - 1/slowdown`` of every
  `SLOW_PERIOD` and resumed (SIGCONT) for the rest, for the fault's duration: on average the
  whole node, its replies as much as its compute, runs ``slowdown`` times slower.

``at: 1.5s`` counts from the moment every node had been started (`Injector.start`); ``at:
"step N"`` fires when a trainer's progress line first says N steps are done (`on_progress`).
The launcher reads those lines while the trainers go on, so such a fault lands a little after
the step; its event records the step reported when it fired. Link rules without ``at`` hold
from before the first node starts (`Injector.arm`). Every fault becomes a `FaultEvent`, listed
in metrics.json and announced through `say`.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

from .cluster import pserver_name, trainer_name
from .faultproxy import Direction, FaultProxy, Faults, Latency
from .faults import Crash, LinkFaults, Partition, Slow, describe, fault_kind
from .metrics import FaultEvent

AnyFault = Crash | Partition | LinkFaults | Slow

SLOW_PERIOD = 0.02
"""Seconds of one pause-and-run cycle of a slowed node."""
REORDER_WAIT = 0.02
"""Longest a message held back for reordering waits for the next one on its link (seconds)."""


class Nodes(Protocol):
    """What the injector asks of the launcher, which owns the processes."""

    def kill(self, node: str) -> int | None:
        """SIGKILL `node`'s process group; its pid, or None if it was not running."""

    def restart_after(self, node: str, delay: float) -> None:
        """Start the killed `node` again `delay` seconds after its kill."""

    def send_signal(self, node: str, sig: signal.Signals) -> bool:
        """Send `sig` to `node`'s process group; False if it is not running."""


def needs_proxies(faults: Sequence[AnyFault]) -> bool:
    """Whether `faults` act on messages, so that the pservers need fault proxies."""
    return any(isinstance(f, (Partition, LinkFaults)) for f in faults)


def connects(fault: Partition | LinkFaults, trainers: int, pservers: int) -> bool:
    """Whether `fault` acts on at least one trainer-pserver connection."""
    pairs = [(trainer_name(i), pserver_name(j)) for i in range(trainers) for j in range(pservers)]
    if isinstance(fault, Partition):
        return any(fault.cuts(t, p) for t, p in pairs)
    return any(fault.matches(t, p) for t, p in pairs)


@dataclass(frozen=True)
class DelaySampler:
    """A link's latency: its `base` latency (the scenario's network, under ``--netns``), then
    each rule's ``delay_by`` with its ``delay`` probability, added up; one draw per rule and
    message from the link's generator."""

    delays: tuple[tuple[float, float], ...]
    """(probability, seconds) of each rule."""
    base: Latency = 0.0

    def __call__(self, rng: random.Random) -> float:
        base = self.base(rng) if callable(self.base) else self.base
        return base + sum(seconds for chance, seconds in self.delays if rng.random() < chance)


def link_faults(rules: Sequence[LinkFaults], base: Faults | None = None) -> Faults:
    """The proxy's `Faults` for a link that all of `rules` match: each fault happens if any
    rule's independent draw says so (probability ``1 - prod(1 - p)``), delays add up, on top of
    the latency of `base` (the link's own faults, without the rules)."""

    def either(chances: list[float]) -> float:
        return 1.0 - math.prod(1.0 - p for p in chances)

    delays = tuple((r.delay, r.delay_by) for r in rules if r.delay > 0)
    latency = base.latency if base is not None else 0.0
    return Faults(latency=DelaySampler(delays, latency) if delays else latency,
                  drop=either([r.drop for r in rules]),
                  duplicate=either([r.duplicate for r in rules]),
                  reorder=either([r.reorder for r in rules]), reorder_wait=REORDER_WAIT)


@dataclass
class Injector:
    """Fires a scenario's faults at their triggers during one `runtime up` run."""

    faults: Sequence[AnyFault]
    nodes: Nodes
    proxies: Mapping[int, FaultProxy]
    """The fault proxy in front of each pserver, by index (empty without message faults)."""
    node_names: Sequence[str]
    trainers: int
    say: Callable[[str], None]
    base: Mapping[tuple[str, str], Faults] = field(default_factory=dict)
    """(trainer, pserver) -> the faults of that link without any rule: the scenario network's
    latency under ``--netns``; none (no faults) for a link not listed."""
    events: list[FaultEvent] = field(default_factory=list)
    _active: list[Partition | LinkFaults] = field(default_factory=list)
    """The partitions and link rules in force now."""
    _by_step: list[tuple[int, int]] = field(default_factory=list)
    _cut: dict[int, set[str]] = field(default_factory=dict)
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)
    _slowed: set[asyncio.Task[None]] = field(default_factory=set)
    _start: float | None = None

    def arm(self) -> None:
        """Before the nodes start: switch on the link rules that hold from the beginning."""
        for index, fault in enumerate(self.faults):
            if fault.at is None:
                self._fire(index, fault, "from the start")

    def start(self) -> None:
        """Every node has been started: the clock of ``at: <seconds>`` starts now."""
        loop = asyncio.get_running_loop()
        self._start = loop.time()
        for index, fault in enumerate(self.faults):
            at = fault.at
            if at is None:
                continue
            if at.step is not None:
                self._by_step.append((at.step, index))
            else:
                self._timers.append(loop.call_later(at.seconds or 0.0, self._fire, index, fault,
                                                    f"at {at.seconds:g}s"))

    def on_progress(self, trainer: int, done: int) -> None:
        """Trainer `trainer` reported `done` steps finished: fire the faults due."""
        due = [index for step, index in self._by_step if done >= step]
        self._by_step = [(step, index) for step, index in self._by_step if done < step]
        for index in due:
            self._fire(index, self.faults[index],
                       f"{trainer_name(trainer)} reported step {done}")

    async def close(self) -> None:
        """Cancel what has not fired yet and resume every paused node."""
        for timer in self._timers:
            timer.cancel()
        self._by_step.clear()
        for task in self._slowed:
            task.cancel()
        await asyncio.gather(*self._slowed, return_exceptions=True)

    # -- firing -----------------------------------------------------------------------------------
    def _now(self) -> float:
        return 0.0 if self._start is None else asyncio.get_running_loop().time() - self._start

    def _fire(self, index: int, fault: AnyFault, why: str) -> None:
        event = FaultEvent(index, fault_kind(fault), describe(fault), round(self._now(), 3),
                           detail=why)
        self.events.append(event)
        if isinstance(fault, Crash):
            self._crash(fault, event)
        elif isinstance(fault, Partition):
            self._window(event, fault.heal_after, fault)
        elif isinstance(fault, LinkFaults):
            self._window(event, fault.duration, fault)
        else:
            self._slow(fault, event)
        self.say(f"fault {index} at {event.start:.2f}s ({event.detail}): {event.what}")

    def _crash(self, fault: Crash, event: FaultEvent) -> None:
        pid = self.nodes.kill(fault.crash)
        if pid is None:
            event.detail += "; not running: nothing to crash"
            event.end = event.start
            return
        event.detail += f"; SIGKILL to process group {pid}"
        if fault.restart_after is not None:
            event.end = round(event.start + fault.restart_after, 3)
            self.nodes.restart_after(fault.crash, fault.restart_after)

    def _window(self, event: FaultEvent, duration: float | None,
                fault: Partition | LinkFaults) -> None:
        self._active.append(fault)
        self._apply()
        if duration is not None:
            event.end = round(event.start + duration, 3)
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(duration, self._end_window, event, fault))

    def _end_window(self, event: FaultEvent, fault: Partition | LinkFaults) -> None:
        self._active.remove(fault)
        self._apply()
        self.say(f"fault {event.fault} ended at {self._now():.2f}s: {event.what}")

    def _apply(self) -> None:
        """Set every proxy's per-trainer faults and partitions to what is in force now."""
        partitions = [f for f in self._active if isinstance(f, Partition)]
        rules = [f for f in self._active if isinstance(f, LinkFaults)]
        for j, proxy in self.proxies.items():
            pserver = pserver_name(j)
            cut = set()
            for i in range(self.trainers):
                trainer = trainer_name(i)
                matching = [r for r in rules if r.matches(trainer, pserver)]
                base = self.base.get((trainer, pserver))
                if matching:
                    proxy.client_faults[trainer] = dict.fromkeys(Direction,
                                                                 link_faults(matching, base))
                elif base is not None:
                    proxy.client_faults[trainer] = dict.fromkeys(Direction, base)
                else:
                    proxy.client_faults.pop(trainer, None)
                if any(p.cuts(trainer, pserver) for p in partitions):
                    cut.add(trainer)
            before = self._cut.get(j, set())
            if before - cut:
                proxy.heal(before - cut)
            if cut - before:
                proxy.partition("drop", cut - before)
            self._cut[j] = cut

    def _slow(self, fault: Slow, event: FaultEvent) -> None:
        slowed = [n for n in self.node_names if fnmatchcase(n, fault.slow)]
        if fault.duration is not None:
            event.end = round(event.start + fault.duration, 3)
        stopped = SLOW_PERIOD * (1.0 - 1.0 / fault.slowdown)
        event.detail += (f"; paused {stopped * 1e3:.1f}ms of every {SLOW_PERIOD * 1e3:g}ms "
                         "(SIGSTOP/SIGCONT)")
        loop = asyncio.get_running_loop()
        for node in slowed:
            task = loop.create_task(self._duty_cycle(node, stopped, fault.duration, event),
                                    name=f"slow {node}")
            self._slowed.add(task)
            task.add_done_callback(self._slowed.discard)

    async def _duty_cycle(self, node: str, stopped: float, duration: float | None,
                          event: FaultEvent) -> None:
        """Pause `node` `stopped` seconds of every period until `duration` has passed (or it
        stops running); the event's detail then says how often."""
        loop = asyncio.get_running_loop()
        end = math.inf if duration is None else loop.time() + duration
        pauses = 0
        try:
            while loop.time() < end and self.nodes.send_signal(node, signal.SIGSTOP):
                pauses += 1
                await asyncio.sleep(stopped)
                self.nodes.send_signal(node, signal.SIGCONT)
                await asyncio.sleep(SLOW_PERIOD - stopped)
        finally:
            self.nodes.send_signal(node, signal.SIGCONT)
            event.detail += f"; {node} paused {pauses} times"

