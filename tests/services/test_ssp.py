"""Bounded-staleness async (ssp mode): the transpiler's option, the pserver policy driven by
events (which read is held, and which event releases it), the bound over random schedules, and
whole runs under `sim run` and `runtime up`."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.cli import main as runtime_main
from runtime.config.metrics import JobMetrics, JobSummary, TrainerMetrics, read_metrics
from runtime.config.scenario import ScenarioError, load_scenario, parse_scenario
from runtime.network.wire import Kind, Message
from runtime.services.pserver_actions import Action, Begin, Pay, Replay, Reply, Tally
from sim.cli import main as sim_main
from sim.report import collect
from sim.simulate import simulate
from sim.sweep import time_to_loss
from transpiler.distribute.config import DistributeTranspilerConfig
from transpiler.distribute.contract import ServeContract
from transpiler.distribute.from_spec import config_from_spec

from metrics_schema import assert_valid_metrics
from pserver_shell import PARAM, Shell, grad, kinds, replies

ROOT = Path(__file__).resolve().parents[2]
SSP = ROOT / "scenarios" / "ssp.yaml"


def ssp(staleness: int | str, trainers: int = 2) -> Shell:
    return Shell("ssp", trainers=trainers, transpiler=f"staleness: {staleness}")


def step(shell: Shell, trainer: int, s: int) -> tuple[list[Action], Message]:
    """`trainer`'s step `s` here: its SEND, then its GET (the read for step s + 1); the
    actions of the GET and the GET."""
    shell.send(shell.message(Kind.SEND, trainer, s, grad(shell, trainer, 1.0)))
    get = shell.message(Kind.GET, trainer, s, names=[PARAM])
    return shell.send(get), get


def answered(actions: list[Action]) -> list[int]:
    return [m.id for m in replies(actions)]


# -- the option ---------------------------------------------------------------------------------

def test_the_scenario_maps_ssp_onto_async_with_a_staleness_bound() -> None:
    config, sync = config_from_spec({"mode": "ssp", "staleness": 3})
    assert (sync, config.runtime_split_send_recv, config.staleness) == (False, True, 3)
    assert config_from_spec({"mode": "ssp", "staleness": "inf"})[0].staleness == math.inf
    assert config_from_spec({"mode": "async"})[0].staleness is None
    with pytest.raises(ValueError, match="transpiler.staleness: .*staleness needs mode ssp; got mode async"):
        config_from_spec({"mode": "async", "staleness": 1})


def test_the_pserver_program_carries_the_bound_and_async_programs_do_not() -> None:
    assert ServeContract.of(ssp(2).program).staleness == 2
    assert ServeContract.of(ssp("inf").program).staleness == math.inf
    contract = ServeContract.of(Shell("async").program)
    assert contract.staleness is None and "staleness" not in contract.op.attrs


@pytest.mark.parametrize("fields, culprit", [
    ({"staleness": -1}, "must be None, an int >= 0 or math.inf, got -1"),
    ({"staleness": 1}, "staleness (bounded-staleness async) needs runtime_split_send_recv"),
])
def test_bad_staleness_settings_name_the_field(fields: dict, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit.replace("(", r"\(").replace(")", r"\)")):
        DistributeTranspilerConfig(**fields).validate()


@pytest.mark.parametrize("transpiler", ["{mode: ssp}", "{mode: async, staleness: 2}",
                                        "{mode: ssp, staleness: -1}"])
def test_the_schema_ties_staleness_to_ssp(transpiler: str) -> None:
    with pytest.raises(ScenarioError, match="transpiler"):
        parse_scenario(f"name: x\nmodel: {{name: mlp}}\ntranspiler: {transpiler}\n")


# -- the policy, event by event -----------------------------------------------------------------

def test_staleness_0_holds_a_read_until_every_trainer_completed_the_step() -> None:
    shell = ssp(0)
    assert shell.core.policy.name == "ssp"
    held, get = step(shell, 0, 0)
    assert held == [Begin()]  # held: trainer 1 has not completed step 0
    assert replies(shell.send(get))[0].extra["pending"] is True  # a retry is told to wait
    shell.now = 2.5
    sent = shell.send(shell.message(Kind.SEND, 1, 0, grad(shell, 1, 1.0)))
    assert get.id not in answered(sent)  # trainer 1 is in step 0, not past it
    released, own = step(shell, 1, 0)
    assert kinds(released) == [Begin, Tally, Pay, Reply, Replay, Begin, Tally, Tally, Pay, Reply,
                               Replay]
    assert answered(released) == [own.id, get.id]
    assert Tally("blocked_seconds", 2.5, key=0) in released
    assert Tally("read_staleness_max", 0, peak=True) in released
    np.testing.assert_array_equal(replies(released)[1].vars[PARAM], shell.store.scope.get(PARAM))


def test_a_trainer_may_read_staleness_steps_ahead_and_no_further() -> None:
    shell = ssp(1, trainers=3)
    for s in (0, 1):  # trainers 0 and 1 run ahead; trainer 2 has completed nothing
        for trainer in (0, 1):
            actions, get = step(shell, trainer, s)
            assert answered(actions) == ([get.id] if s == 0 else [])
    actions, get = step(shell, 2, 0)  # the slowest completes step 0: reads for step 2 may go
    assert answered(actions)[0] == get.id and len(answered(actions)) == 3
    assert shell.core.policy.clocks == {0: 2, 1: 2, 2: 1}
    assert Tally("read_staleness_max", 1, peak=True) in actions


def test_an_unbounded_staleness_never_holds_and_measures_how_far_reads_ran_ahead() -> None:
    shell = ssp("inf")
    for s in range(5):
        actions, get = step(shell, 0, s)
        assert answered(actions) == [get.id]
    assert Tally("read_staleness_max", 5, peak=True) in actions


def test_a_prefetch_is_a_read_for_its_own_step() -> None:
    shell = ssp(0)
    step(shell, 0, 0)
    prefetch = shell.message(Kind.PREFETCH, 0, 1, {"ids": np.zeros((1, 1), np.int64)})
    assert shell.send(prefetch) == [Begin()]


def test_a_held_read_riding_on_a_send_applies_the_send_once() -> None:
    """The bundled protocol's async step is one SEND carrying its GET (``fetch``). The bound
    holds the read with the gradients already in; replayed, it is answered as the read and its
    gradients are not applied again: the parameters and the values read are those of a SEND
    and a GET apart."""
    apart, riding = ssp(0), ssp(0)
    read_apart, read_riding = {}, {}
    for trainer in (0, 1):
        actions, get = step(apart, trainer, 0)
        read_apart.update({m.id: m for m in replies(actions)})
        carrier = riding.message(Kind.SEND, trainer, 0, grad(riding, trainer, 1.0),
                                 fetch=[PARAM])
        actions = riding.send(carrier)
        read_riding.update({m.id: m for m in replies(actions)})
        if trainer == 0:
            assert answered(actions) == []  # held, its gradients in
    assert kinds(actions)[-6:] == [Begin, Tally, Tally, Pay, Reply, Replay]  # no RunBlocks
    np.testing.assert_array_equal(riding.store.scope.get(PARAM), apart.store.scope.get(PARAM))
    firsts = [min(read_apart), min(read_riding)]  # trainer 0's read, released by trainer 1
    np.testing.assert_array_equal(read_riding[firsts[1]].vars[PARAM],
                                  read_apart[firsts[0]].vars[PARAM])


def test_a_trainer_that_completes_no_longer_holds_the_others() -> None:
    shell = ssp(0)
    held, get = step(shell, 0, 0)
    assert held == [Begin()]
    done = shell.send(shell.message(Kind.COMPLETE, 1, 0))
    assert answered(done)[-1] == get.id


def test_a_silent_trainer_is_dropped_and_its_return_is_waited_for_again() -> None:
    shell = ssp(0)
    shell.send(shell.message(Kind.HEARTBEAT, 1, 0))
    held, get = step(shell, 0, 0)
    shell.now = 11.0  # trainer 1 silent past the heartbeat timeout; trainer 0 heartbeats
    shell.send(shell.message(Kind.HEARTBEAT, 0, 1))
    ticked = shell.drive(shell.core.on_tick())
    assert ticked[0] == Tally("dropped", 1)
    assert answered(ticked) == [get.id]
    assert Tally("blocked_seconds", 11.0, key=0) in ticked
    _, late = step(shell, 1, 0)  # back: it counts again, so trainer 0's next read waits
    assert 1 in shell.core.round.live
    held_again, get2 = step(shell, 0, 1)
    assert held_again == [Begin()]
    assert answered(step(shell, 1, 1)[0])[-1] == get2.id


def test_the_server_stops_once_every_trainer_completed() -> None:
    shell = ssp(1)
    shell.send(shell.message(Kind.COMPLETE, 0, 3))
    assert any(type(a).__name__ == "Stop" for a in shell.send(shell.message(Kind.COMPLETE, 1, 3)))


# -- the bound over random schedules ----------------------------------------------------------

STEPS = 6


@given(staleness=st.integers(0, 3), trainers=st.integers(2, 4),
       order=st.lists(st.integers(0, 3), min_size=0, max_size=80))
def test_no_read_is_ever_served_more_than_staleness_steps_ahead(
        staleness: int, trainers: int, order: list[int]) -> None:
    """Trainers take their steps (SEND, then GET, the next step only once the GET is answered,
    COMPLETE after the last) in a random order: every read served sees every live trainer's
    updates of the steps before (its step - staleness), the server's measure says so, and
    every trainer finishes (nothing is held for ever)."""
    shell = ssp(staleness, trainers)
    at = [0] * trainers          # the step each trainer is in
    waiting: dict[int, int] = {}  # trainer -> the id of its GET held
    applied = [0] * trainers     # the steps whose gradients are applied here
    done: set[int] = set()
    reads = 0
    measured: list[int | float] = []

    def send(msg: Message) -> list[Action]:
        actions = shell.send(msg)
        measured.extend(a.value for a in actions
                        if isinstance(a, Tally) and a.stat == "read_staleness_max")
        return actions

    def take(trainer: int) -> None:
        nonlocal reads
        if trainer in waiting or trainer in done:
            return
        if at[trainer] == STEPS:
            send(shell.message(Kind.COMPLETE, trainer, STEPS - 1))
            done.add(trainer)
            return
        s = at[trainer]
        send(shell.message(Kind.SEND, trainer, s, grad(shell, trainer, 0.01)))
        applied[trainer] = s + 1
        get = shell.message(Kind.GET, trainer, s, names=[PARAM])
        waiting[trainer] = get.id
        for reply in replies(send(get)):
            reader = next((t for t, i in waiting.items() if i == reply.id), None)
            if reader is None:
                continue
            reads_for = at[reader] + 1
            behind = [applied[u] for u in range(trainers) if u not in done]
            assert min(behind) >= reads_for - staleness, (reader, reads_for, applied)
            del waiting[reader]
            at[reader] += 1
            reads += 1

    for trainer in order:
        take(trainer % trainers)
    for _ in range(trainers * (STEPS + 2) * 2):
        for trainer in range(trainers):
            take(trainer)
    assert done == set(range(trainers)) and not waiting
    assert reads == len(measured) == trainers * STEPS
    assert max(measured) <= staleness


# -- whole runs -----------------------------------------------------------------------------------

def test_sim_run_bounds_the_staleness_and_a_straggler_holds_the_others() -> None:
    scenario = load_scenario(SSP, ["train.steps=30"])
    metrics = collect(simulate(scenario, base_dir=SSP.parent))
    job = metrics.job
    assert job.mode == "ssp" and job.success
    assert job.read_staleness_max == 2
    assert [p.read_staleness_max for p in metrics.pservers] == [2, 2]
    held = metrics.pservers[0].blocked_seconds or {}
    assert set(held) == {0, 1, 2} and all(seconds > 0 for seconds in held.values())
    assert 3 not in held  # the straggler itself is never held
    assert job.blocked_seconds == pytest.approx(
        sum(max((p.blocked_seconds or {}).get(t, 0.0) for p in metrics.pservers)
            for t in range(4)))
    unbounded = collect(simulate(load_scenario(SSP, ["train.steps=30",
                                                     "transpiler.staleness=inf"]),
                                 base_dir=SSP.parent)).job
    assert unbounded.read_staleness_max is not None and unbounded.read_staleness_max > 2
    assert unbounded.blocked_seconds == 0.0
    assert unbounded.train_seconds is not None and job.train_seconds is not None


@pytest.mark.timeout(90)
@pytest.mark.parametrize("protocol", ["compact", "bundled"])
def test_runtime_up_runs_ssp_and_reports_the_bound(tmp_path: Path, protocol: str) -> None:
    """As processes, in either protocol (bundled: a read the bound holds rides on its SEND)."""
    scenario = tmp_path / "ssp.yaml"
    scenario.write_text(f"""\
