"""Front end: the op sequences of Paddle's static graph, exactly."""

from __future__ import annotations

import pytest

import transpiler as T
from transpiler.ir import OpRole, VarType, op_types

from distribute_helpers import lookup_model
from program_helpers import build


def basic(opt=None, **fc_kwargs):  # type: ignore[no-untyped-def]
    def body():  # type: ignore[no-untyped-def]
        x = T.layers.data("x", shape=[1000])
        y = T.layers.data("y", shape=[1])
        pred = T.layers.fc(x, size=1000, param_attr=T.ParamAttr(name="fc_w"),
                           bias_attr=T.ParamAttr(name="fc_b"), **fc_kwargs)
        loss = T.layers.mean(T.layers.square_error_cost(pred, y))
        (opt or (lambda: T.optimizer.SGD(0.1)))().minimize(loss)
        return loss
    return build(body)


def test_spec_basic_model_op_sequence() -> None:
    main, startup, _ = basic()
    assert op_types(main.global_block()) == [
        "mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant",
        "mean_grad", "square_grad", "elementwise_sub_grad", "elementwise_add_grad", "mul_grad",
        "sgd", "sgd"]
    # initializers are prepended: learning rate, fc_b, fc_w
    assert op_types(startup.global_block()) == ["fill_constant", "fill_constant", "uniform_random"]
    assert [op.output("Out") for op in startup.global_block().ops] == [
        ["learning_rate_0"], ["fc_b"], ["fc_w"]]
    assert startup.global_block().ops[2].attr("shape") == [1000, 1000]


def test_roles_and_role_vars() -> None:
    main, _, loss = basic()
    ops = main.global_block().ops
    assert ops[4].role == OpRole.Forward | OpRole.Loss
    assert ops[5].role == OpRole.Backward | OpRole.Loss
    assert ops[5].output("Out") == [loss.name + "@GRAD"]
    assert all(op.role == OpRole.Backward for op in ops[6:11])
    assert ops[9].role_var == ["fc_b", "fc_b@GRAD"]
    assert ops[10].role_var == ["fc_w", "fc_w@GRAD"]
    assert [(op.role, op.role_var) for op in ops[11:]] == [
        (OpRole.Optimize, ["fc_b", "fc_b@GRAD"]), (OpRole.Optimize, ["fc_w", "fc_w@GRAD"])]


def test_data_vars_get_no_gradient() -> None:
    main, _, _ = basic()
    block = main.global_block()
    assert not block.has_var("x@GRAD") and not block.has_var("y@GRAD")
    sub_grad = block.ops[8]
    assert sub_grad.type == "elementwise_sub_grad" and list(sub_grad.outputs) == ["X@GRAD"]


def test_fc_with_act_and_multiple_inputs() -> None:
    def body():  # type: ignore[no-untyped-def]
        a = T.layers.data("a", shape=[3])
        b = T.layers.data("b", shape=[5])
        return T.layers.fc([a, b], size=4, act="relu")
    main, _, out = build(body)
    assert op_types(main.global_block()) == ["mul", "mul", "sum", "elementwise_add", "relu"]
    assert main.global_block().var("fc_0.w_0").shape == (3, 4)
    assert main.global_block().var("fc_0.w_1").shape == (5, 4)
    assert out.shape == (-1, 4)


