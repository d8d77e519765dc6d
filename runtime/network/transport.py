"""The Transport interface: how a node moves opaque frames to and from its peers.

A transport knows nothing of tensors or the PS protocol; it moves *messages*, each a list of
frames (byte buffers), between named nodes. The same runtime code runs over `ZmqTransport` for
real and over the simulator's transport on a virtual clock, so the interface is small and its
semantics are pinned down by one contract suite (`tests/support/transport_contract.py`):

- A node has a `name`, its identity on the wire (`check_node_name` says which are valid). It
  may `bind` endpoints to serve and `connect` to endpoints other nodes bound, in any order: a
  message sent before the server binds is queued and delivered once it does.
- Peer identity: `recv()` returns `(peer, frames)`. A message from a node that connected to us
  comes from peer = that node's `name`; a message on a connection *we* opened comes from peer =
  the endpoint string we passed to `connect`. Replying is `send(peer, ...)` with the peer `recv`
  gave, so a server replies to a client's name and a client talks to an endpoint.
- Messages between two nodes arrive whole and in the order sent; nothing is dropped silently:
  sending to a peer the transport cannot route raises `UnknownPeerError`.
- `send` takes ownership of the frames' buffers until they are delivered (zero-copy transports
  read them later): the caller must not mutate them after the call.
- After `close()`, `send` and `recv` raise `TransportClosed`, and a `recv` waiting at that moment
  is woken with it.
- Fast paths, optional (the simulator has them; a transport without them says False):
  `send_nowait` sends without a coroutine, `deliver_to` hands messages to a callback instead
  of `recv`. Semantics are otherwise the same.
- Time: implementations wait only through the running asyncio loop, never the wall clock, so a
  virtual-time loop can drive them; timeouts are the caller's (`asyncio.wait_for`).
"""

from __future__ import annotations

import abc
import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Self

Frame = bytes | bytearray | memoryview
"""One frame of a message: a contiguous byte buffer."""


class TransportError(Exception):
    """Base of the errors a transport raises."""


class TransportClosed(TransportError):
    """The transport was closed; it cannot send or receive any more."""

    def __init__(self, name: str, operation: str) -> None:
        super().__init__(f"transport of node {name!r} is closed: cannot {operation}")
        self.name = name
        self.operation = operation


class UnknownPeerError(TransportError):
    """A message was addressed to a peer the transport cannot route to."""

    def __init__(self, name: str, peer: str) -> None:
        super().__init__(
            f"node {name!r} cannot route to peer {peer!r}: not connected to that endpoint "
            "and no node of that name is connected here"
        )
        self.name = name
        self.peer = peer


class EndpointError(TransportError):
    """An endpoint could not be bound or connected (bad address, address in use, ...)."""

    def __init__(self, name: str, endpoint: str, reason: str) -> None:
        super().__init__(f"node {name!r}: endpoint {endpoint!r}: {reason}")
        self.name = name
        self.endpoint = endpoint
        self.reason = reason


MAX_NAME_BYTES = 255


