"""`RpcClient` on the virtual clock: retries with backoff keep the message id, a server's
"pending" notices keep a call alive past its deadline, and a silent server makes the call time
out with an error that names the node."""

from __future__ import annotations

import asyncio

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
