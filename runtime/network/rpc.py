"""Request/reply over a `Transport`: message ids, deadlines, retries with backoff.

`RpcClient.call(endpoint, kind, ...)` sends a request with a fresh message id and waits for the
reply carrying the same id. If none comes within the retry interval the same message (same id)
is sent again until the call's deadline, which counts from the last sign of life: a server
holding the request until other trainers catch up answers a retry with a ``pending`` notice,
and the wait starts over, so only a silent server makes a call time out; the server
deduplicates by (sender, id), so a retried gradient is applied once. A reply of kind ERROR
raises `RemoteError`; a deadline that passes raises `RpcTimeout` naming the endpoint, the request
and the wait.

The interval doubles (up to `RetryPolicy.max_interval`) only while the server gives no sign
that the answer is simply lost, so that neither a busy server nor a long round is polled hard:
- a server that has answered a request started after this one's latest attempt (messages
  from one client are served in order) has passed this attempt by: the attempt or its reply
  was lost, and the next resend comes after `first_retry` again;
- a request held with a pending notice at the server's step s is asked again as soon as any
  message from that server carries a later step (`_Call.hurry`): the round it waited for is
  over, so its answer was lost or it waits anew. Until then its resends back off.
Under heavy message loss a step then waits about `first_retry` per lost message, or until the
next message from that server (a heartbeat), not the grown backoff (up to 10 s each).

A call whose bytes take long to move waits longer before its first resend (`RpcClient.
first_wait`): the client learns each endpoint's pace, the seconds a byte of a call took there
from request to reply (calls of at least `PACE_MIN_BYTES` that the server never held;
smoothed), and waits `PACE_MARGIN` times what the call's request and the reply
the endpoint last gave to a call of its kind take at that pace. DESIGN: without it, a 67 MB
SEND of four trainers to one pserver behind a 1 Gbit/s NIC, which takes 2 s to arrive, was
sent again after 1 s and again after 2 s more, each copy queued behind the first on the same
connection: three times the bytes, and 6.9 s steps where paced calls take 2.9 s. A resend of
a lost request then waits as long as the bytes took; the backoff grows from there.

A node that restarts passes its `incarnation` (how many times it started before) so that its
message ids do not repeat its earlier life's. Replies reach the client from one reader task, or
straight from the transport where it can hand them over (`Transport.deliver_to`, the
simulator's); a reply to a call that already gave up is dropped. All waiting goes through the
running loop, so the same code runs on a virtual clock.

DESIGN: a call is a future driven by callbacks (`_Call`: sent at once where the transport can
send without waiting, resent or failed when its attempt's timeout fires, answered when its
reply comes), not a task: a simulation makes millions of calls, and a trainer sends to every
pserver at once. `start` returns the future; `call` is its awaitable form. A client times its
calls' attempts out on one loop timer (`_Timeouts`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

from runtime.execution.costs import RECEIVES, SENDS, Meter
from runtime.network.transport import Frame, Transport, TransportClosed, TransportError
from runtime.network.wire import (DecodeError, Kind, Message, charged_size, decode, encode,
                                  raise_for_error)

log = logging.getLogger(__name__)


class RpcTimeout(TimeoutError):
    """A request got no reply before its deadline."""

    def __init__(self, src: str, endpoint: str, kind: Kind, step: int, waited: float,
                 attempts: int, node: str | None = None) -> None:
        where = f"{node} at {endpoint}" if node else endpoint
        super().__init__(f"{src}: no reply from {where} to {kind} (step {step}) after "
                         f"{waited:.3g}s and {attempts} attempt(s)")
        self.endpoint = endpoint
        self.kind = kind


@dataclass(frozen=True)
class RetryPolicy:
    deadline: float = 60.0        # seconds a call may take in all
    first_retry: float = 2.0      # seconds before the first resend
    max_interval: float = 10.0    # cap of the backoff between resends
    backoff: float = 2.0

    def __post_init__(self) -> None:
        if self.deadline <= 0 or self.first_retry <= 0 or self.backoff < 1:
            raise ValueError(f"RetryPolicy: deadline and first_retry must be > 0 and backoff "
                             f">= 1, got {self}")


class _Timeouts:
    """When the current attempts of one client's calls stop waiting, on one loop timer.

    Replies come in milliseconds and retry intervals are seconds, so a loop timer per attempt
    would fill the loop's timer heap with timers nearly all cancelled, at a cost to every other
    timer. Instead the client keeps its own heap of ``[when, seq, call]`` and one loop timer at
    the earliest; when it fires, every call due `expire`s, exactly at the time a timer of its
    own would have fired. A call that got its answer drops its entry (`drop`); dropped entries
    are swept out once they are half the heap, and skipped when they come to the top.
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()
        self._timer: asyncio.Handle | None = None
        self._due = math.inf
        """When `_timer` fires (a handle need not say: uvloop's for a time past is a plain one)."""
        self._dropped = 0

    def add(self, when: float, call: _Call) -> list[Any]:
        """Expire `call` at `when` unless it is dropped by then; the entry to `drop` after."""
        entry = [when, next(self._seq), call]
        heapq.heappush(self._heap, entry)
        if when < self._due:
            self._arm(when)
        return entry

    def drop(self, entry: list[Any]) -> None:
        """The wait of `entry` is over: forget its call."""
        if entry[2] is None:
            return
        entry[2] = None
        self._dropped += 1
        if self._dropped > _SWEEP_MIN and 2 * self._dropped > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2] is not None]
            heapq.heapify(self._heap)
            self._dropped = 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._due = None, math.inf

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)
        self._due = when

    def _fire(self) -> None:
        self._timer, self._due = None, math.inf
        heap, now = self._heap, asyncio.get_running_loop().time()
        while heap and (heap[0][0] <= now or heap[0][2] is None):
            entry = heapq.heappop(heap)
            call = entry[2]
            if call is None:
                self._dropped -= 1
                continue
            entry[2] = None
            call.expire()  # may add entries (a resend), arming the timer at the earliest
        if heap and heap[0][0] < self._due:  # an entry older than those added comes first
            self._arm(heap[0][0])


