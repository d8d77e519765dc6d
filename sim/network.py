"""The simulated network: a `Transport` that carries the real frames on the virtual clock.

`Network` is the fabric one simulated run shares: it knows which node bound which endpoint,
which clients connected where, the parameters of every link and the state of every node's NIC.
`Network.transport(name)` gives a node its `SimTransport`; the runtime uses it exactly as it
uses `ZmqTransport`, so the same pserver and trainer code runs over it unchanged.

Queueing model. A message of S bytes from node A to node B, sent at time t, over a link of
bandwidth b (from the `network` spec; a NIC rule may cap a node's rate below it):

1. Egress: A's NIC sends one message at a time, first in first out. The message starts leaving
   at `start = max(t, A's NIC free)` and occupies A's egress for S / rate_out.
2. Latency: its first bit reaches B one sampled link latency after `start`, and never before the
   last bit of the previous message on the directed link A -> B (so a message never overtakes
   an earlier one on the same link, whatever the latencies drawn).
3. Ingress: B's NIC takes arriving messages one at a time, in arrival order, each occupying it
   for S / rate_in; the message is delivered when B has taken it all and no earlier than its
   last bit can have arrived (first bit + S / rate_out).

A lone message on idle NICs therefore takes L + S/b (ingress overlaps egress, not added to it);
k messages sent together by one node, or by k nodes to one node, finish at L + k*S/b: the busy
NIC is the bottleneck. S here is what the message weighs against a rate: by default its bytes
with the headers of the TCP segments that carry it (``network.framing: tcp``,
`NetworkSpec.wire_bytes`: 66 bytes per 1,448, as tc counts frames, about 4.6% of a large
message), or its bytes alone with ``framing: none``, under which hand computations come out
exact. The counters (bytes in and out) are the messages' bytes either way.

Token bucket (``network.burst: D``, default 0): each rate-limited NIC direction also holds a
bucket of D seconds of data at the link's rate, filling at that rate while it is idle, as a tc
tbf qdisc (what `runtime up --netns` shapes with) or a cloud VM's shaper does. A message finds
`tokens` bytes in it when it starts: that part takes no time, the rest goes at the rate, so it
occupies the direction for max(0, S - tokens) / rate and leaves max(0, tokens - S) behind. With
D = 0 the formulas above are unchanged. S is the frames' bytes; a timing-mode message, whose phantoms carry
no data, weighs what it would with data (`runtime.network.wire.charged_size`), as its numeric twin
does. Without a `network` section the network is ideal: no latency, unlimited bandwidth.

Identity rules, as `ZmqTransport`: a server receives a client's messages from peer = the
client's node name, and a client receives a server's from peer = the endpoint string it
connected to. A message sent to an endpoint nobody has bound yet waits in the sender until a
node binds it; a server that closes and a new one binding the same endpoint (a restart) gets
the clients' later messages. A node that reconnects under its old name takes the name over.
Messages still in flight to a transport that closes are dropped (counted per link).

The `network` section's schema, the latency distributions and how rules resolve for a pair of
nodes (`NetworkSpec.link`, `NetworkSpec.nic_bandwidth`) are the runtime's
(`runtime.config.netspec`), so that `runtime up --netns` applies the same network to real links;
this module re-exports them.

Determinism: latencies come from one `random.Random` per directed link, seeded from the run's
seed and the two node names, so the same seed gives the same times however traffic on other
links interleaves; `sim.latencies.LinkLatencies` gives a link's draws without holding its
generator (2.5 KB a link, 200,000 links at 1,000 trainers x 100 pservers). Everything waits on `loop.call_at`, never the wall clock.

Every message passes through `Network._deliver` between leaving its sender and arriving: the
single place where fault injection (drop, duplicate, delay, partition) decides its fate.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.config.netspec import (ConstantLatency, Latency, LinkParams, LinkRule,
                                    LogNormalLatency, NetworkConfigError, NetworkSection,
                                    NetworkSpec, NicRule, NormalLatency, UniformLatency)
from runtime.execution.costs import RECEIVES, SENDS, RuntimeCosts, Side
from sim.cpu import Cpus, io_thread
from sim.faults import REORDER_WAIT, Fate, MessageFaults
from sim.latencies import LinkLatencies
from runtime.network.transport import (Inbound, Inbox, EndpointError, Frame, Transport,
                                       TransportClosed, TransportError, UnknownPeerError,
                                       check_node_name)
from runtime.network.wire import charged_size, message_kind

__all__ = [
    "ConstantLatency",
    "Latency",
    "LinkParams",
    "LinkRule",
    "LinkStats",
    "LogNormalLatency",
    "MessageObserver",
    "Network",
    "NetworkConfigError",
    "NetworkSpec",
    "NicRule",
    "NicStats",
    "NormalLatency",
    "SimTransport",
    "UniformLatency",
]

MessageObserver = Callable[[str, str, int, float, float], None]
"""`on_message(src, dst, nbytes, t_send, t_deliver)`, called as each message is delivered."""


# ------------------------------------------------------------------------------------ counters


@dataclass(slots=True)
class LinkStats:
    """Traffic on one directed link."""

    messages: int = 0
    bytes: int = 0
    dropped: int = 0
    """Messages that arrived at a transport already closed."""
    lost: int = 0
    """Messages a fault dropped (or a partition cut); see `sim.faults`."""
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0


@dataclass(slots=True)
class NicStats:
    """One node's NIC: traffic, busy time and queueing delay, each direction apart (seconds)."""

    messages_out: int = 0
    bytes_out: int = 0
    busy_out: float = 0.0
    wait_out: float = 0.0
    messages_in: int = 0
    bytes_in: int = 0
    busy_in: float = 0.0
    wait_in: float = 0.0


