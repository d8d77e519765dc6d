"""Faults in the simulator: the `faults:` schema, message fates on the simulated network, crash
and restart with checkpoints, rewind and rejoin, and every shipped fault scenario replayed with
its `expect` block (tests/faults/test_runtime_faults.py replays them on real processes)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from runtime.config.faults import LinkFaults, Partition, Trigger
from runtime.config.scenario import ScenarioError, load_scenario, parse_scenario
from runtime.services.cluster import LocalCluster
from runtime.services.trainer import TrainerReport
from sim.faults import REORDER_WAIT, MessageFaults, SimTarget, Slowdowns
from sim.loop import run
from sim.network import Network, SimTransport
from sim.report import collect
from sim.simulate import SimResult
from sim.trace import TraceRecorder

from fault_contract import FaultTargetContract, Harness, Look, chances, look
from fault_runs import CUT_TOO_LONG, sim, simulated

ROOT = Path(__file__).resolve().parents[2]
FAULT_SCENARIOS = sorted((ROOT / "scenarios" / "faults").glob("*.yaml"))
LOSSY = ROOT / "scenarios" / "faults" / "lossy.yaml"
RESTART = ROOT / "scenarios" / "faults" / "pserver_restart.yaml"


# -- the schema -------------------------------------------------------------------------------

def test_the_four_fault_shapes_parse_with_units_and_step_triggers() -> None:
    s = load_scenario(ROOT / "scenarios" / "quickstart.yaml", [
        'faults=[{at: "step 80", crash: "pserver:1", restart_after: 2s},'
        ' {at: 1.5s, partition: [["trainer:0"], ["pserver:*"]], heal_after: 300ms},'
        ' {links: ["trainer:*", "pserver:*"], drop: 0.01, delay: 0.1, delay_by: 20ms},'
        ' {at: 2s, slow: "trainer:1", slowdown: 3, for: 1s}]'])
    crash, partition, links, slow = s.faults
    assert crash.at == Trigger(step=80) and crash.restart_after == 2.0  # type: ignore[union-attr]
    assert partition.at == Trigger(seconds=1.5) and partition.heal_after == pytest.approx(0.3)  # type: ignore[union-attr]
    assert links.delay_by == pytest.approx(0.02) and links.at is None  # type: ignore[union-attr]
    assert slow.duration == 1.0 and slow.slowdown == 3.0  # type: ignore[union-attr]


@pytest.mark.parametrize("fault, message", [
    ('{at: 1s, crash: "pserver:5"}', "faults[0]: crash 'pserver:5': no such node"),
    ('{at: 1s, crash: "trainer:*"}', "faults.0.crash: Value error, crash names one node"),
    ('{at: 1s, partition: [["trainer:9"], ["pserver:*"]]}', "'trainer:9' matches no node"),
    ('{links: ["trainer:*", "pserver:*"], drop: 1.0}', "faults.0.drop: Input should be less than 1"),
    ('{at: soon, slow: "trainer:0", slowdown: 2}', 'faults.0.at: Value error, duration \'soon\''),
    ('{at: 1s, crash: "pserver:0", reboot: 2s}', "faults.0.reboot: Extra inputs"),
    ('{at: 1s, explode: "pserver:0"}', "a fault names exactly one of crash, partition, links, slow"),
])
def test_a_bad_fault_is_refused_naming_the_entry_and_line(fault: str, message: str) -> None:
    text = f"name: x\nmodel: {{name: mlp}}\ncluster: {{pservers: 2, trainers: 2}}\nfaults:\n  - {fault}\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "x.yaml")
    assert message.replace("Value error, ", "") in str(err.value)
    assert str(err.value).startswith("x.yaml:")


# -- message fates ------------------------------------------------------------------------------

def test_a_partition_cuts_both_ways_between_its_groups_only() -> None:
    faults = MessageFaults(seed=0)
    faults.partitions.append(Partition(at=Trigger(seconds=0), partition=(("trainer:0",),
                                                                         ("pserver:*",))))
    assert faults.fate("trainer:0", "pserver:1") == faults.fate("pserver:1", "trainer:0")
    assert faults.fate("trainer:0", "pserver:1").cut  # type: ignore[union-attr]
    assert faults.fate("trainer:1", "pserver:1") is None


def test_fates_are_drawn_per_link_from_the_seed_in_a_fixed_order() -> None:
    rule = LinkFaults(links=("trainer:*", "pserver:*"), drop=0.3, duplicate=0.2, reorder=0.1)
    faults = MessageFaults(seed=11)
    faults.rules.append(rule)
    other = [faults.fate("trainer:1", "pserver:0") for _ in range(50)]  # another link's stream
    fates = [faults.fate("trainer:0", "pserver:0") for _ in range(500)]
    rng = random.Random("11:faults:trainer:0->pserver:0")
    for fate in fates:
        drop, dup, late, swap = (rng.random() for _ in range(4))
        assert fate is not None and fate.lost == (drop < 0.3)
        assert fate.copies == 1 + (dup < 0.2) and fate.reorder == (swap < 0.1)
    assert 0.25 < sum(f.lost for f in fates if f) / 500 < 0.35
    assert other != fates[:50]


def deliveries(rule: LinkFaults, count: int = 40) -> tuple[list[tuple[float, int]], Network]:
    """`count` numbered messages from trainer:0 to pserver:0, 1ms apart, under `rule`:
    (arrival time, number) in arrival order."""
    net = Network.from_spec({"default": {"latency": "100us"}}, seed=3)
    net.faults = MessageFaults(seed=3)
    net.faults.rules.append(rule)
    log: list[tuple[float, int]] = []

    async def receive(server: SimTransport) -> None:
        while True:
            _, frames = await server.recv()
            log.append((asyncio.get_running_loop().time(),
                        int.from_bytes(bytes(frames[0]), "little")))

    async def main() -> None:
        server = net.transport("pserver:0")
        await server.bind("ps0")
        client = net.transport("trainer:0")
        await client.connect("ps0")
        receiver = asyncio.get_running_loop().create_task(receive(server))
        for n in range(count):
            await client.send("ps0", [n.to_bytes(4, "little")])
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.1)  # virtual time: everything due has arrived by then
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)

    run(main())
    return log, net


def test_dropped_messages_never_arrive_and_duplicates_arrive_twice() -> None:
    log, net = deliveries(LinkFaults(links=("trainer:*", "pserver:*"), drop=0.2, duplicate=0.2))
    stats = net.link_stats()["trainer:0", "pserver:0"]
    numbers = [n for _, n in log]
    assert len(set(numbers)) == 40 - stats.lost and len(numbers) - len(set(numbers)) == stats.duplicated
    assert stats.lost > 0 and stats.duplicated > 0
    assert numbers == sorted(numbers)  # no reordering asked: order kept


def test_a_reordered_message_arrives_right_after_the_next_one() -> None:
    log, net = deliveries(LinkFaults(links=("trainer:*", "pserver:*"), reorder=0.3))
    numbers = [n for _, n in log]
    assert sorted(numbers) == list(range(40))
    swapped = [i for i in range(39) if numbers[i] > numbers[i + 1]]
    reordered = net.link_stats()["trainer:0", "pserver:0"].reordered
    last_time, last = log[-1]
    held_alone = last == 39 and last_time >= 0.039 + REORDER_WAIT  # no next message came
    assert len(swapped) + held_alone == reordered > 0
    for i in swapped:
        assert numbers[i] == numbers[i + 1] + 1  # a neighbouring pair, swapped


def test_a_duplicated_message_held_back_arrives_twice_behind_the_next() -> None:
    log, net = deliveries(LinkFaults(links=("trainer:*", "pserver:*"), duplicate=0.5,
                                     reorder=0.5))
    stats = net.link_stats()["trainer:0", "pserver:0"]
    numbers = [n for _, n in log]
    assert sorted(set(numbers)) == list(range(40))
    assert len(numbers) - 40 == stats.duplicated > 0  # every copy arrives, held or not
    assert all(numbers.count(n) <= 2 for n in range(40))


def test_several_rules_on_a_link_duplicate_a_message_once_at_most() -> None:
    rule = LinkFaults(links=("trainer:*", "pserver:*"), duplicate=0.9)
    faults = MessageFaults(seed=5)
    faults.rules += [rule, rule.model_copy(update={"links": ("trainer:0", "pserver:0")})]
    copies = [faults.fate("trainer:0", "pserver:0").copies for _ in range(200)]  # type: ignore[union-attr]
    assert set(copies) == {1, 2} and copies.count(2) > 190  # 1 - 0.1 * 0.1 of them


def test_a_delayed_message_arrives_delay_by_later() -> None:
    clean, _ = deliveries(LinkFaults(links=("trainer:*", "pserver:*")))
    late, net = deliveries(LinkFaults(links=("trainer:*", "pserver:*"), delay=0.5,
                                      delay_by=0.0005))
    delayed = [b - a for (a, _), (b, _) in zip(clean, late) if b != a]
    assert len(delayed) == net.link_stats()["trainer:0", "pserver:0"].delayed > 0
    assert delayed == pytest.approx([0.0005] * len(delayed))


# -- the shipped fault scenarios ---------------------------------------------------------------

def test_the_fault_scenarios_are_shipped() -> None:
    assert {p.stem for p in FAULT_SCENARIOS} >= {"lossy", "partition", "pserver_restart",
                                                 "pserver_lost", "trainer_crash", "slow_node",
                                                 "pause"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", FAULT_SCENARIOS, ids=[p.stem for p in FAULT_SCENARIOS])
def test_each_fault_scenario_meets_its_expectations_in_the_simulator(path: Path) -> None:
    scenario = load_scenario(path)
    try:
        metrics = simulated(path)
    except Exception as exc:
        assert scenario.expect.error is not None, f"{path.name} failed: {exc}"
        assert scenario.expect.error in str(exc)
        return
    assert metrics.expectations, f"{path.name} states no expectation"
    failed = [e.detail for e in metrics.expectations if not e.passed]
    assert not failed, failed
    assert metrics.faults and all(f.start is not None for f in metrics.faults)


SWEEP = {"lossy": "train.steps=20",       # faults on every message from the first step
         "partition": "train.steps=30"}   # cut at step 20 for 1 s, then 10 steps after it
"""Shorter than shipped: the fault still strikes and the job goes on past it; the full
scenarios are replayed above."""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", sorted(SWEEP))
def test_sync_under_message_faults_ends_exactly_as_without_them(name: str, seed: int) -> None:
    """200 seeds per scenario are `sim sweep scenarios/faults/NAME.yaml --vary seed=0..199`."""
    path = ROOT / "scenarios" / "faults" / f"{name}.yaml"
    faulty = sim(path, f"seed={seed}", SWEEP[name])
    clean = sim(path, f"seed={seed}", SWEEP[name], "faults=[]")
    links = faulty.links.values()
    assert sum(link.lost for link in links) > 0
    for pname, value in clean.params.items():
        np.testing.assert_array_equal(faulty.params[pname], value, err_msg=pname)
    assert [p.steps for p in faulty.pservers] == [faulty.scenario.train.steps] * 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(3))
def test_a_bundled_async_step_under_message_faults_applies_each_update_once(seed: int) -> None:
    """An async step's GET rides on its SEND (bundled protocol): a lost, duplicated or
    reordered SEND, or its lost reply, is retried and answered from the pserver's dedupe, its
    gradients applied once. One trainer, so the run is plain SGD whatever the timing: bit for
    bit the fault-free run's."""
    lossy = ROOT / "scenarios" / "faults" / "lossy.yaml"
    settings = [f"seed={seed}", "train.steps=20", "transpiler.mode=async", "cluster.trainers=1",
                "train.protocol=bundled", "expect={}"]
    faulty, clean = sim(lossy, *settings), sim(lossy, *settings, "faults=[]")
    assert sum(link.lost for link in faulty.links.values()) > 0
    assert all(p.messages_by_kind.get("get", 0) == 1 for p in faulty.pservers)  # the startup's only
    for pname, value in clean.params.items():
        np.testing.assert_array_equal(faulty.params[pname], value, err_msg=pname)


