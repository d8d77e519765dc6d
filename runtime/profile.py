"""`runtime profile`: measure what each op type's kernel takes in a real run, for the simulator.

The scenario's job runs for real in this process: `runtime.cluster.run_job` with every pserver
and trainer a task of one event loop, talking over loopback ZeroMQ, and every executor timing its
kernels (`runtime.executor.timing_kernels`). Each kernel call is a sample: the op's type, the
elements of its outputs right after it ran, and its real duration. RPC ops have no kernel and are
not measured (the simulator's network prices them); neither are waits. A control-flow op's
duration includes the ops its sub-blocks ran, as the runtime charges it as one op.

Each op type gets one of two fits, both of which reproduce the type's measured total exactly:

- per call: ``total seconds / calls``;
- per element: ``total seconds / total output elements`` (the least-squares fit of
  ``seconds = s * elements`` when a call's noise grows with its size).

The per-element fit is kept when the op type's calls wrote outputs of at least two sizes and it
leaves less than `PER_ELEMENT_GAIN` times the squared error of the per-call fit; otherwise (one
size only, or no clear gain) per call, which extrapolates least.
Elements are counted as `sim.cost.Profile` counts them: every array, LoDTensor's data or
SelectedRows' values an output slot holds.

The result is the profile file `sim.cost.load_profile` reads,
``{"ops": {op_type: seconds | {"per_element": seconds}}, "default": 0.0, "meta": {...}}``;
op types the run did not execute cost ``default`` (nothing) in the simulator. ``meta`` says what
was run, where, and the calls, seconds, elements and chosen fit of every op type.
Timing-mode scenarios (phantom kernels) compute nothing and cannot be profiled.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from transpiler.ir import Op

from .cluster import run_job
from .executor import timing_kernels
from .job import Job
from .launch import free_endpoints
from .node import run_async
from .scenario import Scenario
from .scope import Scope
from .tensor import LoDTensor, SelectedRows, Value
from .zmq_transport import ZmqTransport

PER_ELEMENT_GAIN = 0.5
"""The per-element fit must leave under this share of the per-call fit's squared error."""

FitKind = Literal["per_call", "per_element"]
StepObserver = Callable[[int, int, float, float], None]
"""`on_step(trainer_id, step, loss, seconds)`, as `runtime.cluster.run_job` calls it."""


class ProfileError(RuntimeError):
    """The scenario cannot be profiled, or its run failed; the message names the culprit."""


# -- measuring ---------------------------------------------------------------------------------

@dataclass
class OpSamples:
    """The calls of one op type: output elements and seconds of each."""

    elements: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


class KernelTimes:
    """A `runtime.executor.KernelTimer` that keeps every call's sample, per op type."""

    def __init__(self) -> None:
        self.samples: dict[str, OpSamples] = {}

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        samples = self.samples.setdefault(op.type, OpSamples())
        samples.elements.append(output_elements(op, scope))
        samples.seconds.append(seconds)

    @property
    def calls(self) -> int:
        return sum(len(s.seconds) for s in self.samples.values())


def _elements(value: Value) -> int:
    if isinstance(value, LoDTensor):
        return int(value.data.size)
    if isinstance(value, SelectedRows):
        return int(value.values.size)
    return int(value.size) if isinstance(value, np.ndarray) else 0


def output_elements(op: Op, scope: Scope) -> int:
    """Elements of the values `op`'s outputs hold in `scope` (as `sim.cost.Profile` counts)."""
    return sum(_elements(scope.get_tensor(name)) for names in op.outputs.values()
               for name in names if scope.has(name))


# -- fitting -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpFit:
    """One op type's measurements and the fit chosen for its profile entry."""

    op_type: str
    calls: int
    seconds: float
    elements: int
    kind: FitKind
    value: float

    def entry(self) -> float | dict[str, float]:
        return self.value if self.kind == "per_call" else {"per_element": self.value}

    def meta(self) -> dict[str, Any]:
        return {"calls": self.calls, "seconds": self.seconds, "elements": self.elements,
                "fit": self.kind}


def fit_op(op_type: str, samples: OpSamples) -> OpFit:
    """Per call or per element, whichever `PER_ELEMENT_GAIN` says (see the module doc)."""
    n = np.asarray(samples.elements, dtype=np.float64)
    t = np.asarray(samples.seconds, dtype=np.float64)
    total, elements = float(t.sum()), int(n.sum())
    per_call = total / len(t)
    fit = OpFit(op_type, len(t), total, elements, "per_call", per_call)
    if elements == 0 or len(np.unique(n)) < 2:
        return fit
    per_element = total / elements
    if np.sum((t - per_element * n) ** 2) < PER_ELEMENT_GAIN * np.sum((t - per_call) ** 2):
        return OpFit(op_type, len(t), total, elements, "per_element", per_element)
    return fit