def test_shared_sparse_embedding_sums_selected_rows_grads() -> None:
    main, startup = lookup_model()
    block = main.global_block()
    types = op_types(block)
    assert types[:8] == ["lookup_table", "sequence_pool", "lookup_table", "sequence_pool", "concat",
                         "mul", "elementwise_add", "softmax"]
    assert types[types.index("fill_constant"):] == [
        "fill_constant", "mean_grad", "cross_entropy_grad2", "softmax_grad", "elementwise_add_grad",
        "mul_grad", "concat_grad", "sequence_pool_grad", "lookup_table_grad", "sequence_pool_grad",
        "lookup_table_grad", "sum", "adam", "adam", "adam"] + ["scale"] * 6
    assert block.var("shared_w@GRAD").type is VarType.SELECTED_ROWS
    summed = next(op for op in block.ops if op.type == "sum")
    assert summed.input("X") == ["shared_w@GRAD@RENAME@block0@0", "shared_w@GRAD@RENAME@block0@1"]
    assert summed.output("Out") == ["shared_w@GRAD"]
    assert summed.role_var == ["shared_w", "shared_w@GRAD"]
    assert all(block.var(n).type is VarType.SELECTED_ROWS for n in summed.input("X"))
    lookups = [op for op in block.ops if op.type == "lookup_table"]
    assert lookups[0].attrs["is_sparse"] and lookups[0].attrs["padding_idx"] == -1
    # adam accumulators: moment1/moment2 param-shaped, beta pows [1] filled with beta
    sblock = startup.global_block()
    assert sblock.var("moment1_2").shape == (1000, 64)  # params in name order: fc_b, fc_w, shared_w
    assert sblock.var("beta1_pow_acc_0").shape == (1,)
    beta1 = next(op for op in sblock.ops if op.output("Out") == ["beta1_pow_acc_0"])
    assert beta1.attr("value") == pytest.approx(0.9)


def test_exponential_decay_ops() -> None:
    main, startup, _ = basic(lambda: T.optimizer.SGD(T.lr.exponential_decay(1.0, 2100, 0.1, True)))
    lr_ops = [op for op in main.global_block().ops if op.role & OpRole.LRSched]
    assert [op.type for op in lr_ops] == [
        "increment", "cast", "fill_constant", "elementwise_div", "floor", "fill_constant",
        "elementwise_pow", "fill_constant", "elementwise_mul"]
    assert main.global_block().ops[0].type == "increment"
    counter = next(op for op in startup.global_block().ops
                   if op.output("Out") == ["@LR_DECAY_COUNTER@"])
    assert counter.attr("value") == -1.0 and counter.attr("dtype") == "int64"


def test_piecewise_decay_switch_ops() -> None:
    main, _, _ = basic(lambda: T.optimizer.SGD(T.lr.piecewise_decay([10000, 20000], [1.0, 0.5, 1.0])))
    lr_ops = [op.type for op in main.global_block().ops if op.role & OpRole.LRSched]
    assert lr_ops == ["increment", "cast", "fill_constant", "fill_constant", "less_than",
                      "logical_not", "conditional_block", "fill_constant", "fill_constant",
                      "less_than", "logical_not", "logical_and", "logical_and",
                      "conditional_block", "fill_constant", "conditional_block"]
    assert len(main.blocks) == 4
    for sub in main.blocks[1:]:
        assert op_types(sub) == ["assign"] and sub.ops[0].output("Out") == ["learning_rate"]
    T.verify(main)


@pytest.mark.parametrize("schedule", [
    lambda: T.lr.natural_exp_decay(0.1, 10, 0.5),
    lambda: T.lr.inverse_time_decay(0.1, 10, 0.5, staircase=True),
    lambda: T.lr.polynomial_decay(0.1, 10, cycle=True),
    lambda: T.lr.polynomial_decay(0.1, 10),
    lambda: T.lr.noam_decay(64, 100),
    lambda: T.lr.cosine_decay(0.1, 10, 5),
])
def test_other_schedules_are_lr_ops(schedule) -> None:  # type: ignore[no-untyped-def]
    main, _, _ = basic(lambda: T.optimizer.SGD(schedule()))
    ops = main.global_block().ops
    assert ops[0].type == "increment"
    sgd = [op for op in ops if op.type == "sgd"]
    lr_name = sgd[0].input("LearningRate")[0]
    producer = [op for op in ops if lr_name in op.output_arg_names]
    assert producer and all(op.role & OpRole.LRSched for op in producer)
    T.verify(main)


