"""`DelayRelay`: a TCP relay that delays every byte by its link's latency, for ``runtime up
--netns`` on kernels without netem.

A network's latency delays bytes, not messages: each byte arrives a latency after it left. The
relay listens where the trainers reach a pserver and forwards each connection to the pserver
behind it, holding each chunk it reads for the latency of that link before writing it on, in
order, in both directions. The latency is chosen by the client's address (`latencies`), so one
relay serves trainers whose links differ; an address it does not know gets `default`.

It never reads the stream: CurveZMQ passes through encrypted, with no key and no cryptography
in the relay, and a chunk costs it one read and one write. ``runtime up --netns`` uses it for
links whose only fault is a constant latency; a drawn latency, message faults and partitions
need message boundaries, and keep `runtime.faults.proxy.FaultProxy`.

Flow control: a side whose held bytes, plus what its peer's transport has yet to send, pass
`max_queued_bytes` stops reading until they drain; TCP then pushes back on the sender, as a
full link's queue would.

DESIGN:
- Bytes rather than messages. Under CurveZMQ the message proxy must decrypt and encrypt every
  message again (`runtime.faults.curve_proxy`), on the job's cores. On the 2-core development
  machine a 2 x 2 job of 200 KB messages behind 2 ms of latency took 15.2-16.7 ms a step
  behind the proxy, and 12.5-12.9 behind this relay, in alternating runs. The simulator, which
  models the latency and not what delays it, predicted 11.6.
- Its own thread and event loop, on ``select()``. The launcher's loop is uvloop's, whose timers
  fire on a millisecond clock, as epoll's timeouts do: through the proxy, some round trips
  behind 2 ms each way took 3.7 ms. ``select()`` sleeps to the microsecond, and this loop
  never waits for the launcher's work.
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
from collections import deque
from collections.abc import Mapping

from runtime.faults.proxy import SocketFactory, listening_socket, split_endpoint

__all__ = ["DelayRelay"]

END = None
"""Held in place of data: the reading side's connection ended; end the peer's too."""


class _Side(asyncio.Protocol):
    """One end of a relayed connection: what it reads reaches `peer` `latency` seconds later."""

    def __init__(self, relay: DelayRelay, latency: float) -> None:
        self.relay = relay
        self.latency = latency
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.held: deque[tuple[float, bytes | None]] = deque()
        self.held_bytes = 0
        self.timer: asyncio.TimerHandle | None = None
        self.peer_full = False
        """The peer's transport asked us to stop writing (its buffer is over its high mark)."""
        self.ended = False
        """This side's connection ended (EOF or lost): nothing more comes from it."""
        self.end_delivered = False
        """Its end reached the peer: the peer was half-closed or closed."""

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.relay._sides.add(self)
        # asyncio sets TCP_NODELAY only on sockets made with proto IPPROTO_TCP, and a factory's
        # have proto 0: without it, Nagle's algorithm and delayed ACKs held chunks for 40 ms
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._hold(data)

    def eof_received(self) -> bool:
        self._end()
        return True  # the peer still writes to this side until its own bytes are through

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay._sides.discard(self)
        self._end()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.peer_full = True
            self.peer._throttle()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.peer_full = False
            self.peer._throttle()

    # -- relaying ----------------------------------------------------------------------------

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self._hold(END)

    def _hold(self, data: bytes | None) -> None:
        self.held.append((self.relay._running_loop().time() + self.latency, data))
        self.held_bytes += 0 if data is None else len(data)
        self._schedule()
        self._throttle()

    def linked(self, peer: _Side) -> None:
        """`peer` is connected: what was held for it may go."""
        self.peer = peer
        self._schedule()

    def _schedule(self) -> None:
        """Wake when the first held chunk is due, once linked and not already waiting."""
        if self.held and self.timer is None and self.peer is not None:
            self.timer = self.relay._running_loop().call_at(self.held[0][0], self._release)

    def _release(self) -> None:
        """Write on what is due, in order; wait for the next."""
        self.timer = None
        now = self.relay._running_loop().time()
        peer = self.peer
        assert peer is not None and peer.transport is not None
        while self.held and self.held[0][0] <= now:
            _, data = self.held.popleft()
            if data is None:
                self._deliver_end()
            else:
                self.held_bytes -= len(data)
                if not peer.transport.is_closing():
                    peer.transport.write(data)
        self._schedule()
        self._throttle()

    def _deliver_end(self) -> None:
        """This side ended: half-close the peer's connection, or close both once both ends
        are through (or the peer cannot be half-closed)."""
        self.end_delivered = True
        peer = self.peer
        assert peer is not None and peer.transport is not None and self.transport is not None
        to = peer.transport
        if peer.end_delivered or not to.can_write_eof():
            to.close()
            self.transport.close()
        elif not to.is_closing():
            to.write_eof()

    def _throttle(self) -> None:
        """Stop reading while too much waits here or in the peer's transport; read again once
        it has drained."""
        if self.transport is None or self.transport.is_closing():
            return
        full = self.peer_full or self.held_bytes > self.relay.max_queued_bytes
        if full and self.transport.is_reading():
            self.transport.pause_reading()
        elif not full and not self.transport.is_reading():
            self.transport.resume_reading()


