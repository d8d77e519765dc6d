"""How many messages a step costs, in each protocol (train.protocol), on the deterministic
simulator: exact counts per pserver and kind, bit-identical parameters either way, and those of
local training (to float32 summation order)."""

from __future__ import annotations

import numpy as np
import pytest

from transpiler.ir import Op

from runtime.config.scenario import Scenario, parse_scenario
from runtime.services.cluster import train_locally
from runtime.services.job import Job
from runtime.services.trainer import _shared_plan, barrier_plan
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
    # compact carries both on the last SEND / GET. bundled sends each pserver one SEND a step,
    # carrying both barriers and the step's GET, whose reply brings the values: 6 sends, and
    # the startup's 2 gets.
    fetches = TRAINERS * (STEPS + 1)
    common = {"complete": TRAINERS, "get": 2 * fetches, "send": 2 * TRAINERS * STEPS}
    per_op = simulate(scenario("per_op"))
    compact = simulate(scenario("compact"))
    bundled = simulate(scenario("bundled"))
    assert by_kind(per_op) == [{**common, "fetch_barrier": fetches,
                                "send_barrier": TRAINERS * STEPS}] * PSERVERS
    assert by_kind(compact) == [common] * PSERVERS
    assert by_kind(bundled) == [{"complete": TRAINERS, "get": TRAINERS,
                                 "send": TRAINERS * STEPS}] * PSERVERS
    assert (per_op.messages, compact.messages, bundled.messages) == (176, 120, 40)


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


def _send(var: str, ep: str) -> Op:
    return Op("send", {"X": [var]}, {"Out": []}, {"epmap": [ep]})


def _recv(var: str, ep: str) -> Op:
    return Op("recv", {"X": []}, {"Out": [var]}, {"epmap": [ep]})


def _barrier(kind: str) -> Op:
    return Op(kind, {}, {}, {"endpoints": ["e0", "e1"]})


def test_bundling_joins_each_run_of_sends_and_of_recvs_per_endpoint() -> None:
    """A compute op between sends keeps their run (the earlier send's vars wait for the later
    op's message); the recvs right after the barrier are one GET per endpoint."""
    ops = [_send("a", "e0"), Op("relu", {"X": ["h"]}, {"Out": ["r"]}), _send("b", "e0"),
           _send("c", "e1"), _barrier("send_barrier"), _recv("a", "e0"), _recv("b", "e0"),
           _recv("c", "e1"), _barrier("fetch_barrier")]
    plan = barrier_plan(ops, lambda op: False, bundle=True)
    assert plan.held == {id(ops[0]): {"e0"}, id(ops[5]): {"e0"}}
    assert plan.carriers == {id(ops[2]): {"e0": 1}, id(ops[3]): {"e1": 1}}
    assert plan.covered == {id(ops[4]): {"e0", "e1"}, id(ops[8]): {"e0", "e1"}}
    # both barriers carried to every endpoint: each GET rides on the SEND there
    assert plan.fetches == {id(ops[2]): {"e0": ["a", "b"]}, id(ops[3]): {"e1": ["c"]}}
    assert plan.fetched == {id(ops[6]): {"e0"}, id(ops[7]): {"e1"}}
    unbundled = barrier_plan(ops, lambda op: False)
    assert unbundled.held == {}
    assert unbundled.carriers[id(ops[2])] == {"e0": 2} == unbundled.carriers[id(ops[6])]


def test_another_rpc_op_ends_a_run_of_sends_and_any_other_op_a_run_of_recvs() -> None:
    """A prefetch may wait for what was sent, a compute op may read what was fetched: the
    messages on either side of them stay apart, and the barrier counts both."""
    prefetch = Op("prefetch", {"X": ["ids"]}, {"Out": ["rows"]}, {"epmap": ["e1"]})
    ops = [_send("a", "e0"), prefetch, _send("b", "e0"), _barrier("send_barrier"),
           _recv("a", "e0"), Op("relu", {"X": ["a"]}, {"Out": ["r"]}), _recv("b", "e0"),
           _barrier("fetch_barrier")]
    plan = barrier_plan(ops, lambda op: False, bundle=True)
    assert plan.held == {} and plan.fetches == {} and plan.fetched == {}
    assert plan.carriers == {id(ops[2]): {"e0": 2}, id(ops[6]): {"e0": 2}}
    assert plan.covered == {id(ops[3]): {"e0"}, id(ops[7]): {"e0"}}


def test_trainers_running_one_block_share_its_barrier_plan_until_its_ops_change() -> None:
    job = Job.from_scenario(scenario("compact"))
    block = job.trainer_programs(1)[0].global_block()
    no_rpc_inside = lambda op: False  # noqa: E731
    plan = _shared_plan(block, no_rpc_inside, bundle=False)
    assert plan.carriers and _shared_plan(block, no_rpc_inside, bundle=False) is plan
    assert _shared_plan(block, no_rpc_inside, bundle=True) is not plan
    block.ops = list(block.ops)[:-1]
    assert _shared_plan(block, no_rpc_inside, bundle=False) is not plan
