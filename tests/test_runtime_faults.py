"""Faults on real processes: `runtime up` replays every shipped fault scenario
(``scenarios/faults/*.yaml``), each meets its expect block, shows in its metrics that the fault
was injected, and ends as the simulator's run of the same scenario does (the same expectations
passing, or the same error): the simulator and the real runtime agree.

Also, without processes: how `runtime.inject` combines link rules, fires faults at their
triggers with per-client partitions and rules on the proxies, kills and restarts nodes, pauses a
slowed node in a duty cycle, and what `runtime up` notes of faults it cannot inject as written.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runtime import expect
from runtime.checkpoint import MANIFEST
from runtime.faultproxy import Direction, FaultProxy, Faults
from runtime.faults import LinkFaults
from runtime.inject import SLOW_PERIOD, Injector, link_faults
from runtime.launch import ignored_by_runtime
from runtime.metrics import JobMetrics, read_metrics
from runtime.scenario import Scenario, load_scenario, parse_scenario

from test_runtime_up import children_of, up
from test_sim_faults import simulated

FAULTS = Path(__file__).resolve().parents[1] / "scenarios" / "faults"

CASES: dict[str, list[str]] = {
    "lossy": ["train.steps=20",  # and a delay too
              "faults=[{links: [trainer:*, pserver:*], drop: 0.05, duplicate: 0.05, "
              "reorder: 0.05, delay: 0.05, delay_by: 5ms}]"],
    "partition": ["train.steps=30"],             # cut at step 20 for 1 s
    "pserver_restart": ["train.steps=120"],      # crash at 45; loss 0.55 at 120, bound 0.6
    "pserver_lost": [],
    "slow_node": ["train.steps=60",              # slowed from step 20 for 2 s
                  "train.retry_after=100ms"],    # drain 0.3 s, not 3 s, as the others
    "trainer_crash": [],  # its length lets the restarted trainer find the job still running
}
"""Each shipped fault scenario and the overrides that shorten it without losing its point."""


# -- outcomes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """How a run ended: the expectations checked and whether each passed; or the type of the
    error that ended it and whether its text has the scenario's ``expect.error``. Not the rest
    of the text: which trainer notices a lost pserver first, and so which pserver its timeout
    names (the dead one, or a live one still holding its request for the next step), is a race
    between real processes."""

    expectations: frozenset[tuple[str, bool]] = frozenset()
    error: str | None = None
    as_expected: bool | None = None


def sim_outcome(path: Path, overrides: list[str]) -> Outcome:
    """The simulator's run of `path` with `overrides` (shared with tests/test_sim_faults.py,
    which replays the same scenarios: see `simulated`)."""
    scenario = load_scenario(path, overrides)
    try:
        metrics = simulated(path, *overrides)
    except Exception as exc:
        verdict = expect.outcome(scenario, exc)
        return Outcome(error=type(exc).__name__, as_expected=verdict and verdict.passed)
    return Outcome(frozenset((e.name, e.passed) for e in metrics.expectations))


def real_outcome(scenario: Scenario, metrics: JobMetrics) -> Outcome:
    """From `runtime up`'s metrics: a node's failure is ``<node> exited with status N:
    <ErrorType>: <message>``."""
    reason = metrics.job.reason
    if reason is None:
        return Outcome(frozenset((e.name, e.passed) for e in metrics.expectations))
    found = re.search(r"exited with status \d+: (\w+): ", reason)
    assert found is not None, reason
    (verdict,) = [e for e in metrics.expectations if e.name == "error"]
    return Outcome(error=found[1], as_expected=verdict.passed)


# -- what each scenario's metrics must show ----------------------------------------------------

def proxy_totals(metrics: JobMetrics, client: str | None = None) -> dict[str, int]:
    totals: dict[str, int] = {}
    for proxy in metrics.proxies:
        for name, directions in proxy.links.items():
            if client is None or name == client:
                for counters in directions.values():
                    for key, value in counters.items():
                        totals[key] = totals.get(key, 0) + value
    return totals


def reported_step(detail: str) -> int:
    found = re.search(r"trainer:\d+ reported step (\d+)", detail)
    assert found is not None, detail
    return int(found[1])


def lossy(metrics: JobMetrics, out: Path) -> None:
    totals = proxy_totals(metrics)
    assert all(totals[fault] > 0 for fault in ("dropped", "duplicated", "reordered", "delayed"))
    assert set(metrics.proxies[0].links) == {"trainer:0", "trainer:1"}
    assert [(p.steps, p.errors) for p in metrics.pservers] == [(20, 0)] * 2


def partition(metrics: JobMetrics, out: Path) -> None:
    (event,) = metrics.faults
    assert event.end is not None and event.end - event.start == pytest.approx(1.0)
    assert reported_step(event.detail) >= 20
    assert proxy_totals(metrics, "trainer:0")["cut"] > 0
    assert proxy_totals(metrics, "trainer:1")["cut"] == 0
    assert [p.dropped for p in metrics.pservers] == [[], []]  # it stayed in the fan-in


def pserver_restart(metrics: JobMetrics, out: Path) -> None:
    (event,) = metrics.faults
    assert event.kind == "crash" and event.end == pytest.approx(event.start + 1.0)
    assert reported_step(event.detail) >= 45
    assert all(1 <= t.steps_redone <= 10 for t in metrics.trainers)
    restarted = metrics.pservers[1]
    assert restarted.exit_code == 0 and restarted.steps < 120  # from its checkpoint on
    log = (out / "logs" / "pserver-1.log").read_text()
    assert "[runtime up] restarting pserver:1 (--recover)" in log
    assert (out / "checkpoints" / "pserver:1" / MANIFEST).exists()


def pserver_lost(metrics: JobMetrics, out: Path) -> None:
    assert metrics.pservers[1].exit_code == -signal.SIGKILL
    assert metrics.job.failed_node in ("trainer:0", "trainer:1")
    assert metrics.expectations[0].name == "error" and metrics.expectations[0].passed


def slow_node(metrics: JobMetrics, out: Path) -> None:
    (event,) = metrics.faults
    assert event.end is not None and event.end - event.start == pytest.approx(2.0)
    pauses = int(re.search(r"trainer:1 paused (\d+) times", event.detail)[1])  # type: ignore
    assert pauses >= 0.5 * 2.0 / SLOW_PERIOD
    assert [(p.steps, p.errors, p.dropped) for p in metrics.pservers] == [(60, 0, [])] * 2


def trainer_crash(metrics: JobMetrics, out: Path) -> None:
    (event,) = metrics.faults
    assert event.end == pytest.approx(event.start + 2.0)
    rejoined = metrics.trainers[1]
    assert rejoined.exit_code == 0 and rejoined.first_step > 50
    assert len(rejoined.losses) == 1500 - rejoined.first_step
    assert all(1 in p.dropped for p in metrics.pservers)
    assert "[runtime up] restarting trainer:1 (--incarnation 1)" in \
        (out / "logs" / "trainer-1.log").read_text()


EVIDENCE: dict[str, Callable[[JobMetrics, Path], None]] = {
    "lossy": lossy, "partition": partition, "pserver_restart": pserver_restart,
    "pserver_lost": pserver_lost, "slow_node": slow_node, "trainer_crash": trainer_crash}


def test_every_shipped_fault_scenario_is_replayed() -> None:
    assert set(CASES) == set(EVIDENCE) == {p.stem for p in FAULTS.glob("*.yaml")}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(CASES))
def test_a_fault_scenario_on_real_processes_ends_as_in_the_simulator(name: str,
                                                                     tmp_path: Path) -> None:
    path, overrides = FAULTS / f"{name}.yaml", CASES[name]
    scenario = load_scenario(path, overrides)
    code, lines = up(str(path), "--out", str(tmp_path), *(f"--set={o}" for o in overrides))
    assert code == 0, "\n".join(lines)
    assert lines[-1].startswith(f"OK: {name}")
    assert children_of(os.getpid()) == []
    metrics = read_metrics(tmp_path / "metrics.json")
    assert metrics.job.success and all(e.passed for e in metrics.expectations)
    assert [f.fault for f in metrics.faults] == list(range(len(scenario.faults)))
    assert not any("not injected" in note for note in metrics.notes)
    EVIDENCE[name](metrics, tmp_path)
    assert real_outcome(scenario, metrics) == sim_outcome(path, overrides)


# -- the injector without processes --------------------------------------------------------------

def test_link_rules_combine_as_independent_chances_and_added_delays() -> None:
    a = LinkFaults(links=("trainer:*", "pserver:*"), drop=0.5, delay=0.5, delay_by=0.01)
    b = LinkFaults(links=("trainer:0", "pserver:1"), drop=0.5, duplicate=0.2, delay=1 - 1e-9,
                   delay_by=0.03)
    faults = link_faults([a, b])
    assert (faults.drop, faults.duplicate, faults.reorder) == (0.75, pytest.approx(0.2), 0.0)
    assert callable(faults.latency)
    delays = {round(faults.latency(random.Random(seed)), 9) for seed in range(50)}
    assert delays == {0.03, 0.04}  # b's delay always, a's half of the time
    assert link_faults([]).latency == 0.0


@dataclass
class FakeNodes:
    """The launcher's side of the injector, recording what was asked."""

    running: set[str]
    calls: list[tuple[str, str]] = field(default_factory=list)

    def kill(self, node: str) -> int | None:
        self.calls.append(("kill", node))
        if node not in self.running:
            return None
        self.running.discard(node)
        return 4242

    def restart_after(self, node: str, delay: float) -> None:
        self.calls.append((f"restart after {delay:g}s", node))

    def send_signal(self, node: str, sig: signal.Signals) -> bool:
        self.calls.append((sig.name, node))
        return node in self.running