def test_clip_before_regularization_per_param() -> None:
    main, _, _ = basic(lambda: T.optimizer.SGD(0.1, grad_clip=T.clip.GradientClipByValue(0.1)))
    opt_ops = [op for op in main.global_block().ops if op.role == OpRole.Optimize]
    assert [op.type for op in opt_ops] == ["clip", "clip", "sgd", "sgd"]
    assert opt_ops[0].attr("op_namescope") == "/@CLIP/"
    assert opt_ops[0].input("X") == opt_ops[0].output("Out") == ["fc_b@GRAD"]


def test_param_attr_regularizer_wins_and_l2_is_scale_then_sum() -> None:
    def body():  # type: ignore[no-untyped-def]
        x = T.layers.data("x", shape=[8])
        y = T.layers.data("y", shape=[1])
        pred = T.layers.fc(x, size=1, param_attr=T.ParamAttr(name="fc_w", regularizer=T.regularizer.L2Decay(0.5)),
                           bias_attr=T.ParamAttr(name="fc_b"))
        loss = T.layers.mean(T.layers.square_error_cost(pred, y))
        T.optimizer.Momentum(0.1, regularization=T.regularizer.L1Decay(1e-4),
                             grad_clip=T.clip.GradientClipByValue(0.1)).minimize(loss)
    main, _, _ = build(body)
    opt = [op for op in main.global_block().ops if op.role == OpRole.Optimize]
    by_param: dict[str, list[str]] = {}
    for op in opt:
        by_param.setdefault(op.role_var[0], []).append(op.type)
    assert by_param == {"fc_b": ["clip", "sign", "scale", "sum", "momentum"],
                        "fc_w": ["clip", "scale", "sum", "momentum"]}
    l2 = next(op for op in opt if op.type == "scale" and op.role_var[0] == "fc_w")
    assert l2.attr("scale") == 0.5 and l2.input("X") == ["fc_w"]


def test_global_norm_clip_ops() -> None:
    main, _, _ = basic(lambda: T.optimizer.SGD(0.1, grad_clip=T.clip.GradientClipByGlobalNorm(1.0)))
    opt = [op.type for op in main.global_block().ops if op.role == OpRole.Optimize]
    assert opt == ["squared_l2_norm", "squared_l2_norm", "sum", "sqrt", "fill_constant",
                   "elementwise_max", "elementwise_div", "elementwise_mul", "elementwise_mul",
                   "sgd", "sgd"]


@pytest.mark.parametrize("opt,op_type,accs", [
    (lambda: T.optimizer.Momentum(0.1), "momentum", ["velocity"]),
    (lambda: T.optimizer.Adam(0.1), "adam", ["moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"]),
    (lambda: T.optimizer.Adagrad(0.1), "adagrad", ["moment"]),
    (lambda: T.optimizer.DecayedAdagrad(0.1), "decayed_adagrad", ["moment"]),
    (lambda: T.optimizer.Adamax(0.1), "adamax", ["moment", "inf_norm", "beta1_pow_acc"]),
    (lambda: T.optimizer.RMSProp(0.1), "rmsprop", ["momentum", "mean_square", "mean_grad"]),
    (lambda: T.optimizer.Ftrl(0.1), "ftrl", ["squared", "linear"]),
])
def test_optimizer_ops_and_accumulators(opt, op_type, accs) -> None:  # type: ignore[no-untyped-def]
    main, startup, _ = basic(opt)
    ops = [op for op in main.global_block().ops if op.type == op_type]
    assert [op.input("Param") for op in ops] == [["fc_b"], ["fc_w"]]
    for acc in accs:
        assert main.global_block().var(f"{acc}_0").shape in ((1000,), (1,))
        assert startup.global_block().has_var(f"{acc}_1")
    T.verify(main)
    T.verify(startup)


