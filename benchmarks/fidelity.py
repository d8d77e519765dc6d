"""How far to trust the simulator: real runs against simulations of the same jobs, same machine.

For every configuration of a matrix (cluster sizes 1x1 to 4x2 oversubscribed on this
machine's cores, sync and async, small and wide models; with ``--netns`` and root, links capped
by tc tbf in network namespaces), in one run of this script:

1. in turn, ``--profile-runs`` times a `runtime profile` run (the job run for real, every node
   measuring its kernels and runtime costs) and ``--repeat`` times a plain `runtime up` run (not
   measuring): the measured median step time (min/median/max over the real runs), samples/s and
   per-pserver bytes. Taking them in turn matters on a machine whose speed drifts (one run can
   take 30% more CPU than another for the same work): a profile is compared with real runs of
   the same minutes, not with runs taken after all the profiles;
2. the simulator runs the job with each profile, every node on one host with this machine's
   cores (``cluster.hosts``), and the same network; the prediction is the median of those
   (the lower of two). The shaped configurations say ``network.burst: 1ms``, the least bucket
   `runtime up --netns` gives tbf, so that the simulator models the bucket the real links have.

It prints a row per configuration and one summary line: the median and worst |error| of the
predicted median step time, and whether the per-pserver bytes matched exactly (the heartbeats,
which depend on wall time, excluded: bytes of everything else).

Each row also gives the share of the machine's CPU time its hypervisor took during the real runs
("steal"): on a shared machine that time slows the real runs in a way nothing here predicts, so
a row with much steal measures the neighbours, not the simulator. For the same reason every real
run is taken between two speed probes, as `runtime calibrate` takes its references
(`runtime.launch.speed.SpeedGuard`): a run taken while the machine ran slow is run again, up
to three times, and a row whose kept run was still slow says "slow xR" (R: how much slower the
probe ran than its best this benchmark).

``--protocol P`` runs and simulates the jobs in protocol P (``train.protocol``: bundled, the
default, compact or per_op); ``--profile-protocol Q`` takes the profile in Q instead: the
cross-protocol check, whether a profile of one protocol predicts another (the runtime's costs
are per message and per step, so it should). ``--cpu`` also prints, per node, the simulated
CPU seconds of its main thread and of its whole process (the I/O thread's added) against a
measured run's in protocol P (the profiling run's, or with ``--profile-protocol`` one more
measured run in P), less what measuring itself cost there (the profile's
``measuring_seconds``): the simulator predicts an unmeasured run.

``--transfer`` asks what users ask: ONE calibration of this machine (`runtime calibrate`, or
``--machine FILE``) predicts every configuration of another matrix (`TRANSFER`: 1 to 6
trainers, 1 to 3 pservers, small, mid and wide MLPs, the CNN, ctr_dnn with a distributed
table, sync, async, half_async, geo, ssp and collective, batches 16 to 256, and with
``--netns`` links shaped to 200 Mbit/s, 1 Gbit/s or 2 ms of added latency), none of which the
calibration ran or profiled; no profile is taken.

Run: python benchmarks/fidelity.py [--repeat 3] [--profile-runs 3] [--only NAME,...] [--netns]
     [--steps N] [--protocol P] [--profile-protocol Q] [--cpu] [--transfer [--machine FILE]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runtime.config.scenario import load_scenario
from runtime.launch.speed import SpeedGuard
from sim.cpu import io_thread
from transpiler.distribute.rpc_plan import DEFAULT_PROTOCOL, PROTOCOLS
from sim.simulate import SimResult, simulate

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Config:
    name: str
    sizes: tuple[int, ...]
    pservers: int
    trainers: int
    mode: str = "sync"
    steps: int = 150
    bandwidth: str | None = None
    """A tbf cap on every node's link (needs --netns)."""
    model: str | None = None
    """The model as YAML flow text (default: the MLP of `sizes`, SGD)."""
    batch: int = 32
    transpiler: str = ""
    """More transpiler fields, as YAML flow text (``staleness: 2``)."""
    latency: str | None = None
    """Added latency on every link (needs --netns)."""

    @property
    def shaped(self) -> bool:
        return self.bandwidth is not None or self.latency is not None

    @property
    def warmup(self) -> int:
        """Steps that may wait for the job to form, left out of samples/s: a trainer's first;
        in ssp, its first staleness + 1, which may each run ahead of a trainer not yet started."""
        fields = yaml.safe_load(f"{{{self.transpiler}}}") or {}
        return 1 + int(fields.get("staleness", 0)) if self.mode == "ssp" else 1

    def scenario(self, steps: int | None, protocol: str | None = None) -> str:
        link = {k: v for k, v in (("bandwidth", self.bandwidth), ("latency", self.latency))
                if v is not None}
        network = "" if not link else \
            f"network: {{default: {{{', '.join(f'{k}: {v}' for k, v in link.items())}}}, " \
            "burst: 1ms}\n"
        speaks = "" if protocol is None else f", protocol: {protocol}"
        model = self.model or (f"{{name: mlp, sizes: {list(self.sizes)}, "
                               "optimizer: {type: sgd, learning_rate: 0.05}}")
        data = "name: digits, " if self.model is None else ""
        extra = f", {self.transpiler}" if self.transpiler else ""
        # shaped: in namespaces (--netns), whose nodes talk CurveZMQ; said here for the simulator
        secured = ", security: curve" if self.shaped else ""
        return (f"name: fidelity-{self.name}\nseed: 3\nmodel: {model}\n"
                f"data: {{{data}batch_size: {self.batch}}}\n"
                f"cluster: {{pservers: {self.pservers}, trainers: {self.trainers}{secured}}}\n"
                f"transpiler: {{mode: {self.mode}{extra}}}\n"
                f"train: {{steps: {steps or self.steps}, deadline: 600s, "
                f"log_every: 1000{speaks}}}\n" + network)


