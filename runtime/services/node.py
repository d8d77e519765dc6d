"""One node of a job: run a single pserver or trainer of a scenario in this process.

Every node reads the same scenario and the same pserver endpoints and builds the same `Job`, so
the nodes agree on every program without talking (see `runtime.services.job`). Which node this
process is comes from the command line (``--role pserver|trainer --index N [--endpoints h:p,...]``)
or, as with Paddle's launchers, from the environment: ``TRAINING_ROLE`` (``PSERVER`` or
``TRAINER``), the pserver endpoints (``PADDLE_PSERVERS_IP_PORT_LIST``), the trainer count
(``PADDLE_TRAINERS_NUM``), a trainer's index (``PADDLE_TRAINER_ID``) and a pserver's own endpoint
(``POD_IP`` and ``PADDLE_PORT``), or the other names Paddle gave them
(`runtime.config.paddle_env` maps every name to its fact and refuses two that disagree).

Endpoints and the trainer count given this way replace the scenario's ``cluster.pservers`` and
``cluster.trainers`` (both together, so the job stays consistent); a scenario that lists its own
``cluster.endpoints.pservers`` must list the same ones.

A pserver serves until every trainer has completed, a trainer runs ``train.steps`` steps and
prints a progress line per step for people (`format_progress`); where its environment names a
progress channel (``PSLAB_PROGRESS_FD``, set by `runtime up`) it also reports each step there
(`runtime.services.progress`), which the launcher reads for its display and the faults triggered at
a step. Both give up when ``train.deadline`` passes. With an output
directory the node writes its `runtime.config.metrics` record to ``OUT/nodes/<role>-<index>.json``,
and trainer 0 its final parameters to ``OUT/params.npz``; a node on its own (not started by
`runtime up`) also describes its job in ``OUT/nodes/<role>-<index>.job.json`` as it starts, for
``runtime collect`` (`runtime.launch.collect`), which merges the records of nodes that ran on
several hosts into one ``metrics.json``. Exit status 0 means done; any error is
logged (with its traceback unless it is what the scenario expects or a condition of the job,
such as a timeout: `runtime.services.failures`) and ends with one line ``<node> failed:
<error>`` on stderr and status 1. A node started by `runtime up` dies with it
(`runtime.services.lifeline`); a pserver it started that gets SIGTERM (the launcher stopping the
job, or gone) stops serving, writes its record of what it served so far and exits with status
143 (128 + SIGTERM). A pserver on
its own (role mode: no `runtime up` to restart its trainers) whose trainers are all gone, none
heard from for ``train.heartbeat_timeout`` (or ``train.startup_timeout`` from its start), stops
with ``pserver:N failed: pserver:N gave up: its trainers are gone: ...`` and status 3
(`EXIT_TRAINERS_GONE`) instead of serving until its deadline. The event loop is uvloop's where
installed.

Every pserver checkpoints into `checkpoint_dir_for` (``train.checkpoint_dir``, else
``OUT/checkpoints``) when ``train.checkpoint_every`` asks for it. Three flags serve `runtime
up`'s fault injection (`NodeOptions`): ``--bind HOST:PORT`` makes a pserver serve there instead
of at its endpoint (a fault proxy listens at the endpoint and forwards to it), ``--recover``
starts a pserver that replaces one that crashed (from its last checkpoint, the trainers redoing
the steps it lost) and ``--incarnation N`` a trainer restarted for the N-th time (its message ids
then differ from its earlier lives'). With ``PSLAB_MEASURE=1`` in its environment (`runtime
profile` sets it) a node also times its kernels and its runtime costs
(`runtime.execution.costs.Meter`) and writes them to ``OUT/nodes/<role>-<index>.costs.json``.

Security (`runtime.network.curve`, SECURITY.md): a node talks CurveZMQ with the job's keys from
``--keys DIR`` (or ``PSLAB_KEYS``), written by ``runtime keys DIR``: a pserver admits only the
trainers' keys and takes a trainer's key as its identity, a trainer checks each pserver's key.
Without keys a node refuses to start unless ``--ipc DIR`` or ``--insecure`` says so. With
``--ipc`` every endpoint is a Unix socket in DIR, a directory of mode 0700 that only the job's
user can open (`runtime.network.local_sockets`: `runtime up` on one host runs its nodes so);
with ``--insecure`` the node warns that anyone reaching its endpoints can read, change and end
the job. Either way a pserver takes no frame or
message larger than its trainers legitimately send it, and holds a bounded budget of received
bytes (`runtime.services.inbound`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Coroutine, Mapping, NoReturn, Sequence, TextIO, TypeVar, cast

import numpy as np

from transpiler.distribute.from_spec import TRAINER_RING_MODES

from runtime.config.atomic import atomic_open, write_atomic
from runtime.config.metrics import PserverMetrics, RunFacts, TrainerMetrics, write_record
from runtime.config.nodes import (ROLES, RoleName, node_file_stem, node_name, pserver_name,
                                  trainer_name)
from runtime.config.paddle_env import ENV_VARS, RoleError, paddle_node, parse_endpoints
from runtime.config.paddle_env import env_role as paddle_role
from runtime.config.scenario import Scenario, ScenarioError, load_scenario
from runtime.execution.costs import KernelTimes, Meter
from runtime.execution.executor import set_kernel_threads
from runtime.execution.executor import timing_kernels
from runtime.network.curve import KEYS_VAR, RELAY, CurveKeys, load_keys
from runtime.network.local_sockets import (SocketDirError, check_socket_dir,
                                           release_socket_dir)
from runtime.network.ports import wait_for_ports
from runtime.network.zmq_transport import ZmqLimits, ZmqTransport
from runtime.services.cluster import batches_for, make_pserver, make_trainer
from runtime.services.failures import traceback_wanted
from runtime.services.inbound import pserver_inbound_limits
from runtime.services.job import Job, check_job
from runtime.services.lifeline import (die_with_launcher, launcher_gone, launcher_pid,
                                      lifeline_signal)
from runtime.services.output import DetachedOutput, shown_dropped
from runtime.services.progress import Progress, Reporter
from runtime.services.pserver import ServerStats, TrainersGone
from runtime.services.trainer import TrainerReport

log = logging.getLogger("runtime.services.node")

MEASURE_VAR = "PSLAB_MEASURE"
"""Set to 1 (as `runtime profile` does), a node measures its kernels and runtime costs and
writes them to ``OUT/nodes/<role>-<index>.costs.json``."""
EXIT_TRAINERS_GONE = 3
"""The exit status of a pserver on its own that stopped because its trainers were gone."""
EXIT_LAUNCHER_GONE = 4
"""The exit status of a node whose `runtime up` died before the node started."""
ALONE_VAR = "PSLAB_ALONE"
"""Set to 1 by `runtime up --role` (`runtime.launch.role`), which supervises this one node to
act out its faults: the node is still on its own (no launcher of the whole job)."""
STOP_GRACE = 5.0
"""Seconds a pserver stopped by SIGTERM has to write its record before it is killed."""
UPDATES_EVERY = 0.005
"""Seconds between a pserver's looks at its update count, to report it on a progress channel."""
T = TypeVar("T")


