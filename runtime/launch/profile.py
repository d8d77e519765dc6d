"""`runtime profile`: measure what a real run of a scenario costs, for the simulator.

The scenario's job runs for real, as `runtime up` runs it (`runtime.launch.launcher`: one process
per node on this host), with every node measuring (``PSLAB_MEASURE=1``, `runtime.services.node`):
each kernel call (the op's type, the elements of its outputs right after it ran, its duration on
`time.perf_counter`) and the runtime's own costs (`runtime.execution.costs.Meter`: messages by kind
and size on both sides, the executor's per-op overhead, the trainer's per-step and the pserver's
per-round work, and what no timer sees, from the process's CPU time). RPC ops have no kernel;
the network and the runtime's message costs price them. A control-flow op's duration includes
the ops its sub-blocks ran, as the runtime charges it as one op.

Each op type gets one of two fits, both of which reproduce the type's measured total exactly:

- per call: ``total seconds / calls``;
- per element: ``total seconds / total output elements`` (the least-squares fit of
  ``seconds = s * elements`` when a call's noise grows with its size).

The per-element fit is kept when the op type's calls wrote outputs of at least two sizes and it
leaves less than `PER_ELEMENT_GAIN` times the squared error of the per-call fit; otherwise (one
size only, or no clear gain) per call, which extrapolates least.
Elements are counted as `sim.cost.Profile` counts them: every array, LoDTensor's data or
SelectedRows' values an output slot holds. The runtime's costs are fitted by
`runtime.execution.costs.fit_costs`.

The result is the profile file `sim.cost.load_profile` reads,
``{"ops": {op_type: seconds | {"per_element": seconds}}, "default": 0.0, "runtime": {...},
"meta": {...}}``; op types the run did not execute cost ``default`` (nothing) in the
simulator. ``meta`` says what was run, on which machine, the step times the run measured, and
the calls, seconds, elements and chosen fit of every op type and the CPU of every node.
Timing-mode scenarios (phantom kernels) compute nothing and cannot be profiled.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import time
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np

from runtime.config.atomic import write_atomic
from runtime.config.metrics import JobMetrics, read_metrics
from runtime.config.scenario import ExpectSpec, Scenario
from runtime.execution.costs import (CurveCosts, KernelTimes, NodeCosts, OpSamples, RuntimeCosts,
                                     SpanCost, calibrate_curve_least, calibrate_span, fit_costs,
                                     machine)
from runtime.launch.io_curve import IoCurves, measure_io_curves
from runtime.launch.launcher import launch
from runtime.launch.speed import PROBE_TRIES, SpeedGuard
from runtime.services.node import MEASURE_VAR, run_async

PER_ELEMENT_GAIN = 0.5
"""The per-element fit must leave under this share of the per-call fit's squared error."""

FitKind = Literal["per_call", "per_element"]


class ProfileError(RuntimeError):
    """The scenario cannot be profiled, or its run failed; the message names the culprit."""


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


@dataclass(frozen=True)
class Calibration:
    """What measuring and the runtime's untimed work cost on this machine, measured apart from
    the run: `spans` (`calibrate_span`), the event loop's per message received
    (`calibrate_loop`), what CurveZMQ costs the I/O thread (`calibrate_curve_least`: an
    encrypted job's profile prices encryption at this machine's figures, as every other runtime
    cost), and the I/O thread's cost of a small message and what a message's size adds to it,
    between two processes over local sockets and over TCP (`runtime.launch.io_curve`)."""

    spans: SpanCost
    loop_per_message: float
    curve: CurveCosts
    io_by_size: IoCurves

    def document(self) -> dict[str, Any]:
        return {"span": self.spans.document(), "io_per_message": self.io_by_size.per_message,
                "loop_per_message": self.loop_per_message, "curve": self.curve.document(),
                "io_by_size": self.io_by_size.local.document(),
                "io_by_size_tcp": self.io_by_size.tcp.document()}


@functools.cache
def io_by_size() -> IoCurves:
    """`measure_io_curves`, once a process: `runtime calibrate` profiles several reference
    jobs, and each of their fits is to use the same curves."""
    return measure_io_curves()


def calibrate() -> Calibration:
    return Calibration(calibrate_span(), calibrate_loop(), calibrate_curve_least(), io_by_size())


