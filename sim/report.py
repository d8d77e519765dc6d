"""What a simulated run reports: `metrics.json`, the summary table, and PNG plots.

`collect(result)` turns a `SimResult` into the run record (`runtime.config.metrics.JobMetrics`, the
schema `runtime up` writes too; ``runtime/config/metrics.schema.json``), checking the scenario's
`expect` block with `runtime.config.expect.check` (as `runtime up` does, plus ``max_step_time``,
which only simulated time can answer). ``OUT/metrics.json`` is that record (`write_record`); its
fields and their meanings are documented in `runtime.config.metrics`. All its times are simulated
seconds and it holds no wall-clock figure but ``job.run`` (when, where and how the process ran;
the same for two runs in one process), so two runs of the same scenario and seed write the same
bytes. What only a simulation measures fills the fields marked "sim run only":
``job.simulated_seconds``, ``job.steps_span_seconds``, each trainer's ``step_ends``,
``compute_seconds`` and ``barrier_wait_seconds`` (counted from its first step's start), each
pserver's ``busy_seconds`` and NIC shares, and the ``links`` and ``nics`` lists.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from rich.console import Console
from rich.table import Table

from runtime.config import expect
from runtime.config.atomic import atomic_open
from runtime.config.faults import Slow
from runtime.config.metrics import (ExpectationResult, FaultEvent, JobMetrics, JobSummary,
                                    LinkMetrics, NicMetrics, PserverMetrics, StepTimeStats,
                                    TrainerMetrics)
from runtime.config.nodes import pserver_name, trainer_name
from runtime.services.cluster import train_locally
from runtime.services.job import Job

from .cost import runtime_costs
from .cpu import host_loads, hosts_of
from .simulate import SimResult, TrainerRun, simulate
from .trace import BARRIER_OPS

__all__ = ["check_expectations", "collect", "console_for", "fmt_bytes", "fmt_seconds",
           "loss_figure", "new_figure", "plots_available", "print_summary", "save_png",
           "step_figure", "write_plots"]



# -- collecting ---------------------------------------------------------------------------------

def steps_span(result: SimResult) -> float:
    """Simulated time from the first step's start to the last step's end, over all trainers."""
    runs = [run for run in result.trainers if run.step_ends]
    if not runs:
        return 0.0
    return max(run.step_ends[-1] for run in runs) - min(run.steps_start for run in runs)


def _share(seconds: float, total: float) -> float:
    return seconds / total if total > 0 else 0.0


def _trainer(result: SimResult, run: TrainerRun) -> TrainerMetrics:
    """A trainer's figures. Its barrier spans count from its first step's start (`steps_start`,
    known to a rounding error: the startup's last barrier ends at it, step 0's first barrier
    begins a send's round trip later)."""
    node, since = trainer_name(run.index), run.steps_start
    record = TrainerMetrics.from_steps(run.index, run.losses, run.step_times, run.first_step,
                                       run.redone, run.resends)
    record.step_ends = list(run.step_ends)
    record.compute_seconds = result.compute.get(node, 0.0)
    record.barrier_wait_seconds = result.trace.seconds(node, "rpc", BARRIER_OPS, since)
    return record


def _pserver(result: SimResult, index: int) -> PserverMetrics:
    node, total = pserver_name(index), steps_span(result)
    record = PserverMetrics.from_stats(index, result.endpoints[index], result.pservers[index])
    busy = result.compute.get(node, 0.0)
    nic = result.nics.get(node)
    record.busy_seconds, record.busy_share = busy, _share(busy, total)
    record.nic_in_share = _share(nic.busy_in, total) if nic else 0.0
    record.nic_out_share = _share(nic.busy_out, total) if nic else 0.0
    return record


def _summary(result: SimResult, trainers: list[TrainerMetrics],
             pservers: list[PserverMetrics]) -> JobSummary:
    s = result.scenario
    summary = JobSummary.for_run("sim run", s, result.endpoints, trainers, pservers)
    summary.success = True
    summary.simulated_seconds = result.simulated_seconds
    summary.steps_span_seconds = steps_span(result)
    summary.network = "from the scenario" if s.network is not None else "ideal"
    summary.compute = str(s.compute["model"]) if s.compute is not None else "none"
    summary.messages = result.messages
    summary.bytes = sum(link.bytes for link in result.links.values())
    return summary


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
                         "(messages, dispatch); a machine file from `runtime calibrate` (or "
                         "a profile from `runtime profile`) prices it")
        elif not s.cluster.hosts:
            notes.append("cluster.hosts: none given, so every node has a machine of its own")
    if s.collective.backend == "torch" and s.cluster.pservers == 0:
        notes.append("collective.backend: torch is a real-run backend (runtime up, role mode); "
                     "simulated as the ring all-reduce (its messages and sums: the same sums "
                     "within float rounding, not torch.distributed's algorithm or timing)")
    return notes + _busy_hosts(result) + _slow_fan_in(result) + result.compute_notes


HEARTBEAT_SHARE = 2 / 3
"""A pserver's NIC busy this share of ``train.heartbeat_timeout`` a step taking in requests can
hold a trainer's heartbeat past the timeout (heartbeats go every third of it)."""


