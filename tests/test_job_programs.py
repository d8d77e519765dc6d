"""A job transpiles as little as it can: shared trainer programs where only the id differs,
one transpile for every pserver, and the same programs as transpiling role by role."""

from __future__ import annotations

from pathlib import Path

from transpiler.distribute.from_spec import transpile_from_spec

from runtime.config.scenario import load_scenario
from runtime.services.job import Job

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


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