class DelayRelay:
    """Listens on `listen` (``host:port``; port 0 picks one), forwards each connection to
    `upstream`, every byte held for its link's latency: `latencies[client address]`, else
    `default` (seconds); see the module doc. `start` runs it in a thread of its own, `close`
    stops it and closes every connection."""

    def __init__(self, *, listen: str, upstream: str, latencies: Mapping[str, float],
                 default: float = 0.0, socket_factory: SocketFactory | None = None,
                 max_queued_bytes: int = 64 << 20) -> None:
        self.listen = split_endpoint(listen)
        self.upstream = split_endpoint(upstream)
        self.latencies = dict(latencies)
        self.default = default
        self.socket_factory = socket_factory or (
            lambda family: socket.socket(family, socket.SOCK_STREAM))
        self.max_queued_bytes = max_queued_bytes
        self.address = ""
        self.links: list[tuple[str, float]] = []
        """(client address, latency) of each connection accepted, in order."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._sides: set[_Side] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def latency_of(self, address: str) -> float:
        return self.latencies.get(address, self.default)

    def start(self) -> str:
        """Listen, in the relay's own thread; the address bound, as ``host:port``. Raises what
        binding raised."""
        ready = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._serve, args=(ready, failed), daemon=True,
                                        name=f"delay-relay {self.listen[0]}:{self.listen[1]}")
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            self._thread = None
            raise failed[0]
        return self.address

    def close(self) -> None:
        """Stop listening, close every connection (dropping what is held), end the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(self._shut)
        thread.join()
        self._thread = None

    def _serve(self, ready: threading.Event, failed: list[BaseException]) -> None:
        """The relay's thread: its loop, from listening to closed."""
        loop = self._loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
        try:
            listening = listening_socket(self.socket_factory, *self.listen)
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(lambda: _AcceptedSide(self), sock=listening))
            except BaseException:
                listening.close()
                raise
            bound = listening.getsockname()
            self.address = f"{bound[0]}:{bound[1]}"
        except BaseException as exc:  # handed to `start`, which raises it
            failed.append(exc)
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def _shut(self) -> None:
        """In the relay's thread: close the server and every connection, then stop."""
        assert self._server is not None and self._loop is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        for side in list(self._sides):
            if side.timer is not None:
                side.timer.cancel()
            if side.transport is not None:
                side.transport.abort()
        self._loop.call_soon(self._loop.stop)  # after the aborts' callbacks close the sockets

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    async def _connect(self, client: _Side) -> None:
        """Connect `client`'s connection to the upstream; close it if that cannot be done
        (the client reconnects, as ZeroMQ does)."""
        host, port = self.upstream
        loop = self._running_loop()
        sock = self.socket_factory(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, port))
            _, upstream = await loop.create_connection(
                lambda: _Side(self, client.latency), sock=sock)
        except OSError:
            sock.close()
            if client.transport is not None:
                client.transport.close()
            return
        assert isinstance(upstream, _Side)
        upstream.linked(client)
        client.linked(upstream)


class _AcceptedSide(_Side):
    """A client's side: its latency is its address's; it connects the upstream side."""

    def __init__(self, relay: DelayRelay) -> None:
        super().__init__(relay, relay.default)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        address = str(transport.get_extra_info("peername")[0])
        self.latency = self.relay.latency_of(address)
        self.relay.links.append((address, self.latency))
        task = self.relay._running_loop().create_task(self.relay._connect(self))
        self.relay._tasks.add(task)
        task.add_done_callback(self.relay._tasks.discard)
