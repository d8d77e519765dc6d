"""A pserver's inbound limits: derived from its program as a hand computation says, and holding
under an insider's flood: eight authenticated connections, each sending one 64 MB frame of
garbage, leave the pserver alive, its parameters bit-identical and its memory within its
budget, and the job then runs to the parameters of a run that saw no flood."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.config.scenario import load_scenario
from runtime.network.curve import CurveKeys
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import batches_for, make_pserver, make_trainer, run_job
from runtime.services.inbound import (BUDGET_FLOOR, CURVE_FRAME_OVERHEAD, HEADER_ALLOWANCE,
                                      MAX_RECV_HWM, ROWS_PER_EXAMPLE, InboundLimits,
                                      inbound_limits, pserver_inbound_limits)
from runtime.services.job import Job
from runtime.services.node import node_keys

from cluster_helpers import FAST_DRAIN, make_job
from curve_helpers import job_keys

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
FLOOD_BYTES = 64 * MiB
CONNECTIONS = 8
MARGIN = 48 * MiB
"""Memory growth allowed beyond the budget (handshakes, allocator slack). Without the limits
the flood costs about a gigabyte: each 64 MB frame whole, under CurveZMQ twice."""

FLOOD = """
import json, sys, zmq
from zmq.utils.monitor import recv_monitor_message
from runtime.network.curve import CurveKeys, make_client
from runtime.network.zmq_transport import own_routing_id
arg = json.loads(sys.stdin.read())
keys = CurveKeys(arg["public"].encode(), arg["secret"].encode(),
                 servers={arg["endpoint"]: arg["server"].encode()})
context = zmq.Context()
garbage = b"\\xa5" * arg["bytes"]
seen = {"handshakes": 0, "disconnects": 0, "replies": 0}
ends = {}  # socket -> the pair it ends: the server drops the connection or answers
for _ in range(arg["connections"]):
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.ROUTING_ID, own_routing_id(arg["identity"], True))
    make_client(dealer, keys, arg["endpoint"])
    monitor = dealer.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
    dealer.connect("tcp://" + arg["endpoint"])
    dealer.send(garbage, copy=False)
    ends[dealer] = ends[monitor] = (dealer, monitor)
poller = zmq.Poller()
for socket in ends:
    poller.register(socket, zmq.POLLIN)
while ends and (ready := dict(poller.poll(20000))):
    for socket in ready:
        if socket not in ends:
            continue
        dealer, monitor = ends[socket]
        if socket is dealer:
            dealer.recv_multipart()
            seen["replies"] += 1
        elif recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            seen["handshakes"] += 1
            continue
        else:
            seen["disconnects"] += 1
        for done in (dealer, monitor):
            poller.unregister(done)
            del ends[done]
        dealer.disable_monitor()
        monitor.close()
        dealer.close()
for socket in ends:
    socket.close()
context.term()
print(json.dumps(seen))
"""
"""Run by `flood`: one DEALER per connection with a trainer's key, each sending one frame of
garbage; it ends when the server has dropped or answered every connection, and prints how
many handshakes succeeded, connections were dropped and replies came."""


# -------------------------------------------------------------------------- the derivation

def f32(*shape: int) -> int:
    return 4 * int(np.prod(shape))


def quickstart() -> Job:
    return Job.from_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml"))


def test_quickstart_limits_are_its_largest_send_by_hand() -> None:
    """2 pservers x 2 trainers, sync: each trainer sends each pserver its own copy of the
    pserver's grad blocks (the biases on pserver 0, the weights on pserver 1) in one SEND."""
    job = quickstart()
    own: dict[int, dict[str, tuple[int, ...]]] = {
        0: {"mlp.fc0.b@GRAD.trainer_0": (128,), "mlp.fc1.b@GRAD.trainer_0": (10,)},
        1: {"mlp.fc0.w@GRAD.trainer_0": (64, 128), "mlp.fc1.w@GRAD.trainer_0": (128, 10)}}
    for index, grads in own.items():
        block = job.pserver_programs(index)[0].global_block()
        assert {name: block.var(name).shape for name in grads} == grads
        largest = HEADER_ALLOWANCE + sum(f32(*shape) for shape in grads.values())
        assert largest == {0: 65_536 + 552, 1: 65_536 + 37_888}[index]
        limits = pserver_inbound_limits(job, index)
        assert limits == InboundLimits(largest, HEADER_ALLOWANCE, BUDGET_FLOOR, MAX_RECV_HWM)
        zmq_limits = limits.zmq_limits(linger_ms=2000)
        assert (zmq_limits.max_message_size, zmq_limits.max_frame_size, zmq_limits.inbox_bytes,
                zmq_limits.recv_hwm) == (largest, HEADER_ALLOWANCE + CURVE_FRAME_OVERHEAD,
                                         BUDGET_FLOOR, MAX_RECV_HWM)


