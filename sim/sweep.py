"""`sim sweep`: one scenario simulated at every combination of a few settings.

``--vary cluster.pservers=1,2,4,8 --vary cluster.trainers=4,8`` simulates the cartesian product
of the values (8 runs here), each as ``--set cluster.pservers=2 --set cluster.trainers=8`` on
top of the scenario and the sweep's own ``--set``s, and records per point the simulated step
time, throughput, final loss, the bytes each pserver took in, how long the loss took to reach
a target and whether the scenario's expectations held. A point that cannot
run (an invalid combination, a deadlock) is recorded with its error and the sweep goes on.

``OUT/sweep.json`` is `dataclasses.asdict` of a `SweepRecord`:

    {"schema": 2, "scenario", "vary": {path: [values]}, "loss_target",
     "points": [{"settings": {path: value}, "steps_span_seconds", "step_time_mean",
                 "step_time_p99", "samples_per_second", "final_loss", "pserver_bytes_in",
                 "time_to_loss", "passed", "failed", "error"}]}

Step times are over every step of every trainer, in simulated seconds; ``failed`` names the
expectations not met. ``pserver_bytes_in`` is the mean over the pservers of the bytes each
received (null without pservers). ``time_to_loss`` is the simulated time at the end of trainer
0's first step whose loss, averaged over it and the 9 steps before (as `final_loss_below`
averages the last 10), is below ``loss_target`` (`sim sweep --loss-target`, else the
scenario's `expect.final_loss_below`); null when it never gets there or there is no target.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.table import Table

from runtime.config import expect
from runtime.config.scenario import load_scenario

from .report import collect, fmt_seconds, new_figure, save_png
from .simulate import simulate

__all__ = ["Axis", "SweepError", "SweepPoint", "SweepRecord", "plot_sweep", "run_sweep",
           "sweep_table"]

SCHEMA_VERSION = 2


class SweepError(ValueError):
    """A `--vary` argument that is not ``path=value,value...``."""


@dataclass(frozen=True)
class Axis:
    path: str
    values: tuple[str, ...]

    @staticmethod
    def parse(text: str) -> Axis:
        """``path=v1,v2,...``; an item ``a..b`` stands for the integers a to b inclusive."""
        path, sep, values = text.partition("=")
        items = tuple(v.strip() for v in values.split(","))
        if not sep or not path.strip() or not all(items):
            raise SweepError(f"--vary {text!r}: expected path=value,value..., "
                             f"e.g. cluster.pservers=1,2,4 or seed=0..199")
        return Axis(path.strip(), tuple(v for item in items for v in _expand(item, text)))


def _expand(item: str, text: str) -> list[str]:
    first, dots, last = item.partition("..")
    if not dots:
        return [item]
    if not (first.strip().lstrip("-").isdigit() and last.strip().lstrip("-").isdigit()) \
            or int(first) > int(last):
        raise SweepError(f"--vary {text!r}: {item!r} is not a range of integers a..b with a <= b")
    return [str(n) for n in range(int(first), int(last) + 1)]


@dataclass
class SweepPoint:
    settings: dict[str, str]
    steps_span_seconds: float | None = None
    step_time_mean: float | None = None
    step_time_p99: float | None = None
    samples_per_second: float | None = None
    final_loss: float | None = None
    pserver_bytes_in: float | None = None
    time_to_loss: float | None = None
    passed: bool = False
    failed: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return f"ERROR: {self.error}"
        return "PASS" if self.passed else f"FAIL: {', '.join(self.failed)}"


@dataclass
class SweepRecord:
    scenario: str
    vary: dict[str, list[str]]
    points: list[SweepPoint]
    loss_target: float | None = None
    schema: int = SCHEMA_VERSION


def time_to_loss(losses: list[float], step_ends: list[float] | None,
                 target: float | None) -> float | None:
    """When the trailing mean of `losses` (over `expect.LOSS_WINDOW` steps) first falls below
    `target`: that step's end; None if never, or without a target or step times."""
    if target is None or not step_ends or not losses:
        return None
    sums = np.cumsum(np.asarray(losses, dtype=np.float64))
    window = np.minimum(np.arange(1, len(losses) + 1), expect.LOSS_WINDOW)
    shifted = np.concatenate([np.zeros(expect.LOSS_WINDOW), sums])[:len(losses)]
    below = np.flatnonzero((sums - shifted) / window < target)
    return float(step_ends[below[0]]) if below.size else None


