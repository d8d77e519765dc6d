"""Faults on real processes: `runtime up` replays every shipped fault scenario
(``scenarios/faults/*.yaml``), each meets its expect block, shows in its metrics that the fault
was injected, and ends as the simulator's run of the same scenario does (the same expectations
passing, or the same error): the simulator and the real runtime agree.

Also, without processes: how `runtime.faults.inject` combines link rules, fires faults at their
triggers with per-client partitions and rules on the proxies, kills and restarts nodes, pauses a
slowed node in a duty cycle, and what `runtime up` notes of faults it cannot inject as written.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.config import expect
from runtime.config.faults import REORDER_WAIT, LinkFaults
from runtime.config.metrics import JobMetrics, read_metrics
from runtime.config.scenario import Scenario, load_scenario, parse_scenario
from runtime.faults.inject import SLOW_PERIOD, RuntimeTarget, link_faults
from runtime.faults.proxy import Direction, FaultProxy, Faults
from runtime.faults.schedule import FaultSchedule
from runtime.launch.launcher import ignored_by_runtime
from runtime.services.checkpoint import MANIFEST

from sim.loop import run

from fault_contract import NODES, SCENARIO, FaultTargetContract, Harness, Look, faults_of, look
from fault_runs import CUT_TOO_LONG, FakeNodes, simulated
from runtime_runs import children_of, up

FAULTS = Path(__file__).resolve().parents[2] / "scenarios" / "faults"

CASES: dict[str, list[str]] = {
    "lossy": ["train.steps=20",  # and a delay too
              "faults=[{links: [trainer:*, pserver:*], drop: 0.05, duplicate: 0.05, "
              "reorder: 0.05, delay: 0.05, delay_by: 5ms}]",
              # a request per op: several in flight on a link, so that there is something to
              # reorder (bundled has one a step)
              "train.protocol=compact"],
    "partition": ["train.steps=30"],             # cut at step 20 for 1 s
    "pserver_restart": ["train.steps=120"],      # crash at 45; loss 0.55 at 120, bound 0.6
    "pserver_lost": [],
    "slow_node": ["train.steps=60"],             # slowed from step 20 for 2 s
    "pause": [],                                 # pserver 1 stopped at step 20 for 1 s
    # long enough that the restarted trainer finds the job still running on a busy machine:
    # at 1,500 steps of about 3 ms it had 1.5 s to start, and a loaded CI run's took longer
    "trainer_crash": ["train.steps=3000"],
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
    """The simulator's run of `path` with `overrides` (shared with tests/sim/test_sim_faults.py,
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
    rejoined, steps = metrics.trainers[1], len(metrics.trainers[0].losses)
    assert rejoined.exit_code == 0 and rejoined.first_step > 50
    assert len(rejoined.losses) == steps - rejoined.first_step
    assert all(1 in p.dropped for p in metrics.pservers)
    assert "[runtime up] restarting trainer:1 (--incarnation 1)" in \
        (out / "logs" / "trainer-1.log").read_text()


def pause(metrics: JobMetrics, out: Path) -> None:
    (event,) = metrics.faults
    assert event.end is not None and event.end - event.start == pytest.approx(1.0)
    assert reported_step(event.detail) >= 20 and event.detail.endswith("SIGSTOP")
    assert [(p.steps, p.errors, p.dropped) for p in metrics.pservers] == [(60, 0, [])] * 2


EVIDENCE: dict[str, Callable[[JobMetrics, Path], None]] = {
    "lossy": lossy, "partition": partition, "pserver_restart": pserver_restart,
    "pserver_lost": pserver_lost, "slow_node": slow_node, "trainer_crash": trainer_crash,
    "pause": pause}


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


def trainer_crash_up(out: Path, *settings: str) -> tuple[JobMetrics, str]:
    """`runtime up` of trainer_crash with `settings`, which must succeed and leave no process
    behind: its metrics and trainer 1's log."""
    args = [arg for setting in settings for arg in ("--set", setting)]
    code, lines = up(str(FAULTS / "trainer_crash.yaml"), "--out", str(out), *args)
    assert code == 0 and lines[-1].startswith("OK: trainer_crash"), "\n".join(lines)
    assert children_of(os.getpid()) == []
    return read_metrics(out / "metrics.json"), (out / "logs" / "trainer-1.log").read_text()


@pytest.mark.timeout(120)
def test_a_trainer_due_back_after_the_job_ended_is_not_restarted(tmp_path: Path) -> None:
    """trainer_crash cut to 60 steps: trainer 1 is killed at step 50 to come back 30 s later,
    but the others and the pservers (which drop it after 0.5 s of silence) end first; the run
    ends with them, as in the simulator, without starting it again. 30 s rather than the
    scenario's 2 s: on a busy machine the last 10 steps and the drop took longer than 2 s, and
    the trainer came back before the job ended."""
    metrics, log = trainer_crash_up(
        tmp_path, "train.steps=60", "expect={}",
        'faults=[{at: "step 50", crash: "trainer:1", restart_after: 30s}]')
    [crash] = metrics.faults
    assert crash.end is None and "the run ended at " in crash.detail
    assert [len(t.losses) for t in metrics.trainers][::2] == [60, 60]
    assert "restarting" not in log


