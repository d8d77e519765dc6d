"""One directed link's latencies, message by message, without holding its generator.

A simulated link draws its latencies with its own `random.Random`, seeded from the run's seed
and the two node names (`sim.network`), so that a seed gives the same times however the
traffic of other links interleaves; `runtime up --netns`'s proxy draws the same way
(`runtime.faults.proxy`), through the same `Latency.sample(rng)`. A `random.Random` holds a
Mersenne Twister state of 2.5 KB, though, and a job of 1,000 trainers and 100 pservers has
200,000 directed links, each of which carries a few dozen messages: half a gigabyte of
generator state, nearly all of it idle.

`LinkLatencies` gives the very values that `latency.sample(random.Random(key))` would give,
call after call, while holding only a few of them:

- a constant latency draws nothing (as `ConstantLatency.sample` does not): no generator at all;
- otherwise it seeds a generator when it needs values, replays the draws it handed out
  already, draws the next batch into a small array and lets the generator go. Batches double
  (8, 16, 32, ...), so the replays cost at most as many draws again as were handed out, and a
  link that has drawn `KEEP` values (a busy one, whose 2.5 KB are spread over as many
  messages) keeps its generator from then on.

DESIGN: a generator of our own with a one-int state (splitmix-style) would be smaller still,
but its draws would differ from the Mersenne Twister's, changing every shipped scenario with
random latencies and parting the simulator from the proxy; replaying costs a second seeding
and some dozen draws per link, and keeps every result as it was.
"""

from __future__ import annotations

import random
from array import array

from runtime.config.netspec import ConstantLatency, Latency

__all__ = ["FIRST_BATCH", "KEEP", "LinkLatencies"]

FIRST_BATCH = 8
"""Values drawn at the first draw of a link; each later batch draws as many as were drawn
before it."""
KEEP = 256
"""Values drawn after which a link keeps its generator instead of replaying it."""


class LinkLatencies:
    """The latencies of one directed link, in order: those of `latency.sample(rng)` for
    `rng = random.Random(str(key))`, called again and again (see the module doc). `key` is
    the seed string, or an object whose `str` it is (a simulated link, which makes it only
    when the generator is seeded)."""

    __slots__ = ("latency", "key", "_constant", "_ahead", "_drawn", "_rng")

    def __init__(self, latency: Latency, key: object) -> None:
        self.latency = latency
        self.key = key
        self._constant: float | None = (latency.value if isinstance(latency, ConstantLatency)
                                        else None)
        self._ahead = array("d")
        """Values drawn but not handed out yet, the next one last."""
        self._drawn = 0
        """Values drawn from the generator so far (handed out, or in `_ahead`)."""
        self._rng: random.Random | None = None
        """The generator, once the link keeps it (`KEEP`)."""

    def next(self) -> float:
        """The link's next latency, in seconds."""
        if self._constant is not None:
            return self._constant
        if self._ahead:
            return self._ahead.pop()
        if self._rng is not None:
            return self.latency.sample(self._rng)
        return self._refill()

    def _refill(self) -> float:
        """Seed the generator, replay the values drawn before, draw the next batch (or keep the
        generator) and hand out the first new value."""
        rng = random.Random(str(self.key))
        sample = self.latency.sample
        for _ in range(self._drawn):
            sample(rng)
        batch = max(FIRST_BATCH, self._drawn)
        if self._drawn + batch > KEEP:
            self._rng = rng
            return sample(rng)
        ahead = array("d", [sample(rng) for _ in range(batch)])
        self._drawn += batch
        ahead.reverse()
        first = ahead.pop()
        self._ahead = ahead
        return first
