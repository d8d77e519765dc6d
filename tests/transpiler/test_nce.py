"""`nce` (Paddle's noise-contrastive estimation): the kernels against a direct loop over Paddle's
formula and finite differences, the samplers, the layer, a word2vec with nce training locally,
and remote prefetch of its weight: a distributed job (simulated) equals local training."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from gradcheck import check_grad, run_op

from runtime import SelectedRows
from runtime.execution.executor import Executor
from runtime.execution.scope import Scope
from runtime.services.cluster import train_locally
from transpiler import layers
from transpiler.distribute.analysis import read_optimize_section
from transpiler.distribute.lookup_table import find_distributed_table, remote_sparse_params
from transpiler.framework import program_guard
from transpiler.ir import Program
from transpiler.optimizer import SGD

from cluster_helpers import FAST_DRAIN, make_job, simulate

OUTS = ("Cost", "SampleLogits", "SampleLabels")
LABELS = np.array([[3, 0], [1, 6], [6, 6], [2, 5]], np.int64)


def inputs(rng: np.random.Generator, classes: int = 7, bias: bool = True) -> dict[str, Any]:
    values = {"Input": rng.normal(size=(4, 3)), "Label": LABELS,
              "Weight": rng.normal(size=(classes, 3)), "SampleWeight": rng.uniform(0.5, 2, (4, 1))}
    if bias:
        values["Bias"] = rng.normal(size=(classes, 1))
    return values


def attrs(sampler: int = 0, **extra: Any) -> dict[str, Any]:
    return {"num_total_classes": 7, "num_neg_samples": 3, "sampler": sampler, "seed": 5, **extra}


def q(sampler: int, c: int, classes: int = 7) -> float:
    return 1 / classes if sampler == 0 else math.log((c + 2) / (c + 1)) / math.log(classes)


def reference_cost(values: dict[str, Any], labels: np.ndarray, sampler: int) -> np.ndarray:
    """Paddle's NCEKernel loop, written out."""
    x, w, sw = values["Input"], values["Weight"], values["SampleWeight"].reshape(-1)
    cost = np.zeros((x.shape[0], 1))
    for i in range(x.shape[0]):
        for j, c in enumerate(labels[i]):
            o = 1 / (1 + math.exp(-(x[i] @ w[c] + values.get("Bias", np.zeros((7, 1)))[c, 0])))
            b = q(sampler, c) * 3
            cost[i, 0] += sw[i] * (-math.log(o / (o + b)) if j < 2 else -math.log(b / (o + b)))
    return cost


