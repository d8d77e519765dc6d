"""Shared helpers for tests that run whole jobs: over ZeroMQ on this host (local sockets), or on
the simulated network, and compare their parameters with local training's."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import numpy as np

from runtime.config.scenario import parse_scenario
from runtime.network.local_sockets import make_socket_dir
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import JobResult, run_job
from runtime.services.job import Job
from sim.loop import run as sim_run
from sim.network import Network


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


FAST_DRAIN = "100ms"
"""A `train.retry_after` for jobs on loopback. A pserver stops once every trainer has said BYE;
should a BYE be lost, it drains 3 x retry_after: 0.3 s with this instead of the default 3 s.
Timing does not change a job's numbers."""


def make_job(model: str, trainers: int, pservers: int, steps: int = 20, batch: int = 16,
             mode: str = "sync", data: str | None = None, extra: str = "",
             transpiler: str = "", retry_after: str | None = None,
             heartbeat_timeout: str = "10s", protocol: str | None = None) -> Job:
    """A job over loopback endpoints; `retry_after` (e.g. FAST_DRAIN) sets `train.retry_after`
    (default 1 s), `protocol` `train.protocol` (default the scenario's). Loopback loses nothing, and a request resent sooner than that is answered
    from the pserver's deduplication (or with a ``pending`` notice), so it changes no number."""
    eps = free_endpoints(pservers)
    retry = f", retry_after: {retry_after}" if retry_after else ""
    retry += f", protocol: {protocol}" if protocol else ""
    data_line = f"data: {{name: {data}, batch_size: {batch}}}" if data else f"data: {{batch_size: {batch}}}"
    text = f"""
name: test
seed: 3
model: {model}
{data_line}
cluster: {{pservers: {pservers}, trainers: {trainers}, endpoints: {{pservers: {eps}}}}}
transpiler: {{mode: {mode}{", " + transpiler if transpiler else ""}}}
train: {{steps: {steps}, deadline: 60s, heartbeat_timeout: {heartbeat_timeout}{retry}}}
{extra}
"""
    return Job.from_scenario(parse_scenario(text))


def run(job: Job) -> JobResult:
    """Run `job` over ZeroMQ, every node a task of one loop, its sockets in a directory of its
    own (mode 0700, `runtime.network.local_sockets`), not on loopback TCP ports.

    DESIGN: a TCP port that `free_endpoints` reports free may still be the target of a client
    of an earlier job (another test, the other xdist worker, a node process left retrying)
    that reconnects every 0.1 s under the same node names (``trainer:1``). Once this job's
    pserver binds the port, that client connects, and without keys a ROUTER hands a routing id
    to its newest connection (ROUTER_HANDOVER, which a restarted node needs): the stranger
    takes over ``trainer:1``'s routing id, the pserver no longer hears the real trainer 1, and
    after `train.heartbeat_timeout` of that silence drops it from the fan-in: the sync job no
    longer equals local training (or stalls). Nobody else can reach this job's own socket
    directory (`tests/services/test_cluster_sync.py` connects such a stranger)."""
    directory = make_socket_dir()
    try:
        return asyncio.run(run_job(job, lambda name: ZmqTransport(name, ipc_dir=directory)))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def simulate(job: Job) -> dict[str, np.ndarray]:
    """The parameters `job` ends with on the simulated network (fast links: 2**-12 s, 1 GiB/s)."""
    net = Network.from_spec({"default": {"latency": 2.0**-12, "bandwidth": "1GiB/s"}}, seed=0)
    return sim_run(run_job(job, net.transport)).params


def assert_params_equal(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray],
                        atol: float = 1e-6) -> None:
    """The same parameters, each within rtol 1e-5 and `atol` of `expected`'s. Float32 sums in
    another order (per-trainer means, then their mean) differ in the last bits; where Adam
    divides by the root of tiny second moments, that moves a few parameters near zero by a few
    1e-6 over 20 steps, and such callers pass atol 1e-5."""
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=atol,
                                   err_msg=f"parameter {name}")


def csv_with_a_bad_value(path: Path, rows: int = 96, bad_row: int = 40) -> tuple[str, str]:
    """A csv of `rows` records for an MLP on 64 features (``f0``..``f63``, ``label``) whose
    record `bad_row` holds a word in column ``f3``: the job starts (its first record is good)
    and the trainer that reads that record fails. The ``--set`` that makes a scenario read it,
    and the start of the error the trainer reports."""
    header = [f"f{i}" for i in range(64)] + ["label"]
    lines = [",".join(header)]
    for r in range(rows):
        values = [f"{(r * 64 + i) % 7 / 7:.3f}" for i in range(64)] + [str(r % 10)]
        if r == bad_row:
            values[3] = "oops"
        lines.append(",".join(values))
    path.write_text("\n".join(lines) + "\n")
    override = f"data={{name: csv, path: {path}, batch_size: 16, feeds: {{x: 'f*', label: label}}}}"
    return override, f"DataError: {path}:{bad_row + 2}: column 'f3'"