def test_a_distributed_tables_open_dims_and_rows_count_a_batch_of_long_sequences() -> None:
    """ctr_dnn_distributed, pserver 0 (batch 32): its trainer-0 SEND holds three bias grads
    and its piece of the table's grad (rows of 8 floats, `ROWS_PER_EXAMPLE` per example);
    its PREFETCH ids vars are [-1, 1] int64 sequences."""
    job = Job.from_scenario(load_scenario(ROOT / "scenarios" / "ctr_dnn_distributed.yaml"))
    program = job.pserver_programs(0)[0]
    block = program.global_block()
    assert block.var("ctr.emb.prefetch_ids_0.pserver_0").shape == (-1, 1)
    assert block.var("ctr.emb@GRAD.trainer_0.pserver_0").shape == (1000, 8)
    rows = 32 * ROWS_PER_EXAMPLE
    table_grad = rows * 8 + rows * f32(8)
    send = f32(32) + f32(16) + f32(2) + table_grad
    assert send > rows * 8  # bigger than one PREFETCH of ids
    largest = HEADER_ALLOWANCE + send
    hwm = BUDGET_FLOOR // (2 * largest)
    assert inbound_limits(job, program) == InboundLimits(largest, rows * f32(8), BUDGET_FLOOR,
                                                         hwm)


# -------------------------------------------------------------------------------- the flood

def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Make VmHWM this process's resident memory now (Linux: ``5`` to clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as exc:
        pytest.skip(f"cannot reset the peak resident memory: {exc}")


async def flood(endpoint: str, server: bytes, keys: CurveKeys) -> dict[str, int]:
    """`FLOOD` in a process of its own (its send buffers are not this process's memory)."""
    argument = json.dumps({"endpoint": endpoint, "server": server.decode(),
                           "public": keys.public.decode(), "secret": keys.secret.decode(),
                           "identity": "trainer:0", "connections": CONNECTIONS,
                           "bytes": FLOOD_BYTES})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FLOOD, cwd=ROOT, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    try:
        out, _ = await asyncio.wait_for(process.communicate(argument.encode()), 40)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0
    return json.loads(out)  # type: ignore[no-any-return]


def state_of(service: object) -> dict[str, bytes]:
    scope, state = service.scope, service.state  # type: ignore[attr-defined]
    return {name: np.asarray(scope.get(name)).tobytes() for name in sorted(state)
            if scope.has(name)}


@pytest.mark.timeout(90)
def test_eight_connections_of_oversized_frames_cost_the_pserver_less_than_its_budget(
        tmp_path: Path) -> None:
    job = make_job("{name: mlp}", trainers=2, pservers=1, steps=3, retry_after=FAST_DRAIN)
    reference = asyncio.run(run_job(job, ZmqTransport)).params
    directory = job_keys(tmp_path, job)
    endpoint, limits = job.endpoints[0], pserver_inbound_limits(job, 0)

    def keys_of(role: str, index: int) -> CurveKeys:
        return node_keys(directory, role, index, job.trainers, job.endpoints)

    async def train() -> dict[str, np.ndarray]:
        """The whole job against the flooded pserver: trainer 0's parameters."""
        trainers = [make_trainer(job, i, ZmqTransport(f"trainer:{i}", curve=keys_of("trainer", i)))
                    for i in range(job.trainers)]
        try:
            await asyncio.gather(*(trainer.run(batches_for(job, i), job.scenario.train.steps,
                                               job.model.loss.name)
                                   for i, trainer in enumerate(trainers)))
            return {name: np.asarray(trainers[0].scope.get(name)) for name in reference}
        finally:
            await asyncio.gather(*(trainer.client.close() for trainer in trainers))

    async def flooded() -> dict[str, np.ndarray]:
        server_keys = keys_of("pserver", 0)
        transport = ZmqTransport("pserver:0", limits.zmq_limits(linger_ms=1000), curve=server_keys)
        service = make_pserver(job, 0, transport)
        before = state_of(service)
        serving = asyncio.get_running_loop().create_task(service.serve(endpoint))
        try:
            await asyncio.sleep(0)  # bound
            reset_peak()
            resident = status_kib("VmRSS")
            seen = await flood(endpoint, server_keys.public, keys_of("trainer", 0))
            growth = (status_kib("VmHWM") - resident) << 10
            assert growth < limits.budget + MARGIN, growth
            assert seen == {"handshakes": CONNECTIONS, "disconnects": CONNECTIONS, "replies": 0}
            assert not serving.done() and state_of(service) == before
            params = await train()
            await asyncio.wait_for(serving, 30)
            return params
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await transport.close()

    after = asyncio.run(flooded())
    assert {name: value.tobytes() for name, value in after.items()} == \
        {name: np.asarray(value).tobytes() for name, value in reference.items()}
