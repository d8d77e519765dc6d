"""`runtime calibrate`: measure this machine, not a job, so that the simulator prices any job.

A profile (`runtime.launch.profile`) measures one job: its op types at its shapes, its messages
at its sizes. Priced from it, another job (a wider model, more trainers, another mode) comes out
tens of percent off, since a constant per call or per element does not follow shape. A
calibration measures what a job is made of instead, over ranges wide enough for jobs never run:

- **kernels**: the training programs of reference models (the MLP at widths 16 to 2,048 and
  batches 8 to 256, two hidden layers, the CNN at three image sizes, ctr_dnn's embedding tables
  from 1,000 to 100,000 rows), and their startups' initializers, run in this process on each
  kernel backend (numpy, and torch where installed), a sync pserver's optimize blocks of
  the MLPs (their ``sum``, ``scale`` and optimizer ops, SGD, momentum and Adam), and a
  trainer's ``split_byref`` and ``concat`` with the parameters sliced over two pservers
  (`_slicing`); every kernel call's CPU time against its work
  (`runtime.execution.work.op_work`). Each op type gets a `Curve` of seconds against FLOPs
  (the matrix products, convolutions, nce) or bytes moved (everything else), and the bytes
  curve of all elementwise op types together prices an op type none of the programs ran.
- **cores**: 1, 2, ... up to two more than the cores processes working at once (small numpy
  kernels between Python steps, as a node works), each one's rate against one alone: what a
  busy thread gets while m have work (`sim.cpu.SimHost.rates`), caches, memory bandwidth and
  a hypervisor's sharing included, where processor sharing would say ``min(1, cores / m)``.
- **runtime**: a reference job (2 pservers x 2 trainers, an MLP whose messages range from 40
  bytes to 128 KiB, run as `runtime up` runs a job on one host: the default protocol over
  local sockets) run for real three times as `runtime profile --runs 3` runs one (the median
  run counts), and a job of messages up to 2 MiB for the cost per byte (`BYTES_REFERENCE`,
  `merge_bytes`): each message's cost by kind and size on both sides, the I/O thread's (what
  a message's size adds measured apart between two processes, `runtime.launch.io_curve`, the
  rest per message; CurveZMQ's measured apart and charged to a job that talks it), the
  executor's dispatch per op, a trainer's per-step and a pserver's per-round work, fitted as a
  profile's are (`runtime.execution.costs.fit_costs`); then two short jobs for the message
  kinds it never sends (`KIND_REFERENCES`: a distributed table's prefetches, the collective
  ring's messages), of which those kinds are kept; a job with a distributed table is priced
  whole by the table job, run three times too (its sends carry rows, its steps await two round
  trips: `FAMILY_REFERENCES`, `family_variant`, the runtime section's ``variants``); every
  kernel call of these jobs is kept with its work too, and the op types the grid never runs
  (a distributed table's ``split_ids``, ``merge_ids`` and ``lookup_sparse_table``, for
  instance) get their numpy curves from them (`job_curves`; named in ``meta.from_jobs``).
  A step's and an op's own cost come
  from a job whose steps make no RPC (`LOCAL_REFERENCE`, `fold_local`); what the reference
  job's steps and rounds cost beyond that is owed by the steps that make an RPC and by the
  rounds, and how that grows with a node's peers and its host's crowding comes from the same
  job with one pserver and one trainer (`PEERS_REFERENCE`, `merge_peers`), as does the part of
  a received SEND's cost that is its round's (`_round_of_sends`).

Drift. On a shared machine (a VM whose host runs other guests) a thread's CPU time grows while
the hypervisor runs someone else, so a kernel measured then looks slower than it is, and one
bad reference bends its op type's curve (the fit never lets a larger op cost less). Each
reference is measured between two speed probes (`speed_probe`), and again while either ran
`PROBE_SLOW` times slower than the fastest probe yet; one still slow after `PROBE_TRIES` tries
is kept (its least slow try) and named in the file's ``meta.slow``. The cores' sharing and
every run of a reference job are guarded the same way (`runtime.launch.speed.SpeedGuard`;
named under ``meta.slow.machine``): a spell had given two busy processes 0.82 of a core each
and priced every message a quarter dearer.

The machine file (``machine.json``)::

    {"format": "pslab-machine", "version": 1,
     "kernels": {"numpy": {"mul": {"feature": "flops", "points": [[flops, seconds], ...]}, ...},
                 "torch": {...}},
     "fallback": {"numpy": {"feature": "bytes", "points": [...]}, ...},
     "cores": {"count": 2, "rates": [1.0, 0.97, 0.64, 0.48]},
     "runtime": {...a profile's runtime section...},
     "meta": {"machine": ..., "seconds": ..., "grid": [...], "samples": {...}}}

A scenario's ``compute: {model: calibrated, path: machine.json}`` prices its job from it
(`sim.cost.Calibrated`). Calibration takes about two minutes on two cores (`--quick`: a
coarser grid, about half); a grid point that would pass the time budget is skipped and named.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from runtime.config.atomic import write_atomic
from runtime.config.scenario import Scenario, parse_scenario
from runtime.execution.costs import RECEIVES, crowding, machine
from runtime.execution.curves import Curve, Feature, fit_curve
from runtime.execution.executor import Executor
from runtime.execution.scope import Scope
from runtime.execution.work import op_work
from runtime.launch.speed import PROBE_TRIES, SpeedGuard, speed_probe
from runtime.services.job import Job
from transpiler.distribute.contract import ServeContract
from transpiler.ir import Op, OpRole, VarType
from transpiler.opcatalog import OPS

FORMAT = "pslab-machine"
VERSION = 1
BY_FLOPS = frozenset({"matmul", "matmul_grad", "batched_matmul", "batched_matmul_grad",
                      "conv2d", "conv2d_grad", "nce"})
"""The cost rules whose time follows FLOPs; every other op's follows the bytes it moves."""
SLICING_OPS = frozenset({"concat", "split_byref"})
"""The compute ops the transpiler puts around a sliced parameter's RPC ops (`_slicing`)."""
COLD_BYTES = 64 << 20
"""Inputs `_slicing` cycles through, beyond the caches of the machines this runs on (32 MiB
of L3 on the development machine)."""
FALLBACK_RULES = frozenset({"elementwise", "reduction", "sum", "softmax"})
"""The cost rules whose samples, pooled by bytes, price an op type that was not calibrated."""


