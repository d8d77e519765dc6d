"""`CurveFaultProxy`: the fault proxy of a job that talks CurveZMQ, a participant of the job's
encryption rather than a reader of its frames.

`runtime.faults.proxy.FaultProxy` reads ZMTP frames off TCP to find whole messages; under CURVE
those frames are encrypted commands, and their nonces must rise, so no proxy outside the
handshake can drop, duplicate or reorder them. This one takes part in CURVE on both sides:

- towards the trainers it is the pserver: a ZeroMQ ROUTER at the pserver's endpoint, a CURVE
  server with the pserver's own keypair (the trainers check the key they always check), whose
  ZAP handler admits only the job's trainer keys, each bound to its owner's name: a message
  whose routing id is not its key's owner is dropped (`ZmqTransport`'s impostor check) before
  any fault is drawn;
- towards the pserver it is each trainer: for every trainer it heard from, a DEALER with that
  trainer's routing id, a CURVE client of the pserver that authenticates with the pserver's own
  keypair. A pserver behind a proxy (``--bind``) admits its own public key as `RELAY`, the one
  client that may speak for any routing id (`runtime.network.curve`): only a holder of the
  pserver's secret key, the pserver's host, can.

Between the two each message is plaintext in this process only, and takes the faults of the
`FaultProxy` it subclasses: the same `Faults`, fates drawn from the same per-link generators
(seeded by the scenario's seed, the trainer and the pserver), partitions, holds and counters,
through the same `_Lane`s, whose input is whole ZeroMQ messages instead of frames read off a
stream. DESIGN: a ZeroMQ-level proxy rather than CURVE spoken over the byte stream: libzmq does
the cryptography, and messages arrive whole.

Its sockets are libzmq's, so it takes no `socket_factory`; ``runtime up --netns`` gives it
`made_in` instead, which enters the pserver's network namespace (`runtime.launch.netns.entered`)
while `start` makes its ZeroMQ context and binds. The listening socket is made in the thread
that binds, so in the namespace; its connections to the pserver are opened by the context's I/O
thread, started with the context's first socket and so in the namespace too, however much
later they are made (a trainer first heard from, a pserver restarted).

Connections differ from the byte proxy's in one way: a trainer's connection and the proxy's
connection to the pserver are separate, so a trainer that restarts reconnects to the proxy while
the pserver keeps the proxy's connection (as it keeps a trainer's across its reconnects), and a
pserver that restarts is reconnected to by the proxy, its trainers' connections untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq

from runtime.faults.proxy import DirectedFaults, Direction, FaultProxy, Faults, _Lane, _ProxyLink
from runtime.network.curve import CurveKeys
from runtime.network.transport import Frame, TransportError
from runtime.network.zmq_transport import ZmqLimits, ZmqTransport

log = logging.getLogger(__name__)

MadeIn = Callable[[], contextlib.AbstractContextManager[object]]
"""A context to make a proxy's sockets in (e.g. a network namespace entered)."""


class _Out:
    """A lane's output: whole messages, each handed to `transport` for `peer`."""

    def __init__(self, transport: ZmqTransport, peer: str) -> None:
        self.transport = transport
        self.peer = peer

    def writelines(self, frames: Sequence[Frame]) -> None:
        try:
            self.transport.send_nowait(self.peer, list(frames))
        except TransportError as exc:  # e.g. the trainer is gone: as a message lost on the way
            log.info("fault proxy: a message to %s is lost: %s", self.peer, exc)

    async def drain(self) -> None:
        pass


class _CurveLink(_ProxyLink):
    """One trainer's traffic through the proxy: its upstream DEALER and both lanes."""

    def __init__(self, proxy: CurveFaultProxy, client: str, upstream: ZmqTransport) -> None:
        self.proxy = proxy
        self.client = client
        self.named = True
        self.upstream = upstream
        front = proxy.front
        assert front is not None
        up = _Lane(proxy, self, Direction.UP, cast(Any, None),
                   cast(Any, _Out(upstream, proxy.upstream)))
        down = _Lane(proxy, self, Direction.DOWN, cast(Any, None), cast(Any, _Out(front, client)))
        self.lanes = (up, down)
        self.writers = [asyncio.get_running_loop().create_task(lane.write(),
                                                               name=f"proxy {client} {lane.direction}")
                        for lane in self.lanes]

    def take(self, direction: Direction, frames: list[Frame]) -> None:
        """A whole message read in `direction`: count it and give it its fate."""
        lane = self.lanes[0] if direction is Direction.UP else self.lanes[1]
        lane.count("bytes_in", sum(len(frame) for frame in frames))
        lane._on_message(cast(list[bytes], frames))

    async def close(self) -> None:
        for task in self.writers:
            task.cancel()
        await asyncio.gather(*self.writers, return_exceptions=True)
        await self.upstream.close()


