"""How fast this machine runs right now, and measurements taken only while it runs as it can.

On a shared machine (a VM whose host runs other guests, a box where other jobs come and go) a
thread's CPU time grows while someone else holds the core, so whatever is measured then looks
slower than it is: one calibration taken in such a spell priced every message 25% dearer and
gave two busy processes 0.82 of a core each, where the calm machine gives them 1.00.

`speed_probe` times a fixed workload. `SpeedGuard.measure` runs a measurement between two
probes and again (up to `PROBE_TRIES` times) while either probe took `PROBE_SLOW` times the
fastest probe the guard has seen; when every try ran slow it keeps the try that ran least slow
and names the measurement, with how much slower, in `SpeedGuard.slow`.

DESIGN: the probe compares the machine with itself, within one guard, rather than with a fixed
figure: a slower machine is not a slow spell, and the first probes set the bar.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

PROBE_SLOW = 1.25
"""A measurement whose speed probe ran this much slower than the fastest probe so far was
taken while the machine was slow (another guest's steal counts as the thread's own CPU time in
a VM), and is taken again."""
PROBE_TRIES = 3
"""How many times a measurement is taken at most before the least slow try is kept anyway (and
named in `SpeedGuard.slow`)."""

T = TypeVar("T")


def speed_probe(repeats: int = 200) -> float:
    """CPU seconds of a fixed numpy workload (small products, as a node's kernels are): how fast
    this thread runs right now."""
    a = np.ones((48, 48), np.float32)
    started = time.thread_time()
    for _ in range(repeats):
        a = (a @ a) * np.float32(1e-3)
    return time.thread_time() - started


@dataclass
class SpeedGuard:
    """Measurements taken between speed probes, again while the machine runs slow."""

    probe: Callable[[], float] = speed_probe
    fastest: float = math.inf
    """The fastest probe seen."""
    slow: dict[str, float] = field(default_factory=dict)
    """Measurement -> how much slower than the fastest probe its kept try ran, for those taken
    slow every time."""
    deadline: float = math.inf
    """`time.monotonic()` after which a measurement is not taken again: a time budget holds
    even in a slow spell (what was slow is still named)."""

    def measure(self, name: str, work: Callable[[int], T]) -> tuple[T, float | None]:
        """`work(attempt)` between two probes, up to `PROBE_TRIES` times while slow (and before
        the deadline): the result of the first try that ran at speed, else of the least slow,
        with its slowness."""
        if math.isinf(self.fastest):
            self.fastest = self.probe()
        tries: list[tuple[float, T]] = []
        for attempt in range(PROBE_TRIES):
            before = self.probe()
            result = work(attempt)
            slowest = max(before, self.probe())
            self.fastest = min(self.fastest, before, slowest)
            if slowest <= PROBE_SLOW * self.fastest:
                self.slow.pop(name, None)
                return result, None
            tries.append((slowest, result))
            if time.monotonic() > self.deadline:
                break
        slowest, result = min(tries, key=lambda t: t[0])
        self.slow[name] = round(slowest / self.fastest, 2)
        return result, self.slow[name]
