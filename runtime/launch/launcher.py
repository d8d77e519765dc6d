"""`runtime up SCENARIO`: every pserver and trainer of a scenario as a process on this host.

The launcher is a supervisor; the nodes do the work. It picks the pserver endpoints (the
scenario's, or free loopback ports) and starts each node as ``python -m runtime.services.node
SCENARIO
--role R --index N --endpoints E --out OUT`` (see `runtime.services.node`), so every node builds the
same job from the same file and overrides. Each child runs in its own session (process group): a
Ctrl-C at the terminal reaches only the launcher, which then decides the order of shutdown.

While the nodes run, the launcher copies each one's stdout and stderr line by line into
``OUT/logs/<role>-<index>.log``, and reads each trainer's progress off a pipe of its own
(`runtime.services.progress`; the output is for people and is not parsed) for the live display: a
table redrawn in place (rich) on a terminal, plain lines every ``train.log_every`` steps otherwise.
The run fails, and every node still running is stopped, as soon as a node exits non-zero,
``train.deadline`` passes (counted from the launch) or SIGINT/SIGTERM/SIGHUP arrives. After a node
failed the others get `SETTLE_SECONDS` to end on their own first: one fault often
fails several nodes at once, each naming what it waited for (the first to give up may name a
live pserver that holds its request for the next step), and the reason lists every node that
failed, the first first. Stopping is SIGTERM to each child's process group, then SIGKILL after
`GRACE_SECONDS`; the launcher reaps every child before it returns, so nothing is left behind.
A pserver answers SIGTERM by writing its record first (`runtime.services.node`), so that an
interrupted run's summary and metrics.json say what the pservers served. SIGHUP (the terminal
closed) stops the run as SIGTERM does. A launcher that cannot stop its nodes (SIGKILLed,
crashed) takes them with it: each node has Linux signal it when its parent dies
(`runtime.services.lifeline`; SIGTERM, so a pserver writes its record then too, or SIGKILL for
a node a fault may hold paused).

OUT serves one run at a time: `launch` claims it before anything else (`runtime.config.outdir`:
made, checked writable, and locked, else `OutputDirError` naming the folder and the run that
holds it), and every node holds the lock too, so that the folder stays taken until the last of
them has ended.

The scenario's `faults` are fired by `runtime.faults.schedule.FaultSchedule` (the simulator's
schedule too) on `runtime.faults.inject.RuntimeTarget`, with the trainers' progress as the trigger
of
``at: "step N"``: the launcher SIGKILLs a crashed node's process group and, when the schedule
says it restarts, starts it again (a pserver with ``--recover``, a trainer with ``--incarnation
N``); the target pauses a slowed one with SIGSTOP/SIGCONT; and for message faults the launcher
puts a `FaultProxy` at each pserver's endpoint, the pserver serving behind it (``--bind``). A node
killed by a fault is not a failure by itself. Every pserver checkpoints into
``train.checkpoint_dir`` or ``OUT/checkpoints`` (what an earlier run left there for this job's
pservers is removed first).

With ``--netns`` (`runtime.launch.netns`) each node runs in a network namespace of its own, bridged
to the others, and the scenario's `network` is applied: its bandwidths as tc tbf qdiscs on the
nodes' interfaces, its latencies in front of each pserver: by a `DelayRelay`
(`runtime.launch.delay_relay`) that holds every byte for its link's latency where each latency
is a constant and no fault acts on messages, else by a `FaultProxy` that delays every message
by a draw from the link's distribution and carries the message faults too. The pservers'
endpoints are then their namespaces' addresses, and the namespaces are deleted before `launch`
returns, whatever happened. Without it the nodes share the host's
loopback and the notes list every network setting not applied
(`runtime.launch.netns.network_notes`).

How the nodes keep their messages to themselves (`secure`, the scenario's
``cluster.security``): a job whose nodes all share the host's network (no ``--netns``, no message
faults) talks over local sockets, ZeroMQ ``ipc://`` sockets in a fresh directory of mode 0700
that only the job's user can open (`runtime.network.local_sockets`): each node is started with
``--ipc DIR``, and the directory is removed when the job ends. The kernel keeps those bytes
from everyone else, so nothing is encrypted. Every other job talks CurveZMQ
(`runtime.network.curve`): the launcher writes a fresh keypair per node into ``OUT/keys``
(secret keys mode 0600) and starts each node with ``--keys OUT/keys``. ``cluster.security:
curve`` asks for CurveZMQ on one host too, ``--keys DIR`` names the job's keys (CurveZMQ), and
``--insecure`` (which warns) turns security off. A job with message faults stays encrypted: its proxies are `CurveFaultProxy`s, CURVE servers to
the trainers with their pservers' keys and CURVE clients of the pservers
(`runtime.faults.curve_proxy`), ``--netns``'s too: each makes its sockets in its pserver's
namespace (`runtime.launch.netns.entered`). Only with ``--insecure`` are the proxies the
frame-reading `FaultProxy`, its ``--netns`` sockets made there by `runtime.launch.netns.Sockets`.

At the end it gathers the nodes' records into ``OUT/metrics.json`` (`runtime.config.metrics`: the
run record `sim run` writes too, schema in ``runtime/config/metrics.schema.json``), checks
the scenario's `expect` (`runtime.config.expect`) when every node succeeded, and prints a summary
whose last line says OK or why not. ``params_equal_to: fault_free`` is checked against the same job
without its faults, run here in one process over loopback ZeroMQ (`fault_free_params`), under
CurveZMQ with keys of its own made in memory unless the job runs ``--insecure``
(`runtime.services.local_zmq`): no other user of the host can talk to its pservers. A
scenario whose ``expect.error`` says the run must fail is OK when it failed with that text. The
exit status is 0 on success (a failure as expected included), 1 on a failure, and 128 + the
signal number when interrupted.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import signal
import socket
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Protocol, TextIO, cast

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from transpiler.distribute.from_spec import TRAINER_RING_MODES, pserver_endpoints, trainer_endpoints

from runtime.config import expect
from runtime.config.faults import LinkFaults, Partition, Pause, Slow
from runtime.config.metrics import (ExpectationResult, JobMetrics, JobSummary, NetnsMetrics,
                                    ProxyMetrics, PserverMetrics, TrainerMetrics, read_record,
                                    write_record)
from runtime.config.netspec import ConstantLatency, NetworkSpec, fmt_rate
from runtime.config.nodes import (node_file_stem, node_name, node_names, pserver_name,
                                  trainer_name)
from runtime.config.outdir import claim_output
from runtime.config.scenario import Scenario
from runtime.faults.inject import (SLOW_PERIOD, RuntimeTarget, connects, metrics_events,
                                   needs_proxies)
from runtime.faults.curve_proxy import CurveFaultProxy
from runtime.faults.proxy import FaultProxy, Faults
from runtime.faults.schedule import FaultSchedule
from runtime.launch.delay_relay import DelayRelay
from runtime.launch.netns import (PORT, Fabric, NetnsError, entered, link_latencies,
                                  network_notes, sigterm_interrupts)
from runtime.network.curve import KeyFileError, write_keys
from runtime.network.local_sockets import make_socket_dir
from runtime.services.cluster import restart_is_moot, run_job, train_locally
from runtime.services.job import Job
from runtime.services.lifeline import launcher_environment, lifeline_environment
from runtime.services.local_zmq import fresh_keys, zmq_transports
from runtime.services.node import (ENV_VARS, checkpoint_dir_for, insecure_warning, node_keys,
                                   run_async)
from runtime.services.output import DetachedOutput
from runtime.services.progress import Channel, Progress, ProgressSummary, read_progress

GRACE_SECONDS = 5.0
"""How long a node has to exit after SIGTERM before it is killed."""
SETTLE_SECONDS = 1.0
"""How long the other nodes may go on after one failed, to fail as well (and say why)."""
READ_LIMIT = 1 << 20
"""Longest line read from a node's output or progress channel."""