class CalibrationError(RuntimeError):
    """Calibrating failed: the reason, naming the reference that failed."""


def _rule(op_type: str) -> str | None:
    """The op catalog's cost rule of an op type (None: it names none)."""
    entry = OPS.get(op_type)
    return entry.cost.rule if entry is not None and entry.cost is not None else None


def feature_of(op_type: str) -> Feature:
    """What an op type's time follows: FLOPs or bytes moved (see `BY_FLOPS`)."""
    return "flops" if _rule(op_type) in BY_FLOPS else "bytes"


def pooled(op_type: str) -> bool:
    """Whether an op type's samples go into the fallback curve."""
    return _rule(op_type) in FALLBACK_RULES


# -- measuring kernels ---------------------------------------------------------------------------

@dataclass
class WorkTimes:
    """A `KernelTimer` keeping each call's work and CPU seconds, per op type."""

    samples: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    clock: Callable[[], float] = time.thread_time
    traffic: tuple[int, int] = (0, 0)
    """A real job's messages and bytes over its nodes (`_profile_runtime`); none else."""

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        work = op_work(op, scope)
        self.samples.setdefault(op.type, []).append((work.flops, work.bytes, seconds))

    @property
    def calls(self) -> int:
        return sum(len(s) for s in self.samples.values())


@dataclass(frozen=True)
class Reference:
    """A reference program of the grid: a job's text; `pserver`: its pserver's optimize blocks
    too (a sync job of one pserver and two trainers)."""

    name: str
    model: str
    batch: int
    width: int
    """Its widest layer (an embedding's width, not its rows: a lookup reads only the rows its
    batch names); with the batch, what orders the grid by cost (`_cost_rank`)."""
    steps: int = 6
    pserver: bool = True

    def scenario(self, pservers: int = 1) -> Scenario:
        endpoints = ", ".join(f"127.0.0.1:{7001 + k}" for k in range(pservers))
        return parse_scenario(
            f"name: calibrate-{self.name}\nseed: 1\nmodel: {self.model}\n"
            f"data: {{batch_size: {self.batch}}}\n"
            f"cluster: {{pservers: {pservers}, trainers: 2, endpoints: {{pservers: [{endpoints}]}}}}\n"
            f"transpiler: {{mode: sync}}\ntrain: {{steps: {self.steps}}}\n",
            f"<calibration {self.name}>")


def _mlp(sizes: list[int], optimizer: str = "sgd") -> str:
    return f"{{name: mlp, sizes: {sizes}, optimizer: {{type: {optimizer}, learning_rate: 0.01}}}}"


