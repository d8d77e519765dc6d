"""Kernels write large outputs into the arrays their vars held, only where nobody else can see
it: the numbers are those of a fresh array, and any holder of the old array keeps what it saw."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from gradcheck import run_in_scope

from runtime import Scope
from runtime.execution.kernels.buffers import MIN_BYTES
from transpiler.ir import Op

ROWS = MIN_BYTES // 4 // 8 + 1  # float32 [ROWS, 8]: just over the size reused


def _array(seed: int, rows: int = ROWS) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 8)).astype("float32")


def _concat_scope() -> Scope:
    scope = Scope()
    scope.put("a", _array(1))
    scope.put("b", _array(2))
    return scope


CONCAT = Op("concat", {"X": ["a", "b"]}, {"Out": ["w"]}, {"axis": 0})
SUM = Op("sum", {"X": ["a", "b"]}, {"Out": ["g"]}, {})
SCALE = Op("scale", {"X": ["g"]}, {"Out": ["g"]}, {"scale": 0.5, "bias": 0.0,
                                                 "bias_after_scale": True})


@pytest.mark.parametrize("op", [CONCAT, SUM], ids=["concat", "sum"])
def test_a_second_run_writes_into_the_unshared_array_of_the_first(op: Op) -> None:
    scope = _concat_scope()
    run_in_scope(op, scope)
    out = op.outputs["Out"][0]
    first = weakref.ref(scope.get(out))  # a weak reference leaves the array unshared
    scope.put("a", _array(3))
    run_in_scope(op, scope)
    assert scope.get(out) is first(), "an unshared output array is reused"
    expected = (np.concatenate([_array(3), _array(2)]) if op.type == "concat"
                else _array(3) + _array(2))
    np.testing.assert_array_equal(scope.get(out), expected)


@pytest.mark.parametrize("op", [CONCAT, SUM], ids=["concat", "sum"])
def test_an_output_someone_holds_is_left_as_it_was(op: Op) -> None:
    scope = _concat_scope()
    run_in_scope(op, scope)
    out = op.outputs["Out"][0]
    held = scope.get(out)  # a fetched result, a frame being sent
    seen = held.copy()
    scope.put("a", _array(3))
    run_in_scope(op, scope)
    assert scope.get(out) is not held
    np.testing.assert_array_equal(held, seen)


def test_a_view_of_the_output_keeps_it_from_being_reused() -> None:
    scope = _concat_scope()
    run_in_scope(CONCAT, scope)
    view = scope.get("w")[:4]  # a split by reference, say
    seen = view.copy()
    run_in_scope(CONCAT, scope)
    np.testing.assert_array_equal(view, seen)


def test_a_pservers_scale_of_its_own_sum_runs_in_place_with_the_same_numbers() -> None:
    scope = Scope()
    scope.put("g", _array(4))
    before = weakref.ref(scope.get("g"))
    run_in_scope(SCALE, scope)
    assert scope.get("g") is before()
    np.testing.assert_array_equal(scope.get("g"), _array(4) * np.float32(0.5))


def test_a_shared_or_borrowed_input_is_scaled_into_a_new_array() -> None:
    scope = Scope()
    held = _array(4)
    scope.put("g", held)
    run_in_scope(SCALE, scope)  # `held` is still ours: the scope's array is shared
    assert scope.get("g") is not held
    np.testing.assert_array_equal(held, _array(4))
    borrowed = np.frombuffer(_array(5).tobytes(), "float32").reshape(ROWS, 8)  # read-only
    scope.put("g", borrowed)
    run_in_scope(SCALE, scope)
    np.testing.assert_array_equal(scope.get("g"), _array(5) * np.float32(0.5))


@pytest.mark.parametrize("after", [True, False])
def test_scale_with_a_bias_in_place_equals_the_formula(after: bool) -> None:
    op = Op("scale", {"X": ["g"]}, {"Out": ["g"]},
            {"scale": 3.0, "bias": 0.25, "bias_after_scale": after})
    scope = Scope()
    scope.put("g", _array(6))
    run_in_scope(op, scope)
    x = _array(6)
    expected = x * np.float32(3.0) + np.float32(0.25) if after else \
        (x + np.float32(0.25)) * np.float32(3.0)
    np.testing.assert_array_equal(scope.get("g"), expected)
