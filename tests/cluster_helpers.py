"""Shared helpers for tests that run whole jobs over loopback ZeroMQ."""

from __future__ import annotations

import asyncio
import socket

from runtime.cluster import JobResult, run_job
from runtime.job import Job
from runtime.scenario import parse_scenario
from runtime.zmq_transport import ZmqTransport


def free_endpoints(count: int) -> list[str]:
    """Loopback endpoints with ports the OS just reported free."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    finally:
        for s in sockets:
            s.close()


def make_job(model: str, trainers: int, pservers: int, steps: int = 20, batch: int = 16,
             mode: str = "sync", data: str | None = None, extra: str = "",
             transpiler: str = "") -> Job:
    eps = free_endpoints(pservers)
    data_line = f"data: {{name: {data}, batch_size: {batch}}}" if data else f"data: {{batch_size: {batch}}}"
    text = f"""
name: test
seed: 3
model: {model}
{data_line}
cluster: {{pservers: {pservers}, trainers: {trainers}, endpoints: {{pservers: {eps}}}}}
transpiler: {{mode: {mode}{", " + transpiler if transpiler else ""}}}
train: {{steps: {steps}, deadline: 60s, heartbeat_timeout: 10s}}
{extra}
"""
    return Job.from_scenario(parse_scenario(text))


def run(job: Job) -> JobResult:
    return asyncio.run(run_job(job, ZmqTransport))