SCENARIO = """\
name: inject
model: {{name: mlp}}
cluster: {{pservers: 2, trainers: 2}}
faults: {faults}
"""


def injector_for(faults: str, nodes: FakeNodes,
                 wake_on: str = " ended ") -> tuple[Injector, list[str], asyncio.Event]:
    """An injector of `faults` over two proxies; what it says, and an event set when it says
    something containing `wake_on`."""
    scenario = parse_scenario(SCENARIO.format(faults=faults))
    said: list[str] = []
    woken = asyncio.Event()

    def say(text: str) -> None:
        said.append(text)
        if wake_on in text:
            woken.set()

    proxies = {j: FaultProxy(upstream=f"127.0.0.1:{7000 + j}") for j in range(2)}
    names = ["pserver:0", "pserver:1", "trainer:0", "trainer:1"]
    return Injector(scenario.faults, nodes, proxies, names, 2, say), said, woken


@pytest.mark.timeout(10)
async def test_a_partition_cuts_the_links_of_its_groups_and_heals() -> None:
    nodes = FakeNodes(set())
    injector, said, ended = injector_for(
        '[{at: "step 3", partition: [["trainer:0"], ["pserver:1"]], heal_after: 50ms}, '
        '{links: ["trainer:1", "pserver:*"], drop: 0.5}]', nodes)
    proxies = injector.proxies
    injector.arm()  # the link rule without `at` holds from the start
    assert proxies[0].faults_for("trainer:1", Direction.UP) == link_faults(
        [LinkFaults(links=("trainer:1", "pserver:*"), drop=0.5)])
    assert proxies[0].faults_for("trainer:0", Direction.UP) == Faults()
    injector.start()
    injector.on_progress(1, 2)
    assert proxies[1].partition_of("trainer:0") is None
    injector.on_progress(1, 4)
    injector.on_progress(0, 5)  # fires once
    assert [e.fault for e in injector.events] == [1, 0]
    assert injector.events[1].detail == "trainer:1 reported step 4"
    assert [p.partition_of("trainer:0") for p in proxies.values()] == [None, "drop"]
    assert proxies[1].partition_of("trainer:1") is None
    await asyncio.wait_for(ended.wait(), 5)
    assert [p.partition_of("trainer:0") for p in proxies.values()] == [None, None]
    assert said[-1].startswith("fault 0 ended at")
    await injector.close()
    assert nodes.calls == []


