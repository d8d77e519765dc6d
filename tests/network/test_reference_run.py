"""The fault-free reference run of `runtime up` (``expect.params_equal_to: fault_free``) speaks
CurveZMQ with keys of its own: every transport it makes has keys, a plaintext client that
connects to one of its pservers while it serves is refused at the handshake, and the
parameters are those of a plain run, bit for bit. Under ``--insecure`` it stays plain."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from runtime.config.scenario import parse_scenario
from runtime.launch import launcher
from runtime.network.curve import CurveKeys
from runtime.network.wire import Kind, Message, encode
from runtime.network.zmq_transport import ZmqLimits, ZmqTransport
from runtime.services import local_zmq
from runtime.services.cluster import run_job
from runtime.services.job import Job

REFUSED = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
           zmq.EVENT_HANDSHAKE_FAILED_AUTH}
"""How a connection's handshake fails (which one depends on where libzmq notices)."""
HANDSHAKE_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(REFUSED)
SCENARIO = """
name: reference
seed: 5
model: {name: mlp}
data: {batch_size: 16}
cluster: {pservers: 2, trainers: 2}
transpiler: {mode: sync}
train: {steps: 4, deadline: 60s, retry_after: 100ms}
faults:
  - {at: "step 2", crash: "trainer:1", restart_after: 0.5s}
expect: {params_equal_to: fault_free}
"""


def plaintext_get(endpoint: str) -> int:
    """Connect to `endpoint` in plaintext as ``trainer:0`` and send a GET; the first handshake
    event its connection reports. A plaintext server needs no ZAP (nor its event loop, which
    waits while this runs): it would succeed."""
    context: zmq.Context[Any] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.ROUTING_ID, b"trainer:0")
        monitor = dealer.get_monitor_socket(HANDSHAKE_EVENTS)
        dealer.connect(f"tcp://{endpoint}")
        dealer.send_multipart(encode(Message(Kind.GET, 1, "trainer:0", 0,
                                             extra={"names": ["mlp.fc0.w"]})), copy=True)
        assert monitor.poll(20_000), "no handshake event within 20 s"
        event = int(recv_monitor_message(monitor)["event"])
        assert dealer.poll(0) == 0  # nothing came back
        dealer.disable_monitor()
        monitor.close()
        return event
    finally:
        dealer.close()
        context.term()


class Recorded(ZmqTransport):
    """A `ZmqTransport` that records its keys and, once a pserver's is bound (before it serves
    anything), has a plaintext client try it."""

    made: list[tuple[str, CurveKeys | None]] = []
    probes: list[int] = []

    def __init__(self, name: str, limits: ZmqLimits | None = None, context: Any = None,
                 curve: CurveKeys | None = None) -> None:
        super().__init__(name, limits, context, curve)
        self.made.append((name, curve))

    def bind_nowait(self, endpoint: str) -> str:
        bound = super().bind_nowait(endpoint)
        if self.curve is not None and self.name.startswith("pserver:"):
            self.probes.append(plaintext_get(endpoint))
        return bound


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> type[Recorded]:
    monkeypatch.setattr(local_zmq, "ZmqTransport", Recorded)
    monkeypatch.setattr(Recorded, "made", [])
    monkeypatch.setattr(Recorded, "probes", [])
    return Recorded


@pytest.mark.timeout(60)
def test_the_reference_run_is_authenticated_and_computes_a_plain_runs_parameters(
        recorded: type[Recorded]) -> None:
    scenario = parse_scenario(SCENARIO)
    secured = launcher.fault_free_params(scenario)
    assert sorted(name for name, _ in recorded.made) == \
        ["pserver:0", "pserver:1", "trainer:0", "trainer:1"]
    assert all(keys is not None for _, keys in recorded.made)
    assert len(recorded.probes) == 2 and set(recorded.probes) <= REFUSED, recorded.probes
    clean = scenario.model_copy(update={"faults": []})
    job = Job.from_scenario(clean, launcher.free_endpoints("127.0.0.1", 2))
    plain = asyncio.run(run_job(job, ZmqTransport)).params
    assert {k: v.tobytes() for k, v in secured.items()} == \
        {k: np.asarray(v).tobytes() for k, v in plain.items()}


@pytest.mark.timeout(60)
def test_an_insecure_jobs_reference_run_is_plain(recorded: type[Recorded]) -> None:
    launcher.fault_free_params(parse_scenario(SCENARIO), secure=False)
    assert [keys for _, keys in recorded.made] == [None] * 4
    assert recorded.probes == []


@pytest.mark.timeout(60)
def test_a_ring_jobs_reference_run_gives_each_trainer_its_peers_keys(
        recorded: type[Recorded]) -> None:
    """nccl2 and collective: the trainers serve one another, each admitting the others."""
    ring = SCENARIO.replace("mode: sync", "mode: collective").replace("trainers: 2", "trainers: 3")
    scenario = parse_scenario(ring[:ring.index("faults:")])
    launcher.fault_free_params(scenario)  # three trainers' endpoints, whatever cluster.pservers
    keys = {name: k for name, k in recorded.made if k is not None}
    assert sorted(keys) == sorted(name for name, _ in recorded.made) == \
        ["trainer:0", "trainer:1", "trainer:2"]
    publics = {name: k.public for name, k in keys.items()}
    for name, own in keys.items():
        others = {public: other for other, public in publics.items() if other != name}
        assert dict(own.clients) == others
        assert sorted(own.servers.values()) == sorted(others)