name: ssp-up
seed: 3
model: {{name: mlp, sizes: [16, 8, 4], optimizer: {{type: sgd, learning_rate: 0.1}}}}
data: {{batch_size: 8}}
cluster: {{pservers: 2, trainers: 3}}
transpiler: {{mode: ssp, staleness: 1}}
train: {{steps: 12, deadline: 60s, heartbeat_timeout: 10s, retry_after: 100ms,
         protocol: {protocol}}}
""")
    out = tmp_path / "out"
    code = runtime_main(["up", str(scenario), "--out", str(out)], out=io.StringIO())
    assert code == 0
    assert_valid_metrics(out / "metrics.json")
    metrics = read_metrics(out / "metrics.json")
    assert metrics.job.mode == "ssp" and metrics.job.success
    assert metrics.job.read_staleness_max is not None and metrics.job.read_staleness_max <= 1
    assert all(p.read_staleness_max is not None and p.blocked_seconds is not None
               for p in metrics.pservers)
    assert all(len(t.losses) == 12 for t in metrics.trainers)
    if protocol == "bundled":  # the startup's GETs (3, more if resent), none a step (36)
        assert all(p.messages_by_kind.get("get", 0) < 12 for p in metrics.pservers)


# -- the sweep's time to loss ---------------------------------------------------------------------

def test_time_to_loss_is_when_trainer_0s_windowed_mean_first_reaches_the_target() -> None:
    losses = [4.0, 2.0, 1.0, 0.5, 0.25] + [0.1] * 10
    trainer = TrainerMetrics.from_steps(0, losses, [1.0] * len(losses))
    trainer.step_ends = [2.0 + i for i in range(1, len(losses) + 1)]  # steps from t = 2
    other = TrainerMetrics.from_steps(1, [9.0], [0.5])
    other.step_ends = [1.5]  # its first step began at 1.0: the job's first
    metrics = JobMetrics(JobSummary("sim run", "t", 0, "ssp", 1, 2, 15, 8, []),
                         [trainer, other], [])
    assert time_to_loss(metrics, 1.75) == 7.0 - 1.0  # mean(4, 2, 1, .5, .25) = 1.55: step 4
    assert time_to_loss(metrics, 0.1) == 17.0 - 1.0  # the last 10 all 0.1: the last step
    assert time_to_loss(metrics, 0.05) is None


def test_sim_sweep_tabulates_time_to_loss_and_the_staleness(tmp_path: Path) -> None:
    out = io.StringIO()
    code = sim_main(["sweep", str(SSP), "--set", "train.steps=20", "--vary",
                     "transpiler.staleness=0,inf", "--loss-target", "0.5", "--out",
                     str(tmp_path), "--no-plots"], out=out)
    assert code == 0, out.getvalue()
    header = out.getvalue().split("┡")[0]  # the table's header, wrapped as the width needs
    assert all(name in header for name in ("to loss", "0.5", "staleness", "held"))
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert record["loss_target"] == 0.5
    bounded, free = record["points"]
    assert (bounded["read_staleness_max"], bounded["blocked_seconds"] > 0) == (0, True)
    assert free["read_staleness_max"] > 0 and free["blocked_seconds"] == 0.0
    assert 0 < free["time_to_loss"] < bounded["time_to_loss"]
