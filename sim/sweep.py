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
received (null without pservers). ``time_to_loss`` is the simulated time from the first step's
start until trainer 0's mean loss over its last 10 steps (fewer at first; the window of
``expect.final_loss_below``) is at most ``loss_target`` (`sim sweep --loss-target`, else the
scenario's `expect.final_loss_below`); null when it never gets there or there is no target. In
ssp mode, ``read_staleness_max`` and ``blocked_seconds`` are the run's (metrics.json's ``job``).

What the points share is a `SweepSpec`: the scenario's text, read once, the sweep's own
overrides and the loss target. `check_points` builds every point's scenario (and its job,
network and compute model, what `sim run` refuses with exit status 2) before any runs, so a bad
``--vary`` value stops the sweep at once, not hours in. `run_sweep` hands the points still to do
to a runner (`sim.sweep_runners`: in this process, in worker processes, or as Ray tasks) and
puts each result back at its point's index, whatever order they finish in: a point's simulation
is deterministic given its scenario and seed, so every runner gives the same `SweepRecord`, and
the same sweep.json bytes. Points already done (`sim.sweep_journal`, ``--resume``) are not run
again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from rich.table import Table

from runtime.config import expect
from runtime.config.metrics import JobMetrics
from runtime.config.overrides import parse_override
from runtime.config.scenario import Scenario, ScenarioError, parse_scenario
from runtime.services.job import check_job

from .cost import ComputeConfigError, compute_model, runtime_costs
from .network import Network, NetworkConfigError
from .report import collect, fmt_seconds, new_figure, save_png
from .simulate import cyclic_gc_paused, simulate

__all__ = ["Axis", "Runner", "Settings", "SweepError", "SweepPoint", "SweepRecord", "SweepSpec",
           "check_points", "in_this_process", "plan", "plot_sweep", "run_point", "run_sweep",
           "sweep_table", "time_to_loss"]

SCHEMA_VERSION = 2

Settings = dict[str, str]
"""A point: the value of each varied path, in the order of the axes."""


class SweepError(ValueError):
    """A `--vary` argument that is not ``path=value,value...``, or a point whose scenario
    cannot be built (`check_points`)."""


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
    read_staleness_max: int | None = None
    blocked_seconds: float | None = None

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


def time_to_loss(metrics: JobMetrics, target: float) -> float | None:
    """Simulated seconds from the first step's start until trainer 0's mean loss over its last
    `expect.LOSS_WINDOW` steps is at most `target`; None if it never is."""
    runs = [t for t in metrics.trainers if t.step_ends and t.step_times]
    if not runs or runs[0].index != 0:
        return None
    start = min(t.step_ends[0] - t.step_times[0] for t in runs)  # type: ignore[index]
    first = runs[0]
    for i, end in enumerate(first.step_ends or ()):
        window = first.losses[max(0, i + 1 - expect.LOSS_WINDOW):i + 1]
        if float(np.mean(window)) <= target:
            return end - start
    return None


@dataclass(frozen=True)
class SweepSpec:
    """What every point of a sweep shares, sent whole to each worker: the scenario's `text`,
    read once (every worker runs the same bytes, wherever it is), `source` (the path as given,
    which error messages name), `folder` (absolute: where the scenario's relative paths start,
    from any working directory), the sweep's `overrides` (``--set``, ``--seed``) and the
    `loss_target` of `time_to_loss`."""

    text: str
    source: str
    folder: Path
    overrides: tuple[str, ...] = ()
    loss_target: float | None = None

    @staticmethod
    def read(path: Path, overrides: Iterable[str] = (),
             loss_target: float | None = None) -> SweepSpec:
        return SweepSpec(path.read_text(), str(path), path.resolve().parent, tuple(overrides),
                         loss_target)

    def scenario(self, settings: Settings) -> Scenario:
        """The point's scenario, as `load_scenario` would read it with the overrides and then
        `settings` (the later wins)."""
        varied = [parse_override(f"{k}={v}", "--vary") for k, v in settings.items()]
        return parse_scenario(self.text, self.source, [*self.overrides, *varied]).located(
            self.source, self.folder)

    @property
    def key(self) -> str:
        """A hash of what decides every point's result but its settings: the points of two
        sweeps with the same key and settings are the same (`sim.sweep_journal`)."""
        what = [SCHEMA_VERSION, self.text, list(self.overrides), self.loss_target]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def plan(axes: Sequence[Axis]) -> list[Settings]:
    """Every combination of the axes' values, in order (the last axis varies fastest)."""
    return [{axis.path: value for axis, value in zip(axes, values)}
            for values in itertools.product(*(axis.values for axis in axes))]


def check_point(spec: SweepSpec, settings: Settings) -> None:
    """Build what `sim run` builds before it runs (the scenario, its job, network and compute
    model); raise what it would refuse with exit status 2."""
    scenario = spec.scenario(settings)
    check_job(scenario)
    Network.from_spec(scenario.network, scenario.seed)
    compute_model(scenario.compute, scenario.seed, spec.folder)
    runtime_costs(scenario.compute, spec.folder)


