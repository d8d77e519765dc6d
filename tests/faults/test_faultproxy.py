"""`FaultProxy` between real ZeroMQ nodes on 127.0.0.1: clean forwarding of whole messages (a
16 MB one included), each fault alone with exact counts, partitions that drop or hold and heal,
RPC retries that survive loss with every request applied once, and a sync job whose every
pserver link is faulty ending with exactly the parameters of the fault-free run.

Waits are bounded by `WAIT` on the loop's clock. To show that faulty messages did not arrive
without waiting for nothing, a test lets the proxy read them, turns the faults off and sends a
marker: order per link means the marker arrives after whatever of the earlier ones survived.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pytest

from runtime.faults.proxy import Direction, Faults, FaultProxy, ZmtpError, check_greeting, decide
from runtime.network.rpc import RetryPolicy, RpcClient
from runtime.network.transport import Frame
from runtime.network.wire import Kind, Message, decode, encode
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import run_job
from runtime.services.job import Job

from cluster_helpers import free_endpoints, make_job

WAIT = 30.0
MARKER = 1 << 31
UP, DOWN = Direction.UP, Direction.DOWN
T = TypeVar("T")


async def within(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, WAIT)


async def until(condition: Callable[[], bool]) -> None:
    """Poll `condition` on the loop's clock: for proxy counters, which nothing signals."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)
    await within(poll())


def numbered(i: int, *more: Frame) -> list[Frame]:
    return [i.to_bytes(8, "little"), *more]


def number(frames: list[Frame]) -> int:
    return int.from_bytes(bytes(frames[0]), "little")


@dataclass
class Link:
    """A client and a server talking through a proxy."""

    client: ZmqTransport
    server: ZmqTransport
    proxy: FaultProxy
    endpoint: str  # the proxy's address, which the client connected to

    sent: int = 0

    async def send(self, numbers: range) -> None:
        for i in numbers:
            await within(self.client.send(self.endpoint, numbered(i)))
            self.sent += 1

    async def send_marker(self) -> None:
        """Once the proxy has decided the fates of everything sent, turn the faults off and
        send the marker: it arrives after whatever of the earlier messages survived."""
        await until(lambda: self.proxy.counters[UP].messages == self.sent)
        self.proxy.faults = {d: Faults() for d in Direction}
        await within(self.client.send(self.endpoint, numbered(MARKER)))

    async def received_before_marker(self) -> list[int]:
        received = []
        while (i := number((await within(self.server.recv()))[1])) != MARKER:
            received.append(i)
        return received

    def rng(self, direction: Direction) -> random.Random:
        """A fresh copy of the RNG the proxy uses for this link and direction."""
        up = f"{self.client.name}->{self.proxy.upstream_name}"
        down = f"{self.proxy.upstream_name}->{self.client.name}"
        return random.Random(f"{self.proxy.seed}:{up if direction is UP else down}")


@asynccontextmanager
async def link(faults: Faults | dict[Direction, Faults] = Faults(), seed: int = 0,
               **options: Any) -> AsyncIterator[Link]:
    server, client = ZmqTransport("server"), ZmqTransport("client")
    proxy = FaultProxy(upstream=await server.bind("tcp://127.0.0.1:*"), faults=faults, seed=seed,
                       **options)
    try:
        endpoint = await proxy.start()
        await client.connect(endpoint)
        yield Link(client, server, proxy, endpoint)
    finally:
        await client.close()
        await proxy.close()
        await server.close()


def swaps(received: list[int]) -> int:
    return sum(a > b for a, b in zip(received, received[1:]))


# ----------------------------------------------------------------------------- clean forwarding


@pytest.mark.timeout(60)
async def test_without_faults_messages_and_replies_arrive_whole_and_in_order() -> None:
    big = np.arange(4 << 20, dtype=np.uint32)  # 16 MiB
    async with link() as ln:
        for i in range(1000):
            await within(ln.client.send(ln.endpoint, numbered(i, big.data if i == 500 else b"x")))
        for i in range(1000):
            peer, frames = await within(ln.server.recv())
            assert (peer, number(frames)) == ("client", i)
            if i == 500:
                assert np.array_equal(np.frombuffer(frames[1], np.uint32), big)
            else:
                assert bytes(frames[1]) == b"x"
            await within(ln.server.send(peer, numbered(i + 1)))
        assert [number((await within(ln.client.recv()))[1]) for _ in range(1000)] == \
            list(range(1, 1001))
        up, down = ln.proxy.counters[UP], ln.proxy.counters[DOWN]
        assert (up.messages, up.delivered, down.messages, down.delivered) == (1000,) * 4
        assert up.bytes_in == up.bytes_out > big.nbytes
        assert up.dropped == up.duplicated == up.reordered == up.cut == 0


