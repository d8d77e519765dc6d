"""Sync mode equals local training: same parameters after 20 steps on the same global batches,
every node a task in one loop talking over ZeroMQ (local sockets in a directory of the job's)."""

from __future__ import annotations

import pytest
import zmq

from runtime.services.cluster import train_locally

from cluster_helpers import FAST_DRAIN, assert_params_equal, make_job, run

MLP = "{{name: mlp, sizes: [256, 64, 10], optimizer: {opt}{lr}}}"
OPTIMIZERS = {
    "sgd": "{type: sgd, learning_rate: 0.1}",
    "momentum": "{type: momentum, learning_rate: 0.05}",
    "adam": "{type: adam, learning_rate: 0.01}",
}
GRID = [(t, p) for t in (1, 2, 4) for p in (1, 2, 3)]
EXP_DECAY = ", lr: {type: exponential_decay, decay_steps: 5, decay_rate: 0.5, staircase: true}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trainers,pservers", GRID)
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_mlp_sync_equals_local(opt: str, trainers: int, pservers: int) -> None:
    lr = EXP_DECAY if opt == "adam" else ""
    job = make_job(MLP.format(opt=OPTIMIZERS[opt], lr=lr), trainers, pservers,
                   retry_after=FAST_DRAIN)
    result = run(job)
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)
    assert all(len(r.losses) == 20 for r in result.trainers)
    assert all(s.steps == 20 and s.errors == 0 for s in result.pservers)


@pytest.mark.timeout(60)
def test_the_job_shares_no_port_with_the_other_jobs_on_the_host() -> None:
    """A loopback port that `free_endpoints` reported free can be another job's (another test,
    the other xdist worker, a node left running) by the time the pserver binds it, and a
    client of that job may be reconnecting to it under the same node name: over TCP such a
    client took over ``trainer:1``'s routing id at the pserver (no keys: ROUTER_HANDOVER), the
    real trainer 1 was no longer heard, was dropped after the heartbeat timeout, and the sync
    job diverged from local training or stalled. The tests' jobs run on sockets in a directory
    of their own (`cluster_helpers.run`): another job holding every endpoint's port, and a
    client of its connecting there as ``trainer:1``, change nothing."""
    job = make_job(MLP.format(opt=OPTIMIZERS["adam"], lr=EXP_DECAY), 2, 2,
                   retry_after=FAST_DRAIN, heartbeat_timeout="2s")
    context = zmq.Context()
    others = []
    try:
        for endpoint in job.endpoints:
            server = context.socket(zmq.ROUTER)
            server.setsockopt(zmq.LINGER, 0)
            server.bind(f"tcp://{endpoint}")
            client = context.socket(zmq.DEALER)
            client.setsockopt(zmq.ROUTING_ID, b"trainer:1")
            client.setsockopt(zmq.LINGER, 0)
            client.connect(f"tcp://{endpoint}")
            others += [server, client]
        result = run(job)
    finally:
        for sock in others:
            sock.close()
        context.term()
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)
    assert all(s.dropped == [] and s.steps == 20 and s.errors == 0 for s in result.pservers)
    assert all(len(r.losses) == 20 for r in result.trainers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trainers,pservers", GRID)
def test_ctr_dnn_sparse_local_table_sync_equals_local(trainers: int, pservers: int) -> None:
    model = "{name: ctr_dnn, vocab: 20000, embed_dim: 8, hidden: [16], optimizer: {type: adam, learning_rate: 0.01}}"
    job = make_job(model, trainers, pservers, batch=8, retry_after=FAST_DRAIN)
    result = run(job)
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)