SHORT = {"lossy": ["train.steps=10"], "partition": ["train.steps=25"],
         "pserver_restart": ["train.steps=50"], "slow_node": ["train.steps=30"],
         "pause": ["train.steps=30"],
         "trainer_crash": ["train.steps=150",
                           'faults=[{at: "step 50", crash: "trainer:1", restart_after: 100ms}]']}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(SHORT))
def test_two_runs_of_a_fault_scenario_give_identical_metrics_and_trace(name: str) -> None:
    def once() -> tuple[str, str]:
        result = sim(ROOT / "scenarios" / "faults" / f"{name}.yaml", *SHORT[name])
        metrics = json.dumps(asdict(collect(result)), sort_keys=True)
        return metrics, json.dumps(result.trace.chrome_trace(), sort_keys=True)
    first, second = once(), once()
    assert first == second
    assert '"cat": "fault"' in first[1]


# -- recovery -----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_restarted_pserver_resumes_from_its_checkpoint_and_trainers_redo_the_rest() -> None:
    result = sim(RESTART, "train.steps=60")
    restarted = result.pservers[1]
    assert restarted.restored_step == 40 and restarted.rewinds >= 2
    assert result.pservers[0].checkpoints == [10, 20, 30, 40, 50, 60][:len(result.pservers[0].checkpoints)]
    redone = [t.redone for t in result.trainers]
    assert all(0 < r <= 10 for r in redone)
    # every trainer took every step once, plus those it redid
    assert [len(t.losses) for t in result.trainers] == [60 + r for r in redone]