def check_points(spec: SweepSpec, points: Sequence[Settings]) -> None:
    """Raise `SweepError` naming the first point that cannot be built, the ``--vary`` values
    the error is about (the one the scenario's error blames, as it blames a ``--set``; else
    those it mentions, or all the point's) and how many more fail."""
    bad = []
    for settings in points:
        try:
            check_point(spec, settings)
        except (ScenarioError, NetworkConfigError, ComputeConfigError) as err:
            bad.append((settings, str(err).splitlines()[0]))
    if not bad:
        return
    settings, error = bad[0]
    more = f" (and {len(bad) - 1} more point(s))" if len(bad) > 1 else ""
    if error.startswith("--vary "):  # the scenario's error names the value to blame
        raise SweepError(f"{error}{more}")
    named = {k: v for k, v in settings.items() if k in error} or settings
    raise SweepError(f"--vary {', '.join(f'{k}={v}' for k, v in named.items())}: "
                     f"{error}{more}")


def run_point(spec: SweepSpec, settings: Settings) -> SweepPoint:
    """Simulate the spec's scenario with `settings`; errors are recorded."""
    point = SweepPoint(settings)
    scenario = None
    try:
        scenario = spec.scenario(settings)
        result = simulate(scenario, base_dir=spec.folder)
        with cyclic_gc_paused():
            metrics = collect(result)
    except Exception as exc:  # a point that cannot run is an outcome of the sweep
        verdict = None if scenario is None else expect.outcome(scenario, exc)
        if verdict is not None:  # the scenario expects this run to fail
            point.passed, point.failed = verdict.passed, [] if verdict.passed else ["error"]
            return point
        point.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return point
    _measure(point, metrics, spec.loss_target)
    return point


def _measure(point: SweepPoint, metrics: JobMetrics, loss_target: float | None) -> None:
    s = metrics.job
    point.steps_span_seconds = s.steps_span_seconds
    point.step_time_mean = s.step_time_all.mean if s.step_time_all else None
    point.step_time_p99 = s.step_time_all.p99 if s.step_time_all else None
    point.samples_per_second, point.final_loss = s.samples_per_second, s.final_loss
    point.read_staleness_max, point.blocked_seconds = s.read_staleness_max, s.blocked_seconds
    if metrics.pservers:
        point.pserver_bytes_in = float(np.mean([p.bytes_in for p in metrics.pservers]))
    if loss_target is not None:
        point.time_to_loss = time_to_loss(metrics, loss_target)
    point.failed = [e.name for e in metrics.expectations if not e.passed]
    point.passed = not point.failed


class Runner(Protocol):
    """Runs points: yields each (index, result) of `todo` as it finishes, in any order."""

    def __call__(self, spec: SweepSpec,
                 todo: Sequence[tuple[int, Settings]]) -> Iterator[tuple[int, SweepPoint]]: ...


def in_this_process(spec: SweepSpec,
                    todo: Sequence[tuple[int, Settings]]) -> Iterator[tuple[int, SweepPoint]]:
    """The sequential runner: one point after the other, in order."""
    for index, settings in todo:
        yield index, run_point(spec, settings)


def run_sweep(spec: SweepSpec, name: str, axes: Sequence[Axis],
              runner: Runner = in_this_process, done: Mapping[int, SweepPoint] | None = None,
              on_point: Callable[[int, SweepPoint], None] | None = None) -> SweepRecord:
    """Every point of `plan(axes)` but those `done` (by index), run by `runner`; `on_point`
    is told each (index, result) as it finishes. The record lists the points in plan order."""
    settings = plan(axes)
    points: list[SweepPoint | None] = [(done or {}).get(i) for i in range(len(settings))]
    todo = [(i, settings[i]) for i, point in enumerate(points) if point is None]
    for index, point in runner(spec, todo):
        points[index] = point
        if on_point is not None:
            on_point(index, point)
    missing = [i for i, point in enumerate(points) if point is None]
    if missing:
        raise RuntimeError(f"the runner left point(s) {missing} unrun")
    return SweepRecord(name, {axis.path: list(axis.values) for axis in axes},
                       [point for point in points if point is not None],
                       loss_target=spec.loss_target)


def sweep_table(record: SweepRecord) -> Table:
    """A row per point: step times, throughput, loss, the bytes a pserver received; with a loss
    target, the time to it ("to loss"); when a point ran in ssp mode, the most steps a read ran
    ahead ("staleness") and the trainers' time held."""
    target = record.loss_target
    ssp = any(p.read_staleness_max is not None for p in record.points)
    extra = ([f"to loss {target:g}"] if target is not None else []) + \
        (["staleness", "held"] if ssp else [])
    table = Table(*record.vary, "step mean", "step p99", "samples/s", "final loss",
                  "MB/pserver", *extra, "outcome",
                  title=f"{record.scenario}: sweep of {len(record.points)} point(s)")
    for p in record.points:
        cells = ([fmt_seconds(p.time_to_loss) if p.time_to_loss is not None else "never"]
                 if target is not None else []) + \
            ([_or_dash(p.read_staleness_max), fmt_seconds(p.blocked_seconds)] if ssp else [])
        table.add_row(*(p.settings[path] for path in record.vary),
                      fmt_seconds(p.step_time_mean), fmt_seconds(p.step_time_p99),
                      f"{p.samples_per_second:,.0f}" if p.samples_per_second else "-",
                      f"{p.final_loss:.4f}" if p.final_loss is not None else "-",
                      f"{p.pserver_bytes_in / 1e6:,.2f}" if p.pserver_bytes_in is not None
                      else "-", *cells, p.outcome)
    return table


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


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
