"""pslab against PyTorch DDP: real training throughput of the same models on this machine, in
one run.

Rows are models: ``mlp-small`` (mlp [64, 128, 10], the quickstart's), ``mlp-1024`` (mlp
[64, 1024, 1024, 10]), ``mlp-2048`` (mlp [64, 2048, 2048, 10]) and ``cnn`` (pslab's ``cnn``
model: a 16x16 image, two 3x3 conv + batch_norm + relu + 2x2 max pool blocks of 8 and 16
channels, an fc to 10 classes). Columns are ways to train it with 2 trainers:

- ``pslab``: `runtime up` of the row's scenario as written: 2 pservers x 2 trainers, sync,
  the defaults (the bundled protocol, local sockets: what `runtime up` gives a one-host job);
- ``compact``: the same with ``--set train.protocol=compact`` (the default before bundled);
- ``curve``: with ``--set cluster.security=curve``, CurveZMQ over TCP, what a job across hosts
  pays for its encryption (the default on one host before local sockets);
- ``1x2``: with ``--set cluster.pservers=1``;
- ``torch``: with ``--set backend.kernels=torch``, the torch kernels on the CPU instead of the
  default numpy ones (benchmarks/torch_backend.py compares the two in one process);
- ``ddp``: the same layers written with torch.nn, in 2 processes started by
  torch.multiprocessing, DistributedDataParallel over the gloo backend on 127.0.0.1 (a free
  loopback port as init_method), SGD at the scenario's learning rate, each process its batch of
  synthetic data of the row's shapes (global batch = pslab's trainers x batch), as many steps as
  pslab takes, so the same samples in total; initial weights are torch's own, DDP's
  settings its defaults (for the CNN, its batch norm buffers broadcast every forward).

Every process, pslab's nodes and DDP's, runs its kernels on `kernel_threads` threads
(runtime/launch/launcher.py: this machine's cores over the processes sharing them, at least
one; ``torch.set_num_threads`` in each DDP process). pslab computes with its default kernels
(``backend.kernels``, printed), DDP with torch's. pslab's scenarios are built by
`fidelity.Config` (benchmarks/fidelity.py; its name prefix ``fidelity-`` stays) with the row's
model and the model's own synthetic data, run by `fidelity._run` (`runtime up` as a process,
its output in a log beside the run folder) and read back with `read_metrics`.

Throughput is samples/s as OUT/metrics.json defines it (``job.samples_per_second``,
runtime/config/metrics.py: the samples of every trainer's steps after its first, over the
slowest trainer's time from the end of its first step to the end of its last), and the same for
DDP: (steps - 1) x batch x processes over the slowest process's time from the end of its first
step to the end of its last. The first step (job formation, DDP's first bucket allreduce) is
left out on both sides. Each cell is min / median / max over ``--repeat`` runs, the columns run
in turn within a repeat so that drift on a busy machine hits all of them; the ratio is the
median over DDP's median. A last block gives each column's ratios, one line a column.

Where the time goes, per row, from the run with the median samples/s (the lower of two):

- pslab columns, from metrics.json's records (per step: mean over the trainers of their
  training steps): the step time; the pservers' time in sync optimize steps
  (``optimize_seconds`` over their ``steps``, mean over pservers); requests per trainer-step
  (``job.messages_per_step``) and KiB per trainer-step (the pservers' ``bytes_in + bytes_out``
  less heartbeats, over every trainer's steps, start-up fetches included); and the trainers'
  ``compute_seconds`` and ``barrier_wait_seconds`` per step where the records hold them. A
  `runtime up` record does not (they are `sim run`'s): the split of a trainer's step into its
  kernels, encoding and decoding, transport and waiting is not in what a plain run records,
  and a line under the block says so: `benchmarks/step_split.py SCENARIO` gives that split
  (the scheduler's and py-spy's) for a row's scenario, kept in ``--out DIR/ROW``.
- DDP, timed in each process with perf_counter around each part of a step (mean over its
  steps after the first, then over the processes): forward and loss; backward, which holds
  the gradient allreduce (DDP overlaps the two, so they are one figure); the SGD update and
  zeroing the gradients; the rest (taking the batch, reading the loss as a float, as pslab's
  trainer fetches its loss every step). Gradient KiB a step is what each process hands to the
  allreduce (the parameters' size), not bytes measured on the wire.

Run: python benchmarks/vs_ddp.py [--repeat 3] [--steps N] [--batch 32] [--only NAME,...]
         [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fidelity import Config, _run
from runtime.config.metrics import JobMetrics, read_metrics
from runtime.config.scenario import parse_scenario
from runtime.launch.launcher import free_endpoints, kernel_threads

if TYPE_CHECKING:
    import torch

TRAINERS = 2
PSERVERS = 2
LEARNING_RATE = 0.05
CLASSES = 10


@dataclass(frozen=True)
class Row:
    """A model, as pslab's scenario names it and as torch.nn layers."""

    name: str
    kind: str
    """mlp or cnn (transpiler/models.py)."""
    steps: int
    """Steps a run takes unless --steps says."""
    sizes: tuple[int, ...] = ()
    image: int = 16
    channels: tuple[int, ...] = (8, 16)

    def model_text(self) -> str:
        """The scenario's model, YAML flow text."""
        sgd = f"optimizer: {{type: sgd, learning_rate: {LEARNING_RATE}}}"
        if self.kind == "mlp":
            return f"{{name: mlp, sizes: {list(self.sizes)}, {sgd}}}"
        return (f"{{name: cnn, image: {self.image}, channels: {list(self.channels)}, "
                f"classes: {CLASSES}, {sgd}}}")

    @property
    def features(self) -> int:
        return self.sizes[0] if self.kind == "mlp" else self.image * self.image

    @property
    def classes(self) -> int:
        return self.sizes[-1] if self.kind == "mlp" else CLASSES

    def label(self) -> str:
        if self.kind == "mlp":
            return f"mlp {list(self.sizes)}"
        return f"cnn {self.image}x{self.image}, channels {list(self.channels)}, batch_norm"