def grid(quick: bool = False) -> list[Reference]:
    """The reference programs, cheapest first (so a budget cut drops the largest)."""
    widths = (16, 128, 1024, 4096) if quick else (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    batches = (1, 16, 128, 512) if quick else (1, 8, 16, 32, 64, 128, 256, 512)
    refs = [Reference(f"mlp-{w}-b{b}", _mlp([64, w, 10]), b, max(w, 64))
            for w in widths for b in batches]
    deep = (256, 1024) if quick else (64, 128, 256, 512, 1024, 2048)
    refs += [Reference(f"mlp2-{w}-b{b}", _mlp([64, w, w, 10]), b, max(w, 64))
             for w in deep for b in ((32, 256) if quick else (8, 32, 128, 256))]
    refs += [Reference(f"mlp-{opt}-{w}-b{b}", _mlp([64, w, w, 10], opt), b, max(w, 64))
             for opt in ("momentum", "adam") for w in (64, 512, 2048) for b in (8, 64)]
    images = (8, 16) if quick else (8, 16, 28, 32)
    refs += [Reference(f"cnn-{image}-{c}-b{b}",
                       f"{{name: cnn, image: {image}, channels: [{c}, {2 * c}]}}", b, 2 * c,
                       steps=4)
             for image in images for c in (8, 16) for b in (8, 32, 64)]
    tables = ((1000, 8), (100_000, 16)) if quick else \
        ((1000, 8), (10_000, 16), (100_000, 16), (100_000, 64), (1_000_000, 16))
    refs += [Reference(f"ctr-{vocab}-{dim}-b{b}",
                       f"{{name: ctr_dnn, vocab: {vocab}, embed_dim: {dim}}}", b, dim,
                       pserver=False)
             for vocab, dim in tables for b in (32, 256)]
    return sorted(refs, key=_cost_rank)


def _cost_rank(ref: Reference) -> int:
    """A reference's rough cost, so that the cheap run first and a budget cut drops the
    largest: batch size times the widest layer (a convolution's layers count 8 times)."""
    return ref.batch * ref.width * (8 if ref.name.startswith("cnn-") else 1)


@dataclass
class KernelRun:
    """What `measure_kernels` measured: the samples, the references over the budget, and those
    measured while the machine ran slow with how much slower (`PROBE_SLOW`)."""

    times: WorkTimes
    skipped: list[str] = field(default_factory=list)
    slow: dict[str, float] = field(default_factory=dict)


def measure_kernels(backend: str, refs: list[Reference], budget: float, stream: TextIO,
                    probe: Callable[[], float] = speed_probe) -> KernelRun:
    """Run every reference on `backend` until `budget` seconds are spent, each between two
    speed probes, again (up to `PROBE_TRIES` times) while either probe is `PROBE_SLOW` times
    the fastest seen (`SpeedGuard`)."""
    run, guard = KernelRun(WorkTimes()), SpeedGuard(probe)
    started = time.monotonic()
    for k, ref in enumerate(refs):
        if k and time.monotonic() - started > budget:  # the first runs whatever the budget
            run.skipped += [r.name for r in refs[k:]]
            break
        times, slowness = guard.measure(ref.name, partial(_measured, ref, backend))
        for op_type, samples in times.samples.items():
            run.times.samples.setdefault(op_type, []).extend(samples)
        print(f"  {backend:<6} {ref.name:<22} {run.times.calls:>7} calls  "
              f"{time.monotonic() - started:6.1f}s"
              + (f"  (slow machine: x{slowness:.2f})" if slowness else ""),
              file=stream, flush=True)
    run.slow = guard.slow
    return run


def _measured(ref: Reference, backend: str, _attempt: int) -> WorkTimes:
    times = WorkTimes()
    _measure(ref, backend, times)
    return times


def _measure(ref: Reference, backend: str, times: WorkTimes) -> None:
    """One reference's kernels on `backend` into `times`."""
    try:
        job = Job.from_scenario(ref.scenario())
        _train(job, backend, times, ref.steps)
        if ref.pserver:
            _optimize(job, backend, times, ref.steps)
            _slicing(Job.from_scenario(ref.scenario(pservers=2)), backend, times, ref.steps)
    except Exception as exc:
        raise CalibrationError(f"reference {ref.name} on {backend}: "
                               f"{type(exc).__name__}: {exc}") from exc


def _train(job: Job, backend: str, times: WorkTimes, steps: int) -> None:
    """Local training steps of `job`'s program (forward, backward and optimizer kernels), and
    of its startup program the op types the steps do not run (the initializers:
    `gaussian_random`, `uniform_random`, ... at the parameters' sizes). DESIGN: a startup runs
    each op once, cold; an op type the steps run too (`fill_constant`) keeps the steps' figures."""
    model = job.model
    executor, scope, startup = Executor(backend, timer=times), Scope(), WorkTimes()
    Executor(backend, timer=startup).run(model.startup, scope=scope)
    batch = job.scenario.data.batch_size
    for step in range(steps):
        executor.run(model.main, feed=job.dataset.batch(step, batch, model.feeds),
                     fetch_list=[model.loss], scope=scope)
    for op_type, samples in startup.samples.items():
        if op_type not in times.samples:
            times.samples[op_type] = samples


def _optimize(job: Job, backend: str, times: WorkTimes, steps: int) -> None:
    """A sync pserver's optimize blocks over random gradients: its fan-in and update ops."""
    main, startup = job.pserver_programs(0)
    scope = Scope()
    Executor(backend).run(startup, scope=scope)
    contract = ServeContract.of(main)
    block = main.global_block()
    rng = np.random.default_rng(0)
    for name in sorted(contract.received):
        var = block.var(name)
        if var.type is VarType.SELECTED_ROWS:
            return  # sparse gradients: their ops are calibrated by the trainers' programs
        shape = tuple(d if d > 0 else 1 for d in var.shape)
        scope.put(name, rng.standard_normal(shape).astype(var.dtype))
    executor = Executor(backend, timer=times)
    for _ in range(steps):
        for idx in contract.sync_blocks:
            executor.run_block(main, idx, scope, keep_locals=True)


def _slicing(job: Job, backend: str, times: WorkTimes, steps: int) -> None:
    """The compute ops a trainer runs around its RPC ops once its parameters are sliced over
    two pservers (`split_byref` of a gradient into the blocks it sends, `concat` of the blocks
    it receives into the parameter), at the vars' shapes. DESIGN: neither the local nor the
    pserver programs run them, and the reference jobs' messages stop at 128 KiB, where a wide
    layer's `concat` copies megabytes a step. In a job, what a step's concat reads (blocks just
    received) has left the caches since its last run; so each run here reads another set of
    inputs, of `COLD_BYTES` together (a loop over one set timed a 4 MB concat at a quarter of
    its cost in a job)."""
    sliced = job.trainer_programs(0)[0].clone()
    block = sliced.global_block()
    ops = [op for op in block.ops if op.type in SLICING_OPS and op.role & OpRole.Dist]
    if not ops:
        return
    block.ops = ops
    names = sorted({name for op in ops for name in op.input_arg_names})
    shapes = {name: (tuple(block.var(name).shape), block.var(name).dtype) for name in names}
    one_set = sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in shapes.values())
    sets = [{name: np.full(shape, k + 1.0, dtype) for name, (shape, dtype) in shapes.items()}
            for k in range(min(steps, max(1, math.ceil(COLD_BYTES / one_set))))]
    scope, executor = Scope(), Executor(backend, timer=times)
    for step in range(steps):
        for name, value in sets[step % len(sets)].items():
            scope.put(name, value)
        executor.run_block(sliced, 0, scope)


# -- fitting -------------------------------------------------------------------------------------

def fit_kernels(times: WorkTimes) -> tuple[dict[str, Curve], Curve | None]:
    """Each op type's curve, and the fallback curve (elementwise-like types by bytes)."""
    curves: dict[str, Curve] = {}
    pool_x: list[float] = []
    pool_s: list[float] = []
    for op_type, samples in sorted(times.samples.items()):
        feature = feature_of(op_type)
        xs = [flops if feature == "flops" else nbytes for flops, nbytes, _ in samples]
        seconds = [s for _, _, s in samples]
        curves[op_type] = fit_curve(feature, xs, seconds)
        if pooled(op_type):
            pool_x += [nbytes for _, nbytes, _ in samples]
            pool_s += seconds
    fallback = fit_curve("bytes", pool_x, pool_s) if pool_x else None
    return curves, fallback


