"""Timing mode: the phantom backend yields the shapes numpy computes, and a whole job on phantom
tensors sends the same messages, weighing the same bytes on every link, and ends at the same
simulated time as its numeric twin when the network alone decides; the scale scenario builds.

Jobs run on the virtual loop (`sim.loop.run`) over a simulated `Network`, with no compute model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import pickle
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime import Executor, LoDTensor, Scope, SelectedRows
from runtime.cli import main as runtime_main
from runtime.config.scenario import ScenarioError, load_scenario, parse_scenario
from runtime.execution.kernels import KernelContext, get_kernel, registered_ops
from runtime.execution.kernels.phantom import apportion
from runtime.execution.tensor import (Phantom, Value, concat_rows, nbytes_of, phantom_of, shape_of,
                                      shared_phantom, slice_rows)
from runtime.network.rpc import RpcClient
from runtime.network.wire import Kind, Message, RemoteError, charged_size, decode, encode
from runtime.services.cluster import JobResult, run_job
from runtime.services.job import Job, JobError, check_job
from runtime.services.pserver import PserverService
from sim.loop import run
from sim.cli import main as sim_main
from sim.network import Network
from sim.simulate import simulate as sim_simulate
from transpiler.distribute.edit import append_every_k_steps
from transpiler.ir import Op, OpRole, Program
from transpiler.models import build_model

SCALE = Path(__file__).resolve().parents[2] / "scenarios" / "scale.yaml"
NETWORK = "network: {default: {latency: 200us, bandwidth: 1Gbps}}"
MLP = "{name: mlp, sizes: [64, 96, 10], optimizer: {type: sgd, learning_rate: 0.1}}"
LR_MLP = ("{name: mlp, sizes: [64, 96, 10], optimizer: {type: adam, learning_rate: 0.01}, "
          "lr: {type: exponential_decay, decay_steps: 2, decay_rate: 0.5}}")


# -- the backend -----------------------------------------------------------------------------------
def test_phantom_registers_exactly_the_numpy_ops() -> None:
    assert registered_ops("phantom") == registered_ops("numpy")


def feed_phantoms(feed: dict[str, Any]) -> dict[str, Phantom]:
    return {name: phantom_of(LoDTensor(*value) if isinstance(value, tuple) else value)
            for name, value in feed.items()}


def described(value: Value) -> tuple[Any, ...]:
    p = phantom_of(value)
    return p.shape, p.dtype, p.height, p.lod


MODELS = {
    "linear": {},
    "mlp adam piecewise": {"optimizer": {"type": "adam", "learning_rate": 0.01},
                           "lr": {"type": "piecewise_decay", "boundaries": [3], "values": [0.1, 0.01]}},
    "ctr_dnn sparse": {},
    "ctr_dnn dense": {"is_sparse": False, "optimizer": {"type": "adam", "learning_rate": 0.01}},
    "ctr_dnn v2": {"embedding_v2": True},
    "linear ftrl": {"optimizer": {"type": "ftrl", "learning_rate": 0.01, "l1": 0.1}},
    "word2vec": {},
    "cnn": {},
    "cnn plain": {"batch_norm": False},
    **{f"mlp {opt}": {"optimizer": {"type": opt, "learning_rate": 0.01}}
       for opt in ("momentum", "adagrad", "decayed_adagrad", "adamax", "rmsprop")},
    "mlp lars_momentum": {"optimizer": {"type": "lars_momentum", "learning_rate": 0.01}},
}


def run_model(label: str) -> tuple[Scope, Scope, set[str]]:
    """Startup and one step of a model, by numpy on a real batch and by the phantom kernels on
    its phantoms; the two scopes and the op types run."""
    from runtime.execution.data import dataset_for

    model = build_model(label.split()[0], **MODELS[label])
    feed = dataset_for(model).batch(0, 8, model.feeds)
    real, shapes = Scope(), Scope()
    for exe, scope, batch in ((Executor(), real, feed), (Executor("phantom"), shapes,
                                                          feed_phantoms(feed))):
        exe.run(model.startup, scope=scope)
        exe.run(model.main, feed=batch, scope=scope)
    ops = {op.type for program in (model.startup, model.main) for block in program.blocks
           for op in block.ops}
    return real, shapes, ops


@pytest.mark.parametrize("label", sorted(MODELS))
def test_phantom_kernels_give_every_var_the_shape_numpy_gives(label: str) -> None:
    real, shapes, _ = run_model(label)
    assert set(shapes.names()) == set(real.names())
    for name in real.names():
        assert described(shapes.get_tensor(name)) == described(real.get_tensor(name)), name
    floats = [n for n in shapes.names() if np.dtype(phantom_of(real.get_tensor(n)).dtype).kind == "f"]
    assert all(isinstance(shapes.get_tensor(n), Phantom) for n in floats)


def program_with(vars: dict[str, tuple[list[int], str]]) -> Program:
    program = Program()
    for name, (shape, dtype) in vars.items():
        program.global_block().create_var(name, shape=tuple(shape), dtype=dtype)
    return program


def run_op(backend: str, op: Op, inputs: dict[str, Value], program: Program) -> dict[str, Value]:
    scope = Scope()
    for name, value in inputs.items():
        scope.put(name, value if backend == "numpy" else phantom_of(value))
    get_kernel(op.type, backend)(KernelContext(op, scope, op.type, program))
    return {name: scope.get_tensor(name) for name in op.output_arg_names}


rng = np.random.default_rng(0)
SPARSE = SelectedRows([0, 3, 3, 9], rng.standard_normal((4, 5)).astype(np.float32), 12)
OP_CASES: dict[str, tuple[Op, dict[str, Value], dict[str, tuple[list[int], str]]]] = {
    "split_byref": (Op("split_byref", {"X": ["x"]}, {"Out": ["a", "b"]}, {"sections": [2, 4]}),
                    {"x": rng.standard_normal((6, 3))}, {}),
    "concat": (Op("concat", {"X": ["x", "y"]}, {"Out": ["o"]}, {"axis": 1}),
               {"x": np.ones((2, 3)), "y": np.ones((2, 4))}, {}),
    "concat_grad": (Op("concat_grad", {"X": ["x", "y"], "Out@GRAD": ["g"]}, {"X@GRAD": ["y@GRAD"]},
                       {"axis": 1}),
                    {"x": np.ones((2, 3)), "y": np.ones((2, 4)), "g": np.ones((2, 7))}, {}),
    "reshape": (Op("reshape", {"X": ["x"]}, {"Out": ["o"]}, {"shape": [0, -1, 2]}),
                {"x": np.ones((3, 4, 2))}, {}),
    "reshape_grad": (Op("reshape_grad", {"X": ["x"], "Out@GRAD": ["g"]}, {"X@GRAD": ["x@GRAD"]}),
                     {"x": np.ones((3, 8)), "g": np.ones((3, 4, 2))}, {}),
    "sum of rows": (Op("sum", {"X": ["a", "b"]}, {"Out": ["o"]}), {"a": SPARSE, "b": SPARSE}, {}),
    "scale of rows": (Op("scale", {"X": ["a"]}, {"Out": ["o"]}, {"scale": 0.5}), {"a": SPARSE}, {}),
    "sgd of rows": (Op("sgd", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]},
                       {"ParamOut": ["p"]}),
                    {"p": np.ones((12, 5), np.float32), "g": SPARSE,
                     "lr": np.array([0.1], np.float32)}, {}),
    "sequence_pool max": (Op("sequence_pool", {"X": ["x"]}, {"Out": ["o"], "MaxIndex": ["i"]},
                             {"pooltype": "MAX"}),
                          {"x": LoDTensor(np.ones((5, 2), np.float32), [[0, 2, 5]])},
                          {"o": ([-1, 2], "float32"), "i": ([-1, 2], "int32")}),
    "merge_ids": (Op("merge_ids", {"Ids": ["ids"], "Rows": ["r"], "X": ["x"]}, {"Out": ["o"]}),
                  {"ids": LoDTensor(np.array([[1], [2], [1]]), [[0, 1, 3]]),
                   "r": np.array([[1], [2]]), "x": np.ones((2, 4), np.float32)},
                  {"o": ([-1, 4], "float32")}),
    "clip_by_norm": (Op("clip_by_norm", {"X": ["x"]}, {"Out": ["o"]}, {"max_norm": 1.0}),
                     {"x": np.ones((3, 2), np.float32)}, {"x": ([-1, 2], "float32"),
                                                          "o": ([-1, 2], "float32")}),
    "ref_by_trainer_id": (Op("ref_by_trainer_id", {"X": ["a", "b"], "TrainerId": ["t"]},
                             {"Out": ["o"]}),
                          {"a": np.ones((4, 2), np.float32), "b": np.ones((4, 2), np.float32),
                           "t": np.array([1])}, {}),
    "fake_init": (Op("fake_init", {}, {"Out": ["o"]}, {"shape": [7, 3], "dtype": "float32"}), {}, {}),
}


POSITIVE = rng.uniform(0.5, 1.5, (3, 2)).astype(np.float32)
ROW = rng.uniform(0.5, 1.5, 2).astype(np.float32)
BATCH = ([-1, 2], "float32")


def _unary(op_type: str) -> None:
    OP_CASES[op_type] = (Op(op_type, {"X": ["x"]}, {"Out": ["o"]},
                            {"min": 0.7, "max": 1.2, "out_dtype": "float32"}),
                         {"x": POSITIVE}, {"x": BATCH, "o": BATCH})
    OP_CASES[op_type + "_grad"] = (
        Op(op_type + "_grad", {"X": ["x"], "Out": ["o"], "Out@GRAD": ["g"]}, {"X@GRAD": ["x@GRAD"]},
           {"min": 0.7, "max": 1.2, "out_dtype": "float32"}),
        {"x": POSITIVE, "o": POSITIVE, "g": POSITIVE}, {})


def _binary(op_type: str) -> None:
    OP_CASES[op_type] = (Op(op_type, {"X": ["x"], "Y": ["y"]}, {"Out": ["o"]}),
                         {"x": POSITIVE, "y": ROW}, {"x": BATCH, "y": ([2], "float32"), "o": BATCH})
    OP_CASES[op_type + "_grad"] = (
        Op(op_type + "_grad", {"X": ["x"], "Y": ["y"], "Out": ["o"], "Out@GRAD": ["g"]},
           {"X@GRAD": ["x@GRAD"], "Y@GRAD": ["y@GRAD"]}),
        {"x": POSITIVE, "y": ROW, "o": POSITIVE, "g": POSITIVE}, {})


for _op in ("relu", "tanh", "sigmoid", "exp", "log", "sqrt", "square", "cos", "clip", "scale",
            "cast", "assign", "gelu", "silu", "leaky_relu", "elu", "softplus", "brelu", "softsign"):
    _unary(_op)
for _op in ("floor", "ceil", "sign"):
    OP_CASES[_op] = (Op(_op, {"X": ["x"]}, {"Out": ["o"]}), {"x": POSITIVE}, {"x": BATCH, "o": BATCH})
for _op in ("add", "sub", "mul", "div", "max", "min", "pow"):
    _binary("elementwise_" + _op)
BOOLS = ([-1, 2], "bool")
for _op in ("logical_and", "logical_or", "logical_xor", "less_than"):
    OP_CASES[_op] = (Op(_op, {"X": ["x"], "Y": ["y"]}, {"Out": ["o"]}),
                     {"x": POSITIVE > 1, "y": POSITIVE < 1}, {"x": BOOLS, "y": BOOLS, "o": BOOLS})
OP_CASES["logical_not"] = (Op("logical_not", {"X": ["x"]}, {"Out": ["o"]}), {"x": POSITIVE > 1},
                           {"x": BOOLS, "o": BOOLS})
OP_CASES["squared_l2_norm_grad"] = (
    Op("squared_l2_norm_grad", {"X": ["x"], "Out@GRAD": ["g"]}, {"X@GRAD": ["x@GRAD"]}),
    {"x": POSITIVE, "g": np.ones(1, np.float32)}, {})
OP_CASES["squared_l2_norm"] = (Op("squared_l2_norm", {"X": ["x"]}, {"Out": ["o"]}),
                               {"x": POSITIVE}, {"o": ([1], "float32")})
# fluid 1.8's layer writes cross_entropy2, so the models below no longer run fluid 1.2's op
OP_CASES["cross_entropy"] = (
    Op("cross_entropy", {"X": ["x"], "Label": ["l"]}, {"Y": ["y"]}),
    {"x": POSITIVE, "l": np.array([[0], [1], [1]])},
    {"x": ([-1, 2], "float32"), "y": ([-1, 1], "float32")})
OP_CASES["cross_entropy_grad"] = (
    Op("cross_entropy_grad", {"X": ["x"], "Label": ["l"], "Y": ["y"], "Y@GRAD": ["g"]},
       {"X@GRAD": ["x@GRAD"]}),
    {"x": POSITIVE, "l": np.array([[0], [1], [1]]), "y": POSITIVE[:, :1], "g": POSITIVE[:, :1]}, {})
OP_CASES["sequence_pool_grad"] = (
    Op("sequence_pool_grad", {"X": ["x"], "Out": ["o"], "Out@GRAD": ["g"]}, {"X@GRAD": ["x@GRAD"]},
       {"pooltype": "SUM"}),
    {"x": LoDTensor(POSITIVE, [[0, 1, 3]]), "o": POSITIVE[:2], "g": POSITIVE[:2]}, {})
for _op in ("lookup_sparse_table", "lookup_sparse_table_read"):  # the latter: 2.x's name
    OP_CASES[_op] = (Op(_op, {"W": ["w"], "Ids": ["i"]}, {"Out": ["o"]}),
                     {"w": POSITIVE, "i": np.array([[2], [0]])}, {})
for _op in ("gaussian_random", "truncated_gaussian_random"):
    OP_CASES[_op] = (Op(_op, {}, {"Out": ["o"]}, {"shape": [4, 3], "dtype": "float64"}), {},
                     {"o": ([4, 3], "float64")})
OP_CASES["fill_constant_batch_size_like"] = (
    Op("fill_constant_batch_size_like", {"Input": ["i"]}, {"Out": ["o"]},
       {"shape": [-1, 5], "dtype": "float32", "value": 1.0}),
    {"i": LoDTensor(POSITIVE, [[0, 1, 3]])}, {"o": ([-1, 5], "float32")})
OP_CASES["top_k"] = (Op("top_k", {"X": ["x"]}, {"Out": ["o"], "Indices": ["i"]}, {"k": 1}),
                     {"x": POSITIVE}, {"x": BATCH, "o": ([-1, 1], "float32"),
                                       "i": ([-1, 1], "int64")})
OP_CASES["accuracy"] = (  # a script's total: create_tensor declares no shape
    Op("accuracy", {"Out": ["v"], "Indices": ["i"], "Label": ["l"]},
       {"Accuracy": ["a"], "Correct": ["c"], "Total": ["t"]}),
    {"v": POSITIVE[:, :1], "i": np.array([[0], [1], [1]]), "l": np.array([[0], [1], [0]])},
    {"t": ([], "int64")})
OP_CASES["auc"] = (
    Op("auc", {"Predict": ["p"], "Label": ["l"], "StatPos": ["sp"], "StatNeg": ["sn"]},
       {"AUC": ["a"], "StatPosOut": ["sp"], "StatNegOut": ["sn"]},
       {"num_thresholds": 7, "slide_steps": 2}),
    {"p": POSITIVE / 2, "l": np.array([[0], [1], [1]]), "sp": np.zeros(25, np.int64),
     "sn": np.zeros(25, np.int64)}, {})
OP_CASES["assign_value"] = (
    Op("assign_value", {}, {"Out": ["o"]},
       {"shape": [2, 3], "dtype": "float32", "fp32_values": [0.5, 1, 2, 3, 4, 5]}), {},
    {"o": ([2, 3], "float32")})



def _with_grad(op_type: str, inputs: dict[str, Any], outputs: dict[str, int],
               wrt: tuple[str, ...], attrs: dict[str, Any], loss: str) -> None:
    """Cases for `op_type` and its grad op (fed the numpy forward's outputs and a gradient of
    `loss`); var ``s{i}`` is slot s's i-th."""
    ins = {slot: [f"{slot}{i}" for i in range(len(v) if isinstance(v, list) else 1)]
           for slot, v in inputs.items()}
    values = {f"{slot}{i}": v for slot, vs in inputs.items()
              for i, v in enumerate(vs if isinstance(vs, list) else [vs])}
    outs = {slot: [f"{slot}{i}" for i in range(n)] for slot, n in outputs.items()}
    op = Op(op_type, ins, outs, attrs)
    OP_CASES[op_type] = (op, values, {})
    forward = run_op("numpy", op, values, Program())
    grads = {f"{n}@GRAD": np.ones(forward[n].shape) for n in outs[loss]}
    OP_CASES[op_type + "_grad"] = (
        Op(op_type + "_grad", {**ins, **outs, f"{loss}@GRAD": list(grads)},
           {f"{s}@GRAD": [f"{n}@GRAD" for n in ins[s]] for s in wrt}, attrs),
        {**values, **forward, **grads}, {})


