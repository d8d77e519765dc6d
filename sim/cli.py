"""The `sim` command: scenarios run by the real runtime on the virtual clock (docs/architecture.md).

``sim run SCENARIO`` simulates the scenario (`sim.simulate`) and shows its progress over the
simulated steps: a bar on a terminal, otherwise a line per trainer every ``train.log_every``
steps. Then it prints the summary (`sim.report`), writes ``OUT/metrics.json``, ``OUT/trace.json``
(unless ``--no-trace``) and ``OUT/loss.png``, ``OUT/step_times.png`` (unless ``--no-plots``, or
matplotlib is missing), and ends with a line saying OK or why not. A scenario that sets
``outputs.trace`` or ``outputs.plots`` to false turns those off too. OUT is ``--out``, else
``<outputs.dir or out/NAME>/sim``, beside what `runtime up` writes; it is made and locked before
the simulation starts (`runtime.config.outdir`): one that cannot be written, or that another run
holds, ends the command at once with one line naming it (and the holder). Exit status: 0 when
every expectation holds, 1 when one fails (named) or the simulation cannot finish (deadlock,
deadline), 2 for a bad command line or scenario, or an output folder that cannot be used.

``sim run SCENARIO --check-determinism`` then simulates the scenario a second time with the same
seed (`sim.determinism`) and compares what both runs write, metrics.json and trace.json, byte for
byte: it prints a line saying they are equal, or ends with ``FAILED: not deterministic:`` naming
the first differing file, byte (line, column) and JSON key, and exits 1.

``sim sweep SCENARIO --vary path=v1,v2,... [--vary ...] [--loss-target X]`` simulates every
combination (`sim.sweep`), prints a line per point as it finishes and then a table of outcomes
(with ``--loss-target``, the time each took to reach that loss), and writes ``OUT/sweep.json``
and ``OUT/sweep.png`` (OUT: ``--out``, else ``<outputs.dir or out/NAME>/sweep``). Every point's
scenario is built first: one that cannot be is exit status 2, naming its ``--vary`` values and
the field, before anything runs. ``--jobs N`` runs N points at a time in worker processes (0 or
``auto``: one per CPU), ``--ray ADDRESS`` runs them as tasks on a Ray cluster
(`sim.sweep_runners`); either way sweep.json and the table are a sequential sweep's, byte for
byte. Each finished point is saved in ``OUT/sweep.points.jsonl`` at once (`sim.sweep_journal`):
``--resume`` reruns an interrupted sweep's missing points only. A sweep refuses to overwrite an
earlier one's results in OUT (exit status 2) unless ``--force`` or ``--resume`` says what to do
with them (``--resume`` continues only a sweep whose journal is there: a sweep.json without one is
refused too). Exit status 0 when every point ran and met its expectations, 1 when some point could
not run, missed an expectation (the table says which) or the runner failed, 130 when
interrupted (the finished points stay saved).

Wall-clock figures (how long the simulation took, simulated messages per second) are printed,
never written to the files, so that the same scenario and seed give the same bytes.

Errors (`runtime.config.commandline`): a bad flag, scenario, ``--set`` or ``--vary`` is one line,
``sim run: error: <where>: <what>``, exit status 2, no traceback (``--debug`` adds it); an
unexpected exception is one line saying it is an internal error, exit status 70.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn, Protocol, Sequence, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from runtime.config import expect
from runtime.config.commandline import CommandParser, add_debug, run_command
from runtime.config.metrics import JobMetrics, write_record
from runtime.config.nodes import trainer_name
from runtime.config.outdir import OutputDirError, claim_output
from runtime.config.scenario import Scenario, ScenarioError, load_scenario
from runtime.config.version import version
from runtime.services.job import check_job
from runtime.services.progress import ProgressSummary
from runtime.services.progress import Progress as StepReport

from .cost import ComputeConfigError
from .determinism import Difference, first_difference
from .network import NetworkConfigError
from .report import collect, console_for, fmt_seconds, plots_available, print_summary, write_plots
from .simulate import SimResult, cyclic_gc_paused, simulate
from .sweep import (Axis, Runner, Settings, SweepError, SweepPoint, SweepRecord, SweepSpec,
                    check_points, in_this_process, plan, plot_sweep, run_sweep, sweep_table)
from .sweep_journal import JOURNAL, Journal, JournalMismatch, done_by_index, load_points
from .sweep_runners import RunnerError, in_processes, on_ray

OUTPUTS = ("metrics.json", "trace.json", "loss.png", "step_times.png")
"""What `sim run` writes; an earlier run's copies are removed first."""
NO_MATPLOTLIB = "plots: skipped, matplotlib is not installed (pip install 'pslab[plot]')"


