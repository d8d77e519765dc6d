"""A trainer's RPC client as its tests stand in for it."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.network.rpc import RetryPolicy
from runtime.network.wire import Kind, Message


class FutureClient:
    """Hands out a future per request; the test answers them."""

    name = "trainer:0"
    labels = {"ep": "pserver:1"}
    policy = RetryPolicy()
    next_id = 1

    def __init__(self) -> None:
        self.started: list[tuple[Kind, Any, asyncio.Future[Message]]] = []

    def start(self, endpoint: str, kind: Kind, step: int, vars: Any, extra: Any,
              deadline: Any, check: Any) -> asyncio.Future[Message]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.started.append((kind, extra.get("names"), future))
        return future
