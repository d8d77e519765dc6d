"""How fast the virtual-time loop runs, against baselines measured in the same run.

1. A parameter-server message exchange (trainers send to every pserver after a link latency,
   pservers serve one message at a time and reply) on `VirtualTimeLoop`, and the same model
   in SimPy (if installed): simulated messages per wall second, and their ratio.
2. Callbacks at one virtual instant (tasks yielding with `sleep(0)`) on `VirtualTimeLoop` and
   on the stock asyncio loop: the per-callback overhead the virtual clock adds.

Run: python benchmarks/sim_loop_speed.py [--trainers 100 --pservers 10 --steps 20]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from sim.loop import VirtualTimeLoop

T = TypeVar("T")

LATENCY = 0.001
SERVE = 0.0002
COMPUTE = 0.01


@dataclass(frozen=True)
class Workload:
    trainers: int
    pservers: int
    steps: int

    def compute(self, trainer: int) -> float:
        return COMPUTE * (1 + trainer % 3)


@dataclass(frozen=True)
class Outcome:
    messages: int
    sim_time: float
    wall: float


async def exchange_asyncio(work: Workload) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    inboxes: list[asyncio.Queue[tuple[asyncio.Queue[int], int]]] = [
        asyncio.Queue() for _ in range(work.pservers)
    ]
    delivered = 0

    def deliver(queue: asyncio.Queue[Any], message: Any) -> None:
        nonlocal delivered
        delivered += 1
        queue.put_nowait(message)

    async def pserver(inbox: asyncio.Queue[tuple[asyncio.Queue[int], int]]) -> None:
        while True:
            reply_to, step = await inbox.get()
            await asyncio.sleep(SERVE)
            loop.call_later(LATENCY, deliver, reply_to, step)

    async def trainer(index: int) -> None:
        replies: asyncio.Queue[int] = asyncio.Queue()
        for step in range(work.steps):
            await asyncio.sleep(work.compute(index))
            for inbox in inboxes:
                loop.call_later(LATENCY, deliver, inbox, (replies, step))
            for _ in inboxes:
                await replies.get()

    servers = [asyncio.create_task(pserver(inbox)) for inbox in inboxes]
    await asyncio.gather(*(trainer(i) for i in range(work.trainers)))
    for server in servers:
        server.cancel()
    return delivered, loop.time()


def exchange_simpy(work: Workload) -> tuple[int, float]:
    import simpy

    env = simpy.Environment()
    inboxes = [simpy.Store(env) for _ in range(work.pservers)]
    delivered = 0

    def send(store: simpy.Store, message: object) -> None:
        def deliver(_: simpy.Event) -> None:
            nonlocal delivered
            delivered += 1
            store.put(message)

        env.timeout(LATENCY).callbacks.append(deliver)

    def pserver(inbox: simpy.Store):  # type: ignore[no-untyped-def]
        while True:
            reply_to, step = yield inbox.get()
            yield env.timeout(SERVE)
            send(reply_to, step)

    def trainer(index: int):  # type: ignore[no-untyped-def]
        replies = simpy.Store(env)
        for step in range(work.steps):
            yield env.timeout(work.compute(index))
            for inbox in inboxes:
                send(inbox, (replies, step))
            for _ in inboxes:
                yield replies.get()

    for inbox in inboxes:
        env.process(pserver(inbox))
    env.run(until=simpy.AllOf(env, [env.process(trainer(i)) for i in range(work.trainers)]))
    return delivered, env.now


def timed(body: Callable[[], tuple[int, float]]) -> Outcome:
    started = time.perf_counter()
    messages, sim_time = body()
    return Outcome(messages, sim_time, time.perf_counter() - started)


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


async def spin(tasks: int, yields: int) -> None:
    async def yielder() -> None:
        for _ in range(yields):
            await asyncio.sleep(0)

    await asyncio.gather(*(yielder() for _ in range(tasks)))


def spin_seconds(loop: asyncio.AbstractEventLoop, tasks: int, yields: int) -> float:
    started = time.perf_counter()
    run_on(loop, spin(tasks, yields))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=int, default=100)
    parser.add_argument("--pservers", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    work = Workload(args.trainers, args.pservers, args.steps)

    loop = VirtualTimeLoop()
    ours = timed(lambda: run_on(loop, exchange_asyncio(work)))
    rate = ours.messages / ours.wall
    print(f"parameter-server exchange {work}:")
    print(
        f"  VirtualTimeLoop: {ours.messages} messages, sim time {ours.sim_time:.4f} s, "
        f"wall {ours.wall:.3f} s, {rate:,.0f} messages/s, "
        f"{loop.stats.callbacks / ours.wall:,.0f} callbacks/s, "
        f"{loop.stats.timers / ours.wall:,.0f} timers/s"
    )
    try:
        theirs = timed(lambda: exchange_simpy(work))
    except ImportError:
        print("  SimPy not installed: no baseline (pip install simpy)")
    else:
        print(
            f"  SimPy:           {theirs.messages} messages, sim time {theirs.sim_time:.4f} s, "
            f"wall {theirs.wall:.3f} s, {theirs.messages / theirs.wall:,.0f} messages/s"
        )
        print(f"  ratio (ours / SimPy messages per second): {rate * theirs.wall / theirs.messages:.2f}")

    tasks, yields = 1_000, 200
    virtual = spin_seconds(VirtualTimeLoop(), tasks, yields)
    stock = spin_seconds(asyncio.new_event_loop(), tasks, yields)
    print(f"same-instant callbacks ({tasks} tasks x {yields} sleep(0)):")
    print(
        f"  VirtualTimeLoop {tasks * yields / virtual:,.0f}/s, stock loop "
        f"{tasks * yields / stock:,.0f}/s, ratio {stock / virtual:.2f}"
    )


if __name__ == "__main__":
    main()
