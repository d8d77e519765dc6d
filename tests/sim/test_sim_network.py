"""The simulated network: the transport contract on virtual time, exact closed-form delivery
times (latency, bandwidth, NIC queueing), per-link overrides, seeded latencies, counters,
validation of the `network` section, and a whole job running over it."""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import re
import statistics
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from runtime.config.scenario import ScenarioError, parse_scenario
from runtime.config.units import duration
from runtime.network.transport import EndpointError, Transport, TransportClosed, UnknownPeerError
from runtime.services.cluster import run_job, train_locally
from sim.loop import run
from sim.network import (ConstantLatency, LinkStats, LogNormalLatency, Network, NetworkConfigError,
                         NetworkSpec, NormalLatency, SimTransport, UniformLatency)
from cluster_helpers import make_job
from transport_contract import Nodes, TransportContract

C = TypeVar("C", bound=type)

# Values exact in binary floating point: L = 2^-12 s (~244us), B = 1 GiB/s, S = 256 KiB, so one
# message's serialization S/B is 2^-12 s as well and every sum below is exact.
L = 2.0**-12
B = "1GiB/s"
S = 2**18
SB = S / 1024.0**3
assert SB == 2.0**-12

Log = list[tuple[float, str, str, bytes]]
"""Deliveries as (virtual time, receiver, peer, first frame)."""


def exact_network(**section: Any) -> Network:
    """Constant latency L and bandwidth B unless `section` says otherwise; rates count the
    messages' bytes alone (``framing: none``), so that S / B is exact."""
    return Network.from_spec({"default": {"latency": L, "bandwidth": B}, "framing": "none",
                              **section}, seed=0)


def now() -> float:
    return asyncio.get_running_loop().time()


async def receive(node: Transport, count: int, log: Log) -> None:
    for _ in range(count):
        peer, frames = await node.recv()
        log.append((now(), node.name, peer, bytes(frames[0])))


async def serve(net: Network, name: str, endpoint: str) -> SimTransport:
    server = net.transport(name)
    await server.bind(endpoint)
    return server


async def client(net: Network, name: str, *endpoints: str) -> SimTransport:
    node = net.transport(name)
    for endpoint in endpoints:
        await node.connect(endpoint)
    return node


def payload(tag: int, nbytes: int = S) -> bytes:
    return tag.to_bytes(4, "little") + bytes(nbytes - 4)


# ------------------------------------------------------------------------------ the contract


class SimFactory:
    def __init__(self, network: Network) -> None:
        self.network = network
        self._endpoints = 0

    def transport(self, name: str) -> Transport:
        return self.network.transport(name)

    def endpoint(self) -> str:
        self._endpoints += 1
        return f"10.0.0.{self._endpoints}:6174"


NETWORKS = {
    "ideal": None,
    "lognormal": {
        "default": {"latency": {"dist": "lognormal", "median": "200us", "sigma": 1.0},
                    "bandwidth": "10Gbps"},
        "nics": [{"nodes": "server", "bandwidth": "1Gbps"}],
    },
}  # fmt: skip


def on_virtual_time(cls: C) -> C:
    """Run every async test `cls` has (each taking only `nodes`) under `sim.loop.run`.

    pytest-asyncio would run them on a stock loop; here each one gets a fresh VirtualTimeLoop,
    with the `Nodes` of the contract's own fixture made from the `factory` fixture.
    """
    for name, test in inspect.getmembers(cls, inspect.iscoroutinefunction):
        if name.startswith("test_"):
            if list(inspect.signature(test).parameters) != ["self", "nodes"]:
                raise TypeError(f"{name}: on_virtual_time only runs tests taking `nodes`")
            setattr(cls, name, _run_virtually(test))
    return cls


def _run_virtually(test: Callable[[Any, Nodes], Awaitable[None]]) -> Callable[..., None]:
    def wrapper(self: Any, factory: SimFactory) -> None:
        async def body() -> None:
            nodes = Nodes(factory)
            try:
                await test(self, nodes)
            finally:
                await nodes.close()

        run(body())

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapper, attribute, getattr(test, attribute))
    wrapper.__dict__.update(test.__dict__)  # marks, if any
    return wrapper


