"""`FaultProxy`: a TCP proxy between ZeroMQ nodes that delays, drops, duplicates, reorders and
partitions whole messages, for fault tests on real processes where kernel netem is unavailable.

A proxy listens on one address and forwards every connection it accepts to one upstream
endpoint (a pserver): point the clients at the proxy and bind the server at the upstream
address. Each accepted connection is one *link* carrying both directions: `Direction.UP`
(client -> upstream) and `Direction.DOWN` (upstream -> client).

ZMTP 3.x framing, which the proxy reads to find message boundaries:

- A 64-byte greeting each way: signature (0xFF, 8 padding bytes, 0x7F), version (3.x),
  mechanism ("NULL", zero-padded to 20 bytes), as-server flag, filler. It is forwarded as it
  streams in (peers wait for each other's signature before sending the rest).
- Then frames: a flags byte (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), a size (1 byte, or 8
  bytes big-endian when LONG), the body. Command frames (the NULL handshake's READY, whose
  ``Identity`` property names the client, and any later PING/PONG) pass through untouched; the
  other frames make up messages, each ending with a frame without MORE.

Faults act on whole messages, per direction, as `Faults` says: `proxy.faults[direction]`
for every client, unless `proxy.client_faults[client]` names that client (its READY identity,
e.g. ``"trainer:0"``); both replaceable at any time, so one proxy in front of a server can give
each client's link its own faults. For each message the proxy draws, in this order, drop,
duplicate and reorder from one `random.Random` per directed link, seeded
``"{seed}:{src}->{dst}"`` by the client's identity and the upstream's name (`upstream_name`,
by default its endpoint) as the simulator seeds its links, then samples the latency: the same
seed and message sequence give the same fates however links interleave.

- drop: the message is not forwarded (TCP never knows).
- duplicate: it is forwarded twice in a row.
- reorder: it is held until the next message of its direction has been read, then forwarded
  right after it (a swapped pair); if none comes within `Faults.reorder_wait` of its reading it
  goes alone. Holding it adds nothing to its own latency, which counts from its reading: it
  goes at the later of its release and its due time (as the simulator holds a message back,
  `runtime.config.faults.LinkFaults`).
- latency: it is forwarded `latency` seconds (constant, or drawn by a sampler from the link's
  RNG) after it was read, never before an earlier message of its direction: order is kept.
- bandwidth: each direction of a connection sends at most that many bytes per second (paced
  before the latency, as a serializing link).
- `partition()` / `heal()`: while partitioned, messages due in either direction of every link
  are dropped (``"drop"``, a cut cable under live TCP connections) or held until `heal`
  (``"hold"``). Greeting and commands still pass, so connections stay up. With ``clients=``
  both act on the links of those client identities only (`partition_of` says what holds).

The proxy makes its sockets with ``socket.socket`` unless given a `socket_factory`: `runtime
up --netns` passes one that makes them in the pserver's network namespace (`runtime.launch.netns`),
so that a proxy run by the launcher listens and forwards inside it.

`counters[direction]` counts what happened (`client_counters[client][direction]`, per client
identity). All waiting is on the running loop's clock. An error on one connection (bad framing,
a reset) closes that connection and is logged; the proxy keeps serving, and ZeroMQ reconnects as
it would over a flaky network.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

from runtime.config.faults import REORDER_WAIT

log = logging.getLogger(__name__)

GREETING_SIZE = 64
SIGNATURE_END = 9
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
STREAM_LIMIT = 1 << 20
"""Read buffer of each socket (bytes)."""

Latency = float | Callable[[random.Random], float]
"""Seconds a message is delayed: a constant, or a sampler drawing from the link's RNG."""
PartitionMode = Literal["drop", "hold"]
SocketFactory = Callable[[int], socket.socket]
"""Makes an unconnected TCP socket of the given address family."""


class ZmtpError(ValueError):
    """The bytes on a connection are not ZMTP 3 with the NULL mechanism."""


class Direction(enum.StrEnum):
    UP = "up"
    """From the client to the upstream server."""
    DOWN = "down"
    """From the upstream server back to the client."""


