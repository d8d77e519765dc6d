"""The run record's figures count the time a job really took: a pserver restart's outage is in
the throughput and in the longest step (`sim run`), a trainer started long after another is
start-up, not a step (`runtime collect`, the records of several hosts); the record says which
pslab ran it, when, where, how and of which scenario; the plots say something in timing mode
and with many trainers; piped progress is a line per interval for all the trainers."""

from __future__ import annotations

import io
import json
import math
import socket
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from runtime.config.metrics import (JobMetrics, JobSummary, PserverMetrics, RunFacts,
                                    TrainerMetrics, read_metrics, scenario_sha256, write_record)
from runtime.config.scenario import load_scenario, parse_scenario
from runtime.config.version import version
from runtime.launch.collect import collect
from runtime.services.progress import Progress, ProgressSummary
from sim.report import collect as sim_collect
from sim.report import summary_table
from sim.simulate import simulate

from metrics_schema import assert_valid_metrics

ROOT = Path(__file__).resolve().parents[2]
RESTART = ROOT / "scenarios" / "faults" / "pserver_restart.yaml"
SMALL = """\
name: skewed
seed: 3
model: {name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}
data: {batch_size: 16}
cluster: {pservers: 1, trainers: 2}
transpiler: {mode: sync}
train: {steps: 20}
"""


# -- a pserver restart (sim run) ----------------------------------------------------------------

@pytest.fixture(scope="module")
def restart() -> JobMetrics:
    return sim_collect(simulate(load_scenario(RESTART), base_dir=RESTART.parent))


def test_the_throughput_of_a_run_with_a_pserver_restart_is_samples_over_its_elapsed_time(
        restart: JobMetrics) -> None:
    job, trainers = restart.job, restart.trainers
    assert job.train_seconds == max(sum(t.step_times[1:]) for t in trainers)
    elapsed = max(t.step_ends[-1] - t.step_ends[0] for t in trainers if t.step_ends)
    assert job.train_seconds == pytest.approx(elapsed, rel=1e-12)  # from the first step's end
    assert job.trained_samples == sum(len(t.step_times) - 1 - t.steps_redone
                                      for t in trainers) * 32 == 149 * 2 * 32
    assert [t.steps_redone for t in trainers] == [5, 5]
    assert job.samples_per_second == job.trained_samples / job.train_seconds
    outage = restart.faults[0].end - restart.faults[0].start  # type: ignore[operator]
    assert outage == pytest.approx(1.0)
    assert job.samples_per_second < job.trained_samples / outage  # not the 225,879 of before
    assert job.step_samples_per_second is not None
    assert job.step_samples_per_second > 20 * job.samples_per_second  # the per-step view


def test_the_step_that_spans_a_pserver_restart_lasts_the_outage(restart: JobMetrics) -> None:
    fault = restart.faults[0]
    assert fault.end is not None
    for t in restart.trainers:
        assert t.step_ends is not None and t.step_time is not None
        longest = max(range(len(t.step_times)), key=t.step_times.__getitem__)
        end = t.step_ends[longest]
        begin = end - t.step_times[longest]
        assert begin <= fault.start + 1e-3 and end >= fault.end  # from the crash to after it
        assert t.step_time.max == t.step_times[longest] >= 1.0
    assert restart.job.step_time_all is not None and restart.job.step_time_all.max >= 1.0
    assert restart.job.step_time_all.p50 < 1e-3  # the typical step, as before


def test_the_summary_shows_both_rates_and_the_longest_step(restart: JobMetrics) -> None:
    out = io.StringIO()
    Console(file=out, width=160).print(summary_table(restart))
    text = out.getvalue()
    assert f"{restart.job.samples_per_second:,.0f} ({restart.job.trained_samples:,} trained" in text
    assert f"{restart.job.step_samples_per_second:,.0f}" in text
    assert "samples/s at the median step" in text and "max 1.00" in text


# -- a skewed start (runtime collect) -----------------------------------------------------------

def write_node(out: Path, node: str, scenario: dict[str, Any], facts: RunFacts,
               record: Any) -> None:
    """What a node running on its own leaves in its output folder: its job description (with
    its `RunFacts`) and its record."""
    role, _, index = node.partition(":")
    (out / "nodes").mkdir(parents=True)
    job = {"node": node, "scenario": scenario, "endpoints": ["127.0.0.1:6170"],
           "run": asdict(facts)}
    (out / "nodes" / f"{role}-{index}.job.json").write_text(json.dumps(job))
    write_record(out / "nodes" / f"{role}-{index}.json", record)


def test_a_trainer_started_48s_late_is_start_up_not_a_step(tmp_path: Path) -> None:
    scenario = parse_scenario(SMALL)
    described = scenario.model_dump(mode="json", exclude_unset=True)
    first = [47.688] + [0.01] * 19  # waits for trainer 1, started 48 s after it
    second = [0.012] + [0.01] * 19
    records = {"pserver:0": PserverMetrics(0, "127.0.0.1:6170", steps=20),
               "trainer:0": TrainerMetrics.from_steps(0, [1.0] * 20, first),
               "trainer:1": TrainerMetrics.from_steps(1, [1.0] * 20, second)}
    starts = {"pserver:0": "2025-03-01T10:00:00Z", "trainer:0": "2025-03-01T10:00:01Z",
              "trainer:1": "2025-03-01T10:00:49Z"}
    hosts = {"pserver:0": "ps-host", "trainer:0": "t-host", "trainer:1": "t-host"}
    dirs = []
    for node, record in records.items():
        dirs.append(tmp_path / node.replace(":", "-"))
        write_node(dirs[-1], node, described, RunFacts("0", starts[node], [hosts[node]],
                                                       ["runtime", "up"], "x"), record)
    stream = io.StringIO()
    assert collect(dirs, tmp_path, stream) == 0, stream.getvalue()
    assert_valid_metrics(tmp_path / "metrics.json")
    job = read_metrics(tmp_path / "metrics.json").job
    assert job.startup_wait_seconds == 47.688
    assert job.step_time is not None and job.step_time_all is not None
    assert job.step_time.mean == pytest.approx(0.01) and job.step_time.max == 0.01
    assert job.step_time_all.max == 0.01
    assert job.train_seconds is not None and job.train_seconds == pytest.approx(19 * 0.01)
    assert job.trained_samples == 2 * 19 * 16
    assert job.samples_per_second == job.trained_samples / job.train_seconds
    assert job.samples_per_second == pytest.approx(3200)  # 2 trainers x 16 per 10 ms
    assert job.step_samples_per_second == pytest.approx(3200)
    assert job.run is not None
    assert job.run.started_utc == "2025-03-01T10:00:00Z"  # the earliest node's start
    assert job.run.hosts == ["ps-host", "t-host"]
    assert job.run.scenario_sha256 == scenario_sha256(scenario)


