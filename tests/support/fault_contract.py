"""The contract between the fault schedule and every `FaultTarget`, as a test class any target's
tests subclass.

`runtime.faults.schedule.FaultSchedule` decides when each fault begins and ends and calls its
target; a target realises the calls. Each `Case` is a fault list of a 2x2 cluster, a script
(trainers' progress reports, looks at the target, the end of the run) and what must come of it,
on the virtual clock of `sim.loop`:

- `calls`: the exact target calls, in order, with their times (`Recorder` wraps the target);
- `looks`: what the target has realised at given times, as a `Look` (nodes down, trainer-pserver
  links cut, each such link's chances of drop/duplicate/reorder, each node's slowdown);
- `events`: each fault's event (index, what, start, end).

A subclass provides the `harness` fixture: a function that, inside the running loop, makes a
`Harness` (the target and how to look at it). `ModelTarget` here is the reference: a target that
only keeps the state the calls describe; tests/faults/test_fault_schedule.py runs the contract on
it, tests/sim/test_sim_faults.py on the simulator's target, tests/faults/test_runtime_faults.py on
runtime up's (with fake processes and proxies that are never started).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from runtime.config.faults import AnyFault, LinkFaults, Partition
from runtime.config.scenario import parse_scenario
from runtime.faults.schedule import FaultSchedule, FaultTarget, ScheduleEvent
from sim.loop import run

NODES = ("pserver:0", "pserver:1", "trainer:0", "trainer:1")
LINKS = tuple((t, p) for t in NODES[2:] for p in NODES[:2])
"""The trainer-pserver pairs: the links every target has (runtime up has no others)."""

SCENARIO = """\
name: contract
model: {{name: mlp}}
cluster: {{pservers: 2, trainers: 2}}
faults: {faults}
"""


def faults_of(text: str) -> list[AnyFault]:
    """The parsed `faults:` list (YAML flow) of a 2x2 scenario."""
    return list(parse_scenario(SCENARIO.format(faults=text)).faults)


def chances(rules: Sequence[LinkFaults]) -> tuple[float, float, float]:
    """A link's chances of drop, duplicate and reorder under `rules`: any rule may decide."""
    return tuple(round(1.0 - math.prod(1.0 - getattr(r, name) for r in rules), 12)
                 for name in ("drop", "duplicate", "reorder"))  # type: ignore[return-value]


@dataclass(frozen=True)
class Look:
    """What a target has realised: only what differs from a fault-free run is listed."""

    down: frozenset[str] = frozenset()
    cut: frozenset[tuple[str, str]] = frozenset()
    """(trainer, pserver) links cut (both ways)."""
    chances: tuple[tuple[tuple[str, str], tuple[float, float, float]], ...] = ()
    """(trainer, pserver) -> (drop, duplicate, reorder) chances, for links with any."""
    slow: tuple[tuple[str, float], ...] = ()
    """node -> the factor it is slowed by, for slowed nodes."""
    paused: frozenset[str] = frozenset()


def look(down: set[str], cut: Callable[[str, str], bool],
         link: Callable[[str, str], tuple[float, float, float]],
         slowdown: Callable[[str], float], paused: set[str]) -> Look:
    """A `Look` from probes of a target's state."""
    links = [(pair, tuple(round(c, 12) for c in link(*pair))) for pair in LINKS]
    slowed = [(node, round(slowdown(node), 12)) for node in NODES]
    return Look(frozenset(down), frozenset(pair for pair in LINKS if cut(*pair)),
                tuple((pair, c) for pair, c in links if any(c)),
                tuple((node, f) for node, f in slowed if f != 1.0), frozenset(paused))


class Harness(Protocol):
    target: FaultTarget

    def look(self) -> Look:
        """What the target realises now."""

    async def close(self) -> None:
        """End what the harness started."""


Call = tuple[float, str, tuple[Any, ...]]