# ----------------------------------------------------------------------------- message faults


@pytest.mark.timeout(30)
async def test_drop_everything_delivers_nothing() -> None:
    async with link({UP: Faults(drop=1.0), DOWN: Faults()}) as ln:
        await ln.send(range(20))
        await ln.send_marker()
        assert await ln.received_before_marker() == []
        assert ln.proxy.counters[UP].dropped == 20


@pytest.mark.timeout(30)
async def test_random_drops_follow_the_seed_and_keep_order() -> None:
    faults = Faults(drop=0.3)
    async with link({UP: faults, DOWN: Faults()}, seed=7) as ln:
        await ln.send(range(200))
        await ln.send_marker()
        survivors = await ln.received_before_marker()
        counters = ln.proxy.counters[UP]
        assert counters.dropped == 200 - len(survivors) > 0
        rng = ln.rng(UP)
        assert survivors == [i for i in range(200) if decide(faults, rng).copies]


@pytest.mark.timeout(30)
async def test_duplicate_everything_delivers_every_message_twice() -> None:
    async with link({UP: Faults(duplicate=1.0), DOWN: Faults()}) as ln:
        await ln.send(range(100))
        await ln.send_marker()
        assert await ln.received_before_marker() == [i for i in range(100) for _ in range(2)]
        assert (ln.proxy.counters[UP].duplicated, ln.proxy.counters[UP].delivered) == (100, 201)


@pytest.mark.timeout(30)
async def test_reordered_messages_swap_with_their_successor() -> None:
    async with link({UP: Faults(reorder=0.3, reorder_wait=5.0), DOWN: Faults()}, seed=3) as ln:
        await ln.send(range(200))
        await ln.send_marker()  # it overtakes message 199 if that one is held
        received = [number((await within(ln.server.recv()))[1]) for _ in range(201)]
        assert sorted(received) == [*range(200), MARKER]
        assert swaps(received) == ln.proxy.counters[UP].reordered > 20
        assert all(b == a - 1 for a, b in zip(received, received[1:]) if a > b and a != MARKER)


@pytest.mark.timeout(30)
async def test_a_reordered_message_with_no_successor_goes_alone_after_its_wait() -> None:
    async with link({UP: Faults(reorder=1.0, reorder_wait=0.05), DOWN: Faults()}) as ln:
        await ln.send(range(1))
        assert number((await within(ln.server.recv()))[1]) == 0
        assert ln.proxy.counters[UP].reordered == 0


@pytest.mark.timeout(30)
async def test_holding_a_reordered_message_adds_nothing_to_its_latency() -> None:
    """Latency 1 s, held at most 0.5 s for a successor that never comes: it goes after 1 s
    (its latency counts from its reading, as in the simulator), not 1.5 s."""
    async with link({UP: Faults(reorder=1.0, reorder_wait=0.5, latency=1.0),
                     DOWN: Faults()}) as ln:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await ln.send(range(1))
        assert number((await within(ln.server.recv()))[1]) == 0
        assert 1.0 <= loop.time() - start < 1.4


@pytest.mark.timeout(30)
async def test_latency_delays_each_direction() -> None:
    latency = 0.2
    async with link(Faults(latency=latency)) as ln:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await ln.send(range(1))
        peer, frames = await within(ln.server.recv())
        await within(ln.server.send(peer, frames))
        await within(ln.client.recv())
        assert loop.time() - start >= 2 * latency


@pytest.mark.timeout(30)
async def test_sampled_latency_never_reorders_a_direction() -> None:
    jitter = Faults(latency=lambda rng: rng.uniform(0.0, 0.05))
    async with link({UP: jitter, DOWN: Faults()}) as ln:
        await ln.send(range(300))
        assert [number((await within(ln.server.recv()))[1]) for _ in range(300)] == \
            list(range(300))