# ------------------------------------------------------------------------------------ the fabric


@dataclass(slots=True)
class _Nic:
    cap: float
    egress_free: float = 0.0
    ingress_free: float = 0.0
    egress_tokens: float = math.inf
    """Bytes in the egress bucket at `egress_free` (with a `burst`; at first more than any
    bucket holds: full)."""
    ingress_tokens: float = math.inf
    stats: NicStats = field(default_factory=NicStats)


def _drain(tokens: float, idle: float, rate: float, bucket: float,
           nbytes: int) -> tuple[float, float]:
    """A message of `nbytes` through a token bucket of `bucket` bytes filling at `rate`, which
    held `tokens` when its direction last went idle, `idle` seconds ago: (seconds it occupies
    the direction, tokens left when it has passed)."""
    have = tokens + idle * rate
    if have > bucket:
        have = bucket
    if nbytes <= have:
        return 0.0, have - nbytes
    return (nbytes - have) / rate, 0.0


@dataclass(slots=True)
class _Link:
    src: str
    dst: str
    seed: int
    src_nic: _Nic
    dst_nic: _Nic
    rate_out: float
    rate_in: float
    bucket_out: float = 0.0
    """Bytes of the sender's egress token bucket on this link (0: none)."""
    bucket_in: float = 0.0
    last_bit: float = 0.0
    """When the last bit of the latest message on this link reaches `dst`."""
    stats: LinkStats = field(default_factory=LinkStats)
    latencies: LinkLatencies = field(init=False)
    """Its latencies, seeded by the link's key (`str(link)`: made when they need it, not
    held as a string by each of 200,000 links)."""

    def __str__(self) -> str:
        return f"{self.seed}:{self.src}->{self.dst}"


_QUIET = contextvars.Context()
"""The context a message's own timers (first bit in, fully taken) run in: they read no context
variables, and copying the sender's for each would cost every message."""


@dataclass(slots=True)
class _Packet:
    link: _Link
    receiver: SimTransport
    peer: str
    frames: list[Frame]
    nbytes: int
    framed: int
    """What it weighs against a rate (`NetworkSpec.wire_bytes`), worked out once as it leaves."""
    sent_at: float
    wire_time: float
    """Seconds its bits take to leave the sender (S / rate_out)."""
    loop: asyncio.AbstractEventLoop
    """The loop it was sent on, whose timers carry it (asked once per message: finding the
    running loop costs a system call, `getpid`)."""