ROWS = [Row("mlp-small", "mlp", 200, sizes=(64, 128, 10)),
        Row("mlp-1024", "mlp", 100, sizes=(64, 1024, 1024, 10)),
        Row("mlp-2048", "mlp", 50, sizes=(64, 2048, 2048, 10)),
        Row("cnn", "cnn", 60)]


@dataclass(frozen=True)
class Column:
    """A way to run a row's scenario with `runtime up`: the arguments added to it."""

    name: str
    args: tuple[str, ...]


COLUMNS = [Column("pslab", ()),
           Column("compact", ("--set", "train.protocol=compact")),
           Column("curve", ("--set", "cluster.security=curve")),
           Column("1x2", ("--set", "cluster.pservers=1")),
           Column("torch", ("--set", "backend.kernels=torch"))]
DDP = "ddp"
DDP_TRIES = 3
"""Starts of a DDP run before its failure ends the benchmark."""


@dataclass
class Run:
    """One run of a row in a column: its throughput and where its time went."""

    samples_per_second: float
    split: str
    trainer_split: bool = True
    """Whether its records split the trainers' steps (compute, barrier wait)."""


# -- pslab -------------------------------------------------------------------------------------

def scenario_text(row: Row, steps: int, batch: int) -> str:
    return Config(row.name, row.sizes, PSERVERS, TRAINERS, steps=steps, model=row.model_text(),
                  batch=batch).scenario(steps)


def pslab_run(scenario: Path, column: Column, out: Path) -> Run:
    """`runtime up` of `scenario` with the column's arguments into `out`."""
    _run([sys.executable, "-m", "runtime.cli", "up", str(scenario), "--out", str(out),
          *column.args], out.with_suffix(".log"))
    metrics = read_metrics(out / "metrics.json")
    if metrics.job.samples_per_second is None:
        raise SystemExit(f"{out / 'metrics.json'}: no throughput (fewer than 2 steps?)")
    recorded = trainer_split(metrics)
    return Run(metrics.job.samples_per_second,
               pslab_split(metrics) + (f"; {recorded}" if recorded else ""), bool(recorded))


def pslab_split(metrics: JobMetrics) -> str:
    """Per step, from the records: trainer step, pserver optimize, requests and KiB."""
    trainers, pservers = metrics.trainers, metrics.pservers
    step = statistics.mean(t.step_time.mean for t in trainers if t.step_time is not None)
    optimize = statistics.mean(p.optimize_seconds / p.steps for p in pservers if p.steps) \
        if any(p.steps for p in pservers) else 0.0
    trainer_steps = sum(len(t.step_times) for t in trainers)
    wire = sum(p.bytes_in + p.bytes_out - p.heartbeat_bytes for p in pservers)
    requests = metrics.job.messages_per_step.get("total", 0.0)
    return (f"step {step * 1e3:.2f} ms, pserver optimize {optimize * 1e3:.2f} ms, "
            f"{requests:.1f} requests, {wire / max(trainer_steps, 1) / 1024:.1f} KiB")


def trainer_split(metrics: JobMetrics) -> str:
    """The trainers' compute and barrier wait per step, mean over trainers; empty where the
    records do not hold them (a `runtime up` record)."""
    trainers = metrics.trainers
    if any(t.compute_seconds is None or t.barrier_wait_seconds is None or not t.step_times
           for t in trainers):
        return ""
    compute = statistics.mean((t.compute_seconds or 0.0) / len(t.step_times) for t in trainers)
    wait = statistics.mean((t.barrier_wait_seconds or 0.0) / len(t.step_times)
                           for t in trainers)
    return f"compute {compute * 1e3:.2f} ms, barrier wait {wait * 1e3:.2f} ms"