for _op, _ins, _outs, _wrt, _attrs, _loss in [
    ("layer_norm", {"X": POSITIVE, "Scale": np.ones(2), "Bias": np.ones(2)},
     {"Y": 1, "Mean": 1, "Variance": 1}, ("X", "Scale", "Bias"), {}, "Y"),
    ("dropout", {"X": POSITIVE}, {"Out": 1, "Mask": 1}, ("X",), {"dropout_prob": 0.5}, "Out"),
    ("matmul", {"X": np.ones((2, 3, 4)), "Y": np.ones((5, 4))}, {"Out": 1}, ("X", "Y"),
     {"transpose_Y": True}, "Out"),
    ("matmul_v2", {"X": np.ones((4, 3)), "Y": np.ones((2, 4, 5))}, {"Out": 1}, ("X", "Y"),
     {"trans_x": True}, "Out"),
    ("transpose2", {"X": np.ones((2, 3, 4))}, {"Out": 1, "XShape": 1}, ("X",),
     {"axis": [2, 0, 1]}, "Out"),
    ("reshape2", {"X": np.ones((2, 3, 4))}, {"Out": 1, "XShape": 1}, ("X",), {"shape": [-1, 4]},
     "Out"),
    ("squeeze2", {"X": np.ones((2, 1, 3))}, {"Out": 1, "XShape": 1}, ("X",), {"axes": [1]}, "Out"),
    ("unsqueeze2", {"X": np.ones((2, 3))}, {"Out": 1, "XShape": 1}, ("X",), {"axes": [0, 2]},
     "Out"),
    ("split", {"X": np.ones((2, 6))}, {"Out": 3}, ("X",), {"sections": [1, -1, 3], "axis": 1},
     "Out"),
    ("slice", {"Input": np.ones((3, 5, 4))}, {"Out": 1}, ("Input",),
     {"axes": [1, 2], "starts": [1, 0], "ends": [-1, 1], "decrease_axis": [2]}, "Out"),
    ("gather", {"X": np.ones((5, 3)), "Index": np.array([[1], [4], [1]])}, {"Out": 1}, ("X",), {},
     "Out"),
    ("sigmoid_cross_entropy_with_logits", {"X": POSITIVE, "Label": POSITIVE}, {"Out": 1}, ("X",),
     {}, "Out"),
    ("hierarchical_sigmoid", {"X": POSITIVE, "W": np.ones((2, 2)), "Label": np.array([[0], [2], [1]]),
                              "Bias": np.ones((2, 1))}, {"Out": 1, "PreOut": 1},
     ("X", "W", "Bias"), {"num_classes": 3}, "Out"),
    ("reduce_sum", {"X": np.ones((2, 3, 4))}, {"Out": 1}, ("X",),
     {"dim": [1, -1], "keep_dim": False, "reduce_all": False}, "Out"),
    ("reduce_mean", {"X": np.ones((2, 3))}, {"Out": 1}, ("X",),
     {"dim": [0], "keep_dim": True, "reduce_all": True}, "Out"),
    ("sequence_conv", {"X": LoDTensor(np.ones((5, 2)), [[0, 2, 5]]), "Filter": np.ones((6, 4))},
     {"Out": 1}, ("X", "Filter"), {"contextLength": 3, "contextStart": -1}, "Out"),
    ("cos_sim", {"X": POSITIVE, "Y": ROW[None, :]}, {"Out": 1, "XNorm": 1, "YNorm": 1},
     ("X", "Y"), {}, "Out"),
    ("nce", {"Input": POSITIVE, "Label": np.array([[1, 0]] * 3), "Weight": np.ones((4, 2)),
             "Bias": np.ones((4, 1))}, {"Cost": 1, "SampleLogits": 1, "SampleLabels": 1},
     ("Input", "Weight", "Bias"), {"num_total_classes": 4, "num_neg_samples": 3}, "Cost"),
]:
    _with_grad(_op, _ins, _outs, _wrt, _attrs, _loss)


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_ops_give_the_shapes_numpy_gives(case: str) -> None:
    op, inputs, declared = OP_CASES[case]
    program = program_with(declared)
    numeric = run_op("numpy", op, inputs, program)
    shapes = run_op("phantom", op, inputs, program)
    assert {n: described(v) for n, v in shapes.items()} == \
        {n: described(v) for n, v in numeric.items()}