@dataclass
class Failure:
    reason: str
    node: str | None = None
    signal: int | None = None


class RunFailed(RuntimeError):
    """The run failed; the message is the launcher's reason (naming the node and its error)."""


@dataclass
class Life:
    """One process of a node: a node restarted after a crash has several, one after another."""

    number: int
    """0 for the first start, N for the N-th restart."""
    process: asyncio.subprocess.Process
    watcher: asyncio.Task[None] | None = None
    exit_code: int | None = None
    killed: bool = False
    """Killed by fault injection."""
    moot: bool = False
    """A trainer's life after a crash that the job ended without (`Launcher._moot`)."""
    checked: bool = False
    """The supervisor has judged its exit."""
    first_seen: int = 0
    """Where its progress begins in its node's `NodeRun.seen`."""


@dataclass
class NodeRun:
    """A node's processes and what the launcher has seen of them."""

    role: str
    index: int
    log: IO[str]
    lives: list[Life] = field(default_factory=list)
    restart: asyncio.Task[None] | None = None
    """Starting the node again after a crash, while that is pending."""
    seen: list[Progress] = field(default_factory=list)
    """The progress its processes reported, one after another."""
    last_line: str = ""

    @property
    def name(self) -> str:
        return node_name(self.role, self.index)

    @property
    def life(self) -> Life | None:
        return self.lives[-1] if self.lives else None

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        return self.lives[-1].process if self.lives else None

    @property
    def exit_code(self) -> int | None:
        """Its last process's exit code (None while it runs)."""
        return self.lives[-1].exit_code if self.lives else None

    @property
    def killed(self) -> bool:
        """Its last process was killed by fault injection."""
        return bool(self.lives) and self.lives[-1].killed

    @property
    def moot(self) -> bool:
        """Its last process was a trainer's life that the job ended without."""
        return bool(self.lives) and self.lives[-1].moot

    @property
    def progress(self) -> Progress | None:
        return self.seen[-1] if self.seen else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.exit_code is None

    def state(self) -> str:
        if self.restart is not None:
            return "restarting"
        if self.process is None:
            return "starting"
        if self.running:
            return "running"
        return "killed" if self.killed else f"exit {self.exit_code}"

    def exit_reason(self) -> str:
        code = self.exit_code
        if code is not None and code < 0:
            return f"{self.name} was killed by {signal.Signals(-code).name}"
        detail = self.last_line.removeprefix(f"{self.name} failed: ")
        return f"{self.name} exited with status {code}" + (f": {detail}" if detail else "")

    def progress_record(self) -> TrainerMetrics:
        """What its last process reported of a trainer that wrote no record."""
        seen = self.seen[self.lives[-1].first_seen:] if self.lives else self.seen
        first, redone = (seen[0].first_step, seen[-1].redone) if seen else (0, 0)
        return TrainerMetrics.from_steps(self.index, [p.loss for p in seen],
                                         [p.step_time for p in seen], first, redone)


# -- display -----------------------------------------------------------------------------------

