"""`Inbox`, the queue between a transport and `recv`: order, waiting for items and for room,
failure that every later `recv` sees, and cancelled waiters that pass their turn on."""

from __future__ import annotations

import asyncio

import pytest

from runtime.network.transport import Inbound, Inbox, TransportClosed
from sim.loop import run


def item(n: int) -> Inbound:
    return (f"peer{n}", [bytes([n])])


def test_items_come_out_in_order_and_get_waits_for_the_next() -> None:
    async def main() -> list[tuple[float, str]]:
        inbox, loop = Inbox(), asyncio.get_running_loop()
        inbox.put_nowait(item(1))
        loop.call_later(2.0, inbox.put_nowait, item(2))
        got = []
        for _ in range(2):
            peer, _ = await inbox.get()
            got.append((loop.time(), peer))
        return got

    assert run(main()) == [(0.0, "peer1"), (2.0, "peer2")]


def test_a_bounded_inbox_makes_put_wait_for_room() -> None:
    async def main() -> list[tuple[float, str]]:
        inbox, loop = Inbox(maxsize=1), asyncio.get_running_loop()
        log: list[tuple[float, str]] = []
        await inbox.put(item(1))
        with pytest.raises(asyncio.QueueFull):
            inbox.put_nowait(item(2))

        async def producer() -> None:
            await inbox.put(item(2))
            log.append((loop.time(), "put 2"))

        task = loop.create_task(producer())
        await asyncio.sleep(1.0)
        log.append((loop.time(), (await inbox.get())[0]))
        await task
        log.append((loop.time(), (await inbox.get())[0]))
        return log

    assert run(main()) == [(1.0, "peer1"), (1.0, "put 2"), (1.0, "peer2")]


def test_failure_wakes_the_waiting_get_and_every_later_one_and_drops_what_comes() -> None:
    async def main() -> int:
        inbox, loop = Inbox(), asyncio.get_running_loop()
        waiting = loop.create_task(inbox.get())
        await asyncio.sleep(0)
        inbox.fail(TransportClosed("n", "recv"))
        inbox.put_nowait(item(1))  # too late: dropped
        failures = 0
        for get in (waiting, inbox.get(), inbox.get()):
            with pytest.raises(TransportClosed):
                await get
            failures += 1
        return failures

    assert run(main()) == 3


def test_failure_drops_what_the_inbox_held() -> None:
    async def main() -> None:
        inbox = Inbox()
        inbox.put_nowait(item(1))
        inbox.fail(TransportClosed("n", "recv"))
        with pytest.raises(TransportClosed):
            await inbox.get()

    run(main())


def test_a_cancelled_get_passes_the_item_it_was_woken_for_to_the_next_in_line() -> None:
    async def main() -> str:
        inbox, loop = Inbox(), asyncio.get_running_loop()
        first = loop.create_task(inbox.get())
        second = loop.create_task(inbox.get())
        await asyncio.sleep(0)
        inbox.put_nowait(item(1))  # wakes `first`...
        first.cancel()  # ...which is cancelled before it runs
        peer, _ = await second
        return peer

    assert run(main()) == "peer1"
