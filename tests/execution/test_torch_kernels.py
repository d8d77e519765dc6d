"""Torch kernels against numpy kernels: every op, forward and gradient, on random float32 and
float64 inputs (plus mixed-dtype and integer cases), gives the same values (rtol 1e-5), dtypes,
shapes, LoD and SelectedRows rows; whole programs from the front end train to the same
parameters with either backend; device and missing-torch errors say what to do.

Each case builds an op's inputs; the gradient case of an op feeds the grad op the forward
inputs, the numpy forward outputs and random output gradients, as the backward pass would.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transpiler as T  # noqa: E402
from runtime import Executor, LoDTensor, Scope, SelectedRows  # noqa: E402
from runtime.execution.kernels import KernelContext, get_kernel, registered_ops  # noqa: E402
from runtime.execution.kernels import torch_nn  # noqa: E402
from runtime.execution.kernels.torch_common import DeviceError, resolve_device  # noqa: E402
from transpiler.ir import BlockRef, Op, Program  # noqa: E402

from gradcheck import Outputs, grad_op, run_kernel  # noqa: E402
from program_helpers import build  # noqa: E402

BACKENDS = ("numpy", "torch")
FLOATS = (np.float64, np.float32)
RTOL = 1e-5
ATOL = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}
PARAM_ATOL = 1e-6
"""For float32 weights that pass near zero after 20 steps: about 10 float32 ulps of a weight of
size 1. Matmuls and sums round differently in numpy's BLAS and torch's, by an ulp per op."""
HAS_CUDA = torch.cuda.is_available()


# -- running one op -------------------------------------------------------------------------------
Inputs = Mapping[str, Any]


def assert_same(want: Any, got: Any, what: str) -> None:
    """Same kind of value, dtype, shape, LoD and rows; values within RTOL."""
    assert type(got) is type(want), f"{what}: {type(got).__name__} != {type(want).__name__}"
    if want is None:
        return
    if isinstance(want, LoDTensor):
        assert got.lod == want.lod, f"{what}: LoD {got.lod} != {want.lod}"
        want, got = want.data, got.data
    if isinstance(want, SelectedRows):
        assert got.height == want.height, f"{what}: height"
        np.testing.assert_array_equal(got.rows, want.rows, err_msg=f"{what}: rows")
        want, got = want.values, got.values
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL.get(want.dtype, 1e-6), err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def c_contiguous(value: Any) -> bool:
    """Whether the value's array data can go to the wire as is (no copy)."""
    data = (value.data if isinstance(value, LoDTensor) else
            value.values if isinstance(value, SelectedRows) else value)
    return data is None or bool(data.flags.c_contiguous)


def assert_backends_agree(op_type: str, inputs: Inputs, outputs: Mapping[str, int],
                          attrs: Mapping[str, Any], program: Program | None = None) -> Outputs:
    """Both backends' outputs are the same; torch's are C-contiguous too."""
    want, got = (run_kernel(b, op_type, inputs, outputs, attrs, program) for b in BACKENDS)
    for slot in outputs:
        for i, (w, g) in enumerate(zip(want[slot], got[slot])):
            assert_same(w, g, f"{op_type} {slot}[{i}]")
            assert c_contiguous(g), f"{op_type} {slot}[{i}]: torch output is not C-contiguous"
    return want


# -- cases ------------------------------------------------------------------------------------------
RNG = np.random.default_rng(2024)
Build = Callable[[np.random.Generator], dict[str, Any]]


@dataclass
class Case:
    """One op on inputs from `build` (float64, cast per test); `wrt`: the input slots whose
    gradients the grad op computes, `loss`: the outputs whose gradients it receives."""

    op: str
    build: Build
    outputs: tuple[str, ...] = ("Out",)
    attrs: dict[str, Any] = field(default_factory=dict)
    wrt: tuple[str, ...] = ()
    loss: tuple[str, ...] = ()
    id: str = ""

    def __str__(self) -> str:
        return f"{self.op}-{self.id}" if self.id else self.op


def normal(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape)