@pytest.mark.timeout(120)
def test_a_trainer_dropped_and_cut_off_past_the_jobs_end_is_stopped(tmp_path: Path) -> None:
    """partition.yaml with trainer 0 cut off for 3 s at step 20 and dropped after 0.3 s: the
    pservers finish with trainer 1 and exit, and trainer 0, alive but with nobody left to
    train with, is stopped rather than left to time out; the run succeeds, as the
    simulator's does (tests/sim/test_sim_faults.py)."""
    args = [arg for setting in CUT_TOO_LONG for arg in ("--set", setting)]
    code, lines = up(str(FAULTS / "partition.yaml"), "--out", str(tmp_path), *args)
    assert code == 0 and lines[-1].startswith("OK: partition"), "\n".join(lines)
    assert children_of(os.getpid()) == []
    metrics = read_metrics(tmp_path / "metrics.json")
    assert [len(t.losses) for t in metrics.trainers][1] == 60
    assert 19 <= len(metrics.trainers[0].losses) <= 21  # where the cut found it
    assert all(p.dropped == [0] for p in metrics.pservers)
    log = (tmp_path / "logs" / "trainer-0.log").read_text()
    assert "stopping trainer:0: every pserver finished the job without it" in log


@pytest.mark.timeout(120)
def test_a_pause_of_every_process_of_the_job_drops_nobody(tmp_path: Path) -> None:
    """pause.yaml with every node stopped (SIGSTOP) for 1 s, three heartbeat timeouts, as a
    suspended machine stops them: each pserver's watchdog wakes late and counts none of it as
    the trainers' silence. The run ends bit for bit as without the pause, as in the simulator
    (tests/sim/test_sim_faults.py)."""
    code, lines = up(str(FAULTS / "pause.yaml"), "--out", str(tmp_path),
                     '--set=faults=[{at: "step 20", pause: "*", for: 1s}]')
    assert code == 0 and lines[-1].startswith("OK: pause"), "\n".join(lines)
    assert children_of(os.getpid()) == []
    metrics = read_metrics(tmp_path / "metrics.json")
    assert [(p.steps, p.errors, p.dropped) for p in metrics.pservers] == [(60, 0, [])] * 2
    [pause] = metrics.faults
    assert pause.end is not None and pause.end - pause.start == pytest.approx(1.0)
    assert all(e.passed for e in metrics.expectations)


@pytest.mark.timeout(120)
def test_a_trainer_restarted_as_the_job_ends_does_not_fail_it(tmp_path: Path) -> None:
    """trainer_crash in bundled async steps (about 1 ms each): the others finish their 1,500
    steps about as trainer 1 is due back, 2 s after its crash at step 50. Restarted while the
    pservers, which dropped it, are exiting, it would wait for their ports until its own
    deadline and fail the run; it is stopped instead, or not restarted at all, and the run
    ends with the others. Where it comes back in time (a slower machine, or a quick start) it
    rejoins and trains to the last step."""
    metrics, log = trainer_crash_up(tmp_path, "transpiler.mode=async", "train.protocol=bundled")
    assert [len(t.losses) for t in metrics.trainers][::2] == [1500, 1500]
    ended_without = ("every pserver finished the job while it was down" in log
                     or "after the job ended without it" in log)
    assert ended_without or "step 1500/1500" in log, log[-2000:]  # back in time: to the end


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


class RuntimeHarness:
    """runtime up's target over fake processes and two fault proxies that are never started."""

    def __init__(self, running: Sequence[str] = NODES) -> None:
        self.nodes = FakeNodes(set(running))
        self.proxies = {j: FaultProxy(upstream=f"127.0.0.1:{7000 + j}",
                                      upstream_name=f"pserver:{j}") for j in range(2)}
        self.said: list[str] = []
        self.target = RuntimeTarget(self.nodes, self.proxies, 2, self.said.append)

    def look(self) -> Look:
        def cut(trainer: str, pserver: str) -> bool:
            return self.proxies[int(pserver[-1])].partition_of(trainer) == "drop"

        def link(trainer: str, pserver: str) -> tuple[float, float, float]:
            proxy = self.proxies[int(pserver[-1])]
            up, down = (proxy.faults_for(trainer, d) for d in Direction)
            assert up == down and (up == Faults() or up.reorder_wait == REORDER_WAIT)
            return up.drop, up.duplicate, up.reorder

        return look(set(NODES) - self.nodes.running, cut, link, self.target.slowdown,
                    self.target.paused)

    async def close(self) -> None:
        await self.target.close()