def test_split_ops_share_rows_in_proportion_to_the_sections() -> None:
    """Which rows or ids a phantom holds is unknown: each section gets its share."""
    assert apportion(10, [5, 3, 2]) == [5, 3, 2]
    assert apportion(7, [1, 1, 1]) == [3, 2, 2]
    assert sum(apportion(1001, [3, 5, 7, 11])) == 1001
    rows = Op("split_selected_rows", {"X": ["g"]}, {"Out": ["a", "b"]}, {"height_sections": [9, 3]})
    out = run_op("phantom", rows, {"g": SPARSE}, Program())
    assert [described(out[n]) for n in "ab"] == [((3, 5), np.dtype("float32"), 9, ()),
                                                 ((1, 5), np.dtype("float32"), 3, ())]
    ids = Op("split_ids", {"Ids": ["i"]}, {"Out": ["a", "b"]}, {"height_sections": [50, 150]})
    out = run_op("phantom", ids, {"i": np.zeros((8, 1), np.int64)}, Program())
    assert [shape_of(out[n]) for n in "ab"] == [(2, 1), (6, 1)]
    delta = Op("sparse_delta", {"X": ["p"], "Y": ["old"]}, {"Out": ["d"]}, {"scale": 0.5})
    table = np.ones((12, 5), np.float32)
    out = run_op("phantom", delta, {"p": table, "old": table}, Program())
    assert described(out["d"]) == ((12, 5), np.dtype("float32"), 12, ())  # every row, at most


