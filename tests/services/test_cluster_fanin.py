"""Fan-in changes in sync mode, on the virtual clock: a trainer that starts late is dropped
after the start-up timeout (and the event logged), the others go on, and the late one joins
at the next step all pservers can admit; a trainer that finishes early leaves the fan-in. Over
loopback ZeroMQ: a pause of the whole job drops nobody."""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest

from runtime.config.nodes import pserver_name, trainer_name
from runtime.config.scenario import parse_scenario
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import batches_for, make_pserver, make_trainer, run_job
from runtime.services.job import Job
from sim.loop import run as run_virtual
from sim.network import Network

from cluster_helpers import FAST_DRAIN, make_job

SCENARIO = """
name: fanin
seed: 3
model: {name: mlp, sizes: [32, 16, 4], optimizer: {type: sgd, learning_rate: 0.1}}
data: {name: synthetic_classification, batch_size: 8}
cluster: {pservers: 2, trainers: 2}
train: {steps: 12, deadline: 600s, heartbeat_timeout: 2s, startup_timeout: 2s}
network: {default: {latency: 50ms, bandwidth: 1Gbps}}
"""


async def run_cluster(job: Job, delays: dict[int, float], steps: dict[int, int]) -> tuple:
    network = Network.from_spec(job.scenario.network, job.scenario.seed)
    servers = [make_pserver(job, j, network.transport(pserver_name(j)))
               for j in range(len(job.endpoints))]
    loop = asyncio.get_running_loop()
    serving = [loop.create_task(s.serve(ep)) for s, ep in zip(servers, job.endpoints)]
    trainers = [make_trainer(job, i, network.transport(trainer_name(i)))
                for i in range(job.trainers)]

    async def train(i: int) -> object:
        await asyncio.sleep(delays.get(i, 0.0))
        return await trainers[i].run(batches_for(job, i), steps.get(i, job.scenario.train.steps),
                                     job.model.loss.name)

    reports = await asyncio.gather(*(train(i) for i in range(job.trainers)))
    trained = loop.time()  # the pservers then drain a while: answer retries of lost replies
    stats = await asyncio.gather(*serving)
    for t in trainers:
        await t.client.close()
    return reports, stats, trained


@pytest.mark.timeout(60)
def test_late_trainer_is_dropped_then_joins(caplog: pytest.LogCaptureFixture) -> None:
    job = Job.from_scenario(parse_scenario(SCENARIO))
    with caplog.at_level(logging.INFO):
        reports, stats, _ = run_virtual(run_cluster(job, delays={1: 3.0}, steps={}))
    first, late = reports
    assert len(first.losses) == 12
    assert 0 < len(late.losses) < 12  # it took part in the steps left after it joined
    assert all(s.dropped == [1] for s in stats)
    assert all(s.steps == 12 and s.errors == 0 for s in stats)
    text = caplog.text
    assert "dropped trainer 1 from the fan-in at step 0: not heard from within 2s of the start" \
        in text
    assert f"trainer 1 joins at step {12 - len(late.losses)}" in text


@pytest.mark.timeout(60)
def test_trainer_with_fewer_steps_leaves_the_fan_in() -> None:
    job = Job.from_scenario(parse_scenario(SCENARIO))
    reports, stats, now = run_virtual(run_cluster(job, delays={}, steps={1: 5}))
    assert [len(r.losses) for r in reports] == [12, 5]
    assert all(s.steps == 12 and s.dropped == [] for s in stats)
    assert now < 12 * 0.5  # nobody waited for a heartbeat timeout
    assert np.isfinite(reports[0].losses[-1])


@pytest.mark.timeout(60)
def test_a_pause_of_the_whole_job_longer_than_the_heartbeat_timeout_drops_nobody() -> None:
    """Every node stops at once for three heartbeat timeouts (a suspended machine, an
    overloaded host): here the one process they share blocks at trainer 0's step 4. On waking,
    each pserver's watchdog runs before the heartbeats that waited are read; the pause was its
    own, not the trainers' silence, so nobody is dropped and both train every step."""
    job = make_job("{name: mlp, sizes: [8, 4, 2]}", trainers=2, pservers=2, steps=8,
                   retry_after=FAST_DRAIN, heartbeat_timeout="200ms")

    def pause(trainer: int, step: int, loss: float, seconds: float) -> None:
        if (trainer, step) == (0, 4):
            time.sleep(0.6)  # the fault itself: the process stops, nothing is awaited

    result = asyncio.run(run_job(job, ZmqTransport, on_step=pause))
    assert [len(t.losses) for t in result.trainers] == [8, 8]
    assert [s.dropped for s in result.pservers] == [[], []]
