"""`ZmqTransport`: the Transport interface over ZeroMQ, driven from the event loop, for real runs.

Serving side: one ROUTER socket holding every `bind`; a message from a client arrives as
`[identity, *frames]` and the identity (the client's node name) is the peer to reply to.
`ROUTER_MANDATORY` makes a send to an identity that is not connected raise instead of vanishing,
and `ROUTER_HANDOVER` lets a restarted node reclaim its identity while the server still holds the
old, dead connection. Client side: one DEALER per `connect`ed endpoint, its routing id the node's
name; the endpoint string is that peer's name.

Plain (blocking-API) pyzmq sockets, driven by the loop: each socket's notification FD is
registered with `loop.add_reader`; when it fires, the transport reads the socket's events and
receives with NOBLOCK until the socket is empty, handing each message to the `deliver_to`
handler or into one bounded inbox that `recv` takes from (so a node that both serves and
connects receives from all its sockets through one call). A send goes to libzmq at once, from
the caller, when libzmq can take it; otherwise it waits in a queue for its peer that the next
readiness event flushes, in order. A ROUTER's peers queue apart (libzmq refuses a message to a
peer whose queue is full while the others take theirs): a client that stops reading holds back
its own replies only, never those to every other client. Frames are sent with `copy=False`:
pyzmq copies those under the socket's copy threshold and hands larger ones to libzmq as they
are (zero-copy); received frames are zero-copy memoryviews, and a received frame sent on (a
tensor decoded from it, unchanged) goes back to libzmq by reference (`_received`).

DESIGN: this replaces `zmq.asyncio`, whose per-call futures, poller bookkeeping and enum flag
arithmetic cost more CPU per small message than pslab's whole encode/decode. ZeroMQ's FD is
edge-triggered and a send may consume the edge that announced incoming messages, so after
every send the socket's events are read again and a drain scheduled if input is waiting.

Every queue is bounded: the send and receive high-water marks (messages per peer), the sends
waiting for a peer (`send_hwm` more; `send_nowait` drops and counts the rest in `unsent`), the
inbox (messages and bytes), the largest frame a peer may send (`MAXMSGSIZE`; libzmq drops a
connection that exceeds it before allocating the frame), and a message's frame count and total
size, summed as its frames are read: libzmq only bounds frames, so a message over either limit
is read to its end and dropped (logged, counted in `dropped`), never handed on. Close uses
LINGER `linger_ms` (100 by default) and terminates the context if this transport created it.

Local sockets (`runtime.network.local_sockets`): given an ``ipc_dir``, every endpoint is the
Unix socket of its name in that directory (`ZmqTransport.address`), whose mode 0700 admits only
the job's user; the endpoint stays the peer's name.

Security (`runtime.network.curve`): with `CurveKeys`, the ROUTER is a CURVE server that admits
only the job's client keys (a `ZapHandler` on the loop answers its context's ZAP requests), and
each DEALER a CURVE client of its endpoint's server key: every byte is encrypted and
authenticated. A message's peer is then its connection's key owner, not merely the routing id
the client chose: a message whose routing id is not its key's owner (a trainer's key claiming
another trainer's name) is dropped and counted in `impostors`, the handshakes ZAP refused in
`unauthenticated`. An authenticated client's routing id is its name and a secret token drawn
afresh by each transport (`own_routing_id`), which travels only inside the encrypted
handshake; the server replies to the routing id a name's owner last spoke under. DESIGN: a
ROUTER routes by routing id, and with ROUTER_HANDOVER (which a restarted node needs to reclaim
its name while the server still holds its dead connection) a connection that claims a routing
id in use takes over its replies at once, before any message could be checked; without
handover libzmq would read a duplicate's first message as its routing id. With the token
nobody but the owner can name its routing id: another key holder claiming ``trainer:1`` gets
a routing id of its own, its messages dropped, and ``trainer:1``'s replies go on reaching it;
a restarted node comes back under a new token, handover not needed. A client whose
key's owner is `runtime.network.curve.RELAY` (a pserver's fault proxy, holding the pserver's
own key) may send under any routing id: it checked its own clients' keys.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import zmq

from runtime.network.curve import RELAY, CurveKeys, ZapHandler, make_client, make_server
from runtime.network.local_sockets import ipc_address
from runtime.network.refusals import RefusalLog
from runtime.network.transport import (MAX_NAME_BYTES, Inbound, Inbox, EndpointError, Frame,
                                       Transport, TransportClosed, TransportError,
                                       UnknownPeerError, check_node_name)

log = logging.getLogger(__name__)
_IDENTITY_ENCODING = ("utf-8", "surrogateescape")
TOKEN_SEPARATOR = b"\0"
"""Between a node's name and its secret token in an authenticated client's routing id."""
TOKEN_BYTES = 8
"""Random bytes of that token (sent as hex)."""


def own_routing_id(name: str, authenticated: bool) -> bytes:
    """The routing id a client named `name` connects with: its name, and under CURVE its name,
    `TOKEN_SEPARATOR` and a token drawn afresh for this transport, which travels only inside the
    encrypted handshake (a name too long to take one goes without)."""
    plain = name.encode(*_IDENTITY_ENCODING)
    token = secrets.token_hex(TOKEN_BYTES).encode()
    if not authenticated or len(plain) + len(TOKEN_SEPARATOR) + len(token) > MAX_NAME_BYTES:
        return plain
    return plain + TOKEN_SEPARATOR + token


def name_in(routing_id: bytes) -> str:
    """The node name in an authenticated client's routing id (all of it without a token)."""
    name, sep, _ = routing_id.rpartition(TOKEN_SEPARATOR)
    return (name if sep else routing_id).decode(*_IDENTITY_ENCODING)


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
    max_message_size: int = 1 << 30
    """Largest message (all its frames) accepted from a peer (bytes); a larger one is dropped
    as its frames are read, before it reaches `recv`. `MAXMSGSIZE` (per frame) is the smaller
    of this and `max_frame_size`."""
    max_frames: int = 1 << 16
    """Most frames a message may have; one with more is dropped as its frames are read."""
    inbox_bytes: int = 1 << 30
    """Bytes of received messages held for `recv` before receiving waits (besides `inbox`)."""
    copy_threshold: int = 256 * 1024
    """Frames smaller than this (bytes) are copied on send; larger ones go zero-copy.

    DESIGN: a zero-copy frame costs a tracked `zmq.Frame` whose buffer pyzmq's garbage-collection
    thread releases once libzmq is done with it; copying is the cheaper of the two up to a few
    hundred KiB. Measured with raw pyzmq over loopback TCP (client CPU per echo round trip,
    least of 7 interleaved runs): 72 KiB 127 -> 101 us, 128 KiB 133 -> 105 us, 200 KiB
    143 -> 134 us with 256 KiB instead of pyzmq's 64 KiB; at 512 KiB zero-copy is the cheaper
    (124 against 169 us copied)."""
    io_threads: int = 1
    """libzmq IO threads of a context this transport creates."""
    linger_ms: int = 100
    """How long `close` lets queued messages go out (ms): a trainer's last message (BYE) is
    sent just before it closes, a server's last replies need more. It waits only while a
    message is still queued (a peer gone, or a slow link)."""

    def __post_init__(self) -> None:
        for field, value in vars(self).items():
            minimum = 0 if field in ("copy_threshold", "linger_ms") else 1
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"ZmqLimits.{field} must be an int >= {minimum}, got {value!r}")