# -- DDP ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DdpJob:
    """What each DDP process needs (pickled to it)."""

    row: Row
    batch: int
    steps: int
    learning_rate: float
    world: int
    threads: int
    endpoint: str
    out: Path


def torch_model(row: Row) -> torch.nn.Module:
    """The row's layers as torch.nn, as transpiler/models.py builds them."""
    from torch import nn

    if row.kind == "mlp":
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(row.sizes, row.sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(row.sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)
    blocks: list[nn.Module] = [nn.Unflatten(1, (1, row.image, row.image))]
    channels = 1
    for c in row.channels:
        blocks += [nn.Conv2d(channels, c, 3, padding=1, bias=False), nn.BatchNorm2d(c),
                   nn.ReLU(), nn.MaxPool2d(2, 2)]
        channels = c
    side = row.image // 2 ** len(row.channels)
    return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(channels * side * side, row.classes))


def synthetic_batches(row: Row, batch: int, count: int,
                      seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, row.features, generator=generator),
             torch.randint(0, row.classes, (batch,), generator=generator))
            for _ in range(count)]


def ddp_worker(rank: int, job: DdpJob) -> None:
    """One DDP process: join the group, train `job.steps` steps, write each step's marks."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(job.threads)
    if "lo" in {name for _, name in socket.if_nameindex()}:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pairs on loopback too
    dist.init_process_group("gloo", init_method=f"tcp://{job.endpoint}", rank=rank,
                            world_size=job.world)
    try:
        model = DistributedDataParallel(torch_model(job.row))
        optimizer = torch.optim.SGD(model.parameters(), lr=job.learning_rate)
        batches = synthetic_batches(job.row, job.batch, job.steps, seed=rank)
        marks = [ddp_step(model, optimizer, batches, step) for step in range(job.steps)]
        dist.barrier()  # neither leaves while the other may still be in an allreduce
    finally:
        dist.destroy_process_group()
    (job.out / f"rank{rank}.json").write_text(json.dumps(marks))


def ddp_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             batches: list[tuple[torch.Tensor, torch.Tensor]], step: int) -> list[float]:
    """One step; perf_counter at its start, after forward and loss, after backward (with the
    allreduce), after the update, and at its end."""
    from torch.nn.functional import cross_entropy

    start = time.perf_counter()
    x, label = batches[step]
    loss = cross_entropy(model(x), label)
    forward = time.perf_counter()
    loss.backward()
    backward = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    update = time.perf_counter()
    loss.item()
    return [start, forward, backward, update, time.perf_counter()]


def ddp_run(row: Row, batch: int, steps: int, out: Path) -> Run:
    """2 DDP processes training `row`; their marks read back from `out`."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    job = DdpJob(row, batch, steps, LEARNING_RATE, TRAINERS, kernel_threads(TRAINERS),
                 free_endpoints("127.0.0.1", 1)[0], out)
    for attempt in range(DDP_TRIES):
        try:
            mp.spawn(ddp_worker, args=(job,), nprocs=TRAINERS, join=True)
            break
        except mp.ProcessExitedException as exc:  # gloo now and then aborts a process
            if attempt == DDP_TRIES - 1:
                raise
            print(f"  ddp: {exc}; running it again", flush=True)
            job = replace(job, endpoint=free_endpoints("127.0.0.1", 1)[0])
    marks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(TRAINERS)]
    seconds = max(steps_[-1][-1] - steps_[0][-1] for steps_ in marks)
    return Run((steps - 1) * batch * TRAINERS / seconds, ddp_split(marks, row))


def ddp_split(marks: list[list[list[float]]], row: Row) -> str:
    """Per step, mean over the steps after the first and over the processes."""
    parts = [[statistics.mean(m[i + 1] - m[i] for m in rank[1:]) for i in range(4)]
             for rank in marks]
    forward, backward, update, rest = (statistics.mean(p[i] for p in parts) for i in range(4))
    grads = sum(p.numel() for p in torch_model(row).parameters()) * 4
    return (f"step {(forward + backward + update + rest) * 1e3:.2f} ms: forward "
            f"{forward * 1e3:.2f}, backward + allreduce {backward * 1e3:.2f}, sgd "
            f"{update * 1e3:.2f}, rest {rest * 1e3:.2f} ms; {grads / 1024:.1f} KiB of gradients")


# -- the table ---------------------------------------------------------------------------------