@pytest.mark.timeout(60)
def test_a_pserver_restarted_without_checkpoints_starts_over_and_trainers_redo_everything() -> None:
    result = sim(RESTART, "train.steps=60", "train.checkpoint_every=null")
    assert result.pservers[1].restored_step == 0
    assert [t.redone for t in result.trainers] == [45, 44] or \
        all(44 <= t.redone <= 46 for t in result.trainers)


@pytest.mark.timeout(60)
def test_a_trainer_that_dies_for_good_is_dropped_and_the_others_finish() -> None:
    path = ROOT / "scenarios" / "faults" / "trainer_crash.yaml"
    result = sim(path, "train.steps=200", 'faults=[{at: "step 50", crash: "trainer:1"}]')
    finished = [len(t.losses) for t in result.trainers]
    assert finished[0] == finished[2] == 200 and finished[1] in (49, 50)  # the first has 50
    assert all(p.dropped == [1] for p in result.pservers)


@pytest.mark.timeout(60)
def test_a_trainer_cut_off_longer_than_the_heartbeat_timeout_joins_again() -> None:
    """Trainer 0 is cut off for 0.3 s at step 20 with a heartbeat timeout of 0.1 s: both
    pservers drop it and the other goes on alone. When the partition heals its retried SEND
    is answered with a notice to join again, not an error: it joins at the next step every
    pserver admits and trains to the end."""
    result = sim(ROOT / "scenarios" / "faults" / "partition.yaml", "expect={}",
                 "train.heartbeat_timeout=100ms", "network.default.latency=5ms",
                 'faults=[{at: "step 20", partition: [["trainer:0"], ["pserver:*"]],'
                 ' heal_after: 300ms}]')
    cut, other = (len(t.losses) for t in result.trainers)
    assert other == 60 and 20 < cut < 60
    assert all(p.dropped == [0] and p.errors == 0 for p in result.pservers)
    [partition] = result.faults
    rejoined_at = 60 - (cut - 20)  # it finished the 20 steps before the cut, then the rest
    assert result.trainers[0].step_ends[20] > partition.end  # its first step after it joined
    assert rejoined_at > 21


