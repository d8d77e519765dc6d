"""Seconds as a function of work: the measured cost curve of one op type on one machine.

A kernel's time follows its work (`runtime.execution.work.op_work`) but not in proportion: a
tiny op costs its fixed overhead whatever it does, a matrix product's FLOP rate climbs with its
size until it fills the cores and then falls once its operands leave the caches, an elementwise
op's bytes per second drop when it streams from memory instead of L2. A constant per call or per
element, taken at one job's shapes, is right for that job only. A `Curve` keeps instead the
measured seconds at many sizes of one feature of the work (FLOPs for the compute-bound rules,
bytes moved for the rest) and reads between them.

- `fit_curve(xs, seconds)`: the calls' samples grouped by feature value (the median of each
  group: one size measured many times), made non-decreasing in the feature (a larger op never
  costs less: pool-adjacent-violators, weighted by the calls of each group), one point per size.
- `Curve.seconds(x)`: linear interpolation between the two nearest points in log-log space (a
  power law between them); below the smallest size measured, that size's time (the floor: an op
  costs at least its overhead); above the largest, that size's seconds per unit of work times
  `x` (the throughput measured last, carried on). Either way outside the measured range,
  `Curve.covers(x)` says so, so that the caller can name it.

DESIGN: interpolating in log-log space keeps a power law exact between points, so a grid of
sizes a factor of 2 to 4 apart follows a cache or BLAS knee closely without a model of either;
the curve is data (`points`), written to and read from the machine file as it is, so a test can
evaluate it by hand.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Feature = Literal["flops", "bytes"]
FEATURES: tuple[Feature, ...] = ("flops", "bytes")


@dataclass(frozen=True)
class Curve:
    """Seconds at increasing sizes of a work `feature`: ``points`` of (size, seconds), sizes
    positive and rising, seconds non-decreasing."""

    feature: Feature
    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a curve needs at least one point")
        sizes = [x for x, _ in self.points]
        if any(x <= 0 for x in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"a curve's sizes must be positive and rising, got {sizes}")
        if any(s < 0 or not math.isfinite(s) for _, s in self.points):
            raise ValueError("a curve's seconds must be finite and >= 0")

    def covers(self, x: float) -> bool:
        """Whether `x` lies within the sizes measured."""
        return self.points[0][0] <= x <= self.points[-1][0]

    def seconds(self, x: float) -> float:
        """The time of an op of size `x` (see the module)."""
        points = self.points
        first_x, first_s = points[0]
        if x <= first_x:
            return first_s
        last_x, last_s = points[-1]
        if x >= last_x:
            return last_s * x / last_x
        low, high = 0, len(points) - 1
        while high - low > 1:  # the segment holding x
            mid = (low + high) // 2
            if points[mid][0] <= x:
                low = mid
            else:
                high = mid
        (x0, s0), (x1, s1) = points[low], points[high]
        if s0 <= 0 or s1 <= 0:
            return s0 + (s1 - s0) * (x - x0) / (x1 - x0)
        t = math.log(x / x0) / math.log(x1 / x0)
        return math.exp(math.log(s0) + t * math.log(s1 / s0))

    def document(self) -> dict[str, Any]:
        return {"feature": self.feature, "points": [[x, s] for x, s in self.points]}

    @staticmethod
    def of(document: dict[str, Any]) -> Curve:
        return Curve(document["feature"], tuple((float(x), float(s))
                                                for x, s in document["points"]))


def fit_curve(feature: Feature, xs: Sequence[float], seconds: Sequence[float]) -> Curve:
    """The curve of samples (`xs[i]`, `seconds[i]`): see the module. Samples of size 0 (an op
    that did no work) count at the smallest size measured, as its floor."""
    if len(xs) != len(seconds) or not xs:
        raise ValueError("fit_curve needs as many sizes as seconds, and one at least")
    positive = [x for x in xs if x > 0]
    floor = min(positive) if positive else 1.0
    groups: dict[float, list[float]] = {}
    for x, s in zip(xs, seconds):
        groups.setdefault(float(x) if x > 0 else floor, []).append(max(float(s), 0.0))
    sizes = sorted(groups)
    medians = [statistics.median(groups[x]) for x in sizes]
    weights = [len(groups[x]) for x in sizes]
    return Curve(feature, tuple(zip(sizes, _non_decreasing(medians, weights))))


def _non_decreasing(values: list[float], weights: list[int]) -> list[float]:
    """The weighted least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([value, float(weight), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight_b, count = blocks.pop()
            previous = blocks[-1]
            total = previous[1] + weight_b
            previous[0] = (previous[0] * previous[1] + mean * weight_b) / total
            previous[1] = total
            previous[2] += count
    fitted: list[float] = []
    for mean, _, count in blocks:
        fitted += [mean] * int(count)
    return fitted
