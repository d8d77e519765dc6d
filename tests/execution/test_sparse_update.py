"""Sparse optimizer updates touch only the rows of the grad: exact against the dense rule, in
place where nobody else holds the param, a copy where someone does."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest
from gradcheck import run_in_scope

from runtime import Scope, SelectedRows
from runtime.execution.kernels.buffers import MIN_BYTES
from transpiler.ir import Op

ROWS = SelectedRows([5, 1, 5], np.array([[1.0, -2.0], [0.5, 0.5], [0.25, 1.0]], "float32"), 8)
TOUCHED = np.array([1, 5])

STATES = {
    "sgd": {},
    "adagrad": {"Moment": "MomentOut"},
    "momentum": {"Velocity": "VelocityOut"},
    "adam": {"Moment1": "Moment1Out", "Moment2": "Moment2Out"},
    "decayed_adagrad": {"Moment": "MomentOut"},
    "adamax": {"Moment": "MomentOut", "InfNorm": "InfNormOut"},
    "rmsprop": {"MeanSquare": "MeanSquareOut", "Moment": "MomentOut"},
    "ftrl": {"SquaredAccumulator": "SquaredAccumOut", "LinearAccumulator": "LinearAccumOut"},
}
SCALARS = {"adam": {"Beta1Pow": [0.81], "Beta2Pow": [0.998]}, "adamax": {"Beta1Pow": [0.81]}}


def _scope(op_type: str, grad: Any, rows: int = 8) -> Scope:
    rng = np.random.default_rng(1)
    scope = Scope()
    scope.put("p", rng.standard_normal((rows, 2)).astype("float32"))
    scope.put("g", grad)
    scope.put("lr", np.array([0.1], "float32"))
    for slot in STATES[op_type]:
        scope.put(slot, rng.uniform(0.1, 1.0, (rows, 2)).astype("float32"))
    for slot, value in SCALARS.get(op_type, {}).items():
        scope.put(slot, np.array(value, "float32"))
    return scope


def _op(op_type: str, lazy: bool = False) -> Op:
    """The op updating its param and accumulators in place (each output is its input's var)."""
    inputs = {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]}
    inputs |= {slot: [slot] for slot in [*STATES[op_type], *SCALARS.get(op_type, {})]}
    outputs = {"ParamOut": ["p"]} | {out: [slot] for slot, out in STATES[op_type].items()}
    return Op(op_type, inputs, outputs, {"lazy_mode": True} if lazy else {})


def _values(scope: Scope, op_type: str) -> dict[str, np.ndarray]:
    return {n: np.array(scope.get(n)) for n in ["p", *STATES[op_type]]}


@pytest.mark.parametrize("op_type", ["sgd", "adagrad"])
def test_exact_sparse_updates_equal_dense_and_write_in_place(op_type: str) -> None:
    """(sgd subtracts a repeated row's values one by one, so its rows here are distinct.)"""
    grad = ROWS.merged() if op_type == "sgd" else ROWS
    sparse, dense = _scope(op_type, grad), _scope(op_type, grad.to_dense())
    before = weakref.ref(sparse.get("p"))  # a weak reference leaves the array unshared
    run_in_scope(_op(op_type), sparse)
    run_in_scope(_op(op_type), dense)
    assert sparse.get("p") is before(), "an unshared param is updated in place"
    for name, value in _values(dense, op_type).items():
        np.testing.assert_array_equal(_values(sparse, op_type)[name], value, err_msg=name)


@pytest.mark.parametrize("op_type", ["sgd", "adagrad", "adam"])
def test_a_shared_param_is_copied_not_written(op_type: str) -> None:
    scope = _scope(op_type, ROWS)
    held = scope.get("p")  # e.g. a frame still being sent, or a receiver's decoded view
    kept = held.copy()
    run_in_scope(_op(op_type, lazy=True), scope)
    np.testing.assert_array_equal(held, kept)
    assert scope.get("p") is not held
    assert not np.array_equal(scope.get("p")[TOUCHED], kept[TOUCHED])


def test_a_borrowed_param_is_copied_once() -> None:
    """A param decoded from a message views the message's memory: the first update copies."""
    scope = _scope("sgd", ROWS)
    buffer = bytearray(scope.get("p").tobytes())
    scope.put("p", np.frombuffer(buffer, "float32").reshape(8, 2))
    run_in_scope(_op("sgd"), scope)
    assert scope.get("p").flags.owndata
    np.testing.assert_array_equal(np.frombuffer(buffer, "float32").reshape(8, 2),
                                  _scope("sgd", ROWS).get("p"))


@pytest.mark.parametrize("op_type", sorted(set(STATES) - {"sgd"}))
def test_lazy_mode_applies_the_dense_rule_to_the_touched_rows_only(op_type: str) -> None:
    """With `lazy_mode`, the rows the grad touches get exactly what the dense rule gives a
    table of just those rows (with the merged grad); every other row stays as it was."""
    lazy = _scope(op_type, ROWS)
    start = _values(lazy, op_type)
    run_in_scope(_op(op_type, lazy=True), lazy)
    merged = ROWS.merged()
    sub = _scope(op_type, merged.values, rows=2)
    for name, value in start.items():
        sub.put(name, value[merged.rows].copy())
    run_in_scope(_op(op_type), sub)
    untouched = np.setdiff1d(np.arange(8), TOUCHED)
    for name, value in _values(lazy, op_type).items():
        np.testing.assert_array_equal(value[TOUCHED], sub.get(name), err_msg=name)
        np.testing.assert_array_equal(value[untouched], start[name][untouched], err_msg=name)