@pytest.mark.timeout(30)
async def test_bandwidth_paces_a_direction() -> None:
    rate, payload = 4e6, bytes(1 << 20)
    async with link({UP: Faults(bandwidth=rate), DOWN: Faults()}) as ln:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(4):
            await within(ln.client.send(ln.endpoint, numbered(i, payload)))
        for _ in range(4):
            await within(ln.server.recv())
        assert loop.time() - start >= 4 * len(payload) / rate


# ----------------------------------------------------------------------------- partitions


@pytest.mark.timeout(30)
async def test_a_partition_drops_messages_until_it_heals() -> None:
    async with link() as ln:
        await ln.send(range(5))
        assert [number((await within(ln.server.recv()))[1]) for _ in range(5)] == list(range(5))
        ln.proxy.partition()
        await ln.send(range(5, 15))
        await until(lambda: ln.proxy.counters[UP].cut == 10)
        ln.proxy.heal()
        await ln.send(range(15, 20))
        peer, frames = await within(ln.server.recv())
        assert number(frames) == 15  # 5..14 were cut
        await within(ln.server.send(peer, numbered(99)))  # replies flow again too
        assert number((await within(ln.client.recv()))[1]) == 99


@pytest.mark.timeout(30)
async def test_a_holding_partition_delivers_in_order_when_it_heals() -> None:
    async with link() as ln:
        ln.proxy.partition("hold")
        await ln.send(range(10))
        up = ln.proxy.counters[UP]
        await until(lambda: up.messages == 10 and up.held == 1)
        assert up.delivered == 0  # the first message waits for the heal, the rest behind it
        ln.proxy.heal()
        assert [number((await within(ln.server.recv()))[1]) for _ in range(10)] == list(range(10))
        assert up.cut == 0 and up.delivered == 10


# ----------------------------------------------------------------------------- per client


@pytest.mark.timeout(30)
async def test_a_clients_own_faults_are_seeded_by_its_identity_and_the_upstream_name() -> None:
    faults = Faults(drop=0.3)
    async with link(seed=5, upstream_name="pserver:0",
                    client_faults={"client": {UP: faults, DOWN: Faults()}}) as ln:
        await ln.send(range(200))
        await until(lambda: ln.proxy.counters[UP].messages == 200)
        ln.proxy.client_faults.clear()  # the default (no faults) lets the marker through
        await within(ln.client.send(ln.endpoint, numbered(MARKER)))
        survivors = await ln.received_before_marker()
        rng = random.Random("5:client->pserver:0")
        assert survivors == [i for i in range(200) if decide(faults, rng).copies]
        mine = ln.proxy.client_counters["client"][UP]
        assert mine.dropped == ln.proxy.counters[UP].dropped == 200 - len(survivors) > 0


@pytest.mark.timeout(30)
async def test_faults_and_partitions_can_be_chosen_per_client() -> None:
    """Two clients of one proxy: one's messages are all dropped while the other's pass; then a
    partition of the other alone cuts it and not the first, until it heals."""
    async with link() as ln:
        other = ZmqTransport("other")
        try:
            await other.connect(ln.endpoint)
            ln.proxy.client_faults["client"] = {UP: Faults(drop=1.0), DOWN: Faults()}
            await ln.send(range(10))
            await within(other.send(ln.endpoint, numbered(100)))
            peer, frames = await within(ln.server.recv())
            assert (peer, number(frames)) == ("other", 100)
            await until(lambda: ln.proxy.counters[UP].messages == 11)
            assert ln.proxy.counters_of("client", UP).dropped == 10
            assert ln.proxy.counters_of("other", UP).delivered == 1

            del ln.proxy.client_faults["client"]
            ln.proxy.partition(clients=["other"])
            assert (ln.proxy.partition_of("other"), ln.proxy.partition_of("client")) == \
                ("drop", None)
            await within(other.send(ln.endpoint, numbered(101)))
            await until(lambda: ln.proxy.counters_of("other", UP).cut == 1)
            await ln.send(range(10, 11))
            assert number((await within(ln.server.recv()))[1]) == 10
            ln.proxy.heal(["other"])
            await within(other.send(ln.endpoint, numbered(102)))
            peer, frames = await within(ln.server.recv())
            assert (peer, number(frames)) == ("other", 102)  # 101 was cut
        finally:
            await other.close()


