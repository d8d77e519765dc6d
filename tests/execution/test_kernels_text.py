"""Kernels of fluid's text-model ops on both backends: sequence_conv over ragged LoD batches
(its window against a loop over each sequence), softsign, cos_sim (Y of X's rows or one row)
and auc (the ROC area of binned predictions against counting the pairs, sliding and global);
forward values, and gradients against central finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import BACKENDS, check_grad, run_op

from runtime import LoDTensor

RNG = np.random.default_rng(11)
LOD = [[0, 3, 4, 4, 7]]  # sequences of 3, 1, 0 and 3 rows


# -- sequence_conv ------------------------------------------------------------------------------
def windows_by_loop(x: np.ndarray, lod: list[int], length: int, start: int) -> np.ndarray:
    """Each row's window, one sequence at a time, zeros past its ends."""
    cols = np.zeros((x.shape[0], length * x.shape[1]))
    for s, e in zip(lod, lod[1:]):
        for t in range(s, e):
            for j in range(length):
                src = t + start + j
                if s <= src < e:
                    cols[t, j * x.shape[1]:(j + 1) * x.shape[1]] = x[src]
    return cols


def conv_attrs(length: int, start: int) -> dict[str, int]:
    return {"contextLength": length, "contextStart": start, "contextStride": 1}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("length,start", [(3, -1), (1, 0), (2, 0), (3, 1), (4, -3)])
def test_sequence_conv_reads_each_rows_window_within_its_sequence(backend: str, length: int,
                                                                  start: int) -> None:
    x, w = RNG.standard_normal((7, 2)), RNG.standard_normal((length * 2, 3))
    out = run_op("sequence_conv", {"X": LoDTensor(x, LOD), "Filter": w},
                 attrs=conv_attrs(length, start), backend=backend)["Out"]
    cols = windows_by_loop(x, LOD[0], length, start)
    # within 1e-12 of the products' magnitudes (a dot product's rounding), not of the result:
    # relative to an element whose products cancel, the backends' summation orders differ
    scale = np.abs(cols) @ np.abs(w)
    err = np.abs(out - cols @ w)
    assert np.all(err <= 1e-12 * scale), np.max(err / np.maximum(scale, 1e-300))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_conv_gradient_on_ragged_batch(backend: str) -> None:
    x = LoDTensor(RNG.standard_normal((7, 2)), LOD)
    check_grad("sequence_conv", {"X": x, "Filter": RNG.standard_normal((6, 3))}, ["X", "Filter"],
               conv_attrs(3, -1), backend=backend)


def test_sequence_conv_refuses_what_it_cannot_do() -> None:
    x = LoDTensor(np.ones((3, 2)), [[0, 3]])
    with pytest.raises(ValueError, match="Filter has 4 rows"):
        run_op("sequence_conv", {"X": x, "Filter": np.ones((4, 1))}, attrs=conv_attrs(3, -1))
    with pytest.raises(ValueError, match="paddingTrainable"):
        run_op("sequence_conv", {"X": x, "Filter": np.ones((6, 1))},
               attrs={**conv_attrs(3, -1), "paddingTrainable": True})
    with pytest.raises(ValueError, match="no LoD"):
        run_op("sequence_conv", {"X": np.ones((3, 2)), "Filter": np.ones((6, 1))},
               attrs=conv_attrs(3, -1))


# -- softsign -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_softsign_values_and_gradient(backend: str) -> None:
    x = np.array([[-3.0, -0.5, 0.25, 2.0]])
    out = run_op("softsign", {"X": x}, backend=backend)["Out"]
    np.testing.assert_allclose(out, [[-0.75, -1 / 3, 0.2, 2 / 3]])
    check_grad("softsign", {"X": RNG.standard_normal((3, 4))}, ["X"], backend=backend)


