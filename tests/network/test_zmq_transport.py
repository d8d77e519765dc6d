"""`ZmqTransport` on 127.0.0.1: the transport contract, plus what is ZeroMQ's own: socket
options, wildcard ports, bounded queues, the frame size limit and clean release of sockets."""

from __future__ import annotations

import asyncio
import itertools
import os
import select
import socket
import sys

import numpy as np
import pytest
import zmq
import zmq.asyncio

from runtime.network.transport import EndpointError, Frame, Transport, UnknownPeerError
from runtime.network.wire import Kind, Message, decode, encode
from runtime.network.zmq_transport import ZmqLimits, ZmqTransport, _received
from transport_contract import TransportContract, numbered, recv_number, within


def free_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


class ZmqFactory:
    def __init__(self, limits: ZmqLimits | None = None) -> None:
        self.limits = limits

    def transport(self, name: str) -> Transport:
        return ZmqTransport(name, self.limits)

    def endpoint(self) -> str:
        return free_endpoint()


class TestZmqTransportContract(TransportContract):
    @pytest.fixture
    def factory(self) -> ZmqFactory:
        return ZmqFactory()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_wildcard_port_bind_returns_the_real_endpoint() -> None:
    async with ZmqTransport("server") as server, ZmqTransport("client") as client:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":*")
        await client.connect(endpoint)
        await within(client.send(endpoint, [b"hi"]))
        assert (await within(server.recv()))[0] == "client"


async def test_bad_or_busy_endpoints_raise_naming_the_endpoint() -> None:
    async with ZmqTransport("a") as first, ZmqTransport("b") as second:
        endpoint = await first.bind("tcp://127.0.0.1:*")
        busy = f"'b': endpoint '{endpoint}': Address already in use"
        with pytest.raises(EndpointError, match=busy):
            await second.bind(endpoint)
        with pytest.raises(EndpointError, match="endpoint 'nowhere'"):
            await second.connect("nowhere")
        assert second.sockets[1:] == []  # the failed DEALER was not kept


async def test_sockets_get_the_configured_limits() -> None:
    limits = ZmqLimits(send_hwm=7, recv_hwm=9, max_frame_size=12345, copy_threshold=4096)
    async with ZmqTransport("node", limits) as node:
        await node.bind("tcp://127.0.0.1:*")
        await node.connect(free_endpoint())
        for sock in node.sockets:
            assert sock.getsockopt(zmq.LINGER) == 0
            assert (sock.getsockopt(zmq.SNDHWM), sock.getsockopt(zmq.RCVHWM)) == (7, 9)
            assert sock.getsockopt(zmq.MAXMSGSIZE) == 12345
            assert sock.copy_threshold == 4096
        router, dealer = node.sockets
        assert (router.type, dealer.type) == (zmq.ROUTER, zmq.DEALER)
        assert dealer.getsockopt(zmq.ROUTING_ID) == b"node"


@pytest.mark.parametrize("field", ["send_hwm", "recv_hwm", "inbox", "max_frame_size", "io_threads"])
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=f"ZmqLimits.{field}"):
        ZmqLimits(**{field: 0})


async def test_close_releases_sockets_context_and_file_descriptors() -> None:
    before = open_fds()
    server = ZmqTransport("server")
    clients = [ZmqTransport(f"c{k}") for k in range(4)]
    endpoint = await server.bind("tcp://127.0.0.1:*")
    for client in clients:
        await client.connect(endpoint)
        await within(client.send(endpoint, [b"x"]))
        await within(server.recv())
    sockets = [sock for node in (server, *clients) for sock in node.sockets]
    for node in (server, *clients):
        await node.close()
    assert all(sock.closed for sock in sockets)
    assert all(sock.context.closed for sock in sockets)
    assert open_fds() == before


async def test_a_shared_context_is_left_open() -> None:
    context = zmq.asyncio.Context()
    try:
        node = ZmqTransport("node", context=context)
        await node.bind("tcp://127.0.0.1:*")
        await node.close()
        assert node.sockets[0].closed and not context.closed
    finally:
        context.term()


async def test_queues_are_bounded_so_a_fast_sender_waits() -> None:
    limits = ZmqLimits(send_hwm=1, recv_hwm=1, inbox=1)
    async with ZmqTransport("server", limits) as server, ZmqTransport("client", limits) as client:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        await client.connect(endpoint)
        block = np.zeros(1 << 20, np.uint8)
        sent = 0

        async def send_all() -> None:
            nonlocal sent
            for i in range(200):
                await client.send(endpoint, [*numbered(i), block.data])
                sent += 1

        sender = asyncio.ensure_future(send_all())
        with pytest.raises(TimeoutError):  # nobody reads, so the sender must stall
            await asyncio.wait_for(asyncio.shield(sender), 1.0)
        assert 0 < sent < 200
        order = [await recv_number(server) for _ in range(200)]
        await within(sender)
        assert order == [("client", i) for i in range(200)]