# -- how busy processes share the cores ---------------------------------------------------------

SHARING_SECONDS = 0.4
"""How long each count of busy processes is measured for."""
SHARING_TRIES = 3
"""How many times the sharing is measured; the best rate of each count counts."""


def _spin(seconds: float, start: Any, done: Any) -> None:
    """Work as a node works (small numpy kernels between Python steps) for `seconds` after the
    common start; put how much was done on `done`."""
    a = np.ones((48, 48), np.float32)
    start.wait()
    until = time.perf_counter() + seconds
    count = 0
    while time.perf_counter() < until:
        for _ in range(20):
            a = np.tanh(a @ a * 1e-3)
        count += 1
    done.put(count)


def busy_together(work: Callable[..., None], processes: int, seconds: float) -> list[Any]:
    """What each of `processes` processes running `work(seconds, start, done)` from one
    common start put on `done`."""
    import multiprocessing

    # fork: its locks are unlinked at once, so no resource-tracker process outlives the
    # measurement (spawn's would live as long as this process); the workers only compute
    context = multiprocessing.get_context("fork")
    start, done = context.Barrier(processes + 1), context.Queue()
    workers = [context.Process(target=work, args=(seconds, start, done))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    start.wait()
    results = [done.get(timeout=60 + seconds) for _ in workers]
    for worker in workers:
        worker.join()
    return results


def measure_sharing(most: int | None = None, seconds: float = SHARING_SECONDS,
                    tries: int = SHARING_TRIES, cores: int | None = None) -> list[float]:
    """The rate of each of m busy processes, against one alone, for m = 1 .. `most` (default:
    the `cores` and two more): what m nodes each get of a core, cache and memory included.

    Each count's best mean over `tries` measurements, against the best alone: another process
    that holds a core for a moment only lowers a mean (one spell gave 2 busy processes on 2
    cores 0.62 of a core each). DESIGN: not the best of each try's ratio, which picks the try
    whose lone process ran slow: on 2026-12-07 one alone did 820 where another try's did 1,416,
    and three at once came out at 0.88 to 0.91 of a core each, 2.6 cores of 2, which let every
    simulated host of many busy threads run a third faster than it can. And never more than
    ``cores / m`` each: m processes busy on fewer cores share them."""
    cores = cores or os.cpu_count() or 1
    most = most or cores + 2
    best = [0.0] * most
    for _ in range(tries):
        for m in range(1, most + 1):
            best[m - 1] = max(best[m - 1], statistics.mean(busy_together(_spin, m, seconds)))
    alone = best[0]
    return [round(min(1.0, cores / m, mean / alone), 4) for m, mean in enumerate(best, 1)]


GAP = 50e-6
"""A pause in a busy loop this long or longer is the scheduler running another process."""


def _runs(seconds: float, start: Any, done: Any) -> None:
    """Spin for `seconds` after the common start, reading the clock; put the lengths of the
    stretches run without a `GAP` (the first and the last cut off: they are not whole)."""
    start.wait()
    now = began = last = time.perf_counter()
    until = now + seconds
    runs = []
    while now < until:
        now = time.perf_counter()
        if now - last >= GAP:
            runs.append(last - began)
            began = now
        last = now
    done.put(runs[1:])


def measure_slice(processes: int | None = None, seconds: float = SHARING_SECONDS
                  ) -> float | None:
    """How long a busy process runs before the scheduler gives its core to another, while
    `processes` (default: the cores and two more) are busy: the median stretch run without a
    pause; None if none was paused (as many cores as processes)."""
    processes = processes or (os.cpu_count() or 1) + 2
    runs = [run for stretches in busy_together(_runs, processes, seconds) for run in stretches]
    return round(statistics.median(runs), 6) if runs else None


# -- the runtime's own costs ---------------------------------------------------------------------

def _reference_job(name: str, sizes: list[int], steps: int, pservers: int = 2,
                   trainers: int = 2) -> str:
    """A sync job of the MLP `sizes` (2 pservers x 2 trainers), for `steps` steps."""
    return (f"name: calibrate-{name}\nseed: 1\nmodel: {{name: mlp, sizes: {sizes}, optimizer: "
            "{type: sgd, learning_rate: 0.05}}\ndata: {name: digits, batch_size: 32}\n"
            f"cluster: {{pservers: {pservers}, trainers: {trainers}}}\n"
            "transpiler: {mode: sync}\n"
            f"train: {{steps: {steps}, deadline: 300s}}\n")


RUNTIME_REFERENCE = _reference_job("runtime", [64, 512, 64, 10], 80)
"""The job whose real runs measure the runtime's costs: messages from 40 bytes (a bias's
gradient) to 128 KiB (the 64 x 512 weights), both protocol sides, two of each role."""
BYTES_REFERENCE = _reference_job("bytes", [64, 1024, 512, 10], 40)
"""A job of messages up to 2 MiB (the 1024 x 512 weights), whose cost per byte, on the I/O
thread and by message kind, replaces the main reference's (`merge_bytes`): fitted to messages
of 128 KiB at most, it priced a 4 MB message half as dear again as it was. Its per-step work
is not kept: the work no timer sees grew with its bytes (0.85 ms a step against 0.4) and
priced a small job's step 50% too dear."""
PEERS_REFERENCE = _reference_job("peers", [64, 512, 64, 10], 80, pservers=1, trainers=1)
"""`RUNTIME_REFERENCE` with one pserver and one trainer: how the work no timer sees changes
with a node's peers (`merge_peers`). In this calibration's transfer benchmark, a 1x1 job had
come out 13% slow and a 3x2 one 17% fast from the 2 x 2 job's residuals alone."""
REFERENCE_PEERS = 2
"""The peers of each node of `RUNTIME_REFERENCE`: the pservers a trainer talks to, and the
trainers in a pserver's round."""
RUNTIME_RUNS = 3
"""Real runs of the reference job; the one whose nodes used the median CPU time is fitted
(`measure_runs`): the work no timer sees, per step, read 0.24 ms in one calibration and
0.61 ms in the next, ten minutes apart on a quiet machine."""


KIND_REFERENCES = {
    "table": """name: calibrate-table
seed: 1
model: {name: ctr_dnn, vocab: 20000, embed_dim: 8, hidden: [32], is_distributed: true,
        optimizer: {type: sgd, learning_rate: 0.05}}
data: {batch_size: 32}
cluster: {pservers: 2, trainers: 2}
transpiler: {mode: sync}
train: {steps: 40, deadline: 300s}
""",
    "collective": """name: calibrate-collective
seed: 1
model: {name: mlp, sizes: [64, 256, 10], optimizer: {type: sgd, learning_rate: 0.05}}
data: {name: digits, batch_size: 32}
cluster: {pservers: 1, trainers: 2}
transpiler: {mode: collective, collective_mode: grad_allreduce}
train: {steps: 40, deadline: 300s}
""",
}
"""Short jobs for the message kinds `RUNTIME_REFERENCE` never sends: a distributed table's
``prefetch`` (and its sparse sends), and the collective ring's messages. Their kinds are added
to the main reference's (`merge_kinds`)."""
FAMILY_REFERENCES = {"table": KIND_REFERENCES["table"]}
"""The job whose figures, whole, price each family of jobs (`runtime.services.job.Job.family`,
`family_variant`), run `RUNTIME_RUNS` times as the main reference is."""


@dataclass
class RuntimeRuns:
    """What the reference jobs measured: the runtime section, and the kernel samples of their
    nodes (the op types only a distributed table or the collective ring runs are among them)."""

    document: dict[str, Any]
    kernels: WorkTimes = field(default_factory=WorkTimes)


LOCAL_REFERENCE = """name: calibrate-local
seed: 1
model: {name: mlp, sizes: [64, 256, 10], optimizer: {type: sgd, learning_rate: 0.05}}
data: {name: digits, batch_size: 32}
cluster: {pservers: 1, trainers: 1}
transpiler: {mode: geo, geo_push_every: 1000}
train: {steps: 150, deadline: 300s}
"""
"""A job whose steps make no RPC (a geo trainer that never pushes): what a step and an op's
dispatch cost with no messages in the step (`fold_local`)."""


def measure_runtime(stream: TextIO, cores: int, guard: SpeedGuard | None = None
                    ) -> RuntimeRuns:
    """The runtime section of a profile of `RUNTIME_REFERENCE`, run for real on this machine
    of `cores` cores, with the message kinds of each of
    `KIND_REFERENCES` added, the per-step and per-op costs of `LOCAL_REFERENCE` (`fold_local`),
    and every reference job's kernel samples; each run taken again while `guard` finds the
    machine slow."""
    guard = guard or SpeedGuard()
    document, kernels = _profile_runtime("reference", RUNTIME_REFERENCE, stream, guard,
                                         RUNTIME_RUNS)
    print("  runtime: the local reference job, for a step without RPCs", file=stream, flush=True)
    local, _ = _profile_runtime("local", LOCAL_REFERENCE, stream, guard)
    document = fold_local(document, local, *ops_per_period(RUNTIME_REFERENCE))
    print("  runtime: the reference job with one pserver and one trainer, for the work no "
          "timer sees per peer", file=stream, flush=True)
    alone, _ = _profile_runtime("peers", PEERS_REFERENCE, stream, guard, RUNTIME_RUNS)
    document = merge_peers(document, fold_local(alone, local, *ops_per_period(PEERS_REFERENCE)),
                           cores)
    print("  runtime: the bytes reference job, for the cost of large messages", file=stream,
          flush=True)
    big, _ = _profile_runtime("bytes", BYTES_REFERENCE, stream, guard)
    document = merge_bytes(document, big, param_bytes(RUNTIME_REFERENCE),
                           param_bytes(BYTES_REFERENCE))
    families: dict[str, tuple[dict[str, Any], tuple[int, int]]] = {}
    for name, text in KIND_REFERENCES.items():
        print(f"  runtime: the {name} reference job, for its message kinds and op types",
              file=stream, flush=True)
        extra, more = _profile_runtime(name, text, stream, guard,
                                       RUNTIME_RUNS if name in FAMILY_REFERENCES else 1)
        if name in FAMILY_REFERENCES:
            families[name] = (fold_local(extra, local, *ops_per_period(text)), more.traffic)
        document = merge_kinds(document, extra)
        for op_type, samples in more.samples.items():
            kernels.samples.setdefault(op_type, []).extend(samples)
    document = dict(document, variants={
        name: family_variant(folded, document, traffic)
        for name, (folded, traffic) in families.items()})
    return RuntimeRuns(document, kernels)


def _profile_runtime(name: str, text: str, stream: TextIO, guard: SpeedGuard, runs: int = 1
                     ) -> tuple[dict[str, Any], WorkTimes]:
    """The runtime section of a profile of the job `text`, run for real (`runs` times: the
    median run's; each again while `guard` finds the machine slow), and its nodes' kernel
    calls with their work."""
    from runtime.launch.profile import measure_runs  # the launcher: imported when needed

    with tempfile.TemporaryDirectory(prefix="pslab-calibrate-") as tmp:
        path = Path(tmp) / f"{name}.yaml"
        write_atomic(path, text)
        scenario = parse_scenario(text, str(path))
        run, _ = measure_runs(path, [], scenario, Path(tmp) / "out", stream, runs=runs,
                              guard=guard)
    kernels = WorkTimes(traffic=(sum(n.messages for n in run.nodes),
                                 sum(n.bytes for n in run.nodes)))
    for op_type, samples in run.times.samples.items():
        if len(samples.flops) == len(samples.seconds):  # the work of each call was kept
            kernels.samples[op_type] = list(zip(samples.flops, samples.bytes, samples.seconds))
    return run.costs.document(), kernels


def job_curves(curves: dict[str, Any], runs: WorkTimes) -> dict[str, Any]:
    """Curves, fitted as the grid's are, for the op types the reference jobs ran and the grid
    (`curves`, by op type) did not: a distributed table's ``split_ids``, ``merge_ids`` and
    ``lookup_sparse_table``, for instance."""
    missing = WorkTimes({op: samples for op, samples in runs.samples.items()
                         if op not in curves})
    fitted, _ = fit_kernels(missing)
    return {op: curve.document() for op, curve in fitted.items()}


def ops_per_period(text: str) -> tuple[int, int]:
    """The compute ops a trainer of the job `text` runs per step (its main block's, RPC ops
    left out) and those a sync pserver of it runs per round (its sync blocks')."""
    job = Job.from_scenario(parse_scenario(text, "<reference>"))
    main = job.trainer_programs(0)[0]
    trainer = sum(1 for op in main.global_block().ops
                  if op.type not in OPS or OPS[op.type].runs == "kernel")
    pserver_main, _ = job.pserver_programs(0)
    contract = ServeContract.of(pserver_main)
    pserver = sum(len(pserver_main.blocks[i].ops) for i in contract.sync_blocks)
    return trainer, pserver


def fold_local(main: dict[str, Any], local: dict[str, Any], trainer_ops: int,
               pserver_ops: int) -> dict[str, Any]:
    """`main`'s runtime section with a step's and an op's cost taken from `local` (a job whose
    steps make no RPC), and what `main`'s steps and rounds cost beyond that owed by the steps
    that make an RPC (``step_residual``) and by the rounds (``round_residual``): a geo trainer's
    local step then costs what one costs, where the sync job's figures, spread over every
    step and op, priced it a fifth too high."""
    op = min(float(local["op_overhead"]), float(main["op_overhead"]))
    step = min(float(local["step_overhead"]), float(main["step_overhead"]))
    extra_op = float(main["op_overhead"]) - op
    return dict(main, op_overhead=op, step_overhead=step,
                step_residual=float(main.get("step_residual", 0.0))
                + float(main["step_overhead"]) - step + extra_op * trainer_ops,
                round_residual=float(main.get("round_residual", 0.0)) + extra_op * pserver_ops)


def param_bytes(text: str) -> int:
    """Bytes of the job `text`'s parameters: what a trainer of a sync job receives a step, and
    (with as many pservers as trainers, as the reference jobs have) a pserver a round."""
    job = Job.from_scenario(parse_scenario(text, "<reference>"))
    return sum(4 * math.prod(p.shape) for p in job.model.main.global_block().all_parameters())


def merge_bytes(main: dict[str, Any], big: dict[str, Any], main_bytes: int,
                big_bytes: int) -> dict[str, Any]:
    """`main`'s runtime section with the cost per byte of `big` (a job of larger messages,
    `big_bytes` of parameters against `main_bytes`): its I/O thread's, and each message
    kind's on either side that both measured, past the largest of `main`'s messages (a
    pserver's share of `main_bytes`: ``up_to``); up to it, `main`'s line holds. The work no
    timer sees grows with the bytes too: what `big`'s steps and rounds left unseen beyond
    `main`'s, per byte more received, goes on the cost per byte past that of what a trainer
    receives (``reply``) and a pserver (``send``).

    DESIGN: `big`'s cost per byte all the way priced the reference job's own 129 KiB replies at
    177 us where it measured 305 (a reply's decoding costs more a byte below the caches' sizes
    than a large one's copy does), and its sends at more than they cost."""
    up_to = main_bytes // REFERENCE_PEERS
    messages = {side: dict(kinds) for side, kinds in main.get("messages", {}).items()}
    for side, kinds in messages.items():
        for kind, cost in kinds.items():
            other = big.get("messages", {}).get(side, {}).get(kind)
            if other is not None:
                kinds[kind] = dict(cost, up_to=up_to, beyond=other["per_byte"])
    more = max(big_bytes - main_bytes, 1)
    for kind, residual in (("reply", "step_residual"), ("send", "round_residual")):
        unseen = max(float(big.get(residual, 0.0)) - float(main.get(residual, 0.0)), 0.0)
        cost = messages.get(RECEIVES, {}).get(kind)
        if cost is not None:
            messages[RECEIVES][kind] = dict(cost, up_to=up_to, beyond=float(
                cost.get("beyond", cost["per_byte"])) + unseen / more)
    if "io_by_size" in main:  # the I/O thread's cost by size is measured apart
        return dict(main, messages=messages)
    io = dict(main.get("io", {}), per_byte=big.get("io", {}).get("per_byte", 0.0))
    return dict(main, messages=messages, io=io)


def merge_peers(main: dict[str, Any], alone: dict[str, Any], cores: int) -> dict[str, Any]:
    """`main` (folded, `REFERENCE_PEERS` peers a node) with how its residuals change, from
    `alone` (the same job with one pserver and one trainer, folded the same way), on a machine
    of `cores` cores: a trainer's step residual per pserver it talks to, a pserver's round
    residual per node beyond the cores on its host (`RuntimeCosts.round_residual_per_node`
    says why not per trainer in its round; none where neither job has more nodes than cores).
    DESIGN: what no timer sees grows with a node's peers (a reply to wait for and resolve per
    pserver), more than the event loop's wake-up per message (`loop_per_message`) accounts
    for, and with the processes it takes turns with; fitted as lines through the two jobs.
    The two jobs' received SENDs also split what is the round's from what is the message's
    (`_round_of_sends`)."""
    peers = REFERENCE_PEERS - 1
    # an n x n job's 2n nodes share this machine
    crowded, alone_crowded = (crowding(2 * n, cores) for n in (REFERENCE_PEERS, 1))
    more = crowded - alone_crowded
    merged = dict(main, residual_peers=float(REFERENCE_PEERS),
                  step_residual_per_peer=(float(main["step_residual"])
                                          - float(alone["step_residual"])) / peers,
                  round_residual_per_peer=0.0)
    if more:
        merged.update(residual_crowding=crowded, round_residual_per_node=(
            float(main["round_residual"]) - float(alone["round_residual"])) / more)
    return _round_of_sends(merged, alone)


def _round_of_sends(main: dict[str, Any], alone: dict[str, Any]) -> dict[str, Any]:
    """`main` with the part of a received SEND's cost that is the round's moved onto the
    round: a SEND costs ``a + X / trainers`` (`REFERENCE_PEERS` trainers in `main`'s rounds,
    one in `alone`'s), so ``X`` goes on ``round_residual`` and ``a`` stays on the message.

    DESIGN: the timers put a round's own work (the round begun and ended, the replies it
    releases made ready) on the message that completes it. Per received SEND, twelve jobs of
    the reference model measured 0.78-0.90 ms with one trainer a round, 0.72-0.75 with two,
    0.51-0.58 with four and 0.53 with six; at the 2 x 2 job's price, a 1 x 6 pserver's
    rounds cost 1.4 ms more than they took."""
    send, send_alone = (job.get("messages", {}).get(RECEIVES, {}).get("send")
                        for job in (main, alone))
    if send is None or send_alone is None:
        return main
    trainers = REFERENCE_PEERS
    per_round = max(float(send_alone["per_message"]) - float(send["per_message"]), 0.0) \
        * trainers / (trainers - 1)
    received = dict(main["messages"][RECEIVES], send=dict(
        send, per_message=float(send["per_message"]) - per_round / trainers))
    return dict(main, messages=dict(main["messages"], **{RECEIVES: received}),
                round_residual=float(main["round_residual"]) + per_round)


def family_variant(family: dict[str, Any], main: dict[str, Any],
                   traffic: tuple[int, int]) -> dict[str, Any]:
    """The runtime section that prices a family of jobs (a variant of the machine file's
    runtime section, `RuntimeCosts.for_job`): what its reference job measured (`family`,
    folded as `main` was, `fold_local`), with `main`'s per-peer slopes (`merge_peers`) and
    CurveZMQ's cost, and the message kinds only `main` measured. Its I/O thread's cost per
    byte is `main`'s, and what the family job's I/O threads spent beyond that on its `traffic`
    (messages, bytes, over its nodes) is per message. DESIGN: a byte costs the I/O thread what
    it costs in any job; the table job's small messages left its own per-byte figure 28 times
    `main`'s, and a ctr_dnn job of larger messages came out slow."""
    peers = {key: main[key] for key in ("residual_peers", "step_residual_per_peer",
                                        "round_residual_per_peer", "residual_crowding",
                                        "round_residual_per_node", "curve") if key in main}
    variant = merge_kinds(dict(family, **peers), main)
    variant.pop("variants", None)
    messages, nbytes = traffic
    io, per_byte = family.get("io", {}), float(main.get("io", {}).get("per_byte", 0.0))
    if "io_by_size" in family:  # fitted beyond the measured curve: its per message is its own
        return variant
    if messages:
        spent = float(io.get("per_message", 0.0)) * messages \
            + float(io.get("per_byte", 0.0)) * nbytes
        variant["io"] = {"per_message": max(spent - per_byte * nbytes, 0.0) / messages,
                         "per_byte": per_byte}
    return variant


def merge_kinds(main: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`main` with each message kind (per side) that only `extra` measured added."""
    merged = dict(main, messages={side: dict(kinds)
                                  for side, kinds in main.get("messages", {}).items()})
    for side, kinds in extra.get("messages", {}).items():
        into = merged["messages"].setdefault(side, {})
        for kind, cost in kinds.items():
            if kind != "*" and kind not in into:
                into[kind] = cost
    return merged


# -- the file --------------------------------------------------------------------------------------

KERNEL_THREADS = 1
"""Threads the kernels are calibrated with: a node's when the nodes outnumber the cores (as
`runtime up` starts them: `runtime.launch.launcher.kernel_threads`), and the only count whose
CPU time `time.thread_time` measures whole (a BLAS thread's time is not the caller's)."""


def backend_kernels(backend: str, refs: list[Reference], budget: float, stream: TextIO
                    ) -> dict[str, Any]:
    """`backend`'s curves, fallback, sample counts and skipped references: measured in this
    process (call it with the kernels' threads capped, as `measure_backend` does)."""
    run = measure_kernels(backend, refs, budget, stream)
    curves, pooled_curve = fit_kernels(run.times)
    return {"curves": {op: curve.document() for op, curve in curves.items()},
            "fallback": None if pooled_curve is None else pooled_curve.document(),
            "samples": {op: len(s) for op, s in sorted(run.times.samples.items())},
            "skipped": run.skipped, "slow": run.slow}


def measure_backend(backend: str, quick: bool, budget: float, stream: TextIO) -> dict[str, Any]:
    """`backend_kernels` in a child process whose kernels use `KERNEL_THREADS` threads (BLAS
    reads its thread count when it loads, so it cannot be capped afterwards in this one)."""
    from runtime.launch.launcher import THREAD_VARS, node_environment

    env = node_environment()
    env.update({name: str(KERNEL_THREADS) for name in THREAD_VARS})
    with tempfile.TemporaryDirectory(prefix="pslab-calibrate-") as tmp:
        out = Path(tmp) / "kernels.json"
        command = [sys.executable, "-m", "runtime.launch.calibrate", backend, str(budget),
                   str(out)] + (["--quick"] if quick else [])
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as child:
            assert child.stdout is not None
            lines = []
            for line in child.stdout:
                lines.append(line)
                print(line, end="", file=stream, flush=True)
        if child.returncode != 0 or not out.exists():
            raise CalibrationError(f"measuring the {backend} kernels failed (exit "
                                   f"{child.returncode}): {''.join(lines[-5:]).strip()}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def calibrate(stream: TextIO, backends: list[str] | None = None, quick: bool = False,
              budget: float = 120.0, runtime: bool = True) -> dict[str, Any]:
    """The machine document (see the module): kernels on each backend, how processes share
    the cores, then the runtime."""
    started = time.monotonic()
    backends = backends or ["numpy"] + (["torch"] if find_spec("torch") else [])
    share = budget * (0.7 if runtime else 0.9) / len(backends)
    measured = {backend: measure_backend(backend, quick, share, stream) for backend in backends}
    document: dict[str, Any] = {
        "format": FORMAT, "version": VERSION,
        "kernels": {b: m["curves"] for b, m in measured.items()},
        "fallback": {b: m["fallback"] for b, m in measured.items() if m["fallback"]}}
    cores = os.cpu_count() or 1
    print(f"  cores: 1 to {cores + 2} busy processes on {cores} cores", file=stream, flush=True)
    guard = SpeedGuard(deadline=started + budget)  # retries stop at the budget
    (rates, slice_), _ = guard.measure(
        "cores", lambda _: (measure_sharing(cores + 2, cores=cores), measure_slice(cores + 2)))
    document["cores"] = {"count": cores, "rates": rates, "slice": slice_}
    from_jobs: list[str] = []
    if runtime:
        print("  runtime: a 2 x 2 reference job, run for real", file=stream, flush=True)
        runs = measure_runtime(stream, cores, guard)
        document["runtime"] = runs.document
        if "numpy" in document["kernels"]:  # the jobs ran the numpy kernels
            extra = job_curves(document["kernels"]["numpy"], runs.kernels)
            document["kernels"]["numpy"].update(extra)
            from_jobs = sorted(extra)
    document["meta"] = {
        "machine": machine(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - started, 1), "quick": quick,
        "kernel_threads": KERNEL_THREADS, "grid": [r.name for r in grid(quick)],
        "skipped": {b: m["skipped"] for b, m in measured.items()},
        "slow": {**{b: m.get("slow", {}) for b, m in measured.items()},
                 "machine": guard.slow},
        "from_jobs": from_jobs,
        "samples": {b: m["samples"] for b, m in measured.items()}}
    return document


def write_machine(path: Path, document: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(document, indent=1) + "\n")


def summary(document: dict[str, Any]) -> Iterator[str]:
    """What a calibration holds, for people: op types per backend and their range."""
    for backend, curves in document["kernels"].items():
        yield f"{backend}: {len(curves)} op types"
        for op, curve in sorted(curves.items()):
            points = curve["points"]
            yield (f"  {op:<28} {len(points):>3} sizes  {curve['feature']:<5} "
                   f"{points[0][0]:.3g} .. {points[-1][0]:.3g}  "
                   f"{points[0][1] * 1e6:.1f} .. {points[-1][1] * 1e6:.1f} us")
    if "cores" in document:
        rates = ", ".join(f"{m + 1}: {r:.2f}" for m, r in enumerate(document["cores"]["rates"]))
        yield f"cores: {document['cores']['count']}; a busy process's rate by how many: {rates}"
        if document["cores"].get("slice"):
            yield (f"scheduler: a busy process keeps a core for "
                   f"{document['cores']['slice'] * 1e3:.2f} ms while others wait (median)")
    if "runtime" in document:
        yield ("runtime: measured on a 2 x 2 reference job, a step without RPCs on a local "
               "job, and the message kinds of "
               + " and ".join(f"a {name} job" for name in KIND_REFERENCES)
               + "".join(f"; the {name} reference job's figures price the {name} family"
                         for name in document["runtime"].get("variants", {})))
    if document["meta"].get("from_jobs"):
        yield ("op types priced from the reference jobs' runs: "
               + ", ".join(document["meta"]["from_jobs"]))
    slow = {name: x for named in document["meta"].get("slow", {}).values()
            for name, x in named.items()}
    if slow:
        yield (f"measured while the machine ran slow, {len(slow)} times (up to "
               f"x{max(slow.values()):.2f}), each kept after up to {PROBE_TRIES} tries: "
               + ", ".join(sorted(slow)) + "; calibrate again on a quiet machine to replace them")
    skipped = {b: s for b, s in document["meta"].get("skipped", {}).items() if s}
    for backend, names in skipped.items():
        yield f"{backend}: over the time budget, skipped {', '.join(names)}"


def main(argv: list[str] | None = None) -> int:
    """The child process of `measure_backend`: BACKEND BUDGET OUT [--quick]."""
    args = sys.argv[1:] if argv is None else argv
    backend, budget, out = args[0], float(args[1]), Path(args[2])
    from runtime.services.node import cap_kernel_threads
    cap_kernel_threads(backend, os.environ)
    write_atomic(out, json.dumps(backend_kernels(backend, grid("--quick" in args), budget,
                                                 sys.stdout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
