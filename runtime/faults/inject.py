"""Faults for `runtime up`: `RuntimeTarget`, the `runtime.faults.schedule.FaultTarget` that acts a
scenario's `faults:` (`runtime.config.faults`) out on real processes and fault proxies.

The schedule (`runtime.faults.schedule.FaultSchedule`, the simulator's too) says when each fault
begins and ends; this target does it with what the operating system and a proxy offer:

- crash: SIGKILL to the node's process group, without warning (`Nodes.kill`). For a crash with
  ``restart_after`` the launcher then waits for `restart`, which starts the node again: a
  pserver with ``--recover`` (from its last checkpoint; the trainers redo the steps it lost), a
  trainer with ``--incarnation N`` (so that its message ids differ from its earlier lives'). A
  node killed for good is not a failure of the run by itself: the other nodes and the expect
  block decide.
- partition, links: one `FaultProxy` listens at each pserver's endpoint, which the trainers
  connect to, and forwards to the address the pserver really serves at (``--bind``); in a job
  with keys a `runtime.faults.curve_proxy.CurveFaultProxy`, which keeps it encrypted. Each
  (trainer, pserver) connection is one link of that proxy, named by the trainer's ZeroMQ
  identity, and gets the faults of the rules in force that match the pair in either order,
  combined (`link_faults`); a partition drops the messages of the links between its two groups,
  as a cut cable under live TCP connections, until it heals. Only trainer-pserver connections
  exist, so a pattern pair that matches no such pair has nothing to act on
  (`runtime.launch.launcher` says so in its notes). The proxies draw from generators seeded by the
  scenario's seed, the trainer and the pserver's name. Under ``runtime up --netns`` the proxies also
  hold every message for the network's latency of its link (`RuntimeTarget.base`); a rule's delays
  add to it.
- pause: SIGSTOP to the node's process group, SIGCONT when it ends (a slowdown's duty cycle
  leaves it stopped meanwhile).
- slow: the node's process group is paused (SIGSTOP) for ``1 - 1/slowdown`` of every
  `SLOW_PERIOD` and resumed (SIGCONT) for the rest (the slowdowns of a node in force
  multiplied), until it ends: on average the whole node, its replies as much as its compute,
  runs ``slowdown`` times slower.

Role mode (``runtime up --role``, one node per host, `runtime.launch.role`): there is no
launcher of the whole job. Each node's host runs the same schedule on a `RuntimeTarget` whose
`own` is its node: it kills, restarts and pauses that node only, a pserver's host holds the
fault proxy of that pserver (every trainer-pserver link has one: the pserver's), and a fault on
another node is that node's host's to act out (`crash` says so and counts it done).

Each fault is announced through `say` as it begins and ends; `metrics_events` turns the
schedule's events into metrics.json's.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtime.config.faults import AnyFault, LinkFaults, Partition
from runtime.config.metrics import FaultEvent as MetricsEvent
from runtime.config.nodes import pserver_name, trainer_name
from runtime.faults.proxy import Direction, FaultProxy, Faults, Latency
from runtime.faults.schedule import ScheduleEvent

SLOW_PERIOD = 0.02
"""Seconds of one pause-and-run cycle of a slowed node."""


class Nodes(Protocol):
    """What the target asks of the launcher, which owns the processes."""

    def kill(self, node: str, returning: bool) -> int | None:
        """SIGKILL `node`'s process group; its pid, or None if it was not running. With
        `returning`, the run waits for `restart`."""

    def restart(self, node: str) -> None:
        """Start the killed `node` again (once its process is reaped)."""

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
    the latency of `base` (the link's own faults, without the rules); a reordered message waits
    at most `REORDER_WAIT` for its successor (the `Faults` default), as in the simulator."""

    def either(chances: list[float]) -> float:
        return 1.0 - math.prod(1.0 - p for p in chances)

    delays = tuple((r.delay, r.delay_by) for r in rules if r.delay > 0)
    latency = base.latency if base is not None else 0.0
    return Faults(latency=DelaySampler(delays, latency) if delays else latency,
                  drop=either([r.drop for r in rules]),
                  duplicate=either([r.duplicate for r in rules]),
                  reorder=either([r.reorder for r in rules]))


@dataclass
class _Slowed:
    """A node's slowdowns in force and the duty cycle that realises their product."""

    factors: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    """The node's pause count when each slowdown began."""
    pauses: int = 0
    task: asyncio.Task[None] | None = None


