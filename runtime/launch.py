"""`runtime up SCENARIO`: every pserver and trainer of a scenario as a process on this host.

The launcher is a supervisor; the nodes do the work. It picks the pserver endpoints (the
scenario's, or free loopback ports) and starts each node as ``python -m runtime.node SCENARIO
--role R --index N --endpoints E --out OUT`` (see `runtime.node`), so every node builds the same
job from the same file and overrides. Each child runs in its own session (process group): a
Ctrl-C at the terminal reaches only the launcher, which then decides the order of shutdown.

While the nodes run, the launcher copies each one's stdout and stderr line by line into
``OUT/logs/<role>-<index>.log`` and reads the trainers' progress lines off them for the live
display: a table redrawn in place (rich) on a terminal, plain lines every ``train.log_every``
steps otherwise. The run fails, and every node still running is stopped, as soon as a node
exits non-zero, ``train.deadline`` passes (counted from the launch) or SIGINT/SIGTERM arrives.
Stopping is SIGTERM to each child's process group, then SIGKILL after `GRACE_SECONDS`; the
launcher reaps every child before it returns, so nothing is left behind.

At the end it gathers the nodes' records into ``OUT/metrics.json`` (`runtime.metrics`), checks
the scenario's `expect` (`runtime.expect`) when every node succeeded, and prints a summary whose
last line says OK or why not. The exit status is 0 on success, 1 on a failure, and 128 + the
signal number when interrupted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TextIO

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from transpiler.distribute.from_spec import pserver_endpoints

from . import expect
from .cluster import train_locally
from .job import Job
from .metrics import (ExpectationResult, JobMetrics, JobSummary, PserverMetrics, TrainerMetrics,
                      read_record, write_record)
from .node import ENV_VARS, Progress, node_file_stem, node_name, parse_progress, run_async
from .scenario import Scenario

GRACE_SECONDS = 5.0
"""How long a node has to exit after SIGTERM before it is killed."""
READ_LIMIT = 1 << 20
"""Longest line read from a node's output."""


@dataclass
class Failure:
    reason: str
    node: str | None = None
    signal: int | None = None


@dataclass
class NodeRun:
    """A node's process and what the launcher has seen of it."""

    role: str
    index: int
    log: IO[str]
    process: asyncio.subprocess.Process | None = None
    watcher: asyncio.Task[None] | None = None
    seen: list[Progress] = field(default_factory=list)
    last_line: str = ""
    exit_code: int | None = None

    @property
    def name(self) -> str:
        return node_name(self.role, self.index)

    @property
    def progress(self) -> Progress | None:
        return self.seen[-1] if self.seen else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def exit_reason(self) -> str:
        code = self.exit_code
        if code is not None and code < 0:
            return f"{self.name} was killed by {signal.Signals(-code).name}"
        detail = self.last_line.removeprefix(f"{self.name} failed: ")
        return f"{self.name} exited with status {code}" + (f": {detail}" if detail else "")

    def progress_record(self) -> TrainerMetrics:
        """What the progress lines told of a trainer that wrote no record (losses to the 6
        significant digits printed)."""
        return TrainerMetrics.from_steps(self.index, [p.loss for p in self.seen],
                                         [p.step_time for p in self.seen])


# -- display -----------------------------------------------------------------------------------

class Display(Protocol):
    def message(self, text: str) -> None: ...
    def progress(self, node: NodeRun) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    """One line per trainer every `every` steps (and at its last step), one per node exit."""

    def __init__(self, stream: TextIO, every: int) -> None:
        self.stream, self.every = stream, every

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def progress(self, node: NodeRun) -> None:
        p = node.progress
        if p is not None and (p.step % self.every == 0 or p.step == p.steps):
            self.message(f"{node.name:<12} step {p.step}/{p.steps}  loss {p.loss:.4f}  "
                         f"step time {p.step_time * 1e3:.1f}ms")

    def close(self) -> None:
        pass


