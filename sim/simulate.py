"""Run a scenario in the simulator: the real job on the virtual clock, over the simulated network.

`simulate(scenario)` builds the scenario's job exactly as `runtime up` does (`Job.from_scenario`)
and runs it with `runtime.services.cluster.run_job`, every pserver and trainer a task of one
`VirtualTimeLoop` (`sim.loop.run`), talking through the `Network` its `network` section
describes, charged for compute by the model its `compute` section names (`sim.cost`), and traced
by a `TraceRecorder`. The numbers are real (numeric mode: real tensors, real updates); only time
is simulated, so the parameters equal those of a real run of the same sync scenario.

The scenario's `faults` are fired by `runtime.faults.schedule.FaultSchedule`, the schedule
`runtime up` uses too, on `sim.faults.SimTarget` (messages in the network, crashes and restarts
of nodes through `runtime.services.cluster.LocalCluster`, slowdowns in the compute model) and listed
in
`SimResult.faults`; pservers checkpoint into `train.checkpoint_dir`, or a temporary
directory that is removed after the run.

Speed: the built job (programs, scopes, the network) lives the whole run, and a large run makes
millions of short-lived objects, so the cyclic garbage collector would walk that heap again and
again for nothing (most of a 1,000-trainer run's time). The run therefore starts with one
collection, freezes what survives out of the collector's sight (`gc.freeze`) and runs with the
cyclic collector off; afterwards both are undone. Reference counting still frees everything
that is not in a cycle the moment it is dropped. Whoever reports on a large run pauses the
collector the same way while it does (`cyclic_gc_paused`): the run's objects, back in the
collector's sight, would make each pass over the report's new objects walk them all again
(4 of a 1,000 x 100 run's 9 s of reporting).

`train.deadline` is the limit of simulated time: a run that would go past it stops with
`SimTimeLimit`, and one where every node waits on another with `SimDeadlock`. An error nobody
handles stops it too (`sim.loop` fails fast): a callback that raises (`SimCallbackError`), or a
task's exception nothing retrieved (`SimLostError`).
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
from contextlib import contextmanager
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import numpy as np

from runtime.config.faults import Crash
from runtime.config.nodes import is_pserver, node_names, trainer_name
from runtime.config.scenario import Scenario
from runtime.execution.costs import RuntimeCosts
from runtime.faults.schedule import FaultSchedule, ScheduleEvent
from runtime.services.cluster import JobResult, LocalCluster
from runtime.services.job import Job
from runtime.services.pserver import ServerStats

from .cost import (Ledger, OnCpus, compute_model, model_notes, model_sharing, model_slices,
                   runtime_costs)
from .cpu import Cpus, hosts_of
from .faults import MessageFaults, SimTarget, Slowdowns
from .loop import SimStats, VirtualTimeLoop, run
from .network import LinkStats, Network, NicStats
from .trace import REPORTED, TraceRecorder

__all__ = ["SimResult", "TrainerRun", "simulate"]

StepObserver = Callable[[int, int, float, float, float], None]
"""`on_step(trainer, step, loss, step_seconds, now)`: a trainer finished a step at simulated
time `now`."""


@dataclass
class TrainerRun:
    """One trainer's steps: loss, simulated duration, and simulated time at the end of each."""

    index: int
    losses: list[float]
    step_times: list[float]
    step_ends: list[float]
    redone: int = 0
    """Steps taken again after a pserver restarted from an earlier checkpoint."""
    first_step: int = 0
    resends: int = 0
    """Requests sent again (no answer in time)."""

    @property
    def steps_start(self) -> float:
        """When its first step began (its startup lies before)."""
        return self.step_ends[0] - self.step_times[0] if self.step_ends else 0.0


@dataclass
class SimResult:
    scenario: Scenario
    endpoints: list[str]
    simulated_seconds: float
    """Virtual time when the job ended: every trainer completed and every pserver stopped."""
    trainers: list[TrainerRun]
    pservers: list[ServerStats]
    params: dict[str, np.ndarray]
    """Trainer 0's parameters after its last step."""
    links: dict[tuple[str, str], LinkStats]
    nics: dict[str, NicStats]
    trace: TraceRecorder
    compute: dict[str, float] = field(default_factory=dict)
    """Modelled compute seconds of each node during training steps (a trainer's startup aside)."""
    loop: SimStats = field(default_factory=SimStats)
    faults: list[ScheduleEvent] = field(default_factory=list)
    base_dir: Path | None = None
    cpu: dict[str, float] = field(default_factory=dict)
    """Simulated CPU seconds each node's main thread, and with the runtime's costs its I/O
    thread (`sim.cpu.io_thread`), was given over the whole run (empty: compute was not on
    CPUs)."""
    compute_notes: list[str] = field(default_factory=list)
    """What the compute model priced by an approximation (`sim.cost.model_notes`)."""

    @property
    def messages(self) -> int:
        return sum(link.messages for link in self.links.values())