def fit_all(times: KernelTimes) -> list[OpFit]:
    """Every measured op type's fit, the most expensive in total first."""
    fits = [fit_op(op_type, s) for op_type, s in times.samples.items()]
    return sorted(fits, key=lambda f: (-f.seconds, f.op_type))


# -- running -----------------------------------------------------------------------------------

def check_profilable(scenario: Scenario, source: str) -> None:
    if scenario.backend.kernels == "phantom":
        raise ProfileError(
            f"{source}: cannot profile backend.kernels phantom (timing mode): its kernels "
            "compute only shapes, so there is no real compute time to measure; profile with real "
            "kernels (--set backend.kernels=numpy or torch)")


async def _run_before_deadline(job: Job, on_step: StepObserver | None) -> None:
    deadline = job.scenario.train.deadline
    try:
        await asyncio.wait_for(run_job(job, ZmqTransport, on_step=on_step), deadline)
    except TimeoutError:
        raise ProfileError(f"{job.scenario.name}: the run did not finish within train.deadline "
                           f"({deadline:g}s)") from None


def measure(scenario: Scenario, source: str, on_step: StepObserver | None = None) -> KernelTimes:
    """Run `scenario`'s job for real in this process (pservers on free loopback ports) and
    return the duration of every kernel call."""
    check_profilable(scenario, source)
    job = Job.from_scenario(scenario, free_endpoints("127.0.0.1", scenario.cluster.pservers))
    times = KernelTimes()
    with timing_kernels(times):
        run_async(_run_before_deadline(job, on_step))
    if not times.samples:
        raise ProfileError(f"{source}: the run executed no compute op, so nothing was measured")
    return times


# -- the file ----------------------------------------------------------------------------------

def _meta(scenario: Scenario, source: str, fits: list[OpFit]) -> dict[str, Any]:
    return {
        "tool": "runtime profile",
        "scenario": scenario.name,
        "source": source,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "backend": scenario.backend.model_dump(),
        "cluster": {"pservers": scenario.cluster.pservers, "trainers": scenario.cluster.trainers},
        "steps": scenario.train.steps,
        "batch_size": scenario.data.batch_size,
        "host": {"platform": platform.platform(), "python": platform.python_version(),
                 "numpy": np.__version__, "cpus": os.cpu_count()},
        "fit": "per_call: total seconds / calls; per_element: total seconds / output elements, "
               f"kept when its squared error is under {PER_ELEMENT_GAIN} of per_call's",
        "ops": {f.op_type: f.meta() for f in fits},
    }


def profile_document(scenario: Scenario, source: str, fits: list[OpFit]) -> dict[str, Any]:
    """The profile file's content, in the format `sim.cost.load_profile` reads."""
    return {"ops": {f.op_type: f.entry() for f in sorted(fits, key=lambda f: f.op_type)},
            "default": 0.0, "meta": _meta(scenario, source, fits)}


def write_profile(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def format_table(fits: list[OpFit], top: int = 10) -> list[str]:
    """The `top` op types by total kernel time, with their calls and profile entry."""
    lines = [f"{'op type':<32} {'calls':>7} {'total ms':>10} {'share':>6}  entry"]
    total = sum(f.seconds for f in fits) or 1.0
    for f in fits[:top]:
        entry = f"{f.value * 1e6:.3f}us/call" if f.kind == "per_call" \
            else f"{f.value * 1e9:.4f}ns/element"
        lines.append(f"{f.op_type:<32} {f.calls:>7} {f.seconds * 1e3:>10.3f} "
                     f"{f.seconds / total:>6.1%}  {entry}")
    if len(fits) > top:
        rest = fits[top:]
        lines.append(f"{f'({len(rest)} more)':<32} {sum(f.calls for f in rest):>7} "
                     f"{sum(f.seconds for f in rest) * 1e3:>10.3f}")
    return lines


__all__ = ["KernelTimes", "OpFit", "OpSamples", "PER_ELEMENT_GAIN", "ProfileError",
           "check_profilable", "fit_all", "fit_op", "format_table", "measure",
           "output_elements", "profile_document", "write_profile"]
