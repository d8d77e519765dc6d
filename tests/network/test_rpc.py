"""`RpcClient` on the virtual clock: retries with backoff keep the message id, a server's
"pending" notices keep a call alive past its deadline, and a silent server makes the call time
out with an error that names the node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from runtime.network.rpc import RetryPolicy, RpcClient, RpcTimeout
from runtime.network.wire import Kind, Message, decode, encode
from sim.loop import run
from sim.network import Network


async def fake_server(net: Network, pending: int, seen: list[tuple[float, int]]) -> None:
    """Answer each request's first `pending` retries with a pending notice, then reply."""
    server = net.transport("pserver:0")
    await server.bind("ps0")
    loop = asyncio.get_running_loop()
    while True:
        peer, frames = await server.recv()
        msg = decode(frames)
        seen.append((loop.time(), msg.id))
        extra = {"pending": True} if len(seen) <= pending else {"answer": 42}
        await server.send(peer, encode(Message(Kind.REPLY, msg.id, "pserver:0", 0, extra=extra)))


def call(pending: int, serve: bool = True) -> tuple[Message | Exception, list[tuple[float, int]]]:
    net = Network.from_spec({"default": {"latency": "1ms"}}, seed=0)
    seen: list[tuple[float, int]] = []

    async def main() -> Message | Exception:
        task = asyncio.get_running_loop().create_task(fake_server(net, pending, seen)) \
            if serve else None
        client = RpcClient(net.transport("trainer:0"),
                           RetryPolicy(deadline=1.0, first_retry=0.1, max_interval=0.4),
                           labels={"ps0": "pserver:0"})
        try:
            return await client.call("ps0", Kind.GET, step=3)
        except RpcTimeout as exc:
            return exc
        finally:
            await client.close()
            if task is not None:
                task.cancel()

    return run(main()), seen


def test_pending_notices_keep_a_call_alive_past_its_deadline() -> None:
    reply, seen = call(pending=8)  # 8 notices over ~2s of retries, more than the 1s deadline
    assert isinstance(reply, Message) and reply.extra == {"answer": 42}
    assert len({msg_id for _, msg_id in seen}) == 1  # every resend is the same message
    assert seen[-1][0] > 1.0


def test_a_silent_server_makes_the_call_time_out_naming_the_node() -> None:
    error, _ = call(pending=0, serve=False)
    assert isinstance(error, RpcTimeout)
    assert str(error).startswith("trainer:0: no reply from pserver:0 at ps0 to get (step 3) "
                                 "after 1s")


@pytest.mark.parametrize("incarnation", [0, 3])
def test_a_restarted_node_numbers_its_messages_apart_from_its_earlier_life(incarnation: int) -> None:
    net = Network.from_spec(None, seed=0)
    client = RpcClient(net.transport("trainer:0"), incarnation=incarnation)
    assert client.next_id == (incarnation << 32) + 1


# -- when a call is asked again: backoff only for a server that is silent about it -------------

Script = Callable[[Message, int], "dict[str, Any] | None"]
"""(request, how many times its id arrived before) -> the reply's step and extra fields, or
None: the reply is lost."""

POLICY = RetryPolicy(deadline=60.0, first_retry=0.1, max_interval=10.0)


async def scripted_server(net: Network, script: Script, seen: list[tuple[float, Kind]]) -> None:
    server = net.transport("pserver:0")
    await server.bind("ps0")
    loop = asyncio.get_running_loop()
    arrivals: dict[int, int] = {}
    while True:
        peer, frames = await server.recv()
        msg = decode(frames)
        seen.append((round(loop.time(), 3), msg.kind))
        reply = script(msg, arrivals.get(msg.id, 0))
        arrivals[msg.id] = arrivals.get(msg.id, 0) + 1
        if reply is not None:
            step, extra = reply.pop("step"), reply
            await server.send(peer, encode(Message(Kind.REPLY, msg.id, "pserver:0", step,
                                                   extra=extra)))