def positive(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.uniform(0.5, 1.5, shape)


def slots(**makers: Callable[[np.random.Generator], Any]) -> Build:
    return lambda rng: {slot: make(rng) for slot, make in makers.items()}


def rows(height: int, ids: list[int], width: int = 3) -> Callable[[np.random.Generator], SelectedRows]:
    return lambda rng: SelectedRows(ids, rng.standard_normal((len(ids), width)), height)


def probs(n: int, c: int) -> Callable[[np.random.Generator], np.ndarray]:
    def make(rng: np.random.Generator) -> np.ndarray:
        e = np.exp(rng.standard_normal((n, c)))
        return e / e.sum(axis=1, keepdims=True)
    return make


def labels(n: int, c: int, ignore: int | None = None) -> Callable[[np.random.Generator], np.ndarray]:
    def make(rng: np.random.Generator) -> np.ndarray:
        ids = rng.integers(0, c, (n, 1)).astype(np.int64)
        if ignore is not None:
            ids[1] = ignore
        return ids
    return make


def sequences(lengths: list[int], width: int = 3) -> Callable[[np.random.Generator], LoDTensor]:
    lod = [[0, *np.cumsum(lengths).tolist()]]
    return lambda rng: LoDTensor(rng.standard_normal((sum(lengths), width)), lod)


BROADCASTS = [((2, 3), (2, 3), -1), ((2, 3, 4), (3,), 1), ((2, 3, 4), (3, 4), -1),
              ((2, 3, 4), (3, 1), 1), ((1, 3), (2, 3), -1), ((2, 3), (1,), -1)]


def _moved_rows(rng: np.random.Generator) -> dict[str, Any]:
    """Geo's sparse delta: X moved from Y in rows 1 and 3 only."""
    x = rng.standard_normal((5, 3))
    y = x.copy()
    y[[1, 3]] -= rng.standard_normal((2, 3))
    return {"X": x, "Y": y}


def elementwise_cases() -> list[Case]:
    cases = []
    for op in ["elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div",
               "elementwise_max", "elementwise_min", "elementwise_pow"]:
        make = positive if op in ("elementwise_div", "elementwise_pow") else normal
        for xs, ys, axis in BROADCASTS:
            cases.append(Case(op, slots(X=make(*xs), Y=make(*ys)), attrs={"axis": axis},
                              wrt=("X", "Y"), id=f"{xs}x{ys}@{axis}"))
    cases.append(Case("elementwise_mul", slots(X=sequences([2, 1]), Y=normal(3)), wrt=("X", "Y"),
                      id="lod"))
    cases.append(Case("less_than", slots(X=normal(2, 3), Y=normal(3))))
    return cases


UNARY = {"relu": normal, "tanh": normal, "sigmoid": normal, "exp": normal, "log": positive,
         "sqrt": positive, "square": normal, "cos": normal, "softsign": normal}
ACTIVATIONS = {"gelu": {"approximate": True}, "silu": {}, "leaky_relu": {"alpha": 0.1},
               "elu": {"alpha": 0.7}, "softplus": {"beta": 2.0, "threshold": 1.0},
               "brelu": {"t_min": -0.5, "t_max": 0.7}}
"""The activations with attributes: each with its defaults, and with the attributes given."""


def math_cases() -> list[Case]:
    cases = [Case(op, slots(X=make(3, 4)), wrt=("X",)) for op, make in UNARY.items()]
    cases += [Case(op, slots(X=normal(3, 4)), attrs=attrs, wrt=("X",), id=",".join(attrs))
              for op, given in ACTIVATIONS.items() for attrs in ([{}, given] if given else [{}])]
    cases += [Case(op, slots(X=lambda rng: 3 * rng.standard_normal((3, 4)))) for op in ("floor", "ceil", "sign")]
    cases += [Case("relu", slots(X=sequences([1, 2])), wrt=("X",), id="lod"),
              Case("scale", slots(X=normal(2, 3)), attrs={"scale": 3.0, "bias": 0.5}, wrt=("X",)),
              Case("scale", slots(X=normal(2, 3)), id="bias-first", wrt=("X",),
                   attrs={"scale": -2.0, "bias": 0.25, "bias_after_scale": False}),
              Case("scale", slots(X=rows(5, [3, 1, 3])), attrs={"scale": 0.5}, id="rows"),
              Case("cast", slots(X=normal(2, 3)), attrs={"out_dtype": "float64"}, wrt=("X",)),
              Case("cast", slots(X=lambda rng: 3 * rng.standard_normal((2, 3))),
                   attrs={"out_dtype": "int64"}, id="int"),
              Case("cast", slots(X=sequences([2, 1])), attrs={"out_dtype": "float32"}, id="lod"),
              Case("assign", slots(X=normal(2, 3)), wrt=("X",)),
              Case("assign", slots(X=sequences([1, 2])), id="lod"),
              Case("assign", slots(X=rows(4, [0, 2])), id="rows"),
              Case("reshape", slots(X=normal(2, 3, 4)), attrs={"shape": [0, -1]}, wrt=("X",)),
              Case("reshape", slots(X=normal(2, 3, 2)), attrs={"shape": [-1, 3, 0]}, wrt=("X",),
                   id="infer"),
              Case("mean", slots(X=normal(3, 4)), wrt=("X",)),
              Case("reduce_sum", slots(X=normal(2, 3, 4)), wrt=("X",),
                   attrs={"dim": [1], "keep_dim": False, "reduce_all": False}),
              Case("reduce_sum", slots(X=normal(2, 3, 4)), wrt=("X",), id="all",
                   attrs={"dim": [0], "keep_dim": True, "reduce_all": True}),
              Case("reduce_mean", slots(X=normal(2, 3, 4)), wrt=("X",),
                   attrs={"dim": [-1, 0], "keep_dim": True, "reduce_all": False}),
              Case("reduce_mean", slots(X=normal(3, 4)), wrt=("X",), id="all",
                   attrs={"dim": [0], "keep_dim": False, "reduce_all": True}),
              Case("squared_l2_norm", slots(X=normal(3, 4)), wrt=("X",)),
              Case("sum", slots(X=lambda rng: [rng.standard_normal((2, 3)) for _ in range(3)]),
                   wrt=("X",)),
              Case("sum", slots(X=lambda rng: [rows(4, [0, 2])(rng), rows(4, [2, 2, 3])(rng)]),
                   id="rows"),
              Case("sparse_delta", _moved_rows, attrs={"scale": 0.5}),
              Case("sum", slots(X=lambda rng: [rows(4, [1, 1, 3])(rng), rng.standard_normal((4, 3))]),
                   id="rows+dense"),
              Case("sum", slots(X=lambda rng: [sequences([1, 2])(rng), rng.standard_normal((3, 3))]),
                   id="lod"),
              Case("concat", slots(X=lambda rng: [rng.standard_normal((2, n)) for n in (1, 3, 2)]),
                   attrs={"axis": 1}, wrt=("X",)),
              Case("concat", slots(X=lambda rng: [rng.standard_normal((n, 2)) for n in (2, 1)]),
                   attrs={"axis": -2}, wrt=("X",), id="axis-2"),
              Case("clip", slots(X=normal(3, 4)), attrs={"min": -0.5, "max": 0.7}, wrt=("X",)),
              Case("clip_by_norm", slots(X=normal(3, 4)), attrs={"max_norm": 1.0}),
              Case("clip_by_norm", slots(X=normal(3, 4)), attrs={"max_norm": 100.0}, id="inside")]
    return cases


def nn_cases() -> list[Case]:
    cases = [Case("mul", slots(X=normal(*xs), Y=normal(*ys)), wrt=("X", "Y"), id=f"{xs}x{ys}",
                  attrs={"x_num_col_dims": xd, "y_num_col_dims": yd})
             for xs, ys, xd, yd in [((3, 4), (4, 2), 1, 1), ((2, 3, 4), (4, 5), 2, 1),
                                    ((2, 3, 4), (12, 2), 1, 1), ((2, 3, 4), (2, 2, 3), 2, 2),
                                    # narrow products, computed transposed on the CPU
                                    ((20, 24), (24, 3), 1, 1), ((40, 8), (8, 3), 1, 1)]]
    cases += [Case("mul", slots(X=sequences([2, 1], 4), Y=normal(4, 2)), wrt=("X", "Y"), id="lod"),
              Case("softmax", slots(X=normal(3, 4)), wrt=("X",)),
              Case("softmax", slots(X=normal(3, 4)), attrs={"axis": 0}, wrt=("X",), id="axis0"),
              Case("cross_entropy", slots(X=probs(4, 3), Label=labels(4, 3)), outputs=("Y",),
                   wrt=("X",)),
              Case("cross_entropy", slots(X=probs(4, 3), Label=labels(4, 3, ignore=-100)),
                   outputs=("Y",), wrt=("X",), id="ignore"),
              Case("cross_entropy", slots(X=probs(4, 3), Label=probs(4, 3)), outputs=("Y",),
                   attrs={"soft_label": True}, wrt=("X",), id="soft"),
              Case("cross_entropy2", slots(X=probs(4, 3), Label=labels(4, 3)),
                   outputs=("Y", "MatchX"), wrt=("X",)),
              Case("cross_entropy2", slots(X=probs(4, 3), Label=labels(4, 3, ignore=1)),
                   outputs=("Y", "MatchX"), attrs={"ignore_index": 1}, wrt=("X",), id="ignore")]
    losses: list[tuple[Callable[[np.random.Generator], np.ndarray], dict[str, Any], str]] = [
        (labels(4, 5), {}, "hard"), (labels(4, 5, ignore=2), {"ignore_index": 2}, "ignore"),
        (probs(4, 5), {"soft_label": True}, "soft")]
    for lab, attrs, name in losses:
        cases.append(Case("softmax_with_cross_entropy", slots(Logits=normal(4, 5), Label=lab),
                          outputs=("Softmax", "Loss"), loss=("Loss",), attrs=attrs,
                          wrt=("Logits",), id=name))
    ids = lambda rng: np.array([[3], [0], [1], [3], [5]], np.int64)  # noqa: E731
    tables: list[tuple[dict[str, Any], str]] = [
        ({}, "dense"), ({"is_sparse": True}, "sparse"), ({"padding_idx": 3}, "padding"),
        ({"is_sparse": True, "padding_idx": 0}, "sparse-padding")]
    for attrs, name in tables:
        cases.append(Case("lookup_table", slots(W=normal(6, 4), Ids=ids), attrs=attrs, wrt=("W",),
                          id=name))
    nce_labels = lambda rng: np.array([[3, 0], [1, 6], [6, 6], [2, 5]], np.int64)  # noqa: E731
    for sampler, sparse in ((0, False), (1, True), (2, False)):
        custom = {} if sampler != 2 else {
            "CustomDistProbs": lambda rng: np.full(7, 1 / 7, np.float32),
            "CustomDistAlias": lambda rng: np.full(7, -1, np.int32),
            "CustomDistAliasProbs": lambda rng: np.ones(7, np.float32)}
        cases.append(Case("nce", slots(Input=normal(4, 3), Label=nce_labels, Weight=normal(7, 3),
                                       Bias=normal(7, 1), SampleWeight=positive(4, 1), **custom),
                          outputs=("Cost", "SampleLogits", "SampleLabels"), loss=("Cost",),
                          attrs={"num_total_classes": 7, "num_neg_samples": 3, "seed": 5,
                                 "sampler": sampler, "is_sparse": sparse},
                          wrt=("Input", "Weight", "Bias"), id=f"sampler{sampler}"))
    v2_ids = [(np.array([3, 0, 1, 3, 5], np.int64), "flat"),
              (np.array([[3, 0, 1], [3, 5, 5]], np.int64), "matrix"),
              (np.array([[3], [0]], np.int64), "trailing-1")]
    for (v2, shape), (attrs, name) in zip(v2_ids * 2, tables + tables[:2]):
        cases.append(Case("lookup_table_v2", slots(W=normal(6, 4), Ids=lambda rng, v=v2: v),
                          attrs=attrs, wrt=("W",), id=f"{shape}-{name}"))
    cases.append(Case("lookup_table", id="lod", wrt=("W",), build=slots(
        W=normal(6, 4), Ids=lambda rng: LoDTensor(np.array([[1], [4], [4]], np.int64), [[0, 1, 3]]))))
    hs_label = lambda rng: np.array([[0], [3], [5], [2]], np.int64)  # noqa: E731
    cases.append(Case("hierarchical_sigmoid", slots(X=normal(4, 3), W=normal(5, 3), Label=hs_label,
                                                    Bias=normal(5, 1)),
                      outputs=("Out", "PreOut"), loss=("Out",), attrs={"num_classes": 6},
                      wrt=("X", "W", "Bias"), id="default-tree"))
    for sparse in (False, True):
        cases.append(Case("hierarchical_sigmoid", slots(
            X=normal(4, 3), W=normal(3, 3), Label=hs_label, Bias=normal(3, 1),
            PathTable=lambda rng: np.array([[0, 1, -1], [0, 2, 1], [2, -1, -1], [1, 0, 2]]),
            PathCode=lambda rng: np.array([[1, 0, 0], [0, 1, 1], [1, 0, 0], [0, 0, 1]])),
            outputs=("Out", "PreOut"), loss=("Out",), wrt=("X", "W", "Bias"),
            attrs={"num_classes": 3, "is_sparse": sparse}, id=f"custom-sparse{int(sparse)}"))
    ties = lambda rng: np.array([[0.5, 0.1, 0.5, 0.2], [0.3, 0.3, 0.3, 0.3]])  # noqa: E731
    cases += [Case("top_k", slots(X=normal(2, 3, 5)), outputs=("Out", "Indices"), attrs={"k": 3}),
              Case("top_k", slots(X=ties), outputs=("Out", "Indices"), attrs={"k": 2}, id="ties"),
              Case("top_k", slots(X=sequences([2, 1], 4)), outputs=("Out", "Indices"), id="lod"),
              Case("accuracy", outputs=("Accuracy", "Correct", "Total"), build=slots(
                  Out=normal(3, 2), Indices=lambda rng: np.array([[0, 2], [1, 3], [4, 0]]),
                  Label=lambda rng: np.array([[2], [0], [1]])))]
    for kind in ["SUM", "AVERAGE", "SQRT", "MAX", "FIRST", "LAST"]:
        cases.append(Case("sequence_pool", slots(X=sequences([3, 1, 0, 4, 2])), id=kind,
                          outputs=("Out", "MaxIndex"), loss=("Out",), attrs={"pooltype": kind},
                          wrt=("X",)))
    cases.append(Case("sequence_pool", id="nested-lod", outputs=("Out", "MaxIndex"), loss=("Out",),
                      attrs={"pooltype": "MAX"}, wrt=("X",), build=slots(
                          X=lambda rng: LoDTensor(rng.standard_normal((5, 2, 2)), [[0, 1, 3], [0, 2, 2, 5]]))))
    return cases


def optimizer_slots(op: str, rng: np.random.Generator, grad: Any) -> dict[str, Any]:
    p = rng.standard_normal((4, 3))
    extra = {"momentum": ["Velocity"], "adam": ["Moment1", "Moment2"], "adagrad": ["Moment"],
             "decayed_adagrad": ["Moment"], "adamax": ["Moment", "InfNorm"],
             "rmsprop": ["MeanSquare", "MeanGrad", "Moment"],
             "ftrl": ["SquaredAccumulator", "LinearAccumulator"], "sgd": [],
             "lars_momentum": ["Velocity"]}[op]
    values = {"Param": p, "Grad": grad, "LearningRate": np.array([0.05])}
    for slot in extra:
        values[slot] = rng.uniform(0.1, 1.0, p.shape)  # accumulators that are positive where needed
    if op == "rmsprop":
        values["MeanGrad"] *= 0.1  # centered: MeanSquare - MeanGrad^2 > 0
    if op in ("adam", "adamax"):
        values["Beta1Pow"] = np.array([0.9 ** 3])
    if op == "adam":
        values["Beta2Pow"] = np.array([0.999 ** 3])
    return values


OPTIMIZER_OUTPUTS = {
    "sgd": ("ParamOut",), "momentum": ("ParamOut", "VelocityOut"),
    "adam": ("ParamOut", "Moment1Out", "Moment2Out"), "adagrad": ("ParamOut", "MomentOut"),
    "decayed_adagrad": ("ParamOut", "MomentOut"), "adamax": ("ParamOut", "MomentOut", "InfNormOut"),
    "rmsprop": ("ParamOut", "MomentOut", "MeanSquareOut", "MeanGradOut"),
    "ftrl": ("ParamOut", "SquaredAccumOut", "LinearAccumOut"),
    "lars_momentum": ("ParamOut", "VelocityOut"),
}
OPTIMIZER_ATTRS = [("lars_momentum", {"mu": 0.5, "lars_coeff": 0.01, "lars_weight_decay": 0.1},
                    "coeffs"),
                   ("momentum", {"mu": 0.8, "use_nesterov": True}, "nesterov"),
                   ("rmsprop", {"centered": True, "momentum": 0.5}, "centered"),
                   ("ftrl", {"l1": 0.01, "l2": 0.02, "lr_power": -0.6}, "power"),
                   ("adam", {"beta1": 0.8, "beta2": 0.99, "epsilon": 1e-4}, "betas")]


def optimizer_cases() -> list[Case]:
    cases = []
    for op, outputs in OPTIMIZER_OUTPUTS.items():
        # lazy: the rule on rows 0 and 3 only, rows 1 and 2 left alone (sgd has no lazy mode)
        grads = [("dense", normal(4, 3), {}), ("rows", rows(4, [3, 0, 3]), {})]
        grads += [("lazy", rows(4, [3, 0, 3]), {"lazy_mode": True})] if op != "sgd" else []
        for name, grad, attrs in grads:
            build = (lambda o, g: lambda rng: optimizer_slots(o, rng, g(rng)))(op, grad)
            cases.append(Case(op, build, outputs=outputs, attrs=attrs, id=name))
    for op, attrs, name in OPTIMIZER_ATTRS:
        build = (lambda o: lambda rng: optimizer_slots(o, rng, rng.standard_normal((4, 3))))(op)
        cases.append(Case(op, build, outputs=OPTIMIZER_OUTPUTS[op], attrs=attrs, id=name))
    return cases


def cnn_cases() -> list[Case]:
    """The image, normalization, product and shaping ops (tests/execution/test_kernels_cnn.py checks
    the numpy ones against loops and finite differences)."""
    conv = slots(Input=normal(2, 4, 6, 5), Filter=normal(6, 2, 3, 2))
    cases = [Case("conv2d", conv, outputs=("Output",), wrt=("Input", "Filter"), id=name,
                  attrs={"strides": s, "paddings": p, "dilations": d, "groups": 2})
             for s, p, d, name in [([1, 1], [0, 0], [1, 1], "plain"),
                                   ([1, 1], [1, 1], [1, 1], "padded"),  # torch pads
                                   ([2, 1], [1, 0, 2, 1], [1, 2], "strided")]]
    cases.append(Case("conv2d", conv, outputs=("Output",), wrt=("Filter",), id="filter-only",
                      attrs={"paddings": [1, 1], "groups": 2}))  # a first layer: no Input@GRAD
    for attrs in [{"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2]},
                  {"pooling_type": "max", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1]},
                  # padded by -inf before torch pools: uneven, and more than half the window
                  {"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2],
                   "paddings": [0, 1, 1, 0]},
                  {"pooling_type": "max", "ksize": [3, 3], "strides": [2, 2], "paddings": [2, 2]},
                  {"pooling_type": "avg", "ksize": [3, 3], "strides": [2, 1], "paddings": [1, 1]},
                  {"pooling_type": "avg", "ksize": [3, 3], "strides": [2, 2], "paddings": [1, 1],
                   "exclusive": False},
                  {"pooling_type": "avg", "ksize": [1, 1], "global_pooling": True}]:
        cases.append(Case("pool2d", slots(X=normal(2, 3, 5, 5)), attrs=attrs, wrt=("X",),
                          id=f"{attrs['pooling_type']}-{attrs['ksize']}-{attrs.get('paddings')}"))
    bn = slots(X=normal(4, 3, 2, 3), Scale=normal(3), Bias=normal(3), Mean=normal(3),
               Variance=positive(3))
    bn_outs = ("Y", "MeanOut", "VarianceOut", "SavedMean", "SavedVariance")
    cases += [Case("batch_norm", bn, outputs=bn_outs, loss=("Y",), attrs=attrs,
                   wrt=("X", "Scale", "Bias"), id=name)
              for attrs, name in [({"momentum": 0.8}, "train"), ({"is_test": True}, "is_test")]]
    cases += [Case("layer_norm", slots(X=normal(2, 3, 4), Scale=normal(12), Bias=normal(12)),
                   outputs=("Y", "Mean", "Variance"), loss=("Y",), wrt=("X", "Scale", "Bias")),
              Case("layer_norm", slots(X=normal(2, 3, 4)), outputs=("Y", "Mean", "Variance"),
                   loss=("Y",), attrs={"begin_norm_axis": 2}, wrt=("X",), id="bare")]
    for impl in ("downgrade_in_infer", "upscale_in_train"):
        cases.append(Case("dropout", slots(X=normal(6, 5)), outputs=("Out", "Mask"), loss=("Out",),
                          attrs={"dropout_prob": 0.3, "dropout_implementation": impl},
                          wrt=("X",), id=impl))
    for op, flags in (("matmul", ("transpose_X", "transpose_Y")), ("matmul_v2", ("trans_x", "trans_y"))):
        cases += [Case(op, slots(X=normal(*xs), Y=normal(*ys)), wrt=("X", "Y"),
                       attrs=dict(zip(flags, t)), id=f"{xs}{ys}")
                  for xs, ys, t in [((3, 4), (4, 2), (False, False)),
                                    ((2, 1, 4, 3), (3, 5, 4), (True, True)),
                                    ((4,), (2, 4, 3), (False, False))]]
    cases += [Case("reshape2", slots(X=normal(2, 3, 4)), outputs=("Out", "XShape"), loss=("Out",),
                   attrs={"shape": [0, -1]}, wrt=("X",)),
              Case("transpose2", slots(X=normal(2, 3, 4)), outputs=("Out", "XShape"),
                   loss=("Out",), attrs={"axis": [1, 2, 0]}, wrt=("X",)),
              Case("squeeze2", slots(X=normal(2, 1, 3)), outputs=("Out", "XShape"), loss=("Out",),
                   attrs={"axes": [1]}, wrt=("X",)),
              Case("unsqueeze2", slots(X=normal(2, 3)), outputs=("Out", "XShape"), loss=("Out",),
                   attrs={"axes": [1]}, wrt=("X",)),
              Case("slice", slots(Input=normal(3, 5, 4)), attrs={
                  "axes": [0, 1], "starts": [-2, 1], "ends": [10, 3], "decrease_axis": []},
                   wrt=("Input",)),
              Case("gather", slots(X=normal(5, 3), Index=lambda rng: np.array([4, 0, 4, 2])),
                   attrs={"overwrite": False}, wrt=("X",), id="add"),
              Case("gather", slots(X=normal(5, 3), Index=lambda rng: np.array([4, 0, 4, 2])),
                   wrt=("X",), id="overwrite"),
              Case("sigmoid_cross_entropy_with_logits", slots(
                  X=normal(3, 4), Label=lambda rng: np.where(rng.uniform(size=(3, 4)) < 0.2, -1.0,
                                                             rng.uniform(size=(3, 4)))),
                   attrs={"ignore_index": -1, "normalize": True}, wrt=("X",))]
    return cases


def control_cases() -> list[Case]:
    return [Case("increment", slots(X=normal(1)), attrs={"step": 2.0}),
            Case("fill_constant", slots(), attrs={"shape": [2, 3], "dtype": "float32", "value": 0.1}),
            Case("fill_constant_batch_size_like", slots(Input=normal(4, 2)),
                 attrs={"shape": [-1, 3], "dtype": "float32", "value": 0.5}),
            Case("fill_constant_batch_size_like", slots(Input=sequences([2, 1])), id="lod",
                 attrs={"shape": [2, -1], "dtype": "int64", "value": 1.0, "output_dim_idx": 1})]


def text_cases() -> list[Case]:
    """sequence_conv, cos_sim and auc (tests/execution/test_kernels_text.py checks values)."""
    cases = [Case("sequence_conv", slots(X=sequences([3, 1, 0, 4], 2), Filter=normal(2 * n, 3)),
                  attrs={"contextLength": n, "contextStart": s}, wrt=("X", "Filter"),
                  id=f"{n}@{s}") for n, s in ((3, -1), (2, 1))]
    cases += [Case("cos_sim", slots(X=normal(4, 3), Y=normal(rows, 3)), id=f"y{rows}",
                   outputs=("Out", "XNorm", "YNorm"), loss=("Out",), wrt=("X", "Y"))
              for rows in (4, 1)]
    for steps, stat in ((0, (1, 6)), (2, (19,))):
        cases.append(Case("auc", id=f"slide{steps}", outputs=("AUC", "StatPosOut", "StatNegOut"),
                          attrs={"num_thresholds": 5, "slide_steps": steps}, build=slots(
                              Predict=lambda rng: rng.uniform(0, 1, (6, 2)),
                              Label=labels(6, 2),
                              StatPos=lambda rng, s=stat: rng.integers(0, 3, s).astype(np.int64),
                              StatNeg=lambda rng, s=stat: rng.integers(0, 3, s).astype(np.int64))))
    return cases


CASES = (elementwise_cases() + math_cases() + nn_cases() + cnn_cases() + optimizer_cases()
         + control_cases() + text_cases())
GRAD_CASES = [c for c in CASES if c.wrt]


def cast_floats(value: Any, dtype: type) -> Any:
    """`value` with every float64 array (inside LoDTensor, SelectedRows, lists too) as `dtype`."""
    if isinstance(value, list):
        return [cast_floats(v, dtype) for v in value]
    if isinstance(value, LoDTensor):
        return LoDTensor(cast_floats(value.data, dtype), value.lod)
    if isinstance(value, SelectedRows):
        return SelectedRows(value.rows, cast_floats(value.values, dtype), value.height)
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        return value.astype(dtype)
    return value


def case_inputs(case: Case, dtype: type, seed: int = 0) -> dict[str, Any]:
    return cast_floats(case.build(np.random.default_rng(seed)), dtype)


def grad_inputs(case: Case, inputs: Inputs, forward: Outputs, rng: np.random.Generator,
                with_out_grad: bool = True) -> dict[str, Any]:
    """The grad op's inputs: forward inputs and outputs, and random gradients of the losses."""
    values: dict[str, Any] = dict(inputs)
    values.update({slot: forward[slot][0] for slot in case.outputs})
    if with_out_grad:
        for slot in case.loss or case.outputs[:1]:
            out = forward[slot][0]
            data = out.data if isinstance(out, LoDTensor) else out
            values[f"{slot}@GRAD"] = rng.standard_normal(data.shape).astype(data.dtype)
    return values


def grad_outputs(case: Case, inputs: Inputs) -> dict[str, int]:
    return {f"{s}@GRAD": len(inputs[s]) if isinstance(inputs[s], list) else 1 for s in case.wrt}


# -- every op, both backends
# ------------------------------------------------------------------------
def test_torch_registers_exactly_the_numpy_ops() -> None:
    assert registered_ops("torch") == registered_ops("numpy")


def test_cases_cover_every_op_and_gradient() -> None:
    tested = {c.op for c in CASES} | {grad_op(c.op) for c in GRAD_CASES}
    tested |= {"logical_and", "logical_or", "logical_xor", "logical_not", "conditional_block",
               "uniform_random", "gaussian_random", "truncated_gaussian_random", "split_byref",
               "split_selected_rows", "split", "split_grad", "assign_value"}  # tests below
    tested |= set(TABLE_OPS)
    assert tested == set(registered_ops("numpy"))


TABLE_OPS = ("split_ids", "merge_ids", "lookup_sparse_table", "lookup_sparse_table_read", "fake_init",
             "save", "ref_by_trainer_id")


def test_table_ops_are_the_numpy_kernels() -> None:
    """They only cut, gather, pick, place or write rows (tests/services/test_cluster_table.py and
    tests/execution/test_kernels_dist.py check them); the torch backend runs them on numpy
    values."""
    for op_type in TABLE_OPS:
        assert get_kernel(op_type, "torch").__wrapped__ is get_kernel(op_type, "numpy"), op_type


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_agrees(case: Case, dtype: type) -> None:
    outputs = dict.fromkeys(case.outputs, 1)
    assert_backends_agree(case.op, case_inputs(case, dtype), outputs, case.attrs)


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradient_agrees(case: Case, dtype: type) -> None:
    inputs = case_inputs(case, dtype)
    forward = run_kernel("numpy", case.op, inputs, dict.fromkeys(case.outputs, 1), case.attrs)
    values = grad_inputs(case, inputs, forward, np.random.default_rng(1))
    assert_backends_agree(grad_op(case.op), values, grad_outputs(case, inputs), case.attrs)


@pytest.mark.parametrize("transpose", [False, True], ids=["direct", "transposed"])
@pytest.mark.parametrize("shapes", [((20, 24), (24, 3)), ((40, 8), (8, 3)), ((3, 4), (4, 2))],
                         ids=str)
def test_narrow_products_agree_either_way(shapes: tuple[tuple[int, int], tuple[int, int]],
                                          transpose: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_mm` computes narrow CPU products transposed where MKL runs on AMD: both ways, on any
    machine, give numpy's product, contiguous."""
    monkeypatch.setattr(torch_nn, "TRANSPOSE_NARROW", transpose)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    out = torch_nn._mm(torch.from_numpy(a), torch.from_numpy(b))
    assert out.is_contiguous()
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [c for c in GRAD_CASES if c.id in ("", "MAX", "sparse", "hard")],
                         ids=str)
def test_gradient_without_out_grad_is_zero_in_both(case: Case) -> None:
    inputs = case_inputs(case, np.float64)
    forward = run_kernel("numpy", case.op, inputs, dict.fromkeys(case.outputs, 1), case.attrs)
    values = grad_inputs(case, inputs, forward, np.random.default_rng(1), with_out_grad=False)
    assert_backends_agree(grad_op(case.op), values, grad_outputs(case, inputs), case.attrs)


def test_gradient_of_some_inputs_only() -> None:
    x, y = RNG.standard_normal((2, 3)), RNG.standard_normal((3,))
    values = {"X": x, "Y": y, "Out": x * y, "Out@GRAD": RNG.standard_normal((2, 3))}
    out = assert_backends_agree("elementwise_mul_grad", values, {"Y@GRAD": 1}, {"axis": -1})
    np.testing.assert_allclose(out["Y@GRAD"][0], (values["Out@GRAD"] * x).sum(axis=0))
    xs = [RNG.standard_normal((2, n)) for n in (1, 3)]
    g = RNG.standard_normal((2, 4))
    op = Op("concat_grad", {"X": ["a", "b"], "Out@GRAD": ["g"]}, {"X@GRAD": ["b@GRAD"]}, {"axis": 1})
    for backend in BACKENDS:
        scope = Scope()
        for name, value in [("a", xs[0]), ("b", xs[1]), ("g", g)]:
            scope.set(name, value)
        get_kernel("concat_grad", backend)(KernelContext(op, scope))
        np.testing.assert_array_equal(scope.get("b@GRAD"), g[:, 1:])


MIXED: list[tuple[str, dict[str, Any]]] = [
    ("elementwise_add", {"X": np.ones((2, 3), np.float32), "Y": np.full(3, 0.1)}),
    ("elementwise_div", {"X": np.arange(6).reshape(2, 3), "Y": np.array([2, 4, 5])}),
    ("elementwise_pow", {"X": np.arange(6).reshape(2, 3), "Y": np.array([2])}),
    ("elementwise_mul", {"X": np.arange(6, dtype=np.int32).reshape(2, 3), "Y": np.full(3, 0.5, np.float32)}),
    ("less_than", {"X": np.arange(6).reshape(2, 3), "Y": np.array([2.5])}),
    ("logical_and", {"X": np.array([True, True, False, False]), "Y": np.array([True, False, True, False])}),
    ("logical_or", {"X": np.array([True, True, False, False]), "Y": np.array([True, False, True, False])}),
    ("logical_xor", {"X": np.array([True, True, False, False]), "Y": np.array([1.0, 0.0, 2.0, 0.0])}),
    ("logical_not", {"X": np.array([True, False, True])}),
    ("mean", {"X": np.arange(7, dtype=np.int64)}),
    ("scale", {"X": np.arange(4, dtype=np.int64)}),
    ("tanh", {"X": np.arange(4, dtype=np.int64)}),
    ("sign", {"X": np.array([-3, 0, 2], np.int64)}),
    ("floor", {"X": np.array([-3, 0, 2], np.int64)}),
    ("relu", {"X": np.array([-3, 0, 2], np.int32)}),
    ("increment", {"X": np.array([-1], np.int64)}),
    ("cast", {"X": np.array([1.7, -2.2, 0.0])}),
    ("sum", {"X": [np.ones((2, 2), np.float32), np.full((2, 2), 0.1)]}),
    ("concat", {"X": [np.ones((1, 2), np.float32), np.ones((1, 2))]}),
    ("mul", {"X": np.ones((2, 3), np.float32), "Y": np.full((3, 2), 0.1)}),
]


@pytest.mark.parametrize("op_type,inputs", MIXED, ids=[f"{op}-{i}" for i, (op, _) in enumerate(MIXED)])
def test_integer_bool_and_mixed_dtypes_follow_numpy(op_type: str, inputs: dict[str, Any]) -> None:
    attrs: dict[str, dict[str, Any]] = {"cast": {"out_dtype": "bool"}, "scale": {"scale": 1.5},
                                        "increment": {"step": 1.0}}
    assert_backends_agree(op_type, inputs, {"Out": 1}, attrs.get(op_type, {}))


@pytest.mark.parametrize("op_type", ["adam", "sgd", "momentum"])
def test_float64_learning_rate_with_float32_params_promotes_like_numpy(op_type: str) -> None:
    inputs = cast_floats(optimizer_slots(op_type, np.random.default_rng(3), RNG.standard_normal((4, 3))),
                         np.float32)
    inputs["LearningRate"] = np.array([0.1])  # float64
    assert_backends_agree(op_type, inputs, dict.fromkeys(OPTIMIZER_OUTPUTS[op_type], 1), {})


def test_kernels_do_not_write_into_their_inputs() -> None:
    """`sum` writing its output over an input var, and read-only inputs (as the wire decodes)."""
    for backend in BACKENDS:
        scope = Scope()
        scope.set("g", np.array([1.0, 2.0]))
        decay = np.array([0.5, 0.5])
        decay.flags.writeable = False
        scope.put("decay", decay)
        get_kernel("sum", backend)(KernelContext(Op("sum", {"X": ["g", "decay"]}, {"Out": ["g"]}), scope))
        assert scope.get("g").tolist() == [1.5, 2.5] and decay.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_split_ops_agree(dtype: type) -> None:
    x = cast_floats(RNG.standard_normal((7, 3)), dtype)
    out = assert_backends_agree("split_byref", {"X": x}, {"Out": 3}, {"sections": [2, 4, 1]})
    assert [o.shape[0] for o in out["Out"]] == [2, 4, 1]
    grad = cast_floats(rows(7, [6, 0, 3, 3, 1])(RNG), dtype)
    out = assert_backends_agree("split_selected_rows", {"X": grad}, {"Out": 2},
                                {"height_sections": [3, 4]})
    assert [o.rows.tolist() for o in out["Out"]] == [[0, 1], [3, 0, 0]]


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_split_and_its_gradient_agree(dtype: type) -> None:
    x = RNG.standard_normal((2, 6)).astype(dtype)
    attrs = {"sections": [1, -1, 2], "axis": 1}
    out = assert_backends_agree("split", {"X": x}, {"Out": 3}, attrs)["Out"]
    grads = [RNG.standard_normal(o.shape).astype(dtype) for o in out]
    assert_backends_agree("split_grad", {"X": x, "Out": out, "Out@GRAD": grads}, {"X@GRAD": 1},
                          attrs)


def test_assign_value_is_the_numpy_kernel() -> None:
    """It builds its value from its attributes alone (tests/execution/test_kernels_control.py)."""
    assert get_kernel("assign_value", "torch").__wrapped__ is get_kernel("assign_value", "numpy")


@pytest.mark.parametrize("op_type", ["uniform_random", "gaussian_random", "truncated_gaussian_random"])
@pytest.mark.parametrize("seed", [0, 7])
def test_random_init_draws_the_numpy_backends_values(op_type: str, seed: int) -> None:
    program = Program()
    program.random_seed = 3
    attrs = {"shape": [50, 20], "dtype": "float32", "seed": seed}
    want, got = (run_kernel(b, op_type, {}, {"Out": 1}, attrs, program)["Out"][0] for b in BACKENDS)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


# -- programs
# -----------------------------------------------------------------------------------------
def conditional_program() -> Program:
    """lr = 0.5 if step < 3 else 0.1 through two conditional_blocks; and a non-scalar one."""
    prog = Program()
    g = prog.global_block()
    for name, dtype in [("step", "float32"), ("bound", "float32"), ("cond", "bool"),
                        ("not_cond", "bool"), ("lr", "float32"), ("hi", "float32"), ("lo", "float32")]:
        g.create_var(name, shape=(1,), dtype=dtype)
    for name, value in [("bound", 3.0), ("hi", 0.5), ("lo", 0.1)]:
        g.append_op("fill_constant", {}, {"Out": [name]}, {"shape": [1], "dtype": "float32", "value": value})
    g.append_op("less_than", {"X": ["step"], "Y": ["bound"]}, {"Out": ["cond"]})
    g.append_op("logical_not", {"X": ["cond"]}, {"Out": ["not_cond"]})
    for cond, source in [("cond", "hi"), ("not_cond", "lo")]:
        sub = prog.create_block(parent_idx=0)
        sub.append_op("scale", {"X": [source]}, {"Out": ["lr"]}, {"scale": 2.0})
        prog.rollback()
        g.append_op("conditional_block", {"Cond": [cond], "Input": [source]}, {"Out": ["lr"]},
                    {"sub_block": BlockRef(sub.idx), "is_scalar_condition": True})
    return prog


def test_conditional_block_runs_torch_sub_blocks_like_numpy() -> None:
    prog = conditional_program()
    for step in range(5):
        lrs = [Executor(backend=b).run(prog, feed={"step": np.array([step], np.float32)},
                                       fetch_list=["lr"], scope=Scope())[0] for b in BACKENDS]
        assert lrs[0].dtype == lrs[1].dtype == np.float32
        np.testing.assert_array_equal(lrs[1], lrs[0])
        assert lrs[0].tolist() == pytest.approx([1.0 if step < 3 else 0.2])


def classifier(schedule: str) -> Callable[[], Any]:
    """fc-tanh-fc, softmax_with_cross_entropy, Adam on a decaying learning rate, L2 decay and a
    global-norm clip (squared_l2_norm, sqrt, elementwise max/div on the way)."""
    def body() -> Any:
        x = T.layers.data("x", shape=[6])
        label = T.layers.data("label", shape=[1], dtype="int64")
        hidden = T.layers.fc(x, size=8, act="tanh")
        logits = T.layers.fc(hidden, size=3)
        loss = T.layers.mean(T.layers.softmax_with_cross_entropy(logits, label))
        lr = (T.lr.exponential_decay(0.05, decay_steps=5, decay_rate=0.5) if schedule == "exponential"
              else T.lr.piecewise_decay([5, 12], [0.05, 0.02, 0.01]))
        T.optimizer.Adam(lr, regularization=T.regularizer.L2Decay(1e-3),
                         grad_clip=T.clip.GradientClipByGlobalNorm(1.0)).minimize(loss)
        return loss
    return body


def classifier_batch(step: int) -> dict[str, Any]:
    rng = np.random.default_rng(step % 4)
    x = rng.standard_normal((16, 6)).astype(np.float32)
    return {"x": x, "label": (x[:, :3].argmax(axis=1)[:, None]).astype(np.int64)}


def bag_of_words(optimizer: Callable[[], Any]) -> Callable[[], Any]:
    """A sparse embedding with a padding row, sequence_pool, fc-tanh-fc and a softmax loss."""
    def body() -> Any:
        words = T.layers.data("words", shape=[1], dtype="int64", lod_level=1)
        label = T.layers.data("label", shape=[1], dtype="int64")
        emb = T.layers.embedding(words, size=[20, 8], is_sparse=True, padding_idx=0)
        pooled = T.layers.sequence_pool(emb, "sum")
        hidden = T.layers.fc(pooled, size=8, act="tanh")
        logits = T.layers.fc(hidden, size=3)
        loss = T.layers.mean(T.layers.softmax_with_cross_entropy(logits, label))
        optimizer().minimize(loss)
        return loss
    return body


def text_batch(step: int) -> dict[str, Any]:
    rng = np.random.default_rng(step % 4)
    lengths = [3, 1, 0, 4, 2, 5]
    ids = rng.integers(0, 20, (sum(lengths), 1)).astype(np.int64)
    lod = [[0, *np.cumsum(lengths).tolist()]]
    return {"words": (ids, lod), "label": rng.integers(0, 3, (len(lengths), 1)).astype(np.int64)}


def train(backend: str, main: Program, startup: Program, loss: Any,
          batch: Callable[[int], dict[str, Any]], steps: int = 20, device: str = "cpu",
          ) -> tuple[Scope, list[float]]:
    exe, scope = Executor(backend=backend, device=device), Scope()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed=batch(s), fetch_list=[loss], scope=scope)[0][0])
              for s in range(steps)]
    return scope, losses


def assert_trains_identically(fn: Callable[[], Any], batch: Callable[[int], dict[str, Any]],
                              device: str = "cpu") -> None:
    main, startup, loss = build(fn)
    (ref, ref_losses), (got, got_losses) = (
        train(backend, main, startup, loss, batch, device=dev)
        for backend, dev in [("numpy", "cpu"), ("torch", device)])
    assert np.mean(ref_losses[-4:]) < np.mean(ref_losses[:4])  # it trains (4 batches in turn)
    np.testing.assert_allclose(got_losses, ref_losses, rtol=RTOL)
    params = sorted(p.name for p in main.all_parameters())
    assert params
    for name in params:
        want, have = ref.get(name), got.get(name)
        assert have.dtype == want.dtype == np.float32 and have.shape == want.shape, name
        np.testing.assert_allclose(have, want, rtol=RTOL, atol=PARAM_ATOL, err_msg=name)


@pytest.mark.parametrize("schedule", ["exponential", "piecewise"])
def test_classifier_with_adam_and_lr_schedule_trains_identically(schedule: str) -> None:
    assert_trains_identically(classifier(schedule), classifier_batch)


@pytest.mark.parametrize("make_opt", [lambda: T.optimizer.SGD(0.5), lambda: T.optimizer.Adam(0.05),
                                      lambda: T.optimizer.Momentum(0.1, 0.9)],
                         ids=["sgd", "adam", "momentum"])
def test_sparse_embedding_sequence_pool_model_trains_identically(make_opt: Callable[[], Any]) -> None:
    assert_trains_identically(bag_of_words(make_opt), text_batch)


def convnet() -> Any:
    """Two conv - batch_norm - relu - 2x2 max pool blocks (8 and 16 channels: the pools run
    channels-last on a CPU) and an fc: the gradients read the maxima the forward kept, and relu's
    zeros tie in many windows."""
    x = T.layers.data("x", shape=[64])
    label = T.layers.data("label", shape=[1], dtype="int64")
    h = T.layers.reshape(x, [-1, 1, 8, 8])
    for channels in (8, 16):
        h = T.layers.conv2d(h, channels, 3, padding=1, bias_attr=False)
        h = T.layers.pool2d(T.layers.batch_norm(h, act="relu"), 2, "max", pool_stride=2)
    loss = T.layers.mean(T.layers.softmax_with_cross_entropy(T.layers.fc(h, size=3), label))
    T.optimizer.SGD(0.2).minimize(loss)
    return loss


def image_batch(step: int) -> dict[str, Any]:
    rng = np.random.default_rng(step % 4)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    return {"x": x, "label": (x[:, :3].argmax(axis=1)[:, None]).astype(np.int64)}


def test_convnet_trains_identically() -> None:
    assert_trains_identically(convnet, image_batch)


@pytest.mark.parametrize("name", sorted(T.optimizer.OPTIMIZERS))
def test_every_optimizer_trains_identically(name: str) -> None:
    lr = {"sgd": 0.1, "momentum": 0.05, "adam": 0.1, "adagrad": 0.5, "decayed_adagrad": 0.1,
          "adamax": 0.2, "rmsprop": 0.05, "ftrl": 0.5, "lars_momentum": 0.05}[name]

    def body() -> Any:
        x = T.layers.data("x", shape=[4])
        y = T.layers.data("y", shape=[1])
        pred = T.layers.fc(T.layers.fc(x, size=5, act="relu"), size=1)
        loss = T.layers.mean(T.layers.square_error_cost(pred, y))
        T.optimizer.OPTIMIZERS[name](lr).minimize(loss)
        return loss

    def batch(step: int) -> dict[str, Any]:
        x = np.random.default_rng(step % 4).standard_normal((16, 4)).astype(np.float32)
        return {"x": x, "y": (0.3 * x @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.1).astype(np.float32)}

    assert_trains_identically(body, batch)


# -- devices and a missing torch
# --------------------------------------------------------------------
@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present")
def test_cuda_without_a_gpu_fails_at_construction_and_says_what_to_do() -> None:
    with pytest.raises(DeviceError) as info:
        Executor(backend="torch", device="cuda")
    message = str(info.value)
    assert message.startswith("backend torch device cuda requested but "
                              "torch.cuda.is_available() is False")
    assert "CUDA build of torch" in message and "use device cpu" in message


def test_bad_devices_are_refused_by_name() -> None:
    with pytest.raises(DeviceError, match="unknown device 'gpu'"):
        Executor(backend="torch", device="gpu")
    with pytest.raises(DeviceError, match="device 'meta' is not supported"):
        resolve_device("meta")
    with pytest.raises(ValueError, match="backend numpy runs on the cpu only, not device 'cuda'"):
        Executor(backend="numpy", device="cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_without_torch_the_torch_backend_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets when not installed
    for name in [m for m in sys.modules if m.startswith("runtime.execution.kernels.torch_")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'pslab\[torch\]'"):
        Executor(backend="torch")


TORCH_MODULES = ("runtime.execution.kernels.torch_", "runtime.services.collective_torch")
"""The torch backends (kernels, collective ops): imported only when a scenario asks for torch."""


def test_nothing_outside_the_torch_backend_imports_torch() -> None:
    code = (
        "import importlib, pkgutil, sys\n"
        "import runtime, sim, transpiler\n"
        "for pkg in (runtime, sim, transpiler):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        f"        if not m.name.startswith({TORCH_MODULES!r}):\n"
        "            importlib.import_module(m.name)\n"
        "from runtime.execution.kernels import registered_ops\n"
        "registered_ops('numpy')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_trains_like_numpy() -> None:
    assert_trains_identically(classifier("piecewise"), classifier_batch, device="cuda")
    assert_trains_identically(bag_of_words(lambda: T.optimizer.Adam(0.05)), text_batch, device="cuda")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_kernels_agree_with_numpy() -> None:
    for case in CASES:
        inputs = case_inputs(case, np.float32)
        outputs = dict.fromkeys(case.outputs, 1)
        want, got = (run_kernel(b, case.op, inputs, outputs, case.attrs, device=d)
                     for b, d in [("numpy", "cpu"), ("torch", "cuda")])
        for slot in outputs:
            assert_same(want[slot][0], got[slot][0], f"{case} {slot} on cuda")
        if case.wrt:
            values = grad_inputs(case, inputs, want, np.random.default_rng(1))
            grads = grad_outputs(case, inputs)
            want, got = (run_kernel(b, grad_op(case.op), values, grads, case.attrs, device=d)
                         for b, d in [("numpy", "cpu"), ("torch", "cuda")])
            for slot in grads:
                assert_same(want[slot][0], got[slot][0], f"{case} {slot} on cuda")