# -- cos_sim ------------------------------------------------------------------------------------
COS_OUTPUTS = ["Out", "XNorm", "YNorm"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("y_rows", [4, 1])
def test_cos_sim_values(backend: str, y_rows: int) -> None:
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((y_rows, 3))
    out = run_op("cos_sim", {"X": x, "Y": y}, COS_OUTPUTS, backend=backend)
    yb = np.broadcast_to(y, x.shape)
    want = (x * yb).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(yb, axis=1)
    np.testing.assert_allclose(out["Out"], want[:, None])
    np.testing.assert_allclose(out["YNorm"], np.linalg.norm(y, axis=1)[:, None])
    assert out["XNorm"].shape == (4, 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("y_rows", [4, 1])
def test_cos_sim_gradient(backend: str, y_rows: int) -> None:
    check_grad("cos_sim", {"X": RNG.standard_normal((4, 3)), "Y": RNG.standard_normal((y_rows, 3))},
               ["X", "Y"], outputs=COS_OUTPUTS, backend=backend)


def test_cos_sim_refuses_y_of_other_rows() -> None:
    with pytest.raises(ValueError, match="rows or one"):
        run_op("cos_sim", {"X": np.ones((4, 3)), "Y": np.ones((2, 3))}, COS_OUTPUTS)


# -- auc ----------------------------------------------------------------------------------------
AUC_OUTPUTS = ["AUC", "StatPosOut", "StatNegOut"]


def pairs_auc(p: np.ndarray, label: np.ndarray, thresholds: int) -> float:
    """The ROC area of binned scores counted pair by pair: a positive above a negative 1, a
    tie 1/2."""
    bins = np.floor(p * thresholds)
    pos, neg = bins[label != 0], bins[label == 0]
    wins = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    return float(wins.mean())


def run_auc(predict: np.ndarray, label: np.ndarray, stats: tuple[np.ndarray, np.ndarray],
            thresholds: int, steps: int, backend: str = "numpy") -> dict[str, np.ndarray]:
    return run_op("auc", {"Predict": predict, "Label": label, "StatPos": stats[0],
                          "StatNeg": stats[1]}, AUC_OUTPUTS,
                  {"num_thresholds": thresholds, "slide_steps": steps}, backend=backend)


def batch(n: int) -> tuple[np.ndarray, np.ndarray]:
    p1 = RNG.uniform(0, 1, n).astype(np.float32)
    return np.stack([1 - p1, p1], axis=1), RNG.integers(0, 2, (n, 1)).astype(np.int64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_auc_accumulates_every_batch_or_slides_over_the_last_ones(backend: str) -> None:
    thresholds, batches = 50, [batch(12) for _ in range(3)]
    whole = tuple(np.zeros((1, thresholds + 1), np.int64) for _ in range(2))
    sliding = tuple(np.zeros(3 * (thresholds + 1) + 1, np.int64) for _ in range(2))
    for step, (predict, label) in enumerate(batches):
        out = run_auc(predict, label, whole, thresholds, 0, backend)
        whole = (out["StatPosOut"], out["StatNegOut"])
        seen = batches[:step + 1]
        assert out["AUC"].dtype == np.float64 and whole[0].shape == (1, thresholds + 1)
        assert out["AUC"][0] == pytest.approx(pairs_auc(
            np.concatenate([b[0][:, 1] for b in seen]),
            np.concatenate([b[1][:, 0] for b in seen]), thresholds))
        out = run_auc(predict, label, sliding, thresholds, 2, backend)
        sliding = (out["StatPosOut"], out["StatNegOut"])
        last = batches[max(step - 1, 0):step + 1]
        assert out["AUC"][0] == pytest.approx(pairs_auc(
            np.concatenate([b[0][:, 1] for b in last]),
            np.concatenate([b[1][:, 0] for b in last]), thresholds))
        assert sliding[0][-1] == sliding[1][-1] == step + 1  # fluid's step counter
    assert whole[0].sum() + whole[1].sum() == 36


def test_auc_takes_the_last_column_and_is_zero_without_both_classes() -> None:
    p = np.array([[0.9], [0.2], [0.6]], np.float32)
    stats = tuple(np.zeros((1, 11), np.int64) for _ in range(2))
    out = run_auc(p, np.array([[1], [0], [1]]), stats, 10, 0)
    assert out["AUC"][0] == 1.0
    assert out["StatPosOut"].ravel()[[6, 9]].tolist() == [1, 1]
    assert run_auc(p, np.ones((3, 1), np.int64), stats, 10, 0)["AUC"][0] == 0.0


def test_auc_skips_a_single_negative_label_and_refuses_what_fluid_refuses() -> None:
    stats = tuple(np.zeros(2 * 11 + 1, np.int64) for _ in range(2))
    out = run_auc(np.array([[0.5, 0.5]], np.float32), np.array([[-1]]), stats, 10, 1)
    assert out["StatPosOut"].sum() == out["StatNegOut"].sum() == 0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        run_auc(np.array([[1.5]]), np.array([[1]]), stats, 10, 1)
    with pytest.raises(ValueError, match="must hold 11 counts, got 23"):
        run_auc(np.array([[0.5]]), np.array([[1]]), stats, 10, 0)