class Recorder:
    """A `FaultTarget` that records every call (loop time, method, arguments; faults as their
    index in the list) and passes it on to `inner`."""

    def __init__(self, inner: FaultTarget, faults: Sequence[AnyFault]) -> None:
        self.inner = inner
        self.faults = faults
        self.calls: list[Call] = []

    def _record(self, method: str, *args: Any) -> None:
        def plain(arg: Any) -> Any:
            if isinstance(arg, (Partition, LinkFaults)):
                return next(i for i, f in enumerate(self.faults) if f is arg)
            return arg.fault if isinstance(arg, ScheduleEvent) else arg
        self.calls.append((asyncio.get_running_loop().time(), method,
                           tuple(plain(a) for a in args)))

    def crash(self, node: str, returning: bool) -> str | None:
        self._record("crash", node, returning)
        return self.inner.crash(node, returning)

    def restart(self, node: str) -> None:
        self._record("restart", node)
        self.inner.restart(node)

    def set_partitions(self, partitions: tuple[Partition, ...]) -> None:
        self._record("set_partitions", *partitions)
        self.inner.set_partitions(partitions)

    def set_link_rules(self, rules: tuple[LinkFaults, ...]) -> None:
        self._record("set_link_rules", *rules)
        self.inner.set_link_rules(rules)

    def slow(self, node: str, factor: float) -> str:
        self._record("slow", node, factor)
        return self.inner.slow(node, factor)

    def unslow(self, node: str, factor: float) -> str:
        self._record("unslow", node, factor)
        return self.inner.unslow(node, factor)

    def pause(self, node: str) -> str:
        self._record("pause", node)
        return self.inner.pause(node)

    def resume(self, node: str) -> None:
        self._record("resume", node)
        self.inner.resume(node)

    def fired(self, event: ScheduleEvent) -> None:
        self._record("fired", event)
        self.inner.fired(event)

    def ended(self, event: ScheduleEvent) -> None:
        self._record("ended", event)
        self.inner.ended(event)


@dataclass
class ModelTarget:
    """The reference target: it keeps exactly the state its calls describe."""

    running: set[str] = field(default_factory=lambda: set(NODES))
    partitions: tuple[Partition, ...] = ()
    rules: tuple[LinkFaults, ...] = ()
    factors: dict[str, list[float]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)

    def crash(self, node: str, returning: bool) -> str | None:
        if node not in self.running:
            return None
        self.running.discard(node)
        return ""

    def restart(self, node: str) -> None:
        self.running.add(node)

    def set_partitions(self, partitions: tuple[Partition, ...]) -> None:
        self.partitions = partitions

    def set_link_rules(self, rules: tuple[LinkFaults, ...]) -> None:
        self.rules = rules

    def slow(self, node: str, factor: float) -> str:
        self.factors.setdefault(node, []).append(factor)
        return ""

    def unslow(self, node: str, factor: float) -> str:
        self.factors[node].remove(factor)
        return ""

    def pause(self, node: str) -> str:
        self.paused.add(node)
        return ""

    def resume(self, node: str) -> None:
        self.paused.discard(node)

    def fired(self, event: ScheduleEvent) -> None:
        pass

    def ended(self, event: ScheduleEvent) -> None:
        pass


@dataclass
class ModelHarness:
    target: ModelTarget = field(default_factory=ModelTarget)

    def look(self) -> Look:
        t = self.target
        return look(set(NODES) - t.running,
                    lambda a, b: any(p.cuts(a, b) for p in t.partitions),
                    lambda a, b: chances([r for r in t.rules if r.matches(a, b)]),
                    lambda node: math.prod(t.factors.get(node, [])), t.paused)

    async def close(self) -> None:
        pass


# -- the cases ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    faults: str
    script: tuple[tuple[Any, ...], ...]
    """(time, "progress", trainer, done) | (time, "look") | (time, "close")"""
    calls: tuple[Call, ...]
    looks: dict[float, Look]
    events: tuple[tuple[int, str, float, float | None], ...]
    """(fault, what, start, end) of each event, in firing order."""


