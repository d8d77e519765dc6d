"""The Transport interface: how a node moves opaque frames to and from its peers.

A transport knows nothing of tensors or the PS protocol; it moves *messages*, each a list of
frames (byte buffers), between named nodes. The same runtime code runs over `ZmqTransport` for
real and over the simulator's transport on a virtual clock, so the interface is small and its
semantics are pinned down by one contract suite (`tests/transport_contract.py`):

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
- Time: implementations wait only through the running asyncio loop, never the wall clock, so a
  virtual-time loop can drive them; timeouts are the caller's (`asyncio.wait_for`).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Sequence
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
    it held is dropped and every later `get` raises that error (closed, or a broken socket)."""

    def __init__(self, maxsize: int = 0) -> None:
        self._queue: asyncio.Queue[Inbound | TransportError] = asyncio.Queue(maxsize)

    async def put(self, item: Inbound) -> None:
        await self._queue.put(item)

    def put_nowait(self, item: Inbound) -> None:
        self._queue.put_nowait(item)

    async def get(self) -> Inbound:
        item = await self._queue.get()
        if isinstance(item, TransportError):
            self._queue.put_nowait(item)  # every later recv fails the same way
            raise item
        return item

    def fail(self, error: TransportError) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(error)
