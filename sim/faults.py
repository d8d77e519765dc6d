"""Faults in the simulator: the scenario's `faults:` (`runtime.config.faults`) acted out on the
virtual clock by `SimTarget`, deterministic by seed; `runtime.faults.schedule.FaultSchedule` says
when.

Three parts:

- `MessageFaults` is what the `Network` asks about every message as it leaves its sender's NIC
  (`Network._deliver`): whether a partition cuts its link, and what the link rules in force do
  to it (`runtime.config.faults.LinkFaults` says what each fault means): dropped, duplicated (two
  copies, the second right behind the first), reordered (held back until the next message on
  its link has gone, or `REORDER_WAIT` passed) or delayed (by ``delay_by``; later messages on
  the link queue behind it, as on a TCP connection). The draws come from one `random.Random`
  per directed link, seeded by the run's seed and the link, four draws per message and
  matching rule in a fixed order, so a run's fates do not depend on how traffic on other links
  interleaves. A partition acts on messages sent while it holds (one already on the wire
  arrives).
- `Slowdowns` multiplies the compute model's cost of each slowed node by its factors in force.
- `SimTarget` is the `runtime.faults.schedule.FaultTarget` of a simulated run: crash and restart
  through `runtime.services.cluster.LocalCluster`, partitions and link rules into `MessageFaults`,
  slowdowns into `Slowdowns`, pauses into the loop (`VirtualTimeLoop.hold`: what the node
  runs) and the `Network` (the messages reaching it); each fault is drawn on the trace as a
  span of category ``fault`` on each node it hits (``fault`` track of `sim.trace`).

DESIGN: the network is seen here as `PausableNetwork` (its `pause` and `resume`), not imported:
`sim.network` imports this module for `MessageFaults`, and the two modules form no cycle.
"""

from __future__ import annotations

import asyncio
import random
from typing import NamedTuple, Protocol

from runtime.config.faults import REORDER_WAIT, LinkFaults, Partition
from runtime.config.nodes import NODE, no_node
from runtime.execution.compute import ComputeModel, Tracer
from runtime.execution.scope import Scope
from runtime.faults.schedule import ScheduleEvent
from runtime.services.cluster import LocalCluster
from sim.loop import VirtualTimeLoop
from transpiler.ir import Op

__all__ = ["Fate", "MessageFaults", "REORDER_WAIT", "ScheduleEvent", "SimTarget",
           "Slowdowns"]



class Fate(NamedTuple):
    """What happens to one message: `lost` (dropped, or `cut` by a partition), else delivered
    `copies` times (1 or 2), `delay` seconds late, after the link's next message if `reorder`."""

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
        lost, twice, delay, reorder = False, False, 0.0, False
        for rule in rules:
            drop, dup, late, swap = rng.random(), rng.random(), rng.random(), rng.random()
            lost = lost or drop < rule.drop
            twice = twice or dup < rule.duplicate
            reorder = reorder or swap < rule.reorder
            delay += rule.delay_by if late < rule.delay else 0.0
        return Fate(lost=lost, copies=1 + twice, delay=delay, reorder=reorder)

    def _rng(self, src: str, dst: str) -> random.Random:
        rng = self._rngs.get((src, dst))
        if rng is None:
            rng = self._rngs[src, dst] = random.Random(f"{self.seed}:faults:{src}->{dst}")
        return rng


class Slowdowns:
    """A compute model whose cost is the wrapped model's, times the factors of the slowdowns
    in force on the node (in the order they began)."""

    def __init__(self, inner: ComputeModel) -> None:
        self.inner = inner
        self.factors: dict[str, list[float]] = {}

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        seconds = self.inner.cost(node, op, scope, step)
        for factor in self.factors.get(node, ()):
            seconds *= factor
        return seconds


class PausableNetwork(Protocol):
    """What a pause needs of the simulated network (`sim.network.Network` is one)."""

    def pause(self, node: str) -> None:
        """`node` stops taking messages: they wait for it."""

    def resume(self, node: str) -> None:
        """`node` takes the messages that waited, then the rest as they come."""


class SimTarget:
    """The simulator's `FaultTarget`: the cluster's tasks, the network's message faults, the
    compute model's slowdowns (None: no compute model, a slowdown has nothing to slow) and the
    trace."""

    def __init__(self, cluster: LocalCluster, messages: MessageFaults,
                 slowdowns: Slowdowns | None, tracer: Tracer | None = None,
                 network: PausableNetwork | None = None) -> None:
        self.cluster = cluster
        self.messages = messages
        self.slowdowns = slowdowns
        self.tracer = tracer
        self.network = network
        self.paused: set[str] = set()

    def crash(self, node: str, returning: bool) -> str | None:
        return "" if self.cluster.crash(node, returning) else None

    def restart(self, node: str) -> None:
        self.cluster.restart(node)

    def set_partitions(self, partitions: tuple[Partition, ...]) -> None:
        self.messages.partitions = list(partitions)

    def set_link_rules(self, rules: tuple[LinkFaults, ...]) -> None:
        self.messages.rules = list(rules)

    def slow(self, node: str, factor: float) -> str:
        if self.slowdowns is not None:
            self.slowdowns.factors.setdefault(node, []).append(factor)
        return ""

    def unslow(self, node: str, factor: float) -> str:
        if self.slowdowns is not None:
            factors = self.slowdowns.factors[node]
            factors.remove(factor)
            if not factors:
                del self.slowdowns.factors[node]
        return ""

    def pause(self, node: str) -> str:
        """Hold what the node would run on the virtual loop (what it runs is its own: `NODE`)
        and the messages that reach it, until `resume`."""
        loop = asyncio.get_running_loop()
        if isinstance(loop, VirtualTimeLoop):
            loop.hold(NODE, node)
        if self.network is not None:
            self.network.pause(node)
        self.paused.add(node)
        return ""

    def resume(self, node: str) -> None:
        """What it would have run meanwhile runs now, late, then the messages that waited
        reach it: a process resumed finds its late timers due before it reads its sockets."""
        loop = asyncio.get_running_loop()
        if isinstance(loop, VirtualTimeLoop):
            loop.release(node)
        if self.network is not None:
            # in no node's context: handing the messages over is the network's work
            loop.call_soon(self.network.resume, node, context=no_node())
        self.paused.discard(node)

    def fired(self, event: ScheduleEvent) -> None:
        """Draw the fault on the trace of each node it hits, until its end (a mark at its
        start when it lasts to the end)."""
        if self.tracer is None:
            return
        end = event.end if event.end is not None else event.start
        what = f"down ({event.what})" if event.kind == "crash" else event.what
        for node in event.nodes:
            self.tracer.span(node, what, event.start, end, "fault")

    def ended(self, event: ScheduleEvent) -> None:
        pass
