"""`DelayRelay`: bytes pass whole and in order both ways, none before its link's latency, the
latency chosen by the client's address; ends of connections pass through; CurveZMQ passes
through with no key in the relay; `close` ends every connection and the thread. Loopback only;
the only timed assertions are lower bounds, which load cannot break."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import zmq

from runtime.launch.delay_relay import DelayRelay

pytestmark = pytest.mark.timeout(60)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        assert chunk, f"the connection ended after {got} of {size} bytes"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_to_end(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


class Upstream:
    """A listening socket on loopback whose connections `serve` handles, each in a thread."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.listening = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listening.getsockname()[1]
        self.serve = serve
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listening.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            self.serve(conn)

    def close(self) -> None:
        self.listening.shutdown(socket.SHUT_RDWR)
        self.listening.close()
        self.accepting.join(10)
        for thread in self.threads:
            thread.join(10)


def echo(conn: socket.socket) -> None:
    while data := conn.recv(1 << 16):
        conn.sendall(data)


@pytest.fixture
def relay_to() -> Iterator[Callable[..., tuple[DelayRelay, Upstream]]]:
    made: list[tuple[DelayRelay, Upstream]] = []

    def make(serve: Callable[[socket.socket], None] = echo, **kwargs: object) -> tuple[
            DelayRelay, Upstream]:
        upstream = Upstream(serve)
        relay = DelayRelay(listen="127.0.0.1:0", upstream=upstream.address, **kwargs)  # type: ignore[arg-type]
        relay.start()
        made.append((relay, upstream))
        return relay, upstream

    yield make
    for relay, upstream in made:
        relay.close()
        upstream.close()


def connect(relay: DelayRelay, source: str = "127.0.0.1") -> socket.socket:
    host, port = relay.address.split(":")
    return socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))


def test_bytes_pass_whole_in_order_and_no_earlier_than_the_latency_each_way(
        relay_to: Callable[..., tuple[DelayRelay, Upstream]]) -> None:
    relay, _ = relay_to(latencies={}, default=0.03)
    payload = os.urandom(4 << 20)
    with connect(relay) as sock:
        started = time.monotonic()
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        back = recv_exactly(sock, len(payload))
        elapsed = time.monotonic() - started
        sender.join()
    assert back == payload
    assert elapsed >= 0.06  # there and back, each way held 30 ms
    assert relay.links == [("127.0.0.1", 0.03)]


def test_every_relayed_socket_sends_at_once(
        relay_to: Callable[..., tuple[DelayRelay, Upstream]]) -> None:
    """TCP_NODELAY on both sides: Nagle's algorithm would hold a small write behind an
    unacknowledged one, for a delayed ACK's 40 ms."""
    relay, _ = relay_to(latencies={}, default=0.0)
    with connect(relay) as sock:
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        sockets = [side.transport.get_extra_info("socket") for side in relay._sides
                   if side.transport is not None]
        assert len(sockets) == 2
        assert all(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for s in sockets)


def test_the_latency_is_the_client_addresses_and_a_stranger_gets_the_default(
        relay_to: Callable[..., tuple[DelayRelay, Upstream]]) -> None:
    relay, _ = relay_to(latencies={"127.0.0.2": 0.05}, default=0.0)
    for source in ("127.0.0.2", "127.0.0.1"):
        with connect(relay, source) as sock:
            started = time.monotonic()
            sock.sendall(b"ping")
            assert recv_exactly(sock, 4) == b"ping"
            if source == "127.0.0.2":
                assert time.monotonic() - started >= 0.1
    assert relay.links == [("127.0.0.2", 0.05), ("127.0.0.1", 0.0)]


def test_ends_pass_through_after_the_bytes_before_them(
        relay_to: Callable[..., tuple[DelayRelay, Upstream]]) -> None:
    """A client that half-closes gets the upstream's answer, which it sends only once it saw
    the end, and then the upstream's own end."""
    def count_then_answer(conn: socket.socket) -> None:
        conn.sendall(str(len(recv_to_end(conn))).encode())

    relay, _ = relay_to(count_then_answer, latencies={}, default=0.01)
    with connect(relay) as sock:
        sock.sendall(b"x" * 300_000)
        sock.shutdown(socket.SHUT_WR)
        assert recv_to_end(sock) == b"300000"


def test_a_small_queue_throttles_the_sender_and_loses_nothing(
        relay_to: Callable[..., tuple[DelayRelay, Upstream]]) -> None:
    relay, _ = relay_to(latencies={}, default=0.002, max_queued_bytes=64 << 10)
    payload = os.urandom(8 << 20)
    with connect(relay) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(sock, len(payload)) == payload
        sender.join()


def test_a_client_whose_upstream_cannot_be_reached_is_closed() -> None:
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()  # nothing listens there now
    relay = DelayRelay(listen="127.0.0.1:0", upstream=f"127.0.0.1:{port}", latencies={})
    relay.start()
    try:
        with connect(relay) as sock:
            assert recv_to_end(sock) == b""
    finally:
        relay.close()


def test_close_ends_every_connection_and_the_thread(
        relay_to: Callable[..., tuple[DelayRelay, Upstream]]) -> None:
    relay, _ = relay_to(latencies={}, default=0.0)
    with connect(relay) as sock:
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        thread = relay._thread
        relay.close()
        assert thread is not None and not thread.is_alive()
        try:
            assert sock.recv(10) == b""
        except ConnectionResetError:
            pass  # aborted: what was held is dropped
    relay.close()  # twice is harmless


def test_curvezmq_passes_through_with_no_key_in_the_relay() -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    context = zmq.Context()
    server = context.socket(zmq.REP)
    client = context.socket(zmq.REQ)
    try:
        server.curve_server = True
        server.curve_publickey, server.curve_secretkey = server_public, server_secret
        port = server.bind_to_random_port("tcp://127.0.0.1")
        relay = DelayRelay(listen="127.0.0.1:0", upstream=f"127.0.0.1:{port}",
                           latencies={}, default=0.01)
        relay.start()
        try:
            client.curve_serverkey = server_public
            client.curve_publickey, client.curve_secretkey = client_public, client_secret
            for sock in (server, client):
                sock.rcvtimeo = sock.sndtimeo = 30_000
            client.connect(f"tcp://{relay.address}")
            client.send(b"x" * 200_000)
            assert server.recv() == b"x" * 200_000
            server.send(b"done")
            assert client.recv() == b"done"
            assert [address for address, _ in relay.links] == ["127.0.0.1"]
        finally:
            client.close(linger=0)
            relay.close()
    finally:
        server.close(linger=0)
        context.term()
