"""Nodes' CPUs on the virtual clock: each node one process, the nodes of a host sharing its cores.

A real node is one Python process with one event loop: it does one thing at a time (a kernel,
encoding a message, handling a request), and what arrives while it is busy waits. `Cpus` gives
every node a queue of work that it serves first in first out: `run(node, seconds, callback)`
queues `seconds` of CPU work and calls `callback` when it is done; `spend(node, seconds)` is
the same as an awaitable. The simulator puts on it everything a node spends CPU on: its
kernels (`runtime.execution.compute.Charge.pay`), and the runtime's own costs
(`runtime.execution.costs`): each message's cost on its sender before it leaves and on its receiver
before it is handled.

Threads. With the runtime's costs, each node also has an I/O thread (`io_thread`: ZeroMQ's,
which moves the bytes beside the main thread): a processor of its own on the node's host, with
a queue of its own. Kernels are taken to run on the main thread alone (`runtime up` gives
each node's kernels its share of the cores, one thread when the nodes outnumber them).

Lanes. A processor's work may come in lanes (`run(..., lane=peer)`): first in first out within
a lane, the lanes that have work sharing the processor's rate evenly. The I/O thread has a lane
per peer: ZeroMQ's I/O thread serves its connections in turn (a batch of bytes from one, then
the next), so a 4 MB reply to one trainer does not go out whole before the reply to another
starts; it finishes later, about when the other does. Served first in first out instead, the
first trainer got its reply a whole encryption earlier than for real and started its next step
while the pserver still sent the other's: measured on a 1 pserver x 2 trainers job with 4 MB
of parameters, the replies reached both trainers 12-13 ms after the pserver sent them, where a
queue served in order predicted 7 and 10.

Hosts and cores (the scenario's ``cluster.hosts``). The threads of a host's nodes share its k
cores by processor sharing: while m of them have work, each runs at rate ``min(1, k / m)`` (a
thread never runs faster than one core). Processor sharing is what a time-sliced scheduler
such as Linux's CFS tends to over slices short against the work, and it is exact for the two
cases that matter most: an idle host (m <= k, every thread at full speed) and the total
throughput of a saturated one (the k cores split evenly). It does not model cache effects, the
cost of a context switch, or the scheduler's granularity: a thread woken on a saturated host
may wait for the running one's slice (about a millisecond) where processor sharing serves it at
once, so on oversubscribed hosts with short pieces of work it predicts somewhat fast.

Time slices. A host whose scheduler slice was measured (`runtime calibrate`: `SimHost.slice`,
about 4 ms on a VM whose tick is 250 Hz) and whose threads outnumber its cores is time-sliced
instead (`_SlicedHost`): as many threads as cores run at once, at full speed, each until its
work runs out or, while others wait, its slice ends. That is what a short piece of work sees
on a busy Linux machine: it runs whole, or waits a slice, rather than crawling at k / m.

A node on no host has a machine of its own, with a core for each of its threads: its main
thread's queue is then served at full speed with one timer per piece of work, and its I/O
thread's lanes share a core of their own.

Determinism: work that finishes at the same instant completes in the order its nodes became
busy; every timer is on the loop's clock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from runtime.config.nodes import no_node
from runtime.execution.costs import crowding

__all__ = ["Cpus", "SimHost", "IO_SUFFIX", "host_loads", "host_of", "hosts_of", "io_thread"]

EPSILON = 1e-12
"""Work left below this many seconds is done (float rounding of rate x time)."""


@dataclass(frozen=True)
class SimHost:
    """A host: the nodes on it (names or patterns) and its cores; `rates`, where measured
    (`runtime calibrate` on a machine of as many cores): the rate of each busy thread while
    1, 2, ... threads have work, instead of processor sharing's ``min(1, cores / m)``."""

    name: str
    nodes: tuple[str, ...]
    cores: float
    rates: tuple[float, ...] = ()
    slice: float = 0.0
    """Where measured (`runtime calibrate`): the longest a busy thread keeps a core while others
    wait for one, in seconds; the host then time-slices (`_SlicedHost`) instead of processor
    sharing. 0: processor sharing."""


@dataclass(slots=True)
class _Work:
    left: float
    callback: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(slots=True)