SMALL, MID, WIDE = (64, 256, 10), (64, 512, 128, 10), (64, 1024, 1024, 10)
CONFIGS = [
    Config("1x1-small", SMALL, 1, 1),
    Config("2x2-quickstart", (64, 128, 10), 2, 2),
    Config("2x3-mid", MID, 2, 3),
    Config("2x4-oversubscribed", (64, 128, 10), 2, 4),
    Config("1x2-wide", WIDE, 1, 2, steps=60),
    Config("2x2-async", (64, 128, 10), 2, 2, mode="async"),
    Config("2x4-async", (64, 128, 10), 2, 4, mode="async"),
    Config("2x2-half-async", MID, 2, 2, mode="half_async"),
    Config("2x2-200Mbit", MID, 2, 2, steps=60, bandwidth="200Mbit/s"),
    Config("2x2-1Gbit", MID, 2, 2, steps=60, bandwidth="1Gbit/s"),
]

CNN = "{name: cnn, image: 16, channels: [8, 16], optimizer: {type: sgd, learning_rate: 0.05}}"
CTR = ("{name: ctr_dnn, vocab: 5000, embed_dim: 16, hidden: [64, 32], is_distributed: true, "
       "optimizer: {type: sgd, learning_rate: 0.05}}")
TRANSFER = [
    Config("t1x1-small-b16", SMALL, 1, 1, batch=16),
    Config("t1x3-small", SMALL, 1, 3),
    Config("t3x2-mid", MID, 3, 2),
    Config("t2x5-small-b64", (64, 128, 10), 2, 5, batch=64),
    Config("t1x6-small", (64, 128, 10), 1, 6, steps=100),
    Config("t2x2-wide-b128", WIDE, 2, 2, steps=40, batch=128),
    Config("t1x2-mid-b256", MID, 1, 2, steps=60, batch=256),
    Config("t2x2-cnn", (), 2, 2, steps=60, model=CNN),
    Config("t2x2-ctr-table", (), 2, 2, steps=80, model=CTR, batch=64),
    Config("t2x3-async-mid", MID, 2, 3, mode="async"),
    Config("t2x2-half-async-wide", WIDE, 2, 2, mode="half_async", steps=40),
    Config("t2x4-geo", (64, 128, 10), 2, 4, mode="geo", transpiler="geo_push_every: 5"),
    Config("t2x4-ssp", (64, 128, 10), 2, 4, mode="ssp", transpiler="staleness: 2"),
    Config("t3-collective", MID, 2, 3, mode="collective",
           transpiler="collective_mode: grad_allreduce"),
    Config("t3x3-200Mbit", MID, 3, 3, steps=60, bandwidth="200Mbit/s"),
    Config("t2x2-1Gbit-b128", WIDE, 2, 2, steps=30, batch=128, bandwidth="1Gbit/s"),
    Config("t2x2-latency-2ms", MID, 2, 2, steps=60, latency="2ms"),
]
"""The transfer matrix (``--transfer``): jobs none of which the calibration ran, predicted
from the one machine file."""


