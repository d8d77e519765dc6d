"""The `cnn` model (conv, batch_norm, relu, pool, fc) trained by a sync job over loopback ZeroMQ
equals local training; batch_norm's running statistics stay on the trainers."""

from __future__ import annotations

import numpy as np
import pytest

import transpiler as T
from runtime.services.cluster import train_locally
from transpiler.models import build_model

from cluster_helpers import FAST_DRAIN, assert_params_equal, make_job, run


@pytest.mark.timeout(60)
def test_cnn_2x2_sync_equals_local() -> None:
    """Without batch_norm every op is per example, so two trainers' mean gradient on their
    halves is local training's on the whole batch."""
    job = make_job("{name: cnn, batch_norm: false}", 2, 2, steps=10, batch=8,
                   retry_after=FAST_DRAIN)
    result = run(job)
    _, local = train_locally(job)
    assert_params_equal(result.params, local)
    assert all(len(r.losses) == 10 for r in result.trainers)


@pytest.mark.timeout(60)
def test_cnn_with_batch_norm_1x2_sync_equals_local() -> None:
    """batch_norm normalizes by its batch, so one trainer (the whole batch) equals local
    training; with several, each normalizes by its own half (as in Paddle)."""
    job = make_job("{name: cnn}", 1, 2, steps=10, batch=16, retry_after=FAST_DRAIN)
    result = run(job)
    losses, local = train_locally(job)
    assert_params_equal(result.params, local)
    np.testing.assert_allclose(result.trainers[0].losses, losses, rtol=1e-5)


@pytest.mark.timeout(60)
def test_cnn_with_batch_norm_2x2_trains_and_keeps_running_stats_on_the_trainers() -> None:
    job = make_job("{name: cnn}", 2, 2, steps=10, batch=8, retry_after=FAST_DRAIN)
    result = run(job)
    assert all(len(r.losses) == 10 and r.losses[-1] < r.losses[0] for r in result.trainers)
    model = build_model("cnn")
    t = T.DistributeTranspiler()
    t.transpile(0, program=model.main, pservers="127.0.0.1:1,127.0.0.1:2", trainers=2,
                startup_program=model.startup, in_place=False)
    sent = {n for op in t.get_trainer_program().global_block().ops if op.type == "send"
            for n in op.input_arg_names}
    assert all("@GRAD" in n for n in sent)
    assert {n.split("@GRAD")[0] for n in sent} == set(model.params)  # no running stats
    assert not any(".mean" in p or ".var" in p for p in model.params)
    main = t.get_trainer_program().global_block()
    bn = [op for op in main.ops if op.type == "batch_norm"]
    assert [op.output("MeanOut") for op in bn] == [["cnn.bn0.mean"], ["cnn.bn1.mean"]]