PACE_MIN_BYTES = 1 << 20
"""Calls that move at least this many bytes (request and reply, as a network weighs them:
`charged_size`) teach the client an endpoint's pace; smaller ones are mostly round trip."""

PACE_MARGIN = 3.0
"""A call waits this many times its bytes' time at the endpoint's pace before a first resend."""

PACE_WEIGHT = 0.25
"""The weight of a new sample in an endpoint's smoothed pace."""

PENDING_FIELD = "pending"
"""The field of a reply that is a pending notice (``pending: true``): the server holds the
request and answers it later; the call goes on waiting."""

_SWEEP_MIN = 64
"""`_Timeouts` sweeps its dropped entries out once there are more than this many (and they are
half its heap)."""


class _Call:
    """One request in flight: its frames, where its retries stand, and the future its caller
    awaits. Driven by callbacks (a reply, a pending notice, its attempt's timeout), not by a
    task of its own: a simulation makes millions of calls."""

    __slots__ = ("client", "endpoint", "msg", "frames", "size", "limit", "start", "heard",
                 "interval", "first", "attempts", "future", "entry", "check", "held_at",
                 "after", "was_held")

    def __init__(self, client: RpcClient, endpoint: str, msg: Message, limit: float,
                 check: Callable[[str, Message], None] | None) -> None:
        loop = asyncio.get_running_loop()
        self.client = client
        self.endpoint = endpoint
        self.msg = msg
        self.frames = encode(msg)
        self.size = charged_size(self.frames)
        """The request's bytes as a network weighs them (phantoms as the data they stand for)."""
        self.limit = limit
        self.start = self.heard = loop.time()
        """`heard`: when the server last showed it is alive (a pending notice), or `start`."""
        self.first = self.interval = client.first_wait(endpoint, msg.kind, self.size)
        """`first`: the wait before a first resend, and after one the server showed lost."""
        self.attempts = 0
        self.future: asyncio.Future[Message] = loop.create_future()
        self.entry: list[Any] | None = None
        self.check = check
        self.held_at: int | None = None
        """The server's step in its latest pending notice (None: no notice, or asked again)."""
        self.after = 0
        """The id of the first request started after this one's latest attempt."""
        self.was_held = False

    def attempt(self) -> None:
        """Send the request (again) and wait for its reply until the retry interval or the
        deadline, whichever comes first."""
        self.attempts += 1
        if self.attempts > 1:
            self.client.resends += 1
        self.after = self.client._next_id
        self.client._send(self)
        now = self.future.get_loop().time()  # not get_running_loop(): that one costs a getpid
        left = self.heard + self.limit - now
        if left <= 0:
            self.fail(self.timeout(now))
            return
        self.entry = self.client._timeouts.add(now + min(self.interval, left), self)

    def expire(self) -> None:
        """The current attempt's wait ran out: resend with backoff, or time out."""
        self.entry = None
        if self.future.done():  # cancelled by its caller meanwhile
            self.settle()
            return
        now = self.future.get_loop().time()
        if now - self.heard >= self.limit:
            self.fail(self.timeout(now))
            return
        log.debug("%s: resending %s id %d to %s", self.client.name, self.msg.kind, self.msg.id,
                  self.endpoint)
        policy = self.client.policy
        if self.held_at is None and self.client._latest.get(self.endpoint, -1) >= self.after:
            self.interval = self.first  # answering a later request: this one was lost
        else:
            self.interval = min(self.interval * policy.backoff,
                                max(policy.max_interval, self.first))
        self.attempt()

    def answer(self, reply: Message) -> None:
        """The reply came: the call's result, or its error (`RemoteError`, or what `check`
        raises)."""
        self.settle()
        if self.future.done():
            return
        try:
            result = raise_for_error(reply)
            if self.check is not None:
                self.check(self.endpoint, result)
        except Exception as exc:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def notice(self, pending: Message) -> None:
        """A pending notice came: the call goes on waiting, unless `check` refuses it."""
        self.heard = self.future.get_loop().time()  # alive, still busy
        self.was_held = True
        if self.held_at is None:
            self.client._held.setdefault(self.endpoint, {})[self.msg.id] = self
        self.held_at = pending.step
        if self.check is None:
            return
        try:
            self.check(self.endpoint, pending)
        except Exception as exc:
            self.fail(exc)

    def hurry(self) -> None:
        """The server has moved past the step it held the request at, and no answer came: it
        was lost on the way, or the request waits again. Ask now, and from then on as a fresh
        request does (`first_retry`, then backoff): the long wait the backoff grew for is over."""
        if self.future.done():  # cancelled by its caller meanwhile
            self.settle()
            return
        self.unhold()
        if self.entry is not None:
            self.client._timeouts.drop(self.entry)
            self.entry = None
        self.interval = self.first
        self.attempt()

    def unhold(self) -> None:
        """A held call (`held_at` set) is no longer held as far as the client knows."""
        self.held_at = None
        held = self.client._held[self.endpoint]
        del held[self.msg.id]
        if not held:
            del self.client._held[self.endpoint]

    def fail(self, exc: BaseException) -> None:
        self.settle()
        if not self.future.done():
            self.future.set_exception(exc)

    def settle(self) -> None:
        """Stop waiting: forget the call and its attempt's timeout."""
        self.client._waiting.pop(self.msg.id, None)
        if self.entry is not None:
            self.client._timeouts.drop(self.entry)
            self.entry = None
        if self.held_at is not None:
            self.unhold()

    def timeout(self, now: float) -> RpcTimeout:
        client = self.client
        return RpcTimeout(client.name, self.endpoint, self.msg.kind, self.msg.step,
                          now - self.start, self.attempts, client.labels.get(self.endpoint))