@pytest.mark.timeout(30)
async def test_a_partition_of_every_link_outlasts_a_heal_of_one_client() -> None:
    proxy = FaultProxy(upstream="127.0.0.1:1")
    proxy.partition("hold")
    proxy.partition("drop", clients=["a"])
    assert (proxy.partition_of("a"), proxy.partition_of("b")) == ("drop", "hold")
    proxy.heal(["a"])
    assert (proxy.partition_of("a"), proxy.partition_of("b")) == ("hold", "hold")
    proxy.heal()
    assert (proxy.partition_of("a"), proxy.partition_of("b")) == (None, None)


def test_partition_modes_are_checked() -> None:
    with pytest.raises(ValueError, match="'drop' or 'hold'"):
        FaultProxy(upstream="127.0.0.1:1").partition("cut")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("bad", [dict(drop=1.5), dict(reorder=-0.1), dict(latency=-1.0),
                                 dict(reorder_wait=0.0), dict(bandwidth=0.0)])
def test_bad_faults_are_refused_naming_the_field(bad: dict[str, float]) -> None:
    (field,) = bad
    with pytest.raises(ValueError, match=f"Faults.{field}"):
        Faults(**bad)  # type: ignore[arg-type]


def test_only_zmtp3_with_the_null_mechanism_is_accepted() -> None:
    mechanism = b"NULL".ljust(20, b"\0")
    greeting = bytearray(b"\xff" + bytes(8) + b"\x7f\x03\x01" + mechanism + bytes(32))
    check_greeting(bytes(greeting))
    with pytest.raises(ZmtpError, match="only NULL"):
        check_greeting(bytes(greeting).replace(b"NULL", b"CURVE"))
    greeting[10] = 2
    with pytest.raises(ZmtpError, match="only 3.x"):
        check_greeting(bytes(greeting))


@pytest.mark.timeout(30)
async def test_garbage_closes_that_connection_and_the_proxy_serves_on(
        caplog: pytest.LogCaptureFixture) -> None:
    async with link() as ln:
        reader, writer = await asyncio.open_connection(*ln.endpoint.split(":"))
        try:
            writer.write(b"GET / HTTP/1.1\r\n" + bytes(64))
            await within(reader.read())  # returns once the proxy closed the connection
        finally:
            writer.close()
        assert "not a ZMTP signature" in caplog.text
        await ln.send(range(3))
        assert [number((await within(ln.server.recv()))[1]) for _ in range(3)] == [0, 1, 2]


# ----------------------------------------------------------------------------- end to end


async def echo_once_per_id(server: ZmqTransport, applied: dict[int, int]) -> None:
    """Reply to every request; apply (count) each (sender, id) once, as the pserver dedupes."""
    replies: dict[tuple[str, int], list[Frame]] = {}
    while True:
        peer, frames = await server.recv()
        msg = decode(frames)
        key = (msg.src, msg.id)
        if key not in replies:
            applied[msg.id] = applied.get(msg.id, 0) + 1
            replies[key] = encode(Message(Kind.REPLY, msg.id, server.name, msg.step,
                                          {"x": np.array(msg.vars["x"])}))
        await server.send(peer, replies[key])


@pytest.mark.timeout(60)
async def test_rpc_retries_survive_drops_and_apply_each_request_once() -> None:
    server = ZmqTransport("echo")
    proxy = FaultProxy(upstream=await server.bind("tcp://127.0.0.1:*"), faults=Faults(drop=0.3),
                       seed=11)
    client = RpcClient(ZmqTransport("caller"), RetryPolicy(deadline=10.0, first_retry=0.05,
                                                           max_interval=0.4))
    applied: dict[int, int] = {}
    echo = asyncio.create_task(echo_once_per_id(server, applied))
    try:
        endpoint = await proxy.start()
        for i in range(50):
            reply = await client.call(endpoint, Kind.SEND, vars={"x": np.array([i])})
            assert reply.vars["x"].tolist() == [i]
        assert sorted(applied) == list(range(1, 51)) and set(applied.values()) == {1}
        assert proxy.counters[UP].dropped > 0 and proxy.counters[DOWN].dropped > 0
    finally:
        echo.cancel()
        await client.close()
        await proxy.close()
        await server.close()