class NodeError(RuntimeError):
    """A node that could not do its part (e.g. its deadline passed); the message names it."""


class Stopped(Exception):
    """SIGTERM stopped this node: its launcher stopping the job, or gone."""


@dataclass(frozen=True)
class NodeOptions:
    """How this node's process differs from a first start at its own endpoint."""

    bind: str | None = None
    """A pserver: the address to serve at instead of its endpoint (behind a fault proxy)."""
    recover: bool = False
    """A pserver that replaces a crashed one: start from its last checkpoint."""
    incarnation: int = 0
    """A trainer: how many times it was started before."""
    alone: bool = False
    """No `runtime up` supervises this process (role mode): a pserver whose trainers are all
    gone stops (`EXIT_TRAINERS_GONE`) instead of waiting for them until its deadline."""
    keys: Path | None = None
    """The job's key directory (CurveZMQ); None: unauthenticated and unencrypted (--insecure),
    unless `ipc` is given."""
    ipc: Path | None = None
    """The job's socket directory (``--ipc``): every endpoint is a Unix socket in it, which
    only its user can open (`runtime.network.local_sockets`), and no CurveZMQ."""
    stoppable: bool = False
    """SIGTERM stops a pserver after it wrote its record (`until_sigterm`): one started by
    `runtime up`, which reads the records of an interrupted job too."""


@dataclass(frozen=True)
class Role:
    """Which node this process runs, and where that was said (for error messages)."""

    role: RoleName
    index: int
    index_source: str
    endpoints: tuple[str, ...] | None = None
    endpoints_source: str = "--endpoints"
    trainers: int | None = None

    @property
    def name(self) -> str:
        return node_name(self.role, self.index)


