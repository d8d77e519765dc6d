"""Faults in role mode (`runtime.launch.role`): every node run on its own (``runtime up --role``)
acts out the faults that concern it, and the job ends as `runtime up` ends it.

- The fault contract (`fault_contract`) on role mode's targets: one `RuntimeTarget` per node,
  each acting on its own node only (a pserver's holding its fault proxy), together realise what
  one schedule calls, as runtime up's single target does.
- A 2 x 2 job run as four role processes on loopback, with a message loss on every link and a
  trainer crash and restart, meets its expect block as `runtime up` of the same scenario does.
  All of it encrypted: each pserver's proxy speaks CurveZMQ with that pserver's keys. Each
  supervisor records what it did of the faults beside its node's record, and `runtime collect`
  merges those into metrics.json's fault events and proxy counters, as `runtime up` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.config.faults import LinkFaults, Partition
from runtime.config.metrics import FaultEvent as MetricsEvent
from runtime.config.metrics import NodeFaults, ProxyMetrics, read_metrics, read_record
from runtime.config.scenario import parse_scenario
from runtime.faults.inject import RuntimeTarget
from runtime.faults.proxy import Direction, FaultProxy
from runtime.faults.schedule import ScheduleEvent
from runtime.launch.collect import merge_faults
from runtime.launch.role import FAULTS_SUFFIX, concerns, message_faults

from fault_contract import NODES, FaultTargetContract, Harness, Look, look
from fault_runs import FakeNodes
from metrics_schema import assert_valid_metrics
from runtime_runs import NODES as ROLES
from runtime_runs import collect, run_roles, up


class Fanout:
    """The schedule's calls handed to every node's target, as every host's schedule gets
    them; a crash's note is that of the crashed node's own target."""

    def __init__(self, targets: dict[str, RuntimeTarget]) -> None:
        self.targets = targets

    def crash(self, node: str, returning: bool) -> str | None:
        notes = {name: t.crash(node, returning) for name, t in self.targets.items()}
        return notes[node]

    def restart(self, node: str) -> None:
        for target in self.targets.values():
            target.restart(node)

    def set_partitions(self, partitions: tuple[Partition, ...]) -> None:
        for target in self.targets.values():
            target.set_partitions(partitions)

    def set_link_rules(self, rules: tuple[LinkFaults, ...]) -> None:
        for target in self.targets.values():
            target.set_link_rules(rules)

    def slow(self, node: str, factor: float) -> str:
        return {n: t.slow(node, factor) for n, t in self.targets.items()}[node]

    def unslow(self, node: str, factor: float) -> str:
        return {n: t.unslow(node, factor) for n, t in self.targets.items()}[node]

    def pause(self, node: str) -> str:
        return {n: t.pause(node) for n, t in self.targets.items()}[node]

    def resume(self, node: str) -> None:
        for target in self.targets.values():
            target.resume(node)

    def fired(self, event: ScheduleEvent) -> None:
        pass

    def ended(self, event: ScheduleEvent) -> None:
        pass


class RoleHarness:
    """Role mode's targets of a 2 x 2 job: each node's own, over a fake process of that node
    only, and a fault proxy (never started) on each pserver's."""

    def __init__(self) -> None:
        self.nodes = {node: FakeNodes({node}) for node in NODES}
        self.proxies = {j: FaultProxy(upstream=f"127.0.0.1:{7000 + j}",
                                      upstream_name=f"pserver:{j}") for j in range(2)}
        self.own = {node: RuntimeTarget(
            self.nodes[node], {int(node[-1]): self.proxies[int(node[-1])]}
            if node.startswith("pserver") else {}, 2, lambda _: None, own=node)
            for node in NODES}
        self.target = Fanout(self.own)

    def look(self) -> Look:
        down = {node for node, fake in self.nodes.items() if node not in fake.running}
        assert all(len(fake.running) <= 1 for fake in self.nodes.values())
        assert all(target.paused <= {node} for node, target in self.own.items())

        def link(trainer: str, pserver: str) -> tuple[float, float, float]:
            faults = self.proxies[int(pserver[-1])].faults_for(trainer, Direction.UP)
            return faults.drop, faults.duplicate, faults.reorder

        return look(down,
                    lambda t, p: self.proxies[int(p[-1])].partition_of(t) == "drop", link,
                    lambda node: self.own[node].slowdown(node),
                    {node for node, target in self.own.items() if node in target.paused})

    async def close(self) -> None:
        for target in self.own.values():
            await target.close()