@pytest.mark.timeout(60)
@pytest.mark.parametrize("faults,first", [
    ('[{at: "step 44", partition: [["trainer:0"], ["pserver:*"]], heal_after: 300ms},'
     ' {at: "step 45", crash: "pserver:1", restart_after: 1s}]', "dropped"),
    ('[{at: "step 44", partition: [["trainer:0"], ["pserver:0"]], heal_after: 400ms},'
     ' {at: "step 44", crash: "pserver:1", restart_after: 100ms}]', "rewound"),
], ids=["dropped-then-rewound", "rewound-then-dropped"])
def test_a_trainer_dropped_while_a_pserver_restarts_rejoins_and_the_others_redo(
        faults: str, first: str) -> None:
    """Trainer 0 is cut off past the heartbeat timeout (0.1 s) while pserver 1 restarts from
    its step-40 checkpoint: one pserver tells it to join again and the other to redo the steps
    from 40, the second notice coming while it follows the first. It does both: it joins at a
    later step everyone admits, and trainer 1 redoes the steps from 40 (to 43 or 44)."""
    result = sim(RESTART, "train.steps=80", "expect={}", "train.heartbeat_timeout=100ms",
                 "network.default.latency=5ms", f"faults={faults}")
    cut, other = result.trainers
    assert 0 in result.pservers[0].dropped and result.pservers[1].restored_step == 40
    assert other.redone in (4, 5) and len(other.losses) == 80 + other.redone
    assert 44 <= len(cut.losses) < 80 and cut.losses[-1] < 1.0  # it trained to the end


