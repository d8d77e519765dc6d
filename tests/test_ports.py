"""`wait_for_ports`: a trainer with ``wait_port`` waits until its pservers listen (loopback);
a trainer node (`run_trainer`) waits before its first step, and names the endpoints nobody
serves after ``train.startup_timeout``."""

from __future__ import annotations

import asyncio
import socket

import pytest

from runtime.config.scenario import parse_scenario
from runtime.network.ports import PortsNotReady, wait_for_ports
from runtime.services.job import Job
from runtime.services.node import run_trainer, serve_pserver

pytestmark = pytest.mark.timeout(30)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_listening_endpoints_are_ready_at_once() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await asyncio.wait_for(wait_for_ports("trainer:0", [f"127.0.0.1:{port}",
                                                            f"tcp://127.0.0.1:{port}"], 5.0), 5.0)
    finally:
        server.close()
        await server.wait_closed()


async def test_the_wait_ends_when_the_server_starts_listening() -> None:
    port = closed_port()
    waiting = asyncio.ensure_future(wait_for_ports("trainer:0", [f"127.0.0.1:{port}"], 20.0))
    await asyncio.sleep(0)  # the first probe is refused
    assert not waiting.done()
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
    try:
        await asyncio.wait_for(waiting, 10.0)
    finally:
        server.close()
        await server.wait_closed()


async def test_an_endpoint_nobody_serves_is_named_after_the_timeout() -> None:
    port = closed_port()
    with pytest.raises(PortsNotReady, match=rf"trainer:1: no pserver listening at "
                                            rf"127\.0\.0\.1:{port} after 0\.2s \(wait_port\)"):
        await wait_for_ports("trainer:1", [f"127.0.0.1:{port}"], 0.2)


async def test_endpoints_that_are_not_tcp_are_not_probed() -> None:
    await asyncio.wait_for(wait_for_ports("trainer:0", ["ipc:///tmp/nowhere"], 0.1), 5.0)


# -- a trainer node (`runtime.services.node.run_trainer`) ------------------------------------------

def job_at(endpoint: str, startup_timeout: str = "60s", steps: int = 3) -> Job:
    """A 1 x 1 sync job whose pserver is at `endpoint`; `startup_timeout` bounds the trainer's
    wait for its port, `train.deadline` (10 s) the whole run."""
    return Job.from_scenario(parse_scenario(f"""
name: ports
seed: 3
model: {{name: mlp, sizes: [16, 8, 2]}}
data: {{batch_size: 4}}
cluster: {{pservers: 1, trainers: 1, endpoints: {{pservers: ['{endpoint}']}}}}
transpiler: {{mode: sync}}
train: {{steps: {steps}, deadline: 10s, startup_timeout: {startup_timeout}, retry_after: 100ms}}
"""))


async def test_a_trainer_node_with_no_pserver_listening_fails_naming_the_endpoint() -> None:
    """The trainer program asks to wait (`get_trainer_program()`'s default ``wait_port``): with
    nothing at the pserver's port the node gives up after ``train.startup_timeout``, naming the
    endpoint, well before ``train.deadline`` (which a trainer that did not wait would reach,
    its requests unanswered)."""
    endpoint = f"127.0.0.1:{closed_port()}"
    job = job_at(endpoint, startup_timeout="300ms")
    assert job.trainer_programs(0)[0].attrs["_wait_port"] is True
    with pytest.raises(PortsNotReady, match=rf"trainer:0: no pserver listening at "
                                            rf"{endpoint} after 0\.3s \(wait_port\)"):
        await run_trainer(job, 0, None)


async def test_a_trainer_node_started_before_its_pserver_waits_and_trains() -> None:
    job = job_at(f"127.0.0.1:{closed_port()}", steps=3)
    trainer = asyncio.ensure_future(run_trainer(job, 0, None))
    stats = await serve_pserver(job, 0, None)
    record = await asyncio.wait_for(trainer, 10.0)
    assert len(record.losses) == 3 and stats.steps == 3 and stats.errors == 0