# -- progress -------------------------------------------------------------------------------------

class StepProgress(Protocol):
    def step(self, trainer: int, step: int, loss: float, seconds: float, now: float) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """For a pipe or a file: a line for all the trainers at each tenth of the steps or every
    few seconds, with the time left (`ProgressSummary`); with at most `PER_TRAINER` trainers
    also a line per trainer every `every` steps and at its last step."""

    def __init__(self, stream: TextIO, steps: int, every: int, trainers: int = 1) -> None:
        self.stream, self.steps, self.every = stream, steps, every
        self.summary = ProgressSummary(trainers, steps)

    def step(self, trainer: int, step: int, loss: float, seconds: float, now: float) -> None:
        done = step + 1
        if self.summary.each_trainer and (done % self.every == 0 or done == self.steps):
            print(f"{trainer_name(trainer):<12} step {done}/{self.steps}  loss {loss:.4f}  "
                  f"step time {fmt_seconds(seconds)}  at {fmt_seconds(now)} simulated",
                  file=self.stream, flush=True)
        line = self.summary.update(trainer, StepReport(done, self.steps, loss, seconds))
        if line is not None:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        pass


class BarProgress:
    """A rich progress bar over every trainer's steps, with the simulated clock and a loss."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self.bar = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[status]}"), console=Console(file=stream))
        self.task = self.bar.add_task("steps", total=total, status="")
        self.bar.start()

    def step(self, trainer: int, step: int, loss: float, seconds: float, now: float) -> None:
        self.bar.update(self.task, advance=1, status=f"t={fmt_seconds(now)}  "
                        f"{trainer_name(trainer)} loss {loss:.4f}")

    def close(self) -> None:
        self.bar.stop()


def make_progress(stream: TextIO, scenario: Scenario) -> StepProgress:
    steps = scenario.train.steps
    if stream.isatty():
        return BarProgress(stream, steps * scenario.cluster.trainers)
    return PlainProgress(stream, steps, scenario.train.log_every, scenario.cluster.trainers)


# -- sim run --------------------------------------------------------------------------------------

def _overrides(args: argparse.Namespace) -> list[str]:
    return list(args.set) + ([f"seed={args.seed}"] if args.seed is not None else [])


def _load(args: argparse.Namespace) -> Scenario:
    parser: argparse.ArgumentParser = args.parser
    try:
        scenario = load_scenario(args.scenario, _overrides(args))
        check_job(scenario)
        return scenario
    except ScenarioError as err:
        parser.error(str(err))


def _out_dir(args: argparse.Namespace, scenario: Scenario, sub: str) -> Path:
    if args.out:
        return Path(args.out)
    return Path(scenario.outputs.dir or Path("out") / scenario.name) / sub


def _wanted(scenario: Scenario, output: str, refused: bool) -> bool:
    """An output is written unless the command line refuses it or the scenario sets it false."""
    outputs = scenario.outputs
    return not refused and (output not in outputs.model_fields_set or getattr(outputs, output))


def _simulate(args: argparse.Namespace, scenario: Scenario, stream: TextIO) -> SimResult:
    progress = make_progress(stream, scenario)
    trace = _wanted(scenario, "trace", args.no_trace)
    try:
        return simulate(scenario, base_dir=Path(args.scenario).parent, on_step=progress.step,
                        trace_messages=trace, trace_spans=trace)
    finally:
        progress.close()


def _write_data(args: argparse.Namespace, result: SimResult, metrics: JobMetrics,
                out: Path) -> list[str]:
    """Write metrics.json and, unless refused, trace.json; the names written."""
    scenario = result.scenario
    write_record(out / "metrics.json", metrics)
    if not _wanted(scenario, "trace", args.no_trace):
        return ["metrics.json"]
    result.trace.write(out / "trace.json", {"scenario": scenario.name, "seed": scenario.seed})
    return ["metrics.json", "trace.json"]


def _write_outputs(args: argparse.Namespace, result: SimResult, metrics: JobMetrics,
                   out: Path) -> list[str]:
    """Write the files; the lines that say where they are."""
    scenario = result.scenario
    lines = [f"metrics: {out / 'metrics.json'}"]
    if "trace.json" in _write_data(args, result, metrics, out):
        lines.append(f"trace: {out / 'trace.json'} (open in ui.perfetto.dev)")
    if _wanted(scenario, "plots", args.no_plots):
        if plots_available():
            lines.append("plots: " + ", ".join(str(p) for p in write_plots(metrics, out)))
        else:
            lines.append(NO_MATPLOTLIB)
    return lines


def _run(args: argparse.Namespace, stream: TextIO) -> int:
    scenario = _load(args)
    out = _out_dir(args, scenario, "sim")
    try:
        with claim_output(out):  # checked and held before any work: one run at a time
            return _run_in(args, scenario, out, stream)
    except OutputDirError as err:
        _refuse(args, str(err))


def _run_in(args: argparse.Namespace, scenario: Scenario, out: Path, stream: TextIO) -> int:
    """`sim run` of `scenario` into the output folder `out`, claimed."""
    c, train = scenario.cluster, scenario.train
    print(f"sim run {scenario.name}: {c.pservers} pserver(s) x {c.trainers} trainer(s), "
          f"{scenario.transpiler.mode}, {train.steps} steps of {scenario.data.batch_size}, "
          f"seed {scenario.seed}; output in {out}", file=stream, flush=True)
    start = time.perf_counter()
    try:
        result = _simulate(args, scenario, stream)
    except (NetworkConfigError, ComputeConfigError) as err:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"{args.scenario}: {err}")
    except Exception as exc:  # the run's failure is the command's outcome, reported by name
        verdict = expect.outcome(scenario, exc)
        if args.check_determinism:
            print("determinism: not checked, the simulation stopped before writing its files",
                  file=stream)
        if verdict is not None and verdict.passed:
            print(f"OK: {scenario.name}: {verdict.detail}", file=stream)
            return 0
        print(f"FAILED: the simulation stopped: {type(exc).__name__}: {exc}", file=stream)
        return 1
    wall = time.perf_counter() - start
    with cyclic_gc_paused():
        metrics = collect(result)
        out.mkdir(parents=True, exist_ok=True)
        for name in OUTPUTS:
            (out / name).unlink(missing_ok=True)
        files = _write_outputs(args, result, metrics, out)
        print_summary(metrics, stream)
    for line in files:
        print(line, file=stream)
    print(f"wall {wall:.2f}s: {result.messages:,} messages simulated, "
          f"{result.messages / wall:,.0f} simulated messages/s", file=stream)
    difference = _check_determinism(args, scenario, out, stream) if args.check_determinism \
        else None
    s = metrics.job
    if difference is not None:
        print(f"FAILED: not deterministic: {difference}", file=stream, flush=True)
        return 1
    print(f"OK: {s.scenario}" if s.success else f"FAILED: {s.reason}", file=stream, flush=True)
    return 0 if s.success else 1


def _check_determinism(args: argparse.Namespace, scenario: Scenario, out: Path,
                       stream: TextIO) -> Difference | None:
    """Simulate `scenario` again with the same seed and compare the files it writes with the
    first run's in `out`, byte for byte; the first difference, or None (and a line saying so)."""
    print(f"determinism: simulating {scenario.name} again with seed {scenario.seed}",
          file=stream, flush=True)
    with tempfile.TemporaryDirectory(prefix="pslab-sim-determinism-") as tmp:
        again = Path(tmp)
        result = _simulate(args, scenario, io.StringIO())
        with cyclic_gc_paused():
            names = _write_data(args, result, collect(result), again)
        for name in names:
            difference = first_difference(name, (out / name).read_bytes(),
                                          (again / name).read_bytes())
            if difference is not None:
                return difference
        sizes = ", ".join(f"{name} ({(again / name).stat().st_size:,} bytes)" for name in names)
    print(f"determinism: OK, both runs wrote the same {sizes}", file=stream)
    return None


