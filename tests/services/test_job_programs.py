"""A job transpiles as little as it can: shared trainer programs where only the id differs (and,
for trainers in one process, where only the names of their copies differ too), one transpile for
every pserver, and the same programs as transpiling role by role."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from transpiler.distribute.from_spec import transpile_from_spec
from transpiler.ir import Program

from runtime.config.scenario import load_scenario
from runtime.services import job as job_module
from runtime.services.job import Job, renamed_copies
from sim.simulate import SimResult, simulate

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def _job(name: str, *overrides: str) -> Job:
    return Job.from_scenario(load_scenario(SCENARIOS / name, list(overrides)))


def test_async_non_chief_trainers_share_programs() -> None:
    job = _job("scale.yaml", "cluster.trainers=5", "cluster.pservers=3")
    programs = [job.trainer_programs(i) for i in range(5)]
    assert all(p is programs[1] for p in programs[1:])
    assert programs[0] is not programs[1]
    assert programs[0][0].attrs["_is_chief"] is True
    assert programs[1][0].attrs["_is_chief"] is False


def test_sync_trainers_whose_names_carry_the_id_do_not_share() -> None:
    job = _job("scale.yaml", "cluster.trainers=4", "cluster.pservers=2", "transpiler.mode=sync")
    programs = [job.trainer_programs(i) for i in range(4)]
    assert len({id(p) for p in programs}) == 4
    for i, (main, _) in enumerate(programs):
        assert main.attrs["_trainer_id"] == i
        assert any(name.endswith(f".trainer_{i}") for name in main.global_block().vars)


def test_programs_equal_those_transpiled_role_by_role() -> None:
    job = _job("scale.yaml", "cluster.trainers=4", "cluster.pservers=3")
    for index in range(3):
        t = transpile_from_spec(job.model.main, job.model.startup, job.args, 0)
        expected = t.get_pserver_programs(job.endpoints[index])
        got = job.pserver_programs(index)
        assert [str(p) for p in got] == [str(p) for p in expected]
    for trainer in (0, 1):
        t = transpile_from_spec(job.model.main, job.model.startup, job.args, trainer)
        expected = (t.get_trainer_program(), t.get_trainer_startup_program())
        assert [str(p) for p in job.trainer_programs(trainer)] == [str(p) for p in expected]


def _renamed(program: Program, renames: dict[str, str], trainer: int) -> dict[str, Any]:
    """`program` as plain data, its strings renamed and its trainer ids made `trainer`."""
    def plain(value: Any, key: str = "") -> Any:
        if key in ("trainer_id", "_trainer_id"):
            return trainer
        if isinstance(value, str):
            return renames.get(value, value)
        if isinstance(value, dict):
            return {k: plain(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value
    return plain(program.to_dict())


def test_sync_trainers_in_one_process_run_trainer_1s_programs_renamed() -> None:
    job = _job("scale.yaml", "cluster.trainers=5", "cluster.pservers=3", "transpiler.mode=sync")
    runs = [job.programs_to_run(i) for i in range(5)]
    assert runs[0].renames == {} and runs[1].renames == {}
    assert runs[0].main is not runs[1].main
    for t in (2, 3, 4):
        assert runs[t].main is runs[1].main and runs[t].startup is runs[1].startup
        assert runs[t].renames and all(old.endswith(".trainer_1") and new.endswith(f".trainer_{t}")
                                       for old, new in runs[t].renames.items())
        own = transpile_from_spec(job.model.main, job.model.startup, job.args, t)
        expected = (own.get_trainer_program(), own.get_trainer_startup_program())
        for shared, mine in zip((runs[t].main, runs[t].startup), expected):
            assert _renamed(shared, dict(runs[t].renames), t) == _renamed(mine, {}, t)


def test_async_trainers_in_one_process_share_without_renames() -> None:
    job = _job("scale.yaml", "cluster.trainers=4", "cluster.pservers=2")
    runs = [job.programs_to_run(i) for i in range(4)]
    assert all(r.main is runs[1].main and r.renames == {} for r in runs[1:])


def _one_and_two() -> tuple[tuple[Program, Program], tuple[Program, Program]]:
    job = _job("scale.yaml", "cluster.trainers=3", "cluster.pservers=2", "transpiler.mode=sync")
    one, two = job.trainer_programs(1), job.trainer_programs(2)
    return (one[0].clone(), one[1].clone()), (two[0].clone(), two[1].clone())


def test_copies_are_not_renamed_where_a_name_would_leave_other_than_by_a_send() -> None:
    one, two = _one_and_two()
    assert renamed_copies(one, two)
    copy = next(n for n in one[0].global_block().vars if n.endswith(".trainer_1"))
    recv = next(op for op in one[0].global_block().ops if op.type == "recv")
    recv.attrs["recv_varnames"] = [copy]
    assert renamed_copies(one, two) is None
    one, two = _one_and_two()
    one[0].attrs["_distributed_lookup_table"] = copy
    assert renamed_copies(one, two) is None


def test_copies_are_not_renamed_where_trainer_2_differs_otherwise() -> None:
    one, two = _one_and_two()
    split = next(op for op in two[0].global_block().ops if op.type == "split_byref")
    split.attrs["sections"] = list(reversed(split.attrs["sections"])) + [0]
    assert renamed_copies(one, two) is None
    one, two = _one_and_two()  # a name of trainer 1's mark in both is no copy of its own
    for programs in (one, two):
        programs[0].global_block().create_var("x.trainer_1", shape=(1,))
    assert renamed_copies(one, two) is None


def _outcome(result: SimResult) -> tuple[Any, ...]:
    return (result.simulated_seconds, [(t.losses, t.step_times, t.step_ends) for t in result.trainers],
            {k: (v.messages, v.bytes) for k, v in result.links.items()},
            [(s.steps, s.errors) for s in result.pservers])


@pytest.mark.timeout(120)
def test_a_sync_run_on_shared_programs_equals_one_on_each_trainers_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = load_scenario(SCENARIOS / "quickstart.yaml",
                             ["cluster.trainers=4", "train.steps=6"])
    assert Job.from_scenario(scenario).programs_to_run(3).renames
    shared = simulate(scenario)
    monkeypatch.setattr(job_module, "renamed_copies", lambda one, two: None)
    assert not Job.from_scenario(scenario).programs_to_run(3).renames
    own = simulate(scenario)
    assert _outcome(shared) == _outcome(own)
    assert shared.params.keys() == own.params.keys()
    for name, value in own.params.items():
        assert np.array_equal(shared.params[name], value), name
