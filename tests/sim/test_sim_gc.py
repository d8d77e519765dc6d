"""`simulate` runs with the cyclic garbage collector off (what the job was built from frozen
out of its sight) and leaves it as it found it; the results do not depend on it. `sim run`
keeps it off while it reports on the run (`cyclic_gc_paused`)."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import sim.cli
from runtime.config.metrics import JobMetrics
from runtime.config.scenario import parse_scenario
from sim.loop import SimTimeLimit
from sim.simulate import cyclic_gc_paused, simulate

SMALL = """
name: gc_check
seed: 3
model: {name: linear, optimizer: {type: sgd, learning_rate: 0.01}}
data: {batch_size: 8}
cluster: {pservers: 2, trainers: 2}
transpiler: {mode: async}
train: {steps: 3}
network: {default: {latency: {dist: lognormal, median: 50us, sigma: 0.2}, bandwidth: 1Gbps}}
compute: {model: roofline, device: {flops: 1.0e9, mem_bandwidth: 1GB/s, op_overhead: 5us}}
"""


def run_and_watch() -> tuple[list[bool], list[float]]:
    """Whether the collector was on at each step of the run, and the step times."""
    during: list[bool] = []
    result = simulate(parse_scenario(SMALL),
                      on_step=lambda *_: during.append(gc.isenabled()))
    return during, [t for trainer in result.trainers for t in trainer.step_times]


def test_the_collector_is_off_during_the_run_and_back_on_after() -> None:
    assert gc.isenabled()
    during, _ = run_and_watch()
    assert during and not any(during)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        run_and_watch()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_the_collector_is_restored_when_the_run_fails() -> None:
    with pytest.raises(SimTimeLimit):
        simulate(parse_scenario(SMALL, overrides=["train.deadline=1us"]))
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_steps_do_not_depend_on_the_collector() -> None:
    _, first = run_and_watch()
    gc.collect()
    _, second = run_and_watch()
    assert first == second and len(first) == 6


def test_sim_run_reports_with_the_collector_off(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    collect = sim.cli.collect

    def watched(result: object) -> JobMetrics:
        seen.append(gc.isenabled())
        return collect(result)  # type: ignore[arg-type]

    monkeypatch.setattr(sim.cli, "collect", watched)
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    assert sim.cli.main(["run", str(scenario), "--out", str(tmp_path / "out"),
                         "--no-plots"]) == 0
    assert seen == [False]
    assert gc.isenabled() and (tmp_path / "out" / "metrics.json").exists()


def test_a_paused_collector_comes_back_after_an_error() -> None:
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        assert not gc.isenabled()
        raise RuntimeError("report failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