def check_node_name(name: str) -> str:
    """Return `name` if it can identify a node on the wire, else raise ValueError saying why.

    Names are 1..255 bytes of UTF-8, do not start with NUL (ZeroMQ reserves those identities)
    and never contain "://", so a node name can never be mistaken for an endpoint peer.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"node name must be a non-empty str, got {name!r}")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"node name {name!r} is longer than {MAX_NAME_BYTES} bytes of UTF-8")
    if name.startswith("\0"):
        raise ValueError(f"node name {name!r} starts with NUL, reserved for generated identities")
    if "://" in name:
        raise ValueError(f"node name {name!r} contains '://', reserved for endpoints")
    return name


class Transport(abc.ABC):
    """Moves messages (lists of frames) between this node and its peers; see the module doc."""

    name: str
    authenticated: bool = False
    """Whether a message's peer is proven (by its key), not merely the name it gave."""

    @abc.abstractmethod
    async def bind(self, endpoint: str) -> str:
        """Serve on `endpoint`; return the endpoint actually bound (a chosen port filled in)."""

    @abc.abstractmethod
    async def connect(self, endpoint: str) -> None:
        """Open a connection to the node serving `endpoint`; afterwards it is a peer name."""

    @abc.abstractmethod
    async def send(self, peer: str, frames: Sequence[Frame]) -> None:
        """Send one message to `peer` (a connected endpoint or a name `recv` returned)."""

    @abc.abstractmethod
    async def recv(self) -> tuple[str, list[Frame]]:
        """Wait for the next message from any peer; return `(peer, frames)`."""

    def send_nowait(self, peer: str, frames: Sequence[Frame]) -> bool:
        """Send as `send` does if that needs no wait, and return True; False (nothing sent):
        this transport cannot, `await send(...)` instead. Errors are `send`'s."""
        return False

    def deliver_to(self, handler: Callable[[str, list[Frame]], None]) -> bool:
        """Hand every later message to `handler(peer, frames)` the moment it arrives, in
        order, instead of keeping it for `recv`, and return True; False: this transport
        cannot (use `recv`). A handler must not block; what it raises is the transport's
        caller's bug and propagates to the loop."""
        return False

    @abc.abstractmethod
    async def close(self) -> None:
        """Release every connection; later calls to `send`/`recv` raise `TransportClosed`."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


Inbound = tuple[str, list[Frame]]
"""A received message: the peer it came from and its frames."""


class Inbox:
    """The messages a transport received and `recv` has not taken yet. Once it `fail`s, what
    it held is dropped, later messages are dropped too, and every later `get` raises that error
    (closed, or a broken socket). With a `maxsize`, `put` waits for room and `put_nowait`
    raises `asyncio.QueueFull`.

    A deque with the waiting getters' and putters' futures beside it (`asyncio.Queue`'s
    bookkeeping, less what an inbox never needs): every simulated message passes through one.
    """

    def __init__(self, maxsize: int = 0) -> None:
        self._items: deque[Inbound] = deque()
        self._maxsize = maxsize
        self._error: TransportError | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: deque[asyncio.Future[None]] = deque()

    def full(self) -> bool:
        """No room for another message (with a `maxsize`)."""
        return 0 < self._maxsize <= len(self._items)

    async def put(self, item: Inbound) -> None:
        while self.full() and self._error is None:
            await _wait_in(self._putters, lambda: not self.full())
        self.put_nowait(item)

    def put_nowait(self, item: Inbound) -> None:
        if self._error is not None:
            return
        if self._maxsize and len(self._items) >= self._maxsize:  # full(), without a call
            raise asyncio.QueueFull
        self._items.append(item)
        if self._getters:
            _wake_next(self._getters)

    async def get(self) -> Inbound:
        items = self._items
        while not items:
            if self._error is not None:
                raise self._error
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                _leave_line(self._getters, getter, bool(items))
                raise
        item = items.popleft()
        if self._putters:
            _wake_next(self._putters)
        return item

    def fail(self, error: TransportError) -> None:
        self._items.clear()
        self._error = error
        for waiters in (self._getters, self._putters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)


async def _wait_in(waiters: deque[asyncio.Future[None]], ready: Callable[[], bool]) -> None:
    """Wait in line in `waiters` until woken."""
    waiter = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    try:
        await waiter
    except BaseException:
        _leave_line(waiters, waiter, ready())
        raise


def _leave_line(waiters: deque[asyncio.Future[None]], waiter: asyncio.Future[None],
                ready: bool) -> None:
    """A waiter gave up (cancelled): leave the line, and pass the wake-up on to the next in
    line if it got one (`ready`: there is still something to take)."""
    waiter.cancel()
    try:
        waiters.remove(waiter)
    except ValueError:
        pass
    if ready and not waiter.cancelled():
        _wake_next(waiters)


def _wake_next(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        waiter = waiters.popleft()
        if not waiter.done():
            waiter.set_result(None)
            return