def _slow_fan_in(result: SimResult) -> list[str]:
    """A note for each pserver whose NIC spends so long a step taking in its trainers' requests
    (`HEARTBEAT_SHARE` of the heartbeat timeout or more) that a heartbeat queued behind them
    can arrive too late: the pserver then drops live trainers. The same holds for real: a
    trainer's heartbeat travels on the connection its requests take."""
    steps, timeout = result.scenario.train.steps, result.scenario.train.heartbeat_timeout
    notes = []
    for j in range(len(result.pservers)):
        nic = result.nics.get(pserver_name(j))
        if nic is None or not steps:
            continue
        busy = nic.busy_in / steps
        if busy >= HEARTBEAT_SHARE * timeout:
            notes.append(
                f"network: {pserver_name(j)}'s NIC takes {busy:.3g}s a step to receive "
                f"{nic.bytes_in / steps / 1e6:.3g} MB of requests; a trainer's heartbeat "
                f"waits behind its requests, so with train.heartbeat_timeout at {timeout:g}s "
                "the pserver can drop live trainers: raise it above the step's transfer")
    return notes


BUSY_HOST = 0.95
"""A host whose cores were given this share of the job's time in work or more is CPU-bound."""


def _busy_hosts(result: SimResult) -> list[str]:
    """A note for each host of ``cluster.hosts`` whose cores the job kept busy (`BUSY_HOST`):
    the figures it then gives are the least certain (docs/fidelity.md)."""
    hosts = hosts_of([h.model_dump() for h in result.scenario.cluster.hosts or ()])
    if not hosts or not result.cpu or result.simulated_seconds <= 0:
        return []
    loads = host_loads(hosts, result.cpu)
    notes = []
    for spec in hosts:
        share = loads[spec.name] / (spec.cores * result.simulated_seconds)
        if share >= BUSY_HOST:
            notes.append(
                f"cluster.hosts: {spec.name}'s {spec.cores:g} core(s) had work "
                f"{min(share, 1.0):.0%} of the job's time: its CPUs bound the step, where the "
                "simulator is least certain (on a 2-core VM such jobs ran from 4% faster to "
                "22% slower than predicted; docs/fidelity.md)")
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


def collect(result: SimResult) -> JobMetrics:
    """Everything `metrics.json` holds, expectations checked."""
    trainers = [_trainer(result, run) for run in result.trainers]
    pservers = [_pserver(result, j) for j in range(len(result.pservers))]
    links = [LinkMetrics(src, dst, st.messages, st.bytes, st.dropped, st.lost, st.duplicated,
                         st.reordered, st.delayed)
             for (src, dst), st in sorted(result.links.items())]
    nics = [NicMetrics(node, **asdict(st)) for node, st in sorted(result.nics.items())]
    faults = [FaultEvent(e.fault, e.kind, e.what, e.start, e.end) for e in result.faults]
    metrics = JobMetrics(_summary(result, trainers, pservers), trainers, pservers,
                         check_expectations(result), notes_for(result), faults, links, nics)
    failed = [f"{e.name} ({e.detail})" for e in metrics.expectations if not e.passed]
    if failed:
        metrics.job.success = False
        metrics.job.reason = f"expectation not met: {'; '.join(failed)}"
    return metrics


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
            f"p99 {fmt_seconds(stats.p99)}  max {fmt_seconds(stats.max)}")


