"""A link's latencies drawn without holding its generator: the same values, in the same order."""

from __future__ import annotations

import random

import pytest

from runtime.config.netspec import (ConstantLatency, Latency, LogNormalLatency, NormalLatency,
                                    UniformLatency)
from sim.latencies import FIRST_BATCH, KEEP, LinkLatencies
from sim.network import Network, NetworkSpec

DISTRIBUTIONS = [
    UniformLatency(1e-4, 3e-4),
    NormalLatency(1e-4, 1e-4),  # truncated: redraws take a varying number of values
    LogNormalLatency(5e-5, 0.2),
]


def reference(latency: Latency, key: str, count: int) -> list[float]:
    """What one `random.Random(key)` held for the whole run draws."""
    rng = random.Random(key)
    return [latency.sample(rng) for _ in range(count)]


@pytest.mark.parametrize("latency", DISTRIBUTIONS, ids=lambda d: type(d).__name__)
def test_the_draws_are_those_of_the_links_own_generator(latency: Latency) -> None:
    count = 3 * KEEP  # past every batch and into the kept generator
    stream = LinkLatencies(latency, "5:trainer:3->127.0.0.1:6001")
    assert [stream.next() for _ in range(count)] == reference(
        latency, "5:trainer:3->127.0.0.1:6001", count)


def test_each_link_and_seed_draws_its_own_sequence() -> None:
    latency = LogNormalLatency(5e-5, 0.2)
    keys = ["5:a->b", "5:b->a", "6:a->b"]
    draws = {key: [LinkLatencies(latency, key).next() for _ in range(1)] for key in keys}
    streams = {key: LinkLatencies(latency, key) for key in keys}
    sequences = {key: [s.next() for _ in range(20)] for key, s in streams.items()}
    assert len({tuple(seq) for seq in sequences.values()}) == 3
    for key in keys:
        assert sequences[key] == reference(latency, key, 20)
        assert draws[key] == sequences[key][:1]


def test_interleaved_links_do_not_disturb_each_other() -> None:
    latency = UniformLatency(0.0, 1.0)
    one, other = LinkLatencies(latency, "1:x->y"), LinkLatencies(latency, "1:y->x")
    got_one, got_other = [], []
    for i in range(100):
        got_one.append(one.next())
        for _ in range(i % 3):
            got_other.append(other.next())
    assert got_one == reference(latency, "1:x->y", 100)
    assert got_other == reference(latency, "1:y->x", len(got_other))


def test_a_link_holds_a_few_values_and_no_generator_until_it_is_busy() -> None:
    stream = LinkLatencies(LogNormalLatency(5e-5, 0.2), "5:a->b")
    stream.next()
    assert stream._rng is None and len(stream._ahead) == FIRST_BATCH - 1
    for _ in range(FIRST_BATCH):  # the second batch: as many again
        stream.next()
    assert stream._rng is None and len(stream._ahead) == FIRST_BATCH - 1
    while stream._rng is None:
        stream.next()
    assert stream._drawn == KEEP and not stream._ahead


def test_a_constant_latency_draws_nothing() -> None:
    stream = LinkLatencies(ConstantLatency(2e-4), "5:a->b")
    assert [stream.next() for _ in range(3)] == [2e-4] * 3
    assert stream._rng is None and stream._drawn == 0


def test_the_network_draws_a_links_latencies_from_its_seed_and_names() -> None:
    latency = LogNormalLatency(5e-5, 0.2)
    network = Network(NetworkSpec(latency=latency), seed=7)
    draws = [network._link("trainer:0", "pserver:1").latencies.next() for _ in range(10)]
    assert draws == reference(latency, "7:trainer:0->pserver:1", 10)