def simulate(scenario: Scenario, *, base_dir: Path | None = None,
             on_step: StepObserver | None = None, trace_messages: bool = True,
             trace_spans: bool = True) -> SimResult:
    """Run `scenario` on the virtual clock; `base_dir` is where the paths it names start (the
    scenario file's folder; default the working directory). Without `trace_messages` the
    trace keeps no record per message, without `trace_spans` only the spans the report reads
    (`sim.trace.REPORTED`): a run that writes no trace.json need not hold millions of them."""
    trace = TraceRecorder(None if trace_spans else REPORTED)
    network = Network.from_spec(scenario.network, scenario.seed,
                                trace.message if trace_messages else None)
    messages = network.faults = MessageFaults(scenario.seed)
    model = compute_model(scenario.compute, scenario.seed, base_dir or Path.cwd(),
                          scenario.backend.kernels)
    slowdowns = None if model is None else Slowdowns(model)
    job = Job.from_scenario(scenario)
    job.check_timing()  # a sweep's point, or a caller that skipped `check_job`
    compute = None if slowdowns is None else _ledger(scenario, job, slowdowns, network,
                                                     base_dir or Path.cwd())
    ends: dict[int, list[float]] = {i: [] for i in range(job.trainers)}

    def observe(trainer: int, step: int, loss: float, seconds: float) -> None:
        now = asyncio.get_running_loop().time()
        ends[trainer].append(now)
        trace.span(trainer_name(trainer), f"step {step}", now - seconds, now, "step")
        schedule.on_progress(trainer, step + 1)
        if on_step is not None:
            on_step(trainer, step, loss, seconds, now)

    async def main(cluster: LocalCluster) -> tuple[JobResult, float, SimStats]:
        schedule.start()
        result = await cluster.run()
        schedule.close()
        loop = cast(VirtualTimeLoop, asyncio.get_running_loop())
        return result, loop.time(), loop.stats

    with _checkpoint_dir(scenario) as checkpoints:
        cluster = LocalCluster(job, network.transport, compute, trace, observe, checkpoints)
        schedule = FaultSchedule(list(scenario.faults),
                                 SimTarget(cluster, messages, slowdowns, trace, network),
                                 node_names(len(job.endpoints), job.trainers))
        with _without_cyclic_gc():
            result, now, stats = run(main(cluster), max_time=scenario.train.deadline)
    trainers = [TrainerRun(r.trainer_id, r.losses, r.step_times, ends[r.trainer_id], r.redone,
                           r.first_step, r.resends) for r in result.trainers]
    return SimResult(scenario, job.endpoints, now, trainers, result.pservers, result.params,
                     network.link_stats(), network.nic_stats(), trace,
                     dict(compute.in_steps) if compute else {}, stats, schedule.events, base_dir,
                     dict(compute.cpus.busy()) if isinstance(compute, OnCpus) else {},
                     model_notes(model))


def _ledger(scenario: Scenario, job: Job, model: Slowdowns, network: Network,
            base_dir: Path) -> Ledger:
    """The ledger of compute: on the nodes' CPUs (`sim.cpu`), with the runtime's own costs on
    them and on every message, where the scenario prices those or places nodes on hosts; else
    plain (compute as sleeps, each node always at full speed)."""
    costs = runtime_costs(scenario.compute, base_dir)
    if costs is not None:
        costs = costs.for_job(job.family)
    cluster = scenario.cluster
    secured = cluster.secured(cluster.on_one_host())
    if costs is not None and secured != "curve":
        costs = replace(costs, curve=None)  # encryption is charged only to a CurveZMQ job
    if costs is not None and secured != "local":
        costs = costs.over_tcp()  # local sockets only where the job has them
    hosts = hosts_of([h.model_dump() for h in scenario.cluster.hosts or ()],
                     model_sharing(model), model_slices(model))
    if costs is None and not hosts:
        return Ledger(model)
    cpus = Cpus(hosts, node_names(scenario.cluster.pservers, job.trainers),
                io=costs is not None)
    network.cpus, network.costs = cpus, costs
    pservers = 0 if job.collective else scenario.cluster.pservers
    return OnCpus(model, costs or RuntimeCosts(), cpus, pservers, job.trainers)


@contextmanager
def _checkpoint_dir(scenario: Scenario) -> Iterator[Path | None]:
    """Where pservers checkpoint: `train.checkpoint_dir`, or a temporary directory when they
    checkpoint (`train.checkpoint_every`) or may restart (a pserver crash); else None."""
    train = scenario.train
    if train.checkpoint_dir is not None:
        yield Path(train.checkpoint_dir)
        return
    crashes = any(isinstance(f, Crash) and is_pserver(f.crash) for f in scenario.faults)
    if train.checkpoint_every is None and not crashes:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="pslab-sim-checkpoints-") as tmp:
        yield Path(tmp)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic collector off for the block, back on afterwards if it was on: for the work
    that turns a finished run into its report (see the module doc)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Collect, freeze the survivors and switch the cyclic collector off for the block (see the
    module doc); afterwards unfreeze and switch it back on if it was on. What the run made is
    frozen too before unfreezing, so that it all lands in the oldest generation, where the
    collector looks rarely, instead of the youngest, which its next pass would walk in full."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()
