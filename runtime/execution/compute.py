"""How long compute takes, as far as the clock is concerned.

A real run computes and the clock moves by itself: `RealCompute` charges nothing. The simulator
plugs in a model (roofline figures or a measured profile, stragglers on top) that charges each
op a duration; the runtime then waits that long on the running loop's clock, in one sleep per
stretch of compute ops (before the next RPC op, and at the end of a block), so simulated time
advances exactly by the modelled cost. An optional `Tracer` is told what each node did when.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from transpiler.ir import Op

from runtime.execution.scope import Scope


class ComputeModel(Protocol):
    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        """Seconds that `node` spends computing `op` (its inputs and outputs in `scope`) during
        training step `step`."""
        ...


class Tracer(Protocol):
    def span(self, node: str, name: str, start: float, end: float, category: str) -> None:
        """`node` spent [start, end) on `name` (an op, a step, a barrier wait...)."""
        ...


class RealCompute:
    """Real runs: compute takes the time it takes; nothing is charged."""

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        return 0.0


class Charge:
    """Modelled compute time owed by one node, paid with a sleep on the loop's clock."""

    def __init__(self, node: str, model: ComputeModel | None, tracer: Tracer | None = None) -> None:
        self.node = node
        self.model = model
        self.tracer = tracer
        self.owed = 0.0
        self.step = -1  # the training step being computed; its owner keeps it current
        self.ops: list[tuple[str, float]] = []
        self._clock: Callable[[], float] | None = None
        """`clock`'s source once `bind` named the loop this node runs on."""

    @property
    def active(self) -> bool:
        return self.model is not None and not isinstance(self.model, RealCompute)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Time this node's work on `loop`, the one it runs on from now (see `clock`).

        DESIGN: the owner binds its charge when it starts running (a pserver's `serve`, a
        trainer's `run`), so that `clock`, read for every request a pserver handles, need not
        ask asyncio for the running loop each time: that asks the OS for the process id."""
        self._clock = _clock_of(loop)

    def clock(self) -> float:
        """Now, for timing this node's work: the loop's clock where it is virtual (a
        simulation: its time is the simulated time, modelled compute or none), else a fine
        wall clock (a real loop's time may tick in whole milliseconds, as uvloop's does, and a
        small update takes less). The bound loop's (`bind`), else the running loop's."""
        clock = self._clock
        if clock is None:
            return _clock_of(asyncio.get_running_loop())()
        return clock()

    def add(self, op: Op, scope: Scope) -> None:
        if self.model is None:
            return
        seconds = self.model.cost(self.node, op, scope, self.step)
        if seconds > 0:
            self.owed += seconds
            self.ops.append((op.type, seconds))

    def add_overhead(self, what: str) -> None:
        """Owe the model's per-`what` bookkeeping ("step": a trainer's, "round": a sync
        pserver's), where the model prices it."""
        overhead = getattr(self.model, "overhead", None)
        if overhead is None:
            return
        seconds = overhead(self.node, what, self.step)
        if seconds > 0:
            self.owed += seconds
            self.ops.append((what, seconds))

    def span(self, name: str, start: float, category: str) -> None:
        """Tell the tracer, if any, that this node spent [start, now) on `name` (an RPC op)."""
        if self.tracer is not None:
            now = asyncio.get_running_loop().time()
            self.tracer.span(self.node, name, start, now, category)

    async def pay(self) -> None:
        """Wait for what is owed: on the node's CPU where the model has one (it may share
        cores, so the stretch can take longer than owed), else a sleep; trace each op as a
        slice of that stretch, in proportion."""
        if self.owed <= 0:
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        owed, ops = self.owed, self.ops
        self.owed, self.ops = 0.0, []
        spend = getattr(self.model, "spend", None)
        stretch = 1.0
        if spend is None:
            await asyncio.sleep(owed)
        else:
            await spend(self.node, owed)
            stretch = (loop.time() - start) / owed
        if self.tracer is not None:
            t = start
            for name, seconds in ops:
                self.tracer.span(self.node, name, t, t + seconds * stretch, "compute")
                t += seconds * stretch


def virtual_clock(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` keeps simulated time (`sim.loop`): it never moves while code runs."""
    return bool(getattr(loop, "virtual_time", False))


def _clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """What `Charge.clock` reads on `loop`: its time where it is virtual, else a fine clock."""
    return loop.time if virtual_clock(loop) else time.perf_counter
