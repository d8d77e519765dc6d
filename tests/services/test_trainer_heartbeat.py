"""A trainer's heartbeat: one per pserver each interval, never beside one still waiting, and
stopped with nothing left to resend (a heartbeat retried after the trainer's BYE would reach
a pserver that was told nothing more comes)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.network.wire import Kind
from runtime.services.trainer import Trainer
from sim.loop import run
from trainer_helpers import FutureClient
from transpiler.ir import Program

pytestmark = pytest.mark.timeout(30)


def test_stopping_the_heartbeat_cancels_the_heartbeats_still_waiting() -> None:
    client = FutureClient()  # leaves every request waiting: a slow pserver
    trainer = Trainer(0, Program(), Program(), client, ["ps0", "ps1"],  # type: ignore[arg-type]
                      heartbeat_interval=1.0)

    async def beat_then_stop() -> None:
        trainer._beat = asyncio.get_running_loop().create_task(trainer._heartbeat())
        await asyncio.sleep(2.5)  # two intervals: the first beats still wait, none sent beside
        assert [kind for kind, _, _ in client.started] == [Kind.HEARTBEAT, Kind.HEARTBEAT]
        await trainer._stop_heartbeat()

    run(beat_then_stop())
    assert all(beat.cancelled() for _, _, beat in client.started)