_Waiting = deque[tuple[list[Any], "asyncio.Future[None] | None"]]
"""Messages to one peer (each with the future of an awaiting `send`) waiting for room."""


class _Socket:
    """One ZeroMQ socket the transport drives: its FD, its sends waiting for room by peer."""

    __slots__ = ("zmq", "endpoint", "fd", "waiting", "paused", "scheduled", "input", "either")

    def __init__(self, socket: zmq.Socket[Any], endpoint: str | None) -> None:
        self.zmq = socket
        self.endpoint = endpoint
        """The connected endpoint (the peer of every message received); None for the ROUTER."""
        self.fd = cast(int, socket.getsockopt(zmq.FD))
        self.waiting: dict[str, _Waiting] = {}
        """Peer -> its messages waiting for room, in order (no entry: none waits). A ROUTER's
        peers wait apart: libzmq refuses a message to a peer whose queue is full (EAGAIN)
        while others still take theirs, so a peer that stops reading holds back only its own."""
        self.paused = False
        """The inbox is full: receiving waits until `recv` takes something."""
        self.scheduled = False
        """A readiness check is already scheduled on the loop."""
        self.input = ((socket, _POLLIN),)
        """`_ready(socket.input)`: whether a message waits to be received."""
        self.either = ((socket, _POLLIN | _POLLOUT),)
        """`_events(socket)`'s poll item."""


