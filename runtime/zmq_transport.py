"""`ZmqTransport`: the Transport interface over ZeroMQ (pyzmq asyncio), for real runs.

Serving side: one ROUTER socket holding every `bind`; a message from a client arrives as
`[identity, *frames]` and the identity (the client's node name) is the peer to reply to.
`ROUTER_MANDATORY` makes a send to an identity that is not connected raise instead of vanishing,
and `ROUTER_HANDOVER` lets a restarted node reclaim its identity while the server still holds the
old, dead connection. Client side: one DEALER per `connect`ed endpoint, its routing id the node's
name; the endpoint string is that peer's name.

A reader task per socket moves incoming messages into one bounded inbox that `recv` takes from,
so a node that both serves and connects receives from all its sockets through one call. Frames
are sent with `copy=False`: pyzmq copies those under the socket's copy threshold and hands larger
ones to libzmq as they are (zero-copy); received frames are zero-copy memoryviews.

Every queue is bounded: the send and receive high-water marks (messages per peer), the inbox,
and the largest frame a peer may send (`MAXMSGSIZE`; libzmq drops a connection that exceeds it
before allocating the frame). Close uses LINGER `linger_ms` (0 by default) and terminates the context if this transport
created it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import zmq
import zmq.asyncio

from runtime.transport import (
    Inbound,
    Inbox,
    EndpointError,
    Frame,
    Transport,
    TransportClosed,
    TransportError,
    UnknownPeerError,
    check_node_name,
)

log = logging.getLogger(__name__)
_IDENTITY_ENCODING = ("utf-8", "surrogateescape")


def zmq_address(endpoint: str) -> str:
    """A ZeroMQ address for `endpoint`: programs name pservers ``host:port``, meaning TCP."""
    return endpoint if "://" in endpoint else f"tcp://{endpoint}"



@dataclass(frozen=True)
class ZmqLimits:
    """Bounds on what a `ZmqTransport` queues and accepts."""

    send_hwm: int = 1000
    """Messages queued per peer for sending before `send` waits."""
    recv_hwm: int = 1000
    """Messages libzmq queues per peer on the receiving side."""
    inbox: int = 1000
    """Messages received but not yet taken by `recv`."""
    max_frame_size: int = 1 << 30
    """Largest frame accepted from a peer (bytes); a peer sending more is disconnected."""
    copy_threshold: int = zmq.COPY_THRESHOLD
    """Frames smaller than this (bytes) are copied on send; larger ones go zero-copy."""
    io_threads: int = 1
    """libzmq IO threads of a context this transport creates."""
    linger_ms: int = 0
    """How long `close` lets queued messages go out (ms); a server's last replies need some."""

    def __post_init__(self) -> None:
        for field, value in vars(self).items():
            minimum = 0 if field in ("copy_threshold", "linger_ms") else 1
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"ZmqLimits.{field} must be an int >= {minimum}, got {value!r}")


