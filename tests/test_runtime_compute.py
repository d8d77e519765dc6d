"""`runtime.compute.Charge`: which clock a node's work is timed on."""

from __future__ import annotations

import asyncio

from runtime.compute import Charge, RealCompute
from runtime.node import run_async
from sim.loop import run


class Flat:
    def cost(self, node: str, op: object, scope: object, step: int) -> float:
        return 0.25


def test_a_modelled_node_times_its_work_on_the_loops_virtual_clock() -> None:
    async def main() -> tuple[float, float]:
        charge = Charge("pserver:0", Flat())
        start = charge.clock()
        await asyncio.sleep(1.5)
        return start, charge.clock()

    assert run(main()) == (0.0, 1.5)


def test_a_real_node_times_its_work_finer_than_the_loops_ticks() -> None:
    """On the loop real nodes run on (uvloop's), `loop.time()` stays put within a callback."""

    async def main() -> float:
        charge = Charge("pserver:0", RealCompute())
        start = charge.clock()
        sum(range(20_000))  # well under a millisecond: a loop clock of ms ticks may say 0
        return charge.clock() - start

    assert run_async(main()) > 0.0
