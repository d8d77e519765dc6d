"""How many messages a step costs, in each protocol (train.protocol), on the deterministic
simulator: exact counts per pserver and kind, bit-identical parameters either way, and those of
local training (to float32 summation order)."""

from __future__ import annotations

import numpy as np
import pytest

from transpiler.distribute.contract import TrainContract
from transpiler.distribute.rpc_plan import Fetch, barrier_plan
from transpiler.ir import Op

from runtime.config.scenario import Scenario, parse_scenario
from runtime.services.cluster import train_locally
from runtime.services.job import Job
from sim.report import collect, notes_for, trainer_table
from sim.simulate import SimResult, simulate

TRAINERS, PSERVERS, STEPS = 2, 2, 3


def scenario(protocol: str, mode: str = "sync", trainers: int = TRAINERS,
             hidden: int = 16) -> Scenario:
    return parse_scenario(f"""
name: counts
model: {{name: mlp, sizes: [64, {hidden}, 10], optimizer: {{type: sgd, learning_rate: 0.5}}}}
data: {{name: digits, batch_size: 8}}
cluster: {{pservers: {PSERVERS}, trainers: {trainers}}}
transpiler: {{mode: {mode}}}
train: {{steps: {STEPS}, protocol: {protocol}}}
""")


def by_kind(result: SimResult) -> list[dict[str, int]]:
    return [dict(sorted(p.messages_by_kind.items())) for p in result.pservers]


def test_a_2x2_sync_step_costs_exactly_the_messages_of_its_protocol() -> None:
    # compact: each trainer sends each pserver 2 SENDs a step (its weight and bias grads) and 2
    # GETs per fetch round (the startup's and each step's): 2 x 3 x 2 = 12 sends, 2 x 4 x 2 =
    # 16 gets. per_op adds a send barrier per step (6) and a fetch barrier per round (8);
    # compact carries both on the last SEND / GET. bundled sends each pserver one SEND a step,
    # carrying both barriers and the step's GET, whose reply brings the values: 6 sends, and
    # the startup's 2 gets. Each trainer ends with a COMPLETE and a BYE (no reply) to each.
    fetches = TRAINERS * (STEPS + 1)
    common = {"bye": TRAINERS, "complete": TRAINERS, "get": 2 * fetches, "send": 2 * TRAINERS * STEPS}
    per_op = simulate(scenario("per_op"))
    compact = simulate(scenario("compact"))
    bundled = simulate(scenario("bundled"))
    assert by_kind(per_op) == [{**common, "fetch_barrier": fetches,
                                "send_barrier": TRAINERS * STEPS}] * PSERVERS
    assert by_kind(compact) == [common] * PSERVERS
    assert by_kind(bundled) == [{"bye": TRAINERS, "complete": TRAINERS, "get": TRAINERS,
                                 "send": TRAINERS * STEPS}] * PSERVERS
    assert (per_op.messages, compact.messages, bundled.messages) == (180, 124, 44)
    assert [t.resends for run in (per_op, compact, bundled) for t in run.trainers] == [0] * 6


WIDE = 256
"""A hidden layer whose weight, 64 x 256, is cut across both pservers (two blocks of the
smallest size, 8,192): async mode fetches it block by block."""


def test_a_bundled_async_step_is_one_request_and_one_reply_per_pserver() -> None:
    """Each trainer's GET of the step rides on its SEND to each pserver, the GET of the var
    fetched block by block included; the startup's GETs stay (nothing was sent)."""
    bundled_async = scenario("bundled", "async", hidden=WIDE)
    main = Job.from_scenario(bundled_async).trainer_programs(0)[0]
    assert any(op.type == "recv" and len(op.attr("epmap")) > 1  # fc0.w, block by block
               for op in main.global_block().ops)
    bundled = simulate(bundled_async)
    assert by_kind(bundled) == [{"bye": TRAINERS, "complete": TRAINERS, "get": TRAINERS,
                                 "send": TRAINERS * STEPS}] * PSERVERS


def test_an_async_run_of_recvs_rides_on_the_run_of_sends_before_it() -> None:
    """Each endpoint's GETs ride on the SEND there that ends the run of sends: a var fetched
    block by block and the vars bundled around it take their values from the one reply
    (``takers``); an endpoint no send reached keeps its GET, as does a recv after a compute op
    (which may read what the recvs before it fetched)."""
    by_row = Op("send", {"X": ["w@GRAD"]}, {"Out": []}, {"epmap": ["e0", "e1"], "sections": [2, 2]})
    by_block = Op("recv", {"X": []}, {"Out": ["w"]},
                  {"epmap": ["e1", "e0"], "recv_varnames": ["w.block0", "w.block1"]})
    ops = [_send("a", "e0"), by_row, _recv("a", "e0"), by_block, _recv("c", "e1"),
           _recv("d", "e2"), Op("relu", {"X": ["a"]}, {"Out": ["r"]}), _recv("e", "e0")]
    plan = barrier_plan(ops, lambda op: False, bundle=True)
    assert plan.held == {id(ops[0]): {"e0"}}
    assert plan.fetches == {id(by_row): {"e0": Fetch(["a", "w.block1"], False, 2),
                                         "e1": Fetch(["w.block0", "c"], False, 2)}}
    assert plan.fetched == {id(ops[2]): {"e0"}, id(by_block): {"e0", "e1"}, id(ops[4]): {"e1"}}
    prefetch = Op("prefetch", {"X": ["ids"]}, {"Out": ["rows"]}, {"epmap": ["e1"]})
    apart = barrier_plan([*ops[:2], prefetch, *ops[2:]], lambda op: False, bundle=True)
    assert apart.fetches == {} and apart.fetched == {}
    assert barrier_plan(ops, lambda op: False).fetches == {}  # compact: no bundling