class ZmqTransport(Transport):
    """Transport over ZeroMQ ROUTER (served endpoints) and DEALER (connected endpoints) sockets."""

    def __init__(
        self,
        name: str,
        limits: ZmqLimits | None = None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.name = check_node_name(name)
        self.limits = limits or ZmqLimits()
        self._owns_context = context is None
        self._context = context or zmq.asyncio.Context(io_threads=self.limits.io_threads)
        self._router: zmq.asyncio.Socket | None = None
        self._dealers: dict[str, zmq.asyncio.Socket] = {}
        self._readers: list[asyncio.Task[None]] = []
        self._inbox = Inbox(self.limits.inbox)
        self._closed = False

    @property
    def sockets(self) -> list[zmq.asyncio.Socket]:
        """The sockets this transport opened (the ROUTER first, if any)."""
        router = [self._router] if self._router is not None else []
        return router + list(self._dealers.values())

    async def bind(self, endpoint: str) -> str:
        self._check_open("bind")
        router = self._router or self._open_router()
        try:
            router.bind(zmq_address(endpoint))
        except zmq.ZMQError as exc:
            raise EndpointError(self.name, endpoint, exc.strerror) from exc
        return router.getsockopt_string(zmq.LAST_ENDPOINT)

    async def connect(self, endpoint: str) -> None:
        self._check_open("connect")
        if endpoint in self._dealers:
            raise EndpointError(self.name, endpoint, "already connected")
        dealer = self._socket(zmq.DEALER)
        dealer.setsockopt(zmq.ROUTING_ID, self.name.encode())
        try:
            dealer.connect(zmq_address(endpoint))
        except zmq.ZMQError as exc:
            dealer.close(linger=0)
            raise EndpointError(self.name, endpoint, exc.strerror) from exc
        self._dealers[endpoint] = dealer
        self._start_reader(dealer, endpoint)

    async def send(self, peer: str, frames: Sequence[Frame]) -> None:
        self._check_open("send")
        if not frames:
            raise ValueError(f"node {self.name!r}: a message to {peer!r} needs at least one frame")
        socket, parts = self._route(peer, frames)
        try:
            await socket.send_multipart(parts, copy=False)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise UnknownPeerError(self.name, peer) from exc
            if self._closed:
                raise TransportClosed(self.name, "send") from exc
            raise TransportError(f"node {self.name!r}: sending to {peer!r}: {exc}") from exc

    def send_nowait(self, peer: str, frames: Sequence[Frame]) -> bool:
        """Send now, from the caller, without a coroutine: pyzmq's asyncio socket hands the
        message to libzmq at once when the socket can take it (its high-water mark not reached,
        no earlier send waiting), and else queues it behind the earlier ones, in order; a send
        queued that later fails is logged (the RPC layer resends what is not answered). Sending
        from the caller, rather than from a task that runs when the caller next yields, lets
        a trainer's gradients leave while it goes on computing."""
        self._check_open("send")
        if not frames:
            raise ValueError(f"node {self.name!r}: a message to {peer!r} needs at least one frame")
        socket, parts = self._route(peer, frames)
        sent = cast("asyncio.Future[Any]", socket.send_multipart(parts, copy=False))
        if not sent.done():
            sent.add_done_callback(self._log_failed_send(peer))
            return True
        exc = sent.exception()
        if exc is not None:
            raise self._send_error(peer, exc)
        return True

    def _send_error(self, peer: str, exc: BaseException) -> BaseException:
        if isinstance(exc, zmq.ZMQError):
            if exc.errno == zmq.EHOSTUNREACH:
                return UnknownPeerError(self.name, peer)
            if self._closed:
                return TransportClosed(self.name, "send")
            return TransportError(f"node {self.name!r}: sending to {peer!r}: {exc}")
        return exc

    def _log_failed_send(self, peer: str) -> Callable[[asyncio.Future[Any]], None]:
        def check(sent: asyncio.Future[Any]) -> None:
            if not sent.cancelled() and sent.exception() is not None:
                log.warning("%s: a queued message to %s was not sent: %s", self.name, peer,
                            self._send_error(peer, sent.exception()))  # type: ignore[arg-type]
        return check

    async def recv(self) -> Inbound:
        self._check_open("recv")
        return await self._inbox.get()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for socket in self.sockets:
            socket.close(linger=self.limits.linger_ms)
        if self._owns_context:
            self._context.term()
        self._fail_waiters(TransportClosed(self.name, "recv"))

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise TransportClosed(self.name, operation)

    def _route(self, peer: str, frames: Sequence[Frame]) -> tuple[zmq.asyncio.Socket, list[Frame]]:
        dealer = self._dealers.get(peer)
        if dealer is not None:
            return dealer, list(frames)
        if self._router is None:
            raise UnknownPeerError(self.name, peer)
        return self._router, [peer.encode(*_IDENTITY_ENCODING), *frames]

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, self.limits.send_hwm)
        socket.setsockopt(zmq.RCVHWM, self.limits.recv_hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, self.limits.max_frame_size)
        socket.copy_threshold = self.limits.copy_threshold
        return socket

    def _open_router(self) -> zmq.asyncio.Socket:
        router = self._socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._router = router
        self._start_reader(router, None)
        return router

    def _start_reader(self, socket: zmq.asyncio.Socket, endpoint: str | None) -> None:
        name = f"{self.name} <- {endpoint or 'clients'}"
        self._readers.append(asyncio.create_task(self._read(socket, endpoint), name=name))

    async def _read(self, socket: zmq.asyncio.Socket, endpoint: str | None) -> None:
        """Move messages from `socket` into the inbox; `endpoint` None means the ROUTER."""
        try:
            while True:
                parts = await socket.recv_multipart(copy=False)
                if endpoint is None:
                    peer = parts[0].bytes.decode(*_IDENTITY_ENCODING)
                    parts = parts[1:]
                else:
                    peer = endpoint
                await self._inbox.put((peer, [part.buffer for part in parts]))
        except zmq.ZMQError as exc:
            source = endpoint or "its clients"
            error = TransportError(f"node {self.name!r}: receiving from {source}: {exc}")
            self._fail_waiters(error)

    def _fail_waiters(self, error: TransportError) -> None:
        """Replace whatever the inbox holds by `error`, which every `recv` then raises."""
        self._inbox.fail(error)
