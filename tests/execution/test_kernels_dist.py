"""Kernels of the ops the distribute transpiler puts around RPC ops on trainers and pservers."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.execution.tensor import SelectedRows

from gradcheck import run_op


def test_split_byref_cuts_rows_into_sections() -> None:
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    out = run_op("split_byref", {"X": x}, {"Out": 2}, {"sections": [4, 2]})["Out"]
    np.testing.assert_array_equal(out[0], x[:4])
    np.testing.assert_array_equal(out[1], x[4:])
    with pytest.raises(ValueError, match=r"sections \[4, 1\] add up to 5, not 6 rows"):
        run_op("split_byref", {"X": x}, {"Out": 2}, {"sections": [4, 1]})


def test_split_selected_rows_rebases_rows_to_each_block() -> None:
    grad = SelectedRows(np.array([5, 0, 3, 5]), np.arange(8, dtype=np.float32).reshape(4, 2), 6)
    low, high = run_op("split_selected_rows", {"X": grad}, {"Out": 2},
                       {"height_sections": [3, 3]})["Out"]
    assert (low.height, high.height) == (3, 3)
    np.testing.assert_array_equal(low.rows, [0])
    np.testing.assert_array_equal(high.rows, [2, 0, 2])  # global 5, 3, 5
    np.testing.assert_array_equal(high.values, grad.values[[0, 2, 3]])


def test_ref_by_trainer_id_picks_that_trainers_backup() -> None:
    baks = [np.full(3, i, np.float32) for i in range(3)]
    out = run_op("ref_by_trainer_id", {"X": baks, "TrainerId": np.array([2], np.int64)})["Out"]
    np.testing.assert_array_equal(out, baks[2])
    with pytest.raises(ValueError, match="TrainerId 3 is outside the 3 backups"):
        run_op("ref_by_trainer_id", {"X": baks, "TrainerId": np.array([3], np.int64)})


def test_sparse_delta_holds_only_the_rows_that_moved_scaled() -> None:
    old = np.arange(12, dtype=np.float32).reshape(4, 3)
    new = old.copy()
    new[[3, 1]] += np.float32(2.0)
    new[2, 0] -= np.float32(4.0)
    out = run_op("sparse_delta", {"X": new, "Y": old}, ("Out",), {"scale": 0.5})["Out"]
    assert isinstance(out, SelectedRows) and out.height == 4
    np.testing.assert_array_equal(out.rows, [1, 2, 3])
    np.testing.assert_array_equal(out.values, [[1, 1, 1], [-2, 0, 0], [1, 1, 1]])
    assert out.values.dtype == np.float32
    nothing = run_op("sparse_delta", {"X": old, "Y": old}, ("Out",), {"scale": 0.5})["Out"]
    assert nothing.rows.size == 0 and nothing.values.shape == (0, 3)
