"""The contract every `Transport` keeps, as a test class any transport's tests subclass.

A subclass provides the `factory` fixture (a `TransportFactory`: makes a node's transport and
hands out fresh endpoints) and inherits one test per promise of `runtime.network.transport`: peer
identity on both sides, message boundaries, per-peer order, large frames, many peers, several
servers, connect-before-bind, reconnecting under the same name, unroutable peers and closing.

Tests wait only through the event loop (`asyncio.wait_for`), never the wall clock, so a
virtual-time loop can run them; every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Protocol, TypeVar

import numpy as np
import pytest

from runtime.network.transport import (EndpointError, Frame, Transport, TransportClosed,
                                       UnknownPeerError)
from runtime.network.wire import Kind, Message, decode, encode

WAIT = 30.0
"""Seconds (of the loop's clock) any single step may take before the test fails."""

T = TypeVar("T")


class TransportFactory(Protocol):
    def transport(self, name: str) -> Transport:
        """A new, unconnected transport for node `name`."""

    def endpoint(self) -> str:
        """An endpoint nothing is bound to yet, that `bind` accepts."""


async def within(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, WAIT)


def as_bytes(frames: Sequence[Frame]) -> list[bytes]:
    return [bytes(frame) for frame in frames]


def numbered(i: int) -> list[Frame]:
    return [i.to_bytes(4, "little")]


async def recv_number(transport: Transport) -> tuple[str, int]:
    peer, frames = await within(transport.recv())
    return peer, int.from_bytes(bytes(frames[0]), "little")


class Nodes:
    """The transports of one test: made by the factory, all closed when the test ends."""

    def __init__(self, factory: TransportFactory) -> None:
        self.factory = factory
        self.made: list[Transport] = []

    def make(self, name: str) -> Transport:
        self.made.append(self.factory.transport(name))
        return self.made[-1]

    async def serve(self, name: str = "server") -> tuple[Transport, str]:
        server = self.make(name)
        return server, await within(server.bind(self.factory.endpoint()))

    async def client(self, endpoint: str, name: str) -> Transport:
        client = self.make(name)
        await within(client.connect(endpoint))
        return client

    async def close(self) -> None:
        for transport in self.made:
            await transport.close()


class TransportContract:
    """Subclass, define the `factory` fixture, and every test below runs on that transport."""

    @pytest.fixture
    def factory(self) -> TransportFactory:
        raise NotImplementedError("a transport's test class must define the `factory` fixture")

    @pytest.fixture
    async def nodes(self, factory: TransportFactory) -> AsyncIterator[Nodes]:
        nodes = Nodes(factory)
        try:
            yield nodes
        finally:
            await nodes.close()

    async def test_request_and_reply_name_each_side(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "trainer:0")
        await within(client.send(endpoint, [b"ping"]))
        peer, frames = await within(server.recv())
        assert (peer, as_bytes(frames)) == ("trainer:0", [b"ping"])
        await within(server.send(peer, [b"pong"]))
        peer, frames = await within(client.recv())
        assert (peer, as_bytes(frames)) == (endpoint, [b"pong"])

    async def test_frames_keep_their_boundaries(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        sent: list[Frame] = [b"", b"a", bytes(range(256)), np.arange(5, dtype=np.int64).data, b""]
        await within(client.send(endpoint, sent))
        _, frames = await within(server.recv())
        assert as_bytes(frames) == as_bytes(sent)

    async def test_messages_from_one_peer_arrive_in_order(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        for i in range(1000):
            await within(client.send(endpoint, numbered(i)))
        received = [await recv_number(server) for _ in range(1000)]
        assert received == [("c", i) for i in range(1000)]

    async def test_order_holds_per_peer_when_peers_interleave(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        clients = [await nodes.client(endpoint, f"c{k}") for k in range(4)]

        async def send_all(client: Transport) -> None:
            for i in range(250):
                await client.send(endpoint, numbered(i))

        await within(asyncio.gather(*(send_all(client) for client in clients)))
        seen: dict[str, list[int]] = {client.name: [] for client in clients}
        for _ in range(1000):
            peer, number = await recv_number(server)
            seen[peer].append(number)
        assert all(numbers == list(range(250)) for numbers in seen.values())

    async def test_large_frames_arrive_intact(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        payload = np.arange(16 << 20, dtype=np.uint32)  # 64 MiB
        await within(client.send(endpoint, [b"head", payload.data]))
        peer, frames = await within(server.recv())
        await within(server.send(peer, frames))  # echo the received buffers as they are
        _, echoed = await within(client.recv())
        assert bytes(echoed[0]) == b"head"
        assert np.array_equal(np.frombuffer(echoed[1], np.uint32), payload)

    async def test_replies_reach_the_right_one_of_many_peers(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        clients = [await nodes.client(endpoint, f"trainer:{k}") for k in range(16)]
        await within(asyncio.gather(*(c.send(endpoint, [c.name.encode()]) for c in clients)))
        for _ in clients:
            peer, frames = await within(server.recv())
            assert bytes(frames[0]) == peer.encode()
            await within(server.send(peer, [b"for " + peer.encode()]))
        for client in clients:
            peer, frames = await within(client.recv())
            assert (peer, as_bytes(frames)) == (endpoint, [b"for " + client.name.encode()])

    async def test_one_client_talks_to_several_servers(self, nodes: Nodes) -> None:
        servers = [await nodes.serve(f"pserver:{k}") for k in range(3)]
        client = nodes.make("trainer:0")
        for server, endpoint in servers:
            await within(client.connect(endpoint))
            await within(client.send(endpoint, [endpoint.encode()]))
        for server, endpoint in servers:
            peer, frames = await within(server.recv())
            assert bytes(frames[0]) == endpoint.encode()
            await within(server.send(peer, [server.name.encode()]))
        replies = dict([await within(client.recv()) for _ in servers])
        assert {peer: bytes(frames[0]) for peer, frames in replies.items()} == {
            endpoint: server.name.encode() for server, endpoint in servers
        }

    async def test_messages_sent_before_the_server_binds_are_delivered(self, nodes: Nodes) -> None:
        endpoint = nodes.factory.endpoint()
        client = await nodes.client(endpoint, "early")
        await within(client.send(endpoint, [b"hello"]))
        server = nodes.make("late-server")
        await within(server.bind(endpoint))
        peer, frames = await within(server.recv())
        assert (peer, as_bytes(frames)) == ("early", [b"hello"])

    async def test_a_restarted_peer_reclaims_its_name(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        old = await nodes.client(endpoint, "trainer:1")
        await within(old.send(endpoint, [b"old"]))
        assert as_bytes((await within(server.recv()))[1]) == [b"old"]
        await old.close()
        new = await nodes.client(endpoint, "trainer:1")
        await within(new.send(endpoint, [b"new"]))
        peer, frames = await within(server.recv())
        assert (peer, as_bytes(frames)) == ("trainer:1", [b"new"])
        await within(server.send(peer, [b"welcome back"]))
        assert as_bytes((await within(new.recv()))[1]) == [b"welcome back"]

    async def test_sending_to_an_unknown_peer_raises(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        with pytest.raises(UnknownPeerError, match="'nobody'"):
            await within(server.send("nobody", [b"x"]))
        lonely = nodes.make("lonely")
        with pytest.raises(UnknownPeerError):
            await within(lonely.send(endpoint, [b"x"]))  # never connected to it
        with pytest.raises(UnknownPeerError):
            await within(lonely.send("server", [b"x"]))  # serves nothing, so routes no names

    async def test_connecting_twice_to_one_endpoint_raises(self, nodes: Nodes) -> None:
        _, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        with pytest.raises(EndpointError, match="already connected"):
            await within(client.connect(endpoint))

    async def test_an_empty_message_is_refused(self, nodes: Nodes) -> None:
        _, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        with pytest.raises(ValueError, match="at least one frame"):
            await within(client.send(endpoint, []))

    @pytest.mark.parametrize("name", ["", "tcp://10.0.0.1:6174", "\0zmq", "x" * 256])
    def test_invalid_node_names_are_refused(self, factory: TransportFactory, name: str) -> None:
        with pytest.raises(ValueError, match="node name"):
            factory.transport(name)

    async def test_recv_and_send_after_close_raise(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        await client.close()
        await client.close()  # closing twice is harmless
        with pytest.raises(TransportClosed, match="'c' is closed: cannot recv"):
            await within(client.recv())
        with pytest.raises(TransportClosed, match="cannot send"):
            await within(client.send(endpoint, [b"x"]))
        with pytest.raises(TransportClosed, match="cannot connect"):
            await within(client.connect(endpoint))

    async def test_close_wakes_a_waiting_recv(self, nodes: Nodes) -> None:
        server, _ = await nodes.serve()
        waiting = asyncio.ensure_future(server.recv())
        await asyncio.sleep(0)  # let recv start waiting
        await server.close()
        with pytest.raises(TransportClosed):
            await within(waiting)

    async def test_wire_messages_survive_the_trip(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "trainer:0")
        grads = {
            "w@GRAD": np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32),
            "b@GRAD": np.arange(3, dtype=np.float64),
        }
        await within(client.send(endpoint, encode(Message(Kind.SEND, 41, client.name, 5, grads))))
        peer, frames = await within(server.recv())
        received = decode(frames)
        assert (peer, received.kind, received.id, received.step) == ("trainer:0", Kind.SEND, 41, 5)
        for name, grad in grads.items():
            np.testing.assert_array_equal(received.vars[name], grad)

    async def test_send_nowait_sends_as_send_does_or_declines(self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        for i in range(10):
            if not client.send_nowait(endpoint, numbered(i)):  # this transport cannot: no trace
                await within(client.send(endpoint, numbered(i)))
        assert [await recv_number(server) for _ in range(10)] == [("c", i) for i in range(10)]
        with pytest.raises(UnknownPeerError):
            server.send_nowait("nobody", [b"x"]) or await within(server.send("nobody", [b"x"]))

    async def test_deliver_to_hands_each_message_over_in_order_or_declines(
            self, nodes: Nodes) -> None:
        server, endpoint = await nodes.serve()
        client = await nodes.client(endpoint, "c")
        got: list[tuple[str, list[bytes]]] = []
        arrived = asyncio.Event()

        def handler(peer: str, frames: list[Frame]) -> None:
            got.append((peer, as_bytes(frames)))
            if len(got) == 5:
                arrived.set()

        pushed = client.deliver_to(handler)
        await within(client.send(endpoint, [b"hello"]))
        assert (await within(server.recv()))[0] == "c"  # the server knows "c" now
        for i in range(5):
            await within(server.send("c", numbered(i)))
        if pushed:
            await within(arrived.wait())
        else:
            got.extend((peer, as_bytes(frames)) for peer, frames in
                       [await within(client.recv()) for _ in range(5)])
        assert got == [(endpoint, as_bytes(numbered(i))) for i in range(5)]