class Network:
    """The simulated fabric of one run: endpoints, links, NICs, latencies and counters."""

    def __init__(
        self,
        spec: NetworkSpec | None = None,
        seed: int = 0,
        on_message: MessageObserver | None = None,
    ) -> None:
        self.spec = spec or NetworkSpec()
        self.seed = seed
        self.on_message = on_message
        self._bound: dict[str, SimTransport] = {}
        self._connected: dict[str, list[SimTransport]] = {}
        self._nics: dict[str, _Nic] = {}
        self._links: dict[str, dict[str, _Link]] = {}
        """Sender -> receiver -> the directed link (a map per sender: no (src, dst) key of
        its own for each of 200,000 links)."""
        self._link_order: list[_Link] = []
        """Every link, in the order they first carried a message."""
        self.faults: MessageFaults | None = None
        """The message faults in force (`sim.faults`); None: none."""
        self._held_back: dict[tuple[str, str], tuple[_Packet, float, int]] = {}
        """A reordered message per link (the packet, its first bit's due time, its copies),
        waiting for the next one to overtake it."""
        self.cpus: Cpus | None = None
        self.costs: RuntimeCosts | None = None
        """The runtime's own costs per message, charged on the nodes' `cpus` (None: free)."""
        self._shaken: set[tuple[str, str]] = set()
        """(node, peer) pairs whose connection's handshake the node's I/O thread has paid."""
        self._paused: dict[str, list[_Packet]] = {}
        """Paused node -> the messages that reached its NIC meanwhile, taken when it resumes."""

    def pause(self, node: str) -> None:
        """`node` stops taking messages: those that reach its NIC wait there (its kernel's
        buffers), in order, until `resume`."""
        self._paused.setdefault(node, [])

    def resume(self, node: str) -> None:
        """`node` takes the messages that waited for it, in the order they came, then the rest
        as they come."""
        for packet in self._paused.pop(node, ()):
            self._hand_over(packet)

    @classmethod
    def from_spec(
        cls,
        spec: NetworkSection | Mapping[str, Any] | None,
        seed: int,
        on_message: MessageObserver | None = None,
    ) -> Network:
        """A network from a scenario's `network` section (validated, or a plain mapping
        validated here; None: ideal) and its seed."""
        return cls(NetworkSpec.parse(spec), seed, on_message)

    def transport(self, name: str) -> SimTransport:
        """A new, unconnected transport for node `name` on this network."""
        return SimTransport(self, name)

    def link_stats(self) -> dict[tuple[str, str], LinkStats]:
        """Live counters of every directed link (src, dst) that carried a message."""
        return {(link.src, link.dst): link.stats for link in self._link_order}

    def nic_stats(self) -> dict[str, NicStats]:
        """Live counters of every node's NIC that sent or received a message."""
        return {name: nic.stats for name, nic in self._nics.items()}

    # -- endpoints ----------------------------------------------------------------------------

    def _bind(self, server: SimTransport, endpoint: str) -> None:
        owner = self._bound.get(endpoint)
        if owner is not None:
            raise EndpointError(server.name, endpoint, f"address in use by node {owner.name!r}")
        self._bound[endpoint] = server
        for client in self._connected.get(endpoint, []):
            server._admit(client, endpoint)

    def _connect(self, client: SimTransport, endpoint: str) -> None:
        self._connected.setdefault(endpoint, []).append(client)
        server = self._bound.get(endpoint)
        if server is not None:
            server._admit(client, endpoint)

    def _leave(self, node: SimTransport, bound: list[str], connected: list[str]) -> None:
        """Forget a closing transport: its endpoints are free, its connections gone."""
        for endpoint in bound:
            del self._bound[endpoint]
        for endpoint in connected:
            self._connected[endpoint].remove(node)
            server = self._bound.get(endpoint)
            if server is not None:
                server._forget(node)

    # -- moving messages ----------------------------------------------------------------------

    def _transmit(
        self, sender: str, receiver: SimTransport, peer: str, frames: list[Frame]
    ) -> None:
        """Put a message on the sender's NIC; `peer` is who the receiver will see it from."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        links = self._links.get(sender)
        link = (links.get(receiver.name) if links is not None else None) \
            or self._link(sender, receiver.name)
        nbytes = charged_size(frames)
        framed = self.spec.wire_bytes(nbytes)
        nic = link.src_nic
        egress_free = nic.egress_free
        start = now if now > egress_free else egress_free
        if link.bucket_out:
            wire_time, nic.egress_tokens = _drain(nic.egress_tokens, start - egress_free,
                                                  link.rate_out, link.bucket_out, framed)
        else:
            wire_time = framed / link.rate_out
        nic.egress_free = start + wire_time
        stats = nic.stats
        stats.messages_out += 1
        stats.bytes_out += nbytes
        stats.busy_out += wire_time
        stats.wait_out += start - now
        link.stats.messages += 1
        link.stats.bytes += nbytes
        packet = _Packet(link, receiver, peer, frames, nbytes, framed, now, wire_time, loop)
        self._deliver(packet, start + link.latencies.next())

    def _deliver(self, packet: _Packet, first_bit: float) -> None:
        """Carry `packet` across its link, its first bit due at `first_bit`.

        The one path every message takes between the sender's NIC and the receiver's: fault
        injection decides here whether it is dropped, duplicated, delayed or cut off.
        """
        faults = self.faults
        if faults is not None and (faults.partitions or faults.rules):
            fate = faults.fate(packet.link.src, packet.link.dst)
            if fate is not None:
                self._suffer(packet, first_bit, fate)
                return
        self._schedule(packet, first_bit)
        if self._held_back:
            self._release_held_back(packet.link)

    def _schedule(self, packet: _Packet, first_bit: float) -> None:
        link = packet.link
        arrival = max(first_bit, link.last_bit)
        link.last_bit = arrival + packet.wire_time
        packet.loop.call_at(arrival, self._arrive, packet, context=_QUIET)

    def _suffer(self, packet: _Packet, first_bit: float, fate: Fate) -> None:
        """Deliver `packet` as its fate says (see `sim.faults.MessageFaults`)."""
        link = packet.link
        if fate.lost:
            link.stats.lost += 1
            return
        link.stats.delayed += fate.delay > 0
        link.stats.duplicated += fate.copies - 1
        first_bit += fate.delay
        key = (link.src, link.dst)
        if fate.reorder and key not in self._held_back:
            link.stats.reordered += 1
            self._held_back[key] = (packet, first_bit, fate.copies)
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + REORDER_WAIT, self._release_held_back, link, packet)
            return
        for _ in range(fate.copies):
            self._schedule(packet, first_bit)
        self._release_held_back(link)

    def _release_held_back(self, link: _Link, only: _Packet | None = None) -> None:
        """Send the message held back on `link` (after the one just sent), if any; `only`: if
        it is that one still (its wait ran out)."""
        held = self._held_back.get((link.src, link.dst))
        if held is None or (only is not None and held[0] is not only):
            return
        del self._held_back[link.src, link.dst]
        packet, first_bit, copies = held
        for _ in range(copies):
            self._schedule(packet, first_bit)

    def _arrive(self, packet: _Packet) -> None:
        """The first bit is in: queue on the receiver's NIC, deliver once fully taken."""
        loop = packet.loop
        now = loop.time()
        link = packet.link
        nic = link.dst_nic
        ingress_free = nic.ingress_free
        start = now if now > ingress_free else ingress_free
        nbytes, framed = packet.nbytes, packet.framed
        if link.bucket_in:
            busy, nic.ingress_tokens = _drain(nic.ingress_tokens, start - ingress_free,
                                              link.rate_in, link.bucket_in, framed)
        else:
            busy = framed / link.rate_in
        done = nic.ingress_free = start + busy
        stats = nic.stats
        stats.messages_in += 1
        stats.bytes_in += nbytes
        stats.busy_in += busy
        stats.wait_in += start - now
        last_bit = now + packet.wire_time
        loop.call_at(done if done > last_bit else last_bit, self._hand_over, packet,
                     context=_QUIET)

    def message_cost(self, side: Side, frames: list[Frame], nbytes: int) -> float:
        """What handling `frames` (`nbytes`, as `charged_size` weighs them) on `side` costs the
        node (the runtime's costs; 0 if none)."""
        costs = self.costs
        if costs is None:
            return 0.0
        return costs.message(side, message_kind(frames) or "*", nbytes)

    def io_cost(self, costs: RuntimeCosts, node: str, peer: str, nbytes: int) -> float:
        """What a message of `nbytes` to or from `peer` costs `node`'s I/O thread: ZeroMQ's
        work, its encryption where the job is encrypted, and on the first message between
        them the connection's handshake (`RuntimeCosts.curve`)."""
        seconds = costs.io_seconds(nbytes)
        if costs.curve is not None and (node, peer) not in self._shaken:
            self._shaken.add((node, peer))
            seconds += costs.handshake()
        return seconds

    def _hand_over(self, packet: _Packet) -> None:
        """The message is in the receiver's NIC: its I/O thread takes it (where the runtime's
        costs are charged), then `_take`."""
        receiver = packet.receiver
        if receiver.closed:
            packet.link.stats.dropped += 1
            return
        if self._paused and (waiting := self._paused.get(receiver.name)) is not None:
            waiting.append(packet)
            return
        cpus, costs = self.cpus, self.costs
        if cpus is not None and costs is not None:
            cpus.run(io_thread(receiver.name),
                     self.io_cost(costs, receiver.name, packet.link.src, packet.nbytes),
                     self._take, packet, lane="<" + packet.link.src)
        else:
            self._take(packet)
        on_message = self.on_message
        if on_message is not None:
            link = packet.link
            on_message(link.src, link.dst, packet.nbytes, packet.sent_at, packet.loop.time())

    def _take(self, packet: _Packet) -> None:
        """Hand the message to the receiving node: into its inbox (it pays its receive cost
        when it takes it: `SimTransport.recv`), or to its handler once its main thread has."""
        receiver = packet.receiver
        if receiver.closed:
            packet.link.stats.dropped += 1
            return
        handler = receiver._handler
        if handler is None:
            receiver._inbox.put_nowait((packet.peer, packet.frames))
        elif self.cpus is not None and self.costs is not None:
            self.cpus.run(receiver.name, self.message_cost(RECEIVES, packet.frames,
                                                           packet.nbytes),
                          handler, packet.peer, packet.frames)
        else:
            handler(packet.peer, packet.frames)

    def _link(self, src: str, dst: str) -> _Link:
        links = self._links.get(src)
        if links is None:
            links = self._links[src] = {}
        link = links.get(dst)
        if link is None:
            latency, bandwidth = self.spec.link(src, dst)
            src_nic, dst_nic = self._nic(src), self._nic(dst)
            rate_out, rate_in = min(bandwidth, src_nic.cap), min(bandwidth, dst_nic.cap)
            link = _Link(src, dst, self.seed, src_nic, dst_nic, rate_out, rate_in,
                         _bucket(self.spec.burst, rate_out), _bucket(self.spec.burst, rate_in))
            link.latencies = LinkLatencies(latency, link)
            links[dst] = link
            self._link_order.append(link)
        return link

    def _nic(self, node: str) -> _Nic:
        nic = self._nics.get(node)
        if nic is None:
            nic = self._nics[node] = _Nic(self.spec.nic_bandwidth(node))
        return nic