def calibrate_loop(messages: int = 400, batches: int = 5) -> float:
    """Seconds of main-thread CPU the event loop spends to wake for one message and hand it to
    the task waiting in `recv`, as a node's loop does (uvloop where installed, the runtime's
    `ZmqTransport`): `messages` round trips through a ZeroMQ proxy that echoes each message
    back (in C, on a thread of its own, so that none of its CPU is this thread's), each sent
    when the last came back; less what the sends cost (a node times its sends), timed apart
    as a run of sends alone. The median of `batches` such measurements: a wake-up's cost
    varies with what else the machine does."""
    import threading

    import zmq

    from runtime.network.transport import UnknownPeerError
    from runtime.network.zmq_transport import ZmqTransport

    async def measure() -> float:
        transport = ZmqTransport("calibration")
        address = transport.bind_nowait("127.0.0.1:0")
        context = zmq.Context(io_threads=1)
        out, back = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
        control, steer = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        control.bind("inproc://calibrate-loop")
        steer.connect("inproc://calibrate-loop")
        for socket, name in ((out, b"out"), (back, b"back")):
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IDENTITY, name)
            socket.connect(address)
        proxy = threading.Thread(target=zmq.proxy_steerable, args=(out, back, None, steer),
                                 name="calibrate-loop", daemon=True)
        proxy.start()
        payload = [b"h" * 64]

        async def round_trips(count: int) -> None:
            for _ in range(count):
                transport.send_nowait("out", payload)
                await transport.recv()

        try:
            for _ in range(5000):  # until both connections are up
                try:
                    transport.send_nowait("out", payload)
                    break
                except UnknownPeerError:
                    await asyncio.sleep(0.001)
            await transport.recv()
            await round_trips(50)
            costs = []
            for _ in range(batches):
                started = time.thread_time()
                await round_trips(messages)
                trips = time.thread_time() - started
                alone = min(messages, 500)  # under the high-water mark: every send goes at once
                started = time.thread_time()
                for _ in range(alone):
                    transport.send_nowait("out", payload)
                sends = (time.thread_time() - started) * messages / alone
                for _ in range(alone):
                    await transport.recv()
                costs.append(max(trips - sends, 0.0) / messages)
        finally:
            control.send(b"TERMINATE")
            proxy.join(timeout=5)
            for socket in (out, back, control, steer):
                socket.close()
            context.term()
            await transport.close()
        return float(np.median(costs))

    return run_async(measure())


@dataclass
class ProfileRun:
    """What a measured real run gave: kernel samples, runtime costs, and the run's metrics."""

    times: KernelTimes
    costs: RuntimeCosts
    nodes: list[NodeCosts]
    metrics: JobMetrics
    calibration: Calibration | None = None


def read_measurements(out: Path) -> tuple[KernelTimes, dict[str, dict[str, Any]]]:
    """Every node's OUT/nodes/<role>-<index>.costs.json: merged kernel samples, and each
    node's record by node name."""
    times = KernelTimes()
    records = {}
    for path in sorted((out / "nodes").glob("*.costs.json")):
        record = json.loads(path.read_text())
        for op_type, samples in record.pop("kernels").items():
            times.merge(op_type, samples["elements"], samples["seconds"],
                        samples.get("flops"), samples.get("bytes"))
        records[path.name.removesuffix(".costs.json").replace("-", ":")] = record
    return times, records


def measure(scenario_path: Path, overrides: list[str], scenario: Scenario, out: Path,
            stream: TextIO, netns: bool = False) -> ProfileRun:
    """Run `scenario`'s job as `runtime up` does (`netns`: as ``runtime up --netns``), every
    node measuring; its output in `out`."""
    check_profilable(scenario, str(scenario_path))
    previous = os.environ.get(MEASURE_VAR)
    os.environ[MEASURE_VAR] = "1"
    unjudged = scenario.model_copy(update={"expect": ExpectSpec()})  # a short run may miss them
    try:
        code = launch(scenario_path, overrides, unjudged, out, stream, netns=netns)
    finally:
        if previous is None:
            del os.environ[MEASURE_VAR]
        else:
            os.environ[MEASURE_VAR] = previous
    metrics = read_metrics(out / "metrics.json")
    if code != 0 or not metrics.job.success:
        raise ProfileError(f"{scenario_path}: the measured run failed: {metrics.job.reason} "
                           f"(logs in {out / 'logs'})")
    times, records = read_measurements(out)
    if not times.samples:
        raise ProfileError(f"{scenario_path}: the run executed no compute op, so nothing was "
                           "measured")
    calibration = calibrate()
    by_size = calibration.io_by_size
    costs, nodes = fit_costs(records, by_size.per_message, curve=calibration.curve,
                             spans=calibration.spans,
                             loop_per_message=calibration.loop_per_message,
                             io_by_size=by_size.local, io_by_size_tcp=by_size.tcp)
    return ProfileRun(times, costs, nodes, metrics, calibration)


def cpu_total(run: ProfileRun) -> float:
    """Every node's process CPU time in `run`."""
    return sum(node.cpu_seconds for node in run.nodes)