@pytest.mark.parametrize("mode", ["sync", "async", "half_async", "geo"])
def test_every_protocol_trains_exactly_as_local_training(mode: str) -> None:
    """Bit for bit the same parameters in every protocol, but for bundled async steps with
    more than one trainer: their GET rides on the SEND, so a pserver reads the values at
    another moment, with other trainers' gradients in or not (async's nature); with one
    trainer those too are the same bit for bit."""
    results = {p: simulate(scenario(p, mode, hidden=WIDE))
               for p in ("bundled", "compact", "per_op")}
    if mode in ("async", "half_async"):
        del results["bundled"]
        alone = {p: simulate(scenario(p, mode, trainers=1, hidden=WIDE))
                 for p in ("bundled", "per_op")}
        for name, value in alone["per_op"].params.items():
            np.testing.assert_array_equal(alone["bundled"].params[name], value, err_msg=name)
    for name, value in results["per_op"].params.items():
        for protocol in set(results) - {"per_op"}:
            np.testing.assert_array_equal(results[protocol].params[name], value,
                                          err_msg=f"{protocol}: {name}")
    if mode == "sync":  # float32 sums in another order: per-trainer means, then their mean
        _, local = train_locally(Job.from_scenario(scenario("compact", hidden=WIDE)), "numpy")
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
    assert plan.fetches == {id(ops[2]): {"e0": Fetch(["a", "b"])}, id(ops[3]): {"e1": Fetch(["c"])}}
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


def test_trainers_running_one_program_share_its_plan_until_its_ops_change() -> None:
    job = Job.from_scenario(scenario("compact"))
    program = job.trainer_programs(1)[0]
    contract = TrainContract.of(program)
    plan = contract.plan("compact")
    assert plan.carriers and TrainContract.of(program).plan("compact") is plan
    assert contract.plan("bundled") is not plan
    block = program.global_block()
    block.ops = list(block.ops)[:-1]
    assert TrainContract.of(program).plan("compact") is not plan


def slow_link(steps: int, heartbeat_timeout: float = 10.0) -> Scenario:
    """A 4.3 MB model, 2 trainers on one pserver behind 20 Mbit/s links (timing mode)."""
    return parse_scenario(f"""
name: slow-link
model: {{name: mlp, sizes: [64, 1024, 1024, 10], optimizer: {{type: sgd, learning_rate: 0.01}}}}
data: {{batch_size: 8}}
cluster: {{pservers: 1, trainers: 2}}
backend: {{kernels: phantom}}
train: {{steps: {steps}, heartbeat_timeout: {heartbeat_timeout}}}
network: {{default: {{latency: 1ms, bandwidth: 20Mbps}}}}
""")


def test_a_big_request_on_a_slow_link_is_not_sent_again_while_its_bytes_are_on_their_way(
        ) -> None:
    """A 4.3 MB model, 2 trainers on one pserver behind 20 Mbit/s links: each SEND takes
    seconds to arrive, more than the 1 s before a first resend. Once a trainer's client has
    learnt the pserver's pace (from the startup's fetch) and the size of a SEND's reply (from
    its first), it waits 3 times that long: at most one SEND more than the steps' in all,
    where resending after 1 s, 2 s, 4 s... sent 38 for 8 and took 3 times as long a step."""
    steps = 4
    result = simulate(slow_link(steps))
    (pserver,) = result.pservers
    assert 2 * steps <= pserver.messages_by_kind["send"] <= 2 * steps + 1
    # what was sent again (the startup's fetches, heartbeats queued behind a SEND) is counted
    assert all(trainer.resends > 0 for trainer in result.trainers)
    metrics = collect(result)
    assert [t.resends for t in metrics.trainers] == [t.resends for t in result.trainers]
    assert "resent" in [column.header for column in trainer_table(metrics).columns]
    quiet = collect(simulate(scenario("bundled")))
    assert "resent" not in [column.header for column in trainer_table(quiet).columns]
    assert max(t for trainer in result.trainers for t in trainer.step_times[1:]) < 6.0


def test_a_run_notes_a_pserver_whose_requests_outlast_the_heartbeat_timeout() -> None:
    """The slow link's pserver takes about 3.4 s a step to receive its trainers' 8.6 MB: with
    a 3 s heartbeat timeout a heartbeat queued behind them arrives too late, and the run says
    so (and drops a live trainer); with 10 s it says nothing."""
    short = simulate(slow_link(3, heartbeat_timeout=3.0))
    notes = [n for n in notes_for(short) if n.startswith("network: pserver:0's NIC")]
    busy = short.nics["pserver:0"].busy_in / 3
    assert 2.0 <= busy and notes == [
        f"network: pserver:0's NIC takes {busy:.3g}s a step to receive "
        f"{short.nics['pserver:0'].bytes_in / 3 / 1e6:.3g} MB of requests; a trainer's "
        "heartbeat waits behind its requests, so with train.heartbeat_timeout at 3s the "
        "pserver can drop live trainers: raise it above the step's transfer"]
    assert any(p.dropped for p in short.pservers)
    assert not [n for n in notes_for(simulate(slow_link(3))) if n.startswith("network: pserver")]