def test_every_op_is_checked_against_numpy() -> None:
    covered = {op.type for op, _, _ in OP_CASES.values()}
    covered |= {"split_selected_rows", "split_ids", "sparse_delta"}  # by proportion, above
    covered |= {"conditional_block", "increment"}  # control values, below
    covered |= {"save"}  # refuses, below
    for label in MODELS:
        covered |= run_model(label)[2]
    assert covered == set(registered_ops("numpy"))


def test_control_values_stay_real_so_every_k_steps_keeps_its_schedule() -> None:
    """Geo-SGD's push every k steps: the int64 step counter and the condition are computed for
    real; a phantom condition is taken to hold."""
    main, startup = Program(), Program()
    for program in (main, startup):
        program.global_block().create_var("pushes", shape=(1,), dtype="int64", persistable=True)
        program.global_block().create_var("x", shape=(4,), dtype="float32", persistable=True)
    startup.global_block().append_op("fill_constant", {}, {"Out": ["pushes"]},
                                     {"shape": [1], "dtype": "int64", "value": 0.0})
    startup.global_block().append_op("fill_constant", {}, {"Out": ["x"]},
                                     {"shape": [4], "dtype": "float32", "value": 1.0})

    def body(sub: Any) -> None:
        sub.append_op("increment", {"X": ["pushes"]}, {"Out": ["pushes"]}, {"step": 1.0})
        sub.append_op("scale", {"X": ["x"]}, {"Out": ["x"]}, {"scale": 2.0})

    append_every_k_steps(main, startup, "@STEP@", 3, body, OpRole.Dist)
    exe, scope = Executor("phantom"), Scope()
    exe.run(startup, scope=scope)
    for _ in range(7):
        exe.run(main, scope=scope)
    assert scope.get("pushes").tolist() == [2] and scope.get("@STEP@").tolist() == [1]
    assert scope.get("x") == Phantom((4,), np.float32)
    scope.put("@STEP@@GO", Phantom((1,), np.bool_))
    cond = main.global_block().ops[-1]
    get_kernel("conditional_block", "phantom")(KernelContext(cond, scope, "", main, lambda idx:
                                                             exe.run_block(main, idx, scope)))
    assert scope.get("pushes").tolist() == [3]


