"""Does a `sim sweep` priced by one calibration rank a sweep's points as real runs do?

A what-if sweep is read for its order more than its numbers: which of these clusters steps
fastest. This benchmark calibrates this machine once (`runtime calibrate`, or ``--machine
FILE``), runs ``sim sweep --vary cluster.trainers=1..6 --vary cluster.pservers=1..3`` of one
job priced from it (every node on one host of this machine's cores), and runs each of the 18
points for real (`runtime up`, ``--repeat`` times, CurveZMQ, the default protocol), none of
them calibrated or profiled. Per point: the real mean step time (min / median / max over the
runs) against the simulated one (the sweep's ``step_time_mean``: every step of every trainer,
as the real figure: each trainer's first step, the wait for the job to form, left out).

Ranking: two points are in the same order when the simulated times order them as the real
medians do; a pair whose real runs' ranges overlap is a tie (the machine cannot tell them
apart) and counts as agreeing. The summary gives the pairs out of order, Kendall's tau of the
simulated against the real medians, and the median and worst |error|. ``--plot FILE`` draws
real (with its min-max range) and simulated step time against trainers, a line per pserver
count (the ``plot`` extra).

Run: python benchmarks/sweep_ranking.py [--repeat 3] [--machine FILE] [--steps N] [--plot F]
[--trainers 1..6] [--pservers 1..3]  (counts as sim sweep --vary takes them: 1..6 or 1,2,4)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from sim.sweep import Axis, SweepError

TRAINERS = range(1, 7)
PSERVERS = range(1, 4)
"""The sweep's points by default: ``--trainers`` and ``--pservers`` (``A..B``) change them."""
SCENARIO = """name: ranking
seed: 3
model: {{name: mlp, sizes: [64, 256, 10], optimizer: {{type: sgd, learning_rate: 0.05}}}}
data: {{name: digits, batch_size: 32}}
cluster: {{pservers: 1, trainers: 1}}
transpiler: {{mode: sync}}
train: {{steps: {steps}, deadline: 600s, log_every: 1000}}
"""


@dataclass(frozen=True)
class Point:
    pservers: int
    trainers: int
    real: tuple[float, ...]
    """Mean step time of each real run."""
    simulated: float

    @property
    def median(self) -> float:
        return statistics.median(self.real)

    @property
    def error(self) -> float:
        return self.simulated / self.median - 1

    def tied(self, other: Point) -> bool:
        """Whether the real runs of the two overlap (the machine cannot order them)."""
        return min(self.real) <= max(other.real) and min(other.real) <= max(self.real)


def _run(command: list[str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}; see {log}:\n"
                 + "\n".join(log.read_text().splitlines()[-15:]))


def mean_step(metrics: dict[str, Any]) -> float:
    """The run record's mean step over every trainer (``job.step_time_all``: each trainer's
    first step, the wait for the job to form, left out), as the sweep's ``step_time_mean``."""
    return float(metrics["job"]["step_time_all"]["mean"])


def counts(path: str) -> Callable[[str], tuple[int, ...]]:
    """An argument parser of `path`'s counts in `sim sweep --vary`'s own syntax (``1..6``,
    ``1,2,4``), so the real runs take the points the sweep does."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = Axis.parse(f"{path}={text}").values
            numbers = tuple(int(value) for value in values)
        except (SweepError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if min(numbers) < 1:
            raise argparse.ArgumentTypeError(f"{path} counts must be >= 1, got {text!r}")
        return numbers
    return parse


def real_runs(scenario: Path, work: Path, repeat: int, pservers: Sequence[int] = PSERVERS,
              trainers: Sequence[int] = TRAINERS) -> dict[tuple[int, int], list[float]]:
    """Each point's mean step time in `repeat` rounds of real runs (a round runs every point
    once, so that a drift of the machine's speed spreads over all points alike)."""
    runtime = [sys.executable, "-m", "runtime.cli", "up", str(scenario)]
    times: dict[tuple[int, int], list[float]] = {}
    for r in range(repeat):
        for p, t in itertools.product(pservers, trainers):
            out = work / f"up-{p}x{t}-{r}"
            _run([*runtime, "--set", f"cluster.pservers={p}", "--set", f"cluster.trainers={t}",
                  "--out", str(out)], work / f"up-{p}x{t}-{r}.log")
            times.setdefault((p, t), []).append(
                mean_step(json.loads((out / "metrics.json").read_text())))
        print(f"real runs: round {r + 1} of {repeat} done", flush=True)
    return times


