"""How much of a trainer's backward its gradients' sends could overlap, and how much they do.

A trainer's send of a gradient can travel while the rest of backward runs only if that
gradient is ready before backward ends. This measures, for each model of
benchmarks/vs_ddp.py (its rows, 2 pservers x 2 trainers, sync, the default protocol), in one
process on this machine:

- each parameter's gradient: when its kernel has finished, in ms from the start of backward
  (the loss's gradient), how much backward is left after it, and its bytes;
- each pserver's SEND in the trainer program as the transpiler wrote it (`BarrierPlan`: the
  bundled protocol holds a run of sends to an endpoint until its last one): the backward left
  when it leaves, which is what the protocol overlaps today;
- the forward that runs before the largest parameter is first read: what replying with each
  block as its update ends (the next step's forward starting on the parameters already back)
  could overlap with the rest of the replies at most;
- the summary: the share of the gradients' bytes that are ready with more than
  ``--enough`` of backward left (what sending each gradient as it is ready could hide at most).

Kernel times are the local program's own (its forward and its backward as the ops' roles
say, `OpRole`; the optimizer's ops left out; `timing_kernels`, median over ``--steps`` steps
after ``--warmup``), on one kernel thread
(as a node of a 2 x 2 job on this 2-core machine runs them); the trainer program's slicing ops
(``split_byref``: views, no copy) are not timed. Gradients of a parameter are matched by name
(``mlp.fc1.w@GRAD``, its blocks and per-trainer copies alike).

Run: python benchmarks/overlap.py [--only mlp-1024,...] [--steps 12] [--batch 32]
         [--enough 1.0] [--quick]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass

from vs_ddp import ROWS, Row, scenario_text

from runtime.config.scenario import parse_scenario
from runtime.execution.executor import Executor, set_kernel_threads, timing_kernels
from runtime.execution.scope import Scope
from runtime.services.job import Job
from transpiler.ir import Op, OpRole

GRAD = re.compile(r"^(?P<param>.+?)@GRAD(\.block\d+)?(\.trainer_\d+)?$")


@dataclass
class Ready:
    """A parameter's gradient: when backward has produced it."""

    param: str
    at: float
    """Seconds from the start of backward to the end of the kernel that wrote it."""
    left: float
    """Seconds of backward after it."""
    nbytes: int


class OpTimes:
    """A `KernelTimer`: each call's seconds, in the order the ops ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[Op, float]] = []

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        self.calls.append((op, seconds))


def param_of(name: str) -> str | None:
    match = GRAD.match(name)
    return match["param"] if match else None


@dataclass
class Step:
    """The local program's step, as its kernels took it."""

    ready: list[Ready]
    forward: float
    backward: float
    largest: Ready
    before_largest: float
    """Seconds of forward before the first op that reads the largest parameter."""


def backward_of(job: Job, steps: int, warmup: int, batch: int) -> Step:
    """Each parameter's gradient as the local program's backward produced it, and the step's
    parts (medians over the timed steps)."""
    model, timer = job.model, OpTimes()
    with timing_kernels(timer):
        executor = Executor("numpy")
    scope = Scope()
    executor.run(model.startup, scope=scope)
    runs: list[list[tuple[Op, float]]] = []
    for step in range(warmup + steps):
        timer.calls.clear()
        executor.run(model.main, feed=job.dataset.batch(step, batch, model.feeds),
                     fetch_list=[model.loss], scope=scope)
        if step >= warmup:
            runs.append(list(timer.calls))
    ops = [op for op, _ in runs[0]]
    seconds = [statistics.median(run[i][1] for run in runs) for i in range(len(ops))]
    backward = [i for i, op in enumerate(ops) if op.role & OpRole.Backward]  # from the loss's
    total = sum(seconds[i] for i in backward)
    ready, at = [], 0.0
    for i in backward:
        at += seconds[i]
        for name in (n for names in ops[i].outputs.values() for n in names):
            param = param_of(name)
            if param in model.params:
                ready.append(Ready(param, at, total - at, int(scope.get(name).nbytes)))
    largest = max(ready, key=lambda r: r.nbytes)
    reads = next(i for i, op in enumerate(ops)
                 if largest.param in (n for names in op.inputs.values() for n in names))
    return Step(ready, sum(seconds[:backward[0]]), total, largest, sum(seconds[:reads]))


def sends_of(job: Job) -> dict[str, str]:
    """Endpoint -> the parameter whose gradient is the last its trainer-0 SEND carries (the
    bundle leaves with it)."""
    main, _ = job.trainer_programs(0)
    last: dict[str, str] = {}
    for op in main.blocks[0].ops:
        if op.type != "send":
            continue
        for name, endpoint in zip(op.inputs.get("X", []), op.attrs.get("epmap", [])):
            param = param_of(name)
            if param is not None:
                last[endpoint] = param
    return last


def report(row: Row, args: argparse.Namespace) -> float:
    """Print the row's table; return the share of its gradient bytes ready early enough."""
    job = Job.from_scenario(parse_scenario(scenario_text(row, args.steps, args.batch),
                                           f"{row.name}.yaml"))
    step = backward_of(job, args.steps, args.warmup, args.batch)
    ready, forward, backward = step.ready, step.forward, step.backward
    by_param = {r.param: r for r in ready}
    total = sum(r.nbytes for r in ready)
    print(f"\n{row.name}: {row.label()}, batch {args.batch}: forward {forward * 1e3:.2f} ms, "
          f"backward {backward * 1e3:.2f} ms, gradients {total / 1024:,.0f} KiB")
    print(f"  {'gradient':<14} {'ready at ms':>11} {'left ms':>8} {'KiB':>9} {'share':>6}")
    for r in ready:
        print(f"  {r.param:<14} {r.at * 1e3:11.2f} {r.left * 1e3:8.2f} {r.nbytes / 1024:9,.0f} "
              f"{r.nbytes / total:6.1%}")
    for endpoint, param in sorted(sends_of(job).items()):
        print(f"  SEND to {endpoint} leaves after {param}'s gradient: "
              f"{by_param[param].left * 1e3:.2f} ms of backward left")
    print(f"  forward before {step.largest.param} is read: {step.before_largest * 1e3:.2f} ms")
    early = sum(r.nbytes for r in ready if r.left >= args.enough * 1e-3) / total
    print(f"  {early:.1%} of the gradient bytes are ready with {args.enough:g} ms or more of "
          "backward left")
    return early


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated rows (default: all)")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (12)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    parser.add_argument("--batch", type=int, default=32, help="per trainer (32)")
    parser.add_argument("--enough", type=float, default=1.0,
                        help="ms of backward left that count as room to overlap (1.0)")
    parser.add_argument("--quick", action="store_true",
                        help="the small MLP, 2 steps (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.only, args.steps, args.warmup = "mlp-small", 2, 1
    return args


def main() -> None:
    args = parse_args()
    names = args.only.split(",") if args.only else [row.name for row in ROWS]
    unknown = set(names) - {row.name for row in ROWS}
    if unknown:
        sys.exit(f"unknown rows {sorted(unknown)}; rows: {[row.name for row in ROWS]}")
    set_kernel_threads("numpy", 1)
    shares = {row.name: report(row, args) for row in ROWS if row.name in names}
    print("\nsummary: share of gradient bytes with room to overlap: "
          + ", ".join(f"{name} {share:.1%}" for name, share in shares.items()))


if __name__ == "__main__":
    main()
