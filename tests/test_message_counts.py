"""How many messages a step costs, in each protocol (train.protocol), on the deterministic
simulator: exact counts per pserver and kind, bit-identical parameters either way, and those of
local training (to float32 summation order)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.config.scenario import Scenario, parse_scenario
from runtime.services.cluster import train_locally
from runtime.services.job import Job
from sim.simulate import SimResult, simulate

TRAINERS, PSERVERS, STEPS = 2, 2, 3


def scenario(protocol: str, mode: str = "sync") -> Scenario:
    return parse_scenario(f"""
name: counts
model: {{name: mlp, sizes: [64, 16, 10], optimizer: {{type: sgd, learning_rate: 0.5}}}}
data: {{name: digits, batch_size: 8}}
cluster: {{pservers: {PSERVERS}, trainers: {TRAINERS}}}
transpiler: {{mode: {mode}}}
train: {{steps: {STEPS}, protocol: {protocol}}}
""")


def by_kind(result: SimResult) -> list[dict[str, int]]:
    return [dict(sorted(p.by_kind.items())) for p in result.pservers]


def test_a_2x2_sync_step_costs_exactly_the_messages_of_its_protocol() -> None:
    # compact: each trainer sends each pserver 2 SENDs a step (its weight and bias grads) and 2
    # GETs per fetch round (the startup's and each step's): 2 x 3 x 2 = 12 sends, 2 x 4 x 2 =
    # 16 gets. per_op adds a send barrier per step (6) and a fetch barrier per round (8);
    # compact carries both on the last SEND / GET. bundled sends each pserver one SEND a step
    # and one GET a round, carrying the barriers: 6 sends, 8 gets.
    fetches = TRAINERS * (STEPS + 1)
    common = {"complete": TRAINERS, "get": 2 * fetches, "send": 2 * TRAINERS * STEPS}
    per_op = simulate(scenario("per_op"))
    compact = simulate(scenario("compact"))
    bundled = simulate(scenario("bundled"))
    assert by_kind(per_op) == [{**common, "fetch_barrier": fetches,
                                "send_barrier": TRAINERS * STEPS}] * PSERVERS
    assert by_kind(compact) == [common] * PSERVERS
    assert by_kind(bundled) == [{"complete": TRAINERS, "get": fetches,
                                 "send": TRAINERS * STEPS}] * PSERVERS
    assert (per_op.messages, compact.messages, bundled.messages) == (176, 120, 64)


@pytest.mark.parametrize("mode", ["sync", "async", "half_async", "geo"])
def test_every_protocol_trains_exactly_as_local_training(mode: str) -> None:
    results = {p: simulate(scenario(p, mode)) for p in ("bundled", "compact", "per_op")}
    for name, value in results["per_op"].params.items():
        for protocol in ("bundled", "compact"):
            np.testing.assert_array_equal(results[protocol].params[name], value,
                                          err_msg=f"{protocol}: {name}")
    if mode == "sync":  # float32 sums in another order: per-trainer means, then their mean
        _, local = train_locally(Job.from_scenario(scenario("compact")), "numpy")
        for name, value in local.items():
            np.testing.assert_allclose(results["compact"].params[name], value, rtol=1e-5,
                                       atol=1e-5, err_msg=name)