def test_save_refuses_a_phantom() -> None:
    op = Op("save", {"X": ["x"]}, {}, {"file_path": "/nonexistent/x.npy"})
    with pytest.raises(TypeError, match="phantom of 24 bytes"):
        run_op("phantom", op, {"x": np.ones((2, 3), np.float32)}, Program())


# -- tensors and the wire --------------------------------------------------------------------------
def test_shape_of_and_nbytes_of_describe_every_kind_of_value() -> None:
    array = np.ones((4, 3), np.float32)
    values: list[Value] = [array, LoDTensor(array, [[0, 1, 4]]), SelectedRows([2, 0], array[:2], 9),
                           Phantom((4, 3), np.float32), Phantom((2, 3), np.float32, height=9)]
    assert [shape_of(v) for v in values] == [(4, 3), (4, 3), (2, 3), (4, 3), (2, 3)]
    assert [nbytes_of(v) for v in values] == [48, 48, 24 + 16, 48, 24 + 16]
    assert [nbytes_of(phantom_of(v)) for v in values[:3]] == [48, 48, 40]


def test_equal_phantoms_made_for_ops_and_blocks_are_one_object() -> None:
    """`shared_phantom` gives the phantom `Phantom(...)` would, made once; a dense phantom is
    its own dense form."""
    made = shared_phantom([4, 3], "float32")
    assert made == Phantom((4, 3), np.dtype("float32")) and type(made.shape[0]) is int
    assert shared_phantom((4, 3), np.float32) is made is shared_phantom((4, 3), np.dtype("<f4"))
    assert shared_phantom((4, 3), "float64") is not made
    with_lod = shared_phantom((4, 3), "float32", ((0, 1, 4),))
    assert with_lod.lod == ((0, 1, 4),) and with_lod is not made
    assert shared_phantom((4, 3), "float32", [[0, 1, 4]]) == with_lod  # lists: not kept, as good
    assert made.dense() is made and with_lod.dense() is made
    assert Phantom((2, 3), np.float32, height=9).dense() is shared_phantom((9, 3), np.float32)
    block = slice_rows(made, 1, 3)
    assert block == Phantom((2, 3), np.float32) and slice_rows(made, 1, 3) is block
    assert concat_rows([block, block]) is made
    with pytest.raises(ValueError, match="negative"):
        shared_phantom((-1, 3), "float32")