def get_beside_heartbeats(script: Script, beats: list[float], cancel_at: float | None = None,
                          ) -> tuple[float | None, list[float]]:
    """A GET from t=0 and a HEARTBEAT call at each of `beats`: when the GET's reply came (None:
    its caller cancelled it at `cancel_at`), and when the server saw each of its attempts (1 ms
    links)."""
    net = Network.from_spec({"default": {"latency": "1ms"}}, seed=0)
    seen: list[tuple[float, Kind]] = []

    async def main() -> float | None:
        loop = asyncio.get_running_loop()
        server = loop.create_task(scripted_server(net, script, seen))
        client = RpcClient(net.transport("trainer:0"), POLICY)
        await client.connect(["ps0"])
        for at in beats:
            loop.call_later(at, lambda: client.start("ps0", Kind.HEARTBEAT))
        get = client.start("ps0", Kind.GET, step=3)
        if cancel_at is not None:
            loop.call_later(cancel_at, get.cancel)
        try:
            await get
            return round(loop.time(), 3)
        except asyncio.CancelledError:
            await asyncio.sleep(max(beats, default=0) + 1 - loop.time())  # the beats' replies
            return None
        finally:
            await client.close()
            server.cancel()

    answered = run(main())
    return answered, [at for at, kind in seen if kind is Kind.GET]


def test_a_held_request_is_asked_again_as_soon_as_the_server_moves_past_its_step() -> None:
    """Four pending notices at step 3, then the answer is lost; a heartbeat's reply at step 4
    shows the server moved on, and the GET is asked again at once, not after the backoff."""
    def script(msg: Message, before: int) -> dict[str, Any] | None:
        if msg.kind is Kind.HEARTBEAT:
            return {"step": 4}
        if before < 4:
            return {"step": 3, "pending": True}
        return None if before == 4 else {"step": 4}

    answered, attempts = get_beside_heartbeats(script, beats=[2.0])
    assert attempts == [0.001, 0.101, 0.301, 0.701, 1.501, 2.003]
    assert answered == 2.004  # the backoff alone would have asked again at 3.101 s


def test_a_held_request_backs_off_while_the_server_stays_at_its_step() -> None:
    """The server answers heartbeats but has not moved on: the GET is still waiting there, and
    its resends back off (no polling load while a long round lasts)."""
    def script(msg: Message, before: int) -> dict[str, Any] | None:
        if msg.kind is Kind.HEARTBEAT:
            return {"step": 3}
        return {"step": 3, "pending": True} if before < 5 else {"step": 4}

    answered, attempts = get_beside_heartbeats(script, beats=[0.05 * i for i in range(1, 40)])
    assert attempts == [0.001, 0.101, 0.301, 0.701, 1.501, 3.101]
    assert answered == 3.102


def test_a_lost_request_is_asked_again_at_the_first_interval_while_the_server_answers_later_ones(
        ) -> None:
    """Each attempt is lost, but the server answers heartbeats started after it: it is alive
    and was not held up by this request, so the resends keep the first interval."""
    def script(msg: Message, before: int) -> dict[str, Any] | None:
        if msg.kind is Kind.HEARTBEAT:
            return {"step": 3}
        return None if before < 4 else {"step": 3}

    answered, attempts = get_beside_heartbeats(script, beats=[0.05 * i for i in range(1, 40)])
    assert attempts == [0.001, 0.101, 0.201, 0.301, 0.401]
    assert answered == 0.402


def test_a_lost_request_backs_off_when_the_server_answers_nothing_newer() -> None:
    def script(msg: Message, before: int) -> dict[str, Any] | None:
        return None if before < 4 else {"step": 3}

    answered, attempts = get_beside_heartbeats(script, beats=[])
    assert attempts == [0.001, 0.101, 0.301, 0.701, 1.501]
    assert answered == 1.502


def test_a_held_request_its_caller_gave_up_is_not_asked_again() -> None:
    def script(msg: Message, before: int) -> dict[str, Any] | None:
        return {"step": 4} if msg.kind is Kind.HEARTBEAT else {"step": 3, "pending": True}

    answered, attempts = get_beside_heartbeats(script, beats=[0.6], cancel_at=0.5)
    assert answered is None and attempts == [0.001, 0.101, 0.301]