@pytest.mark.timeout(60)
def test_a_paused_pserver_holds_up_the_job_and_drops_nobody() -> None:
    """pause.yaml: stopped for longer than the heartbeat timeout, pserver 1 neither answers
    nor hears; the trainers wait for it, and once it goes on it finds their messages waiting
    and drops nobody for its own pause. The run ends exactly as without the pause, a second
    later."""
    path = ROOT / "scenarios" / "faults" / "pause.yaml"
    paused, clean = sim(path), sim(path, "faults=[]")
    assert [len(t.losses) for t in paused.trainers] == [60, 60]
    assert all(p.dropped == [] and p.errors == 0 for p in paused.pservers)
    assert all(max(t.step_times) > 0.99 for t in paused.trainers)  # the step it held up
    assert paused.simulated_seconds > clean.simulated_seconds + 0.99
    assert paused.params.keys() == clean.params.keys()
    for name, value in clean.params.items():
        assert np.array_equal(paused.params[name], value), name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("node,timeout", [("*", "300ms"), ("trainer:0", "10s")])
def test_a_pause_of_the_whole_job_or_of_the_trainer_that_set_it_off_ends_as_without_it(
        node: str, timeout: str) -> None:
    """Every node stopped for 1 s (a suspended machine), three heartbeat timeouts: each
    pserver counts only the time it ran, so nobody is dropped. Trainer 0, whose report of step
    20 fires the pause, stopped itself: the pause still ends (the schedule's timers are no
    node's). Both end bit for bit as without the pause, a second later."""
    path = ROOT / "scenarios" / "faults" / "pause.yaml"
    paused = sim(path, f'faults=[{{at: "step 20", pause: "{node}", for: 1s}}]',
                 f"train.heartbeat_timeout={timeout}")
    clean = sim(path, "faults=[]")
    assert [len(t.losses) for t in paused.trainers] == [60, 60]
    assert all(p.dropped == [] and p.errors == 0 for p in paused.pservers)
    assert paused.simulated_seconds > clean.simulated_seconds + 0.99
    for name, value in clean.params.items():
        assert np.array_equal(paused.params[name], value), name


@pytest.mark.timeout(60)
def test_a_paused_trainer_is_dropped_and_joins_again_when_it_goes_on() -> None:
    """Trainer 1, stopped for 0.2 s at step 20 with a heartbeat timeout of 0.1 s, is dropped
    by both pservers; trainer 0 trains on alone (about 0.3 ms a step, 1000 steps). When it
    goes on, its late retries are answered with a notice to join again, and it trains to the
    end from a later step."""
    path = ROOT / "scenarios" / "faults" / "partition.yaml"
    result = sim(path, 'faults=[{at: "step 20", pause: "trainer:1", for: 200ms}]',
                 "train.heartbeat_timeout=100ms", "train.steps=1000", "expect={}")
    alone, paused = result.trainers
    assert len(alone.losses) == 1000 and 20 < len(paused.losses) < 1000
    assert all(p.dropped == [1] and p.errors == 0 for p in result.pservers)
    [pause] = result.faults
    assert paused.step_ends[20] > pause.end  # its step after the pause ended after it


@pytest.mark.timeout(60)
def test_a_trainer_dropped_and_back_after_the_job_ended_is_not_waited_for() -> None:
    """Trainer 0, cut off at step 20 for longer than the rest of the job takes, is dropped;
    the pservers finish with the other trainer. It has nobody left to train with, and would
    wait for replies until its deadline (120 s): the run ends without it instead."""
    result = sim(ROOT / "scenarios" / "faults" / "partition.yaml", *CUT_TOO_LONG)
    assert [len(t.losses) for t in result.trainers] == [20, 60]
    assert all(p.dropped == [0] and p.errors == 0 for p in result.pservers)
    [partition] = result.faults
    assert result.simulated_seconds < partition.start + 3.0


@pytest.mark.timeout(60)
def test_a_trainer_due_back_after_the_job_ended_is_not_waited_for() -> None:
    """Trainer 1 crashes at step 50 of 60 to come back 2 s later; the others finish in well
    under a second and the pservers, having dropped it, with them: the run ends then (not with
    the restarted trainer timing out on pservers that are gone), and the crash lasted to the
    end."""
    path = ROOT / "scenarios" / "faults" / "trainer_crash.yaml"
    result = sim(path, "train.steps=60", "expect={}")
    finished = [len(t.losses) for t in result.trainers]
    assert finished[0] == finished[2] == 60 and finished[1] in (49, 50)
    assert all(p.dropped == [1] for p in result.pservers)
    [crash] = result.faults
    ended = result.simulated_seconds
    assert crash.end is None and ended < crash.start + 2.0
    assert crash.detail.endswith(f" reported step 50; the run ended at {ended:.3f}s, before "
                                 f"its end was due at {crash.start + 2.0:.3f}s")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["async", "half_async"])
