"""Request/reply over a `Transport`: message ids, deadlines, retries with backoff.

`RpcClient.call(endpoint, kind, ...)` sends a request with a fresh message id and waits for the
reply carrying the same id. If none comes within the retry interval the same message (same id)
is sent again, with exponential backoff, until the call's deadline, which counts from the last
sign of life: a server holding the request until other trainers catch up answers a retry with a
``pending`` notice, and the wait starts over, so only a silent server makes a call time out; the server deduplicates by
(sender, id), so a retried gradient is applied once. A reply of kind ERROR raises `RemoteError`;
a deadline that passes raises `RpcTimeout` naming the endpoint, the request and the wait.

A node that restarts passes its `incarnation` (how many times it started before) so that its
message ids do not repeat its earlier life's. One reader task takes every incoming message off the transport and resolves the matching call;
a reply to a call that already gave up is dropped. All waiting goes through the running loop,
so the same code runs on a virtual clock. A call awaits its reply's future directly (no
`wait_for`/`shield` wrappers), and a client times its calls' attempts out on one loop timer
(`_Timeouts`): a simulation makes millions of calls.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .transport import Transport, TransportClosed
from .wire import DecodeError, Kind, Message, decode, encode, raise_for_error

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
    timer. Instead the client keeps its own heap of ``[when, seq, reply]`` and one loop timer at
    the earliest; when it fires, every reply due is resolved with None ("timed out"), exactly
    at the time a timer of its own would have fired. A call that got its answer drops its entry
    (`drop`), which lets its reply go; dropped entries are swept out once they are half the
    heap, and skipped when they come to the top.
    """

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()
        self._timer: asyncio.Handle | None = None
        self._due = math.inf
        """When `_timer` fires (a handle need not say: uvloop's for a time past is a plain one)."""
        self._dropped = 0

    def add(self, when: float, reply: asyncio.Future[Message | None]) -> list[Any]:
        """Time `reply` out at `when` unless it is done by then; the entry to `drop` after."""
        entry = [when, next(self._seq), reply]
        heapq.heappush(self._heap, entry)
        if when < self._due:
            self._arm(when)
        return entry

    def drop(self, entry: list[Any]) -> None:
        """The wait of `entry` is over: forget its reply."""
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
            reply = entry[2]
            if reply is None:
                self._dropped -= 1
                continue
            entry[2] = None
            if not reply.done():
                reply.set_result(None)
        if heap:
            self._arm(heap[0][0])


_SWEEP_MIN = 64
"""`_Timeouts` sweeps its dropped entries out once there are more than this many (and they are
half its heap)."""


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
        self._ids = itertools.count((incarnation << 32) + 1)
        self._waiting: dict[int, asyncio.Future[Message | None]] = {}
        """Request id -> its reply once it comes (None: the current attempt timed out)."""
        self._timeouts = _Timeouts()
        self._heard: dict[int, float] = {}  # message id -> when its server last said "pending"
        self._connected: set[str] = set()
        self._reader: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.transport.name

    async def connect(self, endpoints: list[str]) -> None:
        for ep in endpoints:
            if ep not in self._connected:
                await self.transport.connect(ep)
                self._connected.add(ep)
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(
                self._read(), name=f"{self.name} rpc reader")

    async def call(self, endpoint: str, kind: Kind, step: int = 0,
                   vars: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None,
                   deadline: float | None = None) -> Message:
        """Send a request to `endpoint` and return its reply (resending until the deadline)."""
        if endpoint not in self._connected:
            await self.connect([endpoint])
        msg = Message(kind, next(self._ids), self.name, step, vars or {}, extra or {})
        frames = encode(msg)
        loop = asyncio.get_running_loop()
        self._waiting[msg.id] = loop.create_future()
        policy = self.policy
        limit = policy.deadline if deadline is None else deadline
        start, interval, attempts = loop.time(), policy.first_retry, 0
        try:
            while True:
                attempts += 1
                await self.transport.send(endpoint, frames)
                left = self._heard.get(msg.id, start) + limit - loop.time()
                if left <= 0:
                    raise RpcTimeout(self.name, endpoint, kind, step,
                                     loop.time() - start, attempts,
                                     self.labels.get(endpoint))
                answer = await self._answer(msg.id, min(interval, left))
                if answer is not None:
                    return raise_for_error(answer)
                if loop.time() - self._heard.get(msg.id, start) >= limit:
                    raise RpcTimeout(self.name, endpoint, kind, step,
                                     loop.time() - start, attempts,
                                     self.labels.get(endpoint))
                log.debug("%s: resending %s id %d to %s", self.name, kind, msg.id, endpoint)
                interval = min(interval * policy.backoff, policy.max_interval)
        finally:
            self._waiting.pop(msg.id, None)
            self._heard.pop(msg.id, None)

    async def _answer(self, msg_id: int, timeout: float) -> Message | None:
        """The reply to request `msg_id` once it comes, or None if `timeout` seconds pass
        first (the request's future then gives way to a new one for the next attempt)."""
        reply = self._waiting[msg_id]
        if not reply.done():
            entry = self._timeouts.add(asyncio.get_running_loop().time() + timeout, reply)
            try:
                await reply
            finally:
                self._timeouts.drop(entry)
        answer = reply.result()
        if answer is None and self._waiting.get(msg_id) is reply:
            self._waiting[msg_id] = asyncio.get_running_loop().create_future()
        return answer

    async def _read(self) -> None:
        while True:
            try:
                peer, frames = await self.transport.recv()
            except TransportClosed:
                return
            try:
                msg = decode(frames, self.max_message_size)
            except DecodeError as exc:
                log.warning("%s: dropping a malformed reply from %s: %s", self.name, peer, exc)
                continue
            self._resolve(msg)

    def _resolve(self, msg: Message) -> None:
        """Hand a reply to the call waiting for it, or note a pending notice. A call whose wait
        ran out this very instant still gets the reply (after resending), as if it had come a
        moment earlier."""
        waiter = self._waiting.get(msg.id)
        if waiter is None or waiter.cancelled():
            return
        timed_out = waiter.done()
        if timed_out and waiter.result() is not None:  # answered already
            return
        if msg.kind is Kind.REPLY and msg.extra.get("pending") is True:
            self._heard[msg.id] = asyncio.get_running_loop().time()  # alive, still busy
            return
        if not timed_out:
            waiter.set_result(msg)
            return
        answered = asyncio.get_running_loop().create_future()
        answered.set_result(msg)
        self._waiting[msg.id] = answered

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass
            self._reader = None
        for fut in self._waiting.values():
            fut.cancel()
        self._timeouts.close()
        await self.transport.close()