async def test_a_frame_over_the_size_limit_is_never_delivered() -> None:
    async with (
        ZmqTransport("server", ZmqLimits(max_frame_size=1024)) as server,
        ZmqTransport("big") as big,
        ZmqTransport("small") as small,
    ):
        endpoint = await server.bind("tcp://127.0.0.1:*")
        await big.connect(endpoint)
        await within(big.send(endpoint, [bytes(2048)]))
        await small.connect(endpoint)
        await within(small.send(endpoint, [bytes(1024)]))
        assert (await within(server.recv()))[0] == "small"
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(server.recv(), 0.5)


@pytest.mark.parametrize("floats", [1 << 10, 1 << 18], ids=["copied", "zero-copy"])
async def test_zero_copy_frames_do_not_alias_the_senders_array(floats: int) -> None:
    """Once `send` returns, a write into the sent array that the kernels' in-place rule allows
    (nothing but its owner references it, `numpy_optim._exclusive`) never reaches the receiver:
    a frame under the copy threshold was copied, and a zero-copy frame holds a reference to
    the array until libzmq is done with it."""
    assert 4 * (1 << 10) < ZmqLimits().copy_threshold <= 4 * (1 << 18)
    async with ZmqTransport("server") as server, ZmqTransport("client") as client:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        await client.connect(endpoint)
        tensor = np.arange(floats, dtype=np.float32)
        alone = sys.getrefcount(tensor)
        await client.send(endpoint, encode(Message(Kind.SEND, 1, "client", 0, {"w": tensor})))
        if sys.getrefcount(tensor) <= alone:
            tensor += 1  # what an in-place optimizer kernel may then do
        _, frames = await within(server.recv())
        np.testing.assert_array_equal(decode(frames).vars["w"],
                                      np.arange(floats, dtype=np.float32))


async def test_a_received_tensor_sent_on_goes_back_by_reference() -> None:
    """A server that replies with the very tensor it decoded sends the received ZeroMQ frame
    again (`_received`), and the client gets the same bytes; a view of part of it, or a copy,
    goes as the view it is."""
    async with ZmqTransport("server") as server, ZmqTransport("client") as client:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        await client.connect(endpoint)
        tensor = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
        await client.send(endpoint, encode(Message(Kind.SEND, 1, "client", 0, {"w": tensor})))
        peer, frames = await within(server.recv())
        received = decode(frames).vars["w"]
        reply = encode(Message(Kind.REPLY, 1, "server", 0, {"w": received}))
        assert isinstance(_received(reply[1]), zmq.Frame)
        assert not isinstance(_received(reply[1][4:]), zmq.Frame)
        copied = memoryview(received.copy()).cast("B")
        assert _received(copied) is copied
        await server.send(peer, reply)
        _, echoed = await within(client.recv())
        np.testing.assert_array_equal(decode(echoed).vars["w"], tensor)


@pytest.mark.timeout(60)
async def stall(server: ZmqTransport, endpoint: str, peer: str, block: np.ndarray) -> ZmqTransport:
    """A client `peer` of `server` that reads one message and no more, and the server's sends to
    it past what libzmq and the kernel buffer (about 10 MiB on loopback), waiting in the
    server's queue for `peer` until it is full and then dropped."""
    slow = ZmqTransport(peer, ZmqLimits(recv_hwm=1, inbox=1))
    await slow.connect(endpoint)
    await slow.send(endpoint, numbered(0))
    assert (await recv_number(server)) == (peer, 0)
    for i in itertools.count():  # until its queue was full 8 times (the test's timeout
        server.send_nowait(peer, [*numbered(i), block.data])  # bounds one never full)
        if server.unsent >= 8:
            return slow  # at once: the queue is still full
        await asyncio.sleep(0)
    raise AssertionError("unreachable")


