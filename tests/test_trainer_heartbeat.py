"""A trainer's heartbeat: one per pserver each interval, never beside one still waiting, and
stopped with nothing left to resend (a heartbeat retried after the trainer's BYE would reach
a pserver that was told nothing more comes)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtime.network.rpc import RetryPolicy
from runtime.network.wire import Kind, Message
from runtime.services.trainer import Trainer
from sim.loop import run
from transpiler.ir import Program

pytestmark = pytest.mark.timeout(30)


class _Client:
    """Hands out a future per request and leaves them all waiting (a slow pserver)."""

    name = "trainer:0"
    labels: dict[str, str] = {}
    policy = RetryPolicy()
    next_id = 1

    def __init__(self) -> None:
        self.started: list[tuple[str, Kind, asyncio.Future[Message]]] = []

    def start(self, endpoint: str, kind: Kind, step: int, vars: Any, extra: Any,
              deadline: Any, check: Any) -> asyncio.Future[Message]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.started.append((endpoint, kind, future))
        return future


def test_stopping_the_heartbeat_cancels_the_heartbeats_still_waiting() -> None:
    client = _Client()
    trainer = Trainer(0, Program(), Program(), client, ["ps0", "ps1"],  # type: ignore[arg-type]
                      heartbeat_interval=1.0)

    async def beat_then_stop() -> None:
        trainer._beat = asyncio.get_running_loop().create_task(trainer._heartbeat())
        await asyncio.sleep(2.5)  # two intervals: the first beats still wait, none sent beside
        assert [(ep, kind) for ep, kind, _ in client.started] == [
            ("ps0", Kind.HEARTBEAT), ("ps1", Kind.HEARTBEAT)]
        await trainer._stop_heartbeat()

    run(beat_then_stop())
    assert all(beat.cancelled() for _, _, beat in client.started)