# -- which node --------------------------------------------------------------------------------

def resolve_role(role: str | None, index: int | None, endpoints: str | None,
                 env: Mapping[str, str]) -> Role | None:
    """The node that flags or, failing them, Paddle's variables name; None for neither (then
    `runtime up` launches every node itself)."""
    env_role = paddle_role(env)
    if role is None and index is not None:
        raise RoleError("--index needs --role pserver|trainer")
    if role is None and env_role is not None:
        if endpoints is not None:
            raise RoleError(f"--endpoints needs --role; with {env_role.source} set the endpoints "
                            "come from PADDLE_PSERVERS_IP_PORT_LIST")
        return _role_from_env(env)
    if role is None:
        if endpoints is not None:
            raise RoleError("--endpoints needs --role (runtime up picks free ports itself, or uses "
                            "the scenario's cluster.endpoints)")
        return None
    if env_role is not None and env_role.value != role:
        raise RoleError(f"--role {role} contradicts {env_role.source}={env_role.text}; give one "
                        "of them")
    if index is None:
        raise RoleError(f"--role {role} needs --index N")
    if index < 0:
        raise RoleError(f"--index {index}: must be >= 0")
    eps = parse_endpoints(endpoints, "--endpoints") if endpoints is not None else None
    return Role(role, index, "--index", eps)  # type: ignore[arg-type]


def _role_from_env(env: Mapping[str, str]) -> Role:
    node = paddle_node(env)
    assert node is not None, "called with a role variable set"
    return Role(node.role, node.index, node.index_source, node.endpoints, node.endpoints_source,
                node.trainers)


def node_options(role: Role | None, bind: str | None, recover: bool,
                 incarnation: int | None) -> NodeOptions:
    """The `NodeOptions` the flags give, checked against the role they apply to."""
    given = [flag for flag, value in (("--bind", bind), ("--recover", recover),
                                      ("--incarnation", incarnation)) if value]
    if role is None:
        if given:
            raise RoleError(f"{given[0]} needs --role (it describes one node's process)")
        return NodeOptions()
    wrong = [f for f in given if (f == "--incarnation") != (role.role == "trainer")]
    if wrong:
        raise RoleError(f"{wrong[0]} does not apply to {role.name}: --bind and --recover are "
                        "for a pserver, --incarnation for a trainer")
    if bind is not None:
        (bind,) = parse_endpoints(bind, "--bind")
    if incarnation is not None and incarnation < 0:
        raise RoleError(f"--incarnation {incarnation}: must be >= 0")
    return NodeOptions(bind, recover, incarnation or 0)


def key_directory(role: Role | None, keys: Path | None, insecure: bool,
                  env: Mapping[str, str]) -> Path | None:
    """The job's key directory: ``--keys``, else `KEYS_VAR`; None with ``--insecure``, or for
    `runtime up` launching the job itself (role None), which then makes keys of its own."""
    if keys is not None and insecure:
        raise RoleError("--keys and --insecure contradict each other; give one of them")
    if insecure:
        return None
    named = keys or (Path(env[KEYS_VAR].strip()) if env.get(KEYS_VAR, "").strip() else None)
    if named is None and role is not None:
        raise RoleError(f"{role.name}: no keys: give --keys DIR (written by `runtime keys DIR`) "
                        f"or set {KEYS_VAR}, or run unauthenticated and unencrypted with "
                        "--insecure (see SECURITY.md)")
    return named


def socket_directory(ipc: Path | None, keys: Path | None, insecure: bool) -> Path | None:
    """``--ipc DIR``, checked: a directory of this user's that nobody else can open
    (`check_socket_dir`); it takes neither ``--keys`` nor ``--insecure``."""
    if ipc is None:
        return None
    if keys is not None or insecure:
        raise RoleError(f"--ipc talks over local sockets without CurveZMQ; it does not combine "
                        f"with {'--keys' if keys is not None else '--insecure'}")
    try:
        return check_socket_dir(ipc)
    except SocketDirError as err:
        raise RoleError(f"--ipc {err}") from err


def node_security(role: Role | None, ipc: Path | None, keys: Path | None, insecure: bool,
                  env: Mapping[str, str]) -> tuple[Path | None, Path | None]:
    """The job's socket directory (`socket_directory`) and, without one, its key directory
    (`key_directory`), from ``--ipc``, ``--keys`` and ``--insecure``."""
    directory = socket_directory(ipc, keys, insecure)
    return directory, None if directory is not None else key_directory(role, keys, insecure, env)