T0P0, T0P1, T1P0, T1P1 = LINKS
CASES: dict[str, Case] = {
    "a crash at a step restarts after its delay": Case(
        '[{at: "step 3", crash: "pserver:1", restart_after: 2s}]',
        ((0.5, "progress", 0, 2), (1.0, "progress", 1, 3), (1.5, "progress", 0, 4),
         (2.0, "look"), (3.5, "look")),
        ((1.0, "crash", ("pserver:1", True)), (1.0, "fired", (0,)),
         (3.0, "restart", ("pserver:1",)), (3.0, "ended", (0,))),
        {2.0: Look(down=frozenset({"pserver:1"})), 3.5: Look()},
        ((0, "crash pserver:1, restarted 2s later", 1.0, 3.0),)),
    "a partition cuts both groups' links and heals": Case(
        '[{at: 1s, partition: [["trainer:0"], ["pserver:*"]], heal_after: 500ms}]',
        ((1.25, "look"), (2.0, "look")),
        ((1.0, "set_partitions", (0,)), (1.0, "fired", (0,)),
         (1.5, "set_partitions", ()), (1.5, "ended", (0,))),
        {1.25: Look(cut=frozenset({T0P0, T0P1})), 2.0: Look()},
        ((0, "partition (trainer:0) from (pserver:*) for 0.5s", 1.0, 1.5),)),
    "link rules hold from the start and combine while they overlap": Case(
        '[{links: ["trainer:*", "pserver:*"], drop: 0.1}, '
        '{at: 1s, links: ["pserver:0", "trainer:0"], duplicate: 0.2, reorder: 0.5, for: 1s}]',
        ((0.5, "look"), (1.5, "look"), (2.5, "look")),
        ((0.0, "set_link_rules", (0,)), (0.0, "fired", (0,)),
         (1.0, "set_link_rules", (0, 1)), (1.0, "fired", (1,)),
         (2.0, "set_link_rules", (0,)), (2.0, "ended", (1,))),
        {0.5: Look(chances=tuple((pair, (0.1, 0.0, 0.0)) for pair in LINKS)),
         1.5: Look(chances=((T0P0, (0.1, 0.2, 0.5)),) +
                   tuple((pair, (0.1, 0.0, 0.0)) for pair in LINKS[1:])),
         2.5: Look(chances=tuple((pair, (0.1, 0.0, 0.0)) for pair in LINKS))},
        ((0, "links trainer:*<->pserver:*: drop 0.1", 0.0, None),
         (1, "links pserver:0<->trainer:0: duplicate 0.2, reorder 0.5", 1.0, 2.0))),
    "slowdowns of a pattern's nodes multiply while they overlap": Case(
        '[{at: "step 1", slow: "trainer:*", slowdown: 4, for: 1s}, '
        '{at: 1s, slow: "trainer:1", slowdown: 2, for: 1s}]',
        ((0.25, "progress", 1, 1), (0.5, "look"), (1.125, "look"), (1.5, "look"),
         (2.5, "look")),
        ((0.25, "slow", ("trainer:0", 4.0)), (0.25, "slow", ("trainer:1", 4.0)),
         (0.25, "fired", (0,)),
         (1.0, "slow", ("trainer:1", 2.0)), (1.0, "fired", (1,)),
         (1.25, "unslow", ("trainer:0", 4.0)), (1.25, "unslow", ("trainer:1", 4.0)),
         (1.25, "ended", (0,)),
         (2.0, "unslow", ("trainer:1", 2.0)), (2.0, "ended", (1,))),
        {0.5: Look(slow=(("trainer:0", 4.0), ("trainer:1", 4.0))),
         1.125: Look(slow=(("trainer:0", 4.0), ("trainer:1", 8.0))),
         1.5: Look(slow=(("trainer:1", 2.0),)), 2.5: Look()},
        ((0, "slow trainer:* x4 for 1s", 0.25, 1.25), (1, "slow trainer:1 x2 for 1s", 1.0, 2.0))),
    "a pause stops a pattern's nodes for its time": Case(
        '[{at: "step 2", pause: "pserver:*", for: 500ms}]',
        ((0.5, "progress", 1, 2), (0.75, "look"), (1.25, "look")),
        ((0.5, "pause", ("pserver:0",)), (0.5, "pause", ("pserver:1",)), (0.5, "fired", (0,)),
         (1.0, "resume", ("pserver:0",)), (1.0, "resume", ("pserver:1",)),
         (1.0, "ended", (0,))),
        {0.75: Look(paused=frozenset({"pserver:0", "pserver:1"})), 1.25: Look()},
        ((0, "pause pserver:* for 0.5s", 0.5, 1.0),)),
    "a crash of a node that is down does nothing": Case(
        '[{at: 1s, crash: "trainer:1"}, {at: 2s, crash: "trainer:1"}]',
        ((1.5, "look"), (2.5, "look")),
        ((1.0, "crash", ("trainer:1", False)), (1.0, "fired", (0,)),
         (2.0, "crash", ("trainer:1", False)), (2.0, "fired", (1,))),
        {1.5: Look(down=frozenset({"trainer:1"})), 2.5: Look(down=frozenset({"trainer:1"}))},
        ((0, "crash trainer:1", 1.0, None),
         (1, "crash trainer:1 (not running: nothing to crash)", 2.0, 2.0))),
    "the end of the run ends slowdowns, cuts and pauses, not crashes, and what is due": Case(
        '[{at: 1s, slow: "trainer:0", slowdown: 2}, '
        '{at: 1s, crash: "pserver:0", restart_after: 5s}, '
        '{at: 1s, partition: [["trainer:1"], ["pserver:1"]]}, {at: 10s, crash: "pserver:1"}, '
        '{at: 1s, pause: "trainer:1", for: 5s}]',
        ((1.5, "look"), (2.0, "close"), (2.5, "look"), (11.0, "look")),
        ((1.0, "slow", ("trainer:0", 2.0)), (1.0, "fired", (0,)),
         (1.0, "crash", ("pserver:0", True)), (1.0, "fired", (1,)),
         (1.0, "set_partitions", (2,)), (1.0, "fired", (2,)),
         (1.0, "pause", ("trainer:1",)), (1.0, "fired", (4,)),
         (2.0, "unslow", ("trainer:0", 2.0)), (2.0, "set_partitions", ()),
         (2.0, "resume", ("trainer:1",))),
        {1.5: Look(down=frozenset({"pserver:0"}), cut=frozenset({T1P1}),
                   slow=(("trainer:0", 2.0),), paused=frozenset({"trainer:1"})),
         2.5: Look(down=frozenset({"pserver:0"})), 11.0: Look(down=frozenset({"pserver:0"}))},
        ((0, "slow trainer:0 x2", 1.0, None),  # the crash lasted to the end: no restart came
         (1, "crash pserver:0, restarted 5s later", 1.0, None),
         (2, "partition (trainer:1) from (pserver:1)", 1.0, None),
         (4, "pause trainer:1 for 5s", 1.0, 6.0))),
}


