"""Layers: functions that append Paddle-style ops to the current block and return output vars.

Op types, slot names and attributes follow Paddle's static graph (`fc` = `mul` +
`elementwise_add` + activation, `embedding` = `lookup_table`, ...), so programs read and compare
op for op. Shapes use -1 for the batch dimension. A layer never computes anything: the runtime
runs the ops it appends.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

from .framework import ParamAttr, append_op
from .framework import create_global_var as _framework_global_var
from .framework import create_parameter, create_tmp_var, default_main_program, unique_name
from .initializer import Constant, Xavier
from .ir import BlockRef, OpRole, Var

__all__ = [
    "data", "fc", "embedding", "sequence_pool", "concat", "relu", "tanh", "sigmoid", "softmax",
    "exp", "log", "sqrt", "square", "floor", "sign", "ceil", "cos", "cross_entropy", "softmax_with_cross_entropy",
    "square_error_cost", "mean", "scale", "sums", "reshape", "clip", "clip_by_norm",
    "elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div", "elementwise_max",
    "elementwise_min", "elementwise_pow", "increment", "less_than", "logical_and", "logical_or",
    "logical_xor", "logical_not", "cast", "fill_constant", "assign", "create_global_var",
    "autoincreased_step_counter", "ConditionalBlock", "conditional_block", "Switch",
]


def _check_var(arg: object, layer: str, what: str) -> Var:
    if not isinstance(arg, Var):
        raise TypeError(f"{layer}: {what} must be a Var, got {type(arg).__name__}")
    return arg


def data(name: str, shape: Sequence[int], dtype: str = "float32", lod_level: int = 0,
         append_batch_size: bool = True, stop_gradient: bool = True) -> Var:
    """Declare a fed input var; the batch dimension -1 is prepended unless already there."""
    shape = list(shape)
    if append_batch_size and (not shape or shape[0] != -1):
        shape = [-1] + shape
    block = default_main_program().global_block()
    return block.create_var(name, shape=tuple(shape), dtype=dtype, lod_level=lod_level,
                            stop_gradient=stop_gradient)


def _activation(x: Var, act: str | None) -> Var:
    if act is None:
        return x
    if act not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}; one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[act](x)


def _unary(op_type: str, x: Var, attrs: dict | None = None, dtype: str | None = None,
           shape: tuple[int, ...] | None = None) -> Var:
    x = _check_var(x, op_type, "x")
    out = create_tmp_var(op_type, shape if shape is not None else x.shape, dtype or x.dtype,
                         lod_level=x.lod_level)
    append_op(op_type, {"X": [x]}, {"Out": [out]}, attrs or {})
    return out


def relu(x: Var) -> Var:
    return _unary("relu", x)


def tanh(x: Var) -> Var:
    return _unary("tanh", x)


def sigmoid(x: Var) -> Var:
    return _unary("sigmoid", x)


def softmax(x: Var, axis: int = -1) -> Var:
    return _unary("softmax", x, {"axis": axis})


def exp(x: Var) -> Var:
    return _unary("exp", x)


def log(x: Var) -> Var:
    return _unary("log", x)


def sqrt(x: Var) -> Var:
    return _unary("sqrt", x)


def square(x: Var) -> Var:
    return _unary("square", x)


def floor(x: Var) -> Var:
    return _unary("floor", x)


def sign(x: Var) -> Var:
    return _unary("sign", x)


def ceil(x: Var) -> Var:
    return _unary("ceil", x)


def cos(x: Var) -> Var:
    return _unary("cos", x)


_ACTIVATIONS = {"relu": relu, "tanh": tanh, "sigmoid": sigmoid, "softmax": softmax}


def fc(input: Var | Sequence[Var], size: int, num_flatten_dims: int = 1,
       param_attr: ParamAttr | str | None = None, bias_attr: ParamAttr | str | bool | None = None,
       act: str | None = None, name: str | None = None) -> Var:
    """Fully connected: ``act(sum_i mul(input_i, w_i) + b)``."""
    inputs = [input] if isinstance(input, Var) else list(input)
    if not inputs:
        raise ValueError("fc: input is empty")
    if size < 1:
        raise ValueError(f"fc: size must be positive, got {size}")
    prefix = name or unique_name.generate("fc")
    attrs_w = [ParamAttr.of(param_attr)] * len(inputs)
    muls = []
    for x, pattr in zip(inputs, attrs_w):
        x = _check_var(x, "fc", "input")
        if len(x.shape) <= num_flatten_dims:
            raise ValueError(f"fc: input {x.name!r} of shape {x.shape} has no dims past "
                             f"num_flatten_dims={num_flatten_dims}")
        in_dim = math.prod(x.shape[num_flatten_dims:])
        assert pattr is not None
        w = create_parameter(pattr, [in_dim, size], x.dtype, Xavier(), prefix + ".w")
        out = create_tmp_var(prefix, tuple(x.shape[:num_flatten_dims]) + (size,), x.dtype,
                             lod_level=x.lod_level)
        append_op("mul", {"X": [x], "Y": [w]}, {"Out": [out]},
                  {"x_num_col_dims": num_flatten_dims, "y_num_col_dims": 1})
        muls.append(out)
    pre_bias = muls[0] if len(muls) == 1 else sums(muls)
    battr = ParamAttr.of(bias_attr)
    if battr is not None:
        b = create_parameter(battr, [size], pre_bias.dtype, Constant(0.0), prefix + ".b")
        out = create_tmp_var(prefix, pre_bias.shape, pre_bias.dtype, lod_level=pre_bias.lod_level)
        append_op("elementwise_add", {"X": [pre_bias], "Y": [b]}, {"Out": [out]},
                  {"axis": num_flatten_dims})
        pre_bias = out
    return _activation(pre_bias, act)


def embedding(input: Var, size: Sequence[int], is_sparse: bool = False,
              is_distributed: bool = False, padding_idx: int | None = None,
              param_attr: ParamAttr | str | None = None, dtype: str = "float32") -> Var:
    """`lookup_table`: rows of a [vocab, dim] table for int64 ids of shape [-1, 1]."""
    input = _check_var(input, "embedding", "input")
    if input.dtype not in ("int64", "int32"):
        raise TypeError(f"embedding: ids {input.name!r} must be int64, got {input.dtype}")
    if len(size) != 2:
        raise ValueError(f"embedding: size must be [vocab, dim], got {list(size)}")
    vocab, dim = int(size[0]), int(size[1])
    pad = -1 if padding_idx is None else (padding_idx if padding_idx >= 0 else vocab + padding_idx)
    if not -1 <= pad < vocab:
        raise ValueError(f"embedding: padding_idx {padding_idx} outside vocabulary of {vocab}")
    pattr = ParamAttr.of(param_attr)
    assert pattr is not None
    w = create_parameter(pattr, [vocab, dim], dtype, Xavier(), "embedding.w")
    out_shape = tuple(input.shape[:-1]) + (dim,) if input.shape[-1] == 1 else tuple(input.shape) + (dim,)
    out = create_tmp_var("embedding", out_shape, dtype, lod_level=input.lod_level)
    append_op("lookup_table", {"W": [w], "Ids": [input]}, {"Out": [out]},
              {"is_sparse": is_sparse, "is_distributed": is_distributed, "padding_idx": pad,
               "remote_prefetch": False})
    return out


def sequence_pool(input: Var, pool_type: str) -> Var:
    """Pool each LoD sequence of `input` to one row: average, sum, or max."""
    input = _check_var(input, "sequence_pool", "input")
    kind = pool_type.upper()
    if kind not in ("AVERAGE", "SUM", "MAX", "SQRT", "FIRST", "LAST"):
        raise ValueError(f"sequence_pool: unknown pool_type {pool_type!r}")
    if input.lod_level < 1:
        raise ValueError(f"sequence_pool: input {input.name!r} has no LoD (lod_level 0)")
    out = create_tmp_var("sequence_pool", input.shape, input.dtype)
    index = create_tmp_var("sequence_pool", input.shape, "int32", stop_gradient=True)
    append_op("sequence_pool", {"X": [input]}, {"Out": [out], "MaxIndex": [index]},
              {"pooltype": kind, "is_test": False})
    return out


def concat(input: Sequence[Var], axis: int = 0) -> Var:
    xs = [_check_var(x, "concat", "input") for x in input]
    if not xs:
        raise ValueError("concat: input is empty")
    rank = len(xs[0].shape)
    ax = axis % rank
    shape = list(xs[0].shape)
    dims = [x.shape[ax] for x in xs]
    shape[ax] = -1 if any(d < 0 for d in dims) else sum(dims)
    out = create_tmp_var("concat", tuple(shape), xs[0].dtype, lod_level=xs[0].lod_level)
    append_op("concat", {"X": xs}, {"Out": [out]}, {"axis": axis})
    return out


def cross_entropy(input: Var, label: Var, soft_label: bool = False,
                  ignore_index: int = -100) -> Var:
    input, label = _check_var(input, "cross_entropy", "input"), _check_var(label, "cross_entropy", "label")
    out = create_tmp_var("cross_entropy", tuple(input.shape[:-1]) + (1,), input.dtype)
    append_op("cross_entropy", {"X": [input], "Label": [label]}, {"Y": [out]},
              {"soft_label": soft_label, "ignore_index": ignore_index})
    return out


def softmax_with_cross_entropy(logits: Var, label: Var, soft_label: bool = False,
                               ignore_index: int = -100) -> Var:
    logits = _check_var(logits, "softmax_with_cross_entropy", "logits")
    soft = create_tmp_var("softmax_with_cross_entropy", logits.shape, logits.dtype)
    loss = create_tmp_var("softmax_with_cross_entropy", tuple(logits.shape[:-1]) + (1,), logits.dtype)
    append_op("softmax_with_cross_entropy", {"Logits": [logits], "Label": [label]},
              {"Softmax": [soft], "Loss": [loss]},
              {"soft_label": soft_label, "ignore_index": ignore_index})
    return loss


def _elementwise(op_type: str, x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    x, y = _check_var(x, op_type, "x"), _check_var(y, op_type, "y")
    out = create_tmp_var(op_type, x.shape, x.dtype, lod_level=x.lod_level)
    append_op(op_type, {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": axis})
    return _activation(out, act)


def elementwise_add(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_add", x, y, axis, act)


def elementwise_sub(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_sub", x, y, axis, act)


def elementwise_mul(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_mul", x, y, axis, act)


def elementwise_div(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_div", x, y, axis, act)


def elementwise_max(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_max", x, y, axis, act)


def elementwise_min(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_min", x, y, axis, act)


def elementwise_pow(x: Var, y: Var, axis: int = -1, act: str | None = None) -> Var:
    return _elementwise("elementwise_pow", x, y, axis, act)


def square_error_cost(input: Var, label: Var) -> Var:
    """(input - label)^2, elementwise: `elementwise_sub` + `square`."""
    return square(elementwise_sub(input, label))


def mean(x: Var) -> Var:
    x = _check_var(x, "mean", "x")
    out = create_tmp_var("mean", (1,), x.dtype)
    append_op("mean", {"X": [x]}, {"Out": [out]})
    return out


def scale(x: Var, scale: float = 1.0, bias: float = 0.0, bias_after_scale: bool = True,
          out: Var | None = None) -> Var:
    x = _check_var(x, "scale", "x")
    out = out or create_tmp_var("scale", x.shape, x.dtype, lod_level=x.lod_level)
    append_op("scale", {"X": [x]}, {"Out": [out]},
              {"scale": float(scale), "bias": float(bias), "bias_after_scale": bias_after_scale})
    return out


def sums(input: Sequence[Var], out: Var | None = None) -> Var:
    xs = [_check_var(x, "sums", "input") for x in input]
    out = out or create_tmp_var("sum", xs[0].shape, xs[0].dtype, lod_level=xs[0].lod_level)
    append_op("sum", {"X": xs}, {"Out": [out]})
    return out


def reshape(x: Var, shape: Sequence[int]) -> Var:
    return _unary("reshape", x, {"shape": list(shape)}, shape=tuple(shape))


def clip(x: Var, min: float, max: float) -> Var:
    if min > max:
        raise ValueError(f"clip: min {min} is greater than max {max}")
    return _unary("clip", x, {"min": float(min), "max": float(max)})


def clip_by_norm(x: Var, max_norm: float) -> Var:
    if max_norm <= 0:
        raise ValueError(f"clip_by_norm: max_norm must be positive, got {max_norm}")
    return _unary("clip_by_norm", x, {"max_norm": float(max_norm)})


def increment(x: Var, value: float = 1.0, in_place: bool = True) -> Var:
    x = _check_var(x, "increment", "x")
    out = x if in_place else create_tmp_var("increment", x.shape, x.dtype)
    append_op("increment", {"X": [x]}, {"Out": [out]}, {"step": float(value)})
    return out


def _compare(op_type: str, x: Var, y: Var) -> Var:
    x, y = _check_var(x, op_type, "x"), _check_var(y, op_type, "y")
    out = create_tmp_var(op_type, x.shape, "bool", stop_gradient=True)
    append_op(op_type, {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": -1})
    return out


def less_than(x: Var, y: Var) -> Var:
    return _compare("less_than", x, y)


def logical_and(x: Var, y: Var) -> Var:
    return _compare("logical_and", x, y)


def logical_or(x: Var, y: Var) -> Var:
    return _compare("logical_or", x, y)


def logical_xor(x: Var, y: Var) -> Var:
    return _compare("logical_xor", x, y)


def logical_not(x: Var) -> Var:
    x = _check_var(x, "logical_not", "x")
    out = create_tmp_var("logical_not", x.shape, "bool", stop_gradient=True)
    append_op("logical_not", {"X": [x]}, {"Out": [out]})
    return out


def cast(x: Var, dtype: str) -> Var:
    x = _check_var(x, "cast", "x")
    out = create_tmp_var("cast", x.shape, dtype, lod_level=x.lod_level, stop_gradient=x.stop_gradient)
    append_op("cast", {"X": [x]}, {"Out": [out]}, {"in_dtype": x.dtype, "out_dtype": dtype})
    return out


def fill_constant(shape: Sequence[int], dtype: str, value: float, out: Var | None = None,
                  force_cpu: bool = False) -> Var:
    out = out or create_tmp_var("fill_constant", tuple(shape), dtype, stop_gradient=True)
    append_op("fill_constant", {}, {"Out": [out]},
              {"shape": list(shape), "dtype": dtype, "value": float(value), "force_cpu": force_cpu})
    return out


def assign(input: Var, output: Var | None = None) -> Var:
    input = _check_var(input, "assign", "input")
    output = output or create_tmp_var("assign", input.shape, input.dtype, lod_level=input.lod_level)
    append_op("assign", {"X": [input]}, {"Out": [output]})
    return output


def autoincreased_step_counter(counter_name: str = "@STEP_COUNTER@", begin: int = 1,
                               step: int = 1) -> Var:
    """A persistable int64 counter, `begin - 1` at startup, raised by an `increment` that is
    put first in the main program, so the first step reads `begin`."""
    block = default_main_program().global_block()
    if block.has_var(counter_name):
        return block.var(counter_name)
    counter = _framework_global_var(counter_name, [1], begin - 1, dtype="int64")
    block.prepend_op("increment", {"X": [counter_name]}, {"Out": [counter_name]},
                     {"step": float(step), "op_role": int(OpRole.LRSched)})
    counter.stop_gradient = True
    return counter


class ConditionalBlock:
    """`with ConditionalBlock([cond]).block(): ...` puts the body into a sub-block that runs when
    `cond` holds; one `conditional_block` op is appended to the parent when the body closes."""

    def __init__(self, inputs: Sequence[Var], is_scalar_condition: bool = True) -> None:
        self.inputs = [_check_var(x, "ConditionalBlock", "condition") for x in inputs]
        self.is_scalar_condition = is_scalar_condition

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        program = default_main_program()
        parent = program.current_block()
        sub = program.create_block()
        try:
            yield
        finally:
            program.rollback()
        reads = _outer_names(sub.ops, "inputs", sub.vars)
        writes = _outer_names(sub.ops, "outputs", sub.vars)
        append_op("conditional_block", {"Cond": self.inputs, "Input": reads}, {"Out": writes},
                  {"sub_block": BlockRef(sub.idx), "is_scalar_condition": self.is_scalar_condition},
                  block=parent)


def _outer_names(ops: list, side: str, local: dict) -> list[str]:
    seen: list[str] = []
    for op in ops:
        for name in (op.input_arg_names if side == "inputs" else op.output_arg_names):
            if name not in local and name not in seen:
                seen.append(name)
    return seen


@contextlib.contextmanager
def conditional_block(cond: Var) -> Iterator[None]:
    with ConditionalBlock([cond]).block():
        yield


class Switch:
    """Paddle's `Switch`: cases are tried in order; `default()` runs when none held."""

    def __init__(self) -> None:
        self.pre_not_conditions: list[Var] = []

    def __enter__(self) -> "Switch":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def case(self, condition: Var) -> contextlib.AbstractContextManager[None]:
        if not self.pre_not_conditions:
            cond = condition
            self.pre_not_conditions.append(logical_not(condition))
        else:
            pre_not = self.pre_not_conditions[-1]
            self.pre_not_conditions.append(logical_and(pre_not, logical_not(condition)))
            cond = logical_and(pre_not, condition)
        return ConditionalBlock([cond]).block()

    def default(self) -> contextlib.AbstractContextManager[None]:
        if not self.pre_not_conditions:
            raise ValueError("Switch.default() needs at least one case before it")
        return ConditionalBlock([self.pre_not_conditions[-1]]).block()


def create_global_var(shape: Sequence[int], value: float, dtype: str, persistable: bool = False,
                      force_cpu: bool = False, name: str | None = None) -> Var:
    """A var of the main program's global block filled with `value` by the startup program."""
    return _framework_global_var(name or unique_name.generate("global_var"), list(shape), value,
                                 dtype, persistable, force_cpu)
