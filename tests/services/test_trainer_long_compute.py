"""A trainer whose compute between two RPC ops outlasts the heartbeat timeout, in many short
kernel ops, is not dropped: `run_block` lets the event loop turn (and the heartbeat go out)
once a run of kernels has held it for `HOLD_LIMIT`. Without that the loop is held throughout
and the pserver drops the live trainer, as the second test shows with the limit lifted.

The pserver runs on an event loop of its own in a thread, as a process of its own would: on
the trainer's loop it would be held too, and its watchdog counts a wait it was not running
for as nobody's silence. The slow kernels sleep (the GIL is free meanwhile), standing for
slow compute: the pserver's thread keeps its time."""

from __future__ import annotations

import asyncio
import math
import shutil
import threading
import time
from typing import Any

import pytest

from runtime.config.nodes import pserver_name, trainer_name
from runtime.execution.executor import timing_kernels
from runtime.execution.scope import Scope
from runtime.network.local_sockets import make_socket_dir
from runtime.network.zmq_transport import ZmqTransport
from runtime.services import trainer as trainer_module
from runtime.services.cluster import batches_for, make_pserver, make_trainer
from runtime.services.job import Job
from runtime.services.pserver import ServerStats
from runtime.services.trainer import TrainerReport
from transpiler.ir import Op, OpRole, OP_ROLE_ATTR

from cluster_helpers import FAST_DRAIN, make_job

pytestmark = pytest.mark.timeout(60)

HEARTBEAT_TIMEOUT = 1.0
HELD = 3 * HEARTBEAT_TIMEOUT
"""Step 0's forward pass: this long in all, no RPC op within it."""
LAYERS = 24
"""Of the MLP: some 70 forward ops, each ~HELD / 70 (40 ms), far below the timeout."""


class SlowForward:
    """A kernel timer (`Executor`'s hook around every kernel) that makes each forward op of
    `main`'s first step sleep, `HELD` over them all."""

    def __init__(self, main_ops: list[Op]) -> None:
        forward = [op for op in main_ops if op.attrs.get(OP_ROLE_ATTR, 0) == OpRole.Forward]
        self.ops = {id(op) for op in forward}
        self.left = len(forward)
        self.each = HELD / len(forward)

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        if self.left > 0 and id(op) in self.ops:
            self.left -= 1
            time.sleep(self.each)


def run_slow_job(job: Job) -> tuple[TrainerReport, ServerStats]:
    """Pserver 0 in a thread, trainer 0 here, over local sockets of their own."""
    directory = make_socket_dir()
    served: dict[str, Any] = {}

    def serve() -> None:
        async def run() -> ServerStats:
            server = make_pserver(job, 0, ZmqTransport(pserver_name(0), ipc_dir=directory))
            try:
                return await server.serve(job.endpoints[0])
            finally:
                await server.transport.close()
        try:
            served["stats"] = asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            served["error"] = exc

    async def train() -> TrainerReport:
        slow = SlowForward(job.trainer_programs(0)[0].global_block().ops)
        with timing_kernels(slow):
            trainer = make_trainer(job, 0, ZmqTransport(trainer_name(0), ipc_dir=directory))
        try:
            steps, loss = job.scenario.train.steps, job.model.loss.name
            return await asyncio.wait_for(trainer.run(batches_for(job, 0), steps, loss), 30)
        finally:
            await trainer.client.close()

    server = threading.Thread(target=serve, name="pserver:0", daemon=True)
    server.start()
    try:
        report = asyncio.run(train())
        server.join(30)
        assert not server.is_alive(), "the pserver did not stop"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if "error" in served:
        raise served["error"]
    return report, served["stats"]


def slow_job() -> Job:
    sizes = [8] * LAYERS + [2]
    return make_job(f"{{name: mlp, sizes: {sizes}}}", trainers=1, pservers=1, steps=2,
                    batch=4, retry_after=FAST_DRAIN, heartbeat_timeout=f"{HEARTBEAT_TIMEOUT}s")


def test_a_trainer_computing_longer_than_the_heartbeat_timeout_is_not_dropped() -> None:
    job = slow_job()
    report, stats = run_slow_job(job)
    assert stats.dropped == []
    assert len(report.losses) == 2 and report.redone == 0
    assert max(report.step_times) > HELD  # the slow step did last that long


def test_without_turning_the_loop_the_pserver_drops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit lifted: step 0's forward pass holds the loop, no heartbeat leaves, and the
    pserver drops the live trainer, which joins again and finishes."""
    monkeypatch.setattr(trainer_module, "HOLD_LIMIT", math.inf)
    report, stats = run_slow_job(slow_job())
    assert stats.dropped == [0]
    assert len(report.losses) == 2