@dataclass
class RuntimeTarget:
    """runtime up's `FaultTarget`: the launcher's processes (`nodes`) and the fault proxy in
    front of each pserver (`proxies`, by index; empty without message faults)."""

    nodes: Nodes
    proxies: Mapping[int, FaultProxy]
    trainers: int
    say: Callable[[str], None]
    base: Mapping[tuple[str, str], Faults] = field(default_factory=dict)
    """(trainer, pserver) -> the faults of that link without any rule: the scenario network's
    latency under ``--netns``; none (no faults) for a link not listed."""
    own: str | None = None
    """Role mode: the one node this target acts on (None: every node, as runtime up)."""
    _partitions: tuple[Partition, ...] = ()
    _rules: tuple[LinkFaults, ...] = ()
    _cut: dict[int, set[str]] = field(default_factory=dict)
    _slowed: dict[str, _Slowed] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    """The nodes a pause fault holds stopped (SIGSTOP) now."""

    # -- processes ---------------------------------------------------------------------------
    def _elsewhere(self, node: str) -> bool:
        """Whether `node` is another host's to act on (role mode)."""
        return self.own is not None and node != self.own

    def crash(self, node: str, returning: bool) -> str | None:
        if self._elsewhere(node):
            return f"by {node}'s own host"
        pid = self.nodes.kill(node, returning)
        return None if pid is None else f"SIGKILL to process group {pid}"

    def restart(self, node: str) -> None:
        if not self._elsewhere(node):
            self.nodes.restart(node)

    def slow(self, node: str, factor: float) -> str:
        if self._elsewhere(node):
            return f"{node} by its own host"
        slowed = self._slowed.setdefault(node, _Slowed())
        slowed.factors.append(factor)
        slowed.starts.append(slowed.pauses)
        self._cycle(node, slowed)
        stopped = SLOW_PERIOD * (1.0 - 1.0 / factor)
        return (f"paused {stopped * 1e3:.1f}ms of every {SLOW_PERIOD * 1e3:g}ms "
                "(SIGSTOP/SIGCONT)")

    def unslow(self, node: str, factor: float) -> str:
        if self._elsewhere(node):
            return ""
        slowed = self._slowed[node]
        at = slowed.factors.index(factor)
        slowed.factors.pop(at)
        pauses = slowed.pauses - slowed.starts.pop(at)
        self._cycle(node, slowed)
        return f"{node} paused {pauses} times"

    def pause(self, node: str) -> str:
        if self._elsewhere(node):
            return f"{node} by its own host"
        if not self.nodes.send_signal(node, signal.SIGSTOP):
            return f"{node} not running"
        self.paused.add(node)
        return "SIGSTOP"

    def resume(self, node: str) -> None:
        if node in self.paused:
            self.paused.discard(node)
            self.nodes.send_signal(node, signal.SIGCONT)

    def _run_on(self, node: str) -> None:
        """SIGCONT to `node` unless a pause holds it stopped (a slowdown's duty cycle)."""
        if node not in self.paused:
            self.nodes.send_signal(node, signal.SIGCONT)

    def slowdown(self, node: str) -> float:
        """The factor `node` is slowed by now (1: not slowed)."""
        slowed = self._slowed.get(node)
        return math.prod(slowed.factors) if slowed is not None else 1.0

    def _cycle(self, node: str, slowed: _Slowed) -> None:
        """(Re)start `node`'s duty cycle at the product of its factors, or end it."""
        if slowed.task is not None:
            slowed.task.cancel()  # it resumes the node as it ends
            slowed.task = None
        if slowed.factors:
            stopped = SLOW_PERIOD * (1.0 - 1.0 / math.prod(slowed.factors))
            slowed.task = asyncio.get_running_loop().create_task(
                self._duty_cycle(node, stopped, slowed), name=f"slow {node}")

    async def _duty_cycle(self, node: str, stopped: float, slowed: _Slowed) -> None:
        """Pause `node` the first `stopped` seconds of every period until cancelled (or it
        stops running), counting the pauses. The periods keep a fixed grid from the cycle's
        start: a late wake-up of this loop shortens the phase it delays, and a pause whose
        time is over by then is left out, rather than every period growing by the lateness
        (relative sleeps made a busy launcher pause a node 46 times in 2 s, not 100)."""
        loop = asyncio.get_running_loop()
        period = loop.time()
        try:
            while True:
                now = loop.time()
                while now >= period + stopped:  # this period's pause is over already
                    period += SLOW_PERIOD
                await asyncio.sleep(max(0.0, period - now))
                if not self.nodes.send_signal(node, signal.SIGSTOP):
                    break
                slowed.pauses += 1
                await asyncio.sleep(max(0.0, period + stopped - loop.time()))
                self._run_on(node)
                period += SLOW_PERIOD
        finally:
            self._run_on(node)

    async def close(self) -> None:
        """Resume every paused node and wait for the duty cycles to end."""
        for node in list(self.paused):
            self.resume(node)
        tasks = [s.task for s in self._slowed.values() if s.task is not None]
        for slowed in self._slowed.values():
            slowed.task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- messages ----------------------------------------------------------------------------
    def set_partitions(self, partitions: tuple[Partition, ...]) -> None:
        self._partitions = partitions
        self._apply()

    def set_link_rules(self, rules: tuple[LinkFaults, ...]) -> None:
        self._rules = rules
        self._apply()

    def _apply(self) -> None:
        """Set every proxy's per-trainer faults and partitions to what is in force now."""
        for j, proxy in self.proxies.items():
            pserver = pserver_name(j)
            cut = set()
            for i in range(self.trainers):
                trainer = trainer_name(i)
                matching = [r for r in self._rules if r.matches(trainer, pserver)]
                base = self.base.get((trainer, pserver))
                if matching:
                    proxy.client_faults[trainer] = dict.fromkeys(Direction,
                                                                 link_faults(matching, base))
                elif base is not None:
                    proxy.client_faults[trainer] = dict.fromkeys(Direction, base)
                else:
                    proxy.client_faults.pop(trainer, None)
                if any(p.cuts(trainer, pserver) for p in self._partitions):
                    cut.add(trainer)
            before = self._cut.get(j, set())
            if before - cut:
                proxy.heal(before - cut)
            if cut - before:
                proxy.partition("drop", cut - before)
            self._cut[j] = cut

    # -- telling -----------------------------------------------------------------------------
    def fired(self, event: ScheduleEvent) -> None:
        self.say(f"fault {event.fault} at {event.start:.2f}s ({event.detail}): {event.what}")

    def ended(self, event: ScheduleEvent) -> None:
        end = event.end if event.end is not None else event.start
        self.say(f"fault {event.fault} ended at {end:.2f}s: {event.what}")


def metrics_events(events: Sequence[ScheduleEvent]) -> list[MetricsEvent]:
    """The schedule's events as metrics.json lists them, times to the millisecond."""
    return [MetricsEvent(e.fault, e.kind, e.what, round(e.start, 3),
                         None if e.end is None else round(e.end, 3), e.detail) for e in events]