@dataclass(frozen=True)
class Faults:
    """What happens to the messages of one direction; probabilities are per message."""

    latency: Latency = 0.0
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_wait: float = REORDER_WAIT
    """Longest a reordered message waits for a successor to overtake it (seconds; by default
    the simulator's wait too)."""
    bandwidth: float | None = None
    """Bytes per second each direction of a connection may carry; None is unlimited."""

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"Faults.{name} is a probability in [0, 1], got {value!r}")
        if not callable(self.latency) and self.latency < 0:
            raise ValueError(f"Faults.latency must be >= 0 seconds, got {self.latency!r}")
        if self.reorder_wait <= 0:
            raise ValueError(f"Faults.reorder_wait must be > 0 seconds, got {self.reorder_wait!r}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError(f"Faults.bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")


@dataclass(frozen=True)
class ProxyFate:
    """What the faults decided for one message."""

    copies: int
    """0 (dropped), 1, or 2 (duplicated)."""
    reorder: bool
    delay: float


def decide(faults: Faults, rng: random.Random) -> ProxyFate:
    """The fate of the next message: always three draws, then the latency sample, so one
    link's RNG stream does not depend on which faults are switched on."""
    drop, duplicate, reorder = rng.random(), rng.random(), rng.random()
    delay = faults.latency(rng) if callable(faults.latency) else faults.latency
    if delay < 0:
        raise ValueError(f"the latency sampler drew {delay!r} s, which is negative")
    copies = 0 if drop < faults.drop else 2 if duplicate < faults.duplicate else 1
    return ProxyFate(copies, reorder < faults.reorder, delay)


@dataclass
class Counters:
    """What one direction of a proxy saw and did, over all its connections (or, in
    `FaultProxy.client_counters`, over one client's)."""

    messages: int = 0
    """Messages read."""
    delivered: int = 0
    """Message copies forwarded."""
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    """Messages that the next message overtook."""
    delayed: int = 0
    """Messages given a latency above zero."""
    cut: int = 0
    """Messages dropped by a partition."""
    held: int = 0
    """Messages a partition held until it healed."""
    bytes_in: int = 0
    bytes_out: int = 0


# ------------------------------------------------------------------------------------- ZMTP


def check_greeting(greeting: bytes) -> None:
    """Raise `ZmtpError` unless `greeting` opens ZMTP 3.x with the NULL mechanism."""
    if greeting[0] != 0xFF or greeting[SIGNATURE_END] != 0x7F:
        raise ZmtpError(f"not a ZMTP signature: {greeting[:10].hex()}")
    if greeting[10] < 3:
        raise ZmtpError(f"ZMTP {greeting[10]}.{greeting[11]}: only 3.x can be proxied")
    mechanism = greeting[12:32].rstrip(b"\0")
    if mechanism != b"NULL":
        raise ZmtpError(f"mechanism {mechanism!r}: only NULL can be proxied (messages of "
                        "other mechanisms are encrypted commands)")


async def read_frame(reader: asyncio.StreamReader,
                     max_size: int) -> tuple[int, bytes, bytes] | None:
    """The next frame as (flags, header bytes, body), or None if the peer closed between frames."""
    try:
        head = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return None
    flags = head[0]
    if flags & ~(MORE | LONG | COMMAND):
        raise ZmtpError(f"frame flags {flags:#04x} set reserved bits")
    size_bytes = await reader.readexactly(8 if flags & LONG else 1)
    size = int.from_bytes(size_bytes, "big")
    if size > max_size:
        raise ZmtpError(f"a frame of {size} bytes is over the limit of {max_size}")
    return flags, head + size_bytes, await reader.readexactly(size)


def command_properties(body: bytes) -> tuple[str, dict[str, bytes]]:
    """A command frame's name and, for READY, its properties (name -> value)."""
    try:
        name = body[1:1 + body[0]].decode("ascii")
        properties: dict[str, bytes] = {}
        at = 1 + body[0]
        while name == "READY" and at < len(body):
            key = body[at + 1:at + 1 + body[at]].decode("ascii")
            at += 1 + body[at]
            (size,) = struct.unpack_from(">I", body, at)
            properties[key] = body[at + 4:at + 4 + size]
            at += 4 + size
            if at > len(body):
                raise ZmtpError(f"READY property {key!r} runs past the end of the frame")
    except (IndexError, UnicodeDecodeError, struct.error) as exc:
        raise ZmtpError(f"malformed command frame: {exc}") from exc
    return name, properties


# ------------------------------------------------------------------------------------- links


@dataclass
class _Unit:
    """Bytes to forward, in order: greeting bytes, a command frame or one message copy."""

    data: list[bytes]
    message: bool
    release: float = 0.0

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.data)