def test_a_phantom_hashes_as_its_fields_do_however_often_and_wherever_it_goes() -> None:
    phantom = Phantom((5, 2), np.dtype("int64"), lod=((0, 2, 5),))
    fields = hash((phantom.shape, phantom.dtype, phantom.height, phantom.lod))
    assert hash(phantom) == hash(phantom) == fields == phantom.__dict__["_hash"]  # kept
    again = pickle.loads(pickle.dumps(phantom))
    assert again == phantom and hash(again) == fields and {phantom: 1}[again] == 1
    assert dataclasses.asdict(again) == {"shape": (5, 2), "dtype": np.dtype("int64"),
                                         "height": None, "lod": ((0, 2, 5),)}
    assert hash(dataclasses.replace(phantom, lod=())) == hash(Phantom((5, 2), np.int64))


@pytest.mark.parametrize("value", [np.ones((3, 4), np.float16),
                                   LoDTensor(np.arange(5).reshape(5, 1), [[0, 2, 5]]),
                                   SelectedRows([4, 1, 4], np.ones((3, 2), np.float32), 6)],
                         ids=["dense", "lod", "rows"])
def test_a_phantom_is_charged_exactly_what_its_numeric_twin_weighs(value: Value) -> None:
    def message(v: Value) -> Message:
        return Message(Kind.SEND, 5, "trainer:3", 2, {"g": v, "b": np.ones(2)}, {"trainer": 3})

    numeric, timing = encode(message(value)), encode(message(phantom_of(value)))
    assert len(timing) < len(numeric)  # the phantom carries no frame
    assert charged_size(timing) == charged_size(numeric) == sum(len(memoryview(f).cast("B"))
                                                                for f in numeric)
    assert decode(timing).vars["g"] == phantom_of(value)