def run_point(scenario_path: Path, overrides: list[str], settings: dict[str, str],
              loss_target: float | None = None) -> SweepPoint:
    """Simulate the scenario with `settings` on top of `overrides`; errors are recorded.
    `loss_target`: the loss whose time `time_to_loss` records (None: the scenario's
    `expect.final_loss_below`)."""
    point = SweepPoint(settings)
    scenario = None
    try:
        scenario = load_scenario(scenario_path,
                                 overrides + [f"{k}={v}" for k, v in settings.items()])
        metrics = collect(simulate(scenario, base_dir=scenario_path.parent))
    except Exception as exc:  # a point that cannot run is an outcome of the sweep
        verdict = None if scenario is None else expect.outcome(scenario, exc)
        if verdict is not None:  # the scenario expects this run to fail
            point.passed, point.failed = verdict.passed, [] if verdict.passed else ["error"]
            return point
        point.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return point
    s = metrics.job
    point.steps_span_seconds = s.steps_span_seconds
    point.step_time_mean = s.step_time_all.mean if s.step_time_all else None
    point.step_time_p99 = s.step_time_all.p99 if s.step_time_all else None
    point.samples_per_second, point.final_loss = s.samples_per_second, s.final_loss
    if metrics.pservers:
        point.pserver_bytes_in = float(np.mean([p.bytes_in for p in metrics.pservers]))
    first = metrics.trainers[0] if metrics.trainers else None
    target = scenario.expect.final_loss_below if loss_target is None else loss_target
    if first is not None:
        point.time_to_loss = time_to_loss(first.losses, first.step_ends, target)
    point.failed = [e.name for e in metrics.expectations if not e.passed]
    point.passed = not point.failed
    return point


def run_sweep(scenario_path: Path, name: str, overrides: list[str], axes: list[Axis],
              on_point: Callable[[int, int, SweepPoint], None] | None = None,
              loss_target: float | None = None) -> SweepRecord:
    """Every combination of the axes' values, in order (the last axis varies fastest)."""
    combos = list(itertools.product(*(axis.values for axis in axes)))
    points = []
    for number, values in enumerate(combos, start=1):
        point = run_point(scenario_path, overrides,
                          {axis.path: value for axis, value in zip(axes, values)}, loss_target)
        points.append(point)
        if on_point is not None:
            on_point(number, len(combos), point)
    return SweepRecord(name, {axis.path: list(axis.values) for axis in axes}, points,
                       loss_target)


def sweep_table(record: SweepRecord) -> Table:
    to_loss = "to loss" if record.loss_target is None else f"to loss {record.loss_target:g}"
    table = Table(*record.vary, "step mean", "step p99", "samples/s", "final loss",
                  "MB/pserver", to_loss, "outcome",
                  title=f"{record.scenario}: sweep of {len(record.points)} point(s)")
    for p in record.points:
        table.add_row(*(p.settings[path] for path in record.vary),
                      fmt_seconds(p.step_time_mean), fmt_seconds(p.step_time_p99),
                      f"{p.samples_per_second:,.0f}" if p.samples_per_second else "-",
                      f"{p.final_loss:.4f}" if p.final_loss is not None else "-",
                      f"{p.pserver_bytes_in / 1e6:,.2f}" if p.pserver_bytes_in is not None
                      else "-", fmt_seconds(p.time_to_loss), p.outcome)
    return table


def plot_sweep(record: SweepRecord, path: Path) -> Path:
    """Samples/s and mean step time against the first varied setting, one line per
    combination of the others."""
    first, *others = record.vary
    xs = record.vary[first]
    rate, rate_axes = new_figure(f"{record.scenario}: throughput", first,
                                 "samples/s (simulated)")
    lines: dict[tuple[str, ...], list[SweepPoint]] = {}
    for p in record.points:
        lines.setdefault(tuple(p.settings[o] for o in others), []).append(p)
    for key, points in lines.items():
        label = ", ".join(f"{o}={v}" for o, v in zip(others, key)) or None
        ys = [p.samples_per_second if p.samples_per_second else np.nan for p in points]
        rate_axes.plot(range(len(xs)), ys, marker="o", label=label)
    rate_axes.set_xticks(range(len(xs)), xs)
    if others:
        rate_axes.legend()
    return save_png(rate, path)
