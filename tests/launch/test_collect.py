"""`runtime collect`: the nodes of a job run one per "host" (each its own process and output
directory, as across machines) make one metrics.json, valid against the run record's schema,
with the scenario's expectations checked; a node without a record fails the run by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime.config.metrics import read_metrics

from metrics_schema import assert_valid_metrics
from runtime_runs import collect, run_roles, scenario_file


pytestmark = pytest.mark.xdist_group("collect")
"""The module on one worker (pyproject.toml's ``--dist loadgroup``): its module-scoped run
below runs once, not once on each worker."""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The output directories of a 2 x 2 job whose four nodes each ran on their own, the way a
    host runs its node: ``runtime up --role R --index N --endpoints ... --out DIR``."""
    tmp = tmp_path_factory.mktemp("hosts")
    scenario = scenario_file(tmp)
    return run_roles(scenario, tmp, 90)[0]


@pytest.mark.timeout(180)
def test_the_nodes_of_several_hosts_make_one_checked_run_record(hosts: list[Path],
                                                                tmp_path: Path) -> None:
    code, lines = collect(*map(str, hosts), "-o", str(tmp_path))
    assert code == 0, lines
    assert lines[-1] == "OK: up-test"
    path = tmp_path / "metrics.json"
    assert_valid_metrics(path)
    metrics = read_metrics(path)
    assert metrics.job.success and metrics.job.command == "runtime up"
    assert [t.index for t in metrics.trainers] == [0, 1]
    assert [len(t.losses) for t in metrics.trainers] == [20, 20]
    assert [p.steps for p in metrics.pservers] == [20, 20]
    assert [(e.name, e.passed) for e in metrics.expectations] == [
        ("params_equal_to", True), ("no_lost_updates", True)]
    assert metrics.job.wall_seconds is None and metrics.notes[0].startswith(
        "collected by runtime collect from ")


@pytest.mark.timeout(180)
def test_a_node_that_wrote_no_record_fails_the_run_by_name(hosts: list[Path],
                                                           tmp_path: Path) -> None:
    copies = [tmp_path / d.name for d in hosts]
    for d, copy in zip(hosts, copies):
        shutil.copytree(d, copy)
    (copies[3] / "nodes" / "trainer-1.json").unlink()
    code, lines = collect(*map(str, copies), "-o", str(tmp_path / "merged"))
    assert code == 1
    assert lines[-1] == (f"FAILED: trainer:1 wrote no record (nodes/trainer-1.json) in any of "
                         f"{', '.join(map(str, copies))}: failed, or never ran")
    metrics = read_metrics(tmp_path / "merged" / "metrics.json")
    assert metrics.job.failed_node == "trainer:1" and metrics.expectations == []


def test_directories_of_different_jobs_are_refused(hosts: list[Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(hosts[0], other)
    described = other / "nodes" / "pserver-0.job.json"
    document = json.loads(described.read_text())
    document["scenario"]["seed"] += 1
    described.write_text(json.dumps(document))
    code, lines = collect(str(hosts[1]), str(other))
    assert code == 1
    assert lines == [f"FAILED: {described} and {hosts[1] / 'nodes' / 'pserver-1.job.json'} "
                     "describe different jobs (their scenario differ)"]
    code, lines = collect(str(tmp_path / "missing"))
    assert (code, lines) == (1, [f"FAILED: {tmp_path / 'missing'}: not a directory"])
