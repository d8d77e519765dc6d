"""fluid 1.x names a ported script (and fluid's own transpiler test) reaches for: operator slot
names, the LR schedules under ``fluid.layers``, the reductions and
``fill_constant_batch_size_like``, ``Block.create_parameter``, the transpiler's lookup-table
answers, a program's distributed attributes, ``fluid.core`` and per-parameter clipping. Each is
checked for the ops it writes and, where it computes, against numpy formulas and finite
differences."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from distribute_helpers import PS1, PS2, PSERVERS, basic, lookup_model, transpile, types
from gradcheck import BACKENDS, check_grad, run_op
from program_helpers import build

import runtime.paddle.fluid as fluid
import transpiler as T
from runtime import LoDTensor, Scope
from runtime.execution.executor import Executor
from transpiler.ir import Program, op_types


def ops_of(block: T.Block, op_type: str) -> list[T.Op]:
    return [op for op in block.ops if op.type == op_type]


# -- Operator.input_names / output_names / all_attrs ------------------------------------------------

def test_an_op_names_its_slots_and_hands_out_its_attributes() -> None:
    main, _ = basic()
    sgd = ops_of(main.global_block(), "sgd")[0]
    assert sgd.input_names == ["Param", "Grad", "LearningRate"]
    assert sgd.output_names == ["ParamOut"]
    mul = ops_of(main.global_block(), "mul")[0]
    assert mul.input_names == ["X", "Y"] and mul.output_names == ["Out"]
    attrs = mul.all_attrs()
    assert attrs["x_num_col_dims"] == 1 and mul.has_attr("x_num_col_dims")
    attrs["x_num_col_dims"] = 5  # a copy
    assert mul.attr("x_num_col_dims") == 1 and not mul.has_attr("nope")


def test_every_optimized_param_appears_on_a_pserver_by_its_param_slot() -> None:
    """What fluid's test asks with ``"Param" in op.input_names``."""
    main, startup = basic()
    t = transpile((main, startup))
    on_pservers = {op.input("Param")[0].split(".block")[0]
                   for ep in (PS1, PS2) for block in t.get_pserver_program(ep).blocks
                   for op in block.ops if "Param" in op.input_names}
    assert on_pservers == {op.input("Param")[0] for op in main.global_block().ops
                           if "Param" in op.input_names} == {"fc_w", "fc_b"}


def test_the_listen_op_lists_its_optimize_blocks_by_index() -> None:
    t = transpile(basic(lambda: T.optimizer.SGD(fluid.layers.piecewise_decay([10, 20],
                                                                             [1.0, 0.5, 0.1]))))
    ps = t.get_pserver_program(PS1)
    listen = ps.global_block().ops[0]
    optimize = [b.idx for b in listen.all_attrs()["optimize_blocks"]]
    assert optimize and all(0 < i < ps.num_blocks for i in optimize)
    for idx in set(range(1, ps.num_blocks)) - set(optimize):  # the schedule's branches
        assert op_types(ps.block(idx)) == ["assign"]


# -- fluid.layers' learning-rate schedules --------------------------------------------------------

def test_fluid_layers_carries_the_schedules_and_every_layer() -> None:
    for name in fluid.LR_SCHEDULES:
        assert getattr(fluid.layers, name) is getattr(T.lr, name)
    for name in T.layers.__all__:
        assert getattr(fluid.layers, name) is getattr(T.layers, name)


def rates(make_lr, steps: int) -> list[float]:  # type: ignore[no-untyped-def]
    """The schedule's value at steps 0 .. steps-1 (one main-program run per step)."""
    main, startup, lr = build_lr(make_lr)
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    return [float(exe.run(main, fetch_list=[lr.name], scope=scope)[0].reshape(-1)[0])
            for _ in range(steps)]


def build_lr(make_lr):  # type: ignore[no-untyped-def]
    main, startup = Program(), Program()
    with T.program_guard(main, startup), T.unique_name.guard():
        lr = make_lr()
    return main, startup, lr


