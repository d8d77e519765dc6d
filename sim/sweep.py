"""`sim sweep`: one scenario simulated at every combination of a few settings.

``--vary cluster.pservers=1,2,4,8 --vary cluster.trainers=4,8`` simulates the cartesian product
of the values (8 runs here), each as ``--set cluster.pservers=2 --set cluster.trainers=8`` on
top of the scenario and the sweep's own ``--set``s, and records per point the simulated step
time, throughput, final loss and whether the scenario's expectations held. A point that cannot
run (an invalid combination, a deadlock) is recorded with its error and the sweep goes on.

``OUT/sweep.json`` is `dataclasses.asdict` of a `SweepRecord`:

    {"schema": 1, "scenario", "vary": {path: [values]},
     "points": [{"settings": {path: value}, "steps_span_seconds", "step_time_mean",
                 "step_time_p99", "samples_per_second", "final_loss", "passed", "failed",
                 "error"}]}

Step times are over every step of every trainer, in simulated seconds; ``failed`` names the
expectations not met.
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

SCHEMA_VERSION = 1


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
    schema: int = SCHEMA_VERSION


def run_point(scenario_path: Path, overrides: list[str], settings: dict[str, str]) -> SweepPoint:
    """Simulate the scenario with `settings` on top of `overrides`; errors are recorded."""
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
    point.failed = [e.name for e in metrics.expectations if not e.passed]
    point.passed = not point.failed
    return point


def run_sweep(scenario_path: Path, name: str, overrides: list[str], axes: list[Axis],
              on_point: Callable[[int, int, SweepPoint], None] | None = None) -> SweepRecord:
    """Every combination of the axes' values, in order (the last axis varies fastest)."""
    combos = list(itertools.product(*(axis.values for axis in axes)))
    points = []
    for number, values in enumerate(combos, start=1):
        point = run_point(scenario_path, overrides,
                          {axis.path: value for axis, value in zip(axes, values)})
        points.append(point)
        if on_point is not None:
            on_point(number, len(combos), point)
    return SweepRecord(name, {axis.path: list(axis.values) for axis in axes}, points)


def sweep_table(record: SweepRecord) -> Table:
    table = Table(*record.vary, "step mean", "step p99", "samples/s", "final loss", "outcome",
                  title=f"{record.scenario}: sweep of {len(record.points)} point(s)")
    for p in record.points:
        table.add_row(*(p.settings[path] for path in record.vary),
                      fmt_seconds(p.step_time_mean), fmt_seconds(p.step_time_p99),
                      f"{p.samples_per_second:,.0f}" if p.samples_per_second else "-",
                      f"{p.final_loss:.4f}" if p.final_loss is not None else "-", p.outcome)
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