def insecure_warning(who: str, endpoints: Sequence[str]) -> str:
    """What a node or job run with ``--insecure`` says on stderr."""
    return (f"warning: {who}: --insecure: no CurveZMQ: whoever reaches "
            f"{','.join(endpoints) or 'the pserver endpoints'} can read and change the "
            "parameters and end the job; see SECURITY.md")


def node_keys(directory: Path, role: str, index: int, trainers: int,
              endpoints: Sequence[str], peers: bool = False, relay: bool = False) -> CurveKeys:
    """A node's keys from the job's key directory: a pserver's keypair and the public key of
    each of the `trainers`, or a trainer's keypair and the public key of the pserver at each of
    the `endpoints` (`runtime.network.curve`). With `peers` (nccl2, collective: `endpoints` are
    the trainers'), a trainer is a server to the other trainers and a client of each. With
    `relay` (a pserver behind a fault proxy), a pserver also admits its own key as `RELAY`, the
    proxy's."""
    if peers:
        others = [i for i in range(trainers) if i != index]
        return load_keys(directory, node_file_stem("trainer", index),
                         clients={node_file_stem("trainer", i): trainer_name(i) for i in others},
                         servers={node_file_stem("trainer", i): endpoints[i] for i in others})
    if role == "pserver":
        clients = {node_file_stem("trainer", i): trainer_name(i) for i in range(trainers)}
        if relay:
            clients[node_file_stem("pserver", index)] = RELAY
        return load_keys(directory, node_file_stem("pserver", index), clients=clients)
    return load_keys(directory, node_file_stem("trainer", index), servers={
        node_file_stem("pserver", j): endpoint for j, endpoint in enumerate(endpoints)})


def checkpoint_dir_for(scenario: Scenario, out: Path | None) -> Path | None:
    """Where pservers save their checkpoints: ``train.checkpoint_dir``, else ``OUT/checkpoints``
    (None without an output directory: then only a scenario that names one checkpoints)."""
    named = scenario.train.checkpoint_dir
    if named is not None:
        return Path(named)
    return None if out is None else out / "checkpoints"


def scenario_for(scenario: Scenario, role: Role) -> Scenario:
    """`scenario` with the cluster size `role` implies, after checking that they agree."""
    cluster = scenario.cluster
    peers = scenario.transpiler.mode in TRAINER_RING_MODES  # the endpoints are the trainers'
    kind = "trainers" if peers else "pservers"
    listed = (cluster.endpoints or {}).get(kind)
    if role.endpoints is not None and listed and tuple(listed) != role.endpoints:
        raise RoleError(f"{role.endpoints_source} {','.join(role.endpoints)} differs from the "
                        f"scenario's cluster.endpoints.{kind} {','.join(listed)}")
    update: dict[str, Any] = {}
    if role.endpoints is not None:
        update[kind] = len(role.endpoints)
    if role.trainers is not None:
        update["trainers"] = role.trainers
    cluster = cluster.model_copy(update=update)
    count = cluster.pservers if role.role == "pserver" else cluster.trainers
    if role.index >= count:
        where = (role.endpoints_source if role.role == "pserver" and role.endpoints is not None
                 else f"cluster.{role.role}s")
        raise RoleError(f"{role.index_source} {role.index}: the job has {count} {role.role}(s) "
                        f"({where})")
    return scenario.model_copy(update={"cluster": cluster})


def load_for_role(path: str | Path, overrides: list[str], role: Role | None) -> Scenario:
    """The scenario at `path`, with the cluster size `role` implies (see `scenario_for`), its
    model and data set made once to be sure they can be (`check_job`: a `JobError` now rather
    than a failure in every node; a pserver reads no data, so its host need not hold the
    data file)."""
    scenario = load_scenario(path, overrides)
    scenario = scenario if role is None else scenario_for(scenario, role)
    check_job(scenario, data=role is None or role.role == "trainer")  # pservers read no data
    return scenario


# -- progress ----------------------------------------------------------------------------------

def format_progress(p: Progress) -> str:
    """A trainer's progress line on its stdout, for people (the launcher learns the progress
    from `runtime.services.progress` instead)."""
    return f"step {p.step}/{p.steps} loss {p.loss:.6g} time {p.step_time * 1e3:.3f}ms"