def test_a_single_step_is_training_not_start_up() -> None:
    record = TrainerMetrics.from_steps(0, [1.0], [0.5])
    assert record.startup_wait_seconds is None and record.step_time is not None
    job = JobSummary.for_run("runtime up", parse_scenario(SMALL), [], [record])
    assert job.train_seconds == 0.5 and job.trained_samples == 16
    assert job.startup_wait_seconds is None


# -- the run's facts ----------------------------------------------------------------------------

def test_the_record_says_which_pslab_ran_it_when_where_how_and_of_what(
        restart: JobMetrics) -> None:
    facts = restart.job.run
    assert facts is not None and facts.pslab_version == version()
    assert facts.hosts == [socket.gethostname()] and facts.command_line
    started = datetime.strptime(facts.started_utc, "%Y-%m-%dT%H:%M:%SZ")
    assert started.replace(tzinfo=timezone.utc) <= datetime.now(timezone.utc)
    assert facts.scenario_sha256 == scenario_sha256(load_scenario(RESTART))
    other = load_scenario(RESTART, ["train.steps=151"])
    assert scenario_sha256(other) != facts.scenario_sha256
    assert len(facts.scenario_sha256) == 64


# -- plots --------------------------------------------------------------------------------------

def record_of(trainers: int, losses: float, steps: int = 6) -> JobMetrics:
    """A run of `trainers` whose steps' losses are all `losses` (NaN: timing mode)."""
    scenario = parse_scenario(SMALL)
    records = [TrainerMetrics.from_steps(i, [losses] * steps,
                                         [0.001 * (1 + i % 5 + k) for k in range(steps)])
               for i in range(trainers)]
    for t in records:
        t.step_ends = list(range(1, steps + 1))
    return JobMetrics(JobSummary.for_run("sim run", scenario, [], records), records, [])


def test_a_run_in_timing_mode_has_a_loss_plot_that_says_so() -> None:
    pytest.importorskip("matplotlib")
    from sim.report import loss_figure

    (axes,) = loss_figure(record_of(2, math.nan)).axes
    assert [t.get_text() for t in axes.texts] == ["no loss recorded (timing mode)"]
    assert not axes.lines
    (axes,) = loss_figure(record_of(2, 1.0)).axes
    assert len(axes.lines) == 2 and not axes.texts


def test_many_trainers_plot_a_median_and_a_percentile_band_few_a_line_each() -> None:
    pytest.importorskip("matplotlib")
    from sim.report import step_figure

    (axes,) = step_figure(record_of(100, 1.0)).axes
    assert len(axes.lines) == 1 and len(axes.collections) == 1
    legend = axes.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [
        "10th to 90th percentile of 100 trainers", "median of 100 trainers"]
    assert list(axes.lines[0].get_ydata()) == pytest.approx([3.0 + k for k in range(6)])
    (axes,) = step_figure(record_of(3, 1.0)).axes
    assert len(axes.lines) == 3 and not axes.collections


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sim.report import write_plots

    paths = write_plots(record_of(20, math.nan), tmp_path)
    assert [p.name for p in paths] == ["loss.png", "step_times.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)


# -- piped progress -----------------------------------------------------------------------------

def test_piped_progress_is_a_line_per_tenth_for_all_trainers_with_an_estimate() -> None:
    clock = [0.0]
    summary = ProgressSummary(100, 1000, every=1e9, clock=lambda: clock[0])
    lines = []
    for step in range(1, 1001):
        for trainer in range(100):
            clock[0] += 0.001
            line = summary.update(trainer, Progress(step, 1000, 0.5, 0.002 + trainer * 1e-5))
            if line is not None:
                lines.append(line)
    assert len(lines) == 11  # the first step, then every tenth
    assert lines[0].startswith("steps 1/100,000 (0%), 100 trainer(s) at step 0 to 1 of 1000")
    assert lines[5] == ("steps 50,000/100,000 (50%), 100 trainer(s) at step 500 to 500 of 1000: "
                        "step time min 2.0ms median 2.5ms, loss median 0.5000, ETA 50s")
    assert lines[-1].endswith("done")


def test_piped_progress_shows_a_line_every_interval_between_tenths() -> None:
    clock = [0.0]
    summary = ProgressSummary(2, 1000, every=10.0, clock=lambda: clock[0])
    shown = []
    for step in range(1, 40):
        clock[0] += 1.0
        shown.append(summary.update(0, Progress(step, 1000, math.nan, 1.0)) is not None)
    assert [i + 1 for i, s in enumerate(shown) if s] == [1, 11, 21, 31]
    line = summary.line(clock[0])
    assert "loss" not in line and "trainer(s) at step 0 to 39 of 1000" in line
