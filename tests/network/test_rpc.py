"""`RpcClient` on the virtual clock: retries with backoff keep the message id, a server's
"pending" notices keep a call alive past its deadline, and a silent server makes the call time
out with an error that names the node."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from runtime.network import rpc
from runtime.network.rpc import PACE_MARGIN, RetryPolicy, RpcClient, RpcTimeout
from runtime.network.wire import Kind, Message, charged_size, decode, encode
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


# -- a call's first wait follows the bytes it moves ----------------------------------------------

BIG = 2_000_000
"""A request or reply that takes 0.2 s on the 80 Mbit/s link of `paced_calls`."""


async def echo_server(net: Network, seen: list[tuple[float, int]]) -> None:
    """Answer each request's first arrival with a reply of `BIG` bytes; later copies of it
    (resends) are only counted."""
    server = net.transport("pserver:0")
    await server.bind("ps0")
    loop = asyncio.get_running_loop()
    answered: set[int] = set()
    while True:
        peer, frames = await server.recv()
        msg = decode(frames)
        seen.append((round(loop.time(), 6), msg.id))
        if msg.id not in answered:
            answered.add(msg.id)
            await server.send(peer, encode(Message(Kind.REPLY, msg.id, "pserver:0", 0,
                                                   {"w": np.zeros(BIG // 4, np.float32)})))


def paced_calls(calls: int) -> tuple[list[list[float]], RpcClient]:
    """`calls` SENDs of `BIG` bytes one after the other over a 1 ms, 80 Mbit/s link (each way
    0.2 s), the first resend after 0.1 s: when the server saw each call's copies."""
    net = Network.from_spec({"default": {"latency": "1ms", "bandwidth": "80Mbps"},
                             "framing": "none"}, seed=0)
    seen: list[tuple[float, int]] = []
    client = RpcClient(net.transport("trainer:0"), RetryPolicy(deadline=60.0, first_retry=0.1))

    async def main() -> list[int]:
        server = asyncio.get_running_loop().create_task(echo_server(net, seen))
        ids = []
        try:
            for _ in range(calls):
                ids.append(client.next_id)
                await client.call("ps0", Kind.SEND, vars={"g": np.zeros(BIG // 4, np.float32)})
            return ids
        finally:
            await client.close()
            server.cancel()

    ids = run(main())
    return [[at for at, id in seen if id == want] for want in ids], client


def test_a_call_waits_as_long_as_its_bytes_took_at_the_endpoints_pace() -> None:
    """The first 2 MB call is sent again after 0.1 s and 0.3 s (no pace known yet; the copies
    queue behind it and are answered by nothing); its time per byte becomes the endpoint's
    pace, and the next calls wait 3 times what their bytes take at it: each goes once."""
    arrivals, client = paced_calls(3)
    assert [len(copies) for copies in arrivals] == [3, 1, 1]
    assert client.resends == 2
    request = charged_size(encode(Message.of(Kind.SEND, 9, "trainer:0", 0,
                                             {"g": np.zeros(BIG // 4, np.float32)})))
    reply = charged_size(encode(Message(Kind.REPLY, 9, "pserver:0", 0,
                                        {"w": np.zeros(BIG // 4, np.float32)})))
    assert client._reply_size[("ps0", Kind.SEND)] == reply
    pace = client._pace["ps0"]
    assert pace > 0.4 / (request + reply)  # 0.2 s each way
    assert client.first_wait("ps0", Kind.SEND, request) == PACE_MARGIN * pace * (request + reply)
    assert client.first_wait("ps0", Kind.GET, 100) == 0.1  # no GET reply known: 100 bytes


def test_without_a_pace_every_call_is_sent_again_after_the_first_interval(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "PACE_MIN_BYTES", 1 << 40)  # never learnt
    arrivals, client = paced_calls(3)
    assert all(len(copies) >= 2 for copies in arrivals)
    assert client._pace == {}


def test_the_first_wait_is_the_floor_of_the_backoff_too() -> None:
    """A known pace makes the first wait 1 s where first_retry is 0.1 s and the backoff's cap
    0.4 s: a silent server is asked every second, not every 0.4 s."""
    net = Network.from_spec({"default": {"latency": "1ms"}}, seed=0)
    seen: list[float] = []

    async def main() -> None:
        server = net.transport("pserver:0")
        await server.bind("ps0")
        loop = asyncio.get_running_loop()

        async def listen() -> None:
            while True:
                await server.recv()
                seen.append(round(loop.time(), 6))

        task = loop.create_task(listen())
        client = RpcClient(net.transport("trainer:0"),
                           RetryPolicy(deadline=3.5, first_retry=0.1, max_interval=0.4))
        client._pace["ps0"] = 1.0 / (PACE_MARGIN * 1_000_000)
        client._reply_size[("ps0", Kind.GET)] = 1_000_000
        assert client.first_wait("ps0", Kind.GET, 0) == pytest.approx(1.0)
        try:
            with pytest.raises(RpcTimeout):
                await client.call("ps0", Kind.GET)
        finally:
            await client.close()
            task.cancel()

    run(main())
    assert seen == pytest.approx([0.001, 1.001, 2.001, 3.001], abs=1e-3)
