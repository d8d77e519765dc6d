"""What a pipe gets of a run's progress: every trainer's lines for a few trainers, and the
summary lines with the time left (`ProgressSummary`) for all; one line per interval, not per
trainer, for many."""

from __future__ import annotations

import io
import math
from pathlib import Path

from runtime.launch.launcher import NodeRun, PlainDisplay
from runtime.services.progress import PER_TRAINER, Progress, ProgressSummary
from sim.cli import PlainProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_pipe_gets_one_summary_line_per_tenth_for_a_hundred_trainers(tmp_path: Path) -> None:
    clock = Clock()
    out = io.StringIO()
    display = PlainDisplay(out, every=10, summary=ProgressSummary(100, 100, clock=clock))
    nodes = [NodeRun("trainer", i, (tmp_path / f"{i}.log").open("w")) for i in range(100)]
    for step in range(1, 101):
        clock.now += 0.01
        for node in nodes:
            node.seen.append(Progress(step, 100, 0.5, 0.002))
            display.progress(node)
    lines = out.getvalue().splitlines()
    assert len(lines) == 11 and all(line.startswith("steps ") for line in lines)
    assert lines[-1].endswith("done") and "ETA" in lines[1]
    for node in nodes:
        node.log.close()


def test_a_pipe_gets_each_trainers_lines_and_the_summary_for_a_few(tmp_path: Path) -> None:
    out = io.StringIO()
    display = PlainDisplay(out, every=5, summary=ProgressSummary(2, 10, clock=Clock()))
    nodes = [NodeRun("trainer", i, (tmp_path / f"{i}.log").open("w")) for i in range(2)]
    for step in range(1, 11):
        for node in nodes:
            node.seen.append(Progress(step, 10, 0.5, 0.002))
            display.progress(node)
    lines = out.getvalue().splitlines()
    assert [line for line in lines if "step 10/10" in line] == [
        "trainer:0    step 10/10  loss 0.5000  step time 2.0ms",
        "trainer:1    step 10/10  loss 0.5000  step time 2.0ms"]
    assert sum(line.startswith("steps ") for line in lines) == 11
    for node in nodes:
        node.log.close()


def test_sim_runs_progress_on_a_pipe_is_summarised_beyond_a_few_trainers() -> None:
    out = io.StringIO()
    progress = PlainProgress(out, steps=50, every=10, trainers=PER_TRAINER + 1)
    for step in range(50):
        for trainer in range(PER_TRAINER + 1):
            progress.step(trainer, step, 0.5, 0.001, step * 0.001)
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("steps ") for line in lines)
    assert len(lines) <= 11


def test_a_progress_line_carries_every_field_and_a_missing_loss_as_null() -> None:
    every = Progress(step=7, steps=100, loss=1.25, step_time=0.002, first_step=3, redone=2)
    assert Progress.from_line(every.to_line()) == every
    line = Progress(step=1, steps=2, loss=float("nan"), step_time=0.5).to_line()
    assert b'"loss": null' in line and line.endswith(b"\n")
    back = Progress.from_line(line)
    assert math.isnan(back.loss) and (back.step, back.steps, back.step_time) == (1, 2, 0.5)
