"""Kernels of the image, normalization, product and shaping ops: forward values against direct
(loop or reference) computations, every gradient against central finite differences on tiny
float64 shapes, and the errors that name a bad attribute. Each check runs on both backends, numpy
and torch (skipped without torch): torch's gradients are checked against torch's own forward
kernel, not against numpy's."""

from __future__ import annotations

import numpy as np
import pytest
from gradcheck import BACKENDS, check_grad, run_op

RNG = np.random.default_rng(7)


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def distinct(*shape: int) -> np.ndarray:
    """Values far apart (no ties within a pooling window under a 1e-6 nudge)."""
    return RNG.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 0.1


# -- conv2d -------------------------------------------------------------------------------------
def conv_reference(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pad: tuple[int, int],
                   dil: tuple[int, int], groups: int) -> np.ndarray:
    """The textbook loop, for comparison."""
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, f, oh, ow))
    fg = f // groups
    for b in range(n):
        for o in range(f):
            g = o // fg
            for i in range(oh):
                for j in range(ow):
                    patch = xp[b, g * cg:(g + 1) * cg,
                               i * stride[0]: i * stride[0] + dil[0] * (kh - 1) + 1: dil[0],
                               j * stride[1]: j * stride[1] + dil[1] * (kw - 1) + 1: dil[1]]
                    out[b, o, i, j] = np.sum(patch * w[o])
    return out