class LiveDisplay:
    """A table of every node (state, step, loss, step time) redrawn in place by rich."""

    def __init__(self, stream: TextIO, nodes: list[NodeRun]) -> None:
        self.nodes = nodes
        self.live = Live(console=Console(file=stream), get_renderable=self._table,
                         refresh_per_second=4, transient=False)
        self.live.start()

    def _table(self) -> Table:
        table = Table("node", "state", "step", "loss", "step time")
        for n in self.nodes:
            p = n.progress
            state = "running" if n.running else ("starting" if n.process is None
                                                 else f"exit {n.exit_code}")
            table.add_row(n.name, state, f"{p.step}/{p.steps}" if p else "",
                          f"{p.loss:.4f}" if p else "", f"{p.step_time * 1e3:.1f}ms" if p else "")
        return table

    def message(self, text: str) -> None:
        self.live.console.print(text, highlight=False, markup=False)

    def progress(self, node: NodeRun) -> None:
        pass  # the next refresh shows it

    def close(self) -> None:
        self.live.stop()


def make_display(stream: TextIO, nodes: list[NodeRun], every: int) -> Display:
    if stream.isatty():
        return LiveDisplay(stream, nodes)
    return PlainDisplay(stream, every)


# -- setting up --------------------------------------------------------------------------------

def free_endpoints(host: str, count: int) -> list[str]:
    """`count` endpoints on `host` at ports the OS just reported free."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [f"{host}:{s.getsockname()[1]}" for s in sockets]
    finally:
        for s in sockets:
            s.close()


def choose_endpoints(scenario: Scenario) -> list[str]:
    """The scenario's endpoints where it names them (listed, or a base port), else free ports."""
    cluster = scenario.cluster
    if (cluster.endpoints or {}).get("pservers") or cluster.base_port:
        return list(pserver_endpoints(cluster.model_dump(exclude_none=True)))
    return free_endpoints(cluster.host, cluster.pservers)


def ignored_by_runtime(scenario: Scenario) -> list[str]:
    """What of `scenario` a real run on one host does not do, for the notes."""
    notes = [f"{section}: simulator only, ignored" for section in ("network", "compute")
             if getattr(scenario, section)]
    if scenario.faults:
        notes.append(f"faults: {len(scenario.faults)} fault(s) not injected by runtime up")
    if scenario.expect.max_step_time is not None:
        notes.append("expect.max_step_time: simulated time, not checked by runtime up")
    notes += [f"outputs.{name}: not written by runtime up" for name in ("trace", "plots")
              if getattr(scenario.outputs, name)]
    return notes