# -- sim sweep ------------------------------------------------------------------------------------

def _axes(args: argparse.Namespace) -> list[Axis]:
    parser: argparse.ArgumentParser = args.parser
    try:
        axes = [Axis.parse(text) for text in args.vary]
    except SweepError as err:
        parser.error(str(err))
    paths = [axis.path for axis in axes]
    repeated = sorted({p for p in paths if paths.count(p) > 1})
    if repeated:
        parser.error(f"--vary: {', '.join(repeated)} varied more than once")
    return axes


def _refuse(args: argparse.Namespace, message: str) -> NoReturn:
    """End the command with exit status 2 and one line, without the usage text: the command
    line is well formed, what it asks for is not possible."""
    parser: argparse.ArgumentParser = args.parser
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _runner(args: argparse.Namespace) -> tuple[Runner, str]:
    """The runner of the points, and how the header line says it runs them."""
    try:
        if args.ray:
            return on_ray(args.ray), f"; as Ray tasks ({args.ray})"
    except RunnerError as err:
        _refuse(args, str(err))
    jobs = args.jobs or os.cpu_count() or 1
    if jobs == 1:
        return in_this_process, ""
    return in_processes(jobs), f"; {jobs} worker processes"


EARLIER = ("sweep.json", JOURNAL)
"""What an earlier sweep left in the output folder that a new one would overwrite."""