CONVS = [  # (input, filter, strides, paddings, dilations, groups)
    ((2, 2, 5, 5), (3, 2, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ((1, 4, 6, 5), (4, 2, 2, 3), (2, 1), (1, 2), (1, 1), 2),
    ((1, 2, 7, 7), (2, 1, 2, 2), (2, 2), (1, 1), (2, 2), 2),
]


@pytest.mark.parametrize("xs,ws,stride,pad,dil,groups", CONVS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_conv2d_equals_the_loop_and_its_gradients_check(xs, ws, stride, pad, dil, groups,
                                                        backend: str) -> None:
    x, w = normal(*xs), normal(*ws)
    attrs = {"strides": list(stride), "paddings": list(pad), "dilations": list(dil),
             "groups": groups}
    out = run_op("conv2d", {"Input": x, "Filter": w}, ("Output",), attrs, backend=backend)["Output"]
    np.testing.assert_allclose(out, conv_reference(x, w, stride, pad, dil, groups), rtol=1e-12,
                               atol=1e-12)
    check_grad("conv2d", {"Input": x, "Filter": w}, ["Input", "Filter"], attrs, ("Output",),
               backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv2d_asymmetric_paddings_and_errors(backend: str) -> None:
    x, w = normal(1, 1, 4, 4), normal(1, 1, 2, 2)
    out = run_op("conv2d", {"Input": x, "Filter": w}, ("Output",),
                 {"paddings": [0, 1, 1, 0]}, backend=backend)["Output"]
    padded = np.pad(x, ((0, 0), (0, 0), (0, 1), (1, 0)))
    np.testing.assert_allclose(out, conv_reference(padded, w, (1, 1), (0, 0), (1, 1), 1))
    check_grad("conv2d", {"Input": x, "Filter": w}, ["Input", "Filter"],
               {"paddings": [0, 1, 1, 0], "strides": [2, 1]}, ("Output",), backend=backend)
    with pytest.raises(ValueError, match="Input has 1 channels, Filter .* groups 2"):
        run_op("conv2d", {"Input": x, "Filter": w}, ("Output",), {"groups": 2},
               backend=backend)
    with pytest.raises(ValueError, match="data_format 'NHWC' is not supported"):
        run_op("conv2d", {"Input": x, "Filter": w}, ("Output",), {"data_format": "NHWC"},
               backend=backend)


# -- pool2d -------------------------------------------------------------------------------------
def test_pool2d_max_and_avg_values() -> None:
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    out = run_op("pool2d", {"X": x}, attrs={"pooling_type": "max", "ksize": [2, 2],
                                            "strides": [2, 2]})["Out"]
    np.testing.assert_array_equal(out, [[[[5, 7], [13, 15]]]])
    avg = run_op("pool2d", {"X": x}, attrs={"pooling_type": "avg", "ksize": [3, 3],
                                            "strides": [2, 2], "paddings": [1, 1]})["Out"]
    # exclusive (the default): the corner window averages its 4 real elements
    assert avg[0, 0, 0, 0] == np.mean([0, 1, 4, 5])
    inclusive = run_op("pool2d", {"X": x}, attrs={"pooling_type": "avg", "ksize": [3, 3],
                                                  "strides": [2, 2], "paddings": [1, 1],
                                                  "exclusive": False})["Out"]
    assert inclusive[0, 0, 0, 0] == np.sum([0, 1, 4, 5]) / 9
    glob = run_op("pool2d", {"X": x}, attrs={"pooling_type": "avg", "ksize": [1, 1],
                                             "global_pooling": True})["Out"]
    np.testing.assert_array_equal(glob, [[[[7.5]]]])


POOLS = [
    {"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2]},
    {"pooling_type": "max", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1]},
    {"pooling_type": "avg", "ksize": [3, 2], "strides": [1, 2], "paddings": [1, 0]},
    {"pooling_type": "avg", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1],
     "exclusive": False},
    {"pooling_type": "max", "ksize": [1, 1], "global_pooling": True},
    {"pooling_type": "avg", "ksize": [1, 1], "global_pooling": True},
]


@pytest.mark.parametrize("attrs", POOLS, ids=lambda a: f"{a['pooling_type']}-{a['ksize']}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_pool2d_gradients_check(attrs: dict, backend: str) -> None:
    check_grad("pool2d", {"X": distinct(2, 2, 5, 5)}, ["X"], attrs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pool_gives_a_tied_or_nan_window_gradient_to_its_first_maximum(backend: str) -> None:
    """Row-major first, as argmax picks: a window of zeros (relu's), tied maxima, a NaN (the
    maximum, as in max); overlapping 3x3 windows each give their own."""
    x = np.array([[[[0.0, 0.0, 1.0, 2.0],
                    [0.0, 0.0, 2.0, 0.5],
                    [3.0, np.nan, 4.0, 4.0],
                    [1.0, 3.0, 4.0, 4.0]]]])
    g = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    attrs = {"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2]}
    out = run_op("pool2d", {"X": x}, attrs=attrs, backend=backend)["Out"]
    np.testing.assert_array_equal(out, [[[[0.0, 2.0], [np.nan, 4.0]]]])
    dx = run_op("pool2d_grad", {"X": x, "Out": out, "Out@GRAD": g}, {"X@GRAD": 1}, attrs,
                backend=backend)["X@GRAD"]
    want = np.zeros_like(x)
    want[0, 0, 0, 0], want[0, 0, 0, 3], want[0, 0, 2, 1], want[0, 0, 2, 2] = 1, 2, 3, 4
    np.testing.assert_array_equal(dx, want)
    x = np.zeros((1, 1, 3, 3))  # one 3x3 window of zeros, padded by 1, stride 2: 4 windows
    attrs = {"pooling_type": "max", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1]}
    out = run_op("pool2d", {"X": x}, attrs=attrs, backend=backend)["Out"]
    dx = run_op("pool2d_grad", {"X": x, "Out": out, "Out@GRAD": np.ones((1, 1, 2, 2))},
                {"X@GRAD": 1}, attrs, backend=backend)["X@GRAD"]
    np.testing.assert_array_equal(dx, [[[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]])


# -- batch_norm ---------------------------------------------------------------------------------
BN_OUTS = ("Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance")


def bn_inputs(c: int = 3) -> dict:
    return {"X": normal(4, c, 2, 3), "Scale": normal(c), "Bias": normal(c),
            "Mean": normal(c), "Variance": RNG.uniform(0.5, 2.0, c)}


def test_batch_norm_training_normalizes_by_the_batch_and_moves_the_running_stats() -> None:
    inputs = bn_inputs()
    out = run_op("batch_norm", inputs, BN_OUTS, {"momentum": 0.8, "epsilon": 1e-5})
    x = inputs["X"]
    mu, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    want = ((x - mu[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
            * inputs["Scale"][:, None, None] + inputs["Bias"][:, None, None])
    np.testing.assert_allclose(out["Y"], want, rtol=1e-12)
    np.testing.assert_allclose(out["MeanOut"], 0.8 * inputs["Mean"] + 0.2 * mu, rtol=1e-12)
    np.testing.assert_allclose(out["VarianceOut"], 0.8 * inputs["Variance"] + 0.2 * var,
                               rtol=1e-12)
    np.testing.assert_allclose(out["SavedVariance"], 1 / np.sqrt(var + 1e-5), rtol=1e-12)


def test_batch_norm_is_test_uses_the_running_stats_and_keeps_them() -> None:
    inputs = bn_inputs()
    out = run_op("batch_norm", inputs, BN_OUTS, {"is_test": True, "epsilon": 1e-5})
    mean, var = inputs["Mean"][:, None, None], inputs["Variance"][:, None, None]
    want = ((inputs["X"] - mean) / np.sqrt(var + 1e-5) * inputs["Scale"][:, None, None]
            + inputs["Bias"][:, None, None])
    np.testing.assert_allclose(out["Y"], want, rtol=1e-12)
    np.testing.assert_array_equal(out["MeanOut"], inputs["Mean"])
    np.testing.assert_array_equal(out["VarianceOut"], inputs["Variance"])


@pytest.mark.parametrize("attrs", [{}, {"is_test": True}, {"use_global_stats": True}],
                         ids=["train", "is_test", "global_stats"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_gradients_check(attrs: dict, backend: str) -> None:
    check_grad("batch_norm", bn_inputs(2), ["X", "Scale", "Bias"], attrs, BN_OUTS, ("Y",),
               rtol=1e-5, atol=1e-6, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_norm_on_rows_normalizes_per_column(backend: str) -> None:
    inputs = {"X": normal(5, 3), "Scale": normal(3), "Bias": normal(3), "Mean": np.zeros(3),
              "Variance": np.ones(3)}
    check_grad("batch_norm", inputs, ["X", "Scale", "Bias"], {}, BN_OUTS, ("Y",), atol=1e-6,
               backend=backend)


def test_batch_norm_layer_keeps_running_stats_in_persistable_vars_not_parameters() -> None:
    """The running mean and variance persist across steps (and in checkpoints), are filled with
    0 and 1 at startup and written in place by the op; no gradient or optimizer touches them."""
    import transpiler as T
    from transpiler.framework import program_guard, unique_name
    from transpiler.ir import Program

    main, startup = Program(), Program()
    with program_guard(main, startup), unique_name.guard():
        x = T.layers.data("x", shape=[2, 3, 3])
        y = T.layers.batch_norm(x, param_attr="bn.w", bias_attr="bn.b", moving_mean_name="bn.mean",
                                moving_variance_name="bn.var")
        T.optimizer.SGD(0.1).minimize(T.layers.mean(y))
    block = main.global_block()
    for name, value in (("bn.mean", 0.0), ("bn.var", 1.0)):
        var = block.var(name)
        assert var.persistable and not var.is_parameter and var.stop_gradient, name
        assert startup.global_block().var(name).persistable
        (init,) = [op for op in startup.global_block().ops if op.output_arg_names == [name]]
        assert (init.type, init.attr("value"), init.attr("shape")) == \
            ("fill_constant", value, [2])
    assert {p.name for p in block.all_parameters()} == {"bn.w", "bn.b"}
    (bn,) = [op for op in block.ops if op.type == "batch_norm"]
    assert (bn.input("Mean"), bn.output("MeanOut")) == (["bn.mean"], ["bn.mean"])
    assert (bn.input("Variance"), bn.output("VarianceOut")) == (["bn.var"], ["bn.var"])
    assert not any(n.startswith(("bn.mean@", "bn.var@")) for n in block.vars)
    assert all(op.type in ("batch_norm", "batch_norm_grad") for op in block.ops
               if {"bn.mean", "bn.var"} & set(op.output_arg_names))


# -- layer_norm, dropout ------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [1, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_values_and_gradients(axis: int, backend: str) -> None:
    x = normal(2, 3, 4)
    right = int(np.prod(x.shape[axis:]))
    inputs = {"X": x, "Scale": normal(right), "Bias": normal(right)}
    out = run_op("layer_norm", inputs, ("Y", "Mean", "Variance"),
                 {"begin_norm_axis": axis, "epsilon": 1e-5}, backend=backend)
    x2 = x.reshape(-1, right)
    want = ((x2 - x2.mean(1, keepdims=True)) / np.sqrt(x2.var(1, keepdims=True) + 1e-5)
            * inputs["Scale"] + inputs["Bias"])
    np.testing.assert_allclose(out["Y"], want.reshape(x.shape), rtol=1e-12)
    check_grad("layer_norm", inputs, ["X", "Scale", "Bias"], {"begin_norm_axis": axis},
               ("Y", "Mean", "Variance"), ("Y",), atol=1e-6, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_without_scale_and_bias(backend: str) -> None:
    check_grad("layer_norm", {"X": normal(3, 4)}, ["X"], {}, ("Y", "Mean", "Variance"), ("Y",),
               atol=1e-6, backend=backend)


@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_is_seeded_scales_per_implementation_and_checks(impl: str, backend: str) -> None:
    x = normal(20, 30)
    attrs = {"dropout_prob": 0.25, "fix_seed": True, "seed": 5, "dropout_implementation": impl}
    one = run_op("dropout", {"X": x}, ("Out", "Mask"), attrs, backend=backend)
    two = run_op("dropout", {"X": x}, ("Out", "Mask"), attrs, backend=backend)
    np.testing.assert_array_equal(one["Mask"], two["Mask"])
    assert one["Mask"].dtype == np.uint8 and 0.65 < one["Mask"].mean() < 0.85
    scale = 1 / 0.75 if impl == "upscale_in_train" else 1.0
    np.testing.assert_allclose(one["Out"], x * one["Mask"] * scale, rtol=1e-15)
    check_grad("dropout", {"X": normal(3, 4)}, ["X"], attrs, ("Out", "Mask"), backend=backend)
    test = run_op("dropout", {"X": x}, ("Out", "Mask"), {**attrs, "is_test": True}, backend=backend)
    np.testing.assert_allclose(test["Out"], x * (1.0 if impl == "upscale_in_train" else 0.75))
    assert test["Mask"] is None


def test_dropout_without_fix_seed_draws_a_mask_per_batch_reproducibly() -> None:
    attrs = {"dropout_prob": 0.5}
    a, b = normal(8, 8), normal(8, 8)
    mask = lambda x: run_op("dropout", {"X": x}, ("Out", "Mask"), attrs)["Mask"]  # noqa: E731
    np.testing.assert_array_equal(mask(a), mask(a))
    assert not np.array_equal(mask(a), mask(b))


# -- matmul -------------------------------------------------------------------------------------
MATMULS = [  # (x, y, transpose x, transpose y)
    ((3, 4), (4, 2), False, False),
    ((4, 3), (2, 4), True, True),
    ((2, 3, 4), (2, 4, 5), False, False),
    ((2, 1, 3, 4), (3, 5, 4), False, True),
    ((4,), (4, 3), False, False),
    ((2, 3, 4), (4,), False, False),
    ((4,), (4,), False, False),
]


@pytest.mark.parametrize("op", ["matmul", "matmul_v2"])
@pytest.mark.parametrize("xs,ys,tx,ty", MATMULS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matmul_values_and_gradients(op: str, xs, ys, tx: bool, ty: bool, backend: str) -> None:
    x, y = normal(*xs), normal(*ys)
    attrs = ({"transpose_X": tx, "transpose_Y": ty, "alpha": 0.5} if op == "matmul"
             else {"trans_x": tx, "trans_y": ty})
    t = lambda a, f: np.swapaxes(a, -1, -2) if f else a  # noqa: E731
    alpha = 0.5 if op == "matmul" else 1.0
    want = np.matmul(t(x, tx), t(y, ty)) * alpha
    out = run_op(op, {"X": x, "Y": y}, attrs=attrs, backend=backend)["Out"]
    assert out.shape == np.shape(want)
    # within 1e-12 of the sum of the products' magnitudes, the scale of a dot product's
    # rounding: relative to the result, an element whose products cancel (-5.9e-6 from terms
    # near 1) failed on one summation order and passed on another (inputs drawn in test order)
    scale = np.matmul(t(np.abs(x), tx), t(np.abs(y), ty)) * alpha
    assert np.all(np.abs(out - want) <= 1e-12 * scale), np.max(np.abs(out - want) / scale)
    check_grad(op, {"X": x, "Y": y}, ["X", "Y"], attrs, backend=backend)


def test_matmul_names_mismatched_dims() -> None:
    with pytest.raises(ValueError, match=r"X \[3, 4\] and Y \[3, 2\]"):
        run_op("matmul", {"X": normal(3, 4), "Y": normal(3, 2)})


# -- shaping ------------------------------------------------------------------------------------
SHAPING = [  # (op, attrs, input shape, output shape)
    ("reshape2", {"shape": [0, -1]}, (2, 3, 4), (2, 12)),
    ("transpose2", {"axis": [2, 0, 1]}, (2, 3, 4), (4, 2, 3)),
    ("squeeze2", {"axes": [1]}, (2, 1, 3, 1), (2, 3, 1)),
    ("squeeze2", {"axes": []}, (2, 1, 3, 1), (2, 3)),
    ("unsqueeze2", {"axes": [0, -1]}, (2, 3), (1, 2, 3, 1)),
]


@pytest.mark.parametrize("op,attrs,shape,out_shape", SHAPING, ids=lambda v: str(v))
@pytest.mark.parametrize("backend", BACKENDS)
def test_shaping_ops_write_out_and_xshape_and_their_gradients_check(op, attrs, shape, out_shape,
                                                                    backend: str) -> None:
    x = normal(*shape)
    out = run_op(op, {"X": x}, ("Out", "XShape"), attrs, backend=backend)
    assert out["Out"].shape == out_shape and out["XShape"].shape == (0,) + shape
    if op == "transpose2":
        np.testing.assert_array_equal(out["Out"], x.transpose(attrs["axis"]))
    else:
        np.testing.assert_array_equal(out["Out"].reshape(-1), x.reshape(-1))
    check_grad(op, {"X": x}, ["X"], attrs, ("Out", "XShape"), backend=backend)


@pytest.mark.parametrize("attrs,sizes", [({"num": 3, "axis": 1}, [2, 2, 2]),
                                         ({"sections": [1, -1, 2], "axis": -1}, [1, 3, 2])])
@pytest.mark.parametrize("backend", BACKENDS)
def test_split_values_and_gradient(attrs: dict, sizes: list[int], backend: str) -> None:
    x = normal(2, 6)
    out = run_op("split", {"X": x}, {"Out": len(sizes)}, attrs, backend=backend)["Out"]
    assert [o.shape[1] for o in out] == sizes
    np.testing.assert_array_equal(np.concatenate(out, axis=1), x)
    check_grad("split", {"X": x}, ["X"], attrs, {"Out": len(sizes)}, ("Out",), backend=backend)


def test_split_grad_treats_a_missing_output_gradient_as_zero() -> None:
    x = normal(2, 4)
    values = {"X": x, "Out": [x[:, :2], x[:, 2:]], "Out@GRAD": [np.ones((2, 2))]}
    from runtime import Scope
    from runtime.execution.kernels import KernelContext, get_kernel
    from transpiler.ir import Op
    scope = Scope()
    for name, value in (("x", x), ("a", values["Out"][0]), ("b", values["Out"][1]),
                        ("b@GRAD", np.ones((2, 2)))):
        scope.set(name, value)
    op = Op("split_grad", {"X": ["x"], "Out": ["a", "b"], "Out@GRAD": ["b@GRAD"]},
            {"X@GRAD": ["x@GRAD"]}, {"num": 2, "axis": 1})
    get_kernel("split_grad")(KernelContext(op, scope))
    np.testing.assert_array_equal(scope.get("x@GRAD"), [[0, 0, 1, 1], [0, 0, 1, 1]])


@pytest.mark.parametrize("attrs,want", [
    ({"axes": [1], "starts": [1], "ends": [3]}, (3, 2, 4)),
    ({"axes": [0, 2], "starts": [-2, 0], "ends": [100, 1], "decrease_axis": [2]}, (2, 5)),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_values_and_gradient(attrs: dict, want: tuple, backend: str) -> None:
    x = normal(3, 5, 4)
    out = run_op("slice", {"Input": x}, attrs=attrs, backend=backend)["Out"]
    assert out.shape == want
    check_grad("slice", {"Input": x}, ["Input"], attrs, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_values_and_gradients(backend: str) -> None:
    x = normal(5, 3)
    ids = np.array([[4], [0], [4], [2]], dtype=np.int64)
    np.testing.assert_array_equal(run_op("gather", {"X": x, "Index": ids}, backend=backend)["Out"],
                                  x[[4, 0, 4, 2]])
    check_grad("gather", {"X": x, "Index": ids}, ["X"], {"overwrite": False}, backend=backend)
    check_grad("gather", {"X": x, "Index": np.array([3, 1, 0])}, ["X"], backend=backend)
    g = np.arange(12.0).reshape(4, 3)
    dx = run_op("gather_grad", {"X": x, "Index": ids, "Out": x[[4, 0, 4, 2]], "Out@GRAD": g},
                ("X@GRAD",), {"overwrite": True}, backend=backend)["X@GRAD"]
    np.testing.assert_array_equal(dx[4], g[2])  # the last of the repeated id wins
    with pytest.raises(IndexError, match="Index 0..5 outside X's 5 rows"):
        run_op("gather", {"X": x, "Index": np.array([0, 5])}, backend=backend)


@pytest.mark.parametrize("attrs", [{}, {"normalize": True, "ignore_index": -1}])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sigmoid_cross_entropy_with_logits(attrs: dict, backend: str) -> None:
    x = normal(3, 4) * 3
    label = RNG.uniform(0, 1, (3, 4))
    label[0, 1] = -1
    out = run_op("sigmoid_cross_entropy_with_logits", {"X": x, "Label": label}, attrs=attrs,
                 backend=backend)["Out"]
    p = 1 / (1 + np.exp(-x))
    want = -(label * np.log(p) + (1 - label) * np.log(1 - p))
    if attrs:
        want[0, 1] = 0
        want /= 11
    np.testing.assert_allclose(out, want, rtol=1e-10)
    check_grad("sigmoid_cross_entropy_with_logits", {"X": x, "Label": label}, ["X"], attrs,
               backend=backend)


# -- the layers and the cost rules ------------------------------------------------------------------
def test_every_new_layer_declares_the_shapes_its_ops_compute_and_trains() -> None:
    import transpiler as T
    from runtime import Executor, Scope
    from transpiler.framework import program_guard, unique_name
    from transpiler.ir import Program

    main, startup = Program(), Program()
    with program_guard(main, startup), unique_name.guard():
        x = T.layers.data("x", shape=[12])
        ids = T.layers.data("ids", shape=[4], dtype="int64", append_batch_size=False)
        label = T.layers.data("label", shape=[4, 4], append_batch_size=False)
        img = T.layers.reshape(x, [-1, 3, 2, 2])
        h = T.layers.conv2d(img, 4, 2, padding=1, groups=1, act="relu")
        h = T.layers.pool2d(h, 2, "avg", pool_stride=1)
        h = T.layers.batch_norm(h)
        h = T.layers.dropout(h, 0.2, seed=1, dropout_implementation="upscale_in_train")
        flat = T.layers.reshape(T.layers.transpose(h, [0, 2, 3, 1]), [0, -1])
        h = T.layers.layer_norm(flat)
        outer = T.layers.matmul(T.layers.unsqueeze(h, [2]), T.layers.unsqueeze(h, [1]), alpha=0.5)
        h = T.layers.squeeze(T.layers.slice(outer, [1, 2], [0, 0], [4, 1]), [2])
        a, b = T.layers.split(h, 2, dim=1)
        picked = T.layers.gather(T.layers.concat([a, b], axis=1), ids)
        loss = T.layers.mean(T.layers.sigmoid_cross_entropy_with_logits(picked, label))
        T.optimizer.SGD(0.1).minimize(loss)
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    feed = {"x": RNG.standard_normal((5, 12)).astype(np.float32),
            "ids": np.array([4, 0, 2, 2], np.int64),
            "label": RNG.uniform(size=(4, 4)).astype(np.float32)}
    exe.run(main, feed=feed, scope=scope)
    for var in main.global_block().vars.values():
        if var.name in scope and not var.name.endswith("@GRAD"):
            got = np.shape(scope.get(var.name))
            assert len(got) == len(var.shape) and all(
                d in (-1, g) for d, g in zip(var.shape, got)), (var.name, var.shape, got)
    assert {"batch_norm_grad", "conv2d_grad", "gather_grad", "split_grad", "matmul_grad"} <= {
        op.type for op in main.global_block().ops}


def test_cost_rules_count_conv_pool_and_batched_matmul_flops() -> None:
    from runtime import Scope
    from sim.cost import op_work
    from transpiler.ir import Op

    scope = Scope()
    scope.set("x", np.ones((2, 4, 6, 6), np.float32))
    scope.set("w", np.ones((6, 2, 3, 3), np.float32))
    conv = Op("conv2d", {"Input": ["x"], "Filter": ["w"]}, {"Output": ["o"]}, {"groups": 2})
    scope.set("o", np.ones((2, 6, 4, 4), np.float32))
    assert op_work(conv, scope).flops == 2 * (2 * 3 * 3) * (2 * 6 * 4 * 4)
    pool = Op("pool2d", {"X": ["x"]}, {"Out": ["p"]}, {"ksize": [2, 2]})
    scope.set("p", np.ones((2, 4, 3, 3), np.float32))
    assert op_work(pool, scope).flops == 4 * 2 * 4 * 3 * 3
    scope.set("a", np.ones((3, 5, 7), np.float32))
    scope.set("b", np.ones((3, 7, 2), np.float32))
    scope.set("m", np.ones((3, 5, 2), np.float32))
    mm = Op("matmul", {"X": ["a"], "Y": ["b"]}, {"Out": ["m"]})
    assert op_work(mm, scope).flops == 2 * 7 * 3 * 5 * 2