class RpcClient:
    """A node's client side: calls to pserver endpoints over one transport."""

    def __init__(self, transport: Transport, policy: RetryPolicy | None = None,
                 max_message_size: int = 1 << 30, incarnation: int = 0,
                 labels: Mapping[str, str] | None = None) -> None:
        self.transport = transport
        self.labels = dict(labels or {})
        """Endpoint -> the node's name, for errors (``pserver:1 at host:port``)."""
        self.policy = policy or RetryPolicy()
        self.max_message_size = max_message_size
        # A restarted node numbers its messages apart from its earlier life's, which the
        # servers still remember replies to (their dedupe is by sender name and id).
        self._next_id = (incarnation << 32) + 1
        self._waiting: dict[int, _Call] = {}
        """Request id -> its call, until it is answered, fails or is cancelled."""
        self._timeouts = _Timeouts()
        self._latest: dict[str, int] = {}
        """Endpoint -> the highest request id it has answered (or sent a pending notice for)."""
        self._held: dict[str, dict[int, _Call]] = {}
        """Endpoint -> its calls that a pending notice said the server holds (`_Call.held_at`)."""
        self.resends = 0
        """Requests sent again so far (each attempt after a call's first)."""
        self._pace: dict[str, float] = {}
        """Endpoint -> seconds a byte of its calls took, smoothed (see `first_wait`)."""
        self._reply_size: dict[tuple[str, Kind], int] = {}
        """(endpoint, request kind) -> the bytes of its latest reply to such a request."""
        self._connected: set[str] = set()
        self._reader: asyncio.Task[None] | None = None
        self._pushed = False
        """The transport hands replies to `_on_message` itself (no reader task)."""
        self.meter: Meter | None = None
        """Measures what each request and reply costs this node (`runtime profile`)."""
        self.peer_messages: Callable[[str, Message], None] | None = None
        """Where messages that answer no request go (`Kind.COLLECTIVE`: a ring neighbour's part
        of a collective op); without it they are dropped with a warning."""

    @property
    def name(self) -> str:
        return self.transport.name

    @property
    def next_id(self) -> int:
        """The message id the next request started will carry (ids only grow)."""
        return self._next_id

    def first_wait(self, endpoint: str, kind: Kind, size: int) -> float:
        """How long a call of `kind` with a request of `size` bytes to `endpoint` waits before
        its first resend: `RetryPolicy.first_retry`, or `PACE_MARGIN` times the time its request
        and the endpoint's latest reply of its kind take at the endpoint's pace, if longer."""
        first = self.policy.first_retry
        pace = self._pace.get(endpoint)
        if pace is None:
            return first
        return max(first, PACE_MARGIN * pace * (size + self._reply_size.get((endpoint, kind), 0)))

    def _learn_pace(self, call: _Call, reply_size: int) -> None:
        """A call's answer came: remember its reply's size and, from a call whose bytes took
        long enough to tell and whose time is its own (never held by the server), the
        endpoint's pace. Counted from the first attempt even where it was sent again: the
        resends of a call whose bytes were still on their way queue behind them, and a pace
        that comes out long from a lost attempt only delays the next resend."""
        endpoint = call.endpoint
        self._reply_size[(endpoint, call.msg.kind)] = reply_size
        moved = call.size + reply_size
        if moved < PACE_MIN_BYTES or call.was_held:
            return
        sample = (call.future.get_loop().time() - call.start) / moved
        pace = self._pace.get(endpoint)
        self._pace[endpoint] = sample if pace is None else pace + PACE_WEIGHT * (sample - pace)

    async def connect(self, endpoints: list[str]) -> None:
        for ep in endpoints:
            if ep not in self._connected:
                await self.transport.connect(ep)
                self._connected.add(ep)
        if self._reader is None and not self._pushed:
            self._pushed = self.transport.deliver_to(self._on_message)
            if not self._pushed:
                self._reader = asyncio.get_running_loop().create_task(
                    self._read(), name=f"{self.name} rpc reader")

    async def call(self, endpoint: str, kind: Kind, step: int = 0,
                   vars: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
                   deadline: float | None = None) -> Message:
        """Send a request to `endpoint` and return its reply (resending until the deadline)."""
        if endpoint not in self._connected:
            await self.connect([endpoint])
        return await self.start(endpoint, kind, step, vars, extra, deadline)

    def start(self, endpoint: str, kind: Kind, step: int = 0,
              vars: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
              deadline: float | None = None,
              check: Callable[[str, Message], None] | None = None) -> asyncio.Future[Message]:
        """`call` without a coroutine: the request leaves now (if the transport can send
        without waiting) and the future holds its reply. `check(endpoint, reply)` may raise to
        make a reply the call's error instead."""
        if endpoint not in self._connected:
            return asyncio.ensure_future(self._connect_then_start(
                endpoint, kind, step, vars, extra, deadline, check))
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        msg = Message.of(kind, self._next_id, self.name, step, vars or {}, extra or {})
        self._next_id += 1
        call = _Call(self, endpoint, msg, self.policy.deadline if deadline is None else deadline,
                     check)
        self._waiting[msg.id] = call
        call.attempt()
        if meter is not None:
            meter.stop_message(started, SENDS, kind.value, call.size)
        return call.future

    async def tell(self, endpoint: str, kind: Kind, step: int = 0,
                   extra: Mapping[str, Any] | None = None) -> None:
        """Send a message that wants no reply (`Kind.BYE`) once, never retried: its loss costs
        the receiver time, not correctness. A transport that cannot send it is logged."""
        msg = Message.of(kind, self._next_id, self.name, step, {}, extra or {})
        self._next_id += 1
        frames = encode(msg)
        try:
            if endpoint not in self._connected:
                await self.connect([endpoint])
            if not self.transport.send_nowait(endpoint, frames):
                await self.transport.send(endpoint, frames)
        except TransportError as exc:
            log.info("%s: %s to %s not sent: %s", self.name, kind, endpoint, exc)

    async def _connect_then_start(self, endpoint: str, kind: Kind, step: int,
                                  vars: Mapping[str, Any] | None,
                                  extra: Mapping[str, Any] | None, deadline: float | None,
                                  check: Callable[[str, Message], None] | None) -> Message:
        await self.connect([endpoint])
        return await self.start(endpoint, kind, step, vars, extra, deadline, check)

    def _send(self, call: _Call) -> None:
        """Put `call`'s request on the transport: at once where it can, else by a task (a
        send that must wait for room), which fails the call if the send does."""
        try:
            if self.transport.send_nowait(call.endpoint, call.frames):
                return
        except Exception as exc:  # closed, or an endpoint it cannot route to
            call.fail(exc)
            return
        asyncio.get_running_loop().create_task(self._send_later(call))

    async def _send_later(self, call: _Call) -> None:
        try:
            await self.transport.send(call.endpoint, call.frames)
        except Exception as exc:
            call.fail(exc)

    async def _read(self) -> None:
        while True:
            try:
                peer, frames = await self.transport.recv()
            except TransportClosed:
                return
            self._on_message(peer, frames)

    def _on_message(self, peer: str, frames: list[Frame]) -> None:
        meter = self.meter
        started = 0.0 if meter is None else meter.start()
        try:
            msg = decode(frames, self.max_message_size)
        except DecodeError as exc:
            log.warning("%s: dropping a malformed reply from %s: %s", self.name, peer, exc)
            if meter is not None:
                meter.discard(started)
            return
        size = charged_size(frames)
        if msg.kind is Kind.COLLECTIVE:
            if self.peer_messages is not None:
                self.peer_messages(peer, msg)
            else:
                log.warning("%s: dropping a collective message from %s: no collective ops here",
                            self.name, peer)
        else:
            self._resolve(msg, peer, size)
        if meter is not None:
            meter.stop_message(started, RECEIVES, msg.kind.value, size)

    def _resolve(self, msg: Message, peer: str, size: int = 0) -> None:
        """Hand a reply to the call waiting for it, or note a pending notice; a reply to a call
        that is over (answered, timed out, cancelled), or from another peer than the call's,
        is dropped. A pending notice goes through the call's `check` too (which may fail it:
        a server that says it holds the request but can never answer it). Any message from the
        server at a later step than one of its held calls was held at hurries that call."""
        call = self._waiting.get(msg.id)
        if call is not None and call.endpoint == peer:
            if msg.id > self._latest.get(peer, -1):
                self._latest[peer] = msg.id
            if call.future.done():  # cancelled by its caller
                call.settle()
            elif msg.kind is Kind.REPLY and msg.extra.get(PENDING_FIELD) is True:
                call.notice(msg)
            else:
                self._learn_pace(call, size)
                call.answer(msg)
        held = self._held.get(peer)
        if held is not None:
            step = msg.step
            for waiting in [c for c in held.values() if cast(int, c.held_at) < step]:
                waiting.hurry()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
            self._reader = None
        for call in list(self._waiting.values()):
            call.future.cancel()
            call.settle()
        self._timeouts.close()
        await self.transport.close()
