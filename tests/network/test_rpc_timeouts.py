"""`RpcClient` on the virtual clock: replies, resends after the retry interval with backoff,
a reply that comes the very instant a wait runs out, deadlines, and close."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from runtime.network.rpc import RetryPolicy, RpcClient, RpcTimeout, _Timeouts
from runtime.network.transport import Frame, Transport
from runtime.network.wire import Kind, Message, decode, encode
from sim.loop import run
from sim.network import Network

Answer = Callable[[Message, float], float | None]
"""(request, now) -> seconds until the server replies to it, or None: no reply."""


async def serve(transport: Transport, answer: Answer, seen: list[tuple[float, int]]) -> None:
    """Reply to each request (same id) after the delay `answer` says, logging (time, id)."""
    loop = asyncio.get_running_loop()

    def reply_later(peer: str, frames: list[Frame]) -> None:
        loop.create_task(transport.send(peer, frames))

    await transport.bind("ps")
    while True:
        peer, frames = await transport.recv()
        msg = decode(frames)
        seen.append((loop.time(), msg.id))
        delay = answer(msg, loop.time())
        if delay is not None:
            reply = encode(Message(Kind.REPLY, msg.id, "pserver:0", msg.step))
            loop.call_later(delay, reply_later, peer, reply)


def call_once(answer: Answer, policy: RetryPolicy) -> tuple[list[tuple[float, int]], object]:
    """One GET through an ideal network; the server's log and the call's outcome."""
    seen: list[tuple[float, int]] = []

    async def main() -> object:
        network = Network()
        server = asyncio.get_running_loop().create_task(
            serve(network.transport("pserver:0"), answer, seen))
        client = RpcClient(network.transport("trainer:0"), policy)
        await client.connect(["ps"])
        try:
            reply = await client.call("ps", Kind.GET)
            return (asyncio.get_running_loop().time(), reply.id)
        except RpcTimeout as exc:
            return exc
        finally:
            await client.close()
            server.cancel()

    return seen, run(main())


POLICY = RetryPolicy(deadline=10.0, first_retry=1.0, max_interval=3.0, backoff=2.0)


def test_a_reply_in_time_is_returned_without_a_resend() -> None:
    seen, outcome = call_once(lambda msg, now: 0.5, POLICY)
    assert seen == [(0.0, 1)]
    assert outcome == (0.5, 1)


def test_a_request_is_resent_with_the_same_id_after_each_interval_with_backoff() -> None:
    answer_third: Answer = lambda msg, now: 0.25 if now >= 3.0 else None  # noqa: E731
    seen, outcome = call_once(answer_third, POLICY)
    assert seen == [(0.0, 1), (1.0, 1), (3.0, 1)]  # waits of 1 s, then 2 s
    assert outcome == (3.25, 1)


def test_a_reply_the_instant_the_wait_runs_out_is_still_the_answer_after_the_resend() -> None:
    seen, outcome = call_once(lambda msg, now: 1.0 if now == 0.0 else None, POLICY)
    assert seen == [(0.0, 1), (1.0, 1)]  # it resends, then takes the reply already in
    assert outcome == (1.0, 1)


def test_a_call_that_gets_no_reply_times_out_at_its_deadline() -> None:
    seen, outcome = call_once(lambda msg, now: None, POLICY)
    assert [t for t, _ in seen] == [0.0, 1.0, 3.0, 6.0, 9.0]  # backoff capped at 3 s
    assert isinstance(outcome, RpcTimeout)
    assert "after 10s and 5 attempt(s)" in str(outcome)


def test_close_cancels_the_calls_still_waiting() -> None:
    async def main() -> bool:
        network = Network()
        seen: list[tuple[float, int]] = []
        server = asyncio.get_running_loop().create_task(
            serve(network.transport("pserver:0"), lambda msg, now: None, seen))
        client = RpcClient(network.transport("trainer:0"), POLICY)
        await client.connect(["ps"])
        call = asyncio.get_running_loop().create_task(client.call("ps", Kind.GET))
        await asyncio.sleep(0.5)
        await client.close()
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return call.cancelled()

    assert run(main())


def test_a_resend_timed_later_than_another_wait_does_not_delay_that_wait() -> None:
    """Waits of 1 s (call A) and 4 s (call B): A's resend at 1 s waits 5 s more, and B still
    times out at 4 s, not at A's 6 s."""
    fired: list[tuple[str, float]] = []

    class Call:
        def __init__(self, name: str, again: float | None = None) -> None:
            self.name, self.again = name, again

        def expire(self) -> None:
            now = asyncio.get_running_loop().time()
            fired.append((self.name, now))
            if self.again is not None:
                timeouts.add(now + self.again, Call(self.name + "'"))  # type: ignore[arg-type]

    async def main() -> None:
        timeouts.add(4.0, Call("B"))  # type: ignore[arg-type]
        timeouts.add(1.0, Call("A", again=5.0))  # type: ignore[arg-type]
        await asyncio.sleep(10)

    timeouts = _Timeouts()
    run(main())
    assert fired == [("A", 1.0), ("B", 4.0), ("A'", 6.0)]
