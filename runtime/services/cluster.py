"""Run a whole job in one event loop: every pserver and trainer as a task.

This is how the tests check a distributed job against local training without processes, and how
the simulator runs a job (its loop and transport plugged in). Nodes talk only through the
transports that `transport_for(node_name)` makes, exactly as separate processes would.
`train_locally` is the reference: the same model, one process, the same global batches.
In timing mode (`Job.timing`: phantom kernels) the same job runs on phantom batches and reports
NaN losses and no parameters.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from transpiler.distribute.checkpoint import CheckpointConfig, append_checkpoint_notify

from runtime.config.nodes import NODE, is_trainer, parse_node, pserver_name, trainer_name
from runtime.config.scenario import COLLECTIVE_BACKENDS
from runtime.execution.compute import ComputeModel, Tracer
from runtime.execution.executor import Executor
from runtime.execution.scope import Scope
from runtime.network.rpc import RetryPolicy, RpcClient
from runtime.network.transport import Transport
from runtime.services.collective import Collective
from runtime.services.inbound import InboundLimits, inbound_limits
from runtime.services.checkpoint import recover
from runtime.services.job import Job, RunPrograms
from runtime.services.pserver import PserverService, ServeConfig, ServerStats
from runtime.services.trainer import Trainer, TrainerReport

TransportFactory = Callable[[str], Transport]
StepObserver = Callable[[int, int, float, float], None]
"""`on_step(trainer_id, step, loss, seconds)`, called as each trainer finishes a step."""


log = logging.getLogger(__name__)


@dataclass
class JobResult:
    trainers: list[TrainerReport]
    pservers: list[ServerStats]
    params: dict[str, np.ndarray]  # trainer 0's parameters after its last step (timing: none)


def serve_config(job: Job, checkpoint_dir: Path | None = None,
                 inbound: InboundLimits | None = None) -> ServeConfig:
    """A pserver's timing: the heartbeat timeout, a drain long enough to answer a trainer's
    first two retries of a request whose reply was lost (e.g. the last COMPLETE), and the
    periodic checkpoints (`train.checkpoint_every`, into `checkpoint_dir`; none of its own
    when trainer 0 notifies them, ``train.checkpoint_by: trainer``); with `inbound` (its
    program's, `runtime.services.inbound`), it decodes no message larger than its trainers
    legitimately send."""
    train = job.scenario.train
    every = (train.checkpoint_every
             if checkpoint_dir is not None and train.checkpoint_by == "pserver" else None)
    largest = ServeConfig.max_message_size if inbound is None else inbound.largest_message
    return ServeConfig(heartbeat_timeout=train.heartbeat_timeout, drain=3 * train.retry_after,
                       max_message_size=largest,
                       startup_grace=train.startup_timeout, checkpoint_every=every,
                       checkpoint_dir=checkpoint_dir, on_nonfinite=train.on_nonfinite,
                       trainer_names=tuple(trainer_name(i) for i in range(job.trainers)))


def make_pserver(job: Job, index: int, transport: Transport, compute: ComputeModel | None = None,
                 tracer: Tracer | None = None, checkpoint_dir: Path | None = None,
                 recovering: bool = False) -> PserverService:
    """The pserver service of node `index`, ready to `serve(job.endpoints[index])`. With
    `recovering` it replaces one that crashed: it starts from its last checkpoint in
    `checkpoint_dir` if there is one (else from its startup state) and has the trainers redo
    the steps it lost. Either way its checkpoint directory is recovered first: a write killed
    midway leaves the last committed checkpoint in place and nothing else
    (`runtime.services.checkpoint.recover`)."""
    main, startup = job.pserver_programs(index)
    backend = job.scenario.backend
    name = pserver_name(index)
    saved = checkpoint_dir is not None and recover(checkpoint_dir / name)
    executor = Executor(backend.kernels, backend.device_for("pserver"), local_index=index)
    config = serve_config(job, checkpoint_dir, inbound_limits(job, main))
    return PserverService(main, startup, transport, executor, config, compute, tracer,
                          load_from=checkpoint_dir if recovering and saved else None,
                          recovering=recovering)


def trainer_programs(job: Job, index: int, checkpoint_dir: Path | None = None,
                     shared: bool = False) -> RunPrograms:
    """Trainer `index`'s programs; with ``train.checkpoint_by: trainer``, trainer 0's send a
    `checkpoint_notify` every ``train.checkpoint_every`` steps, naming `checkpoint_dir` (not
    in timing mode, whose pservers hold no values to save). With `shared` (every trainer in
    this process) they may be another trainer's, with renames (`Job.programs_to_run`)."""
    run = job.programs_to_run(index) if shared else RunPrograms(*job.trainer_programs(index), {})
    train = job.scenario.train
    if (train.checkpoint_by != "trainer" or train.checkpoint_every is None
            or checkpoint_dir is None or job.collective or job.timing or index != 0):
        return run
    main, startup = run.main.clone(), run.startup.clone()
    append_checkpoint_notify(main, startup, CheckpointConfig(str(checkpoint_dir),
                                                             train.checkpoint_every))
    return RunPrograms(main, startup, run.renames)


def make_trainer(job: Job, index: int, transport: Transport, compute: ComputeModel | None = None,
                 tracer: Tracer | None = None, incarnation: int = 0,
                 checkpoint_dir: Path | None = None, collective: str = "ring",
                 shared: bool = False) -> Trainer:
    """Trainer `index` (in its `incarnation`-th restart), ready to `run(batches_for(job,
    index), ...)`. `collective`: what carries its collective ops in the nccl2 and collective
    modes, the ring over `transport` or, for a trainer in a process of its own,
    ``job.scenario.collective.backend`` (torch.distributed with ``torch``). `shared`: the job's
    trainers all run in this process and may share programs (`Job.programs_to_run`)."""
    main, startup, renames = trainer_programs(job, index, checkpoint_dir, shared)
    train, backend = job.scenario.train, job.scenario.backend
    client = RpcClient(transport, RetryPolicy(deadline=train.request_timeout,
                                              first_retry=train.retry_after),
                       incarnation=incarnation,
                       labels={ep: pserver_name(j) for j, ep in enumerate(job.endpoints)})
    executor = Executor(backend.kernels, backend.device_for("trainer"), local_index=index)
    return Trainer(index, main, startup, client, job.endpoints, executor,
                   heartbeat_interval=train.heartbeat_timeout / 3, compute=compute, tracer=tracer,
                   protocol=train.protocol, collective=collective_ops(job, index, collective),
                   renames=renames)


def collective_ops(job: Job, index: int, backend: str) -> Collective | None:
    """Trainer `index`'s collective ops over torch.distributed where `backend` is ``torch``
    and the job's mode has them (nccl2, collective); None: the ring (`Trainer`'s default).

    DESIGN: torch.distributed holds one process group per process, so only a trainer in a
    process of its own (`runtime up`, role mode) can use it; the in-process cluster and the
    simulator run the ring in its place (the same sums: equal within float rounding)."""
    if backend not in COLLECTIVE_BACKENDS:
        raise ValueError(f"collective backend {backend!r}: use one of {COLLECTIVE_BACKENDS}")
    if backend == "ring" or not job.collective:
        return None
    from runtime.services.collective_torch import TorchCollectiveOps  # torch: an optional extra

    scenario = job.scenario
    return TorchCollectiveOps(trainer_name(index), scenario.train.request_timeout,
                              scenario.backend.device_for("trainer"), index,
                              scenario.collective.torch_backend)


def batches_for(job: Job, index: int) -> Callable[[int], dict[str, Any]]:
    """Trainer `index`'s batch of each step: its shard of the step's global batch (in timing
    mode, the same phantom batch every step, see `Dataset.phantom_batch`)."""
    batch, feeds = job.scenario.data.batch_size, job.model.feeds
    if job.timing:
        phantoms = job.dataset.phantom_batch(batch, feeds)
        return lambda step: phantoms
    shard = job.dataset.shard(index, job.trainers)
    return lambda step: shard.batch(step, batch, feeds)


async def run_job(job: Job, transport_for: TransportFactory, compute: ComputeModel | None = None,
                  tracer: Tracer | None = None, on_step: StepObserver | None = None,
                  checkpoint_dir: Path | None = None) -> JobResult:
    """Serve every pserver and train every trainer as tasks of the running loop; `on_step` hears
    of every trainer's every step."""
    return await LocalCluster(job, transport_for, compute, tracer, on_step, checkpoint_dir).run()


class LocalCluster:
    """Every node of a job as tasks of the running loop, which `crash` and `restart` can kill
    and bring back (the simulator's fault injection). A crashed node's tasks are cancelled and
    its transport closed, as if its process had died; a restarted one is built anew under the
    same name, a pserver from its last checkpoint, a trainer with a new incarnation. With
    `resume`, the whole job starts from the pservers' checkpoints in `checkpoint_dir` (the
    trainers join at the step they were taken at). Its trainers share programs where they can
    (`Job.programs_to_run`)."""

    def __init__(self, job: Job, transport_for: TransportFactory,
                 compute: ComputeModel | None = None, tracer: Tracer | None = None,
                 on_step: StepObserver | None = None, checkpoint_dir: Path | None = None,
                 resume: bool = False) -> None:
        if resume and checkpoint_dir is None:
            raise ValueError("resuming a job needs the checkpoint_dir its pservers saved to")
        self.resume = resume
        self.job = job
        self.transport_for = transport_for
        self.compute, self.tracer, self.on_step = compute, tracer, on_step
        self.checkpoint_dir = checkpoint_dir
        self.servers: dict[int, PserverService] = {}
        self.trainers: dict[int, Trainer] = {}
        self.reports: dict[int, TrainerReport] = {}
        self.stats: dict[int, ServerStats] = {}
        self.incarnations: dict[str, int] = {}
        self.down: set[str] = set()
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._changed = asyncio.Event()
        self._restarting: set[str] = set()
        self._earlier: dict[int, TrainerReport] = {}  # what crashed trainers did before

    # -- nodes ------------------------------------------------------------------------------------
    def _start_pserver(self, index: int, recovering: bool = False) -> None:
        name = pserver_name(index)
        server = make_pserver(self.job, index, self.transport_for(name), self.compute,
                              self.tracer, self.checkpoint_dir, recovering)
        self.servers[index] = server
        self._launch(name, server.serve(self.job.endpoints[index]))

    def _start_trainer(self, index: int) -> None:
        name = trainer_name(index)
        trainer = make_trainer(self.job, index, self.transport_for(name), self.compute,
                               self.tracer, self.incarnations.get(name, 0), self.checkpoint_dir,
                               shared=True)
        self.trainers[index] = trainer
        steps, loss = self.job.scenario.train.steps, self.job.model.loss.name
        self._launch(name, trainer.run(batches_for(self.job, index), steps, loss,
                                       _observer(self.on_step, index)))

    def _launch(self, name: str, work: Any) -> None:
        context = contextvars.copy_context()
        context.run(NODE.set, name)  # what the node runs, and schedules, is known as its own
        task = asyncio.get_running_loop().create_task(work, name=f"{name} main", context=context)
        task.add_done_callback(lambda _: self._changed.set())
        self._tasks[name] = task

    def crash(self, node: str, returning: bool = False) -> bool:
        """Kill `node` now: its tasks stop, its transport closes, its state is lost; with
        `returning`, the job waits for its `restart`. False if it was not running."""
        task = self._tasks.get(node)
        if task is None or task.done():
            return False
        del self._tasks[node]
        self.down.add(node)
        task.cancel()
        if returning:
            self._restarting.add(node)
        role, index = parse_node(node)
        owner: Any = self.servers[index] if role == "pserver" else self.trainers[index]
        asyncio.get_running_loop().create_task(_close(owner, role))
        return True

    def restart(self, node: str) -> None:
        """Bring a crashed `node` back."""
        if node not in self.down:
            return
        self.down.discard(node)
        self._restarting.discard(node)
        self.incarnations[node] = self.incarnations.get(node, 0) + 1
        role, index = parse_node(node)
        if role == "pserver":
            self._start_pserver(index, recovering=True)
        else:
            self._earlier[index] = _joined(self._earlier.get(index), self.trainers[index].report)
            self._start_trainer(index)
        self._changed.set()

    # -- the run ----------------------------------------------------------------------------------
    async def run(self) -> JobResult:
        for j in range(len(self.job.endpoints)):
            self._start_pserver(j, recovering=self.resume)
        for i in range(self.job.trainers):
            self._start_trainer(i)
        try:
            await self._until_done()
        finally:
            await self._stop_all()
        trainer0 = self.trainers.get(0)
        params = {} if self.job.timing or trainer0 is None else \
            {p: np.array(trainer0.scope.get(p)) for p in self.job.model.params}
        reports = [_joined(self._earlier.get(i), self.reports.get(i) or self._partial(i))
                   for i in range(self.job.trainers)]
        stats = [self.stats.get(j, ServerStats()) for j in range(len(self.job.endpoints))]
        return JobResult(reports, stats, params)

    async def _until_done(self) -> None:
        """Wait until every node's work has ended and no crashed node is due back; the first
        failure ends the job with it. A trainer due back once every pserver has finished has
        no job left to join: the run ends without it (`restart_is_moot`), as it does without
        one still training then (`_left_behind`)."""
        while True:
            self._changed.clear()
            self._collect()
            if all(task.done() for task in self._tasks.values()) and \
                    restart_is_moot(self._restarting):
                return
            if left := self._left_behind():
                for name in left:
                    log.warning("%s: every pserver finished the job without it (they dropped "
                                "it); the run ends without it", name)
                return
            await self._changed.wait()

    def _left_behind(self) -> list[str]:
        """The trainers still training once every pserver has finished the job (none crashed
        or due back). The pservers finish when every trainer has completed or been dropped, so
        these were dropped (paused, cut off) and came back too late: nobody is left to train
        with, and they would wait for replies until their deadline. `runtime up` stops them
        the same way."""
        pservers = [self._tasks.get(pserver_name(j)) for j in range(len(self.job.endpoints))]
        if not pservers or not all(task is not None and task.done() for task in pservers):
            return []
        running = {name for name, task in self._tasks.items() if not task.done()}
        return [trainer_name(i) for i, trainer in self.trainers.items()
                if trainer.training and trainer_name(i) in running]

    def _collect(self) -> None:
        for name, task in list(self._tasks.items()):
            if not task.done() or task.cancelled():
                continue
            error = task.exception()
            if error is not None:
                raise error
            role, index = parse_node(name)
            if role == "trainer":
                self.reports[index] = task.result()
            else:
                self.stats[index] = task.result()

    def _partial(self, index: int) -> TrainerReport:
        trainer = self.trainers.get(index)
        return trainer.report if trainer is not None else TrainerReport(index)

    async def _stop_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for trainer in self.trainers.values():
            await trainer.client.close()
        for server in self.servers.values():
            await server.transport.close()


def restart_is_moot(returning: Iterable[str]) -> bool:
    """Whether the nodes due back after a crash (`returning`) need not be waited for once every
    running node has ended: none is due, or only trainers (every pserver finished the job, so a
    trainer coming back would find no one to train with)."""
    return all(is_trainer(node) for node in returning)


def _joined(earlier: TrainerReport | None, later: TrainerReport) -> TrainerReport:
    """A trainer's whole record over its lives: the steps of each, in order; `first_step` is
    where its last life began."""
    if earlier is None:
        return later
    return TrainerReport(later.trainer_id, earlier.losses + later.losses,
                         earlier.step_times + later.step_times, later.first_step,
                         earlier.redone + later.redone)


async def _close(owner: Any, role: str) -> None:
    if role == "trainer":
        await owner.rpc.abandon()
        await owner.client.close()
    else:
        await owner.transport.close()


def _observer(on_step: StepObserver | None,
              trainer_id: int) -> Callable[[int, float, float], None] | None:
    if on_step is None:
        return None
    return lambda step, loss, seconds: on_step(trainer_id, step, loss, seconds)


def train_locally(job: Job, backend: str = "numpy") -> tuple[list[float], dict[str, Any]]:
    """Single-process training on the job's global batches: losses and final parameters."""
    model, exe, scope = job.model, Executor(backend), Scope()
    exe.run(model.startup, scope=scope)
    batch = job.scenario.data.batch_size * job.trainers
    losses = []
    for step in range(job.scenario.train.steps):
        (loss,) = exe.run(model.main, feed=job.dataset.batch(step, batch, model.feeds),
                          fetch_list=[model.loss], scope=scope)
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    return losses, {p: np.array(scope.get(p)) for p in model.params}
