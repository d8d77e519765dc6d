"""`runtime.execution.compute.Charge`: which clock a node's work is timed on."""

from __future__ import annotations

import asyncio

import pytest

from runtime.execution.compute import Charge, RealCompute
from runtime.services.node import run_async
from sim.loop import run


class Flat:
    def cost(self, node: str, op: object, scope: object, step: int) -> float:
        return 0.25


@pytest.mark.parametrize("model", [Flat(), None], ids=["modelled", "no compute model"])
def test_a_simulated_node_times_its_work_on_the_loops_virtual_clock(model: Flat | None) -> None:
    async def main() -> tuple[float, float]:
        charge = Charge("pserver:0", model)
        sum(range(20_000))  # takes wall time, none of the simulated
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
