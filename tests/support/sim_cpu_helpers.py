"""The simulated hosts' CPUs as their tests drive them: pieces of work submitted at given times,
and when each finished."""

from __future__ import annotations

import asyncio

from sim.cpu import Cpus
from sim.loop import run


# a power of two: the sums and products of it that tests make are exact in binary floating point
U = 2.0**-10


def finish_times(cpus: Cpus, work: list[tuple[float, str, float]]) -> dict[str, list[float]]:
    """Submit (at, node, seconds) pieces of work; when each node's pieces finished."""
    done: dict[str, list[float]] = {}

    def finished(node: str) -> None:
        done.setdefault(node, []).append(asyncio.get_running_loop().time())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for at, node, seconds in work:
            loop.call_at(at, cpus.run, node, seconds, finished, node)
        await asyncio.sleep(1000 * U)

    run(main())
    return done
