"""Run a whole job in one event loop: every pserver and trainer as a task.

This is how the tests check a distributed job against local training without processes, and how
the simulator runs a job (its loop and transport plugged in). Nodes talk only through the
transports that `transport_for(node_name)` makes, exactly as separate processes would.
`train_locally` is the reference: the same model, one process, the same global batches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .executor import Executor
from .job import Job
from .pserver import PserverService, ServeConfig, ServerStats
from .rpc import RetryPolicy, RpcClient
from .scope import Scope
from .trainer import Trainer, TrainerReport
from .transport import Transport

TransportFactory = Callable[[str], Transport]


@dataclass
class JobResult:
    trainers: list[TrainerReport]
    pservers: list[ServerStats]
    params: dict[str, np.ndarray]  # trainer 0's parameters after its last step


def pserver_name(index: int) -> str:
    return f"pserver:{index}"


def trainer_name(index: int) -> str:
    return f"trainer:{index}"


async def run_job(job: Job, transport_for: TransportFactory, backend: str = "numpy",
                  device: str = "cpu") -> JobResult:
    scenario = job.scenario
    serve = ServeConfig(heartbeat_timeout=scenario.train.heartbeat_timeout)
    servers = []
    for j, endpoint in enumerate(job.endpoints):
        main, startup = job.pserver_programs(j)
        service = PserverService(main, startup, transport_for(pserver_name(j)),
                                 Executor(backend, device), serve)
        servers.append((service, endpoint))
    loop = asyncio.get_running_loop()
    server_tasks = [loop.create_task(s.serve(ep), name=f"{s.name} serve") for s, ep in servers]
    trainers = [_trainer(job, i, transport_for, backend, device) for i in range(job.trainers)]
    batch = scenario.data.batch_size
    shards = [job.dataset.shard(i, job.trainers) for i in range(job.trainers)]
    feeds = job.model.feeds
    try:
        reports = await asyncio.gather(*(
            t.run(lambda step, s=shard: s.batch(step, batch, feeds), scenario.train.steps,
                  job.model.loss.name)
            for t, shard in zip(trainers, shards)))
        stats = await asyncio.gather(*server_tasks)
    finally:
        for task in server_tasks:
            task.cancel()
        await asyncio.gather(*server_tasks, return_exceptions=True)
        for t in trainers:
            await t.client.close()
        for service, _ in servers:
            await service.transport.close()
    params = {p: np.array(trainers[0].scope.get(p)) for p in job.model.params}
    return JobResult(list(reports), list(stats), params)


def _trainer(job: Job, index: int, transport_for: TransportFactory, backend: str,
             device: str) -> Trainer:
    main, startup = job.trainer_programs(index)
    policy = RetryPolicy(deadline=job.scenario.train.deadline)
    client = RpcClient(transport_for(trainer_name(index)), policy)
    return Trainer(index, main, startup, client, job.endpoints, Executor(backend, device),
                   heartbeat_interval=job.scenario.train.heartbeat_timeout / 3)


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
