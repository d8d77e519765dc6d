"""Numpy kernels: mul, softmax, cross-entropy losses, lookup_table (dense and sparse gradient)
and sequence_pool over ragged LoD batches; forward values and finite-difference gradients
(softmax_with_cross_entropy on torch too)."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import BACKENDS, check_grad, run_in_scope, run_op

from runtime import LoDTensor, Scope, SelectedRows
from runtime.execution.tensor import lod_of
from transpiler.ir import Op

RNG = np.random.default_rng(7)


# -- mul ----------------------------------------------------------------------------------------
def test_mul_flattens_at_num_col_dims() -> None:
    x, y = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((4, 5))
    out = run_op("mul", {"X": x, "Y": y}, attrs={"x_num_col_dims": 2, "y_num_col_dims": 1})["Out"]
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(out, np.einsum("abk,kn->abn", x, y))
    out = run_op("mul", {"X": x, "Y": y.reshape(2, 2, 5)},
                 attrs={"x_num_col_dims": 2, "y_num_col_dims": 2})["Out"]
    np.testing.assert_allclose(out, np.einsum("abk,kn->abn", x, y))
    out = run_op("mul", {"X": x, "Y": RNG.standard_normal((12, 2))}, attrs={"x_num_col_dims": 1})["Out"]
    assert out.shape == (2, 2)


@pytest.mark.parametrize("xs,ys,xd,yd", [
    ((3, 4), (4, 2), 1, 1),
    ((2, 3, 4), (4, 5), 2, 1),
    ((2, 3, 4), (12, 2), 1, 1),
    ((2, 3, 4), (2, 2, 3), 2, 2),
])
def test_mul_gradient(xs: tuple[int, ...], ys: tuple[int, ...], xd: int, yd: int) -> None:
    check_grad("mul", {"X": RNG.standard_normal(xs), "Y": RNG.standard_normal(ys)}, ["X", "Y"],
               {"x_num_col_dims": xd, "y_num_col_dims": yd})


def test_mul_keeps_lod_of_x() -> None:
    scope = Scope()
    scope.set("x", LoDTensor(np.ones((3, 2)), [[0, 1, 3]]))
    scope.set("w", np.ones((2, 4)))
    run_in_scope(Op("mul", {"X": ["x"], "Y": ["w"]}, {"Out": ["o"]}), scope)
    assert lod_of(scope.get_tensor("o")) == [[0, 1, 3]]


# -- softmax and losses -------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax(axis: int) -> None:
    x = RNG.standard_normal((3, 4))
    out = run_op("softmax", {"X": x}, attrs={"axis": axis})["Out"]
    np.testing.assert_allclose(out, np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True))
    check_grad("softmax", {"X": x}, ["X"], {"axis": axis})


def probs(n: int, c: int) -> np.ndarray:
    e = np.exp(RNG.standard_normal((n, c)))
    return e / e.sum(axis=1, keepdims=True)


def test_cross_entropy_hard_label_with_ignore_index() -> None:
    p = np.array([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]])
    label = np.array([[1], [7], [0]], np.int64)
    y = run_op("cross_entropy", {"X": p, "Label": label}, ["Y"], {"ignore_index": 7})["Y"]
    np.testing.assert_allclose(y, [[-np.log(0.8)], [0.0], [-np.log(0.9)]])
    check_grad("cross_entropy", {"X": probs(4, 3), "Label": np.array([[2], [0], [-100], [1]])},
               ["X"], outputs=["Y"])


def test_cross_entropy2_picks_the_label_probability_and_skips_ignored_rows() -> None:
    p = np.array([[0.2, 0.8], [0.5, 0.5], [0.9, 0.1]])
    label = np.array([[1], [7], [0]], np.int64)
    out = run_op("cross_entropy2", {"X": p, "Label": label}, ["Y", "MatchX"], {"ignore_index": 7})
    np.testing.assert_allclose(out["MatchX"], [[0.8], [0.0], [0.9]])
    np.testing.assert_allclose(out["Y"], [[-np.log(0.8)], [0.0], [-np.log(0.9)]])
    # the same loss as cross_entropy's, its gradient by central differences
    check_grad("cross_entropy2", {"X": probs(4, 3), "Label": np.array([[2], [0], [-100], [1]])},
               ["X"], outputs=["Y", "MatchX"], loss_outputs=["Y"])


def test_cross_entropy_soft_label() -> None:
    label = probs(3, 4)
    p = probs(3, 4)
    y = run_op("cross_entropy", {"X": p, "Label": label}, ["Y"], {"soft_label": True})["Y"]
    np.testing.assert_allclose(y[:, 0], -(label * np.log(p)).sum(axis=1))
    check_grad("cross_entropy", {"X": p, "Label": label}, ["X"], {"soft_label": True}, outputs=["Y"])


def test_softmax_with_cross_entropy_is_stable_and_correct() -> None:
    logits = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]])
    label = np.array([[1], [2]], np.int64)
    out = run_op("softmax_with_cross_entropy", {"Logits": logits, "Label": label}, ["Softmax", "Loss"])
    lse = np.log(np.exp([1.0, 2.0, 3.0]).sum())
    np.testing.assert_allclose(out["Loss"], [[1000.0], [lse - 3.0]])
    np.testing.assert_allclose(out["Softmax"][1], np.exp([1.0, 2.0, 3.0] - lse))
    assert np.isfinite(out["Softmax"]).all()


@pytest.mark.parametrize("soft", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_with_cross_entropy_gradient(soft: bool, backend: str) -> None:
    logits = RNG.standard_normal((4, 5))
    label = probs(4, 5) if soft else np.array([[0], [4], [-100], [2]], np.int64)
    check_grad("softmax_with_cross_entropy", {"Logits": logits, "Label": label}, ["Logits"],
               {"soft_label": soft}, outputs=["Softmax", "Loss"], loss_outputs=["Loss"],
               backend=backend)


# -- lookup_table -------------------------------------------------------------------------------
def test_lookup_table_forward_padding_and_shapes() -> None:
    w = np.arange(12.0).reshape(4, 3)
    ids = np.array([[2], [0], [2], [3]], np.int64)
    out = run_op("lookup_table", {"W": w, "Ids": ids}, attrs={"padding_idx": 0})["Out"]
    assert out.tolist() == [[6, 7, 8], [0, 0, 0], [6, 7, 8], [9, 10, 11]]
    assert run_op("lookup_table", {"W": w, "Ids": np.array([1, 3])})["Out"].shape == (2, 3)
    assert run_op("lookup_table", {"W": w, "Ids": np.array([[1]])})["Out"].shape == (1, 3)
    with pytest.raises(IndexError, match="outside"):
        run_op("lookup_table", {"W": w, "Ids": np.array([[4]])})


def test_lookup_table_output_keeps_ids_lod() -> None:
    scope = Scope()
    scope.set("w", np.ones((5, 2)))
    scope.set("ids", LoDTensor(np.array([[1], [2], [3]]), [[0, 2, 3]]))
    run_in_scope(Op("lookup_table", {"W": ["w"], "Ids": ["ids"]}, {"Out": ["emb"]}), scope)
    assert lod_of(scope.get_tensor("emb")) == [[0, 2, 3]]


@pytest.mark.parametrize("sparse", [False, True])
def test_lookup_table_gradient_with_repeats_and_padding(sparse: bool) -> None:
    ids = np.array([[1], [3], [1], [0], [3], [1]], np.int64)
    check_grad("lookup_table", {"W": RNG.standard_normal((5, 3)), "Ids": ids}, ["W"],
               {"is_sparse": sparse, "padding_idx": 0})


def test_lookup_table_sparse_gradient_is_selected_rows_of_ids() -> None:
    ids = np.array([[1], [3], [1], [0]], np.int64)
    g = np.arange(8.0).reshape(4, 2)
    w = np.zeros((5, 2))
    grad = run_op("lookup_table_grad", {"W": w, "Ids": ids, "Out": g, "Out@GRAD": g}, ["W@GRAD"],
                  {"is_sparse": True, "padding_idx": 0})["W@GRAD"]
    assert isinstance(grad, SelectedRows) and grad.height == 5
    assert grad.rows.tolist() == [1, 3, 1]
    assert grad.values.tolist() == [[0, 1], [2, 3], [4, 5]]
    dense = run_op("lookup_table_grad", {"W": w, "Ids": ids, "Out": g, "Out@GRAD": g}, ["W@GRAD"],
                   {"is_sparse": False, "padding_idx": 0})["W@GRAD"]
    np.testing.assert_array_equal(dense, grad.to_dense())
    assert dense.tolist() == [[0, 0], [4, 6], [0, 0], [2, 3], [0, 0]]


# -- sequence_pool ------------------------------------------------------------------------------
LOD = [[0, 1, 4, 4, 6]]  # sequences of 1, 3, 0 and 2 rows
X = np.array([[1.0, -1.0], [2.0, 5.0], [4.0, -3.0], [0.0, 4.0], [3.0, 1.0], [-2.0, 2.0]])


@pytest.mark.parametrize("pooltype,expected", [
    ("SUM", [[1, -1], [6, 6], [0, 0], [1, 3]]),
    ("AVERAGE", [[1, -1], [2, 2], [0, 0], [0.5, 1.5]]),
    ("SQRT", [[1, -1], [6 / 3 ** 0.5, 6 / 3 ** 0.5], [0, 0], [1 / 2 ** 0.5, 3 / 2 ** 0.5]]),
    ("MAX", [[1, -1], [4, 5], [0, 0], [3, 2]]),
    ("FIRST", [[1, -1], [2, 5], [0, 0], [3, 1]]),
    ("LAST", [[1, -1], [0, 4], [0, 0], [-2, 2]]),
])
def test_sequence_pool_values_on_ragged_batch(pooltype: str, expected: list[list[float]]) -> None:
    out = run_op("sequence_pool", {"X": LoDTensor(X, LOD)}, ["Out", "MaxIndex"], {"pooltype": pooltype})
    np.testing.assert_allclose(out["Out"], expected)
    if pooltype == "MAX":
        assert out["MaxIndex"].dtype == np.int32
        assert out["MaxIndex"].tolist() == [[0, 0], [2, 1], [-1, -1], [4, 5]]


@pytest.mark.parametrize("pooltype", ["AVERAGE", "SUM", "MAX", "SQRT", "FIRST", "LAST"])
def test_sequence_pool_gradient_on_ragged_batch(pooltype: str) -> None:
    x = LoDTensor(RNG.standard_normal((6, 3)), LOD)
    check_grad("sequence_pool", {"X": x}, ["X"], {"pooltype": pooltype}, outputs=["Out", "MaxIndex"])


def test_sequence_pool_uses_last_lod_level_and_passes_outer_levels_on() -> None:
    scope = Scope()
    scope.set("x", LoDTensor(np.arange(5.0).reshape(5, 1), [[0, 2, 3], [0, 1, 3, 5]]))
    run_in_scope(Op("sequence_pool", {"X": ["x"]}, {"Out": ["o"], "MaxIndex": ["i"]},
                    {"pooltype": "SUM"}), scope)
    assert scope.get("o").ravel().tolist() == [0.0, 3.0, 7.0]
    assert lod_of(scope.get_tensor("o")) == [[0, 2, 3]]


def test_sequence_pool_needs_lod() -> None:
    with pytest.raises(ValueError, match="no LoD"):
        run_op("sequence_pool", {"X": X}, ["Out", "MaxIndex"], {"pooltype": "SUM"})