class TestRuntimeTarget(FaultTargetContract):
    @pytest.fixture
    def harness(self) -> Callable[[], Harness]:
        return RuntimeHarness


Script = Callable[["RuntimeHarness", FaultSchedule], Awaitable[None]]


def played(faults: str, script: Script,
           running: Sequence[str] = NODES) -> tuple[RuntimeHarness, FaultSchedule]:
    """`faults` scheduled on a `RuntimeHarness` on the virtual clock while `script` runs; the
    schedule is closed after it."""
    async def main() -> tuple[RuntimeHarness, FaultSchedule]:
        harness = RuntimeHarness(running)
        schedule = FaultSchedule(faults_of(faults), harness.target, NODES)
        await script(harness, schedule)
        schedule.close()
        await harness.close()
        return harness, schedule
    return run(main(), max_time=60.0)


def test_a_partition_cuts_the_links_of_its_groups_and_heals() -> None:
    async def script(harness: RuntimeHarness, schedule: FaultSchedule) -> None:
        proxies = harness.proxies
        schedule.arm()  # the link rule without `at` holds from the start
        assert proxies[0].faults_for("trainer:1", Direction.UP) == link_faults(
            [LinkFaults(links=("trainer:1", "pserver:*"), drop=0.5)])
        assert proxies[0].faults_for("trainer:0", Direction.UP) == Faults()
        schedule.start()
        schedule.on_progress(1, 2)
        assert proxies[1].partition_of("trainer:0") is None
        schedule.on_progress(1, 4)
        schedule.on_progress(0, 5)  # fires once
        assert [e.fault for e in schedule.events] == [1, 0]
        assert schedule.events[1].detail == "trainer:1 reported step 4"
        assert [p.partition_of("trainer:0") for p in proxies.values()] == [None, "drop"]
        assert proxies[1].partition_of("trainer:1") is None
        await asyncio.sleep(0.05)
        assert [p.partition_of("trainer:0") for p in proxies.values()] == [None, None]

    harness, _ = played('[{at: "step 3", partition: [["trainer:0"], ["pserver:1"]], '
                        'heal_after: 50ms}, {links: ["trainer:1", "pserver:*"], drop: 0.5}]',
                        script)
    assert harness.said[-1] == ("fault 0 ended at 0.05s: partition (trainer:0) from (pserver:1) "
                                "for 0.05s")
    assert harness.nodes.calls == []


def test_crashes_kill_the_node_and_restart_it_when_due() -> None:
    async def script(harness: RuntimeHarness, schedule: FaultSchedule) -> None:
        schedule.start()
        schedule.on_progress(0, 1)  # trainer:0 is not running: nothing to crash
        await asyncio.sleep(3.0)

    harness, schedule = played('[{at: 0s, crash: "pserver:1", restart_after: 2s}, '
                               '{at: "step 1", crash: "trainer:0"}]', script,
                               running=["pserver:0", "pserver:1", "trainer:1"])
    assert harness.nodes.calls == [(0.0, "kill", "trainer:0"),
                                   (0.0, "kill, returning", "pserver:1"),
                                   (2.0, "restart", "pserver:1")]
    second, first = schedule.events
    assert second.what.endswith("(not running: nothing to crash)")
    assert second.end == second.start == 0.0
    assert first.detail == "at 0s; SIGKILL to process group 4242"
    assert (first.start, first.end) == (0.0, 2.0)
    assert harness.said[0] == ("fault 1 at 0.00s (trainer:0 reported step 1): crash trainer:0 "
                               "(not running: nothing to crash)")


def test_a_slowed_node_is_paused_in_a_duty_cycle_and_resumed_at_the_end() -> None:
    async def script(harness: RuntimeHarness, schedule: FaultSchedule) -> None:
        schedule.start()
        await asyncio.sleep(0.2)

    harness, schedule = played('[{at: 0s, slow: "trainer:1", slowdown: 4, for: 100ms}]', script)
    stop, go = SLOW_PERIOD * 0.75, SLOW_PERIOD * 0.25
    expected = []
    for k in range(5):  # paused 15 ms of every 20 ms, from 0 until 100 ms
        start = k * SLOW_PERIOD
        expected += [("SIGSTOP", start), ("SIGCONT", start + stop)]
    signals = [(sig, t) for t, sig, node in harness.nodes.calls if node == "trainer:1"]
    assert [s for s, _ in signals] == [s for s, _ in expected] + ["SIGCONT"]  # resumed at the end
    assert [t for _, t in signals[:-1]] == pytest.approx([t for _, t in expected])
    assert signals[-1][1] == pytest.approx(0.1) and go > 0
    (event,) = schedule.events
    assert event.detail == ("at 0s; paused 15.0ms of every 20ms (SIGSTOP/SIGCONT); "
                            "trainer:1 paused 5 times")


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