def prepare_out(out: Path) -> None:
    """Make OUT/logs and OUT/nodes, and remove what an earlier run left that this one writes."""
    for sub in ("logs", "nodes"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    stale = [*(out / "logs").glob("*.log"), *(out / "nodes").glob("*.json"),
             out / "params.npz", out / "metrics.json"]
    for path in stale:
        path.unlink(missing_ok=True)


def node_command(scenario_path: Path, overrides: list[str], role: str, index: int,
                 endpoints: list[str], out: Path) -> list[str]:
    sets = [f"--set={o}" for o in overrides]
    return [sys.executable, "-m", "runtime.node", str(scenario_path), *sets, "--role", role,
            "--index", str(index), "--endpoints", ",".join(endpoints), "--out", str(out)]


def node_environment() -> dict[str, str]:
    """The launcher's environment without Paddle's role variables (the flags say the role),
    with unbuffered output so that progress lines arrive as they are printed."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- supervising -------------------------------------------------------------------------------

@dataclass
class Launcher:
    scenario_path: Path
    overrides: list[str]
    scenario: Scenario
    endpoints: list[str]
    out: Path
    nodes: list[NodeRun] = field(default_factory=list)

    def __post_init__(self) -> None:
        cluster = self.scenario.cluster
        roles = [("pserver", j) for j in range(cluster.pservers)]
        roles += [("trainer", i) for i in range(cluster.trainers)]
        for role, index in roles:
            log = (self.out / "logs" / f"{node_file_stem(role, index)}.log").open("w")
            self.nodes.append(NodeRun(role, index, log))

    async def run(self, display: Display) -> tuple[float, Failure | None]:
        """Start every node and wait for all; the wall time and the failure, if any."""
        loop = asyncio.get_running_loop()
        stop: asyncio.Future[int] = loop.create_future()

        def on_signal(signum: int) -> None:
            if not stop.done():
                stop.set_result(signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        start = time.perf_counter()  # loop.time() is whole milliseconds on uvloop
        try:
            for node in self.nodes:
                await self._start(node, display)
            failure = await self._supervise(stop)
            if failure is not None:
                display.message(f"stopping: {failure.reason}")
                await self._stop_all(failure.reason)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self._stop_all("the launcher is exiting")
            for node in self.nodes:
                node.log.close()
        return time.perf_counter() - start, failure

    async def _start(self, node: NodeRun, display: Display) -> None:
        cmd = node_command(self.scenario_path, self.overrides, node.role, node.index,
                           self.endpoints, self.out)
        node.process = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=node_environment(), start_new_session=True,
            limit=READ_LIMIT)
        node.watcher = asyncio.get_running_loop().create_task(self._watch(node, display),
                                                              name=f"watch {node.name}")

    async def _watch(self, node: NodeRun, display: Display) -> None:
        """Copy the node's output to its log, follow its progress, and reap it."""
        assert node.process is not None and node.process.stdout is not None
        async for raw in node.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            node.log.write(line + "\n")
            node.log.flush()
            if line.strip():
                node.last_line = line.strip()
            progress = parse_progress(line)
            if progress is not None:
                node.seen.append(progress)
                display.progress(node)
        node.exit_code = await node.process.wait()
        display.message(f"{node.name} exited with status {node.exit_code}")

    async def _supervise(self, stop: asyncio.Future[int]) -> Failure | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.scenario.train.deadline
        watching: dict[asyncio.Future[Any], NodeRun] = {
            n.watcher: n for n in self.nodes if n.watcher is not None}
        while watching:
            done, _ = await asyncio.wait([*watching, stop], timeout=deadline - loop.time(),
                                         return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                sig = signal.Signals(stop.result())
                return Failure(f"interrupted by {sig.name}", signal=sig)
            if not done:
                running = ", ".join(n.name for n in watching.values())
                return Failure(f"train.deadline ({self.scenario.train.deadline:g}s) passed; "
                               f"still running: {running}")
            for task in done:
                node = watching.pop(task)
                task.result()
                if node.exit_code != 0:
                    return Failure(node.exit_reason(), node.name)
        return None

    async def _stop_all(self, why: str) -> None:
        running = [n for n in self.nodes if n.running]
        for node in running:
            node.log.write(f"[runtime up] stopping {node.name}: {why}\n")
            _signal_group(node, signal.SIGTERM)
        watchers = [n.watcher for n in running if n.watcher is not None]
        if not watchers:
            return
        _, late = await asyncio.wait(watchers, timeout=GRACE_SECONDS)
        for node in running:
            if node.watcher in late:
                _signal_group(node, signal.SIGKILL)
        await asyncio.gather(*watchers, return_exceptions=True)


def _signal_group(node: NodeRun, sig: signal.Signals) -> None:
    assert node.process is not None
    try:
        os.killpg(node.process.pid, sig)
    except ProcessLookupError:
        pass


# -- results -----------------------------------------------------------------------------------

def gather_metrics(launcher: Launcher, wall: float, failure: Failure | None,
                   notes: list[str]) -> JobMetrics:
    scenario, out = launcher.scenario, launcher.out
    trainers, pservers = [], []
    for node in launcher.nodes:
        path = out / "nodes" / f"{node_file_stem(node.role, node.index)}.json"
        log = str(Path("logs") / f"{node_file_stem(node.role, node.index)}.log")
        if node.role == "trainer":
            t = read_record(path, TrainerMetrics) if path.exists() else node.progress_record()
            t.exit_code, t.log = node.exit_code, log
            trainers.append(t)
        else:
            endpoint = launcher.endpoints[node.index]
            p = read_record(path, PserverMetrics) if path.exists() else PserverMetrics(node.index,
                                                                                       endpoint)
            p.exit_code, p.log = node.exit_code, log
            pservers.append(p)
        if failure is None and not path.exists():
            failure = Failure(f"{node.name} exited with status 0 but wrote no {path}", node.name)
    train = scenario.train
    samples = sum(len(t.losses) for t in trainers) * scenario.data.batch_size
    busy = [sum(t.step_times) for t in trainers if t.step_times]
    train_seconds = max(busy) if busy else None
    summary = JobSummary(
        scenario.name, scenario.transpiler.mode, scenario.cluster.pservers,
        scenario.cluster.trainers, train.steps, scenario.data.batch_size, launcher.endpoints,
        wall, train_seconds, samples, samples / train_seconds if train_seconds else None,
        failure is None, failure.reason if failure else None, failure.node if failure else None)
    return JobMetrics(summary, trainers, pservers, [], notes)


def check_expectations(launcher: Launcher, metrics: JobMetrics) -> list[ExpectationResult]:
    scenario = launcher.scenario

    def local() -> dict[str, np.ndarray]:
        job = Job.from_scenario(scenario, launcher.endpoints)
        return train_locally(job, scenario.backend.kernels)[1]

    losses = metrics.trainers[0].losses if metrics.trainers else []
    return expect.check(scenario, losses, _load_params(launcher.out / "params.npz"),
                        metrics.pservers, local)


def _load_params(path: Path) -> dict[str, np.ndarray] | None:
    if not path.exists():
        return None
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def summary_lines(metrics: JobMetrics) -> list[str]:
    lines = []
    for t in metrics.trainers:
        loss = (f"loss {t.losses[0]:.4f} -> {t.losses[-1]:.4f}" if t.losses else "no steps")
        mean = f"mean step {1e3 * sum(t.step_times) / len(t.step_times):.1f}ms" \
            if t.step_times else ""
        lines.append(f"trainer:{t.index:<4} {len(t.losses)} steps  {loss}  {mean}  "
                     f"(exit {t.exit_code})")
    for p in metrics.pservers:
        lines.append(f"pserver:{p.index:<4} {p.steps} steps  {p.messages} messages  "
                     f"{p.bytes_in / 1e6:.2f} MB in  {p.bytes_out / 1e6:.2f} MB out  optimize "
                     f"{p.optimize_seconds:.3f}s  errors {p.errors}  dropped {p.dropped or '-'}  "
                     f"(exit {p.exit_code})")
    for e in metrics.expectations:
        lines.append(f"expect {e.name}: {'PASS' if e.passed else 'FAIL'}: {e.detail}")
    job = metrics.job
    rate = f", {job.samples_per_second:.0f} samples/s in steps" if job.samples_per_second else ""
    lines.append(f"wall {job.wall_seconds:.2f}s{rate}")
    return lines


def verdict(metrics: JobMetrics) -> str:
    job = metrics.job
    return f"OK: {job.scenario}" if job.success else f"FAILED: {job.reason}"


def launch(scenario_path: Path, overrides: list[str], scenario: Scenario, out: Path,
           stream: TextIO) -> int:
    """Run every node of `scenario` as a process; the exit status for `runtime up`."""
    prepare_out(out)
    notes = ignored_by_runtime(scenario)
    launcher = Launcher(scenario_path.resolve(), overrides, scenario, choose_endpoints(scenario),
                        out)
    cluster, train = scenario.cluster, scenario.train
    print(f"runtime up {scenario.name}: {cluster.pservers} pserver(s) at "
          f"{','.join(launcher.endpoints)}, {cluster.trainers} trainer(s), "
          f"{scenario.transpiler.mode}, {train.steps} steps of {scenario.data.batch_size}; "
          f"logs in {out / 'logs'}", file=stream, flush=True)
    for note in notes:
        print(f"note: {note}", file=stream)
    display = make_display(stream, launcher.nodes, train.log_every)
    try:
        wall, failure = run_async(launcher.run(display))
    finally:
        display.close()
    metrics = gather_metrics(launcher, wall, failure, notes)
    if metrics.job.success:
        metrics.expectations = check_expectations(launcher, metrics)
        failed = [f"{e.name} ({e.detail})" for e in metrics.expectations if not e.passed]
        if failed:
            metrics.job.success = False
            metrics.job.reason = f"expectation not met: {'; '.join(failed)}"
    write_record(out / "metrics.json", metrics)
    for line in summary_lines(metrics):
        print(line, file=stream)
    print(f"metrics: {out / 'metrics.json'}", file=stream)
    print(verdict(metrics), file=stream, flush=True)
    if failure is not None and failure.signal is not None:
        return 128 + failure.signal
    return 0 if metrics.job.success else 1