def measure_row(row: Row, steps: int, batch: int, repeat: int, work: Path) -> dict[str, list[Run]]:
    """`repeat` runs of every column, the columns in turn within a repeat."""
    folder = work / row.name
    folder.mkdir(parents=True, exist_ok=True)
    scenario = folder / "scenario.yaml"
    scenario.write_text(scenario_text(row, steps, batch))
    runs: dict[str, list[Run]] = {name: [] for name in [*(c.name for c in COLUMNS), DDP]}
    for r in range(repeat):
        for column in COLUMNS:
            runs[column.name].append(pslab_run(scenario, column, folder / f"{column.name}-{r}"))
        runs[DDP].append(ddp_run(row, batch, steps, folder / f"{DDP}-{r}"))
    return runs


def median_run(runs: list[Run]) -> Run:
    """The run of the median samples/s (the lower of two)."""
    ranked = sorted(runs, key=lambda run: run.samples_per_second)
    return ranked[(len(ranked) - 1) // 2]


def median(runs: list[Run]) -> float:
    return statistics.median(run.samples_per_second for run in runs)


def print_row(row: Row, steps: int, batch: int, runs: dict[str, list[Run]]) -> None:
    print(f"\n{row.name}: {row.label()}, {TRAINERS} trainers x batch {batch} (global "
          f"{TRAINERS * batch}), {steps} steps, {len(runs[DDP])} run(s)")
    print(f"  {'column':<18} {'min':>10} {'median':>10} {'max':>10}  {'/ DDP':>6}   samples/s")
    ddp = median(runs[DDP])
    for name, column_runs in runs.items():
        rates = [run.samples_per_second for run in column_runs]
        print(f"  {name:<18} {min(rates):>10,.0f} {median(column_runs):>10,.0f} "
              f"{max(rates):>10,.0f}  {median(column_runs) / ddp:>6.2f}")
    print("  where the time goes, per step (the median run):")
    for name, column_runs in runs.items():
        print(f"    {name:<18} {median_run(column_runs).split}")
    if not all(run.trainer_split for run in runs[COLUMNS[0].name]):
        print("    (runtime up's records do not split a trainer's step into kernels, encode and "
              "decode, transport and waiting: benchmarks/step_split.py on the row's scenario "
              "does)")


def print_ratios(table: dict[Row, dict[str, list[Run]]]) -> None:
    print("\nratios, median samples/s over DDP's median, per column:")
    for name in [c.name for c in COLUMNS]:
        cells = "  ".join(f"{row.name} {median(runs[name]) / median(runs[DDP]):.2f}"
                          for row, runs in table.items())
        print(f"  {name:<18} {cells}")


def print_header(args: argparse.Namespace, rows: list[Row]) -> None:
    import torch

    kernels = parse_scenario(scenario_text(rows[0], 2, args.batch)).backend.kernels
    print(f"pslab vs PyTorch DDP (gloo, CPU, torch {torch.__version__}) on "
          f"{os.cpu_count()} cores; kernel threads a process: pslab "
          f"{kernel_threads(PSERVERS + TRAINERS)} (2x2), DDP {kernel_threads(TRAINERS)}; pslab "
          f"kernels {kernels}")
    for column in COLUMNS:
        print(f"  {column.name:<18} runtime up SCENARIO {' '.join(column.args)}".rstrip())


# -- main --------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (3)")
    parser.add_argument("--steps", type=int, help="steps per run (default: per row)")
    parser.add_argument("--batch", type=int, default=32, help="examples per trainer a step (32)")
    parser.add_argument("--only", help=f"comma-separated rows: {','.join(r.name for r in ROWS)}")
    parser.add_argument("--out", type=Path, help="run folders here (default: a temp folder)")
    parser.add_argument("--quick", action="store_true",
                        help="mlp-small only, 1 run, 10 steps (the test's mode)")
    args = parser.parse_args(argv)
    if args.quick:
        args.only, args.repeat, args.steps = ROWS[0].name, 1, args.steps or 10
    unknown = set(args.only.split(",")) - {r.name for r in ROWS} if args.only else set()
    if unknown:
        parser.error(f"--only: no row {', '.join(sorted(unknown))}")
    if args.repeat < 1 or (args.steps is not None and args.steps < 2) or args.batch < 1:
        parser.error("--repeat and --batch take 1 or more, --steps 2 or more (the first step "
                     "is left out)")
    return args


def main() -> None:
    args = parse_args()
    if importlib.util.find_spec("torch") is None:
        print("vs_ddp: needs torch, which is not installed (pip install -e '.[torch]')",
              file=sys.stderr)
        raise SystemExit(2)
    rows = [r for r in ROWS if not args.only or r.name in args.only.split(",")]
    print_header(args, rows)
    with tempfile.TemporaryDirectory(prefix="pslab-vs-ddp-") as tmp:
        work = args.out or Path(tmp)
        table: dict[Row, dict[str, list[Run]]] = {}
        for row in rows:
            steps = args.steps or row.steps
            table[row] = measure_row(row, steps, args.batch, args.repeat, work)
            print_row(row, steps, args.batch, table[row])
    print_ratios(table)


if __name__ == "__main__":
    main()