@pytest.mark.parametrize("op_type", ["momentum", "adam"])
def test_without_lazy_mode_untouched_rows_move_as_in_dense_training(op_type: str) -> None:
    sparse, dense = _scope(op_type, ROWS), _scope(op_type, ROWS.to_dense())
    run_in_scope(_op(op_type), sparse)
    run_in_scope(_op(op_type), dense)
    for name, value in _values(dense, op_type).items():
        np.testing.assert_array_equal(_values(sparse, op_type)[name], value, err_msg=name)


# -- the torch backend: the same rule for writing in place ---------------------------------------
def _run_torch(op: Op, scope: Scope) -> None:
    pytest.importorskip("torch")
    from runtime.execution.executor import device_binder
    from runtime.execution.kernels import KernelContext, get_kernel
    device_binder("torch", "cpu")(get_kernel(op.type, "torch"))(KernelContext(op, scope, "", None))


TORCH_SPARSE = [("sgd", False), ("adagrad", False), ("adam", True)]


@pytest.mark.parametrize("op_type,lazy", TORCH_SPARSE, ids=[o for o, _ in TORCH_SPARSE])
def test_torch_sparse_updates_write_the_scopes_tensors_in_place(op_type: str, lazy: bool) -> None:
    """The first update copies the tables once (their memory is a numpy array's, which others
    may hold); from then on the scope's own tensors are written, whatever the table's size."""
    scope = _scope(op_type, ROWS)
    _run_torch(_op(op_type, lazy), scope)
    names = ["p", *STATES[op_type]]
    before = {n: weakref.ref(scope.raw(n)) for n in names}  # a weak reference leaves it unshared
    pointers = {n: scope.raw(n).data_ptr() for n in names}
    kept = _values(scope, op_type)
    _run_torch(_op(op_type, lazy), scope)
    for name in names:
        assert scope.raw(name) is before[name](), f"{name}: an unshared tensor is updated in place"
        assert scope.raw(name).data_ptr() == pointers[name], name
    after = _values(scope, op_type)
    assert not np.array_equal(after["p"][TOUCHED], kept["p"][TOUCHED])
    untouched = np.setdiff1d(np.arange(8), TOUCHED)
    np.testing.assert_array_equal(after["p"][untouched], kept["p"][untouched])


@pytest.mark.parametrize("op_type,lazy", TORCH_SPARSE, ids=[o for o, _ in TORCH_SPARSE])
def test_torch_a_shared_param_is_copied_not_written(op_type: str, lazy: bool) -> None:
    """A numpy view of the scope's tensor (what `Scope.get` hands the wire) or the tensor itself
    held elsewhere keeps it unwritten."""
    scope = _scope(op_type, ROWS)
    _run_torch(_op(op_type, lazy), scope)
    for holder in (lambda: scope.get("p"), lambda: scope.raw("p")):
        kept = scope.get("p").copy()
        held = holder()
        _run_torch(_op(op_type, lazy), scope)
        np.testing.assert_array_equal(held if isinstance(held, np.ndarray) else held.numpy(), kept)
        assert not np.array_equal(scope.get("p")[TOUCHED], kept[TOUCHED])
        del held


LARGE = MIN_BYTES // 8 + 1
"""Rows of a [LARGE, 2] float32 parameter: just over the size written in place."""


def test_torch_dense_sgd_writes_the_scopes_tensor_in_place_with_the_same_numbers() -> None:
    """The first step's output is a new tensor (the param's memory is a numpy array's); from the
    second on that tensor is written, and every step equals the fused out-of-place update."""
    torch = pytest.importorskip("torch")
    grad = np.random.default_rng(2).standard_normal((LARGE, 2)).astype("float32")
    scope = _scope("sgd", grad, LARGE)
    want = torch.from_numpy(scope.get("p").copy())
    for step in range(3):
        _run_torch(_op("sgd"), scope)
        want = torch.add(want, torch.from_numpy(grad), alpha=-float(np.float32(0.1)))
        np.testing.assert_array_equal(scope.get("p"), want.numpy())
        if step == 0:
            first = weakref.ref(scope.raw("p"))
            pointer = scope.raw("p").data_ptr()
    assert scope.raw("p") is first() and scope.raw("p").data_ptr() == pointer


def test_torch_dense_sgd_leaves_a_held_param_unwritten() -> None:
    """A numpy view of the scope's tensor (a reply being sent) or the tensor itself held
    elsewhere keeps its values: the step goes into a new tensor."""
    pytest.importorskip("torch")
    grad = np.ones((LARGE, 2), "float32")
    scope = _scope("sgd", grad, LARGE)
    _run_torch(_op("sgd"), scope)
    for holder in (lambda: scope.get("p"), lambda: scope.raw("p")):
        kept = scope.get("p").copy()
        held = holder()
        _run_torch(_op("sgd"), scope)
        np.testing.assert_array_equal(held if isinstance(held, np.ndarray) else held.numpy(), kept)
        np.testing.assert_allclose(scope.get("p"), kept - np.float32(0.1), rtol=1e-6)
        del held