@pytest.mark.timeout(10)
async def test_crashes_kill_the_node_and_ask_for_its_restart() -> None:
    nodes = FakeNodes({"pserver:1"})
    injector, said, fired = injector_for(
        '[{at: 0s, crash: "pserver:1", restart_after: 2s}, {at: "step 1", crash: "trainer:0"}]',
        nodes, wake_on="fault 0 at")
    injector.start()
    injector.on_progress(0, 1)  # trainer:0 is not running: nothing to crash
    await asyncio.wait_for(fired.wait(), 5)
    assert nodes.calls == [("kill", "trainer:0"), ("kill", "pserver:1"),
                           ("restart after 2s", "pserver:1")]
    second, first = injector.events
    assert "not running: nothing to crash" in second.detail and second.end == second.start
    assert "SIGKILL to process group 4242" in first.detail
    assert first.end == pytest.approx(first.start + 2.0, abs=0.01)
    await injector.close()


@pytest.mark.timeout(10)
async def test_a_slowed_node_is_paused_in_a_duty_cycle_and_resumed_at_the_end() -> None:
    nodes = FakeNodes({"trainer:1"})
    injector, said, fired = injector_for('[{at: 0s, slow: "trainer:1", slowdown: 4, '
                                         'for: 100ms}]', nodes, wake_on="fault 0 at")
    injector.start()
    await asyncio.wait_for(fired.wait(), 5)
    (task,) = injector._slowed
    await asyncio.wait_for(task, 5)
    signals = [sig for sig, node in nodes.calls if node == "trainer:1"]
    pauses = signals.count("SIGSTOP")
    assert signals == ["SIGSTOP", "SIGCONT"] * pauses + ["SIGCONT"]  # resumed at the end
    assert 2 <= pauses <= 0.1 / SLOW_PERIOD + 1
    (event,) = injector.events
    assert "paused 15.0ms of every 20ms" in event.detail
    assert event.detail.endswith(f"trainer:1 paused {pauses} times")
    await injector.close()


def test_runtime_up_notes_what_it_injects_otherwise_than_the_simulator() -> None:
    scenario = parse_scenario(SCENARIO.format(faults=(
        '[{links: ["trainer:0", "trainer:1"], drop: 0.1}, '
        '{at: 1s, partition: [["pserver:0"], ["pserver:1"]]}, '
        '{at: 1s, slow: "pserver:0", slowdown: 2}]')))
    assert ignored_by_runtime(scenario) == [
        "faults[0]: acts on no trainer-pserver connection, the only ones a real run has: "
        "nothing injected",
        "faults[1]: acts on no trainer-pserver connection, the only ones a real run has: "
        "nothing injected",
        "faults[2]: slow pserver:0 x2: the process is paused 50% of every 20ms "
        "(SIGSTOP/SIGCONT), its compute not made slower"]
