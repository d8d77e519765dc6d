"""What a simulated run reports: `metrics.json`, the summary table, and PNG plots.

`collect(result)` turns a `SimResult` into `SimMetrics`, checking the scenario's `expect` block
with `runtime.expect.check` (as `runtime up` does, plus ``max_step_time``, which only simulated
time can answer). ``OUT/metrics.json`` is exactly `dataclasses.asdict` of it:

    {"schema": 1,
     "simulation": {"scenario", "seed", "mode", "pservers", "trainers", "steps", "batch_size",
                    "network", "compute", "simulated_seconds", "steps_span_seconds",
                    "train_seconds", "samples",
                    "samples_per_second", "step_time", "step_time_all", "final_loss",
                    "messages", "bytes", "success", "reason"},
     "trainers": [{"index", "losses", "step_times", "step_ends", "final_loss", "step_time",
                   "compute_seconds", "barrier_wait_seconds", "steps_redone", "first_step"}],
     "pservers": [{"index", "endpoint", "messages", "bytes_in", "bytes_out", "optimize_seconds",
                   "busy_seconds", "busy_share", "nic_in_share", "nic_out_share", "steps",
                   "errors", "dropped", "checkpoints", "restored_step", "rewinds"}],
     "links": [{"src", "dst", "messages", "bytes", "dropped", "lost", "duplicated", "reordered",
                "delayed"}],
     "nics": [{"node", "messages_out", "bytes_out", "busy_out", "wait_out",
               "messages_in", "bytes_in", "busy_in", "wait_in"}],
     "expectations": [{"name", "expected", "actual", "passed", "detail"}],
     "notes": ["what this run did not simulate"],
     "faults": [{"fault", "kind", "what", "start", "end"}]}

All times are simulated seconds; the file holds no wall-clock figure, so two runs of the same
scenario and seed write the same bytes. Definitions:

- ``simulated_seconds``: virtual time from the start until the last node finished: startup,
  and the pservers' final drain (the quiet time they wait after the last trainer completed, to
  answer a retried request) included. ``steps_span_seconds``: from the first step's start to the
  last step's end, over all trainers. ``train_seconds``: the slowest trainer's time inside its
  steps; ``samples_per_second`` = samples of every trainer's steps / ``train_seconds`` (the same
  definitions as `runtime up`'s metrics).
- ``step_time`` ({"mean", "p50", "p99", "max"}): trainer 0's step times; ``step_time_all``:
  every step of every trainer. ``step_ends``: simulated time at the end of each step.
- ``compute_seconds``: the modelled compute inside a trainer's steps. ``barrier_wait_seconds``:
  the time it spent inside its send_barrier, recv and fetch_barrier ops during its steps
  (waiting for the pservers, and, in sync mode, for the other trainers).
- ``busy_seconds``: a pserver's modelled compute (its optimize blocks, and in the asynchronous
  modes the update each message runs); ``busy_share`` = busy_seconds / steps_span_seconds.
  ``nic_in_share`` / ``nic_out_share``: the time its NIC spent taking in / sending out bytes,
  over steps_span_seconds (a share near 1 marks the bottleneck). ``optimize_seconds``: time inside sync
  optimize steps, as `runtime up` reports it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

import numpy as np
from rich.console import Console
from rich.table import Table

from runtime import expect
from runtime.cluster import pserver_name, train_locally, trainer_name
from runtime.job import Job
from runtime.faults import Slow
from runtime.metrics import ExpectationResult, PserverMetrics

from .cost import runtime_costs
from .simulate import SimResult, TrainerRun, simulate

__all__ = ["SimMetrics", "StepTimeStats", "check_expectations", "collect", "console_for",
           "fmt_bytes", "fmt_seconds", "new_figure", "plots_available", "print_summary", "save_png",
           "write_json", "write_plots"]

SCHEMA_VERSION = 1
BARRIER_OPS = frozenset({"send_barrier", "recv", "fetch_barrier"})


@dataclass
class StepTimeStats:
    mean: float
    p50: float
    p99: float
    max: float

    @staticmethod
    def of(times: Sequence[float]) -> StepTimeStats | None:
        if not len(times):
            return None
        a = np.asarray(times, dtype=np.float64)
        return StepTimeStats(float(a.mean()), float(np.percentile(a, 50)),
                             float(np.percentile(a, 99)), float(a.max()))


@dataclass
class SimSummary:
    scenario: str
    seed: int
    mode: str
    pservers: int
    trainers: int
    steps: int
    batch_size: int
    network: str
    compute: str
    simulated_seconds: float
    steps_span_seconds: float
    train_seconds: float | None
    samples: int
    samples_per_second: float | None
    step_time: StepTimeStats | None
    step_time_all: StepTimeStats | None
    final_loss: float | None
    messages: int
    bytes: int
    success: bool = True
    reason: str | None = None


@dataclass
class SimTrainerMetrics:
    index: int
    losses: list[float]
    step_times: list[float]
    step_ends: list[float]
    final_loss: float | None
    step_time: StepTimeStats | None
    compute_seconds: float
    barrier_wait_seconds: float
    steps_redone: int = 0
    first_step: int = 0


@dataclass
class SimPserverMetrics:
    index: int
    endpoint: str
    messages: int
    bytes_in: int
    bytes_out: int
    optimize_seconds: float
    busy_seconds: float
    busy_share: float
    nic_in_share: float
    nic_out_share: float
    steps: int
    errors: int
    dropped: list[int]
    checkpoints: list[int] = field(default_factory=list)
    restored_step: int | None = None
    rewinds: int = 0


@dataclass
class LinkMetrics:
    src: str
    dst: str
    messages: int
    bytes: int
    dropped: int
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0


@dataclass
class NicMetrics:
    node: str
    messages_out: int
    bytes_out: int
    busy_out: float
    wait_out: float
    messages_in: int
    bytes_in: int
    busy_in: float
    wait_in: float


@dataclass
class SimMetrics:
    simulation: SimSummary
    trainers: list[SimTrainerMetrics]
    pservers: list[SimPserverMetrics]
    links: list[LinkMetrics]
    nics: list[NicMetrics]
    expectations: list[ExpectationResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    schema: int = SCHEMA_VERSION


# -- collecting ---------------------------------------------------------------------------------

def steps_span(result: SimResult) -> float:
    """Simulated time from the first step's start to the last step's end, over all trainers."""
    runs = [run for run in result.trainers if run.step_ends]
    if not runs:
        return 0.0
    return max(run.step_ends[-1] for run in runs) - min(run.steps_start for run in runs)


def _share(seconds: float, total: float) -> float:
    return seconds / total if total > 0 else 0.0


def _trainer(result: SimResult, run: TrainerRun) -> SimTrainerMetrics:
    """A trainer's figures. Its barrier spans count from its first step's start (`steps_start`,
    known to a rounding error: the startup's last barrier ends at it, step 0's first barrier
    begins a send's round trip later)."""
    node, since = trainer_name(run.index), run.steps_start
    return SimTrainerMetrics(
        run.index, list(run.losses), list(run.step_times), list(run.step_ends),
        run.losses[-1] if run.losses else None, StepTimeStats.of(run.step_times),
        result.compute.get(node, 0.0), result.trace.seconds(node, "rpc", BARRIER_OPS, since),
        run.redone, run.first_step)


def _pserver(result: SimResult, index: int) -> SimPserverMetrics:
    stats, node, total = result.pservers[index], pserver_name(index), steps_span(result)
    busy = result.compute.get(node, 0.0)
    nic = result.nics.get(node)
    return SimPserverMetrics(
        index, result.endpoints[index], stats.messages, stats.bytes_in, stats.bytes_out,
        stats.optimize_seconds, busy, _share(busy, total),
        _share(nic.busy_in, total) if nic else 0.0, _share(nic.busy_out, total) if nic else 0.0,
        stats.steps, stats.errors, list(stats.dropped), list(stats.checkpoints),
        stats.restored_step, stats.rewinds)


def _summary(result: SimResult, trainers: list[SimTrainerMetrics]) -> SimSummary:
    s = result.scenario
    in_steps = [sum(t.step_times) for t in trainers if t.step_times]
    train_seconds = max(in_steps) if in_steps else None
    samples = sum(len(t.losses) for t in trainers) * s.data.batch_size
    first = trainers[0] if trainers else None
    return SimSummary(
        s.name, s.seed, s.transpiler.mode, s.cluster.pservers, s.cluster.trainers, s.train.steps,
        s.data.batch_size, "from the scenario" if s.network is not None else "ideal",
        str(s.compute["model"]) if s.compute is not None else "none",
        result.simulated_seconds, steps_span(result), train_seconds, samples,
        samples / train_seconds if train_seconds else None,
        first.step_time if first else None,
        StepTimeStats.of([x for t in trainers for x in t.step_times]),
        first.final_loss if first else None,
        result.messages, sum(link.bytes for link in result.links.values()))


def notes_for(result: SimResult) -> list[str]:
    """What of the scenario this run did not simulate, or assumed."""
    s, notes = result.scenario, []
    if s.network is None:
        notes.append("network: none given, so an ideal network (no latency, unlimited bandwidth)")
    if s.compute is None:
        notes.append("compute: none given, so compute takes no simulated time")
    if s.compute is None and any(isinstance(f, Slow) for f in s.faults):
        notes.append("faults: a slowdown has no effect without a compute model")
    if s.compute is not None:
        if runtime_costs(s.compute, result.base_dir or Path.cwd()) is None:
            notes.append("compute: only kernels are priced, not the runtime's own work "
                         "(messages, dispatch); a profile from `runtime profile` prices it")
        elif not s.cluster.hosts:
            notes.append("cluster.hosts: none given, so every node has a machine of its own")
    return notes


def check_expectations(result: SimResult) -> list[ExpectationResult]:
    """The scenario's `expect` block against the run, ``max_step_time`` included."""
    scenario = result.scenario
    pservers = [PserverMetrics.from_stats(j, ep, stats)
                for j, (ep, stats) in enumerate(zip(result.endpoints, result.pservers))]

    def local() -> dict[str, np.ndarray]:
        return train_locally(Job.from_scenario(scenario), scenario.backend.kernels)[1]

    def fault_free() -> dict[str, np.ndarray]:
        return simulate(scenario.model_copy(update={"faults": []}), base_dir=result.base_dir).params

    losses = result.trainers[0].losses if result.trainers else []
    checked = expect.check(scenario, losses, result.params, pservers, local,
                           [t.step_times for t in result.trainers], fault_free,
                           [t.redone for t in result.trainers])
    verdict = expect.outcome(scenario, None)
    return checked + ([verdict] if verdict is not None else [])


def collect(result: SimResult) -> SimMetrics:
    """Everything `metrics.json` holds, expectations checked."""
    trainers = [_trainer(result, run) for run in result.trainers]
    pservers = [_pserver(result, j) for j in range(len(result.pservers))]
    links = [LinkMetrics(src, dst, st.messages, st.bytes, st.dropped, st.lost, st.duplicated,
                         st.reordered, st.delayed)
             for (src, dst), st in sorted(result.links.items())]
    nics = [NicMetrics(node, **asdict(st)) for node, st in sorted(result.nics.items())]
    metrics = SimMetrics(_summary(result, trainers), trainers, pservers, links, nics,
                         check_expectations(result), notes_for(result),
                         [event.as_dict() for event in result.faults])
    failed = [f"{e.name} ({e.detail})" for e in metrics.expectations if not e.passed]
    if failed:
        metrics.simulation.success = False
        metrics.simulation.reason = f"expectation not met: {'; '.join(failed)}"
    return metrics


def write_json(path: Path, record: Any) -> None:
    """A dataclass record as indented JSON, atomically. JSON has no NaN: a loss that is not a
    number (timing mode computes none) is written as null."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_finite(asdict(record)), indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_finite(value) for value in data]
    return data


# -- printing -----------------------------------------------------------------------------------

def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f}us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds:.3f}s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _stats(stats: StepTimeStats | None) -> str:
    if stats is None:
        return "-"
    return (f"mean {fmt_seconds(stats.mean)}  p50 {fmt_seconds(stats.p50)}  "
            f"p99 {fmt_seconds(stats.p99)}")


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def summary_table(m: SimMetrics) -> Table:
    s = m.simulation
    table = Table(title=f"{s.scenario}: simulated {s.mode}, {s.pservers} pserver(s) x "
                        f"{s.trainers} trainer(s), seed {s.seed}", show_header=False)
    rate = f"{s.samples_per_second:,.0f}" if s.samples_per_second else "-"
    loss = f"{s.final_loss:.4f}" if s.final_loss is not None else "-"
    rows = [("simulated time of the steps", fmt_seconds(s.steps_span_seconds)),
            ("simulated time of the job", f"{fmt_seconds(s.simulated_seconds)} (with startup "
                                          "and the pservers' final drain)"),
            ("time in steps (slowest trainer)", fmt_seconds(s.train_seconds)),
            ("step time, trainer 0", _stats(s.step_time)),
            ("step time, all trainers", _stats(s.step_time_all)),
            ("samples/s (simulated)", rate),
            ("final loss, trainer 0", loss),
            ("network", f"{s.network}: {s.messages:,} messages, {fmt_bytes(s.bytes)}"),
            ("compute model", s.compute)]
    for name, value in rows:
        table.add_row(name, value)
    return table


def trainer_table(m: SimMetrics) -> Table:
    table = Table("trainer", "steps", "step mean", "p50", "p99", "compute", "barrier wait",
                  "final loss")
    for t in m.trainers:
        st = t.step_time
        table.add_row(trainer_name(t.index), str(len(t.losses)),
                      *(fmt_seconds(x) for x in ((st.mean, st.p50, st.p99) if st else (None,) * 3)),
                      fmt_seconds(t.compute_seconds), fmt_seconds(t.barrier_wait_seconds),
                      f"{t.final_loss:.4f}" if t.final_loss is not None else "-")
    return table


def pserver_table(m: SimMetrics) -> Table:
    table = Table("pserver", "messages", "bytes in", "bytes out", "optimize", "busy share",
                  "NIC in", "NIC out")
    for p in m.pservers:
        table.add_row(pserver_name(p.index), f"{p.messages:,}", fmt_bytes(p.bytes_in),
                      fmt_bytes(p.bytes_out), fmt_seconds(p.optimize_seconds),
                      _percent(p.busy_share), _percent(p.nic_in_share), _percent(p.nic_out_share))
    return table


def fault_table(m: SimMetrics) -> Table | None:
    """The faults as they happened, and what they did to messages and steps; None: no fault."""
    if not m.faults:
        return None
    table = Table("fault", "what", "from", "until", title="faults")
    for f in m.faults:
        end = f["end"]
        table.add_row(str(f["fault"]), str(f["what"]), fmt_seconds(float(f["start"])),
                      fmt_seconds(float(end)) if end is not None else "the end")
    counts = {name: sum(getattr(link, name) for link in m.links)
              for name in ("lost", "duplicated", "reordered", "delayed")}
    table.add_row("", "messages: " + ", ".join(f"{v:,} {k}" for k, v in counts.items()), "", "")
    redone = [t.steps_redone for t in m.trainers]
    restarts = [p for p in m.pservers if p.restored_step is not None]
    if any(redone) or restarts:
        restored = ", ".join(f"{pserver_name(p.index)} restored at step {p.restored_step}"
                             for p in restarts)
        table.add_row("", f"steps redone per trainer: {redone}" + (f"; {restored}" if restored
                                                                   else ""), "", "")
    return table


def console_for(stream: TextIO) -> Console:
    """A rich console on `stream`: the terminal's width, or 120 columns into a file or pipe."""
    return Console(file=stream, width=None if stream.isatty() else 120, highlight=False)


def print_summary(m: SimMetrics, stream: TextIO) -> None:
    """The summary table, per-trainer and per-pserver tables, notes and expectations."""
    console = console_for(stream)
    for table in (summary_table(m), trainer_table(m), pserver_table(m), fault_table(m)):
        if table is not None:
            console.print(table)
    for note in m.notes:
        print(f"note: {note}", file=stream)
    for e in m.expectations:
        print(f"expect {e.name}: {'PASS' if e.passed else 'FAIL'}: {e.detail}", file=stream)


# -- plots --------------------------------------------------------------------------------------

def plots_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def save_png(figure: Any, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=100)
    return path


def new_figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout="tight")
    axes = figure.add_subplot()
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


def write_plots(m: SimMetrics, out: Path) -> list[Path]:
    """``loss.png`` (loss against simulated time, per trainer) and ``step_times.png`` (each
    step's simulated time, per trainer), with the Agg backend."""
    name = m.simulation.scenario
    loss, loss_axes = new_figure(f"{name}: loss", "simulated time (ms)", "loss")
    steps, step_axes = new_figure(f"{name}: step times", "step", "simulated step time (ms)")
    for t in m.trainers:
        label = trainer_name(t.index)
        loss_axes.plot(np.asarray(t.step_ends) * 1e3, t.losses, label=label, linewidth=1)
        step_axes.plot(np.arange(1, len(t.step_times) + 1), np.asarray(t.step_times) * 1e3,
                       label=label, linewidth=1)
    if len(m.trainers) <= 16:
        loss_axes.legend()
        step_axes.legend()
    return [save_png(loss, out / "loss.png"), save_png(steps, out / "step_times.png")]