class TestRoleTargets(FaultTargetContract):
    @pytest.fixture
    def harness(self) -> Callable[[], Harness]:
        return RoleHarness


def test_a_node_acts_only_on_its_own_node() -> None:
    fake = FakeNodes({"trainer:0"})
    target = RuntimeTarget(fake, {}, 2, lambda _: None, own="trainer:0")
    assert target.crash("trainer:1", True) == "by trainer:1's own host"
    assert target.slow("pserver:0", 2.0) == "pserver:0 by its own host"
    target.restart("trainer:1")
    assert fake.calls == []


def test_a_fault_several_hosts_acted_out_is_one_event_from_first_start_to_last_end() -> None:
    def rule(start: float, end: float | None, detail: str) -> MetricsEvent:
        return MetricsEvent(0, "links", "links trainer:*<->pserver:*: drop 0.1", start, end,
                            detail)

    crash = MetricsEvent(1, "crash", "crash trainer:0", 0.5, 1.5, "at 0.5s; SIGKILL to 7")
    proxy = ProxyMetrics(1, "10.0.0.2:6170", "127.0.0.1:6171", {"trainer:0": {}})
    events, proxies = merge_faults([
        NodeFaults("pserver:0", [rule(0.25, 2.0, "at 0.25s")]),
        NodeFaults("pserver:1", [rule(0.125, 3.0, "at 0.125s")], proxy),
        NodeFaults("trainer:0", [crash])])
    assert events == [
        MetricsEvent(0, "links", "links trainer:*<->pserver:*: drop 0.1", 0.125, 3.0,
                     "pserver:0: at 0.25s; pserver:1: at 0.125s"),
        MetricsEvent(1, "crash", "crash trainer:0", 0.5, 1.5, "trainer:0: at 0.5s; SIGKILL to 7")]
    assert proxies == [proxy]
    lasting, _ = merge_faults([NodeFaults("pserver:0", [rule(0.25, None, "")]),
                               NodeFaults("pserver:1", [rule(0.125, 3.0, "")])])
    assert [e.end for e in lasting] == [None]  # it lasted to the end on one host


SCENARIO = """\
name: role-faults
seed: 3
model: {name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}
data: {batch_size: 16}
cluster: {pservers: 2, trainers: 2}
transpiler: {mode: sync}
# steps: enough for the restarted trainer:1 to find the job still running, however long its
# process takes to start on a busy machine (at 200 it rejoined at step 93 on an idle one, about
# 1.3 s before trainer:0's end, and on a loaded one came back to pservers already gone);
# retry_after: a lost message (1 in 20) costs a sync step that long (at 100 ms the test took
# a minute)
train: {steps: 500, deadline: 90s, heartbeat_timeout: 1s, retry_after: 30ms, log_every: 20}
faults:
  - {links: ["trainer:*", "pserver:*"], drop: 0.05}
  - {at: "step 10", crash: "trainer:1", restart_after: 1500ms}
expect: {final_loss_below: 2.0}
"""
STEPS = 500


def test_which_node_acts_out_which_fault() -> None:
    scenario = parse_scenario(SCENARIO)
    links, crash = scenario.faults
    assert [n for n in NODES if concerns(links, n, scenario)] == ["pserver:0", "pserver:1"]
    assert [n for n in NODES if concerns(crash, n, scenario)] == ["trainer:1"]
    assert message_faults(scenario) == [0]