PROGRESS_LINE_SECONDS = 1.0
"""A trainer prints its progress line at most this often (and its first and last steps')."""


class ShownProgress:
    """Which steps' progress lines a trainer prints: its first step's, its last's, a step whose
    loss is not finite, and otherwise one a `PROGRESS_LINE_SECONDS`. DESIGN: a line a step cost
    a quickstart trainer a tenth of its time on a core (py-spy, `benchmarks/step_split.py`):
    the write wakes the output thread, and the launcher, on the same cores, writes each line
    to the node's log; a line a second tells a person as much."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last: float | None = None

    def due(self, progress: Progress) -> bool:
        now = self.clock()
        if (self.last is None or now - self.last >= PROGRESS_LINE_SECONDS
                or progress.step >= progress.steps or not math.isfinite(progress.loss)):
            self.last = now
            return True
        return False


# -- running a node ----------------------------------------------------------------------------

def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on uvloop's event loop where installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def _before_deadline(coro: Coroutine[Any, Any, T], seconds: float, what: str) -> T:
    """`coro`'s result; `NodeError` when `seconds` pass first. A timeout of its own (an
    `RpcTimeout` is a TimeoutError too) propagates as it is."""
    scope = asyncio.timeout(seconds)
    try:
        async with scope:
            return await coro
    except TimeoutError:
        if scope.expired():
            raise NodeError(f"{what} within train.deadline ({seconds:g}s)") from None
        raise


async def until_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """`coro`'s result, or `Stopped` when SIGTERM comes first: `coro` is cancelled, and its
    cleanup runs, so that the caller can write what it did; later SIGTERMs are ignored while the
    loop runs. Should that hang, the process is killed `STOP_GRACE` seconds after the
    signal."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(coro)
    signalled = False

    def on_sigterm() -> None:
        nonlocal signalled
        if signalled:
            return
        signalled = True
        task.cancel()
        timer = threading.Timer(STOP_GRACE, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await task
    except asyncio.CancelledError:
        if not signalled:
            raise
        raise Stopped("stopped by SIGTERM") from None
    finally:
        if not signalled:
            loop.remove_signal_handler(signal.SIGTERM)
        # else it stays until the loop closes, to ignore the signal repeated: Linux sends the
        # parent-death signal again as each thread of a dead launcher ends


def measuring() -> bool:
    """Whether this node measures its costs for `runtime profile` (``PSLAB_MEASURE=1``)."""
    return os.environ.get(MEASURE_VAR) == "1"


def write_costs(out: Path | None, stem: str, meter: Meter, times: KernelTimes,
                encrypted: bool = False) -> None:
    """The node's measurements, for `runtime profile`: OUT/nodes/<stem>.costs.json;
    `encrypted`: it talked CurveZMQ, whose cost `fit_costs` takes out of its I/O thread's."""
    if out is None:
        return
    seconds = sum(sum(s.seconds) for s in times.samples.values())
    record = meter.record(seconds, times.calls, times.bookkeeping)
    record["encrypted"] = encrypted
    record["kernels"] = {op: s.document() for op, s in times.samples.items()}
    path = out / "nodes" / f"{stem}.costs.json"
    write_atomic(path, json.dumps(record))


async def serve_pserver(job: Job, index: int, out: Path | None,
                        options: NodeOptions = NodeOptions()) -> PserverMetrics:
    train = job.scenario.train
    endpoint = job.endpoints[index]
    # linger: the acks of the last COMPLETE messages must leave before the process exits
    keys = (None if options.keys is None
            else node_keys(options.keys, "pserver", index, job.trainers, job.endpoints,
                           relay=options.bind is not None))
    limits = pserver_inbound_limits(job, index).zmq_limits(linger_ms=2000)
    transport = ZmqTransport(pserver_name(index), limits, curve=keys, ipc_dir=options.ipc)
    times = KernelTimes()
    with timing_kernels(times) if measuring() else nullcontext():
        service = make_pserver(job, index, transport, checkpoint_dir=checkpoint_dir_for(
            job.scenario, out), recovering=options.recover)
    if options.alone:
        service.config = replace(service.config, give_up_without_trainers=True)
    if measuring():
        service.meter = Meter("pserver")
        times.samples.clear()  # its startup program ran uncharged, as in a simulation
    bind = options.bind or endpoint
    log.info("%s: serving %s%s for %d trainer(s)%s", service.name, endpoint,
             f" at {bind}" if bind != endpoint else "", job.trainers,
             ", recovering from a crash" if options.recover else "")
    reporter = Reporter.from_environment(os.environ)
    reporting = (None if reporter is None else asyncio.get_running_loop().create_task(
        _report_updates(service.stats, train.steps, reporter), name="report updates"))
    serving = _before_deadline(service.serve(bind), train.deadline,
                               f"{service.name}: not every trainer completed")
    stopped: Stopped | None = None
    try:
        stats = await (until_sigterm(serving) if options.stoppable else serving)
    except Stopped as exc:  # what it served so far is recorded all the same
        stats, stopped = service.stats, exc
    finally:
        if reporting is not None:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
            assert reporter is not None
            reporter.close()
        service.stats.refused += transport.impostors
        service.stats.unauthenticated += transport.unauthenticated
        await transport.close()
    if service.meter is not None:
        write_costs(out, node_file_stem("pserver", index), service.meter, times, keys is not None)
    record = PserverMetrics.from_stats(index, endpoint, stats)
    log.info("%s: %s after %d steps, %d messages, %d errors, %d refused for their sender, "
             "%d connections refused", service.name, stopped or "done", stats.steps,
             stats.messages, stats.errors, stats.refused, stats.unauthenticated)
    if out is not None:
        write_record(out / "nodes" / f"{node_file_stem('pserver', index)}.json", record)
    if stopped is not None:
        raise stopped
    return record


async def _report_updates(stats: ServerStats, steps: int, reporter: Reporter) -> None:
    """Report a pserver's update count on its progress channel as it grows (for the faults
    at a step that its host acts out in role mode, `runtime.launch.role`): a `Progress` whose
    `step` is the updates done, without a loss."""
    done = 0
    while True:
        await asyncio.sleep(UPDATES_EVERY)
        if stats.steps > done:
            done = stats.steps
            reporter.report(Progress(done, steps, math.nan, 0.0))


async def run_trainer(job: Job, index: int, out: Path | None,
                      options: NodeOptions = NodeOptions()) -> TrainerMetrics:
    scenario, model = job.scenario, job.model
    steps, batch = scenario.train.steps, scenario.data.batch_size
    times = KernelTimes()
    with timing_kernels(times) if measuring() else nullcontext():
        keys = (None if options.keys is None
                else node_keys(options.keys, "trainer", index, job.trainers,
                               job.peers or job.endpoints, peers=job.collective))
        # linger: in a ring, the last pieces of the last all-reduce must leave before it exits
        limits = ZmqLimits(linger_ms=2000) if job.collective else None
        transport = ZmqTransport(trainer_name(index), limits, curve=keys, ipc_dir=options.ipc)
        trainer = make_trainer(job, index, transport,
                               incarnation=options.incarnation,
                               checkpoint_dir=checkpoint_dir_for(scenario, out),
                               collective=scenario.collective.backend)
    client = trainer.client
    if measuring():
        client.meter = Meter("trainer")

    reporter = Reporter.from_environment(os.environ)
    shown = ShownProgress()

    def on_step(step: int, loss: float, seconds: float) -> None:
        report = trainer.report
        progress = Progress(step + 1, steps, loss, seconds, report.first_step, report.redone)
        if shown.due(progress):
            print(format_progress(progress), flush=True)
        if reporter is not None:  # every step: the launcher's metrics and faults count them
            reporter.report(progress)

    log.info("%s: %d steps of %d examples against %s%s", trainer_name(index), steps, batch,
             ",".join(job.endpoints),
             f" (restarted, incarnation {options.incarnation})" if options.incarnation else "")
    async def train() -> TrainerReport:
        if trainer.main.attrs.get("_wait_port"):
            await wait_for_ports(trainer_name(index), job.endpoints,
                                 scenario.train.startup_timeout, ipc_dir=options.ipc)
        return await trainer.run(batches_for(job, index), steps, model.loss.name, on_step)

    try:
        report = await _before_deadline(train(), scenario.train.deadline,
                                        f"{trainer_name(index)}: {steps} steps not done")
    finally:
        await client.close()
        if reporter is not None:
            reporter.close()
    if client.meter is not None:
        write_costs(out, node_file_stem("trainer", index), client.meter, times, keys is not None)
    record = TrainerMetrics.from_steps(index, report.losses, report.step_times,
                                       report.first_step, report.redone, report.resends)
    if out is not None:
        write_record(out / "nodes" / f"{node_file_stem('trainer', index)}.json", record)
        if index == 0:
            params: dict[str, Any] = {p: np.asarray(trainer.scope.get(p)) for p in model.params}
            with atomic_open(out / "params.npz", binary=True) as f:
                np.savez(f, **params)
    return record


JOB_SUFFIX = ".job.json"
"""A node on its own describes its job in ``OUT/nodes/<role>-<index>.job.json``."""


def write_node_job(out: Path, role: Role, job: Job) -> None:
    """What `runtime collect` needs to merge this node's record with its peers', written by a
    node on its own as it starts: the scenario as this node resolved it (overrides and the
    cluster size of its role applied), the pserver endpoints, and the run's facts (its host,
    start, command line: `RunFacts`)."""
    # what was stated only: a default written out would read back as stated, and some fields
    # may be stated only for some choices of others (a data file format's options)
    document = {"node": role.name,
                "scenario": job.scenario.model_dump(mode="json", exclude_unset=True),
                "endpoints": list(job.endpoints),
                "run": dataclasses.asdict(RunFacts.of(job.scenario))}
    write_atomic(out / "nodes" / f"{node_file_stem(role.role, role.index)}{JOB_SUFFIX}",
                 json.dumps(document, indent=1) + "\n")


THREADS_VAR = "OMP_NUM_THREADS"
"""How many threads a node's kernels may use: `runtime up` sets it to the node's share of the
host's cores (unless its own environment set it); numpy's BLAS reads it at start."""


def cap_kernel_threads(backend: str, env: Mapping[str, str]) -> int | None:
    """Make `backend`'s kernels use the threads ``OMP_NUM_THREADS`` allows (torch does not read
    it for every pool, so it is told); None where it is unset (a node on its own keeps its
    library's default: every core)."""
    text = env.get(THREADS_VAR)
    if text is None:
        return None
    try:
        threads = int(text)
    except ValueError:
        raise ScenarioError(f"{THREADS_VAR}={text!r} is not a thread count") from None
    if threads < 1:
        raise ScenarioError(f"{THREADS_VAR}={text!r}: a node needs at least one thread")
    set_kernel_threads(backend, threads)
    return threads


def run_role(scenario: Scenario, role: Role, out: Path | None,
             options: NodeOptions = NodeOptions()) -> int:
    """Run `role`'s node of `scenario` (from `load_for_role`) in the foreground; its exit
    status: 0 done, 1 failed, 130 interrupted, `EXIT_TRAINERS_GONE` a pserver on its own whose
    trainers are gone, `EXIT_LAUNCHER_GONE` started by a `runtime up` that is gone. Started by
    `runtime up` (`runtime.services.lifeline`), the node dies with it, and writes its output
    through a `DetachedOutput`: a launcher stopped (Ctrl-Z) or slow to read its pipe never
    blocks the node's loop; all of it is out when this returns."""
    launcher = launcher_pid(os.environ)
    if launcher is None:
        return _run_role(scenario, role, out, options, launcher)
    detached = DetachedOutput(sys.stdout, notice=partial(shown_dropped, who=role.name))
    streams = sys.stdout, sys.stderr
    # one queue for both: the launcher reads them from one pipe, in the order they are written
    sys.stdout = sys.stderr = cast(TextIO, detached)
    try:
        return _run_role(scenario, role, out, options, launcher)
    finally:
        detached.close()
        sys.stdout, sys.stderr = streams


def _run_role(scenario: Scenario, role: Role, out: Path | None, options: NodeOptions,
              launcher: int | None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if launcher is not None and not die_with_launcher(launcher, lifeline_signal(os.environ)):
        print(f"{role.name} failed: runtime up (pid {launcher}) that started it is gone",
              file=sys.stderr, flush=True)
        return EXIT_LAUNCHER_GONE
    role_mode = os.environ.get(ALONE_VAR) == "1"  # supervised by `runtime up --role`
    options = replace(options, alone=launcher is None or role_mode,
                      stoppable=launcher is not None and not role_mode)
    try:
        return _serve_role(scenario, role, out, options, launcher)
    finally:
        if options.ipc is not None and launcher is not None and launcher_gone(launcher):
            release_socket_dir(options.ipc)  # its launcher died and cannot remove it


def _serve_role(scenario: Scenario, role: Role, out: Path | None, options: NodeOptions,
                launcher: int | None) -> int:
    try:
        cap_kernel_threads(scenario.backend.kernels, os.environ)
        job = Job.from_scenario(scenario, list(role.endpoints or ()) or None)
        if options.alone and out is not None:
            write_node_job(out, role, job)
        for i, fault in enumerate(scenario.faults if launcher is None else ()):
            log.warning("%s: faults[%d] (%s) not injected: a node run on its own by "
                        "`python -m runtime.services.node` has nothing to act its faults out; "
                        "`runtime up --role` does (docs/faults.md)", role.name, i,
                        type(fault).__name__.lower())
        if options.keys is None and options.ipc is None:
            print(insecure_warning(role.name, job.endpoints), file=sys.stderr, flush=True)
        if role.role == "pserver":
            run_async(serve_pserver(job, role.index, out, options))
        else:
            run_async(run_trainer(job, role.index, out, options))
    except KeyboardInterrupt:
        print(f"{role.name} interrupted", file=sys.stderr, flush=True)
        return 130
    except Stopped as exc:
        print(f"{role.name} {exc}, its record written", file=sys.stderr, flush=True)
        return 128 + signal.SIGTERM
    except TrainersGone as exc:
        print(f"{role.name} failed: {exc}", file=sys.stderr, flush=True)
        return EXIT_TRAINERS_GONE
    except Exception as exc:
        log.error("%s failed", role.name, exc_info=traceback_wanted(scenario, exc, (NodeError,)))
        print(f"{role.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


# -- command line ------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `runtime up` and of ``python -m runtime.services.node``."""
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                        help="override a scenario field, e.g. --set train.steps=50 (repeatable)")
    parser.add_argument("--out", type=Path,
                        help="output directory (default: the scenario's outputs.dir, else "
                             "out/NAME; with --role none: the node then writes no record)")
    parser.add_argument("--role", choices=ROLES, help="run only this role, in the foreground")
    parser.add_argument("--index", type=int, help="which pserver or trainer (with --role)")
    parser.add_argument("--endpoints", metavar="HOST:PORT,...",
                        help="the pserver endpoints (with --role; default: the scenario's)")
    parser.add_argument("--bind", metavar="HOST:PORT",
                        help="a pserver serves here instead of at its endpoint (runtime up puts "
                             "a fault proxy at the endpoint)")
    parser.add_argument("--recover", action="store_true",
                        help="a pserver that replaces a crashed one: start from its last "
                             "checkpoint and have the trainers redo the steps it lost")
    parser.add_argument("--incarnation", type=int, metavar="N",
                        help="a trainer restarted for the N-th time (its message ids then "
                             "differ from its earlier lives')")
    parser.add_argument("--keys", type=Path, metavar="DIR",
                        help=f"the job's CurveZMQ keys (written by `runtime keys DIR`; default: "
                             f"${KEYS_VAR}); runtime up without --role makes a job's own in "
                             "OUT/keys")
    parser.add_argument("--insecure", action="store_true",
                        help="no CurveZMQ: nodes neither authenticate nor encrypt (warns; see "
                             "SECURITY.md)")
    parser.add_argument("--ipc", type=Path, metavar="DIR",
                        help="talk over ZeroMQ ipc sockets in DIR, a directory of mode 0700 "
                             "of this user, instead of TCP, without CurveZMQ: only this user's "
                             "processes on this host can connect (runtime up on one host does "
                             "this itself; see SECURITY.md)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.services.node",
        description="Run one pserver or trainer of a scenario in the foreground; the role comes "
                    "from --role/--index or from TRAINING_ROLE and Paddle's PADDLE_* variables.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        role = resolve_role(args.role, args.index, args.endpoints, os.environ)
        if role is None:
            raise RoleError("no role: give --role and --index, or set TRAINING_ROLE")
        options = node_options(role, args.bind, args.recover, args.incarnation)
        ipc, keys = node_security(role, args.ipc, args.keys, args.insecure, os.environ)
        scenario = load_for_role(args.scenario, args.set, role)
    except (RoleError, ScenarioError) as err:
        parser.error(str(err))
    return run_role(scenario, role, args.out, replace(options, keys=keys, ipc=ipc))


def exit_process(code: int) -> NoReturn:
    """Exit with `code`. While a torch.distributed process group is still open (a collective
    job that failed, or stopped before its closing barrier), by `os._exit` after flushing the
    logs and streams: gloo's threads would otherwise meet the interpreter's teardown and abort
    the process (SIGABRT), replacing its status; its peers see its sockets close when it ends,
    after it has said why."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_process(main())