def test_rmsprop_accumulator_names_follow_param_order() -> None:
    main, _, _ = basic(lambda: T.optimizer.RMSProp(0.1))
    rms = [op for op in main.global_block().ops if op.type == "rmsprop"]
    assert rms[1].input("Moment") == ["momentum_1"] and rms[1].input("Param") == ["fc_w"]
    assert main.global_block().var("momentum_1").shape == (1000, 1000)


def test_bad_arguments_name_the_culprit() -> None:
    with pytest.raises(ValueError, match="learning_rate must be positive"):
        T.optimizer.SGD(-1.0)
    with pytest.raises(ValueError, match="beta1"):
        T.optimizer.Adam(0.1, beta1=1.5)
    with pytest.raises(ValueError, match="values needs"):
        T.lr.piecewise_decay([1, 2], [0.1])
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        build(lambda: T.layers.fc(T.layers.data("x", shape=[2]), size=2, act="gelu"))
    with pytest.raises(TypeError, match="embedding: ids 'x' must be int64"):
        build(lambda: T.layers.embedding(T.layers.data("x", shape=[1]), size=[10, 2]))
    with pytest.raises(ValueError, match="has no LoD"):
        build(lambda: T.layers.sequence_pool(T.layers.data("x", shape=[2]), "sum"))


def test_building_twice_gives_identical_programs() -> None:
    assert lookup_model()[0] == lookup_model()[0]
    assert basic()[1] == basic()[1]


def test_op_reading_one_var_twice_gets_two_grad_contributions() -> None:
    def body():  # type: ignore[no-untyped-def]
        x = T.layers.data("x", shape=[3])
        h = T.layers.fc(x, size=3, param_attr=T.ParamAttr(name="w"), bias_attr=False)
        loss = T.layers.mean(T.layers.elementwise_mul(h, h))
        T.optimizer.SGD(0.1).minimize(loss)
    main, _, _ = build(body)
    block = main.global_block()
    mul_grad = next(op for op in block.ops if op.type == "elementwise_mul_grad")
    assert mul_grad.output("X@GRAD") == ["fc_0.tmp_0@GRAD@RENAME@block0@0"]
    assert mul_grad.output("Y@GRAD") == ["fc_0.tmp_0@GRAD@RENAME@block0@1"]
    summed = block.ops[block.ops.index(mul_grad) + 1]
    assert summed.type == "sum" and summed.output("Out") == ["fc_0.tmp_0@GRAD"]
    T.verify(main)


def test_one_optimizer_object_minimizes_two_programs() -> None:
    opt = T.optimizer.Adam(0.1)
    first, _, _ = basic(lambda: opt)
    second, startup, _ = basic(lambda: opt)
    for prog in (first, second, startup):
        T.verify(prog)
    assert second.global_block().has_var("moment1_0")


def test_backward_marks_grad_writers_in_one_pass_over_the_ops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: `append_backward` scanned every op once per parameter to find the last writer
    of its grad, so a model of 5,000 small params took 47 s to build (now under 1 s)."""
    reads = 0
    original = T.Op.output_arg_names

    def counted(op: T.Op) -> list[str]:
        nonlocal reads
        reads += 1
        return original.fget(op)  # type: ignore[attr-defined, no-any-return]

    def wide() -> None:
        x = T.layers.data("x", shape=[4])
        outs = [T.layers.fc(x, size=2, param_attr=T.ParamAttr(name=f"w{i}"), bias_attr=False)
                for i in range(200)]
        monkeypatch.setattr(T.Op, "output_arg_names", property(counted))
        T.append_backward(T.layers.mean(T.layers.sums(outs)))

    main, _, _ = build(wide)
    assert len(main.global_block().ops) > 400
    assert reads < 4 * len(main.global_block().ops)
    grads = [op for op in main.global_block().ops if op.type == "mul_grad"]
    assert len(grads) == 200
    assert all(op.attr("op_role_var") == [op.input("Y")[0], op.input("Y")[0] + "@GRAD"]
               for op in grads)