def measure_runs(scenario_path: Path, overrides: list[str], scenario: Scenario, out: Path,
                 stream: TextIO, netns: bool = False, runs: int = 1,
                 guard: SpeedGuard | None = None) -> tuple[ProfileRun, list[float]]:
    """`measure` `runs` times (into OUT/run-<i> when more than one); the run whose nodes used
    the median CPU time, and every run's total. On a shared machine whose speed drifts, one
    run can take 30% more CPU than another for the same work: the median run is the
    machine as it mostly is, where one run is the machine as it happened to be. With a
    `guard`, a run the speed probes find taken while the machine ran slow is taken again
    (into OUT/run-<i>-again<k>), and the least slow try counts."""
    done = []
    for i in range(runs):
        where = out if runs == 1 else out / f"run-{i}"
        if runs > 1:
            print(f"measured run {i + 1} of {runs}", file=stream, flush=True)

        def once(attempt: int, where: Path = where, i: int = i) -> ProfileRun:
            if attempt:
                print(f"the machine ran slow during that run; measuring it again (try "
                      f"{attempt + 1} of {PROBE_TRIES})", file=stream, flush=True)
                where = out / f"run-{i}-again{attempt}"
            return measure(scenario_path, overrides, scenario, where, stream, netns)

        done.append(once(0) if guard is None else
                    guard.measure(f"{scenario.name} run {i + 1}", once)[0])
    totals = [cpu_total(run) for run in done]
    return sorted(done, key=cpu_total)[(runs - 1) // 2], totals


# -- the file ----------------------------------------------------------------------------------

def _measured(run: ProfileRun) -> dict[str, Any]:
    """The step times and CPU the measured run showed, for comparing a simulation with it."""
    times = [t for trainer in run.metrics.trainers for t in trainer.step_times]
    return {"step_time_median": float(np.median(times)) if times else None,
            "samples_per_second": run.metrics.job.samples_per_second,
            "nodes": {n.node: {"cpu_seconds": n.cpu_seconds, "main_seconds": n.main_seconds,
                               "timed_seconds": n.timed_seconds, "bytes": n.bytes,
                               "messages": n.messages,
                               "residual_per_message": n.residual_per_message,
                               "residual_per_step": n.residual_per_step,
                               "measuring_seconds": n.measuring_seconds}
                      for n in run.nodes},
            "calibration": None if run.calibration is None else run.calibration.document()}


def _meta(scenario: Scenario, source: str, fits: list[OpFit],
          run: ProfileRun | None = None) -> dict[str, Any]:
    return {
        "tool": "runtime profile",
        "scenario": scenario.name,
        "source": source,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "backend": scenario.backend.model_dump(),
        "cluster": {"pservers": scenario.cluster.pservers, "trainers": scenario.cluster.trainers},
        "steps": scenario.train.steps,
        "batch_size": scenario.data.batch_size,
        "host": machine(),
        "measured": None if run is None else _measured(run),
        "fit": "per_call: total seconds / calls; per_element: total seconds / output elements, "
               f"kept when its squared error is under {PER_ELEMENT_GAIN} of per_call's",
        "ops": {f.op_type: f.meta() for f in fits},
    }


def profile_document(scenario: Scenario, source: str, fits: list[OpFit],
                     run: ProfileRun | None = None) -> dict[str, Any]:
    """The profile file's content, in the format `sim.cost.load_profile` reads."""
    document: dict[str, Any] = {
        "ops": {f.op_type: f.entry() for f in sorted(fits, key=lambda f: f.op_type)},
        "default": 0.0}
    if run is not None:
        document["runtime"] = run.costs.document()
    document["meta"] = _meta(scenario, source, fits, run)
    return document


def write_profile(path: Path, document: dict[str, Any]) -> None:
    """Write the file whole or not at all (a temporary file renamed over it)."""
    write_atomic(path, json.dumps(document, indent=2) + "\n")


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


def format_costs(costs: RuntimeCosts) -> list[str]:
    """The runtime's costs, one line per side and kind, then the overheads."""
    lines = [f"{'runtime cost':<32} {'per message':>12} {'per KiB':>10}"]
    for (side, kind), cost in sorted(costs.messages.items()):
        lines.append(f"{side + ' ' + kind:<32} {cost.per_message * 1e6:>10.1f}us "
                     f"{cost.per_byte * 1024 * 1e6:>8.3f}us")
    lines.append(f"{'io thread (either side)':<32} {costs.io.per_message * 1e6:>10.1f}us "
                 f"{costs.io.per_byte * 1024 * 1e6:>8.3f}us")
    lines.append(f"op overhead {costs.op_overhead * 1e6:.2f}us, step overhead "
                 f"{costs.step_overhead * 1e6:.1f}us (+{costs.step_residual * 1e6:.1f}us "
                 f"untimed), round overhead {costs.round_overhead * 1e6:.1f}us "
                 f"(+{costs.round_residual * 1e6:.1f}us untimed); "
                 f"{costs.machine.get('cores')} cores ({costs.machine.get('cpu')})")
    return lines


__all__ = ["Calibration", "KernelTimes", "OpFit", "OpSamples", "PER_ELEMENT_GAIN", "ProfileError", "ProfileRun",
           "calibrate", "calibrate_loop", "check_profilable", "cpu_total", "fit_all", "fit_op", "format_costs", "format_table",
           "measure", "measure_runs",
           "profile_document", "read_measurements", "write_profile"]