@dataclass
class Played:
    calls: list[Call]
    looks: dict[float, Look]
    events: list[ScheduleEvent]


def play(case: Case, make: Callable[[], Harness]) -> Played:
    """Run `case`'s script on the virtual clock against the harness `make` builds."""
    async def main() -> Played:
        loop = asyncio.get_running_loop()
        harness = make()
        faults = faults_of(case.faults)
        recorder = Recorder(harness.target, faults)
        schedule = FaultSchedule(faults, recorder, NODES)
        schedule.start()
        looks: dict[float, Look] = {}
        for when, action, *args in case.script:
            await asyncio.sleep(when - loop.time())
            if action == "progress":
                schedule.on_progress(*args)
            elif action == "look":
                looks[when] = harness.look()
            else:
                schedule.close()
        await harness.close()
        return Played(recorder.calls, looks, schedule.events)
    return run(main(), max_time=60.0)


class FaultTargetContract:
    """The contract tests; a subclass provides the `harness` fixture."""

    @pytest.fixture
    def harness(self) -> Callable[[], Harness]:
        raise NotImplementedError

    @pytest.mark.parametrize("name", list(CASES))
    def test_the_schedule_calls_the_target_in_order_at_its_times(
            self, harness: Callable[[], Harness], name: str) -> None:
        case = CASES[name]
        played = play(case, harness)
        assert played.calls == list(case.calls)
        assert [(e.fault, e.what, e.start, e.end) for e in played.events] == list(case.events)

    @pytest.mark.parametrize("name", list(CASES))
    def test_the_target_realises_what_was_called(self, harness: Callable[[], Harness],
                                                 name: str) -> None:
        case = CASES[name]
        assert play(case, harness).looks == case.looks
