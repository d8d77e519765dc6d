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
