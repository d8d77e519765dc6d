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
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .compute import ComputeModel, Tracer
from .executor import Executor
from .job import Job
from .pserver import PserverService, ServeConfig, ServerStats
from .rpc import RetryPolicy, RpcClient
from .scope import Scope
from .trainer import Trainer, TrainerReport
from .transport import Transport

TransportFactory = Callable[[str], Transport]
StepObserver = Callable[[int, int, float, float], None]
"""`on_step(trainer_id, step, loss, seconds)`, called as each trainer finishes a step."""


@dataclass
class JobResult:
    trainers: list[TrainerReport]
    pservers: list[ServerStats]
    params: dict[str, np.ndarray]  # trainer 0's parameters after its last step (timing: none)


def pserver_name(index: int) -> str:
    return f"pserver:{index}"


def trainer_name(index: int) -> str:
    return f"trainer:{index}"


def serve_config(job: Job) -> ServeConfig:
    """A pserver's timing: the heartbeat timeout, and a drain long enough to answer a trainer's
    first two retries of a request whose reply was lost (e.g. the last COMPLETE)."""
    train = job.scenario.train
    return ServeConfig(heartbeat_timeout=train.heartbeat_timeout, drain=3 * train.retry_after)


def make_pserver(job: Job, index: int, transport: Transport, compute: ComputeModel | None = None,
                 tracer: Tracer | None = None) -> PserverService:
    """The pserver service of node `index`, ready to `serve(job.endpoints[index])`."""
    main, startup = job.pserver_programs(index)
    backend = job.scenario.backend
    return PserverService(main, startup, transport, Executor(backend.kernels, backend.device),
                          serve_config(job),
                          compute, tracer)


def make_trainer(job: Job, index: int, transport: Transport, compute: ComputeModel | None = None,
                 tracer: Tracer | None = None) -> Trainer:
    """Trainer `index`, ready to `run(batches_for(job, index), ...)`."""
    main, startup = job.trainer_programs(index)
    train, backend = job.scenario.train, job.scenario.backend
    client = RpcClient(transport, RetryPolicy(deadline=train.deadline,
                                              first_retry=train.retry_after))
    return Trainer(index, main, startup, client, job.endpoints,
                   Executor(backend.kernels, backend.device),
                   heartbeat_interval=train.heartbeat_timeout / 3, compute=compute, tracer=tracer)


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
                  tracer: Tracer | None = None, on_step: StepObserver | None = None) -> JobResult:
    """Serve every pserver and train every trainer as tasks of the running loop; `on_step` hears
    of every trainer's every step."""
    servers = [make_pserver(job, j, transport_for(pserver_name(j)), compute, tracer)
               for j in range(len(job.endpoints))]
    loop = asyncio.get_running_loop()
    server_tasks = [loop.create_task(s.serve(ep), name=f"{s.name} serve")
                    for s, ep in zip(servers, job.endpoints)]
    trainers = [make_trainer(job, i, transport_for(trainer_name(i)), compute, tracer)
                for i in range(job.trainers)]
    steps, loss = job.scenario.train.steps, job.model.loss.name
    try:
        reports = await asyncio.gather(*(t.run(batches_for(job, t.trainer_id), steps, loss,
                                               _observer(on_step, t.trainer_id))
                                         for t in trainers))
        stats = await asyncio.gather(*server_tasks)
    finally:
        for task in server_tasks:
            task.cancel()
        await asyncio.gather(*server_tasks, return_exceptions=True)
        for t in trainers:
            await t.client.close()
        for server in servers:
            await server.transport.close()
    params = {} if job.timing else {p: np.array(trainers[0].scope.get(p)) for p in job.model.params}
    return JobResult(list(reports), list(stats), params)


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
