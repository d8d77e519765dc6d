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
so the same code runs on a virtual clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
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
        self._waiting: dict[int, asyncio.Future[Message]] = {}
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
        reply: asyncio.Future[Message] = loop.create_future()
        self._waiting[msg.id] = reply
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
                try:
                    return raise_for_error(await asyncio.wait_for(asyncio.shield(reply),
                                                                  min(interval, left)))
                except TimeoutError:
                    if loop.time() - self._heard.get(msg.id, start) >= limit:
                        raise RpcTimeout(self.name, endpoint, kind, step,
                                         loop.time() - start, attempts,
                                         self.labels.get(endpoint)) from None
                    log.debug("%s: resending %s id %d to %s", self.name, kind, msg.id, endpoint)
                    interval = min(interval * policy.backoff, policy.max_interval)
        finally:
            self._waiting.pop(msg.id, None)
            self._heard.pop(msg.id, None)

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
            waiter = self._waiting.get(msg.id)
            if waiter is None or waiter.done():
                continue
            if msg.kind is Kind.REPLY and msg.extra.get("pending") is True:
                self._heard[msg.id] = asyncio.get_running_loop().time()  # alive, still busy
                continue
            waiter.set_result(msg)

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
        await self.transport.close()