def simulated(scenario: Path, machine: Path, work: Path, pservers: Sequence[int] = PSERVERS,
              trainers: Sequence[int] = TRAINERS) -> dict[tuple[int, int], float]:
    """The sweep's mean step time per point, priced from `machine`."""
    cores = json.loads(machine.read_text())["meta"]["machine"]["cores"]
    out = work / "sweep"
    _run([sys.executable, "-m", "sim.cli", "sweep", str(scenario), "--no-plots", "--force",
          "--set", f"compute={{model: calibrated, path: {machine}}}",
          "--set", f"cluster.hosts=[{{nodes: '*', cores: {cores}}}]",
          "--vary", f"cluster.pservers={','.join(map(str, pservers))}",
          "--vary", f"cluster.trainers={','.join(map(str, trainers))}", "--out", str(out)],
         work / "sweep.log")
    record = json.loads((out / "sweep.json").read_text())
    return {(int(p["settings"]["cluster.pservers"]), int(p["settings"]["cluster.trainers"])):
            p["step_time_mean"] for p in record["points"]}


def out_of_order(points: list[Point]) -> list[tuple[Point, Point]]:
    """The pairs the real runs order (no tie) and the simulation orders the other way."""
    return [(a, b) for a, b in itertools.combinations(points, 2)
            if not a.tied(b) and (a.median < b.median) != (a.simulated < b.simulated)]


def kendall_tau(points: list[Point]) -> float:
    """Kendall's tau-a of the simulated times against the real medians."""
    pairs = list(itertools.combinations(points, 2))
    score = sum(1 if (a.median - b.median) * (a.simulated - b.simulated) > 0 else -1
                for a, b in pairs)
    return score / len(pairs) if pairs else 1.0


def plot(points: list[Point], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for p, colour in zip(sorted({q.pservers for q in points}), colours):
        row = sorted((q for q in points if q.pservers == p), key=lambda q: q.trainers)
        xs = [q.trainers for q in row]
        ax.errorbar(xs, [q.median * 1e3 for q in row], fmt="o-", color=colour, capsize=3,
                    yerr=[[(q.median - min(q.real)) * 1e3 for q in row],
                          [(max(q.real) - q.median) * 1e3 for q in row]],
                    label=f"{p} pserver(s), real (median, min-max)")
        ax.plot(xs, [q.simulated * 1e3 for q in row], "x--", color=colour,
                label=f"{p} pserver(s), simulated")
    ax.set_xlabel("trainers")
    ax.set_ylabel("mean step time (ms)")
    ax.set_title("sim sweep from one calibration vs runtime up, same machine")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="real runs per point (3)")
    parser.add_argument("--machine", type=Path, help="this machine file instead of a new "
                        "calibration")
    parser.add_argument("--steps", type=int, default=100, help="steps per run (100)")
    parser.add_argument("--plot", type=Path, help="write the figure here (PNG)")
    parser.add_argument("--keep", type=Path, help="keep scenarios, records and logs here")
    parser.add_argument("--trainers", type=counts("cluster.trainers"), default=TRAINERS,
                        help="trainer counts, as sim sweep --vary takes them (1..6)")
    parser.add_argument("--pservers", type=counts("cluster.pservers"), default=PSERVERS,
                        help="pserver counts, as sim sweep --vary takes them (1..3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pslab-ranking-") as tmp:
        work = (args.keep or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        scenario = work / "ranking.yaml"
        scenario.write_text(SCENARIO.format(steps=args.steps))
        machine = args.machine.resolve() if args.machine else work / "machine.json"
        if args.machine is None:
            print("calibrating this machine (runtime calibrate)", flush=True)
            _run([sys.executable, "-m", "runtime.cli", "calibrate", "-o", str(machine)],
                 work / "calibrate.log")
        sim = simulated(scenario, machine, work, args.pservers, args.trainers)
        real = real_runs(scenario, work, args.repeat, args.pservers, args.trainers)
    points = [Point(p, t, tuple(real[p, t]), sim[p, t])
              for p, t in itertools.product(args.pservers, args.trainers)]
    print(f"{len(points)} points on {os.cpu_count()} cores, {args.repeat} real run(s) each")
    print(f"{'point':<8} {'real mean step ms (min/med/max)':>31}  {'simulated':>9} {'error':>7}")
    for q in points:
        print(f"{q.pservers}x{q.trainers:<6} {min(q.real) * 1e3:9.2f} {q.median * 1e3:9.2f} "
              f"{max(q.real) * 1e3:9.2f}  {q.simulated * 1e3:9.2f} {q.error:+7.1%}")
    wrong = out_of_order(points)
    for a, b in wrong:
        print(f"  out of order: {a.pservers}x{a.trainers} and {b.pservers}x{b.trainers}")
    errors = [abs(q.error) for q in points]
    print(f"summary: {len(points)} points, {len(wrong)} pair(s) out of order of "
          f"{len(points) * (len(points) - 1) // 2} (ties within the real runs' range agree), "
          f"Kendall tau {kendall_tau(points):.3f}, median |error| "
          f"{statistics.median(errors):.1%}, worst {max(errors):.1%}")
    if args.plot:
        plot(points, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