def test_exponential_decay_writes_fluids_ops_and_rates() -> None:
    main, _, _ = build_lr(lambda: fluid.layers.exponential_decay(
        learning_rate=1.0, decay_steps=2100, decay_rate=0.1, staircase=True))
    assert op_types(main.global_block()) == [
        "increment", "cast", "fill_constant", "elementwise_div", "floor", "fill_constant",
        "elementwise_pow", "fill_constant", "elementwise_mul"]
    assert all(op.role == T.OpRole.LRSched for op in main.global_block().ops)
    got = rates(lambda: fluid.layers.exponential_decay(0.5, 3, 0.1, staircase=True), 8)
    np.testing.assert_allclose(got, [0.5 * 0.1 ** (s // 3) for s in range(8)], rtol=1e-6)
    got = rates(lambda: fluid.layers.exponential_decay(0.5, 4, 0.5), 6)
    np.testing.assert_allclose(got, [0.5 * 0.5 ** (s / 4) for s in range(6)], rtol=1e-6)


def test_piecewise_decay_writes_fluids_ops_and_rates() -> None:
    main, _, _ = build_lr(lambda: fluid.layers.piecewise_decay([10000, 20000], [1.0, 0.5, 1.0]))
    assert op_types(main.global_block()) == [
        "increment", "cast", "fill_constant", "fill_constant", "less_than", "logical_not",
        "conditional_block", "fill_constant", "fill_constant", "less_than", "logical_not",
        "logical_and", "logical_and", "conditional_block", "fill_constant", "conditional_block"]
    for block in main.blocks[1:]:
        assert op_types(block) == ["assign"]
    got = rates(lambda: fluid.layers.piecewise_decay(boundaries=[2, 5], values=[1.0, 0.1, 0.01]), 7)
    assert got == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01])


@pytest.mark.parametrize("name, make, formula", [
    ("natural_exp_decay", lambda: fluid.layers.natural_exp_decay(0.5, 2, 0.3),
     lambda s: 0.5 * math.exp(-0.3 * s / 2)),
    ("inverse_time_decay", lambda: fluid.layers.inverse_time_decay(0.5, 2, 0.3, staircase=True),
     lambda s: 0.5 / (1 + 0.3 * (s // 2))),
    ("polynomial_decay", lambda: fluid.layers.polynomial_decay(0.5, 4, 0.1, power=2.0),
     lambda s: (0.5 - 0.1) * (1 - min(s, 4) / 4) ** 2 + 0.1),
    ("noam_decay", lambda: fluid.layers.noam_decay(16, 3),
     lambda s: 16 ** -0.5 * min((s + 1) ** -0.5, (s + 1) * 3 ** -1.5)),
    ("cosine_decay", lambda: fluid.layers.cosine_decay(0.5, 2, 4),
     lambda s: 0.5 * 0.5 * (math.cos((s // 2) * math.pi / 4) + 1)),
])
def test_the_other_schedules_follow_their_formulas(name, make, formula) -> None:  # type: ignore[no-untyped-def]
    np.testing.assert_allclose(rates(make, 7), [formula(s) for s in range(7)], rtol=1e-5)


# -- reduce_sum, reduce_mean ----------------------------------------------------------------------

@pytest.mark.parametrize("layer", ["reduce_sum", "reduce_mean"])
def test_a_reduction_writes_fluids_attributes_and_shapes(layer: str) -> None:
    def body():  # type: ignore[no-untyped-def]
        x = fluid.layers.data("x", shape=[3, 4])
        reduce = getattr(fluid.layers, layer)
        return [reduce(x, dim=1), reduce(x, dim=[-1], keep_dim=True), reduce(x),
                reduce(x, dim=[0, 1, 2], keep_dim=True)]
    main, _, outs = build(body)
    ops = ops_of(main.global_block(), layer)
    assert [op.attrs["dim"] for op in ops] == [[1], [-1], [0], [0, 1, 2]]
    assert [op.attrs["keep_dim"] for op in ops] == [False, True, False, True]
    assert [op.attrs["reduce_all"] for op in ops] == [False, False, True, True]
    assert [o.shape for o in outs] == [(-1, 4), (-1, 3, 1), (1,), (1, 1, 1)]
    with pytest.raises(ValueError, match="dim 3 outside"):
        build(lambda: getattr(fluid.layers, layer)(fluid.layers.data("x", shape=[3, 4]), dim=3))


REDUCE_ATTRS = [
    ({"dim": [1], "keep_dim": False, "reduce_all": False}, (1,), False),
    ({"dim": [-1, 0], "keep_dim": True, "reduce_all": False}, (0, 2), True),
    ({"dim": [0], "keep_dim": False, "reduce_all": True}, (0, 1, 2), False),
    ({"dim": [0], "keep_dim": True, "reduce_all": True}, (0, 1, 2), True),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attrs, axes, keep", REDUCE_ATTRS)
def test_reductions_compute_numpys_sum_and_mean_and_their_gradients(
        backend: str, attrs: dict, axes: tuple[int, ...], keep: bool) -> None:
    x = np.random.default_rng(3).standard_normal((2, 3, 4))
    for op_type, reference in (("reduce_sum", np.sum), ("reduce_mean", np.mean)):
        want = np.asarray(reference(x, axis=axes, keepdims=keep))
        got = np.asarray(run_op(op_type, {"X": x}, attrs=attrs, backend=backend)["Out"])
        assert got.shape == (want.shape or (1,))  # nothing left: [1], as in fluid
        np.testing.assert_allclose(got, want.reshape(got.shape), rtol=1e-12)
        check_grad(op_type, {"X": x}, ["X"], attrs, backend=backend)


def test_a_reduction_keeps_float32() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = run_op("reduce_mean", {"X": x}, attrs={"dim": [1], "keep_dim": False, "reduce_all": False})
    assert out["Out"].dtype == np.float32
    np.testing.assert_allclose(out["Out"], [1.0, 4.0])


# -- fill_constant_batch_size_like ----------------------------------------------------------------

def test_fill_constant_batch_size_like_writes_fluids_op() -> None:
    def body():  # type: ignore[no-untyped-def]
        x = fluid.layers.data("x", shape=[4])
        return fluid.layers.fill_constant_batch_size_like(x, shape=[-1, 5], value=1.0,
                                                          dtype="float32")
    main, _, out = build(body)
    op, = ops_of(main.global_block(), "fill_constant_batch_size_like")
    assert op.inputs == {"Input": ["x"]} and op.outputs == {"Out": [out.name]}
    assert {k: op.attrs[k] for k in ("shape", "dtype", "value", "input_dim_idx", "output_dim_idx",
                                     "force_cpu")} == {
        "shape": [-1, 5], "dtype": "float32", "value": 1.0, "input_dim_idx": 0,
        "output_dim_idx": 0, "force_cpu": False}
    assert out.shape == (-1, 5) and out.stop_gradient
    with pytest.raises(ValueError, match="output_dim_idx 2"):
        build(lambda: fluid.layers.fill_constant_batch_size_like(
            fluid.layers.data("x", shape=[4]), shape=[-1, 5], value=0, dtype="float32",
            output_dim_idx=2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_constant_batch_size_like_takes_the_inputs_batch(backend: str) -> None:
    x = np.ones((4, 2))
    out = run_op("fill_constant_batch_size_like", {"Input": x},
                 attrs={"shape": [-1, 3], "dtype": "float32", "value": 0.5}, backend=backend)["Out"]
    np.testing.assert_array_equal(np.asarray(out), np.full((4, 3), 0.5, np.float32))
    assert np.asarray(out).dtype == np.float32
    moved = run_op("fill_constant_batch_size_like", {"Input": x}, backend=backend,
                   attrs={"shape": [7, -1], "dtype": "int64", "value": 2.0, "input_dim_idx": 1,
                          "output_dim_idx": 1})["Out"]
    np.testing.assert_array_equal(np.asarray(moved), np.full((7, 2), 2, np.int64))
    # a batch of sequences: one row per sequence, as fluid counts them
    seqs = run_op("fill_constant_batch_size_like", {"Input": LoDTensor(np.ones((5, 2)), [[0, 2, 5]])},
                  attrs={"shape": [-1, 1], "dtype": "float32", "value": 1.0}, backend=backend)["Out"]
    assert np.asarray(seqs).shape == (2, 1)


def test_a_loss_of_the_new_layers_trains_like_numpy() -> None:
    """fluid's word2vec-style loss: reduce_sum of a product, labels of
    fill_constant_batch_size_like, sigmoid cross-entropy, reduce_mean; the loss and the
    weight's gradient against numpy."""
    def body():  # type: ignore[no-untyped-def]
        x = fluid.layers.data("x", shape=[3])
        w = fluid.layers.fc(x, size=3, param_attr=fluid.ParamAttr(
            name="w", initializer=fluid.initializer.Constant(0.2)), bias_attr=False)
        logit = fluid.layers.reduce_sum(fluid.layers.elementwise_mul(w, x), dim=1, keep_dim=True)
        ones = fluid.layers.fill_constant_batch_size_like(logit, shape=[-1, 1], value=1.0,
                                                          dtype="float32")
        xent = fluid.layers.sigmoid_cross_entropy_with_logits(logit, ones)
        loss = fluid.layers.reduce_mean(fluid.layers.reduce_sum(xent, dim=1))
        fluid.optimizer.SGD(0.1).minimize(loss)
        return loss
    main, startup, loss = build(body)
    assert "fill_constant_batch_size_like_grad" not in op_types(main.global_block())
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    got_loss, got_grad = exe.run(main, feed={"x": x}, fetch_list=[loss.name, "w@GRAD"],
                                 scope=scope)
    w = np.full((3, 3), 0.2)
    z = ((x @ w) * x).sum(axis=1)
    want_loss = np.mean(np.log1p(np.exp(-z)))
    dz = -1 / (1 + np.exp(z)) / len(x)
    # dz/dw[i, j] = sum_n x[n, i] * x[n, j] * dz[n]
    want_grad = np.einsum("ni,nj,n->ij", x, x, dz)
    np.testing.assert_allclose(got_loss.reshape(-1)[0], want_loss, rtol=1e-5)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-6)


# -- Block.create_parameter -----------------------------------------------------------------------

def test_block_create_parameter_declares_a_parameter_and_its_initializer_in_that_block() -> None:
    main = Program()
    block = main.global_block()
    w = block.create_parameter(shape=[20, 10], dtype="float32", name="nce_w",
                               initializer=fluid.initializer.ConstantInitializer(0.5))
    assert w.is_parameter and w.persistable and w.trainable and not w.stop_gradient
    assert w.shape == (20, 10) and main.global_block().var("nce_w") is w
    fill, = block.ops
    assert fill.type == "fill_constant" and fill.outputs == {"Out": ["nce_w"]}
    assert fill.attrs["value"] == 0.5 and fill.attrs["shape"] == [20, 10]
    again = block.create_parameter(shape=[20, 10], dtype="float32", name="nce_w",
                                   initializer=fluid.initializer.ConstantInitializer(0.5))
    assert again is w and len(block.ops) == 1  # already initialized there
    with pytest.raises(T.IRError, match="shape"):
        block.create_parameter(shape=[3], dtype="float32", name="nce_w")


def test_a_layer_naming_a_created_parameter_uses_it_and_initializes_it_at_startup() -> None:
    def body():  # type: ignore[no-untyped-def]
        fluid.default_main_program().global_block().create_parameter(
            shape=[10, 20], dtype="float32", name="nce_w")
        x = fluid.layers.data("x", shape=[10])
        return fluid.layers.fc(x, size=20, param_attr="nce_w", bias_attr=False)
    main, startup, _ = build(body)
    mul, = ops_of(main.global_block(), "mul")
    assert mul.input("Y") == ["nce_w"]
    assert [op.outputs["Out"] for op in startup.global_block().ops] == [["nce_w"]]


# -- the transpiler's lookup-table answers, a program's distributed attributes --------------------

def test_the_transpiler_names_its_distributed_lookup_table() -> None:
    t = transpile(lookup_model(is_distributed=True))
    assert t.has_distributed_lookup_table and t.table_name == "shared_w"
    rows = t.get_pserver_program(PS1).global_block().vars[t.table_name].shape[0]
    assert rows == math.ceil(1000 / 2)
    plain = transpile(lookup_model(is_distributed=False))
    assert not plain.has_distributed_lookup_table and plain.table_name is None
    assert not fluid.DistributeTranspiler().has_distributed_lookup_table


def test_a_transpiled_program_answers_fluids_distributed_attributes() -> None:
    t = transpile(lookup_model(is_distributed=True))
    trainer = t.get_trainer_program()
    assert trainer._is_distributed is True and trainer._is_chief is True
    assert trainer._distributed_lookup_table == "shared_w"
    assert trainer._endpoints == [PS1, PS2]
    assert transpile(lookup_model(True), trainer_id=1).get_trainer_program()._is_chief is False
    ps = t.get_pserver_program(PS2)
    assert ps._is_distributed and ps._ps_endpoint == PS2
    assert ps._endpoints == PSERVERS.split(",")


def test_a_plain_programs_distributed_attributes_are_fluids_defaults_and_settable() -> None:
    p = Program()
    assert (p._is_distributed, p._is_chief, p._endpoints, p._distributed_lookup_table,
            p._ps_endpoint, p._trainers_endpoints, p._nccl_comm_num) == (
        False, False, [], None, None, [], 1)
    p._is_distributed = True
    p._endpoints = ["a:1"]
    p._endpoints.append("b:2")  # a copy, as the attribute is read
    assert p.attrs == {"_is_distributed": True, "_endpoints": ["a:1"]}
    assert p.clone()._is_distributed is True
    assert p.clone()._endpoints == ["a:1"]


# -- fluid.core ----------------------------------------------------------------------------------

def test_core_says_whether_cuda_can_run(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(fluid.core.is_compiled_with_cuda(), bool)
    monkeypatch.setitem(sys.modules, "torch", None)  # no torch: no CUDAPlace
    assert fluid.core.is_compiled_with_cuda() is False


# -- clipping: need_clip, minimize(grad_clip=), ParamAttr(gradient_clip=) -------------------------

def clipped(main: Program) -> list[str]:
    return [op.input("X")[0] for op in ops_of(main.global_block(), "clip")]


def test_need_clip_picks_the_gradients_a_clip_touches() -> None:
    def only_w(param: T.Var) -> bool:
        return param.name == "fc_w"

    main, _, _ = build(lambda: fc_loss_with(lambda loss: T.optimizer.SGD(0.1).minimize(
        loss, grad_clip=fluid.clip.GradientClipByValue(0.1, need_clip=only_w))))
    assert clipped(main) == ["fc_w@GRAD"]
    main, _, _ = build(lambda: fc_loss_with(lambda loss: T.optimizer.SGD(0.1).minimize(
        loss, grad_clip=fluid.clip.GradientClipByNorm(1.0, need_clip=only_w))))
    assert [op.input("X") for op in ops_of(main.global_block(), "clip_by_norm")] == [["fc_w@GRAD"]]
    main, _, _ = build(lambda: fc_loss_with(lambda loss: T.optimizer.SGD(0.1).minimize(
        loss, grad_clip=fluid.clip.GradientClipByGlobalNorm(1.0, need_clip=only_w))))
    assert [op.input("X") for op in ops_of(main.global_block(), "squared_l2_norm")] == \
        [["fc_w@GRAD"]]


def test_a_param_attr_can_refuse_clipping() -> None:
    main, _, _ = build(lambda: fc_loss_with(
        lambda loss: T.optimizer.SGD(0.1, grad_clip=fluid.clip.GradientClipByValue(0.1))
        .minimize(loss), b_attr=fluid.ParamAttr(name="fc_b", need_clip=False)))
    assert clipped(main) == ["fc_w@GRAD"]


def test_minimizes_grad_clip_replaces_the_optimizers() -> None:
    opt = T.optimizer.SGD(0.1, grad_clip=fluid.clip.GradientClipByNorm(1.0))
    main, _, _ = build(lambda: fc_loss_with(
        lambda loss: opt.minimize(loss, grad_clip=fluid.clip.GradientClipByValue(0.5))))
    assert sorted(clipped(main)) == ["fc_b@GRAD", "fc_w@GRAD"]
    assert not ops_of(main.global_block(), "clip_by_norm")
    with pytest.raises(TypeError, match="grad_clip"):
        build(lambda: fc_loss_with(lambda loss: T.optimizer.SGD(0.1).minimize(loss, grad_clip=0.1)))


def test_a_param_attrs_own_clip_applies_without_an_optimizer_clip() -> None:
    w_attr = fluid.ParamAttr(name="fc_w", regularizer=fluid.regularizer.L2Decay(),
                             gradient_clip=fluid.clip.GradientClipByValue(0.1))
    main, _, _ = build(lambda: fc_loss_with(lambda loss: T.optimizer.SGD(0.1).minimize(loss),
                                         w_attr=w_attr))
    clip, = ops_of(main.global_block(), "clip")
    assert clip.input("X") == ["fc_w@GRAD"] and clip.attrs["max"] == 0.1
    # clipping comes before the weight decay, as in fluid
    kinds = [op.type for op in main.global_block().ops if op.role == T.OpRole.Optimize]
    assert kinds.index("clip") < kinds.index("scale")
    # an optimizer clip of its own takes the place of the parameters'
    main, _, _ = build(lambda: fc_loss_with(lambda loss: T.optimizer.SGD(0.1).minimize(
        loss, grad_clip=fluid.clip.GradientClipByNorm(2.0)), w_attr=w_attr))
    assert not ops_of(main.global_block(), "clip")
    assert len(ops_of(main.global_block(), "clip_by_norm")) == 2


def test_a_param_attr_clip_moves_to_its_params_pserver_blocks() -> None:
    w_attr = fluid.ParamAttr(name="fc_w", regularizer=fluid.regularizer.L2Decay(),
                             gradient_clip=fluid.clip.GradientClipByValue(0.1))
    t = transpile(basic(w_attr=w_attr))
    blocks = [types(b) for ep in (PS1, PS2) for b in t.get_pserver_program(ep).blocks[1:]]
    assert sorted(blocks) == sorted([["sum", "scale", "sgd"],  # fc_b
                                     ["sum", "scale", "clip", "scale", "sum", "sgd"],  # fc_w.block0
                                     ["sum", "scale", "clip", "scale", "sum", "sgd"]])  # .block1


def fc_loss_with(minimize, w_attr=None, b_attr=None) -> None:  # type: ignore[no-untyped-def]
    x = fluid.layers.data("x", shape=[4])
    y = fluid.layers.data("y", shape=[1])
    pred = fluid.layers.fc(x, size=1, param_attr=w_attr or fluid.ParamAttr(name="fc_w"),
                           bias_attr=b_attr or fluid.ParamAttr(name="fc_b"))
    minimize(fluid.layers.mean(fluid.layers.square_error_cost(pred, y)))


# -- hsigmoid ------------------------------------------------------------------------------------

def hsigmoid_reference(x, w, b, paths):  # type: ignore[no-untyped-def]
    """Out per row from each row's list of (node, bit), written out loop by loop; `width`
    columns in all, the ones past a path each adding log 2 (fluid's constant)."""
    width = max(len(p) for p in paths)
    out = []
    for i, path in enumerate(paths):
        total = 0.0
        for node, bit in path:
            p = float(np.clip(x[i] @ w[node] + b[node, 0], -40, 40))
            total += math.log1p(math.exp(p)) - bit * p
        out.append(total + (width - len(path)) * math.log(2))
    return np.array(out).reshape(-1, 1)


def default_paths(labels: list[int], num_classes: int) -> list[list[tuple[int, int]]]:
    """fluid's default tree: class c coded k = c + num_classes, node j at (k >> (j+1)) - 1."""
    paths = []
    for c in labels:
        k = c + num_classes
        paths.append([((k >> (j + 1)) - 1, (k >> j) & 1) for j in range(k.bit_length() - 1)])
    return paths


def test_hsigmoid_writes_fluids_op_and_parameters() -> None:
    def body():  # type: ignore[no-untyped-def]
        x = fluid.layers.data("x", shape=[4])
        label = fluid.layers.data("label", shape=[1], dtype="int64")
        return fluid.layers.hsigmoid(x, label, num_classes=6)
    main, startup, out = build(body)
    op, = ops_of(main.global_block(), "hierarchical_sigmoid")
    w, b = "hierarchical_sigmoid_0.w_0", "hierarchical_sigmoid_0.b_0"
    assert op.inputs == {"X": ["x"], "W": [w], "Label": ["label"], "Bias": [b]}
    assert op.output_names == ["Out", "PreOut"] and op.output("Out") == [out.name]
    assert {k: op.attrs[k] for k in ("num_classes", "is_sparse", "remote_prefetch")} == {
        "num_classes": 6, "is_sparse": False, "remote_prefetch": False}
    gblock = main.global_block()
    assert gblock.var(w).shape == (5, 4) and gblock.var(b).shape == (5, 1)
    assert gblock.var(op.output("PreOut")[0]).shape == (-1, 3)  # bit length of 5
    assert out.shape == (-1, 1)
    assert {o.outputs["Out"][0] for o in startup.global_block().ops} == {w, b}
    with pytest.raises(ValueError, match="at least 2"):
        build(lambda: fluid.layers.hsigmoid(fluid.layers.data("x", shape=[4]),
                                            fluid.layers.data("l", shape=[1], dtype="int64"), 1))


def custom_hsigmoid_net(**attrs) -> None:  # type: ignore[no-untyped-def]
    """A sparse hsigmoid on a custom tree of 3 nodes, its mean loss minimized by SGD."""
    x = fluid.layers.data("x", shape=[4])
    label = fluid.layers.data("label", shape=[1], dtype="int64")
    table = fluid.layers.data("path_table", shape=[3], dtype="int64")
    code = fluid.layers.data("path_code", shape=[3], dtype="int64")
    loss = fluid.layers.mean(fluid.layers.hsigmoid(
        x, label, num_classes=3, path_table=table, path_code=code, is_custom=True,
        is_sparse=True, **attrs))
    fluid.optimizer.SGD(0.1).minimize(loss)


def test_a_custom_tree_hsigmoid_has_num_classes_rows_and_may_be_sparse() -> None:
    main, _, _ = build(lambda: custom_hsigmoid_net(param_attr="hs_w", bias_attr="hs_b"))
    op, = ops_of(main.global_block(), "hierarchical_sigmoid")
    assert op.input("PathTable") == ["path_table"] and op.input("PathCode") == ["path_code"]
    assert op.attrs["is_sparse"] is True
    assert main.global_block().var("hs_w").shape == (3, 4)
    assert main.global_block().var("hs_w@GRAD").type is T.VarType.SELECTED_ROWS
    assert main.global_block().var("hs_b@GRAD").type is T.VarType.LOD_TENSOR
    grad, = ops_of(main.global_block(), "hierarchical_sigmoid_grad")
    assert grad.output_names == ["W@GRAD", "Bias@GRAD"]  # x is data: no gradient
    with pytest.raises(ValueError, match="custom tree needs"):
        build(lambda: fluid.layers.hsigmoid(fluid.layers.data("x", shape=[4]),
                                            fluid.layers.data("l", shape=[1], dtype="int64"), 3,
                                            is_custom=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_hsigmoid_computes_fluids_loss_on_the_default_tree(backend: str) -> None:
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((5, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 1))
    labels = [0, 6, 3, 5, 1]  # 7 classes: paths of 2 and 3 nodes
    inputs = {"X": x, "W": w, "Label": np.array(labels).reshape(-1, 1), "Bias": b}
    got = run_op("hierarchical_sigmoid", inputs, ("Out", "PreOut"), {"num_classes": 7},
                 backend=backend)
    np.testing.assert_allclose(np.asarray(got["Out"]),
                               hsigmoid_reference(x, w, b, default_paths(labels, 7)), rtol=1e-10)
    assert np.asarray(got["PreOut"]).shape == (5, 3)
    check_grad("hierarchical_sigmoid", inputs, ["X", "W", "Bias"], {"num_classes": 7},
               ("Out", "PreOut"), ("Out",), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sparse", [False, True])
def test_hsigmoid_computes_fluids_loss_on_a_custom_tree(backend: str, sparse: bool) -> None:
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((3, 2)), rng.standard_normal((4, 2)), rng.standard_normal((4, 1))
    table = np.array([[0, 2, -1], [1, 3, 0], [3, -1, 2]])  # a path ends at its first -1
    code = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 1]])
    inputs = {"X": x, "W": w, "Label": np.zeros((3, 1), np.int64), "Bias": b,
              "PathTable": table, "PathCode": code}
    attrs = {"num_classes": 4, "is_sparse": sparse}
    paths = [[(0, 1), (2, 0)], [(1, 0), (3, 1), (0, 1)], [(3, 1)]]
    got = run_op("hierarchical_sigmoid", inputs, ("Out", "PreOut"), attrs, backend=backend)
    np.testing.assert_allclose(np.asarray(got["Out"]), hsigmoid_reference(x, w, b, paths),
                               rtol=1e-10)
    check_grad("hierarchical_sigmoid", inputs, ["X", "W", "Bias"], attrs, ("Out", "PreOut"),
               ("Out",), backend=backend)
    if sparse:  # the rows of every id in the table, once, sorted (2 included, past a path)
        forward = run_op("hierarchical_sigmoid", inputs, ("Out", "PreOut"), attrs)
        grads = run_op("hierarchical_sigmoid_grad",
                       {**inputs, **forward, "Out@GRAD": np.ones((3, 1))}, ["W@GRAD"], attrs,
                       backend=backend)
        assert list(np.asarray(grads["W@GRAD"].rows)) == [0, 1, 2, 3]
        assert grads["W@GRAD"].height == 4


def test_an_hsigmoid_model_trains() -> None:
    def body():  # type: ignore[no-untyped-def]
        x = fluid.layers.data("x", shape=[4])
        label = fluid.layers.data("label", shape=[1], dtype="int64")
        loss = fluid.layers.mean(fluid.layers.hsigmoid(x, label, num_classes=5))
        fluid.optimizer.SGD(0.5).minimize(loss)
        return loss
    main, startup, loss = build(body, seed=3)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, (16, 1))
    x = (np.eye(5)[labels[:, 0]][:, :4] + 0.1 * rng.standard_normal((16, 4))).astype(np.float32)
    scope, exe = Scope(), Executor()
    exe.run(startup, scope=scope)
    losses = [float(exe.run(main, feed={"x": x, "label": labels}, fetch_list=[loss.name],
                            scope=scope)[0].reshape(-1)[0]) for _ in range(30)]
    assert losses[-1] < 0.7 * losses[0]


def test_a_sparse_hsigmoid_transpiles_with_a_sparse_gradient() -> None:
    main, startup, _ = build(custom_hsigmoid_net)
    t = transpile((main, startup))
    trainer = t.get_trainer_program()
    assert "hierarchical_sigmoid" in op_types(trainer.global_block())
    grad = "hierarchical_sigmoid_0.w_0@GRAD.trainer_0"  # trainer 0's copy
    assert trainer.global_block().var(grad).type is T.VarType.SELECTED_ROWS
    assert any(grad in op.input("X") for op in ops_of(trainer.global_block(), "send"))