class CurveFaultProxy(FaultProxy):
    """A `FaultProxy` for a CurveZMQ job (see the module doc): `keys` are the pserver's own
    (its keypair and the trainer keys it admits)."""

    def __init__(self, *, keys: CurveKeys, upstream: str, listen: str = "127.0.0.1:0",
                 faults: DirectedFaults = Faults(), seed: int = 0,
                 client_faults: dict[str, DirectedFaults] | None = None,
                 upstream_name: str | None = None, max_queued_bytes: int = 256 << 20,
                 made_in: MadeIn | None = None) -> None:
        super().__init__(upstream=upstream, listen=listen, faults=faults, seed=seed,
                         client_faults=client_faults, upstream_name=upstream_name,
                         max_queued_bytes=max_queued_bytes)
        self.keys = keys
        self.made_in = made_in
        """Where `start` makes the sockets (a network namespace entered); None: here."""
        self.front: ZmqTransport | None = None
        self._context: zmq.Context[Any] | None = None
        self._links: dict[str, _CurveLink] = {}

    @classmethod
    def like(cls, proxy: FaultProxy, keys: CurveKeys,
             made_in: MadeIn | None = None) -> CurveFaultProxy:
        """A CurveZMQ proxy in place of `proxy` (not started): the same addresses, seed and
        faults; `made_in` in place of its `socket_factory`."""
        host, port = proxy.listen
        return cls(keys=keys, upstream=proxy.upstream, listen=f"{host}:{port}",
                   faults=proxy.faults, seed=proxy.seed, client_faults=dict(proxy.client_faults),
                   upstream_name=proxy.upstream_name, max_queued_bytes=proxy.max_queued_bytes,
                   made_in=made_in)

    @property
    def refused(self) -> tuple[int, int]:
        """(connections ZAP refused, messages dropped for a routing id not their key's)."""
        front = self.front
        return (0, 0) if front is None else (front.unauthenticated, front.impostors)

    async def start(self) -> str:
        host, port = self.listen
        # nothing here yields to the loop: the thread is back in its own namespace before
        # another task runs on it
        with self.made_in() if self.made_in is not None else contextlib.nullcontext():
            self._context = zmq.Context()
            front = self.front = ZmqTransport(
                f"{self.upstream_name} proxy", ZmqLimits(), self._context,
                curve=CurveKeys(self.keys.public, self.keys.secret, self.keys.clients))
            front.deliver_to(self._from_client)
            bound = front.bind_nowait(f"{host}:{port}")
        self.address = bound.removeprefix("tcp://")
        return self.address

    def _from_client(self, client: str, frames: list[Frame]) -> None:
        link = self._links.get(client)
        if link is None:
            link = self._links[client] = self._open(client)
        link.take(Direction.UP, frames)

    def _open(self, client: str) -> _CurveLink:
        """The link of a trainer first heard from: a DEALER to the pserver in its name."""
        keys = CurveKeys(self.keys.public, self.keys.secret,
                         servers={self.upstream: self.keys.public})
        upstream = ZmqTransport(client, ZmqLimits(), self._context, curve=keys)
        link = _CurveLink(self, client, upstream)
        upstream.deliver_to(lambda _, frames: link.take(Direction.DOWN, frames))
        upstream.connect_nowait(self.upstream)
        return link

    async def close(self) -> None:
        # The listening socket first: a message from a trainer still queued there would
        # otherwise be read while the links close (they yield to the loop) and open a link, and
        # so a socket, that nobody closes, on which the context's `term` would wait forever.
        if self.front is not None:
            await self.front.close()
        while self._links:
            _, link = self._links.popitem()
            await link.close()
        if self._context is not None:
            self._context.term()
            self._context = None