@dataclass
class Outcome:
    config: Config
    measured: list[float]
    """Median step time of each real run."""
    predicted: float
    samples_measured: float
    samples_predicted: float
    bytes_measured: list[int]
    bytes_predicted: list[int]
    steal: float
    """Share of the machine's CPU time the hypervisor took during the real runs."""
    slow: float | None = None
    """How much slower than its best the speed probe ran around the slowest real run kept
    (None: every real run was taken at speed)."""
    cpu: list[str] = field(default_factory=list)
    """With --cpu: a line per node, simulated CPU against measured."""

    @property
    def error(self) -> float:
        return self.predicted / statistics.median(self.measured) - 1.0


def _steal() -> tuple[int, int]:
    """(stolen, total) jiffies of this machine's CPUs so far (/proc/stat): time the
    hypervisor gave other guests, which no model of this machine can predict."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def _run(command: list[str], log: Path) -> None:
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}); see {log}")


def _median_step(metrics: dict[str, Any]) -> float:
    return statistics.median(t for trainer in metrics["trainers"] for t in trainer["step_times"])


def samples_per_second(step_times: list[list[float]], batch: int, warmup: int = 1) -> float:
    """Samples a second over the steps after each trainer's first `warmup` (which may wait for
    the job to form), the slowest trainer's time: the same figure for real runs and simulated."""
    after = [times[warmup:] for times in step_times if len(times) > warmup]
    seconds = max((sum(times) for times in after), default=0.0)
    return sum(len(times) for times in after) * batch / seconds if seconds else 0.0


def _pserver_bytes(pservers: list[dict[str, Any]]) -> list[int]:
    return [p["bytes_in"] + p["bytes_out"] - p["heartbeat_bytes"] for p in pservers]


