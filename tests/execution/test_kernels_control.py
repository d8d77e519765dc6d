"""Numpy kernels for initializers, counters, comparisons and logic; the kernel registry; the
tensor value types; and a check that the gradient checker itself catches a wrong gradient."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gradcheck import check_grad, run_in_scope, run_op

from runtime import LoDTensor, Scope, SelectedRows
from runtime.execution.kernels import KernelNotFound, get_kernel, register, registry
from runtime.execution.tensor import TensorError, lod_of, to_dense
from transpiler.ir import Op, Program


def test_fill_constant_dtype_and_value() -> None:
    out = run_op("fill_constant", {}, attrs={"shape": [2, 3], "dtype": "int64", "value": -1.0})["Out"]
    assert out.dtype == np.int64 and out.tolist() == [[-1] * 3] * 2
    out = run_op("fill_constant", {}, attrs={"shape": [1], "dtype": "float32", "value": 0.1})["Out"]
    assert out.dtype == np.float32 and out[0] == np.float32(0.1)
    with pytest.raises(ValueError, match="fully known"):
        run_op("fill_constant", {}, attrs={"shape": [-1, 3], "dtype": "float32", "value": 0.0})


def test_assign_value_writes_its_values_and_a_slice_keeps_its_rows() -> None:
    values = [float(v) for v in range(12)]
    out = run_op("assign_value", {}, attrs={"shape": [4, 3], "dtype": "float32",
                                            "fp32_values": values})["Out"]
    assert out.dtype == np.float32 and out.tolist() == np.arange(12.0).reshape(4, 3).tolist()
    ids = run_op("assign_value", {}, attrs={"shape": [2], "dtype": "int64",
                                            "int64_values": [7, -1]})["Out"]
    assert ids.dtype == np.int64 and ids.tolist() == [7, -1]
    block = {"shape": [3, 3], "dtype": "float32", "fp32_values": values, "origin_name": "w",
             "origin_shape": [4, 3], "row_offset": 2}  # the last block, run past the end
    rows = run_op("assign_value", {}, attrs=block)["Out"]
    assert rows.tolist() == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0], [0.0, 0.0, 0.0]]


def test_increment_keeps_dtype() -> None:
    out = run_op("increment", {"X": np.array([-1], np.int64)}, attrs={"step": 1.0})["Out"]
    assert out.dtype == np.int64 and out.tolist() == [0]
    out = run_op("increment", {"X": np.array([0.5], np.float32)}, attrs={"step": 2.0})["Out"]
    assert out.dtype == np.float32 and out.tolist() == [2.5]


def test_less_than_and_logical_ops() -> None:
    x = np.array([[1.0, 5.0], [3.0, 0.0]])
    less = run_op("less_than", {"X": x, "Y": np.array([2.0])})["Out"]
    assert less.tolist() == [[True, False], [False, True]]
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    assert run_op("logical_and", {"X": a, "Y": b})["Out"].tolist() == [True, False, False, False]
    assert run_op("logical_or", {"X": a, "Y": b})["Out"].tolist() == [True, True, True, False]
    assert run_op("logical_xor", {"X": a, "Y": b})["Out"].tolist() == [False, True, True, False]
    assert run_op("logical_not", {"X": a})["Out"].tolist() == [False, False, True, True]


def random_op(op_type: str, name: str, seed: int = 0, program_seed: int = 0, **attrs: float) -> np.ndarray:
    program = Program()
    program.random_seed = program_seed
    scope = Scope()
    full = {"shape": [200, 50], "dtype": "float32", "seed": seed, **attrs}
    run_in_scope(Op(op_type, {}, {"Out": [name]}, full), scope, program)
    return scope.get(name)


@pytest.mark.parametrize("op_type", ["uniform_random", "gaussian_random", "truncated_gaussian_random"])
def test_random_init_is_deterministic_per_var_name(op_type: str) -> None:
    first = random_op(op_type, "w")
    assert first.dtype == np.float32 and first.shape == (200, 50)
    np.testing.assert_array_equal(first, random_op(op_type, "w"))
    assert not np.array_equal(random_op(op_type, "v"), first)
    assert not np.array_equal(random_op(op_type, "w", program_seed=1), first)
    assert not np.array_equal(random_op(op_type, "w", seed=5), first)
    np.testing.assert_array_equal(random_op(op_type, "w", seed=5), random_op(op_type, "w", seed=5))


def test_random_seed_comes_from_program_seed_and_output_name() -> None:
    program = Program()
    program.random_seed = 9
    attrs = {"shape": [4], "dtype": "float64", "min": 0.0, "max": 1.0, "seed": 0}
    a = run_op("uniform_random", {}, ["Out"], attrs, program=program)["Out"]
    expected = np.random.default_rng(zlib.crc32(b"9:Out0")).uniform(0.0, 1.0, (4,))
    np.testing.assert_array_equal(a, expected)  # run_op names the output var "Out0"


def test_random_distributions() -> None:
    u = random_op("uniform_random", "u", min=-0.5, max=2.0).astype(np.float64)
    assert u.min() >= -0.5 and u.max() < 2.0 and abs(u.mean() - 0.75) < 0.03
    g = random_op("gaussian_random", "g", mean=1.0, std=3.0).astype(np.float64)
    assert abs(g.mean() - 1.0) < 0.15 and abs(g.std() - 3.0) < 0.1
    t = random_op("truncated_gaussian_random", "t", mean=1.0, std=3.0).astype(np.float64)
    assert t.min() >= 1.0 - 6.0 and t.max() <= 1.0 + 6.0
    assert abs(t.std() - 3.0 * 0.8796) < 0.1  # std of a normal truncated at 2 sigma


def test_get_kernel_unknown_op_names_it() -> None:
    with pytest.raises(KernelNotFound, match="'no_such_op'") as info:
        get_kernel("no_such_op")
    assert info.value.op_type == "no_such_op" and info.value.backend == "numpy"
    with pytest.raises(ValueError, match="unknown kernel backend 'tpu'"):
        get_kernel("mul", backend="tpu")


def test_register_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("mul")(lambda ctx: None)


def test_gradcheck_catches_a_wrong_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(ctx):  # type: ignore[no-untyped-def]
        ctx.set_output("X@GRAD", ctx.input("Out@GRAD") * 1.01)
    monkeypatch.setitem(registry._kernels, ("numpy", "assign_grad"), wrong)
    with pytest.raises(AssertionError, match="gradient of X"):
        check_grad("assign", {"X": np.ones((2, 2))}, ["X"])


# -- tensor values ------------------------------------------------------------------------------
def test_lod_tensor_validates_offsets() -> None:
    t = LoDTensor(np.zeros((5, 2)), [[0, 2, 2, 5]])
    assert t.sequence_lengths() == [2, 0, 3] and lod_of(t) == [[0, 2, 2, 5]]
    assert LoDTensor(np.zeros((3, 1)), [[0, 1, 2], [0, 2, 3]]).lod == [[0, 1, 2], [0, 2, 3]]
    for bad, what in [([[1, 5]], "start at 0"), ([[0, 3, 2, 5]], "non-decreasing"),
                      ([[0, 2, 4]], "end at 5"), ([[0, 1], [0, 2, 5]], "end at 2")]:
        with pytest.raises(TensorError, match=what):
            LoDTensor(np.zeros((5, 2)), bad)


def test_selected_rows_dense_and_merged() -> None:
    rows = SelectedRows([4, 1, 4], np.array([[1.0], [2.0], [3.0]]), 6)
    assert rows.shape == (6, 1)
    assert to_dense(rows).ravel().tolist() == [0, 2, 0, 0, 4, 0]
    merged = rows.merged()
    assert merged.rows.tolist() == [1, 4] and merged.values.ravel().tolist() == [2.0, 4.0]
    with pytest.raises(TensorError, match="rows must lie in"):
        SelectedRows([6], np.ones((1, 1)), 6)
    with pytest.raises(TensorError, match="2 rows but values"):
        SelectedRows([0, 1], np.ones((3, 1)), 6)