# ints, not pyzmq's IntFlag members: flag arithmetic on enum members costs microseconds a call
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_ready = zmq.zmq_poll
"""`_ready(items, 0)`: the sockets of `items` (poll items) that have the events asked for.
DESIGN: a socket's events are read three times a message; `zmq_poll` with no timeout reads
ZMQ_EVENTS (which also clears the socket's FD) in C, where `socket.get(zmq.EVENTS)` first
makes a `SocketOption` of the int, two Python calls in `enum`."""


def _events(socket: _Socket) -> int:
    """The socket's POLLIN / POLLOUT bits; reading them also clears its FD."""
    ready = _ready(socket.either, 0)
    return ready[0][1] if ready else 0  # type: ignore[no-any-return]


_send_part = zmq.backend.Socket.send
"""pyzmq's send itself, called as `_send_part(socket, frame, flags, False)` (copy=False): the
`zmq.Socket.send` wrapper above it only adds routing-id and group arguments (DRAFT sockets),
which cost a Python call per frame."""


def _received(view: memoryview) -> memoryview | zmq.Frame:
    """The received ZeroMQ frame that `view` covers whole (through the arrays decoded from
    it), or `view` itself. A frame sent on by reference goes back to libzmq as another
    reference to the same message (`zmq_msg_copy`): neither copied nor wrapped in a new
    zero-copy frame, which pyzmq keeps alive through its garbage-collection thread until
    libzmq is done with it. DESIGN: a contiguous view with as many bytes as the frame it lies
    in is that whole frame, whatever arrays stand between them."""
    owner = view.obj
    while type(owner) is np.ndarray:
        owner = owner.base
    if type(owner) is memoryview and type(owner.obj) is zmq.Frame \
            and owner.nbytes == view.nbytes and view.c_contiguous:
        return owner.obj
    return view


_buffer = operator.attrgetter("buffer")
"""A received frame's zero-copy memoryview."""

_BATCH = 256
"""Messages received per readiness event before other callbacks get a turn."""


