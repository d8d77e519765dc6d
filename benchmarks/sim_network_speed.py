"""How fast the simulated network moves messages, against bare timers in the same run.

Senders each push their share of N small messages to one receiver over a `Network` with
lognormal latency and 10 Gbps links (so every message is serialized on two NICs, sampled,
ordered and queued), on `VirtualTimeLoop`; the receiver takes them all with `recv()`. The
baseline is the least any simulated delivery costs: one `call_at` per message into an
`asyncio.Queue` on the same loop. Prints messages per wall second for both and their ratio.

Run: python benchmarks/sim_network_speed.py [--messages 100000 --senders 10]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from sim.loop import run
from sim.network import Network

SPEC = {
    "default": {
        "latency": {"dist": "lognormal", "median": "200us", "sigma": 0.3},
        "bandwidth": "10Gbps",
    }
}
LATENCY = 200e-6


async def over_network(messages: int, senders: int) -> None:
    net = Network.from_spec(SPEC, seed=0)
    server = net.transport("pserver:0")
    await server.bind("ps0")
    clients = [net.transport(f"trainer:{k}") for k in range(senders)]

    async def push(node: Any) -> None:
        await node.connect("ps0")
        for i in range(messages // senders):
            await node.send("ps0", [i.to_bytes(8, "little")])

    await asyncio.gather(*map(push, clients))
    for _ in range(messages // senders * senders):
        await server.recv()


async def over_bare_timers(messages: int, senders: int) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[str, list[bytes]]] = asyncio.Queue()

    async def push(name: str) -> None:
        for i in range(messages // senders):
            loop.call_at(loop.time() + LATENCY, inbox.put_nowait, (name, [i.to_bytes(8, "little")]))

    await asyncio.gather(*(push(f"trainer:{k}") for k in range(senders)))
    for _ in range(messages // senders * senders):
        await inbox.get()


def rate(body: Callable[[int, int], Coroutine[Any, Any, None]], messages: int, senders: int) -> float:
    started = time.perf_counter()
    run(body(messages, senders))
    return messages // senders * senders / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--senders", type=int, default=10)
    args = parser.parse_args()
    ours = rate(over_network, args.messages, args.senders)
    bare = rate(over_bare_timers, args.messages, args.senders)
    print(f"{args.messages} messages of 8 bytes from {args.senders} senders to one receiver:")
    print(f"  simulated network: {ours:,.0f} messages/s")
    print(f"  bare call_at + Queue: {bare:,.0f} messages/s")
    print(f"  ratio (network / bare): {ours / bare:.2f}")


if __name__ == "__main__":
    main()