def test_in_the_asynchronous_modes_a_restarted_trainer_goes_on_after_its_last_step(mode: str) -> None:
    path = ROOT / "scenarios" / "faults" / "trainer_crash.yaml"
    result = sim(path, f"transpiler.mode={mode}", "train.steps=300", "expect={}",
                 'faults=[{at: "step 50", crash: "trainer:1", restart_after: 100ms}]')
    crashed = result.trainers[1]
    assert 45 <= crashed.first_step <= 60
    assert len(crashed.losses) == 300 - crashed.first_step + _steps_before_crash(result)


def _steps_before_crash(result: SimResult) -> int:
    """Steps trainer 1 finished before it crashed (its restarted life starts at first_step)."""
    ends = result.trainers[1].step_ends
    crash = result.faults[0].start
    return sum(1 for end in ends if end <= crash)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["async", "half_async"])
def test_in_the_asynchronous_modes_a_restarted_pserver_goes_on_from_its_checkpoint(mode: str) -> None:
    result = sim(RESTART, f"transpiler.mode={mode}", "train.steps=60", "expect={}")
    first, restarted = result.pservers
    assert first.checkpoints == [10, 20, 30, 40, 50, 60]
    assert restarted.restored_step == 40 and restarted.checkpoints == [50, 60]
    assert [t.redone for t in result.trainers] == [0, 0]  # nothing to redo: no barrier
    assert [len(t.losses) for t in result.trainers] == [60, 60]


# -- the fault target contract ------------------------------------------------------------------

class _Idle:
    """What `LocalCluster` closes and reads of a crashed node that never did anything."""

    def __init__(self, index: int) -> None:
        self.report = TrainerReport(index)
        self.rpc = self.client = self.transport = self

    async def abandon(self) -> None:
        pass

    async def close(self) -> None:
        pass


class IdleCluster(LocalCluster):
    """A `LocalCluster` of 2 pservers and 2 trainers whose nodes wait and do nothing: its crash
    and restart bookkeeping is the simulator's own."""

    def __init__(self) -> None:
        super().__init__(None, lambda name: None)  # type: ignore[arg-type]
        for j in range(2):
            self._start_pserver(j)
        for i in range(2):
            self._start_trainer(i)

    def _start_pserver(self, index: int, recovering: bool = False) -> None:
        self.servers[index] = _Idle(index)  # type: ignore[assignment]
        self._launch(f"pserver:{index}", asyncio.Event().wait())

    def _start_trainer(self, index: int) -> None:
        self.trainers[index] = _Idle(index)  # type: ignore[assignment]
        self._launch(f"trainer:{index}", asyncio.Event().wait())


class UnitCost:
    def cost(self, node: str, op: object, scope: object, step: int) -> float:
        return 1.0


class SimHarness:
    def __init__(self) -> None:
        self.cluster = IdleCluster()
        self.messages = MessageFaults(seed=0)
        self.slowdowns = Slowdowns(UnitCost())  # type: ignore[arg-type]
        self.network = Network()
        self.target = SimTarget(self.cluster, self.messages, self.slowdowns, TraceRecorder(),
                                self.network)

    def look(self) -> Look:
        def cut(a: str, b: str) -> bool:
            there, back = self.messages.fate(a, b), self.messages.fate(b, a)
            assert (there is not None and there.cut) == (back is not None and back.cut)
            return there is not None and there.cut

        def link(a: str, b: str) -> tuple[float, float, float]:
            return chances([r for r in self.messages.rules if r.matches(a, b)])

        return look(set(self.cluster.down), cut, link,
                    lambda node: self.slowdowns.cost(node, None, None, 0),  # type: ignore[arg-type]
                    self.target.paused)

    async def close(self) -> None:
        tasks = list(self.cluster._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class TestSimTarget(FaultTargetContract):
    @pytest.fixture
    def harness(self) -> Callable[[], Harness]:
        return SimHarness
