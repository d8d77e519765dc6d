"""`benchmarks/fidelity.py`'s own pieces (no real runs): the scenarios it writes in a chosen
protocol, and its per-node CPU comparison."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from transpiler.distribute.rpc_plan import DEFAULT_PROTOCOL

from runtime.config.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str) -> ModuleType:
    """The module of benchmarks/NAME.py."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def fidelity() -> ModuleType:
    return benchmark("fidelity")


def test_a_configuration_is_written_in_the_protocol_asked_for_or_the_default() -> None:
    bench = fidelity()
    config = next(c for c in bench.CONFIGS if c.name == "1x1-small")
    assert "protocol" not in config.scenario(None)
    assert parse_scenario(config.scenario(None)).train.protocol == DEFAULT_PROTOCOL
    compact = parse_scenario(config.scenario(20, "compact"))
    assert (compact.train.protocol, compact.train.steps) == ("compact", 20)
    assert config.scenario(20, "compact").replace(", protocol: compact", "") == \
        config.scenario(20)


def test_the_cpu_lines_compare_a_measured_run_less_its_measuring_with_the_simulation() -> None:
    measured = {"nodes": {"trainer:0": {"main_seconds": 0.5, "cpu_seconds": 0.75,
                                        "measuring_seconds": 0.25},
                          "pserver:0": {"main_seconds": 0.25, "cpu_seconds": 0.5}}}
    simulated = {"trainer:0": 0.375, "trainer:0/io": 0.125, "pserver:0": 0.25}
    pserver, trainer = fidelity().cpu_lines(measured, simulated)
    assert trainer.split() == ["trainer:0", "main", "250.0", "ms", "real", "375.0", "sim",
                               "+50.0%", "process", "500.0", "real", "500.0", "sim", "+0.0%"]
    assert pserver.split()[:8] == ["pserver:0", "main", "250.0", "ms", "real", "250.0", "sim",
                                   "+0.0%"]


def test_samples_per_second_leaves_out_the_steps_that_wait_for_the_job_to_form() -> None:
    bench = fidelity()
    ssp = next(c for c in bench.TRANSFER if c.mode == "ssp")
    assert (ssp.warmup, bench.TRANSFER[0].warmup) == (3, 1)  # staleness 2: its first 3 steps
    held = [[0.5, 0.001, 0.2, 0.001, 0.001], [0.5, 0.001, 0.001, 0.001, 0.001]]
    # two trainers x 2 steps x 32 samples in the slower trainer's 2 ms
    assert bench.samples_per_second(held, 32, ssp.warmup) == 128 / 0.002
    assert bench.samples_per_second(held, 32) == 8 * 32 / 0.203  # the held step counts


def ranking() -> ModuleType:
    return benchmark("sweep_ranking")


def test_the_ranking_counts_a_pair_out_of_order_only_where_the_real_runs_do_not_overlap() -> None:
    bench = ranking()
    fast = bench.Point(1, 1, (1.0, 1.1, 1.2), simulated=2.0)
    overlapping = bench.Point(1, 2, (1.15, 1.3, 1.4), simulated=1.5)  # a tie for real
    slow = bench.Point(1, 3, (2.0, 2.1, 2.2), simulated=1.9)
    assert fast.tied(overlapping) and not fast.tied(slow)
    assert bench.out_of_order([fast, overlapping, slow]) == [(fast, slow)]
    # tau-a over the three pairs: (fast, overlapping) and (fast, slow) disagree
    assert bench.kendall_tau([fast, overlapping, slow]) == -1 / 3
    assert slow.error == 1.9 / 2.1 - 1


def test_the_ranking_scenario_is_valid_at_every_point() -> None:
    bench = ranking()
    for p in bench.PSERVERS:
        for t in bench.TRAINERS:
            text = bench.SCENARIO.format(steps=20).replace(
                "cluster: {pservers: 1, trainers: 1}", f"cluster: {{pservers: {p}, trainers: {t}}}")
            scenario = parse_scenario(text)
            assert (scenario.cluster.pservers, scenario.cluster.trainers) == (p, t)


def test_samples_per_second_leaves_out_each_trainers_first_step_on_both_sides() -> None:
    bench = fidelity()
    # trainer 0: 10 s to form the job, then 2 steps of 1 s; trainer 1: 3 steps of 1.5 s after
    assert bench.samples_per_second([[10.0, 1.0, 1.0], [0.5, 1.5, 1.5]], batch=4) == \
        4 * 4 / 3.0
    assert bench.samples_per_second([[1.0]], batch=4) == 0.0