@on_virtual_time
class TestSimTransportContract(TransportContract):
    @pytest.fixture(params=sorted(NETWORKS))
    def factory(self, request: pytest.FixtureRequest) -> SimFactory:
        return SimFactory(Network.from_spec(NETWORKS[request.param], seed=11))


def test_contract_tests_run_on_the_virtual_clock() -> None:
    test = getattr(TestSimTransportContract, "test_messages_from_one_peer_arrive_in_order")
    assert not inspect.iscoroutinefunction(test)
    slow = Network.from_spec({"default": {"latency": "1h"}}, seed=0)
    with pytest.raises(TimeoutError):  # 30 s of patience vs. one hour of latency, in no wall time
        test(TestSimTransportContract(), SimFactory(slow))


# ---------------------------------------------------------------------------- closed forms


def test_a_lone_message_takes_latency_plus_size_over_bandwidth() -> None:
    net = exact_network()
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await asyncio.sleep(1.0)  # the clock is not at zero when it sends
        await trainer.send("ps0", [payload(7)[:4], bytes(S - 4)])  # size counts every frame
        await receive(server, 1, log)

    run(main())
    assert log == [(1.0 + L + SB, "pserver:0", "trainer:0", payload(7)[:4])]


def test_back_to_back_messages_from_one_sender_queue_on_its_nic() -> None:
    net = exact_network()
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        for k in range(4):
            await trainer.send("ps0", [payload(k)])
        await receive(server, 4, log)

    run(main())
    assert log == [(L + k * SB, "pserver:0", "trainer:0", payload(k - 1)) for k in range(1, 5)]
    nic = net.nic_stats()["trainer:0"]
    assert (nic.messages_out, nic.bytes_out, nic.busy_out) == (4, 4 * S, 4 * SB)
    assert nic.wait_out == (0 + 1 + 2 + 3) * SB  # each waits for those before it
    assert net.nic_stats()["pserver:0"].wait_in == 0.0  # they arrive as fast as it takes them


def test_messages_from_many_senders_queue_on_the_receivers_nic() -> None:
    net = exact_network()
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainers = [await client(net, f"trainer:{k}", "ps0") for k in range(5)]
        for k, trainer in enumerate(trainers):
            await trainer.send("ps0", [payload(k)])
        await receive(server, 5, log)

    run(main())
    assert log == [
        (L + (k + 1) * SB, "pserver:0", f"trainer:{k}", payload(k)) for k in range(5)
    ]
    nic = net.nic_stats()["pserver:0"]
    assert (nic.messages_in, nic.bytes_in, nic.busy_in) == (5, 5 * S, 5 * SB)
    assert nic.wait_in == (0 + 1 + 2 + 3 + 4) * SB
    assert net.link_stats()["trainer:3", "pserver:0"] == LinkStats(messages=1, bytes=S)