@dataclass
class _Held:
    """A reordered message waiting for the next one to overtake it."""

    units: list[_Unit]
    due: float
    """When its latency, counted from its reading, has passed (the loop's clock)."""
    timer: asyncio.TimerHandle

    def delay(self) -> float:
        """Its latency left, released now."""
        return max(0.0, self.due - asyncio.get_running_loop().time())


class _Lane:
    """One direction of one connection: reads frames, decides the fates of messages, and
    forwards what survives at its release time."""

    def __init__(self, proxy: FaultProxy, link: _ProxyLink, direction: Direction,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.link = link
        self.direction = direction
        self.reader = reader
        self.writer = writer
        self.totals = proxy.counters[direction]
        self._units: deque[_Unit | None] = deque()  # None: the input ended
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._last_release = 0.0
        self._link_free = 0.0
        self._held: _Held | None = None

    @property
    def faults(self) -> Faults:
        return self.proxy.faults_for(self.link.client, self.direction)

    def count(self, name: str, n: int = 1) -> None:
        """Add `n` to counter `name` of this direction, in total and, once its READY named
        the client, for that client."""
        setattr(self.totals, name, getattr(self.totals, name) + n)
        if self.link.named:
            mine = self.proxy.counters_of(self.link.client, self.direction)
            setattr(mine, name, getattr(mine, name) + n)

    # -- reading
    async def read(self) -> None:
        """Forward the greeting, then frames, until the peer closes."""
        if await self._greeting():
            await self._frames()
        self._release_held()
        self._units.append(None)
        self._wake.set()

    async def _greeting(self) -> bool:
        greeting = b""
        while len(greeting) < GREETING_SIZE:
            chunk = await self.reader.read(GREETING_SIZE - len(greeting))
            if not chunk:
                return False
            greeting += chunk
            self.totals.bytes_in += len(chunk)
            self._push([_Unit([chunk], message=False)], 0.0)
        check_greeting(greeting)
        return True

    async def _frames(self) -> None:
        message: list[bytes] = []
        while (frame := await read_frame(self.reader, self.proxy.max_frame_size)) is not None:
            flags, header, body = frame
            self.count("bytes_in", len(header) + len(body))
            if flags & COMMAND:
                self._on_command(body)
                self._push([_Unit([header, body], message=False)], 0.0)
                continue
            message += (header, body)
            if not flags & MORE:
                self._on_message(message)
                message = []
                await self._has_room()

    def _on_command(self, body: bytes) -> None:
        name, properties = command_properties(body)
        if name == "READY" and self.direction is Direction.UP:
            self.link.identify(properties.get("Identity", b""))

    def _on_message(self, data: list[bytes]) -> None:
        self.count("messages")
        faults = self.faults
        fate = decide(faults, self.link.rng(self.direction))
        if fate.copies == 0:
            self.count("dropped")
            return
        if fate.copies == 2:
            self.count("duplicated")
        if fate.delay > 0:
            self.count("delayed")
        units = [_Unit(data, message=True) for _ in range(fate.copies)]
        if self._held is not None:
            held, self._held = self._held, None
            held.timer.cancel()
            self._push(units, fate.delay)
            self._push(held.units, held.delay())
            self.count("reordered")
        elif fate.reorder:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(faults.reorder_wait, self._release_held)
            self._held = _Held(units, loop.time() + fate.delay, timer)
        else:
            self._push(units, fate.delay)

    def _release_held(self) -> None:
        """A held message's wait is over (or the input ended): forward it alone."""
        if self._held is not None:
            held, self._held = self._held, None
            held.timer.cancel()
            self._push(held.units, held.delay())

    def _push(self, units: list[_Unit], delay: float) -> None:
        """Queue `units` to go out `delay` seconds after they leave a link of the configured
        bandwidth, and never before what was queued earlier."""
        now = asyncio.get_running_loop().time()
        bandwidth = self.faults.bandwidth
        for unit in units:
            sent = max(now, self._link_free) + (unit.size / bandwidth if bandwidth else 0.0)
            self._link_free = sent
            unit.release = self._last_release = max(sent + delay, self._last_release)
            self._units.append(unit)
            self._queued_bytes += unit.size
        self._wake.set()

    async def _has_room(self) -> None:
        while self._queued_bytes > self.proxy.max_queued_bytes:
            self._room.clear()
            await self._room.wait()

    # -- writing
    async def write(self) -> None:
        """Forward queued units at their release times, until the input's end is reached."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._units:
                self._wake.clear()
                await self._wake.wait()
            unit = self._units.popleft()
            if unit is None:
                return
            self._queued_bytes -= unit.size
            if self._queued_bytes <= self.proxy.max_queued_bytes:
                self._room.set()
            if unit.release > loop.time():
                await asyncio.sleep(unit.release - loop.time())
            if unit.message and not await self._through_partition():
                continue
            self.writer.writelines(unit.data)
            self.count("bytes_out", unit.size)
            if unit.message:
                self.count("delivered")
            await self.writer.drain()

    async def _through_partition(self) -> bool:
        """Whether a message due now may pass (after waiting for the heal, when held)."""
        mode = self.proxy.partition_of(self.link.client)
        if mode is None:
            return True
        if mode == "drop":
            self.count("cut")
            return False
        self.count("held")
        while mode == "hold":
            await self.proxy.heal_signal().wait()
            mode = self.proxy.partition_of(self.link.client)
        if mode == "drop":  # the hold became a cut meanwhile
            self.count("cut")
            return False
        return True


class _ProxyLink:
    """One accepted connection and its upstream connection: both directions, and the name
    of the client that seeds their RNGs."""

    def __init__(self, proxy: FaultProxy, peer: str,
                 client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client = peer
        self.named = False
        self.lanes = (_Lane(proxy, self, Direction.UP, client[0], upstream[1]),
                      _Lane(proxy, self, Direction.DOWN, upstream[0], client[1]))

    def identify(self, identity: bytes) -> None:
        """The client's READY named it: its RNG streams are those of that name."""
        if identity:
            self.client = identity.decode("utf-8", "surrogateescape")
            self.named = True

    def rng(self, direction: Direction) -> random.Random:
        upstream = self.proxy.upstream_name
        name = f"{self.client}->{upstream}" if direction is Direction.UP \
            else f"{upstream}->{self.client}"
        return self.proxy.rng(name)

    async def run(self) -> None:
        """Carry traffic until a direction's input ends and its output is flushed, or a task
        fails (the error propagates); then close both sockets."""
        readers = [asyncio.create_task(lane.read()) for lane in self.lanes]
        writers = [asyncio.create_task(lane.write()) for lane in self.lanes]
        pending: set[asyncio.Task[None]] = {*readers, *writers}
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # raises what failed
                if any(task in writers for task in done):
                    return
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for lane in self.lanes:
                await _close(lane.writer)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (or ``tcp://host:port``, ``[v6]:port``) as (host, port)."""
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


def listening_socket(factory: SocketFactory, host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket from `factory`, listening at `host`:`port`."""
    sock = factory(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


# ------------------------------------------------------------------------------------- proxy


DirectedFaults = Faults | Mapping[Direction, Faults]
"""One `Faults` for both directions, or one per `Direction`."""


def _per_direction(faults: DirectedFaults) -> dict[Direction, Faults]:
    return {d: faults for d in Direction} if isinstance(faults, Faults) else dict(faults)


class FaultProxy:
    """Listens on `listen`, forwards each connection to `upstream`, and injects `faults`
    into every link, or `client_faults[client]` into the links of that client identity;
    see the module doc."""

    def __init__(self, *, upstream: str, listen: str = "127.0.0.1:0",
                 faults: DirectedFaults = Faults(), seed: int = 0,
                 client_faults: Mapping[str, DirectedFaults] | None = None,
                 upstream_name: str | None = None,
                 max_frame_size: int = 1 << 30, max_queued_bytes: int = 256 << 20,
                 socket_factory: SocketFactory | None = None) -> None:
        self.listen = split_endpoint(listen)
        self.upstream = upstream.removeprefix("tcp://")
        self.upstream_name = upstream_name or self.upstream
        """The upstream as the links' RNG seeds name it (e.g. ``pserver:0``)."""
        self._upstream_address = split_endpoint(upstream)
        self.faults: dict[Direction, Faults] = _per_direction(faults)
        self.client_faults: dict[str, dict[Direction, Faults]] = {
            client: _per_direction(f) for client, f in (client_faults or {}).items()}
        self.seed = seed
        self.max_frame_size = max_frame_size
        self.max_queued_bytes = max_queued_bytes
        """Bytes a direction of a connection may queue before it stops reading its input."""
        self.socket_factory = socket_factory
        """Makes the listening and upstream sockets (None: `socket.socket`)."""
        self.counters = {d: Counters() for d in Direction}
        self.client_counters: dict[str, dict[Direction, Counters]] = {}
        """The counters of each client identity's links (after its READY named it)."""
        self._partitions: dict[str | None, PartitionMode] = {}  # None: every link
        self._healed = asyncio.Event()
        self.address = ""
        self._rngs: dict[str, random.Random] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen; return the address bound, as ``host:port``."""
        host, port = self.listen
        if self.socket_factory is None:
            self._server = await asyncio.start_server(self._accept, host, port,
                                                      limit=STREAM_LIMIT)
        else:
            self._server = await asyncio.start_server(self._accept, sock=self._listening(),
                                                      limit=STREAM_LIMIT)
        bound = self._server.sockets[0].getsockname()
        self.address = f"{bound[0]}:{bound[1]}"
        return self.address

    def _socket(self, host: str) -> socket.socket:
        assert self.socket_factory is not None
        return self.socket_factory(socket.AF_INET6 if ":" in host else socket.AF_INET)

    def _listening(self) -> socket.socket:
        """A socket from the factory, listening at `listen`."""
        assert self.socket_factory is not None
        return listening_socket(self.socket_factory, *self.listen)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self._upstream_address
        if self.socket_factory is None:
            return await asyncio.open_connection(host, port, limit=STREAM_LIMIT)
        sock = self._socket(host)
        try:
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, port))
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock, limit=STREAM_LIMIT)

    async def close(self) -> None:
        """Stop listening and close every connection, dropping what is still queued."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    def faults_for(self, client: str, direction: Direction) -> Faults:
        """The faults of `client`'s links in `direction`: its own, else every link's."""
        own = self.client_faults.get(client)
        return own[direction] if own is not None else self.faults[direction]

    def counters_of(self, client: str, direction: Direction) -> Counters:
        """The counters of `client`'s links in `direction` (made on first use)."""
        mine = self.client_counters.get(client)
        if mine is None:
            mine = self.client_counters[client] = {d: Counters() for d in Direction}
        return mine[direction]

    def partition(self, mode: PartitionMode = "drop", clients: Iterable[str] | None = None) -> None:
        """Cut every link, or those of the `clients` identities: messages due from now on are
        dropped, or held until `heal`."""
        if mode not in ("drop", "hold"):
            raise ValueError(f"partition mode is 'drop' or 'hold', got {mode!r}")
        for client in [None] if clients is None else clients:
            self._partitions[client] = mode

    def heal(self, clients: Iterable[str] | None = None) -> None:
        """End the partition of every link (clients None), or of those `clients` (a partition
        of every link still cuts them); held messages go out in their order."""
        if clients is None:
            self._partitions.clear()
        else:
            for client in clients:
                self._partitions.pop(client, None)
        healed, self._healed = self._healed, asyncio.Event()
        healed.set()

    def partition_of(self, client: str) -> PartitionMode | None:
        """What a partition does to `client`'s messages now: None when none cuts its links."""
        return self._partitions.get(client, self._partitions.get(None))

    def heal_signal(self) -> asyncio.Event:
        """An event set at the next `heal`."""
        return self._healed

    def rng(self, link: str) -> random.Random:
        """The RNG of the directed link named `link` (``src->dst``), made on first use."""
        rng = self._rngs.get(link)
        if rng is None:
            rng = self._rngs[link] = random.Random(f"{self.seed}:{link}")
        return rng

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Carry the connection in a task of the proxy's own, which `close` may cancel."""
        peer = "{}:{}".format(*writer.get_extra_info("peername")[:2])
        task = asyncio.create_task(self._carry(peer, reader, writer), name=f"proxy {peer}")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _carry(self, peer: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await self._open_upstream()
        except OSError as exc:
            log.info("fault proxy %s: %s cannot reach %s: %s", self.address, peer,
                     self.upstream, exc)
            await _close(writer)
            return
        try:
            await _ProxyLink(self, peer, (reader, writer), upstream).run()
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            log.warning("fault proxy %s: connection from %s closed: %s", self.address, peer, exc)
        except Exception:
            log.exception("fault proxy %s: connection from %s failed", self.address, peer)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