class BindingUpstream(ZmqTransport):
    """A `ZmqTransport` that, asked to bind a proxy's address, binds the proxy's upstream."""

    def __init__(self, name: str, upstreams: dict[str, str]) -> None:
        super().__init__(name)
        self.upstreams = upstreams

    async def bind(self, endpoint: str) -> str:
        return await super().bind(self.upstreams.get(endpoint, endpoint))


MLP = "{name: mlp, sizes: [32, 16, 4], optimizer: {type: momentum, learning_rate: 0.05}}"
def faulty_job(trainers: int, pservers: int, steps: int, deadline: float,
               protocol: str | None = None) -> Job:
    job = make_job(MLP, trainers, pservers, steps, protocol=protocol)
    train = job.scenario.train.model_copy(update={"deadline": deadline, "retry_after": 0.1})
    return Job.from_scenario(job.scenario.model_copy(update={"train": train}))


def proxies_for(job: Job, faults: Faults) -> tuple[list[FaultProxy], dict[str, str]]:
    """A proxy listening at each of the job's pserver endpoints, and where each forwards to."""
    upstreams = dict(zip(job.endpoints, free_endpoints(len(job.endpoints))))
    return [FaultProxy(listen=ep, upstream=up, faults=faults, seed=k)
            for k, (ep, up) in enumerate(upstreams.items())], upstreams


def total(proxies: list[FaultProxy], field: str) -> int:
    return sum(getattr(p.counters[d], field) for p in proxies for d in Direction)


@pytest.mark.timeout(240)
async def test_a_sync_job_through_faulty_links_ends_with_the_fault_free_params() -> None:
    # compact: a request per variable, enough messages in 6 steps for each fault to show (in
    # bundled, about 50 messages at 5% each left a run now and then without a reorder)
    clean = await run_job(faulty_job(2, 2, steps=6, deadline=30.0, protocol="compact"),
                          ZmqTransport)
    job = faulty_job(2, 2, steps=6, deadline=30.0, protocol="compact")
    proxies, upstreams = proxies_for(
        job, Faults(drop=0.05, duplicate=0.05, reorder=0.05, reorder_wait=0.2))
    try:
        for proxy in proxies:
            await proxy.start()
        faulty = await run_job(job, lambda name: BindingUpstream(name, upstreams))
    finally:
        for proxy in proxies:
            await proxy.close()
    for name, value in clean.params.items():
        np.testing.assert_array_equal(faulty.params[name], value, err_msg=f"parameter {name}")
    assert [(s.steps, s.errors, s.dropped) for s in faulty.pservers] == [(6, 0, [])] * 2
    assert all(total(proxies, f) > 0 for f in ("dropped", "duplicated", "reordered"))


class LosesCompleteReplies(BindingUpstream):
    """Once its trainer sends COMPLETE, every reply through `proxy` is dropped."""

    proxy: FaultProxy

    async def send(self, peer: str, frames: Sequence[Frame]) -> None:
        self._watch_for_complete(frames)
        await super().send(peer, frames)

    def send_nowait(self, peer: str, frames: Sequence[Frame]) -> bool:
        self._watch_for_complete(frames)
        return super().send_nowait(peer, frames)

    def _watch_for_complete(self, frames: Sequence[Frame]) -> None:
        if decode(frames).kind is Kind.COMPLETE:
            self.proxy.faults[DOWN] = Faults(drop=1.0)


@pytest.mark.timeout(60)
async def test_a_lost_reply_to_complete_does_not_fail_the_job() -> None:
    job = faulty_job(1, 1, steps=2, deadline=5.0)
    (proxy,), upstreams = proxies_for(job, Faults())
    LosesCompleteReplies.proxy = proxy

    def transport(name: str) -> ZmqTransport:
        kind = LosesCompleteReplies if name.startswith("trainer") else BindingUpstream
        return kind(name, upstreams)

    try:
        await proxy.start()
        result = await run_job(job, transport)
    finally:
        await proxy.close()
    assert result.pservers[0].steps == 2 and proxy.counters[DOWN].dropped >= 1