async def test_a_peer_that_stops_reading_holds_back_only_its_own_messages() -> None:
    """A server's messages to a client that stopped reading wait in its queue for that client;
    a message to another client still leaves at once (a trainer that stops reading its
    replies must not stall a pserver's replies to every trainer)."""
    limits = ZmqLimits(send_hwm=2)
    async with ZmqTransport("server", limits) as server, ZmqTransport("fast") as fast:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        slow = await stall(server, endpoint, "slow", np.zeros(1 << 20, np.uint8))
        try:
            await fast.connect(endpoint)
            await fast.send(endpoint, numbered(7))
            assert (await recv_number(server)) == ("fast", 7)
            server.send_nowait("fast", numbered(8))
            assert (await recv_number(fast)) == (endpoint, 8)
        finally:
            await slow.close()


async def test_a_send_that_fails_still_lets_waiting_input_be_read() -> None:
    """A message arrives (the socket's FD signalled, not yet read), then a send to a peer
    that is gone fails. libzmq's send took the FD's signal as it failed; input must still be
    read, not wait for the next message to signal again (a pserver whose reply to a killed
    trainer failed heard nothing from the other trainers and dropped them)."""
    async with ZmqTransport("server") as server:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        context = zmq.Context()
        client = context.socket(zmq.DEALER)
        client.setsockopt(zmq.ROUTING_ID, b"client")
        client.connect(endpoint)
        try:
            client.send(b"first")
            assert (await within(server.recv()))[0] == "client"
            client.send(b"second")
            router = server._router
            assert router is not None
            assert select.select([router.fd], [], [], 30)[0]  # it arrived; the loop not told
            with pytest.raises(UnknownPeerError):
                server.send_nowait("gone", [b"reply"])
            peer, frames = await within(server.recv())
            assert (peer, bytes(frames[0])) == ("client", b"second")
        finally:
            client.close(linger=0)
            context.term()


async def test_sends_waiting_for_a_peer_are_bounded_and_the_rest_dropped() -> None:
    """At most `send_hwm` messages wait for one peer that does not read (besides what libzmq
    holds); `send_nowait` drops the rest and counts them (the RPC layer resends what is not
    answered): a client that never reads cannot grow a server's memory without bound."""
    limits = ZmqLimits(send_hwm=2)
    async with ZmqTransport("server", limits) as server:
        endpoint = await server.bind("tcp://127.0.0.1:*")
        slow = await stall(server, endpoint, "slow", np.zeros(1 << 20, np.uint8))
        try:
            router = server._router
            assert router is not None
            dropped = server.unsent
            for i in range(10):
                server.send_nowait("slow", numbered(i))
            assert len(router.waiting["slow"]) == limits.send_hwm
            assert server.unsent == dropped + 10
        finally:
            await slow.close()


async def test_the_inbox_holds_at_most_its_byte_limit_and_one_message_then_reads_on() -> None:
    """Several clients each send large messages to a server that does not read: the bytes its
    inbox holds stay under `inbox_bytes` plus one message (the message read while under the
    limit), receiving pauses there (the rest waits in libzmq), and resumes as `recv` takes
    messages, until every message has arrived once, in each client's order."""
    size, clients, each = 300_000, 4, 8
    limit = 1 << 20  # about 3.5 messages
    limits = ZmqLimits(inbox=1000, inbox_bytes=limit)  # the message count never binds
    async with ZmqTransport("server", limits) as server:
        held: list[int] = []  # the bytes in the inbox after each message put in
        inbox = server._inbox
        put = inbox.put_nowait

        def put_counting(item: tuple[str, list[Frame]]) -> None:
            put(item)
            held.append(sum(memoryview(f).nbytes for _, frames in inbox._items for f in frames))

        inbox.put_nowait = put_counting  # type: ignore[method-assign]
        endpoint = await server.bind("tcp://127.0.0.1:*")
        senders = [ZmqTransport(f"c{k}") for k in range(clients)]
        try:
            for sender in senders:
                await sender.connect(endpoint)
            block = np.zeros(size - 4, np.uint8)
            for i in range(each):
                for sender in senders:
                    await within(sender.send(endpoint, [*numbered(i), block.data]))
            while not server._paused:  # until the server has read what it may (this test's
                await asyncio.sleep(0.01)  # timeout bounds a transport that never pauses)
            full = len(held)
            assert limit <= held[-1] < limit + size
            await asyncio.sleep(0.2)
            assert len(held) == full  # paused: nothing more read while nothing is taken
            order = [await recv_number(server) for _ in range(clients * each)]
        finally:
            for sender in senders:
                await sender.close()
    assert len(held) == clients * each
    assert max(held) < limit + size
    assert sorted(order) == sorted((f"c{k}", i) for k in range(clients) for i in range(each))
    for k in range(clients):
        assert [i for peer, i in order if peer == f"c{k}"] == list(range(each))