def run_config(config: Config, work: Path, repeat: int, steps: int | None,
               netns: bool, profile_runs: int, protocol: str | None = None,
               profile_protocol: str | None = None, cpu: bool = False,
               machine: Path | None = None, guard: SpeedGuard | None = None) -> Outcome:
    """Run `config` for real `repeat` times and predict it: from `profile_runs` profiles of
    itself taken in turn with the real runs, or (`machine`) from that machine file alone.
    Each real run is taken again while `guard` finds the machine slow."""
    guard = guard or SpeedGuard()
    scenario = work / f"{config.name}.yaml"
    scenario.write_text(config.scenario(steps, protocol))
    profiled = scenario
    if profile_protocol is not None and profile_protocol != protocol:
        profiled = work / f"{config.name}.{profile_protocol}.yaml"
        profiled.write_text(config.scenario(steps, profile_protocol))
    flags = ["--netns"] if netns and config.shaped else []
    runtime = [sys.executable, "-m", "runtime.cli"]
    measured, samples, real_bytes, predictions = [], [], [], []
    slow: float | None = None
    stolen, total = _steal()
    profiles = 0 if machine is not None else profile_runs  # a machine file predicts once, below
    for r in range(max(repeat, profiles)):  # a profile, then a real run, in turn
        if r < profiles:
            profile = work / f"{config.name}.profile{r}.json"
            _run([*runtime, "profile", str(profiled), "-o", str(profile), "--out",
                  str(work / f"{config.name}-profile{r}")] + flags,
                 work / f"{config.name}.profile{r}.log")
            predictions.append((_simulate(scenario, profile), profile))
        if r < repeat:
            def up(attempt: int, r: int = r) -> Path:
                again = f"-again{attempt}" if attempt else ""
                out = work / f"{config.name}-up{r}{again}"
                _run([*runtime, "up", str(scenario), "--out", str(out)] + flags,
                     work / f"{config.name}.up{r}{again}.log")
                return out

            out, slowness = guard.measure(f"{config.name} up{r}", up)
            slow = max(slow or 0.0, slowness or 0.0) or None
            metrics = json.loads((out / "metrics.json").read_text())
            measured.append(_median_step(metrics))
            samples.append(samples_per_second([t["step_times"] for t in metrics["trainers"]],
                                              config.batch, config.warmup))
            real_bytes = _pserver_bytes(metrics["pservers"])
    stolen_after, total_after = _steal()
    steal = (stolen_after - stolen) / max(total_after - total, 1)
    if machine is not None:
        predictions = [(_simulate_calibrated(scenario, machine), machine)]
    predictions.sort(key=lambda prediction: statistics.median(_step_times(prediction[0])))
    sim, profile = predictions[(len(predictions) - 1) // 2]  # the median (the lower of two)
    samples_sim = samples_per_second([t.step_times for t in sim.trainers], config.batch,
                                     config.warmup)
    sim_bytes = [p.bytes_in + p.bytes_out - p.heartbeat_bytes for p in sim.pservers]
    lines = []
    if cpu:
        reference = profile
        if profiled != scenario or machine is not None:  # a measured run of what was simulated
            reference = work / f"{config.name}.check.json"
            _run([*runtime, "profile", str(scenario), "-o", str(reference), "--out",
                  str(work / f"{config.name}-check")] + flags, work / f"{config.name}.check.log")
        lines = cpu_lines(json.loads(reference.read_text())["meta"]["measured"], sim.cpu)
    return Outcome(config, measured, statistics.median(_step_times(sim)),
                   statistics.median(samples),
                   samples_sim, real_bytes, sim_bytes, steal, slow, lines)


def _simulate(scenario: Path, profile: Path) -> SimResult:
    """The simulation of `scenario` priced by `profile`, every node on one host of the
    profiling machine's cores."""
    cores = json.loads(profile.read_text())["runtime"]["machine"]["cores"]
    return simulate(load_scenario(scenario, [
        f"compute={{model: profile, path: {profile}}}",
        f"cluster.hosts=[{{nodes: '*', cores: {cores}}}]"]), trace_messages=False)


def _simulate_calibrated(scenario: Path, machine: Path) -> SimResult:
    """The simulation of `scenario` priced by the machine file `machine`, every node on one
    host of the calibrated machine's cores."""
    cores = json.loads(machine.read_text())["meta"]["machine"]["cores"]
    return simulate(load_scenario(scenario, [
        f"compute={{model: calibrated, path: {machine}}}",
        f"cluster.hosts=[{{nodes: '*', cores: {cores}}}]"]), trace_messages=False)


def _step_times(sim: SimResult) -> list[float]:
    return [t for trainer in sim.trainers for t in trainer.step_times]


def cpu_lines(measured: dict[str, Any], simulated: dict[str, float]) -> list[str]:
    """Per node: its main thread's and its process's CPU seconds in a measured run (less what
    measuring cost there) against the simulation's (main thread; main and I/O thread)."""
    lines = []
    for node, real in sorted(measured["nodes"].items()):
        less = real.get("measuring_seconds", 0.0)
        main, process = real["main_seconds"] - less, real["cpu_seconds"] - less
        sim_main = simulated.get(node, 0.0)
        sim_process = sim_main + simulated.get(io_thread(node), 0.0)
        lines.append(f"  {node:<12} main {main * 1e3:8.1f} ms real {sim_main * 1e3:8.1f} sim "
                     f"{sim_main / main - 1 if main else 0.0:+7.1%}   process "
                     f"{process * 1e3:8.1f} real {sim_process * 1e3:8.1f} sim "
                     f"{sim_process / process - 1 if process else 0.0:+7.1%}")
    return lines


def row(o: Outcome) -> str:
    lo, mid, hi = min(o.measured), statistics.median(o.measured), max(o.measured)
    same = "exact" if o.bytes_measured == o.bytes_predicted else \
        f"DIFFER {o.bytes_measured} vs {o.bytes_predicted}"
    return (f"{o.config.name:<20} {lo * 1e3:7.2f} {mid * 1e3:7.2f} {hi * 1e3:7.2f}  "
            f"{o.predicted * 1e3:8.2f} {o.error:+7.1%}  {o.samples_measured:9,.0f} "
            f"{o.samples_predicted:9,.0f}  bytes {same}  steal {o.steal:.1%}"
            + ("" if o.slow is None else f"  slow x{o.slow:.2f}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="real runs per configuration (3)")
    parser.add_argument("--profile-runs", type=int, default=3,
                        help="runtime profile runs, each predicting the job; the median "
                             "prediction counts (3)")
    parser.add_argument("--only", help="comma-separated configuration names")
    parser.add_argument("--steps", type=int, help="steps per run (default: per configuration)")
    parser.add_argument("--netns", action="store_true",
                        help="also the tbf-shaped configurations, in network namespaces (root)")
    parser.add_argument("--keep", type=Path, help="keep scenarios, profiles and logs here")
    parser.add_argument("--protocol", choices=PROTOCOLS,
                        help="train.protocol of the real and simulated runs (the scenario's "
                             f"default, {DEFAULT_PROTOCOL})")
    parser.add_argument("--profile-protocol", choices=PROTOCOLS,
                        help="profile in this protocol instead (the cross-protocol check)")
    parser.add_argument("--cpu", action="store_true",
                        help="also print each node's simulated CPU against a measured run's")
    parser.add_argument("--transfer", action="store_true",
                        help="one calibration of this machine (runtime calibrate) predicts "
                             "every configuration of the transfer matrix, none of which it ran")
    parser.add_argument("--machine", type=Path,
                        help="with --transfer: this machine file instead of a new calibration")
    parser.add_argument("--matrix", choices=("profiled", "transfer"),
                        help="which configurations (default: transfer with --transfer, else "
                             "profiled); --matrix transfer without --transfer predicts the "
                             "transfer matrix from each job's own profiles, the baseline")
    args = parser.parse_args()
    matrix = TRANSFER if (args.matrix or ("transfer" if args.transfer else "profiled")) \
        == "transfer" else CONFIGS
    chosen = [c for c in matrix if (not c.shaped or args.netns)
              and (not args.only or c.name in args.only.split(","))]
    predicted = "one calibration of this machine predicting" if args.transfer else \
        f"{args.profile_runs} profiling and"
    print(f"{len(chosen)} configurations, {predicted} {args.repeat} real run(s) each, on "
          f"{os.cpu_count()} cores; protocol {args.protocol or DEFAULT_PROTOCOL}"
          + ("" if args.transfer else
             f", profiled in {args.profile_protocol or args.protocol or DEFAULT_PROTOCOL}"),
          flush=True)
    print(f"{'configuration':<20} {'measured step ms (min/med/max)':>23}  {'predicted':>8} "
          f"{'error':>7}  {'samples/s':>9} {'predicted':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pslab-fidelity-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        machine = _machine(args, work) if args.transfer else None
        outcomes, guard = [], SpeedGuard()
        for config in chosen:
            outcome = run_config(config, work, args.repeat, args.steps, args.netns,
                                 args.profile_runs, args.protocol, args.profile_protocol,
                                 args.cpu, machine, guard)
            outcomes.append(outcome)
            print(row(outcome), flush=True)
            for line in outcome.cpu:
                print(line, flush=True)
    errors = [abs(o.error) for o in outcomes]
    rates = [abs(o.samples_predicted / o.samples_measured - 1) for o in outcomes
             if o.samples_measured]
    exact = sum(o.bytes_measured == o.bytes_predicted for o in outcomes)
    print(f"summary: {len(outcomes)} configurations, median |error| "
          f"{statistics.median(errors):.1%}, worst {max(errors):.1%} "
          f"({max(outcomes, key=lambda o: abs(o.error)).config.name}); samples/s median "
          f"|error| {statistics.median(rates) if rates else 0:.1%}, worst "
          f"{max(rates, default=0):.1%}; per-pserver bytes exact in {exact} of {len(outcomes)}")


def _machine(args: argparse.Namespace, work: Path) -> Path:
    """The machine file of --transfer: --machine's, or a calibration made now."""
    if args.machine is not None:
        return args.machine.resolve()
    machine = work / "machine.json"
    print("calibrating this machine (runtime calibrate)", flush=True)
    _run([sys.executable, "-m", "runtime.cli", "calibrate", "-o", str(machine)],
         work / "calibrate.log")
    return machine


if __name__ == "__main__":
    main()