class ZmqTransport(Transport):
    """Transport over ZeroMQ ROUTER (served endpoints) and DEALER (connected endpoints) sockets."""

    def __init__(
        self,
        name: str,
        limits: ZmqLimits | None = None,
        context: zmq.Context[Any] | None = None,
        curve: CurveKeys | None = None,
        ipc_dir: Path | None = None,
    ) -> None:
        self.name = check_node_name(name)
        self.ipc_dir = ipc_dir
        """Where endpoints are Unix sockets (`runtime.network.local_sockets`); none: TCP."""
        self.limits = limits or ZmqLimits()
        self._owns_context = context is None
        # a context made for asyncio sockets is shadowed: the same libzmq context, plain sockets
        self._context: zmq.Context[Any] = (zmq.Context(io_threads=self.limits.io_threads)
                                           if context is None else zmq.Context.shadow(context))
        self._router: _Socket | None = None
        self._dealers: dict[str, _Socket] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox = Inbox(self.limits.inbox)
        self._handler: Callable[[str, list[Frame]], None] | None = None
        self._closed = False
        self.curve = curve
        self.authenticated = curve is not None
        self._zap: ZapHandler | None = None
        self._routing_id = own_routing_id(self.name, curve is not None)
        self._routes: dict[str, bytes] = {}
        """An authenticated server's clients: name -> the routing id it last spoke under."""
        self.impostors = 0
        """Messages dropped: their routing id was not the name their key belongs to."""
        self._held: deque[int] = deque()
        """Bytes of each message in the inbox, in order (`recv` takes from the front)."""
        self._held_bytes = 0
        self._paused: list[_Socket] = []
        """Sockets whose receiving waits for room in the inbox."""
        self.dropped = 0
        """Messages dropped for breaking `max_frames` or `max_message_size`."""
        self.refusals = RefusalLog(log, name)
        """Those drops, logged so that no peer floods the log."""
        self.unsent = 0
        """Messages `send_nowait` dropped: `send_hwm` messages already waited for the peer."""

    def address(self, endpoint: str) -> str:
        """The ZeroMQ address of the node named by `endpoint`: its socket in `ipc_dir`, else
        TCP."""
        if self.ipc_dir is not None:
            return ipc_address(self.ipc_dir, endpoint)
        return zmq_address(endpoint)

    @property
    def unauthenticated(self) -> int:
        """Connections refused at the handshake: their key is not one of the job's."""
        return 0 if self._zap is None else self._zap.refused

    @property
    def sockets(self) -> list[zmq.Socket[Any]]:
        """The sockets this transport opened (the ROUTER first, if any)."""
        router = [self._router.zmq] if self._router is not None else []
        return router + [dealer.zmq for dealer in self._dealers.values()]

    async def bind(self, endpoint: str) -> str:
        return self.bind_nowait(endpoint)

    def bind_nowait(self, endpoint: str) -> str:
        """`bind`, done before it returns: libzmq makes the listening socket in the calling
        thread (in its network namespace, for a caller that entered one)."""
        self._check_open("bind")
        router = self._router or self._open_router()
        try:
            router.zmq.bind(self.address(endpoint))
        except zmq.ZMQError as exc:
            raise EndpointError(self.name, endpoint, exc.strerror) from exc
        return router.zmq.getsockopt_string(zmq.LAST_ENDPOINT)

    async def connect(self, endpoint: str) -> None:
        self.connect_nowait(endpoint)

    def connect_nowait(self, endpoint: str) -> None:
        """`connect`, from a caller that cannot wait (it never needs to: libzmq connects in
        the background)."""
        self._check_open("connect")
        if endpoint in self._dealers:
            raise EndpointError(self.name, endpoint, "already connected")
        dealer = self._socket(zmq.DEALER)
        dealer.setsockopt(zmq.ROUTING_ID, self._routing_id)
        try:
            if self.curve is not None:
                make_client(dealer, self.curve, endpoint)
            dealer.connect(self.address(endpoint))
        except zmq.ZMQError as exc:
            dealer.close(linger=0)
            raise EndpointError(self.name, endpoint, exc.strerror) from exc
        try:
            self._dealers[endpoint] = self._drive(dealer, endpoint)
        except BaseException:
            dealer.close(linger=0)  # else the context could never terminate
            raise

    async def send(self, peer: str, frames: Sequence[Frame]) -> None:
        socket, parts = self._route(peer, frames)
        if peer not in socket.waiting and self._send_now(socket, peer, parts):
            return
        waiter = self._running_loop().create_future()
        self._wait(socket, peer, parts, waiter)
        await waiter

    def send_nowait(self, peer: str, frames: Sequence[Frame]) -> bool:
        """Send now, from the caller, without a coroutine: the message goes to libzmq at once
        when it can take it (the peer's high-water mark not reached, no earlier send to the
        peer waiting), and else waits behind the earlier ones, in order; a waiting send that
        later fails is logged. With `send_hwm` messages already waiting for the peer (it does
        not read), the message is dropped and counted in `unsent`: the RPC layer resends what
        is not answered, and a server's memory does not grow with a peer that never reads.
        Sending from the caller, rather than from a task that runs when the caller next
        yields, lets a trainer's gradients leave while it goes on computing."""
        socket, parts = self._route(peer, frames)
        waiting = socket.waiting.get(peer)
        if waiting is None:
            if self._send_now(socket, peer, parts):
                return True
        elif len(waiting) >= self.limits.send_hwm:
            self.unsent += 1
            if self.unsent & (self.unsent - 1) == 0:  # the 1st, 2nd, 4th, ...: no log flood
                log.warning("%s: dropped a message to %s, which is not reading: %d messages "
                            "wait for it (%d dropped so far)", self.name, peer, len(waiting),
                            self.unsent)
            return True
        self._wait(socket, peer, parts, None)
        return True

    def _wait(self, socket: _Socket, peer: str, parts: list[Any],
              waiter: asyncio.Future[None] | None) -> None:
        """Queue a message to `peer` until the socket has room for it."""
        waiting = socket.waiting.get(peer)
        if waiting is None:
            waiting = socket.waiting[peer] = deque()
        waiting.append((parts, waiter))
        self._schedule(socket)

    def deliver_to(self, handler: Callable[[str, list[Frame]], None]) -> bool:
        self._check_open("deliver")
        self._handler = handler
        return True

    async def recv(self) -> Inbound:
        if self._closed:
            raise TransportClosed(self.name, "recv")
        inbound = await self._inbox.get()
        if self._held:
            self._held_bytes -= self._held.popleft()
        if self._paused:
            self._resume_paused()
        return inbound

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.refusals.flush()
        closed = TransportClosed(self.name, "send")
        for socket in self._all():
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(socket.fd)
            for waiting in socket.waiting.values():
                for _, waiter in waiting:
                    if waiter is not None and not waiter.done():
                        waiter.set_exception(closed)
            socket.waiting.clear()
            socket.zmq.close(linger=self.limits.linger_ms)
        if self._zap is not None:
            self._zap.close()
        if self._owns_context:
            self._context.term()
        self._fail_waiters(TransportClosed(self.name, "recv"))

    # -- sending --------------------------------------------------------------------------

    def _send_now(self, socket: _Socket, peer: str, parts: list[Any]) -> bool:
        """Hand `parts` to libzmq if the socket can take them now; False: no room (EAGAIN)."""
        sock = socket.zmq
        last = len(parts) - 1
        try:  # once the first part is taken, libzmq takes the rest: a message goes whole or not
            _send_part(sock, parts[0], _MORE_NOBLOCK if last else _NOBLOCK, False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            # failed or not, the send may have consumed the FD's edge for waiting input
            self._schedule(socket)
            raise self._send_error(peer, exc) from exc
        for i in range(1, last):
            _send_part(sock, parts[i], _MORE_NOBLOCK, False)
        if last:
            _send_part(sock, parts[last], _NOBLOCK, False)
        if _ready(socket.input, 0):
            self._schedule(socket)  # the send may have consumed the FD's edge for waiting input
        return True

    def _flush(self, socket: _Socket) -> None:
        """Send what waits for room, each peer's in order, while libzmq takes the peer's."""
        for peer, waiting in list(socket.waiting.items()):
            while waiting:
                parts, waiter = waiting[0]
                if waiter is not None and waiter.done():  # its `send` was cancelled
                    waiting.popleft()
                    continue
                try:
                    if not self._send_now(socket, peer, parts):
                        break
                except TransportError as exc:
                    waiting.popleft()
                    self._send_failed(peer, waiter, exc)
                    continue
                waiting.popleft()
                if waiter is not None:
                    waiter.set_result(None)
            if not waiting:
                del socket.waiting[peer]

    def _send_failed(self, peer: str, waiter: asyncio.Future[None] | None,
                     exc: BaseException) -> None:
        if waiter is not None:
            waiter.set_exception(exc)
        else:
            log.warning("%s: a queued message to %s was not sent: %s", self.name, peer, exc)

    def _send_error(self, peer: str, exc: zmq.ZMQError) -> TransportError:
        if exc.errno == zmq.EHOSTUNREACH:
            return UnknownPeerError(self.name, peer)
        if self._closed:
            return TransportClosed(self.name, "send")
        return TransportError(f"node {self.name!r}: sending to {peer!r}: {exc}")

    # -- receiving ------------------------------------------------------------------------

    def _schedule(self, socket: _Socket) -> None:
        """Check the socket's readiness soon (once, however often asked before it runs)."""
        if not socket.scheduled and not self._closed:
            socket.scheduled = True
            self._running_loop().call_soon(self._on_ready, socket)

    def _on_ready(self, socket: _Socket) -> None:
        """The socket's FD fired (or a check was scheduled): flush waiting sends, then receive."""
        socket.scheduled = False
        if self._closed:
            return
        try:
            events = _events(socket)
            if events & _POLLOUT and socket.waiting:
                self._flush(socket)
                events = _events(socket)
            if events & _POLLIN and not socket.paused:
                self._drain(socket)
        except zmq.ZMQError as exc:
            source = socket.endpoint or "its clients"
            error = TransportError(f"node {self.name!r}: receiving from {source}: {exc}")
            log.error("%s", error)  # a `deliver_to` node has no recv to raise it from
            self._fail_waiters(error)

    def _drain(self, socket: _Socket) -> None:
        """Receive while the socket has input (asking its events, which is cheaper than the
        exception an empty NOBLOCK receive raises), up to a batch, then give other callbacks a
        turn if more waits."""
        inbox, limit = self._inbox, self.limits.inbox_bytes
        for _ in range(_BATCH):
            handler = self._handler
            if handler is None and (inbox.full() or self._held_bytes >= limit):
                socket.paused = True
                self._paused.append(socket)
                return
            message = self._read_message(socket)
            if message is not None:
                peer, frames, size = message
                if handler is not None:
                    handler(peer, frames)
                else:
                    inbox.put_nowait((peer, frames))
                    self._held.append(size)
                    self._held_bytes += size
            if not _ready(socket.input, 0):
                return
        self._schedule(socket)

    def _owned(self, peer: str, owner: str | None) -> bool:
        """Whether the routing id `peer` is `owner`, the owner of the key the message came
        with (its ZAP User-Id); if not, the message is dropped and counted."""
        if owner == peer or owner == RELAY:  # a relay (fault proxy) speaks for its clients
            return True
        self.impostors += 1
        if self.impostors & (self.impostors - 1) == 0:  # the 1st, 2nd, 4th, ...: no log flood
            log.warning("%s: dropped a message from routing id %r sent with the key of %r "
                        "(%d such so far)", self.name, peer, owner, self.impostors)
        return False

    def _read_message(self, socket: _Socket) -> tuple[str, list[Frame], int] | None:
        """Read one whole message (libzmq has all its frames once the first is readable): its
        peer, frames and bytes; None if it breaks `max_frames` or `max_message_size` (counted
        as the frames are read, which are then freed, not kept) or, on an authenticated
        server, its routing id is not the owner of its key."""
        sock, limits = socket.zmq, self.limits
        max_frames, max_size = limits.max_frames, limits.max_message_size
        frame = sock.recv(_NOBLOCK, False)
        identity = b""
        if socket.endpoint is None:  # ROUTER: the first frame is the sender's identity
            identity = frame.bytes
            peer = (name_in(identity) if self.curve is not None
                    else identity.decode(*_IDENTITY_ENCODING))
            parts: list[Any] = []
            size = count = 0
        else:
            peer, parts, size, count = socket.endpoint, [frame], len(frame), 1
        more = frame.more
        while more:
            frame = sock.recv(_NOBLOCK, False)
            size += len(frame)
            count += 1
            more = frame.more
            if count <= max_frames and size <= max_size:
                parts.append(frame)
            else:
                parts.clear()
        if count > max_frames or size > max_size:
            self._dropped(peer, size, count)
            return None
        if socket.endpoint is None and self.curve is not None:  # ZAP metadata: servers only
            owner = parts[0].get("User-Id") if parts else None
            if not self._owned(peer, owner):
                return None
            self._routes[peer] = identity
        return peer, list(map(_buffer, parts)), size

    def _dropped(self, peer: str, size: int, count: int) -> None:
        self.dropped += 1
        self.refusals.refused(peer, "too_large", f"dropped a message of {size} bytes in {count} "
                              f"frames from {peer[:64]!r} (limits: "
                              f"{self.limits.max_message_size} bytes, "
                              f"{self.limits.max_frames} frames)")

    def _resume_paused(self) -> None:
        for socket in self._paused:
            socket.paused = False
            self._schedule(socket)
        self._paused.clear()

    # -- sockets --------------------------------------------------------------------------

    def _all(self) -> list[_Socket]:
        router = [self._router] if self._router is not None else []
        return router + list(self._dealers.values())

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise TransportClosed(self.name, operation)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _route(self, peer: str, frames: Sequence[Frame]) -> tuple[_Socket, list[Any]]:
        """The socket that reaches `peer` and the parts to send it `frames` as."""
        if self._closed:
            raise TransportClosed(self.name, "send")
        if not frames:
            raise ValueError(f"node {self.name!r}: a message to {peer!r} needs at least one frame")
        dealer = self._dealers.get(peer)
        parts = [_received(frame) if type(frame) is memoryview else frame for frame in frames]
        if dealer is not None:
            return dealer, parts
        if self._router is None:
            raise UnknownPeerError(self.name, peer)
        parts.insert(0, self._routes.get(peer) or peer.encode(*_IDENTITY_ENCODING))
        return self._router, parts

    def _socket(self, kind: int) -> zmq.Socket[Any]:
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, self.limits.send_hwm)
        socket.setsockopt(zmq.RCVHWM, self.limits.recv_hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, min(self.limits.max_frame_size,
                                              self.limits.max_message_size))
        socket.copy_threshold = self.limits.copy_threshold
        return socket

    def _open_router(self) -> _Socket:
        if self.curve is not None:  # its handler first: no handshake may go unanswered
            self._zap = ZapHandler(self._context, self.curve.clients, self.name)
            self._zap.start(self._running_loop())
        router = self._socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if self.curve is not None:
            make_server(router, self.curve)
        self._router = self._drive(router, None)
        return self._router

    def _drive(self, socket: zmq.Socket[Any], endpoint: str | None) -> _Socket:
        """Register the socket's FD with the loop, and look once for what is already there."""
        watched = _Socket(socket, endpoint)
        self._running_loop().add_reader(watched.fd, self._on_ready, watched)
        self._schedule(watched)
        return watched

    def _fail_waiters(self, error: TransportError) -> None:
        """Replace whatever the inbox holds by `error`, which every `recv` then raises."""
        self._inbox.fail(error)