def _rate(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate else "-"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def summary_table(m: JobMetrics) -> Table:
    s = m.job
    table = Table(title=f"{s.scenario}: simulated {s.mode}, {s.pservers} pserver(s) x "
                        f"{s.trainers} trainer(s), seed {s.seed}", show_header=False)
    loss = f"{s.final_loss:.4f}" if s.final_loss is not None else "-"
    rows = [("simulated time of the steps", fmt_seconds(s.steps_span_seconds)),
            ("simulated time of the job", f"{fmt_seconds(s.simulated_seconds)} (with startup "
                                          "and the pservers' exit)"),
            ("time training (slowest trainer)", f"{fmt_seconds(s.train_seconds)} (after its "
                                                "first step, fault recovery included)"),
            ("start-up: longest first step", fmt_seconds(s.startup_wait_seconds)),
            ("step time, trainer 0", _stats(s.step_time)),
            ("step time, all trainers", _stats(s.step_time_all)),
            ("samples/s (simulated)", f"{_rate(s.samples_per_second)} ({s.trained_samples:,} "
                                      "trained / time training)"),
            ("samples/s at the median step", _rate(s.step_samples_per_second)),
            ("final loss, trainer 0", loss),
            ("network", f"{s.network}: {s.messages or 0:,} messages, {fmt_bytes(s.bytes or 0)}"),
            ("compute model", str(s.compute))]
    if s.read_staleness_max is not None:
        rows.append(("ssp: most steps a read ran ahead, trainers' time held",
                     f"{s.read_staleness_max}, {fmt_seconds(s.blocked_seconds)}"))
    for name, value in rows:
        table.add_row(name, value)
    return table


def trainer_table(m: JobMetrics) -> Table:
    """A row per trainer; a ``resent`` column only where some trainer sent a request again."""
    resent = any(t.resends for t in m.trainers)
    table = Table("trainer", "steps", "first step", "step mean", "p50", "p99", "max", "compute",
                  "barrier wait", *(("resent",) if resent else ()), "final loss")
    for t in m.trainers:
        st = t.step_time
        stats = (st.mean, st.p50, st.p99, st.max) if st else (None,) * 4
        table.add_row(trainer_name(t.index), str(len(t.losses)),
                      fmt_seconds(t.startup_wait_seconds), *(fmt_seconds(x) for x in stats),
                      fmt_seconds(t.compute_seconds), fmt_seconds(t.barrier_wait_seconds),
                      *((str(t.resends),) if resent else ()),
                      f"{t.final_loss:.4f}" if t.final_loss is not None else "-")
    return table


def pserver_table(m: JobMetrics) -> Table | None:
    """The pservers' load; None: there are none (nccl2, collective)."""
    if not m.pservers:
        return None
    table = Table("pserver", "messages", "bytes in", "bytes out", "optimize", "busy share",
                  "NIC in", "NIC out")
    for p in m.pservers:
        table.add_row(pserver_name(p.index), f"{p.messages:,}", fmt_bytes(p.bytes_in),
                      fmt_bytes(p.bytes_out), fmt_seconds(p.optimize_seconds),
                      _percent(p.busy_share), _percent(p.nic_in_share), _percent(p.nic_out_share))
    return table


def fault_table(m: JobMetrics) -> Table | None:
    """The faults as they happened, and what they did to messages and steps; None: no fault."""
    if not m.faults:
        return None
    table = Table("fault", "what", "from", "until", title="faults")
    for f in m.faults:
        table.add_row(str(f.fault), f.what, fmt_seconds(f.start),
                      fmt_seconds(f.end) if f.end is not None else "the end")
    counts = {name: sum(getattr(link, name) for link in m.links or ())
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


def print_summary(m: JobMetrics, stream: TextIO) -> None:
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
    with atomic_open(path, binary=True) as f:
        figure.savefig(f, dpi=100, format=path.suffix.lstrip(".") or "png")
    return path


def new_figure(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout="tight")
    axes = figure.add_subplot()
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


BAND_ABOVE = 8
"""With more trainers than this, ``step_times.png`` draws their median and 10th-90th percentile
band at each step instead of a line per trainer (a hundred lines say nothing)."""


def write_plots(m: JobMetrics, out: Path) -> list[Path]:
    """``loss.png`` (loss against simulated time, per trainer) and ``step_times.png`` (each
    step's simulated time, per trainer, or their median and band), with the Agg backend."""
    return [save_png(loss_figure(m), out / "loss.png"),
            save_png(step_figure(m), out / "step_times.png")]


def loss_figure(m: JobMetrics) -> Any:
    """Each trainer's loss against simulated time; where no loss was computed (timing mode),
    or no step taken, a figure that says so."""
    figure, axes = new_figure(f"{m.job.scenario}: loss", "simulated time (ms)", "loss")
    losses = [x for t in m.trainers for x in t.losses]
    if not any(np.isfinite(losses)):
        say = "no loss recorded (timing mode)" if losses else "no step taken"
        axes.text(0.5, 0.5, say, transform=axes.transAxes, ha="center", va="center")
        return figure
    for t in m.trainers:
        axes.plot(np.asarray(t.step_ends or ()) * 1e3, t.losses, label=trainer_name(t.index),
                  linewidth=1)
    if len(m.trainers) <= 16:
        axes.legend()
    return figure


def step_figure(m: JobMetrics) -> Any:
    """Each trainer's step times against its steps; above `BAND_ABOVE` trainers, their median
    and 10th-90th percentile band."""
    figure, axes = new_figure(f"{m.job.scenario}: step times", "step",
                              "simulated step time (ms)")
    if len(m.trainers) > BAND_ABOVE:
        _band(axes, [t.step_times for t in m.trainers])
        return figure
    for t in m.trainers:
        axes.plot(np.arange(1, len(t.step_times) + 1), np.asarray(t.step_times) * 1e3,
                  label=trainer_name(t.index), linewidth=1)
    if m.trainers:
        axes.legend()
    return figure


def _band(axes: Any, series: list[list[float]]) -> None:
    """The median of `series` (each trainer's step times) at each step, and the band from
    the 10th to the 90th percentile, over the trainers that took that step."""
    longest = max(map(len, series), default=0)
    if not longest:
        return
    grid = np.full((len(series), longest), np.nan)
    for row, times in zip(grid, series):
        row[:len(times)] = times
    low, mid, high = np.nanpercentile(grid * 1e3, [10, 50, 90], axis=0)
    steps = np.arange(1, longest + 1)
    axes.fill_between(steps, low, high, alpha=0.3,
                      label=f"10th to 90th percentile of {len(series)} trainers")
    axes.plot(steps, mid, linewidth=1, label=f"median of {len(series)} trainers")
    axes.legend()
