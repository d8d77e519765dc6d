"""Fault scenarios as the tests of both sides run them: the simulator's run of a scenario (once
per test session, since a simulation is deterministic), and the launcher's side of the runtime's
fault target as processes that are only names."""

from __future__ import annotations

import asyncio
import functools
import signal
from dataclasses import dataclass, field
from pathlib import Path

from runtime.config.metrics import JobMetrics
from runtime.config.scenario import load_scenario
from sim.report import collect
from sim.simulate import SimResult, simulate


def sim(path: Path, *overrides: str) -> SimResult:
    return simulate(load_scenario(path, list(overrides)), base_dir=path.parent)


@functools.cache
def simulated(path: Path, *overrides: str) -> JobMetrics:
    """`collect(sim(path, *overrides))`, once per test session (a run that raises is not kept):
    tests/faults/test_runtime_faults.py compares each shipped fault scenario's real run with this
    simulated one, and tests/sim/test_sim_faults.py replays the same scenarios; a simulation is
    deterministic (test_two_runs_of_a_fault_scenario_give_identical_metrics_and_trace), so one
    run serves both. trainer_crash's 1500 steps take several seconds. Callers only read it."""
    return collect(sim(path, *overrides))


CUT_TOO_LONG = ("expect={}", "train.heartbeat_timeout=300ms",
                'faults=[{at: "step 20", partition: [["trainer:0"], ["pserver:*"]],'
                ' heal_after: 3s}]')
"""partition.yaml with trainer 0 cut off for 3 s and dropped after 0.3 s: the other trainer
and the pservers finish before it is heard from again (in tests/sim/test_sim_faults.py and
tests/faults/test_runtime_faults.py)."""


@dataclass
class FakeNodes:
    """The launcher's side of the target: processes that are only names, recording what was
    asked, with the loop's time."""

    running: set[str]
    calls: list[tuple[float, str, str]] = field(default_factory=list)

    def _record(self, what: str, node: str) -> None:
        self.calls.append((asyncio.get_running_loop().time(), what, node))

    def kill(self, node: str, returning: bool) -> int | None:
        self._record("kill, returning" if returning else "kill", node)
        if node not in self.running:
            return None
        self.running.discard(node)
        return 4242

    def restart(self, node: str) -> None:
        self._record("restart", node)
        self.running.add(node)

    def send_signal(self, node: str, sig: signal.Signals) -> bool:
        self._record(sig.name, node)
        return node in self.running