class _Node:
    """A processor: a main or an I/O thread. Its work waits in lanes (`lanes`, by name); the
    lanes that have work (`active`, in the order they got it) share its rate evenly."""

    name: str
    host: _Host
    lanes: dict[str, deque[_Work]] = field(default_factory=dict)
    active: list[deque[_Work]] = field(default_factory=list)
    free_at: float = 0.0
    """Unshared hosts: when the node's last queued work ends."""
    busy: float = 0.0
    """Seconds of CPU work it has done (or has queued, on an unshared host)."""

    def queue(self, lane: str) -> deque[_Work]:
        queue = self.lanes.get(lane)
        if queue is None:
            queue = self.lanes[lane] = deque()
        return queue


class _Host:
    """Processor sharing of `cores` among the host's processors that have work, at the
    measured `rates` where given (see `SimHost`; beyond the table, its last throughput split
    evenly)."""

    def __init__(self, name: str, cores: float, nodes: int,
                 rates: tuple[float, ...] = ()) -> None:
        self.name = name
        self.cores = cores
        self.rates = rates
        self.shared = nodes > cores or (nodes > 1 and any(r < 1.0 for r in rates[1:nodes]))
        self.active: list[_Node] = []
        self.updated = 0.0
        self.timer: asyncio.TimerHandle | None = None

    def rate(self) -> float:
        """Each busy thread's rate: the measured one, and never more than ``cores / busy`` (a
        machine file measured before `runtime calibrate` capped its rates may say 2.6 cores'
        worth on 2: see docs/fidelity.md, 2026-12-07, 13:12)."""
        busy = len(self.active)
        if not busy:
            return 1.0
        rates = self.rates
        fair = min(1.0, self.cores / busy)
        if not rates:
            return fair
        if busy <= len(rates):
            return min(fair, rates[busy - 1])
        return min(fair, rates[-1] * len(rates) / busy)

    def advance(self, now: float) -> None:
        """Take the work done since the last update off every busy lane's current piece."""
        working = self.working()
        if working and now > self.updated:
            done = (now - self.updated) * self.rate()
            for node in working:
                share = done / len(node.active)
                for queue in node.active:
                    queue[0].left -= share
        self.updated = now

    def working(self) -> list[_Node]:
        """The processors that progress now: every one with work."""
        return self.active

    def submit(self, node: _Node, lane: str, work: _Work,
               loop: asyncio.AbstractEventLoop) -> None:
        self.advance(loop.time())
        queue = node.queue(lane)
        queue.append(work)
        if len(queue) == 1:
            if not node.active:
                self.active.append(node)
            node.active.append(queue)
        self.reschedule(loop)

    def reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.active:
            return
        # the host's clock, in no node's context: a paused node's pause must not hold it
        self.timer = loop.call_at(self.soonest(), self.tick, context=no_node())

    def soonest(self) -> float:
        """When the first piece of work of a working processor ends, at the present rate."""
        left = min(queue[0].left * len(node.active)
                   for node in self.working() for queue in node.active)
        return self.updated + max(left, 0.0) / self.rate()

    def finish(self) -> list[_Work]:
        """Take the pieces of work that are done off the working processors' lanes."""
        finished = []
        for node in self.working():
            for queue in node.active:
                if queue[0].left <= EPSILON:
                    finished.append(queue.popleft())
            node.active = [queue for queue in node.active if queue]
        return finished

    def tick(self) -> None:
        loop = asyncio.get_running_loop()
        self.timer = None
        self.advance(loop.time())
        finished = self.finish()
        self.active = [node for node in self.active if node.active]
        self.reschedule(loop)
        for work in finished:
            work.callback(*work.args)