def _refuse_to_overwrite(args: argparse.Namespace, out: Path) -> None:
    """Refuse to overwrite an earlier sweep's results unless ``--force`` (overwrite them) or
    ``--resume`` (keep the points its journal saved) says what to do with them."""
    earlier = [out / name for name in EARLIER if (out / name).exists()]
    if earlier and not (args.force or args.resume):
        _refuse(args, f"{earlier[0]} exists, from an earlier sweep; pass --resume to run only "
                      "the points it lacks, or --force to overwrite it")
    if args.resume and earlier and not (out / JOURNAL).exists():  # whose sweep.json, then?
        _refuse(args, f"{earlier[0]} exists but {JOURNAL}, which --resume continues, does not; "
                      "pass --force to overwrite it, or --out another folder")


def _saved_points(args: argparse.Namespace, spec: SweepSpec, out: Path) -> list[SweepPoint]:
    """With ``--resume``, the points the journal holds; with ``--force``, none, and the
    earlier sweep's files are removed."""
    if args.force:
        for name in (*EARLIER, "sweep.png"):
            (out / name).unlink(missing_ok=True)
    if not args.resume:
        return []
    try:
        return load_points(out / JOURNAL, spec.key)
    except JournalMismatch as err:
        _refuse(args, str(err))


def _checked_spec(args: argparse.Namespace, scenario: Scenario,
                  points: list[Settings]) -> SweepSpec:
    """What the points share, once every point's scenario is known to build."""
    target = args.loss_target if args.loss_target is not None \
        else scenario.expect.final_loss_below
    spec = SweepSpec.read(Path(args.scenario), _overrides(args), target)
    try:
        check_points(spec, points)
    except SweepError as err:
        _refuse(args, str(err))
    return spec


def _sweep(args: argparse.Namespace, stream: TextIO) -> int:
    axes = _axes(args)
    scenario = _load(args)
    runner, how = _runner(args)
    out = _out_dir(args, scenario, "sweep")
    _refuse_to_overwrite(args, out)
    points = plan(axes)
    spec = _checked_spec(args, scenario, points)
    saved = _saved_points(args, spec, out)
    done = done_by_index(points, saved)
    resumed = f" ({len(done)} done, saved in {out / JOURNAL})" if args.resume else ""
    print(f"sim sweep {scenario.name}: {len(points)} point(s){resumed} over "
          f"{', '.join(a.path for a in axes)}; output in {out}{how}", file=stream, flush=True)
    with Journal(out / JOURNAL, spec.key, saved) as journal:
        progress = SweepProgress(stream, len(points), len(done), journal, parallel=bool(how))
        try:
            record = run_sweep(spec, scenario.name, axes, runner, done, progress.point)
        except (KeyboardInterrupt, RunnerError) as err:
            return progress.stopped(err)
    return _sweep_outputs(args, record, out, stream)


class SweepProgress:
    """Saves each finished point in the journal and prints a line for it: ``[k/N]`` (``[k/N
    done]`` when points run in parallel, so finish out of order), its settings and outcome."""

    def __init__(self, stream: TextIO, total: int, done: int, journal: Journal,
                 parallel: bool) -> None:
        self.stream, self.total, self.done, self.journal = stream, total, done, journal
        self.suffix = " done" if parallel else ""

    def point(self, index: int, point: SweepPoint) -> None:
        self.journal.add(point)
        self.done += 1
        settings = ", ".join(f"{k}={v}" for k, v in point.settings.items())
        print(f"[{self.done}/{self.total}{self.suffix}] {settings}: {point.outcome}",
              file=self.stream, flush=True)

    def stopped(self, error: BaseException) -> int:
        """The last line of a sweep that stopped before its end, and the exit status: 130 for
        Ctrl-C, 1 when the runner failed."""
        why = "interrupted" if isinstance(error, KeyboardInterrupt) else f"FAILED: {error}"
        print(f"{why}: {self.done} of {self.total} point(s) saved in {self.journal.path}; "
              "--resume runs the others", file=self.stream, flush=True)
        return 130 if isinstance(error, KeyboardInterrupt) else 1


