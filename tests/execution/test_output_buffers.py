"""Kernels write large outputs into the arrays their vars held, only where nobody else can see
it: the numbers are those of a fresh array, and any holder of the old array keeps what it saw."""

from __future__ import annotations

import weakref
from typing import Any

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


SGD = Op("sgd", {"Param": ["w"], "Grad": ["g"], "LearningRate": ["lr"]}, {"ParamOut": ["w"]}, {})


def _sgd_scope(lr: np.ndarray) -> Scope:
    scope = Scope()
    scope.put("w", _array(7))
    scope.put("g", _array(8))
    scope.put("lr", lr)
    return scope


def test_sgd_of_an_unshared_parameter_writes_it_in_place_with_the_same_numbers() -> None:
    scope = _sgd_scope(np.array([0.05], "float32"))
    before = weakref.ref(scope.get("w"))
    run_in_scope(SGD, scope)
    assert scope.get("w") is before()
    np.testing.assert_array_equal(scope.get("w"), _array(7) - np.float32(0.05) * _array(8))


def test_sgd_leaves_a_held_parameter_as_it_was_and_computes_in_the_promoted_dtype() -> None:
    scope = _sgd_scope(np.array([0.05], "float32"))
    held = scope.get("w")  # a frame being sent
    run_in_scope(SGD, scope)
    assert scope.get("w") is not held
    np.testing.assert_array_equal(held, _array(7))
    del held
    scope = _sgd_scope(np.array([0.05], "float64"))  # float64 math, rounded once at the end
    before = weakref.ref(scope.get("w"))
    run_in_scope(SGD, scope)
    assert scope.get("w") is not before()
    np.testing.assert_array_equal(
        scope.get("w"), (_array(7) - np.float64(0.05) * _array(8)).astype("float32"))


# -- the torch kernels (runtime/execution/kernels/torch_buffers.py) ------------------------------
def _run_torch(op: Op, scope: Scope) -> None:
    pytest.importorskip("torch")
    from runtime.execution.executor import device_binder
    from runtime.execution.kernels import KernelContext, get_kernel
    device_binder("torch", "cpu")(get_kernel(op.type, "torch"))(KernelContext(op, scope, "", None))


def _numpy(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else value.numpy()


def _expected(op: Op, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.concatenate([a, b]) if op.type == "concat" else a + b


@pytest.mark.parametrize("op", [CONCAT, SUM], ids=["concat", "sum"])
def test_torch_a_second_run_writes_into_the_tensor_of_the_first(op: Op) -> None:
    """The first run's output is a tensor torch allocated: the next run computes into it."""
    scope = _concat_scope()
    _run_torch(op, scope)
    out = op.outputs["Out"][0]
    first, pointer = weakref.ref(scope.raw(out)), scope.raw(out).data_ptr()
    scope.put("a", _array(3))
    _run_torch(op, scope)
    assert scope.raw(out) is first() and scope.raw(out).data_ptr() == pointer
    np.testing.assert_array_equal(scope.get(out), _expected(op, _array(3), _array(2)))


@pytest.mark.parametrize("op", [CONCAT, SUM], ids=["concat", "sum"])
def test_torch_an_output_someone_holds_or_views_is_left_as_it_was(op: Op) -> None:
    """Held as the scope's tensor, as the numpy view `Scope.get` hands the wire, or through a
    view of part of it (a split by reference)."""
    out = op.outputs["Out"][0]
    for hold in (lambda s: s.raw(out), lambda s: s.get(out), lambda s: s.raw(out)[:4]):
        scope = _concat_scope()
        _run_torch(op, scope)
        held = hold(scope)
        seen = _numpy(held).copy()
        scope.put("a", _array(3))
        _run_torch(op, scope)
        np.testing.assert_array_equal(_numpy(held), seen)
        np.testing.assert_array_equal(scope.get(out), _expected(op, _array(3), _array(2)))
        del held


def test_torch_a_pservers_scale_of_its_own_sum_runs_in_place_with_the_same_numbers() -> None:
    """The sum's tensor is torch's own: the scale writes it; a numpy-made value (fed, decoded
    from a message) is scaled into a new tensor and left as it was."""
    torch = pytest.importorskip("torch")
    scope = _concat_scope()
    _run_torch(Op("sum", {"X": ["a", "b"]}, {"Out": ["g"]}, {}), scope)
    before = weakref.ref(scope.raw("g"))
    _run_torch(SCALE, scope)
    assert scope.raw("g") is before()
    want = (torch.from_numpy(_array(1)) + torch.from_numpy(_array(2))) * 0.5
    np.testing.assert_array_equal(scope.get("g"), want.numpy())
    borrowed = _array(4)
    scope.put("g", borrowed)
    _run_torch(SCALE, scope)
    np.testing.assert_array_equal(borrowed, _array(4))
    np.testing.assert_array_equal(scope.get("g"), _array(4) * np.float32(0.5))


@pytest.mark.parametrize("after", [True, False])
def test_torch_scale_with_a_bias_in_place_equals_the_formula(after: bool) -> None:
    torch = pytest.importorskip("torch")
    op = Op("scale", {"X": ["g"]}, {"Out": ["g"]},
            {"scale": 3.0, "bias": 0.25, "bias_after_scale": after})
    scope = _concat_scope()
    _run_torch(Op("sum", {"X": ["a", "b"]}, {"Out": ["g"]}, {}), scope)
    x = torch.from_numpy(_array(1)) + torch.from_numpy(_array(2))
    before = weakref.ref(scope.raw("g"))
    _run_torch(op, scope)
    assert scope.raw("g") is before()
    expected = x * 3.0 + 0.25 if after else (x + 0.25) * 3.0
    np.testing.assert_array_equal(scope.get("g"), expected.numpy())