class _SlicedHost(_Host):
    """Time slices, as Linux's scheduler gives them: at most `cores` of the host's processors
    that have work run at once (`running`), the others wait their turn in order (`waiting`).
    A running one keeps its core until its work is done or, while others wait, its slice ends;
    it then waits at the back. One that gets work after having none (woken: a message came, a
    reply) takes a free core, or waits first in line: it does not cut a running one's slice
    short (Linux's EEVDF lets the running task reach its fair share first, and a VM's tick
    ends slices on its period). The running share what the host does with that many busy
    (`rates`, as processor sharing's): a thread runs its short piece of work at full speed
    where processor sharing would slow it by every thread that has work.

    DESIGN: measured on this project's 2-core development VM, a geo job of 2 pservers x 4
    trainers steps locally in 0.44 ms (its kernels alone take most of that) where processor
    sharing predicted twice as long: four trainers that each run 4 ms at a time do not share
    a core by the microsecond. Preempting a running thread on every wake-up predicted 0.98 ms;
    waiting first in line, 0.56."""

    def __init__(self, name: str, cores: float, nodes: int, rates: tuple[float, ...],
                 slice_seconds: float) -> None:
        super().__init__(name, cores, nodes, rates)
        self.shared = True
        self.slice = slice_seconds
        self.seats = max(int(cores), 1)
        self.running: list[_Node] = []
        self.woken: deque[_Node] = deque()
        """Waiting for a core since they got work, first in line, in the order they got it."""
        self.waiting: deque[_Node] = deque()
        """Waiting since their slice ended, in that order."""
        self.since: dict[str, float] = {}
        """Running processor -> when its current slice began."""

    def rate(self) -> float:
        """Each running processor's: the throughput of the host with all that have work busy,
        split among those that run."""
        working = len(self.working())
        if not working:
            return 1.0
        return min(1.0, super().rate() * len(self.active) / working)

    def working(self) -> list[_Node]:
        """The running processors that have work (one that ran out keeps its core a moment)."""
        return [node for node in self.running if node.active]

    def submit(self, node: _Node, lane: str, work: _Work,
               loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        self.advance(now)
        queue = node.queue(lane)
        queue.append(work)
        if len(queue) == 1:
            if not node.active:
                if node not in self.active:
                    self.active.append(node)
                if node.name not in self.since:  # else: its next piece, in the same slice
                    self._wake(node, now)
            node.active.append(queue)
        self.reschedule(loop)

    def _wake(self, node: _Node, now: float) -> None:
        if len(self.running) >= self.seats:
            self.woken.append(node)
            return
        self.running.append(node)
        self.since[node.name] = now

    def reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        ends = [self.soonest()] if self.working() else []
        if self.woken or self.waiting:
            ends.append(min(self.since.values()) + self.slice)
        if ends:
            self.timer = loop.call_at(max(min(ends), self.updated), self.tick,
                                      context=no_node())

    def tick(self) -> None:
        """Finish the pieces of work due; their callbacks may give their processors the next
        piece at once (a thread going on with its work keeps its core and its slice); then the
        processors left without work give up their cores, and those whose slice is over while
        others wait go to the back."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.timer = None
        self.advance(now)
        finished = self.finish()
        for work in finished:
            work.callback(*work.args)
        if any(not node.active for node in self.running):
            loop.call_soon(self._settle, HOPS, context=no_node())
        self._rotate(now)
        self.reschedule(loop)

    def _settle(self, hops: int) -> None:
        """Free the cores of the processors still without work `hops` turns of the loop after
        their last piece ended: a task resumed by that piece's end gives its next piece within
        a turn or two at the same instant, and keeps its core and slice for it."""
        loop = asyncio.get_running_loop()
        if hops > 1:
            loop.call_soon(self._settle, hops - 1, context=no_node())
            return
        idle = [node for node in self.running if not node.active]
        if not idle:
            return
        self.advance(loop.time())
        for node in idle:  # no more work: it blocks
            self.running.remove(node)
            del self.since[node.name]
        self._rotate(loop.time())
        self.reschedule(loop)

    def _rotate(self, now: float) -> None:
        """Slices over while others wait go to the back; free cores go to those waiting."""
        self.active = [node for node in self.active if node.active]
        for node in list(self.running):  # slices over while others wait
            if node.active and (self.woken or self.waiting) \
                    and now >= self.since[node.name] + self.slice - EPSILON:
                self.running.remove(node)
                del self.since[node.name]
                self.waiting.append(node)
        while (self.woken or self.waiting) and len(self.running) < self.seats:
            node = (self.woken or self.waiting).popleft()
            self.running.append(node)
            self.since[node.name] = now


HOPS = 3
"""Turns of the event loop a processor keeps its core after its work ran out (`_settle`)."""


def io_thread(node: str) -> str:
    """The name of `node`'s I/O thread's processor (ZeroMQ moves the bytes on a thread of its
    own, beside the node's main thread: `runtime.execution.costs`)."""
    return node + IO_SUFFIX


IO_SUFFIX = "/io"


class Cpus:
    """Every node's CPU in one simulated run (see the module doc). A node runs on the first
    host of `hosts` whose patterns match its name, its I/O thread (`io_thread`) beside it; a
    node on no host has a machine of its own, with a core for each of its threads."""

    def __init__(self, hosts: Sequence[SimHost], nodes: Sequence[str], io: bool = False) -> None:
        self.hosts = list(hosts)
        self.io = io
        threads = 2 if io else 1
        self._nodes_on: dict[str, int] = {}
        """Host -> the nodes on it."""
        for name in nodes:
            spec = self._host_of(name)
            if spec is not None:
                self._nodes_on[spec.name] = self._nodes_on.get(spec.name, 0) + 1
        self._hosts = {spec.name: _host(spec, self._nodes_on.get(spec.name, 0) * threads)
                       for spec in self.hosts}
        self._own: dict[str, _Host] = {}
        self._nodes: dict[str, _Node] = {}

    def _host_of(self, name: str) -> SimHost | None:
        return host_of(self.hosts, name)

    def crowding(self, name: str) -> float:
        """The nodes beyond its cores on node `name`'s host (I/O threads not counted); none
        for a node with a machine of its own."""
        spec = self._host_of(name)
        if spec is None:
            return 0.0
        return crowding(self._nodes_on.get(spec.name, 0), spec.cores)

    def node(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            spec = self._host_of(name)
            if spec is None:
                base = name.removesuffix(IO_SUFFIX)
                host = self._own.get(base)
                if host is None:
                    host = self._own[base] = _Host(base, 2.0, 2)
            else:
                host = self._hosts[spec.name]
            node = self._nodes[name] = _Node(name, host)
        return node

    def run(self, name: str, seconds: float, callback: Callable[..., Any], *args: Any,
            lane: str = "") -> None:
        """Queue `seconds` of work on `name`'s CPU, in `lane` (see the module doc);
        `callback(*args)` when it is done. Work of no duration on an idle node calls back at
        once."""
        node = self.node(name)
        host = node.host
        loop = asyncio.get_running_loop()
        if not host.shared and not lane:
            now = loop.time()
            if seconds <= 0 and node.free_at <= now:
                callback(*args)
                return
            node.free_at = max(now, node.free_at) + max(seconds, 0.0)
            node.busy += max(seconds, 0.0)
            loop.call_at(node.free_at, callback, *args)
            return
        node.busy += max(seconds, 0.0)
        if seconds <= 0 and not node.lanes.get(lane):
            callback(*args)
            return
        host.submit(node, lane, _Work(max(seconds, 0.0), callback, args), loop)

    def spend(self, name: str, seconds: float) -> asyncio.Future[None]:
        """`run` as a future that is done when the work is."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.run(name, seconds, _settle, future)
        return future

    def busy(self) -> Mapping[str, float]:
        """Seconds of CPU work each node was given."""
        return {name: node.busy for name, node in self._nodes.items()}


def host_of(hosts: Sequence[SimHost], name: str) -> SimHost | None:
    """The first of `hosts` whose patterns match node `name` (or the node of I/O thread
    `name`); None: the node has a machine of its own."""
    name = name.removesuffix(IO_SUFFIX)
    return next((spec for spec in hosts
                 if any(fnmatchcase(name, pattern) for pattern in spec.nodes)), None)


def host_loads(hosts: Sequence[SimHost], busy: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds of work each host's threads were given, from each thread's (`Cpus.busy`)."""
    loads = {spec.name: 0.0 for spec in hosts}
    for name, seconds in busy.items():
        spec = host_of(hosts, name)
        if spec is not None:
            loads[spec.name] += seconds
    return loads


def _host(spec: SimHost, threads: int) -> _Host:
    """The scheduler of `spec`, whose nodes have `threads` threads in all: time slices where its
    slice was measured and its threads can outnumber its cores, else processor sharing."""
    if spec.slice > 0 and threads > spec.cores:
        return _SlicedHost(spec.name, spec.cores, threads, spec.rates, spec.slice)
    return _Host(spec.name, spec.cores, threads, spec.rates)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def hosts_of(spec: Sequence[Mapping[str, Any]] | None,
             sharing: Mapping[float, tuple[float, ...]] | None = None,
             slices: Mapping[float, float] | None = None) -> list[SimHost]:
    """`SimHost`s from a scenario's validated ``cluster.hosts`` entries; `sharing` and
    `slices`: the measured per-thread rates and scheduler slice of machines by their cores
    (`runtime calibrate`), given to the hosts of as many cores."""
    hosts = []
    for i, entry in enumerate(spec or ()):
        cores = float(entry["cores"])
        hosts.append(SimHost(str(entry.get("name") or f"host{i}"), tuple(entry["nodes"]), cores,
                             tuple((sharing or {}).get(cores, ())),
                             float((slices or {}).get(cores, 0.0))))
    return hosts