@pytest.mark.timeout(240)
def test_a_job_of_role_processes_with_faults_ends_as_runtime_up_ends_it(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    dirs, said = run_roles(scenario, tmp_path, 180)  # encrypted: each proxy has its keys
    trainer1 = said[3]
    assert "SIGKILL to process group" in trainer1 and "(trainer:1 reported step 10;" in trainer1
    assert "restarting trainer:1 (--incarnation 1)" in trainer1
    dropped = {}  # (pserver, direction) -> what its supervisor said its proxy dropped
    for j, pserver in enumerate(said[:2]):  # each proxy dropped messages of its links, both ways
        for direction in ("up", "down"):
            line = next(ln for ln in pserver.splitlines() if f"fault proxy {direction}:" in ln)
            dropped[j, direction] = int(line.split("dropped=")[1].split(",")[0])
            assert dropped[j, direction] > 0, line
    code, lines = collect(*map(str, dirs), "-o", str(tmp_path / "merged"))
    assert code == 0 and lines[-1] == "OK: role-faults", lines
    assert_valid_metrics(tmp_path / "merged" / "metrics.json")
    role_mode = read_metrics(tmp_path / "merged" / "metrics.json")
    assert role_mode.trainers[1].first_step > 0  # its record is its restarted life's

    # What each supervisor did of the faults, beside its node's record (trainer:0 had none:
    # no fault concerned it), merged into one list of events and one proxy per pserver.
    reports = {f"{role}:{index}": read_record(d / "nodes" / f"{role}-{index}{FAULTS_SUFFIX}",
                                              NodeFaults)
               for (role, index), d in zip(ROLES, dirs) if (role, index) != ("trainer", 0)}
    assert not (dirs[2] / "nodes" / f"trainer-0{FAULTS_SUFFIX}").exists()
    assert [(n, [e.fault for e in r.faults]) for n, r in reports.items()] == [
        ("pserver:0", [0]), ("pserver:1", [0]), ("trainer:1", [1])]
    links = [reports[f"pserver:{j}"].faults[0] for j in range(2)]
    (crash,) = reports["trainer:1"].faults
    assert role_mode.faults == sorted([
        MetricsEvent(0, "links", links[0].what, min(e.start for e in links), None,
                     f"pserver:0: {links[0].detail}; pserver:1: {links[1].detail}"),
        MetricsEvent(1, "crash", crash.what, crash.start, crash.end,
                     f"trainer:1: {crash.detail}")], key=lambda e: (e.start, e.fault))
    assert [e.detail for e in links] == ["from the start"] * 2 and crash.end is not None
    assert crash.detail.startswith("trainer:1 reported step 10; SIGKILL to process group ")
    assert role_mode.proxies == [reports["pserver:0"].proxy, reports["pserver:1"].proxy]
    for proxy in role_mode.proxies:  # its connections' drops add up to what its host said
        assert sorted(proxy.links) == ["trainer:0", "trainer:1"]
        for direction in ("up", "down"):
            assert sum(link[direction]["dropped"] for link in proxy.links.values()) == \
                dropped[proxy.pserver, direction]

    code, lines = up(str(scenario), "--out", str(tmp_path / "up"))
    assert code == 0 and lines[-1] == "OK: role-faults", lines
    runtime_up = read_metrics(tmp_path / "up" / "metrics.json")
    assert [(e.name, e.passed) for e in role_mode.expectations] == \
        [(e.name, e.passed) for e in runtime_up.expectations] == [("final_loss_below", True)]
    assert [len(t.losses) + t.first_step for t in role_mode.trainers] == \
        [len(t.losses) + t.first_step for t in runtime_up.trainers] == [STEPS, STEPS]
    assert [(e.fault, e.kind, e.what) for e in role_mode.faults] == \
        [(e.fault, e.kind, e.what) for e in runtime_up.faults]
    assert runtime_up.proxies is not None
    assert [(p.pserver, sorted(p.links)) for p in role_mode.proxies] == \
        [(p.pserver, sorted(p.links)) for p in runtime_up.proxies]