def _bucket(burst: float, rate: float) -> float:
    """Bytes of a token bucket of `burst` seconds at `rate` (0 for an unlimited rate; the one
    float 0.0 without a burst, not a new one for each of 200,000 links)."""
    return burst * rate if burst and rate < math.inf else 0.0


def _frozen(frame: Frame) -> memoryview:
    """`frame` as a read-only flat byte view, as a ZeroMQ receiver gets it, without a copy."""
    if isinstance(frame, bytes):  # immutable and flat already
        return memoryview(frame)
    view = memoryview(frame)
    if not view.readonly:
        view = view.toreadonly()
    if view.ndim != 1 or view.format != "B" or not view.c_contiguous:
        view = view.cast("B")  # raises TypeError for a buffer that is not contiguous
    return view


# ---------------------------------------------------------------------------------- transport




class SimTransport(Transport):
    """One node's `Transport` on a simulated `Network`; see the module doc for its rules."""

    def __init__(self, network: Network, name: str) -> None:
        self.name = check_node_name(name)
        self.network = network
        self.closed = False
        self._bound: list[str] = []
        self._held: dict[str, list[list[Frame]] | tuple[()]] = {}
        """Connected endpoint -> messages waiting for a node to bind it (once a node did, the
        empty tuple until one must wait again: a trainer of a 1,000-trainer job connects to
        100 endpoints, which need no list each)."""
        self._clients: dict[str, tuple[SimTransport, str]] = {}
        """Client node name -> (its transport, the endpoint it connected to)."""
        self._inbox = Inbox()
        self._handler: Callable[[str, list[Frame]], None] | None = None
        """Where messages go instead of the inbox (`deliver_to`)."""

    async def bind(self, endpoint: str) -> str:
        self._check_open("bind")
        _check_endpoint(self.name, endpoint)
        self.network._bind(self, endpoint)
        self._bound.append(endpoint)
        return endpoint

    async def connect(self, endpoint: str) -> None:
        self._check_open("connect")
        _check_endpoint(self.name, endpoint)
        if endpoint in self._held:
            raise EndpointError(self.name, endpoint, "already connected")
        self._held[endpoint] = []
        self.network._connect(self, endpoint)

    async def send(self, peer: str, frames: Sequence[Frame]) -> None:
        self.send_nowait(peer, frames)

    def send_nowait(self, peer: str, frames: Sequence[Frame]) -> bool:
        self._check_open("send")
        if not frames:
            raise ValueError(f"node {self.name!r}: a message to {peer!r} needs at least one frame")
        message: list[Frame] = list(map(_frozen, frames))
        network = self.network
        if network.cpus is not None and network.costs is not None:
            if peer not in self._held and peer not in self._clients:
                raise UnknownPeerError(self.name, peer)
            nbytes = charged_size(message)
            network.cpus.run(self.name, network.message_cost(SENDS, message, nbytes),
                             self._to_io, peer, message, nbytes)
            return True
        return self._route(peer, message)

    def _to_io(self, peer: str, message: list[Frame], nbytes: int) -> None:
        """The main thread has sent `message`: this node's I/O thread moves it out."""
        cpus, costs = self.network.cpus, self.network.costs
        assert cpus is not None and costs is not None
        cpus.run(io_thread(self.name), self.network.io_cost(costs, self.name, peer, nbytes),
                 self._route, peer, message, True, lane=">" + peer)

    def _route(self, peer: str, message: list[Frame], later: bool = False) -> bool:
        """Put `message` on its way to `peer` (or hold it until its endpoint is bound); after
        the sender's CPU did its part, the transport may have closed: then it is dropped."""
        if self.closed:
            return True
        held = self._held.get(peer)
        if held is not None:
            server = self.network._bound.get(peer)
            if server is None:
                if not isinstance(held, list):
                    held = self._held[peer] = []
                held.append(message)
            else:
                self.network._transmit(self.name, server, self.name, message)
            return True
        client = self._clients.get(peer)
        if client is None:
            if later:  # the client left while this node was busy: as a lost reply
                return True
            raise UnknownPeerError(self.name, peer)
        self.network._transmit(self.name, client[0], client[1], message)
        return True

    def deliver_to(self, handler: Callable[[str, list[Frame]], None]) -> bool:
        self._check_open("deliver")
        self._handler = handler
        return True

    def recv(self) -> Coroutine[Any, Any, Inbound]:  # the inbox's own wait: one frame less
        self._check_open("recv")
        if self.network.cpus is None or self.network.costs is None:
            return self._inbox.get()
        return self._recv_paid()

    async def _recv_paid(self) -> Inbound:
        """The next message, once this node's CPU has received it (decode, dispatch: the
        runtime's receive cost)."""
        peer, frames = await self._inbox.get()
        cpus = self.network.cpus
        assert cpus is not None
        await cpus.spend(self.name, self.network.message_cost(RECEIVES, frames,
                                                              charged_size(frames)))
        return peer, frames

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.network._leave(self, self._bound, list(self._held))
        self._bound.clear()
        self._held.clear()
        self._clients.clear()
        self._inbox.fail(TransportClosed(self.name, "recv"))

    def _admit(self, client: SimTransport, endpoint: str) -> None:
        """`client` reached us through `endpoint`: route its name, send what it held for us."""
        self._clients[client.name] = (client, endpoint)
        held = client._held[endpoint]
        client._held[endpoint] = ()
        for message in held:
            self.network._transmit(client.name, self, client.name, message)

    def _forget(self, client: SimTransport) -> None:
        entry = self._clients.get(client.name)
        if entry is not None and entry[0] is client:
            del self._clients[client.name]

    def _check_open(self, operation: str) -> None:
        if self.closed:
            raise TransportClosed(self.name, operation)


def _check_endpoint(name: str, endpoint: str) -> None:
    if not isinstance(endpoint, str) or not endpoint:
        raise EndpointError(name, str(endpoint), "an endpoint must be a non-empty string")
