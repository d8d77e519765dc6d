"""IR: exact round trips (dict, JSON, msgpack), verify() errors, readable printing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transpiler as T
from transpiler.ir import BlockRef, IRError, Op, OpRole, Program, VarType

NAMES = st.text(alphabet="abcdefgh_@.0123456789", min_size=1, max_size=12)
SCALARS = st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=False, allow_infinity=False),
                    st.booleans(), st.text(max_size=8))
ATTRS = st.one_of(SCALARS, st.lists(st.integers(-5, 5), max_size=4), st.lists(st.text(max_size=4), max_size=3))


@st.composite
def programs(draw: st.DrawFn) -> Program:
    prog = Program()
    prog.random_seed = draw(st.integers(0, 2**31))
    nblocks = draw(st.integers(1, 3))
    for _ in range(nblocks - 1):
        prog.create_block(parent_idx=draw(st.integers(0, len(prog.blocks) - 1)))
    for block in prog.blocks:
        names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
        for name in names:
            block.create_var(name, shape=tuple(draw(st.lists(st.integers(-1, 64), max_size=3))),
                             dtype=draw(st.sampled_from(["float32", "float64", "int64", "bool"])),
                             persistable=draw(st.booleans()),
                             type=draw(st.sampled_from(list(VarType))),
                             lod_level=draw(st.integers(0, 2)))
        for _ in range(draw(st.integers(0, 5))):
            attrs = draw(st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=6), ATTRS, max_size=4))
            attrs["op_role"] = draw(st.sampled_from([0, 1, 2, 4, 8, 16, 257, 18]))
            if len(prog.blocks) > 1 and draw(st.booleans()):
                attrs["sub_block"] = BlockRef(draw(st.integers(1, len(prog.blocks) - 1)))
            block.append_op(draw(st.sampled_from(["mul", "sum", "sgd", "send"])),
                            {"X": draw(st.lists(st.sampled_from(names), max_size=3))},
                            {"Out": draw(st.lists(st.sampled_from(names), max_size=2))}, attrs)
    prog.attrs = {"_endpoints": ["127.0.0.1:6174"], "_is_chief": True}
    return prog


@settings(max_examples=60, deadline=None)
@given(programs())
def test_round_trip_is_exact(prog: Program) -> None:
    d = prog.to_dict()
    assert Program.from_dict(d).to_dict() == d
    assert T.loads_json(T.dumps_json(prog)).to_dict() == d
    assert T.loads_msgpack(T.dumps_msgpack(prog)).to_dict() == d
    assert json.loads(json.dumps(d)) == d  # a plain dict: nothing but JSON types


def _model() -> tuple[Program, Program]:
    main, startup = Program(), Program()
    with T.program_guard(main, startup), T.unique_name.guard():
        x = T.layers.data("x", shape=[4])
        y = T.layers.data("y", shape=[1])
        pred = T.layers.fc(x, size=1, act="tanh", param_attr=T.ParamAttr(name="w",
                           regularizer=T.regularizer.L2Decay(0.01)))
        loss = T.layers.mean(T.layers.square_error_cost(pred, y))
        lr = T.lr.piecewise_decay([2, 4], [0.1, 0.05, 0.01])
        T.optimizer.Adam(lr, grad_clip=T.clip.GradientClipByNorm(1.0)).minimize(loss)
    return main, startup


def test_front_end_program_round_trips_with_params_and_sub_blocks() -> None:
    main, startup = _model()
    for prog in (main, startup):
        T.verify(prog)
        again = T.loads_msgpack(T.dumps_msgpack(prog))
        assert again == prog
        assert str(again) == str(prog)
    w = T.loads_json(T.dumps_json(main)).global_block().var("w")
    assert w.is_parameter and w.regularizer == T.regularizer.L2Decay(0.01)
    cond_ops = [op for op in main.global_block().ops if op.type == "conditional_block"]
    assert [op.attr("sub_block") for op in cond_ops] == [BlockRef(1), BlockRef(2), BlockRef(3)]


def test_clone_is_independent() -> None:
    main, _ = _model()
    clone = main.clone()
    clone.global_block().ops.pop()
    clone.global_block().var("w").shape = (9, 9)
    assert main != clone
    assert main.global_block().var("w").shape == (4, 1)


def test_verify_names_block_op_and_var() -> None:
    prog = Program()
    block = prog.global_block()
    block.create_var("a", shape=(2,))
    block.append_op("relu", {"X": ["a"]}, {"Out": ["missing"]})
    with pytest.raises(IRError, match=r"block 0, op 0 \(relu\): output Out var 'missing'"):
        T.verify(prog)


def test_verify_rejects_bad_role_and_sub_block() -> None:
    prog = Program()
    prog.global_block().create_var("a")
    op = prog.global_block().append_op("assign", {"X": ["a"]}, {"Out": ["a"]})
    op.attrs["op_role"] = 1 << 12
    with pytest.raises(IRError, match="op_role"):
        T.verify(prog)
    op.attrs["op_role"] = int(OpRole.Backward | OpRole.Loss)
    op.attrs["sub_block"] = BlockRef(3)
    with pytest.raises(IRError, match="sub-block reference 3"):
        T.verify(prog)
    del op.attrs["sub_block"]
    op.attrs["op_role_var"] = ["p"]
    with pytest.raises(IRError, match="op_role_var"):
        T.verify(prog)


def test_sub_block_reads_parent_vars() -> None:
    prog = Program()
    prog.global_block().create_var("a")
    sub = prog.create_block()
    sub.create_var("b")
    sub.append_op("assign", {"X": ["a"]}, {"Out": ["b"]})
    T.verify(prog)


def test_print_is_one_op_a_line() -> None:
    main, _ = _model()
    text = str(main)
    assert "Out=fc_0.tmp_0 = mul(X=x, Y=w) {x_num_col_dims=1, y_num_col_dims=1}" in text
    assert "[Backward|Loss]" in text
    assert "sub_block=block1" in text
    ops_shown = [line for line in text.splitlines() if line[:6].strip().rstrip(":").isdigit()]
    assert len(ops_shown) == sum(len(b.ops) for b in main.blocks)


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(IRError, match="var 'v': unknown dtype 'float8'"):
        Program().global_block().create_var("v", dtype="float8")


def test_op_helpers() -> None:
    op = Op("sum", {"X": ["a", "b"]}, {"Out": ["a"]})
    op.rename_input("a", "c")
    assert op.input("X") == ["c", "b"] and op.output("Out") == ["a"]
    assert op.role == OpRole.Forward