@pytest.mark.parametrize("sampler", [0, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_paddles_formula(sampler: int, bias: bool) -> None:
    values = inputs(np.random.default_rng(0), bias=bias)
    out = run_op("nce", values, OUTS, attrs(sampler))
    labels = out["SampleLabels"]
    assert labels.shape == (4, 5) and labels.dtype == np.int64
    np.testing.assert_array_equal(labels[:, :2], LABELS)
    negatives = labels[:, 2:]
    assert negatives.min() >= 0 and negatives.max() < (7 if sampler == 0 else 6)  # Paddle's % range
    np.testing.assert_allclose(out["Cost"], reference_cost(values, labels, sampler), rtol=1e-12)
    logit = np.einsum("nd,nsd->ns", values["Input"], values["Weight"][labels])
    if bias:
        logit += values["Bias"][labels, 0]
    np.testing.assert_allclose(out["SampleLogits"], 1 / (1 + np.exp(-logit)), rtol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("sampler", [0, 1])
def test_gradients_match_finite_differences(sampler: int, sparse: bool) -> None:
    """The samples are fixed by ``custom_neg_classes`` (Paddle's attribute for its tests)."""
    check_grad("nce", inputs(np.random.default_rng(1)), ("Input", "Weight", "Bias"),
               attrs(sampler, custom_neg_classes=[4, 0, 6], is_sparse=sparse), outputs=OUTS,
               loss_outputs=("Cost",), rtol=1e-6, atol=1e-8)


def test_sparse_weight_grad_holds_each_sample_label_once() -> None:
    values = inputs(np.random.default_rng(2))
    fwd = run_op("nce", values, OUTS, attrs(is_sparse=True))
    grad = run_op("nce_grad", {**values, **fwd, "Cost@GRAD": np.ones((4, 1))},
                  ("Weight@GRAD",), attrs(is_sparse=True))["Weight@GRAD"]
    assert isinstance(grad, SelectedRows) and grad.height == 7
    np.testing.assert_array_equal(grad.rows, np.unique(fwd["SampleLabels"]))


def test_prefetched_rows_read_as_the_whole_weight() -> None:
    """A trainer with remote_prefetch holds only the sampled rows, as a SelectedRows."""
    values = inputs(np.random.default_rng(3))
    whole = run_op("nce", values, OUTS, attrs(is_sparse=True))
    rows = np.unique(whole["SampleLabels"])
    part = {**values, "Weight": SelectedRows(rows, values["Weight"][rows], 7)}
    np.testing.assert_array_equal(run_op("nce", part, OUTS, attrs(is_sparse=True))["Cost"],
                                  whole["Cost"])
    grads = ("Input@GRAD", "Weight@GRAD", "Bias@GRAD")
    g = {**whole, "Cost@GRAD": np.ones((4, 1))}
    a = run_op("nce_grad", {**values, **g}, grads, attrs(is_sparse=True))
    b = run_op("nce_grad", {**part, **g}, grads, attrs(is_sparse=True))
    np.testing.assert_array_equal(a["Input@GRAD"], b["Input@GRAD"])
    np.testing.assert_array_equal(a["Weight@GRAD"].values, b["Weight@GRAD"].values)
    missing = {**values, "Weight": SelectedRows(rows[1:], values["Weight"][rows[1:]], 7)}
    with pytest.raises(ValueError, match="prefetched rows lack classes"):
        run_op("nce", missing, OUTS, attrs(is_sparse=True))


# -- the draws ------------------------------------------------------------------------------------

def draws(label: np.ndarray, step: int, **extra: Any) -> np.ndarray:
    values = {"Input": np.zeros((label.shape[0], 2)), "Label": label, "Weight": np.zeros((50, 2)),
              "Step": np.array([step])}
    a = {"num_total_classes": 50, "num_neg_samples": 4, "seed": 7, **extra}
    return run_op("nce", values, OUTS, a)["SampleLabels"][:, label.shape[1]:]


def test_draws_depend_on_seed_step_and_row_not_on_the_rows_place() -> None:
    labels = np.arange(12, dtype=np.int64).reshape(-1, 1)
    first = draws(labels, 0)
    np.testing.assert_array_equal(first, draws(labels, 0))
    np.testing.assert_array_equal(first[6:], draws(labels[6:], 0))  # half a batch: same rows
    np.testing.assert_array_equal(first[::-1], draws(labels[::-1], 0))
    assert (first != draws(labels, 1)).any()
    assert (first != draws(labels, 0, seed=8)).any()


@pytest.mark.parametrize("sampler", [0, 1, 2])
def test_samplers_draw_their_distribution(sampler: int) -> None:
    classes = 50
    probs = np.arange(1, classes + 1) / np.arange(1, classes + 1).sum()
    extra: dict[str, Any] = {"sampler": sampler}
    # rows with the same labels share their draws: 2500 distinct label pairs
    pairs = np.arange(classes * classes, dtype=np.int64)
    labels = np.stack([pairs % classes, pairs // classes], axis=1)
    values: dict[str, Any] = {"Input": np.zeros((pairs.size, 2)), "Label": labels,
                              "Weight": np.zeros((classes, 2))}
    if sampler == 2:
        alias, accept = layers._alias_table(list(probs))
        values.update(CustomDistProbs=probs.astype(np.float32),
                      CustomDistAlias=np.array(alias, np.int32),
                      CustomDistAliasProbs=np.array(accept, np.float32))
        want = probs
    elif sampler == 1:
        want = np.array([q(1, c, classes) for c in range(classes)])
        want[0] += want[-1]  # Paddle's % range folds the last class onto 0
        want[-1] = 0
    else:
        want = np.full(classes, 1 / classes)
    a = {"num_total_classes": classes, "num_neg_samples": 25, "seed": 3, **extra}
    got = run_op("nce", values, OUTS, a)["SampleLabels"][:, 2:]
    freq = np.bincount(got.reshape(-1), minlength=classes) / got.size
    np.testing.assert_allclose(freq, want, atol=0.006)


def test_layer_emits_paddles_ops_and_refuses_bad_arguments() -> None:
    main, start = Program(), Program()
    with program_guard(main, start):
        x = layers.data("x", shape=[4])
        y = layers.data("y", shape=[1], dtype="int64")
        loss = layers.mean(layers.nce(x, y, 20, num_neg_samples=3, is_sparse=True))
        SGD(0.1).minimize(loss)
        with pytest.raises(ValueError, match="remote_prefetch needs is_sparse"):
            layers.nce(x, y, 20, remote_prefetch=True)
        with pytest.raises(ValueError, match="custom_dist must give"):
            layers.nce(x, y, 20, sampler="custom_dist", custom_dist=[0.5, 0.5])
    block = main.global_block()
    types = [op.type for op in block.ops]
    assert types[0] == "increment" and types[1:4] == ["nce", "scale", "mean"]
    assert "nce_grad" in types
    assert block.ops[2].attr("scale") == 0.25  # Cost / (num_neg_samples + 1), as Paddle's
    assert block.var("nce_0.w_0@GRAD").type.name == "SELECTED_ROWS"
    assert block.var("nce_0.w_0").shape == (20, 4) and block.var("nce_0.b_0").shape == (20, 1)


# -- training -------------------------------------------------------------------------------------

W2V = ("{{name: word2vec, vocab: {vocab}, embed_dim: 8, neg_num: 4, nce: true, is_sparse: true, "
       "remote_prefetch: {remote}, optimizer: {{type: sgd, learning_rate: {lr}}}}}")


@pytest.mark.timeout(120)
def test_word2vec_with_nce_trains_locally() -> None:
    """Loss over the last 20 of 200 steps is below 0.8 of the first 20's (measured 0.70)."""
    job = make_job(W2V.format(vocab=200, remote="false", lr=3.0), 1, 1, steps=200, batch=64)
    losses, _ = train_locally(job)
    assert np.mean(losses[-20:]) < 0.8 * np.mean(losses[:20])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("trainers", [1, 2])
def test_remote_prefetch_job_equals_local_training(trainers: int) -> None:
    """The nce weight (2048 x 8) is cut in two blocks on 2 pservers; the trainer never receives
    it, and prefetches the rows of its true and sampled classes before each nce."""
    job = make_job(W2V.format(vocab=2048, remote="true", lr=0.5), trainers, 2, steps=10, batch=16,
                   retry_after=FAST_DRAIN)
    main = job.trainer_programs(0)[0].global_block()
    (nce,) = [op for op in main.ops if op.type == "nce"]
    assert nce.attr("table_names") == ["w2v.nce.w.block0", "w2v.nce.w.block1"]
    assert nce.attr("height_sections") == [1024, 1024] and len(nce.attr("epmap")) == 2
    assert not any(op.type == "recv" and "w2v.nce.w.block0" in op.output("Out")
                   for op in main.ops)
    params = simulate(job)
    _, local = train_locally(job)
    assert params.keys() == local.keys()
    for name, value in local.items():
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    start = Scope()
    Executor().run(job.model.startup, scope=start)
    assert (params["w2v.nce.w"] != start.get("w2v.nce.w")).any(axis=1).sum() > 50


def test_transpiler_refuses_nce_on_the_distributed_table_and_dense_remote_prefetch() -> None:
    main, start = Program(), Program()
    with program_guard(main, start):
        ids = layers.data("ids", shape=[1], dtype="int64")
        emb = layers.embedding(ids, [30, 4], is_sparse=True, is_distributed=True,
                               param_attr="table")
        loss = layers.mean(layers.nce(emb, ids, 30, param_attr="table", is_sparse=True))
        SGD(0.1).minimize(loss)
    with pytest.raises(ValueError, match="nce reads the distributed lookup table 'table'"):
        find_distributed_table(main)
    main, start = Program(), Program()
    with program_guard(main, start):
        x = layers.data("x", shape=[4])
        y = layers.data("y", shape=[1], dtype="int64")
        loss = layers.mean(layers.nce(x, y, 30, param_attr="w", is_sparse=True))
        SGD(0.1).minimize(loss)
    (op,) = [op for op in main.global_block().ops if op.type == "nce"]
    op.attrs.update(remote_prefetch=True, is_sparse=False)
    with pytest.raises(ValueError, match="nce of 'w' has remote_prefetch, which needs is_sparse"):
        remote_sparse_params(main, read_optimize_section(main))