def _sweep_outputs(args: argparse.Namespace, record: SweepRecord, out: Path,
                   stream: TextIO) -> int:
    """Write sweep.json and the plot, print the table; the exit status."""
    write_record(out / "sweep.json", record)
    console_for(stream).print(sweep_table(record))
    print(f"sweep: {out / 'sweep.json'}", file=stream)
    _plot_sweep(args, record, out, stream)
    errors = sum(p.error is not None for p in record.points)
    passed = sum(p.passed for p in record.points)
    total = len(record.points)
    print(f"{passed} of {total} point(s) met every expectation", file=stream)
    if errors:
        print(f"FAILED: {errors} of {total} point(s) could not run", file=stream, flush=True)
    elif passed < total:
        print(f"FAILED: {total - passed} of {total} point(s) missed their expectations (the "
              "table says which)", file=stream, flush=True)
    else:
        print(f"OK: {total} point(s) simulated", file=stream, flush=True)
    return 0 if passed == total else 1


def _plot_sweep(args: argparse.Namespace, record: SweepRecord, out: Path, stream: TextIO) -> None:
    (out / "sweep.png").unlink(missing_ok=True)
    if args.no_plots:
        return
    if not plots_available():
        print(NO_MATPLOTLIB, file=stream)
        return
    print(f"plot: {plot_sweep(record, out / 'sweep.png')}", file=stream)


# -- parser ---------------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--seed", type=int, help="seed of the run (default: the scenario's)")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a scenario field, e.g. --set cluster.trainers=8 (repeatable)")
    p.add_argument("--out", help="output folder (default: <outputs.dir or out/NAME>/sim or /sweep)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")


def _jobs(text: str) -> int:
    """``--jobs``: a count of processes, 0 or ``auto`` for one per CPU (0 here)."""
    if text == "auto":
        return 0
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of processes or auto, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="sim", description="Simulate pslab scenarios: the real runtime on a virtual clock "
                                "over a simulated network.")
    parser.add_argument("--version", action="version", version=f"%(prog)s (pslab) {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = subparsers.add_parser(
        "run", help="simulate a scenario",
        description="Simulate a scenario; print the summary; write metrics.json, trace.json "
                    "and plots; exit 1 if an expectation fails.")
    _common(run)
    run.add_argument("--no-trace", action="store_true", help="write no trace.json")
    run.add_argument("--check-determinism", action="store_true",
                     help="simulate the scenario a second time with the same seed and fail, "
                          "naming the first difference, unless both runs write the same "
                          "metrics.json and trace.json")
    run.set_defaults(handler=_run, parser=run)
    sweep = subparsers.add_parser(
        "sweep", help="simulate a scenario at every combination of some settings",
        description="Simulate every combination of the --vary values; print and plot the "
                    "outcomes; write sweep.json.")
    _common(sweep)
    sweep.add_argument("--vary", action="append", required=True, metavar="PATH=V1,V2,...",
                       help="a setting and its values, e.g. cluster.pservers=1,2,4 (repeatable)")
    sweep.add_argument("--loss-target", type=float, metavar="LOSS",
                       help="also tabulate the simulated time until trainer 0's mean loss over "
                            "its last 10 steps is at most LOSS (default: the scenario's "
                            "expect.final_loss_below)")
    how = sweep.add_mutually_exclusive_group()
    how.add_argument("--jobs", "-j", type=_jobs, default=1, metavar="N",
                     help="simulate N points at a time, in worker processes (default 1: one "
                          "after the other here; 0 or auto: one per CPU)")
    how.add_argument("--ray", metavar="ADDRESS",
                     help="simulate the points as tasks on a Ray cluster: auto, local (a new "
                          "one on this machine), ray://HOST:PORT or HOST:PORT (the 'ray' extra)")
    again = sweep.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="keep the points an earlier run of this sweep saved in OUT and "
                            "simulate only the others")
    again.add_argument("--force", action="store_true",
                       help="overwrite an earlier sweep's results in OUT")
    sweep.set_defaults(handler=_sweep, parser=sweep)
    add_debug(parser, subparsers)
    return parser


USER_ERRORS = (ScenarioError, SweepError, NetworkConfigError, ComputeConfigError)
"""What a command refuses as a problem of its input: one line, exit status 2
(`runtime.config.commandline`)."""


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_command(args, lambda: int(args.handler(args, out or sys.stdout)), USER_ERRORS)


if __name__ == "__main__":
    sys.exit(main())
