"""Every shipped scenario is replayed with its `expect` block: each node a task in one loop,
over loopback ZeroMQ (tests/test_runtime_up.py replays scenarios as real processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime import expect
from runtime.cluster import run_job, train_locally
from runtime.job import Job
from runtime.metrics import PserverMetrics
from runtime.scenario import load_scenario
from runtime.zmq_transport import ZmqTransport

from cluster_helpers import free_endpoints

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.yaml"))


def test_scenarios_are_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"quickstart", "async", "half_async", "geo", "dc_asgd", "ctr_dnn_distributed"} <= names


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_meets_its_expectations(path: Path) -> None:
    scenario = load_scenario(path)
    job = Job.from_scenario(scenario, free_endpoints(scenario.cluster.pservers))
    result = asyncio.run(run_job(job, ZmqTransport))
    pservers = [PserverMetrics.from_stats(j, ep, s)
                for j, (ep, s) in enumerate(zip(job.endpoints, result.pservers))]
    results = expect.check(scenario, result.trainers[0].losses, result.params, pservers,
                           lambda: train_locally(job)[1])
    assert results, f"{path.name} states no expectation"
    failed = [r.detail for r in results if not r.passed]
    assert not failed, failed
