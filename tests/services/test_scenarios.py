"""Every shipped scenario in numeric mode is replayed with its `expect` block: each node a task in
one loop, over loopback ZeroMQ (tests/launch/test_runtime_up.py replays scenarios as real
processes). Timing-mode scenarios (phantom kernels) compute nothing and run in the simulator only
(tests/sim/test_timing_mode.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from runtime.config import expect
from runtime.config.metrics import PserverMetrics
from runtime.config.scenario import load_scenario
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import run_job, train_locally
from runtime.services.job import Job

from cluster_helpers import FAST_DRAIN, free_endpoints, make_job

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml"))
NUMERIC = [p for p in SCENARIOS if load_scenario(p).backend.kernels != "phantom"]


def test_scenarios_are_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"quickstart", "async", "half_async", "geo", "dc_asgd", "ctr_dnn_distributed",
            "scale", "allreduce"} <= names


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", NUMERIC, ids=[p.stem for p in NUMERIC])
def test_shipped_scenario_meets_its_expectations(path: Path) -> None:
    scenario = load_scenario(path)  # as shipped: what a user runs
    # the pservers' endpoints; the trainers' in the nccl2 and collective modes (no pservers)
    cluster = scenario.cluster
    job = Job.from_scenario(scenario, free_endpoints(cluster.pservers or cluster.trainers))
    result = asyncio.run(run_job(job, ZmqTransport))
    pservers = [PserverMetrics.from_stats(j, ep, s)
                for j, (ep, s) in enumerate(zip(job.endpoints, result.pservers))]
    results = expect.check(scenario, result.trainers[0].losses, result.params, pservers,
                           lambda: train_locally(job)[1])
    assert results, f"{path.name} states no expectation"
    failed = [r.detail for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.timeout(120)
def test_a_job_trains_identically_with_numpy_and_torch_kernels() -> None:
    pytest.importorskip("torch")
    model = "{name: mlp, sizes: [64, 32, 10], optimizer: {type: adam, learning_rate: 0.01}}"
    runs = {}
    for kernels in ("numpy", "torch"):
        job = make_job(model, trainers=2, pservers=2, extra=f"backend: {{kernels: {kernels}}}",
                       retry_after=FAST_DRAIN)
        runs[kernels] = asyncio.run(run_job(job, ZmqTransport))
    for name, value in runs["numpy"].params.items():
        # numpy's and torch's matrix products differ by about an ulp per op
        np.testing.assert_allclose(runs["torch"].params[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose(runs["torch"].trainers[0].losses, runs["numpy"].trainers[0].losses,
                               rtol=1e-5, atol=1e-6)  # a loss near 0 differs by ulps of its terms
