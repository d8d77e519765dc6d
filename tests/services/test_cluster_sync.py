"""Sync mode equals local training: same parameters after 20 steps on the same global batches,
every node a task in one loop talking over loopback ZeroMQ."""

from __future__ import annotations

import pytest

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
@pytest.mark.parametrize("trainers,pservers", GRID)
def test_ctr_dnn_sparse_local_table_sync_equals_local(trainers: int, pservers: int) -> None:
    model = "{name: ctr_dnn, vocab: 20000, embed_dim: 8, hidden: [16], optimizer: {type: adam, learning_rate: 0.01}}"
    job = make_job(model, trainers, pservers, batch=8, retry_after=FAST_DRAIN)
    result = run(job)
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)