# -- jobs --------------------------------------------------------------------------------------------
def job_text(model: str, mode: str, kernels: str, steps: int = 4, trainers: int = 2,
             pservers: int = 2) -> str:
    return f"""
name: twin
seed: 3
model: {model}
data: {{batch_size: 8}}
cluster: {{pservers: {pservers}, trainers: {trainers}}}
transpiler: {{mode: {mode}}}
train: {{steps: {steps}}}
backend: {{kernels: {kernels}}}
{NETWORK}
"""


def simulate(job: Job) -> tuple[JobResult, float, Network]:
    network = Network.from_spec(job.scenario.network, job.scenario.seed)

    async def main() -> tuple[JobResult, float]:
        result = await run_job(job, network.transport)
        return result, asyncio.get_running_loop().time()

    result, end = run(main())
    return result, end, network


def links(network: Network) -> dict[tuple[str, str], tuple[int, int]]:
    return {key: (s.messages, s.bytes) for key, s in network.link_stats().items()}


TWINS = {
    "sync": (MLP, "sync"),
    "sync, LR decay": (LR_MLP, "sync"),
    "async, LR counters": (LR_MLP, "async"),
    "half_async": (MLP, "half_async"),
    "geo, push every 2": (MLP, "geo, geo_push_every: 2"),
    "dc_asgd": (MLP, "async, dc_asgd: true"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("label", sorted(TWINS))
def test_timing_run_sends_what_the_numeric_run_sends(label: str) -> None:
    model, mode = TWINS[label]
    numeric, n_end, n_net = simulate(Job.from_scenario(parse_scenario(job_text(model, mode, "numpy"))))
    timing, t_end, t_net = simulate(Job.from_scenario(parse_scenario(job_text(model, mode, "phantom"))))
    assert links(t_net) == links(n_net)
    assert t_end == n_end > 0
    assert [(s.messages, s.bytes_in, s.bytes_out, s.steps, s.errors) for s in timing.pservers] == \
        [(s.messages, s.bytes_in, s.bytes_out, s.steps, s.errors) for s in numeric.pservers]
    assert [r.step_times for r in timing.trainers] == [r.step_times for r in numeric.trainers]
    assert all(len(r.losses) == 4 and all(math.isnan(x) for x in r.losses) for r in timing.trainers)
    assert all(np.isfinite(r.losses).all() for r in numeric.trainers)
    assert timing.params == {} and numeric.params


@pytest.mark.timeout(60)
@pytest.mark.parametrize("table,rel", [("is_sparse: true", 0.01), ("is_distributed: true", 0.1)])
def test_jobs_with_embeddings_run_in_timing_mode(table: str, rel: float) -> None:
    """Sparse grads are cut by proportion: the same messages, and about the same bytes; a
    distributed table is asked a row per id, not per distinct id: somewhat more bytes."""
    model = f"{{name: ctr_dnn, vocab: 5000, embed_dim: 8, hidden: [16], {table}}}"
    numeric, _, n_net = simulate(Job.from_scenario(parse_scenario(job_text(model, "sync", "numpy"))))
    timing, _, t_net = simulate(Job.from_scenario(parse_scenario(job_text(model, "sync", "phantom"))))
    assert {k: m for k, (m, _) in links(t_net).items()} == {k: m for k, (m, _) in links(n_net).items()}
    n_bytes, t_bytes = (sum(b for _, b in links(net).values()) for net in (n_net, t_net))
    assert n_bytes <= t_bytes <= n_bytes * (1 + rel)
    assert all(s.steps == 4 and s.errors == 0 for s in timing.pservers)


def test_a_pserver_checks_phantoms_like_tensors() -> None:
    job = Job.from_scenario(parse_scenario(job_text(MLP, "sync", "phantom", trainers=1, pservers=1)))
    main, startup = job.pserver_programs(0)
    grad = main.global_block().var("mlp.fc1.w@GRAD")
    network = Network()

    async def scenario() -> list[str]:
        server = PserverService(main, startup, network.transport("pserver:0"), Executor("phantom"))
        serving = asyncio.get_running_loop().create_task(server.serve(job.endpoints[0]))
        client = RpcClient(network.transport("trainer:0"))
        await client.connect(job.endpoints)
        answers = []
        for value in (Phantom(grad.shape, np.float64), Phantom((3,) + grad.shape[1:], np.float32),
                      Phantom((2,) + grad.shape[1:], np.float32, height=grad.shape[0] - 1),
                      Phantom(grad.shape, np.float32), Phantom(grad.shape, np.float64),
                      Phantom(grad.shape, np.float32)):
            try:
                await client.call(job.endpoints[0], Kind.SEND, 0, {grad.name: value},
                                  {"trainer": 0})
                answers.append("ok")
            except RemoteError as exc:
                answers.append(f"{exc.var}: {exc.detail}")
        await client.close()
        serving.cancel()
        return answers

    *refused, accepted, refused_again, accepted_again = run(scenario())
    assert accepted == accepted_again == "ok" and refused_again == refused[0]
    assert refused == [f"mlp.fc1.w@GRAD: var 'mlp.fc1.w@GRAD': expected float32[96, 10], got "
                       f"phantom {got}" for got in ("float64[96, 10]", "float32[3, 10]",
                                                    "float32[2, 10] rows of height 95")]


# -- scenarios -------------------------------------------------------------------------------------
def test_timing_mode_is_for_the_simulator_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        runtime_main(["up", str(SCALE)])
    assert exit.value.code == 2
    assert "backend.kernels phantom is timing mode" in capsys.readouterr().err
    with pytest.raises(ScenarioError, match="expect.final_loss_below needs numbers"):
        parse_scenario(job_text(MLP, "sync", "phantom") + "expect: {final_loss_below: 0.5}")


W2V_PREFETCH = ("{name: word2vec, vocab: 500, embed_dim: 8, nce: true, is_sparse: true, "
                "remote_prefetch: true}")


def test_a_remote_prefetch_in_timing_mode_is_refused_before_the_job_starts(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An nce or a lookup marked remote_prefetch fetches the rows of real ids (sampled classes)
    from the pservers; phantom kernels draw none, so `check_job` (which `sim run`, `sim sweep`
    and `runtime up` call first) and `simulate` refuse the job, naming the op and the table."""
    refused = "has remote_prefetch, which timing mode (backend.kernels: phantom) cannot run"
    scenario = parse_scenario(job_text(W2V_PREFETCH, "sync", "phantom"))
    with pytest.raises(JobError, match=f"nce of 'w2v.nce.w' {re.escape(refused)}.*"
                                       "use backend.kernels numpy or torch"):
        check_job(scenario)
    with pytest.raises(JobError, match="nce of 'w2v.nce.w'"):
        sim_simulate(scenario)
    path = tmp_path / "w2v.yaml"
    path.write_text(job_text(W2V_PREFETCH, "sync", "phantom"))
    with pytest.raises(SystemExit) as exit:
        sim_main(["run", str(path), "--out", str(tmp_path / "out")])
    assert exit.value.code == 2 and refused in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

    table = Job.from_scenario(parse_scenario(job_text(
        "{name: ctr_dnn, vocab: 500, embed_dim: 8, hidden: [16], shared_table: true}", "async",
        "phantom")))
    for op in table.model.main.global_block().ops:
        if op.type == "lookup_table":
            op.attrs["remote_prefetch"] = True
    with pytest.raises(JobError, match=f"lookup_table of 'ctr.emb' {re.escape(refused)}"):
        table.check_timing()

    # numeric kernels fetch real rows; geo mode and the collective modes prefetch nothing
    check_job(parse_scenario(job_text(W2V_PREFETCH, "sync", "numpy")))
    check_job(parse_scenario(job_text(W2V_PREFETCH, "geo", "phantom")))


@pytest.mark.timeout(120)
def test_the_scale_scenario_builds_every_role() -> None:
    """1,000 trainers and 100 pservers; fc0.w is cut into 100 blocks of 32 KiB, so every
    pserver serves a part of the model."""
    scenario = load_scenario(SCALE)
    start = time.perf_counter()
    job = Job.from_scenario(scenario)
    trainers = [job.trainer_programs(i) for i in range(job.trainers)]
    pservers = [job.pserver_programs(j) for j in range(len(job.endpoints))]
    seconds = time.perf_counter() - start
    assert (len(trainers), len(pservers)) == (1000, 100) and job.timing
    fc0 = [[var.shape for name, var in main.global_block().vars.items()
            if name.startswith("mlp.fc0.w.block")] for main, _ in pservers]
    assert fc0 == [[(16, 512)]] * 100
    assert seconds < 60


@pytest.mark.timeout(60)
def test_a_reduced_scale_run_completes_on_the_virtual_loop() -> None:
    """The scale scenario with 100 trainers, 10 pservers and 3 steps: every pserver answers
    each trainer's startup GET of its blocks (one, carrying the fetch barrier: protocol
    bundled), a SEND of its blocks each step, which carries the step's GET (async mode fetches
    a var block by block: each block's GET rides on the SEND to its pserver), its COMPLETE
    and its BYE."""
    steps, trainers = 3, 100
    scenario = load_scenario(SCALE, [f"cluster.trainers={trainers}", "cluster.pservers=10",
                                     f"train.steps={steps}", "train.protocol=bundled"])
    job = Job.from_scenario(scenario)
    result, end, _ = simulate(job)
    assert [s.messages for s in result.pservers] == [trainers * (1 + steps + 2)] * 10
    assert all(s.errors == 0 for s in result.pservers)
    assert all(len(r.losses) == steps and all(math.isnan(x) for x in r.losses)
               for r in result.trainers)
    assert 0 < max(t for r in result.trainers for t in r.step_times) < end