class Display(Protocol):
    def message(self, text: str) -> None: ...
    def progress(self, node: NodeRun) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    """For a pipe or a file: a line for all the trainers at each tenth of the steps or every
    few seconds, with the time left (`ProgressSummary`); with at most `PER_TRAINER` trainers
    also one line per trainer every `every` steps (and at its last step); one per node exit."""

    def __init__(self, stream: TextIO, every: int,
                 summary: ProgressSummary | None = None) -> None:
        self.stream, self.every, self.summary = stream, every, summary

    def message(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def progress(self, node: NodeRun) -> None:
        p = node.progress
        if p is None:
            return
        each = self.summary is None or self.summary.each_trainer
        if each and (p.step % self.every == 0 or p.step == p.steps):
            self.message(f"{node.name:<12} step {p.step}/{p.steps}  loss {p.loss:.4f}  "
                         f"step time {p.step_time * 1e3:.1f}ms")
        line = None if self.summary is None else self.summary.update(node.index, p)
        if line is not None:
            self.message(line)

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
            table.add_row(n.name, n.state(), f"{p.step}/{p.steps}" if p else "",
                          f"{p.loss:.4f}" if p else "", f"{p.step_time * 1e3:.1f}ms" if p else "")
        return table

    def message(self, text: str) -> None:
        self.live.console.print(text, highlight=False, markup=False)

    def progress(self, node: NodeRun) -> None:
        pass  # the next refresh shows it

    def close(self) -> None:
        self.live.stop()


def make_display(stream: TextIO, nodes: list[NodeRun], every: int, steps: int = 0) -> Display:
    if stream.isatty():
        return LiveDisplay(stream, nodes)
    trainers = sum(1 for n in nodes if n.role == "trainer")
    return PlainDisplay(stream, every, ProgressSummary(trainers, steps) if steps else None)


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
    """The scenario's endpoints where it names them (listed, or a base port), else free ports:
    the pservers', or in the nccl2 and collective modes (no pservers) the trainers'."""
    cluster = scenario.cluster
    if scenario.transpiler.mode in TRAINER_RING_MODES:
        if (cluster.endpoints or {}).get("trainers") or cluster.base_port:
            return list(trainer_endpoints(cluster.for_transpiler()))
        return free_endpoints(cluster.host, cluster.trainers)
    if (cluster.endpoints or {}).get("pservers") or cluster.base_port:
        return list(pserver_endpoints(cluster.for_transpiler()))
    return free_endpoints(cluster.host, cluster.pservers)


def ignored_by_runtime(scenario: Scenario, netns: bool = False) -> list[str]:
    """What of `scenario` a real run on one host does not do, or does otherwise than the
    simulator, for the notes; `netns`: with its nodes in network namespaces (``--netns``),
    which apply the scenario's network (see `runtime.launch.netns.network_notes`)."""
    notes = network_notes(scenario, netns)
    if scenario.compute:
        notes.append("compute: simulator only, ignored")
    cluster = scenario.cluster
    if cluster.hosts:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count()
        notes.append(f"cluster.hosts: simulator only: every node runs on this machine, "
                     f"sharing its {cores} cores")
    for i, fault in enumerate(scenario.faults):
        if isinstance(fault, (Partition, LinkFaults)) and \
                not connects(fault, cluster.trainers, cluster.pservers):
            notes.append(f"faults[{i}]: acts on no trainer-pserver connection, the only ones "
                         "a real run has: nothing injected")
        if isinstance(fault, Slow):
            notes.append(f"faults[{i}]: slow {fault.slow} x{fault.slowdown:g}: the process is "
                         f"paused {1 - 1 / fault.slowdown:.0%} of every {SLOW_PERIOD * 1e3:g}ms "
                         "(SIGSTOP/SIGCONT), its compute not made slower")
    if scenario.expect.max_step_time is not None:
        notes.append("expect.max_step_time: simulated time, not checked by runtime up")
    notes += [f"outputs.{name}: not written by runtime up" for name in ("trace", "plots")
              if getattr(scenario.outputs, name)]
    return notes


def prepare_out(out: Path, scenario: Scenario) -> None:
    """Make OUT/logs and OUT/nodes, and remove what an earlier run left that this one writes or
    reads: its files, and this job's pservers' checkpoints (a restarted pserver must not load
    an earlier run's)."""
    for sub in ("logs", "nodes"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    stale = [*(out / "logs").glob("*.log"), *(out / "nodes").glob("*.json"),
             out / "params.npz", out / "metrics.json"]
    for path in stale:
        path.unlink(missing_ok=True)
    checkpoints = checkpoint_dir_for(scenario, out)
    if checkpoints is not None:
        for j in range(scenario.cluster.pservers):
            shutil.rmtree(checkpoints / pserver_name(j), ignore_errors=True)


def node_command(scenario_path: Path, overrides: list[str], role: str, index: int,
                 endpoints: list[str], out: Path | None, flags: list[str]) -> list[str]:
    """The command line of a node's process (no ``--endpoints``: the scenario's; no ``--out``:
    none)."""
    sets = [f"--set={o}" for o in overrides]
    where = ["--endpoints", ",".join(endpoints)] if endpoints else []
    outs = ["--out", str(out)] if out is not None else []
    return [sys.executable, "-m", "runtime.services.node", str(scenario_path), *sets, "--role", role,
            "--index", str(index), *where, *outs, *flags]


def fault_proxies(scenario: Scenario, endpoints: list[str]) -> tuple[list[FaultProxy], list[str]]:
    """For a scenario with message faults, a `FaultProxy` listening at each pserver endpoint and
    the address each pserver then serves at (a free port); else (or without pservers) none,
    and the endpoints."""
    if not needs_proxies(scenario.faults) or scenario.cluster.pservers == 0:
        return [], list(endpoints)
    binds = free_endpoints(scenario.cluster.host, len(endpoints))
    proxies = [FaultProxy(listen=ep, upstream=bind, seed=scenario.seed,
                          upstream_name=pserver_name(j))
               for j, (ep, bind) in enumerate(zip(endpoints, binds))]
    return proxies, binds


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""How numpy's BLAS and torch learn how many threads a kernel may use."""


def kernel_threads(nodes: int) -> int:
    """Threads a node's kernels may use when `nodes` processes share this machine's cores: its
    share of them, at least one. More would make the nodes' kernels fight for the cores (and a
    profile's CPU times would count threads the simulator's one-thread-a-node model lacks)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(nodes, 1))


def node_environment(threads: int | None = None) -> dict[str, str]:
    """The launcher's environment without Paddle's role variables (the flags say the role),
    with unbuffered output so that the logs keep up with the nodes, and `threads`
    for the kernels (`THREAD_VARS`) where the environment does not set them already."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(launcher_environment())  # the node dies with this process
    if threads is not None:
        for name in THREAD_VARS:
            env.setdefault(name, str(threads))
    return env


# -- supervising -------------------------------------------------------------------------------

@dataclass
class Launcher:
    scenario_path: Path
    overrides: list[str]
    scenario: Scenario
    endpoints: list[str]
    """Where the trainers reach the pservers (their fault proxies', when there are any)."""
    out: Path
    binds: list[str] = field(default_factory=list)
    """Where each pserver serves: its endpoint, or the address behind its fault proxy."""
    proxies: list[FaultProxy] = field(default_factory=list)
    relays: list[DelayRelay] = field(default_factory=list)
    """``--netns`` links whose only fault is a constant latency: a byte relay in front of each
    pserver (`runtime.launch.delay_relay`) instead of a proxy."""
    namespaces: dict[str, str] = field(default_factory=dict)
    """node name -> the network namespace it runs in (``--netns``); none: the host's."""
    base_faults: dict[tuple[str, str], Faults] = field(default_factory=dict)
    """(trainer, pserver) -> what the proxy does to that link without fault rules: the
    network's latency under ``--netns``."""
    nodes: list[NodeRun] = field(default_factory=list)
    injector: FaultSchedule | None = None
    security: list[str] = field(default_factory=lambda: ["--insecure"])
    """Flags every node gets: ``--ipc DIR`` or ``--keys DIR`` (`secure`), or ``--insecure``."""
    socket_dir: Path | None = None
    """The local sockets' directory the launcher made for this job (removed at its end)."""
    inherit: tuple[int, ...] = ()
    """Descriptors every node's process holds open: the output folder's lock
    (`runtime.config.outdir`), which stays held until the last node has ended."""
    _comebacks: dict[str, asyncio.Future[None]] = field(default_factory=dict, init=False)
    """node -> set when the fault schedule restarts that crashed node."""
    _stopping: set[int] = field(default_factory=set, init=False)
    """Ids of the restarted trainers' lives `_stop_moot` stops."""

    def __post_init__(self) -> None:
        cluster = self.scenario.cluster
        self.binds = self.binds or list(self.endpoints)
        roles = [("pserver", j) for j in range(cluster.pservers)]
        roles += [("trainer", i) for i in range(cluster.trainers)]
        for role, index in roles:
            log = (self.out / "logs" / f"{node_file_stem(role, index)}.log").open("w")
            self.nodes.append(NodeRun(role, index, log))
        self._display: Display | None = None

    async def run(self, display: Display) -> tuple[float, Failure | None]:
        """Start every node and wait for all; the wall time and the failure, if any."""
        loop = asyncio.get_running_loop()
        stop: asyncio.Future[int] = loop.create_future()

        def on_signal(signum: int) -> None:
            if not stop.done():
                stop.set_result(signum)

        previous = {sig: signal.getsignal(sig)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        for sig in previous:
            loop.add_signal_handler(sig, on_signal, sig)
        self._display = display
        cluster = self.scenario.cluster
        target = self._fault_target(display)
        injector = self.injector = FaultSchedule(self.scenario.faults, target,
                                                 node_names(cluster.pservers, cluster.trainers))
        start = time.perf_counter()  # loop.time() is whole milliseconds on uvloop
        failure: Failure | None = None
        try:
            for proxy in self.proxies:
                await proxy.start()
            for relay in self.relays:
                relay.start()
            injector.arm()
            for node in self.nodes:
                await self._start(node)
            injector.start()
            failure = await self._supervise(stop)
        finally:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:
                    signal.signal(sig, handler)  # what was there before, e.g. `runtime.launch.netns`'s
            injector.close()
            await target.close()  # resumes paused nodes before they are told to stop
            if failure is not None:
                display.message(f"stopping: {failure.reason}")
            await self._stop_all(failure.reason if failure else "the launcher is exiting")
            for proxy in self.proxies:
                await proxy.close()
            for relay in self.relays:
                relay.close()
            for node in self.nodes:
                node.log.close()
        return time.perf_counter() - start, failure

    def _fault_target(self, display: Display) -> RuntimeTarget:
        """The target the fault schedule acts on: every node, every proxy."""
        return RuntimeTarget(self, dict(enumerate(self.proxies)), self.scenario.cluster.trainers,
                             display.message, self.base_faults)

    def _command(self, node: NodeRun, life: int) -> list[str]:
        """The command line of `node`'s process for its `life`-th start (0: the first)."""
        return node_command(self.scenario_path, self.overrides, node.role, node.index,
                            self.endpoints, self.out, self._flags(node, life))

    def _environment(self) -> dict[str, str]:
        """The environment of a node's process (its progress channel's variable aside)."""
        return node_environment(kernel_threads(len(self.nodes)))

    def _pausable(self, node: NodeRun) -> bool:
        """Whether a fault of the scenario may pause `node` (SIGSTOP: slow, pause), so that
        only SIGKILL ends it should this launcher die (`runtime.services.lifeline`)."""
        cluster = self.scenario.cluster
        names = node_names(cluster.pservers, cluster.trainers)
        return any(isinstance(f, (Slow, Pause)) and node.name in f.nodes(names)
                   for f in self.scenario.faults)

    def _reports(self, node: NodeRun) -> bool:
        """Whether `node` reports its progress on a channel (the trainers: theirs is the
        display's and the trigger of faults at a step)."""
        return node.role == "trainer"

    def _flags(self, node: NodeRun, life: int) -> list[str]:
        """The node's flags besides its role: where a pserver serves, and how a restart
        differs from the first start."""
        if node.role == "trainer":
            return self.security + (["--incarnation", str(life)] if life else [])
        bind = self.binds[node.index]
        flags = ["--bind", bind] if bind != self.endpoints[node.index] else []
        return self.security + flags + (["--recover"] if life else [])

    async def _start(self, node: NodeRun) -> None:
        number = len(node.lives)
        cmd = self._command(node, number)
        namespace = self.namespaces.get(node.name)
        if namespace is not None:
            cmd = ["ip", "netns", "exec", namespace, *cmd]  # execs: the same process, its fds
        env = self._environment() | lifeline_environment(self._pausable(node))
        channel = Channel() if self._reports(node) else None
        try:
            process = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env | (channel.environment() if channel else {}),
                pass_fds=((channel.write_fd,) if channel else ()) + self.inherit,
                start_new_session=True, limit=READ_LIMIT)
        except BaseException:
            if channel is not None:
                channel.close()
            raise
        if channel is not None:
            channel.started()
        life = Life(number, process, first_seen=len(node.seen))
        node.lives.append(life)
        life.watcher = asyncio.get_running_loop().create_task(
            self._watch(node, life, channel.read_fd if channel else None),
            name=f"watch {node.name}")

    async def _watch(self, node: NodeRun, life: Life, progress_fd: int | None) -> None:
        """Copy the process's output to the node's log, follow its progress (a trainer's, on
        the pipe `progress_fd`), and reap it."""
        follow = [self._copy_output(node, life)]
        if progress_fd is not None:
            follow.append(self._follow_progress(node, progress_fd))
        await asyncio.gather(*follow)
        life.exit_code = await life.process.wait()
        if self._display is not None:
            self._display.message(f"{node.name} was killed (fault injection)" if life.killed
                                  else f"{node.name} exited with status {life.exit_code}")

    async def _copy_output(self, node: NodeRun, life: Life) -> None:
        assert life.process.stdout is not None
        async for raw in life.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            node.log.write(line + "\n")
            node.log.flush()
            if line.strip():
                node.last_line = line.strip()

    async def _follow_progress(self, node: NodeRun, fd: int) -> None:
        """Each step a node reports: to the display and the fault injector."""
        async for progress in read_progress(fd, READ_LIMIT):
            if isinstance(progress, ValueError):
                node.log.write(f"[runtime up] {node.name}'s progress channel: {progress}\n")
                continue
            node.seen.append(progress)
            if self._display is not None:
                self._display.progress(node)
            if self.injector is not None:
                self.injector.on_progress(node.index, progress.step, node.name)

    async def _supervise(self, stop: asyncio.Future[int]) -> Failure | None:
        """Wait until every node is done and no restart is pending (a trainer's is moot once
        every process has ended: `restart_is_moot`); the first failure, the deadline or a
        signal ends it early. A trainer restarted after a crash, or one still training, that
        is still running when every pserver has finished the job is stopped (`_stop_moot`),
        its exit no failure."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.scenario.train.deadline
        while True:
            if self._job_over():
                self._stop_moot(loop)
            waiting: dict[asyncio.Future[Any], NodeRun] = {}
            for node in self.nodes:
                life = node.life
                if life is not None and life.watcher is not None and not life.checked:
                    waiting[life.watcher] = node
                if node.restart is not None:
                    waiting[node.restart] = node
            if not waiting:
                return None
            if all(node.restart is task for task, node in waiting.items()) and \
                    restart_is_moot(node.name for node in waiting.values()) and \
                    any(node.role == "pserver" for node in self.nodes):
                return None  # every process has ended, the pservers' too (role mode's
                # supervisor of one trainer cannot tell): no pserver is due back
            done, _ = await asyncio.wait([*waiting, stop], timeout=deadline - loop.time(),
                                         return_when=asyncio.FIRST_COMPLETED)
            if stop in done:
                sig = signal.Signals(stop.result())
                return Failure(f"interrupted by {sig.name}", signal=sig)
            if not done:
                running = ", ".join(n.name for n in self.nodes if n.running or n.restart)
                return Failure(f"train.deadline ({self.scenario.train.deadline:g}s) passed; "
                               f"still running: {running}")
            for task in done:
                node = waiting[task]
                if task is node.restart:
                    node.restart = None
                    try:
                        task.result()
                    except OSError as exc:
                        return Failure(f"{node.name} could not be restarted: {exc}", node.name)
                    continue
                task.result()
                life = node.life
                assert life is not None
                life.checked = True
                if life.exit_code != 0 and not life.killed:
                    if self._moot(node, life):
                        node.log.write(f"[runtime up] {node.name} exited "
                                       f"{life.exit_code} after the job ended without it\n")
                        continue
                    return await self._settle(node, stop)

    def _job_over(self) -> bool:
        """Every pserver has finished the job: exited 0, none due back."""
        pservers = [n for n in self.nodes if n.role == "pserver"]
        return bool(pservers) and all(n.lives and n.restart is None and n.exit_code == 0
                                      for n in pservers)

    def _moot(self, node: NodeRun, life: Life) -> bool:
        """Whether `node`'s `life` had no job left (and mark it so): a trainer, restarted after
        a crash or not, still training once every pserver has finished (they dropped it)."""
        life.moot = life.moot or (node.role == "trainer" and _left_behind(node, life)
                                  and self._job_over())
        return life.moot

    def _stop_moot(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop, after `SETTLE_SECONDS` (time for one that completed to exit by itself), each
        trainer, restarted after a crash or not, still training and still running now that
        the job is over (one that reported its last step is exiting by itself, however long
        that takes on a busy machine).

        DESIGN: it cannot train any more: the pservers dropped it (it crashed, or was paused
        or cut off for longer than the heartbeat timeout), and finished with the others and
        exited, so it would wait for their ports or replies until its own deadline. Its
        return came too late, as a restart due after every process has ended (never made,
        `restart_is_moot`). The simulator ends the run without it the same way
        (`LocalCluster._left_behind`)."""
        for node in self.nodes:
            life = node.life
            if node.role == "trainer" and node.running and life is not None \
                    and _left_behind(node, life) and id(life) not in self._stopping:
                self._stopping.add(id(life))
                loop.call_later(SETTLE_SECONDS, self._stop_life, node, life)

    def _stop_life(self, node: NodeRun, life: Life) -> None:
        if node.life is life and node.running:
            life.moot = True
            how = "while it was down" if life.number > 0 else "without it (they dropped it)"
            node.log.write(f"[runtime up] stopping {node.name}: every pserver finished the job "
                           f"{how}\n")
            _signal_group(life.process.pid, signal.SIGTERM)
            _signal_group(life.process.pid, signal.SIGCONT)

    async def _settle(self, failed: NodeRun, stop: asyncio.Future[int]) -> Failure:
        """The failure of `failed`, and of every other node that fails within
        `SETTLE_SECONDS` (a signal ends the wait)."""
        others = [n for n in self.nodes if n.running]
        watchers = [w for n in others if (w := n.lives[-1].watcher) is not None]
        if watchers:
            ended: asyncio.Future[Any] = asyncio.gather(*watchers, return_exceptions=True)
            await asyncio.wait([ended, stop], timeout=SETTLE_SECONDS,
                               return_when=asyncio.FIRST_COMPLETED)
        also = [n.exit_reason() for n in others
                if n.exit_code not in (0, None) and not n.killed]
        return Failure("; ".join([failed.exit_reason(), *also]), failed.name)

    # -- what the fault target asks (`runtime.faults.inject.Nodes`)
    # -------------------------------------
    def _node(self, name: str) -> NodeRun:
        return next(n for n in self.nodes if n.name == name)

    def kill(self, node: str, returning: bool) -> int | None:
        run = self._node(node)
        life = run.life
        if life is None or not run.running or life.process.returncode is not None:
            return None
        life.killed = True
        run.log.write(f"[runtime up] fault injection: SIGKILL to {run.name} "
                      f"(process group {life.process.pid})\n")
        _signal_group(life.process.pid, signal.SIGKILL)
        if returning:
            loop = asyncio.get_running_loop()
            back = self._comebacks[node] = loop.create_future()
            run.restart = loop.create_task(self._restart(run, back), name=f"restart {node}")
        return life.process.pid

    def restart(self, node: str) -> None:
        back = self._comebacks.pop(node, None)
        if back is not None and not back.done():
            back.set_result(None)

    def send_signal(self, node: str, sig: signal.Signals) -> bool:
        run = self._node(node)
        if not run.running:
            return False
        assert run.process is not None
        _signal_group(run.process.pid, sig)
        return True

    async def _restart(self, node: NodeRun, back: asyncio.Future[None]) -> None:
        """Start `node` again once its killed process is reaped and `back` is set."""
        life = node.life
        if life is not None and life.watcher is not None:
            await asyncio.wait([life.watcher])
        await back
        if node.role == "trainer" and self._job_over():  # the job ended while it was down
            node.log.write(f"[runtime up] not restarting {node.name}: every pserver finished "
                           f"the job while it was down\n")
            return
        how = "--recover" if node.role == "pserver" else f"--incarnation {len(node.lives)}"
        node.log.write(f"[runtime up] restarting {node.name} ({how})\n")
        if self._display is not None:
            self._display.message(f"restarting {node.name} ({how})")
        await self._start(node)

    async def _stop_all(self, why: str) -> None:
        restarts = [n.restart for n in self.nodes if n.restart is not None]
        for task in restarts:
            task.cancel()
        await asyncio.gather(*restarts, return_exceptions=True)
        running = [n for n in self.nodes if n.running]
        for node in running:
            assert node.process is not None
            node.log.write(f"[runtime up] stopping {node.name}: {why}\n")
            _signal_group(node.process.pid, signal.SIGTERM)
            _signal_group(node.process.pid, signal.SIGCONT)  # a paused node must see it
        watchers = [w for n in running if (w := n.lives[-1].watcher) is not None]
        if not watchers:
            return
        _, late = await asyncio.wait(watchers, timeout=GRACE_SECONDS)
        for node in running:
            if node.lives[-1].watcher in late:
                assert node.process is not None
                _signal_group(node.process.pid, signal.SIGKILL)
        await asyncio.gather(*watchers, return_exceptions=True)


def _left_behind(node: NodeRun, life: Life) -> bool:
    """Whether trainer `node`'s `life` has no job left once every pserver has finished: it has
    not reported its last step (one that has is exiting by itself, a restart that rejoined and
    trained to the end too, as the simulator's `LocalCluster._left_behind` counts only those
    still training)."""
    last = node.seen[-1] if len(node.seen) > life.first_seen else None
    return last is None or last.step < last.steps


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


# -- results -----------------------------------------------------------------------------------

def gather_metrics(launcher: Launcher, wall: float, failure: Failure | None,
                   notes: list[str], netns: NetnsMetrics | None = None) -> JobMetrics:
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
        if failure is None and not path.exists() and not node.killed and not node.moot:
            failure = Failure(f"{node.name} exited with status 0 but wrote no {path}", node.name)
    served = launcher.endpoints if scenario.cluster.pservers else []  # else the trainers'
    summary = JobSummary.for_run("runtime up", scenario, served, trainers, pservers)
    summary.wall_seconds = wall
    summary.success = failure is None
    if failure is not None:
        summary.reason, summary.failed_node = failure.reason, failure.node
    events = metrics_events(launcher.injector.events) if launcher.injector is not None else []
    return JobMetrics(summary, trainers, pservers, [], notes, events,
                      proxies=proxy_metrics(dict(enumerate(launcher.proxies))), netns=netns)


def proxy_metrics(proxies: Mapping[int, FaultProxy]) -> list[ProxyMetrics]:
    """The counters of each fault proxy (by its pserver's index), per client link and
    direction."""
    return [ProxyMetrics(j, proxy.address, proxy.upstream,
                         {client: {d.value: asdict(c) for d, c in counters.items()}
                          for client, counters in sorted(proxy.client_counters.items())})
            for j, proxy in sorted(proxies.items())]


def fault_free_params(scenario: Scenario, secure: bool = True) -> dict[str, np.ndarray]:
    """Trainer 0's final parameters in the same job without its faults: every node a task of
    this process over loopback ZeroMQ, which in sync mode computes the same numbers, bit for
    bit, as separate processes. With `secure` its nodes speak CurveZMQ with fresh keys held in
    memory (`runtime.services.local_zmq`): its listening sockets admit none but its own
    trainers."""
    clean = scenario.model_copy(update={"faults": []})
    cluster = scenario.cluster
    listeners = cluster.trainers if scenario.transpiler.mode in TRAINER_RING_MODES \
        else cluster.pservers
    job = Job.from_scenario(clean, free_endpoints(cluster.host, listeners))
    transports = zmq_transports(job, fresh_keys(job) if secure else None)
    result = run_async(asyncio.wait_for(run_job(job, transports), scenario.train.deadline))
    return result.params


def check_expectations(launcher: Launcher, metrics: JobMetrics) -> list[ExpectationResult]:
    return check_run(launcher.scenario, launcher.endpoints, launcher.out / "params.npz", metrics,
                     secure=launcher.security[0] != "--insecure")


def check_run(scenario: Scenario, endpoints: list[str], params: Path,
              metrics: JobMetrics, secure: bool = True) -> list[ExpectationResult]:
    """`scenario`'s expectations of a run whose records are `metrics` and whose trainer 0 left
    its final parameters in `params`; `secure`: its fault-free reference run speaks CurveZMQ
    (`fault_free_params`)."""

    def local() -> dict[str, np.ndarray]:
        job = Job.from_scenario(scenario, endpoints)
        return train_locally(job, scenario.backend.kernels)[1]

    losses = metrics.trainers[0].losses if metrics.trainers else []
    return expect.check(scenario, losses, _load_params(params), metrics.pservers, local,
                        fault_free_params=lambda: fault_free_params(scenario, secure),
                        redone=[t.steps_redone for t in metrics.trainers])


def judge(scenario: Scenario, metrics: JobMetrics, check: Callable[[], list[ExpectationResult]],
          interrupted: bool = False) -> None:
    """Fill in `metrics`' expectations and verdict: an expected error's (`judge_outcome`), or
    `check`'s when the run succeeded."""
    if scenario.expect.error is not None and not interrupted:
        judge_outcome(scenario, metrics)
    elif metrics.job.success:
        metrics.expectations = check()
        failed = [f"{e.name} ({e.detail})" for e in metrics.expectations if not e.passed]
        if failed:
            metrics.job.success = False
            metrics.job.reason = f"expectation not met: {'; '.join(failed)}"


def judge_outcome(scenario: Scenario, metrics: JobMetrics) -> None:
    """For a scenario whose ``expect.error`` says the run must fail: the run is a success when
    it failed with that text (its reason stays), a failure when it did not fail."""
    job = metrics.job
    result = expect.outcome(scenario, None if job.success else RunFailed(job.reason))
    assert result is not None
    metrics.expectations = [result]
    if job.success:
        job.success, job.reason = False, f"expectation not met: error ({result.detail})"
    else:
        job.success = result.passed


def _load_params(path: Path) -> dict[str, np.ndarray] | None:
    if not path.exists():
        return None
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


COUNTED = ("messages", "dropped", "duplicated", "reordered", "delayed", "cut")


def nonfinite_lines(pservers: list[PserverMetrics]) -> list[str]:
    """One line per trainer whose gradients a pserver found NaN, infinite or out of range."""
    by_trainer: dict[int, list[str]] = {}
    for p in pservers:
        for trainer, count in sorted(p.nonfinite.items()):
            by_trainer.setdefault(trainer, []).append(f"{count} at {pserver_name(p.index)}")
    skipped = sum(p.skipped_steps for p in pservers)
    what = f"; {skipped} step update(s) skipped" if skipped else ""
    return [f"{trainer_name(trainer)} sent NaN, infinite or out-of-range gradients: SENDs "
            f"{', '.join(where)}{what}" for trainer, where in sorted(by_trainer.items())]


def summary_lines(metrics: JobMetrics) -> list[str]:
    lines = []
    for t in metrics.trainers:
        loss = (f"loss {t.losses[0]:.4f} -> {t.losses[-1]:.4f}" if t.losses else "no steps")
        mean = f"mean step {1e3 * t.step_time.mean:.1f}ms" if t.step_time else ""
        if t.startup_wait_seconds:
            mean += f" (start-up {t.startup_wait_seconds:.2f}s)"
        joined = f"  from step {t.first_step}" if t.first_step else ""
        redone = f"  redid {t.steps_redone}" if t.steps_redone else ""
        redone += f"  resent {t.resends} request(s)" if t.resends else ""
        lines.append(f"{trainer_name(t.index):<12} {len(t.losses)} steps{joined}{redone}  {loss}  "
                     f"{mean}  (exit {t.exit_code})")
    for p in metrics.pservers:
        lines.append(f"{pserver_name(p.index):<12} {p.steps} steps  {p.messages} messages  "
                     f"{p.bytes_in / 1e6:.2f} MB in  {p.bytes_out / 1e6:.2f} MB out  optimize "
                     f"{p.optimize_seconds:.3f}s  errors {p.errors}  dropped {p.dropped or '-'}  "
                     f"(exit {p.exit_code})")
    lines += nonfinite_lines(metrics.pservers)
    for f in metrics.faults:
        span = f"{f.start:.2f}s" + (f" -> {f.end:.2f}s" if f.end is not None else "")
        lines.append(f"fault {f.fault} {f.what}: {span} ({f.detail})")
    for x in metrics.proxies or ():
        totals = {name: sum(link[d][name] for link in x.links.values() for d in link)
                  for name in COUNTED}
        counted = ", ".join(f"{v} {k}" for k, v in totals.items() if v or k == "messages")
        lines.append(f"proxy pserver:{x.pserver} {x.address} -> {x.upstream}: {counted}")
    lines += netns_lines(metrics.netns)
    for e in metrics.expectations:
        lines.append(f"expect {e.name}: {'PASS' if e.passed else 'FAIL'}: {e.detail}")
    job = metrics.job
    rate = f", {job.samples_per_second:,.0f} samples/s" if job.samples_per_second else ""
    if job.step_samples_per_second:
        rate += f" ({job.step_samples_per_second:,.0f} at the median step)"
    wall = f"wall {job.wall_seconds:.2f}s" if job.wall_seconds is not None else "wall unknown"
    lines.append(f"{wall}{rate}")
    return lines


def netns_lines(netns: NetnsMetrics | None) -> list[str]:
    """A line per node of a ``--netns`` run: what its interface's qdiscs let through."""
    if netns is None:
        return []
    lines = []
    for n in netns.nodes:
        if n.rate is None:
            lines.append(f"netns {n.node:<12} {n.address}: not shaped")
            continue
        out, into = n.egress, n.ingress
        lines.append(f"netns {n.node:<12} {n.address}: tbf {fmt_rate(n.rate)}, sent "
                     f"{(out.get('bytes') or 0) / 1e6:.2f} MB (waited {out.get('overlimits')}x, "
                     f"dropped {out.get('drops')}), took in {(into.get('bytes') or 0) / 1e6:.2f} "
                     f"MB (waited {into.get('overlimits')}x, dropped {into.get('drops')})")
    return lines


def verdict(metrics: JobMetrics) -> str:
    job = metrics.job
    if not job.success:
        return f"FAILED: {job.reason}"
    expected = [e.detail for e in metrics.expectations if e.name == "error"]
    return f"OK: {job.scenario}" + "".join(f": {detail}" for detail in expected)


class SecurityError(Exception):
    """A security the job cannot have (local sockets with TCP proxies or namespaces)."""


def secure(launcher: Launcher, keys: Path | None, insecure: bool,
           ipc: Path | None = None) -> list[str]:
    """Choose the nodes' `Launcher.security` (see the module doc): local sockets in `ipc` or in
    a directory made here; the job's keys, checked here, or keys made in OUT/keys; none with
    `insecure`. Fault proxies become `CurveFaultProxy`s with their pservers' keys, made in
    their pservers' namespaces under ``--netns``. The warnings to show; `KeyFileError` names a
    key file missing from `keys`, `SecurityError` a choice the job cannot have."""
    one_host = not launcher.proxies and not launcher.namespaces
    chosen = ("none" if insecure else "curve" if keys is not None else "local" if ipc is not None
              else launcher.scenario.cluster.secured(one_host))
    if chosen == "none":
        launcher.security = ["--insecure"]
        return [insecure_warning(f"runtime up {launcher.scenario.name}", launcher.endpoints)]
    if chosen == "local":
        if not one_host:
            why = "--netns" if launcher.namespaces else "the message faults' proxies"
            raise SecurityError(f"local sockets (cluster.security local or --ipc) need every "
                                f"node on this host's own network; {why} talk TCP: use "
                                "cluster.security auto or curve")
        if ipc is None:
            ipc = launcher.socket_dir = make_socket_dir()
        launcher.security = ["--ipc", str(ipc)]
        return []
    if keys is None:
        keys = launcher.out / "keys"
        write_keys(keys, [node_file_stem(n.role, n.index) for n in launcher.nodes], force=True)
    cluster = launcher.scenario.cluster
    for node in launcher.nodes:
        node_keys(keys, node.role, node.index, cluster.trainers, launcher.endpoints,
                  peers=cluster.pservers == 0)
    launcher.proxies = [CurveFaultProxy.like(proxy, node_keys(
        keys, "pserver", j, cluster.trainers, launcher.endpoints, relay=True),
        made_in=_made_in(launcher, j))
        for j, proxy in enumerate(launcher.proxies)]
    launcher.security = ["--keys", str(keys.resolve())]
    return []


def _made_in(launcher: Launcher, pserver: int) -> Callable[[], AbstractContextManager[None]] | None:
    """Where pserver `pserver`'s proxy makes its sockets: in its namespace (``--netns``)."""
    namespace = launcher.namespaces.get(pserver_name(pserver))
    return None if namespace is None else partial(entered, namespace)


def launch(scenario_path: Path, overrides: list[str], scenario: Scenario, out: Path,
           stream: TextIO, netns: bool = False, keys: Path | None = None,
           insecure: bool = False, ipc: Path | None = None) -> int:
    """Run every node of `scenario` as a process; the exit status for `runtime up`. With
    `netns`, each node in a network namespace of its own with the scenario's network applied
    (`runtime.launch.netns`; `check_netns` says whether that can work here): the namespaces are
    deleted before this returns, on failure and interruption too. `keys` and `insecure`: the
    job's security (`secure`), and `ipc` the local sockets' directory to use. The output folder `out` is claimed first
    (`runtime.config.outdir`): `OutputDirError` when it cannot be used or another run holds it."""
    with claim_output(out) as claim:
        return _launch(scenario_path, overrides, scenario, out, stream, netns, keys, insecure,
                       claim.fds, ipc)


def _launch(scenario_path: Path, overrides: list[str], scenario: Scenario, out: Path,
            stream: TextIO, netns: bool, keys: Path | None, insecure: bool,
            locks: tuple[int, ...], ipc: Path | None = None) -> int:
    """`launch` in the output folder `out`, claimed: `locks` are its lock's descriptors, which
    every node holds too (`Launcher.inherit`)."""
    prepare_out(out, scenario)
    notes = ignored_by_runtime(scenario, netns)
    if not netns:
        endpoints = choose_endpoints(scenario)
        proxies, binds = fault_proxies(scenario, endpoints)
        launcher = Launcher(scenario_path.resolve(), overrides, scenario, endpoints, out, binds,
                            proxies, inherit=locks)
        return run_launcher(launcher, notes, stream, keys=keys, insecure=insecure, ipc=ipc)
    with sigterm_interrupts():  # Ctrl-C or SIGTERM: the namespaces are deleted all the same
        try:
            return _launch_in_namespaces(scenario_path, overrides, scenario, out, stream, notes,
                                         keys, insecure, locks, ipc)
        except KeyboardInterrupt:
            print("FAILED: interrupted (the network namespaces are deleted)", file=stream,
                  flush=True)
            return 128 + signal.SIGINT


def _launch_in_namespaces(scenario_path: Path, overrides: list[str], scenario: Scenario,
                          out: Path, stream: TextIO, notes: list[str], keys: Path | None,
                          insecure: bool, locks: tuple[int, ...], ipc: Path | None = None) -> int:
    try:
        fabric = Fabric.create(scenario)
    except NetnsError as exc:
        print(f"FAILED: --netns: {exc}", file=stream, flush=True)
        return 1
    try:
        if fabric.removed_stale:
            print(f"note: removed network namespaces an earlier run left behind: "
                  f"{', '.join(fabric.removed_stale)}", file=stream)
        launcher = netns_launcher(scenario_path, overrides, scenario, out, fabric)
        launcher.inherit = locks
        return run_launcher(launcher, notes, stream, fabric, keys, insecure, ipc)
    finally:
        for problem in fabric.delete():
            print(f"warning: --netns: deleting the namespaces: {problem}", file=stream,
                  flush=True)


def netns_launcher(scenario_path: Path, overrides: list[str], scenario: Scenario, out: Path,
                   fabric: Fabric) -> Launcher:
    """The launcher of a ``--netns`` run: each node in its namespace, the pservers' endpoints at
    their addresses and, where a trainer-pserver link has a latency (or the scenario message
    faults), a proxy in each pserver's namespace in front of it, the pserver serving behind it
    on that namespace's loopback: a `DelayRelay` where every such latency is a constant and
    no fault acts on messages, else a `FaultProxy`."""
    port = scenario.cluster.base_port or PORT
    pservers = [pserver_name(j) for j in range(scenario.cluster.pservers)]
    endpoints = [f"{fabric.address(p)}:{port}" for p in pservers]
    namespaces = {node: host.namespace for node, host in fabric.hosts.items()}
    spec = NetworkSpec.from_section(scenario.network)
    latencies = link_latencies(spec, scenario)
    if not latencies and not needs_proxies(scenario.faults):
        return Launcher(scenario_path.resolve(), overrides, scenario, endpoints, out,
                        namespaces=namespaces)
    bind = f"127.0.0.1:{port + 1 if port < 65535 else port - 1}"
    constant = {link: latency.value for link, latency in latencies.items()
                if isinstance(latency, ConstantLatency)}
    if not needs_proxies(scenario.faults) and len(constant) == len(latencies):
        relays = [DelayRelay(listen=endpoint, upstream=bind, socket_factory=fabric.sockets(p),
                             latencies={fabric.address(t): seconds
                                        for (t, q), seconds in constant.items() if q == p})
                  for p, endpoint in zip(pservers, endpoints)]
        return Launcher(scenario_path.resolve(), overrides, scenario, endpoints, out,
                        [bind] * len(pservers), namespaces=namespaces, relays=relays)
    base = {link: Faults(latency=latency.sample) for link, latency in latencies.items()}
    proxies = [FaultProxy(listen=endpoint, upstream=bind, seed=scenario.seed, upstream_name=p,
                          client_faults={t: f for (t, q), f in base.items() if q == p},
                          socket_factory=fabric.sockets(p))
               for p, endpoint in zip(pservers, endpoints)]
    return Launcher(scenario_path.resolve(), overrides, scenario, endpoints, out,
                    [bind] * len(pservers), proxies, namespaces=namespaces, base_faults=base)


def run_launcher(launcher: Launcher, notes: list[str], stream: TextIO,
                 fabric: Fabric | None = None, keys: Path | None = None,
                 insecure: bool = False, ipc: Path | None = None) -> int:
    """Run `launcher`'s job, secured as `secure` says, report, check and record it; the exit
    status."""
    try:
        warnings = secure(launcher, keys, insecure, ipc)
    except (KeyFileError, SecurityError) as exc:
        for node in launcher.nodes:
            node.log.close()
        where = "--keys: " if isinstance(exc, KeyFileError) else ""
        print(f"FAILED: {where}{exc}", file=stream, flush=True)
        return 1
    try:
        return _run_secured(launcher, notes, stream, warnings, fabric)
    finally:
        if launcher.socket_dir is not None:
            shutil.rmtree(launcher.socket_dir, ignore_errors=True)


def _run_secured(launcher: Launcher, notes: list[str], stream: TextIO, warnings: list[str],
                 fabric: Fabric | None) -> int:
    """`run_launcher`, its security chosen."""
    scenario, out = launcher.scenario, launcher.out
    for warning in warnings:
        print(warning, file=sys.stderr, flush=True)
    cluster, train = scenario.cluster, scenario.train
    binds = ",".join(dict.fromkeys(launcher.binds))
    where = " in their namespaces" if fabric is not None else ""
    behind = "" if not launcher.proxies and not launcher.relays else \
        f" (behind {'proxies' if launcher.proxies else 'delay relays'}, serving at {binds}{where})"
    nodes = f"{cluster.pservers} pserver(s)" if cluster.pservers else "no pservers, trainers"
    print(f"runtime up {scenario.name}: {nodes} at {','.join(launcher.endpoints)}{behind}, {cluster.trainers} trainer(s), "
          f"{scenario.transpiler.mode}, {train.steps} steps of {scenario.data.batch_size}; "
          f"logs in {out / 'logs'}", file=stream, flush=True)
    if launcher.security[0] == "--keys":
        print(f"CurveZMQ: every connection authenticated and encrypted, keys in "
              f"{launcher.security[1]}", file=stream)
    elif launcher.security[0] == "--ipc":
        print(f"local sockets: every node talks over ipc sockets in {launcher.security[1]} "
              f"(mode 0700: only {getpass.getuser()}'s processes on this host can connect; "
              "nothing leaves the kernel, so nothing is encrypted: SECURITY.md)", file=stream)
    if scenario.collective.backend == "torch" and cluster.pservers == 0:
        print("torch.distributed: the trainers' all-reduce is neither authenticated nor "
              "encrypted (collective.backend torch; see SECURITY.md)", file=stream)
    if fabric is not None:
        for host in fabric.hosts.values():
            shaped = f"tbf {fmt_rate(host.rate)} each way" if host.rate else "not shaped"
            print(f"netns: {host.node} at {host.address} in {host.namespace}, {shaped}",
                  file=stream)
    for note in notes:
        print(f"note: {note}", file=stream)
    output = DetachedOutput(stream)  # the run never waits for the reader of its display
    display = make_display(cast(TextIO, output), launcher.nodes, train.log_every,  # a text stream
                           train.steps)
    try:
        wall, failure = run_async(launcher.run(display))
    finally:
        display.close()
        output.close()
    netns = fabric.metrics() if fabric is not None else None
    metrics = gather_metrics(launcher, wall, failure, notes, netns)
    interrupted = failure is not None and failure.signal is not None
    judge(scenario, metrics, lambda: check_expectations(launcher, metrics), interrupted)
    write_record(out / "metrics.json", metrics)
    for line in summary_lines(metrics):
        print(line, file=stream)
    print(f"metrics: {out / 'metrics.json'}", file=stream)
    print(verdict(metrics), file=stream, flush=True)
    if failure is not None and failure.signal is not None:
        return 128 + failure.signal
    return 0 if metrics.job.success else 1