def test_a_request_and_its_reply_take_two_latencies_and_both_sizes() -> None:
    net = exact_network()
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await trainer.send("ps0", [payload(1)])
        peer, _ = await server.recv()
        await server.send(peer, [payload(2, S // 2)])
        await receive(trainer, 1, log)

    run(main())
    assert log == [(2 * L + SB + SB / 2, "trainer:0", "ps0", payload(2)[:4] + bytes(S // 2 - 4))]


def test_a_fast_nic_takes_slow_senders_side_by_side() -> None:
    # Trainers' NICs are capped at B, links and the pserver run at 2B: two trainers' messages
    # come in together at L + S/B; a third waits for the pserver's NIC to have room.
    net = exact_network(
        default={"latency": L, "bandwidth": "2GiB/s"},
        nics=[{"nodes": "trainer:*", "bandwidth": B}],
    )
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainers = [await client(net, f"trainer:{k}", "ps0") for k in range(3)]
        for k, trainer in enumerate(trainers):
            await trainer.send("ps0", [payload(k)])
        await receive(server, 3, log)

    run(main())
    assert [t for t, *_ in log] == [L + SB, L + SB, L + 1.5 * SB]


def test_a_token_bucket_lets_an_idle_nic_send_its_burst_at_once_then_the_rate() -> None:
    """burst 2 S/B: each NIC direction holds 2 S of tokens, full at the start. Four messages
    sent together at t = 1: two pass at once, two at the rate (on the trainer's egress and the
    pserver's ingress alike). After SB idle, S of tokens are back: a message of 2 S takes one
    SB, not two."""
    net = exact_network(burst=2 * SB)
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await asyncio.sleep(1.0)
        for k in range(4):
            await trainer.send("ps0", [payload(k)])
        await receive(server, 4, log)
        assert now() == 1.0 + 3 * SB  # the trainer's NIC has been idle since 1 + 2 SB
        await trainer.send("ps0", [payload(4, 2 * S)])
        await receive(server, 1, log)

    run(main())
    assert [t for t, *_ in log] == [1.0 + L, 1.0 + L, 1.0 + L + SB, 1.0 + L + 2 * SB,
                                    1.0 + 3 * SB + L + SB]
    trainer = net.nic_stats()["trainer:0"]
    assert (trainer.busy_out, trainer.wait_out) == (3 * SB, SB)  # the 4th waited for the 3rd
    assert net.nic_stats()["pserver:0"].busy_in == 3 * SB


def test_without_a_burst_a_network_with_a_zero_bucket_times_as_before() -> None:
    log: list[Log] = [[], []]
    for burst, out in ((None, log[0]), (0, log[1])):
        net = exact_network() if burst is None else exact_network(burst=burst)

        async def main(net: Network = net, out: Log = out) -> None:
            server = await serve(net, "pserver:0", "ps0")
            trainer = await client(net, "trainer:0", "ps0")
            for k in range(3):
                await trainer.send("ps0", [payload(k)])
            await receive(server, 3, out)

        run(main())
    assert log[0] == log[1] and [t for t, *_ in log[0]] == [L + SB, L + 2 * SB, L + 3 * SB]


def test_a_message_sent_before_the_bind_leaves_when_the_server_binds() -> None:
    net = exact_network()
    log: Log = []

    async def main() -> None:
        trainer = await client(net, "trainer:0", "ps0")
        await trainer.send("ps0", [payload(1)])
        await asyncio.sleep(0.5)
        server = await serve(net, "pserver:0", "ps0")
        await receive(server, 1, log)

    run(main())
    assert log == [(0.5 + L + SB, "pserver:0", "trainer:0", payload(1))]


def test_an_ideal_network_delivers_at_the_same_instant() -> None:
    net = Network.from_spec(None, seed=0)
    log: Log = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await asyncio.sleep(0.25)
        await trainer.send("ps0", [bytes(1 << 20)])
        await receive(server, 1, log)

    run(main())
    assert [t for t, *_ in log] == [0.25]


def test_a_rate_counts_the_tcp_segments_frames_by_default() -> None:
    # 262,144 bytes ride in 182 segments of at most 1,448 bytes, each with 66 bytes of
    # Ethernet, IPv4 and TCP headers: 274,156 bytes against the rate, as tc counts them
    spec = NetworkSpec.parse({"default": {"bandwidth": B}})
    assert -(-S // 1448) == 182
    assert (spec.framing, spec.wire_bytes(S)) == ("tcp", S + 182 * 66)
    assert spec.wire_bytes(40) == 40 + 66 and spec.wire_bytes(1448) == 1448 + 66
    assert NetworkSpec.parse({"framing": "none"}).wire_bytes(S) == S
    net = Network.from_spec({"default": {"latency": L, "bandwidth": B}}, seed=0)
    log: list[tuple[float, str, str, bytes]] = []

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await asyncio.sleep(1.0)
        await trainer.send("ps0", [payload(7)[:4], bytes(S - 4)])
        await receive(server, 1, log)

    run(main())
    assert log[0][0] == pytest.approx(1.0 + L + (S + 182 * 66) / 1024.0**3, abs=1e-12)
    assert net.nic_stats()["trainer:0"].bytes_out == S  # the counters keep the messages' bytes


def test_framing_is_checked_by_name() -> None:
    with pytest.raises(NetworkConfigError, match="framing"):
        NetworkSpec.parse({"framing": "udp"})


# -------------------------------------------------------------------------- link overrides


OVERRIDES = {
    "default": {"latency": L, "bandwidth": B},
    "framing": "none",
    "links": [
        {"between": ["pserver:*", "trainer:*"], "latency": 4 * L},
        {"between": ["trainer:0", "pserver:1"], "bandwidth": "4GiB/s"},  # keeps latency 4L
    ],
    "nics": [{"nodes": ["pserver:2"], "bandwidth": "512MiB/s"}],
}


@pytest.mark.parametrize(
    "src,dst,latency,bandwidth",
    [
        ("trainer:0", "pserver:0", 4 * L, 1024.0**3),
        ("pserver:0", "trainer:0", 4 * L, 1024.0**3),  # a rule covers both directions
        ("trainer:0", "pserver:1", 4 * L, 4 * 1024.0**3),
        ("pserver:1", "trainer:0", 4 * L, 4 * 1024.0**3),
        ("trainer:1", "pserver:1", 4 * L, 1024.0**3),
        ("trainer:0", "trainer:1", L, 1024.0**3),
        ("pserver:0", "pserver:1", L, 1024.0**3),
    ],
)
def test_later_rules_override_earlier_ones_field_by_field(
    src: str, dst: str, latency: float, bandwidth: float
) -> None:
    assert NetworkSpec.parse(OVERRIDES).link(src, dst) == (ConstantLatency(latency), bandwidth)


def test_overridden_links_and_nics_time_their_messages() -> None:
    net = Network.from_spec(OVERRIDES, seed=0)
    log: Log = []

    async def main() -> None:
        nodes = {"ps0": "pserver:0", "ps1": "pserver:1", "ps2": "pserver:2", "t1": "trainer:1"}
        servers = {endpoint: await serve(net, name, endpoint) for endpoint, name in nodes.items()}
        trainer = await client(net, "trainer:0", *nodes)
        for endpoint, server in servers.items():
            start = now()
            await trainer.send(endpoint, [payload(0)])
            await receive(server, 1, log)
            log[-1] = (log[-1][0] - start, *log[-1][1:])

    run(main())
    assert [(t, node) for t, node, *_ in log] == [
        (4 * L + SB, "pserver:0"),
        (4 * L + SB / 4, "pserver:1"),
        (4 * L + 2 * SB, "pserver:2"),  # its NIC is capped at half the link's rate
        (L + SB, "trainer:1"),
    ]


# ------------------------------------------------------------------- randomness and order


def random_exchange(seed: int) -> Log:
    """Four trainers each send 50 requests to two pservers, which reply to each one."""
    net = Network.from_spec(NETWORKS["lognormal"], seed=seed)
    log: Log = []

    async def pserver(node: SimTransport) -> None:
        for _ in range(200):
            peer, frames = await node.recv()
            log.append((now(), node.name, peer, bytes(frames[0])))
            await node.send(peer, [node.name.encode() + bytes(frames[0])])

    async def trainer(node: SimTransport) -> None:
        for i in range(50):
            for endpoint in ("ps0", "ps1"):
                await node.send(endpoint, [f"{node.name}#{i}".encode(), bytes(1000 * i)])
            await asyncio.sleep(1e-6)
        await receive(node, 100, log)

    async def main() -> None:
        servers = [await serve(net, f"pserver:{j}", f"ps{j}") for j in range(2)]
        trainers = [await client(net, f"trainer:{k}", "ps0", "ps1") for k in range(4)]
        await asyncio.gather(*map(pserver, servers), *map(trainer, trainers))

    run(main())
    return log


def test_runs_with_one_seed_give_identical_delivery_logs() -> None:
    first = random_exchange(seed=5)
    assert len(first) == 2 * 4 * 50 * 2
    assert random_exchange(seed=5) == first
    other = random_exchange(seed=6)
    assert [t for t, *_ in other] != [t for t, *_ in first]
    assert sorted(what for _, *what in other) == sorted(what for _, *what in first)


def test_random_latencies_never_reorder_one_links_messages() -> None:
    sent: list[tuple[float, float]] = []
    spec = {"default": {"latency": {"dist": "lognormal", "median": "200us", "sigma": 1.5}}}
    net = Network.from_spec(spec, seed=1, on_message=lambda *m: sent.append((m[3], m[4])))
    log: Log = []

    async def main() -> None:
        server = await serve(net, "server", "ep")
        node = await client(net, "client", "ep")
        for i in range(500):
            await node.send("ep", [i.to_bytes(4, "little")])
            await asyncio.sleep(1e-6)  # far less than the spread of the latencies
        await receive(server, 500, log)

    run(main())
    assert [int.from_bytes(data, "little") for *_, data in log] == list(range(500))
    delivered = [deliver for _, deliver in sent]
    assert delivered == sorted(delivered)
    # A message whose own latency was short waited for a slower one sent before it, arriving
    # right behind it (the ideal bandwidth makes that the same instant); there are many.
    held = sum(1 for a, b in zip(delivered, delivered[1:]) if a == b)
    assert held > 100


@pytest.mark.parametrize(
    "spec,latency",
    [
        ({"dist": "constant", "value": "50us"}, ConstantLatency(duration("50us"))),
        ("50us", ConstantLatency(duration("50us"))),
        (5e-5, ConstantLatency(5e-5)),
        ({"dist": "uniform", "low": "100us", "high": 3e-4},
         UniformLatency(duration("100us"), 3e-4)),
        ({"dist": "normal", "mean": "1ms", "std": "2ms"},
         NormalLatency(duration("1ms"), duration("2ms"))),
        ({"dist": "lognormal", "median": "200us", "sigma": 0.3},
         LogNormalLatency(duration("200us"), 0.3)),
    ],
)
def test_latency_specs_parse_to_their_distribution(spec: Any, latency: Any) -> None:
    parsed = NetworkSpec.parse({"default": {"latency": spec}}).latency
    assert parsed == latency


def test_latency_samples_follow_their_distribution() -> None:
    rng = random.Random(0)
    uniform = [UniformLatency(1e-4, 3e-4).sample(rng) for _ in range(20000)]
    assert 1e-4 <= min(uniform) and max(uniform) <= 3e-4
    assert statistics.fmean(uniform) == pytest.approx(2e-4, rel=0.01)
    normal = [NormalLatency(1e-3, 2e-3).sample(rng) for _ in range(20000)]
    assert min(normal) >= 0.0  # truncated, not shifted: the mass below 0 is redrawn
    below_zero = statistics.NormalDist(1e-3, 2e-3).cdf(0.0)
    median = statistics.NormalDist(1e-3, 2e-3).inv_cdf((1 + below_zero) / 2)
    assert statistics.median(normal) == pytest.approx(median, rel=0.03)
    lognormal = [LogNormalLatency(2e-4, 0.3).sample(rng) for _ in range(20000)]
    assert statistics.median(lognormal) == pytest.approx(2e-4, rel=0.02)
    assert statistics.stdev(np.log(lognormal)) == pytest.approx(0.3, rel=0.03)


def test_latencies_depend_on_the_seed_and_each_link_has_its_own_stream() -> None:
    def delays(seed: int, extra_link: bool) -> list[float]:
        sent: list[float] = []

        def observe(src: str, dst: str, nbytes: int, t_send: float, t_deliver: float) -> None:
            if src == "client":
                sent.append(t_deliver - t_send)

        spec = {"default": {"latency": {"dist": "lognormal", "median": "200us", "sigma": 0.3}}}
        net = Network.from_spec(spec, seed, on_message=observe)

        async def main() -> None:
            server = await serve(net, "server", "ep")
            node = await client(net, "client", "ep")
            other = await client(net, "other", "ep")
            for i in range(20):
                await node.send("ep", [b"x"])
                if extra_link:  # traffic on another link draws from that link's stream
                    await other.send("ep", [b"y"])
                await asyncio.sleep(0.01)
            await receive(server, 40 if extra_link else 20, [])

        run(main())
        return sent

    assert delays(1, False) == delays(1, False)
    assert delays(1, True) == delays(1, False)
    assert delays(2, False) != delays(1, False)


# ------------------------------------------------------------- counters, hooks and closing


def test_on_message_reports_each_delivery() -> None:
    seen: list[tuple[Any, ...]] = []
    spec = {"default": {"latency": L, "bandwidth": B}, "framing": "none"}
    net = Network.from_spec(spec, seed=0, on_message=lambda *message: seen.append(message))

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainers = [await client(net, f"trainer:{k}", "ps0") for k in range(2)]
        await asyncio.sleep(0.5)
        for trainer in trainers:
            await trainer.send("ps0", [payload(0)])
        await receive(server, 2, [])
        await server.send("trainer:1", [b"ok"])
        await receive(trainers[1], 1, [])

    run(main())
    assert seen == [
        ("trainer:0", "pserver:0", S, 0.5, 0.5 + L + SB),
        ("trainer:1", "pserver:0", S, 0.5, 0.5 + L + 2 * SB),
        ("pserver:0", "trainer:1", 2, 0.5 + L + 2 * SB, 0.5 + 2 * L + 2 * SB + 2 / 1024.0**3),
    ]


def test_messages_to_a_closed_transport_are_dropped_and_a_restart_gets_later_ones() -> None:
    net = exact_network()
    log: Log = []

    async def main() -> None:
        old = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await trainer.send("ps0", [payload(1)])
        await old.close()  # before the message is in
        await trainer.send("ps0", [payload(2)])  # nobody serves ps0: held by the trainer
        await asyncio.sleep(1.0)
        new = await serve(net, "pserver:0", "ps0")
        await receive(new, 1, log)
        await new.send("trainer:0", [payload(3)])
        await receive(trainer, 1, log)

    run(main())
    assert [(t, node, peer, data[:1]) for t, node, peer, data in log] == [
        (1.0 + L + SB, "pserver:0", "trainer:0", b"\x02"),
        (1.0 + 2 * (L + SB), "trainer:0", "ps0", b"\x03"),
    ]
    assert net.link_stats()["trainer:0", "pserver:0"] == LinkStats(2, 2 * S, dropped=1)


def test_a_closed_client_is_no_longer_routable() -> None:
    net = exact_network()

    async def main() -> None:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        await server.send("trainer:0", [b"hello"])  # routable as soon as it connected
        assert (await trainer.recv())[0] == "ps0"
        await trainer.close()
        with pytest.raises(UnknownPeerError, match="'trainer:0'"):
            await server.send("trainer:0", [b"x"])
        with pytest.raises(TransportClosed):
            await trainer.recv()

    run(main())


def test_binding_a_bound_endpoint_names_its_owner() -> None:
    net = exact_network()

    async def main() -> None:
        await serve(net, "pserver:0", "ps0")
        with pytest.raises(EndpointError, match="'ps0': address in use by node 'pserver:0'"):
            await serve(net, "pserver:1", "ps0")

    run(main())


def test_receivers_cannot_write_into_the_senders_buffers() -> None:
    net = exact_network()

    async def main() -> list[Any]:
        server = await serve(net, "pserver:0", "ps0")
        trainer = await client(net, "trainer:0", "ps0")
        grad = np.arange(6, dtype=np.float32).reshape(2, 3)
        await trainer.send("ps0", [bytearray(b"head"), grad.data])
        _, frames = await server.recv()
        return frames

    frames = run(main())
    assert [(f.readonly, f.format, f.ndim, f.nbytes) for f in frames] == [
        (True, "B", 1, 4),
        (True, "B", 1, 24),
    ]
    assert np.array_equal(np.frombuffer(frames[1], np.float32), np.arange(6, dtype=np.float32))


# ------------------------------------------------------------------------------ validation


INVALID_SECTIONS = [
    ([], "network", "Input should be a valid dictionary"),
    ({"defaults": {}}, "network.defaults", "Extra inputs are not permitted"),
    ({"default": {"latency": "200 parsecs"}}, "network.default.latency", "unknown unit 'parsecs'"),
    ({"default": {"latency": "-1ms"}}, "network.default.latency", "not a number with a unit"),
    ({"default": {"latency": -0.001}}, "network.default.latency", "must be finite and >= 0"),
    ({"default": {"latency": {"dist": "gamma"}}}, "network.default.latency.dist",
     "Input should be 'constant', 'uniform', 'normal' or 'lognormal'"),
    ({"default": {"latency": {"median": "1ms"}}}, "network.default.latency.dist", "Field required"),
    ({"default": {"latency": {"dist": "lognormal", "median": "1ms"}}},
     "network.default.latency.sigma", "Field required"),
    ({"default": {"latency": {"dist": "lognormal", "median": 0, "sigma": 1}}},
     "network.default.latency", "median must be > 0"),
    ({"default": {"latency": {"dist": "uniform", "low": "2ms", "high": "1ms"}}},
     "network.default.latency", "high must be >= low"),
    ({"default": {"latency": {"dist": "constant", "value": 1, "mean": 2}}},
     "network.default.latency.mean", "Extra inputs are not permitted"),
    ({"default": {"latency": {"dist": "lognormal", "median": "1ms", "sigma": "1"}}},
     "network.default.latency.sigma", "must be a number"),
    ({"default": {"bandwidth": "10 furlongs"}}, "network.default.bandwidth",
     "unknown unit 'furlongs'"),
    ({"default": {"bandwidth": 0}}, "network.default.bandwidth", "must be > 0"),
    ({"default": {"bandwidth": True}}, "network.default.bandwidth", "must be a rate"),
    ({"links": {"between": ["a", "b"]}}, "network.links", "Input should be a valid list"),
    ({"links": [{"between": ["a"], "latency": 1}]}, "network.links.0.between",
     "needs two node patterns"),
    ({"links": [{"latency": 1}]}, "network.links.0.between", "Field required"),
    ({"links": [{"between": ["a", "b"]}]}, "network.links.0", "sets neither latency nor bandwidth"),
    ({"links": [{"between": ["a", "b"], "bandwidth": "1Gbps"},
                {"between": ["a", "b"], "latency": {"dist": "normal", "mean": "1ms"}}]},
     "network.links.1.latency.std", "Field required"),
    ({"nics": [{"nodes": "pserver:*"}]}, "network.nics.0.bandwidth", "Field required"),
    ({"burst": True}, "network.burst", "must be a duration such as 200us"),
    ({"burst": -0.001}, "network.burst", "must be finite and >= 0"),
    ({"nics": [{"nodes": [], "bandwidth": "1Gbps"}]}, "network.nics.0.nodes",
     "must be a node pattern or a list of them"),
]  # fmt: skip


@pytest.mark.parametrize("section,field,problem", INVALID_SECTIONS)
def test_an_invalid_section_is_refused_naming_the_field(section: Any, field: str,
                                                        problem: str) -> None:
    with pytest.raises(NetworkConfigError, match=f"^{re.escape(field)}: ") as info:
        Network.from_spec(section, seed=0)
    assert info.value.field == field
    assert problem in info.value.problem
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("section,field,problem", INVALID_SECTIONS)
def test_a_scenario_with_an_invalid_section_names_file_line_and_field(
        section: Any, field: str, problem: str) -> None:
    """The same errors come from loading the scenario (for `sim run` and `runtime up` alike),
    at the line of the section (JSON is YAML on one line)."""
    text = f"name: n\nmodel: {{name: mlp}}\nnetwork: {json.dumps(section)}\n"
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "net.yaml")
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"net.yaml:3: {field}: ")
    assert problem in first


def test_the_examples_network_section_parses() -> None:
    spec = NetworkSpec.parse(
        {
            "default": {"latency": {"dist": "lognormal", "median": "200us", "sigma": 0.3},
                        "bandwidth": "10Gbps"},
            "links": [{"between": ["pserver:*", "trainer:*"], "bandwidth": "25Gbps"}],
        }
    )  # fmt: skip
    assert spec.link("trainer:3", "pserver:0").bandwidth == 25e9 / 8
    latency = LogNormalLatency(duration("200us"), 0.3)
    assert spec.link("trainer:3", "trainer:0") == (latency, 10e9 / 8)
    assert spec.nic_bandwidth("pserver:0") == float("inf")


# --------------------------------------------------------------------------- a whole job


def test_a_sync_job_over_the_simulated_network_equals_local_training() -> None:
    model = "{name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}"
    job = make_job(model, trainers=3, pservers=2, steps=5)
    net = Network.from_spec(NETWORKS["lognormal"], seed=3)

    async def main() -> tuple[Any, float]:
        return await run_job(job, net.transport), now()

    result, elapsed = run(main())
    _, local = train_locally(job)
    for name, value in local.items():
        np.testing.assert_allclose(result.params[name], value, rtol=1e-5, atol=1e-6)
    # simulated seconds: a few round trips of ~200us per step; no drain (3 x train.retry_after
    # = 3 s of quiet in which the pservers would answer retries): every trainer said BYE
    assert 0.005 < elapsed < 0.1
    links = net.link_stats()
    assert {src for src, _ in links} == {"trainer:0", "trainer:1", "trainer:2", "pserver:0",
                                         "pserver:1"}  # fmt: skip
    sent = sum(stats.bytes for (src, _), stats in links.items() if src.startswith("trainer"))
    assert sent == sum(stats.bytes_in for stats in result.pservers)
