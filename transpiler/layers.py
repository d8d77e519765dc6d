"""Layers: functions that append Paddle-style ops to the current block and return output vars.

Op types, slot names and attributes follow Paddle's static graph (`fc` = `mul` +
`elementwise_add` + activation, `embedding` = `lookup_table`, `embedding_v2` = `lookup_table_v2`, ...), so programs read and compare
op for op. Shapes use -1 for the batch dimension. A layer never computes anything: the runtime
runs the ops it appends.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import os
from typing import Any, Iterator, Sequence

from .framework import ParamAttr, append_op
from .framework import create_global_var as _framework_global_var
from .framework import (create_parameter, create_tmp_var, default_main_program, env_paddle_version,
                        unique_name)
from .initializer import Constant, Normal, Xavier
from .ir import BlockRef, OpRole, Var, keeps_rows

__all__ = [
    "data", "fc", "embedding", "embedding_v2", "nce", "sequence_pool", "concat", "relu", "tanh", "sigmoid", "softmax",
    "exp", "log", "sqrt", "square", "floor", "sign", "ceil", "cos", "cross_entropy", "softmax_with_cross_entropy",
    "square_error_cost", "mean", "scale", "sums", "reshape", "clip", "clip_by_norm",
    "elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div", "elementwise_max",
    "elementwise_min", "elementwise_pow", "increment", "less_than", "logical_and", "logical_or",
    "logical_xor", "logical_not", "cast", "fill_constant", "assign", "create_global_var",
    "autoincreased_step_counter", "ConditionalBlock", "conditional_block", "Switch",
    "conv2d", "pool2d", "batch_norm", "layer_norm", "dropout", "matmul", "transpose", "squeeze",
    "unsqueeze", "split", "slice", "gather", "sigmoid_cross_entropy_with_logits",
    "gelu", "silu", "leaky_relu", "elu", "softplus", "brelu", "reduce_sum", "reduce_mean",
    "fill_constant_batch_size_like", "hsigmoid", "topk", "accuracy", "auc", "sequence_conv",
    "softsign", "cos_sim",
]


def _check_var(arg: object, layer: str, what: str) -> Var:
    if not isinstance(arg, Var):
        raise TypeError(f"{layer}: {what} must be a Var, got {type(arg).__name__}")
    return arg


def data(name: str, shape: Sequence[int], dtype: str = "float32", lod_level: int = 0,
         append_batch_size: bool = True, stop_gradient: bool = True) -> Var:
    """Declare a fed input var (`Var.is_data`); the batch dimension -1 is prepended unless
    already there."""
    shape = list(shape)
    if append_batch_size and (not shape or shape[0] != -1):
        shape = [-1] + shape
    block = default_main_program().global_block()
    return block.create_var(name, shape=tuple(shape), dtype=dtype, lod_level=lod_level,
                            stop_gradient=stop_gradient, is_data=True)


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


def softsign(x: Var, name: str | None = None) -> Var:
    """x / (1 + |x|)."""
    return _unary("softsign", x)


def gelu(x: Var, approximate: bool = False) -> Var:
    """x * Phi(x), Phi the normal CDF (erf); `approximate`: its tanh approximation."""
    return _unary("gelu", x, {"approximate": approximate})


def silu(x: Var) -> Var:
    """x * sigmoid(x)."""
    return _unary("silu", x)


def leaky_relu(x: Var, alpha: float = 0.02) -> Var:
    """x where x > 0, else alpha * x."""
    return _unary("leaky_relu", x, {"alpha": alpha})


def elu(x: Var, alpha: float = 1.0) -> Var:
    """x where x > 0, else alpha * (exp(x) - 1)."""
    return _unary("elu", x, {"alpha": alpha})


def softplus(x: Var, beta: float = 1.0, threshold: float = 20.0) -> Var:
    """log(1 + exp(beta * x)) / beta, or x where beta * x > threshold."""
    return _unary("softplus", x, {"beta": beta, "threshold": threshold})


def brelu(x: Var, t_min: float = 0.0, t_max: float = 24.0) -> Var:
    """x clipped to [t_min, t_max], the gradient 0 outside (torch's Hardtanh)."""
    return _unary("brelu", x, {"t_min": t_min, "t_max": t_max})


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
              param_attr: ParamAttr | str | None = None, dtype: str = "float32",
              remote_prefetch: bool | None = None) -> Var:
    """`lookup_table` (Paddle's ``fluid.layers.embedding``): rows of a [vocab, dim] table for
    int64 ids of shape [-1, 1]; Out drops the ids' trailing 1. `remote_prefetch` (pslab's;
    needs `is_sparse` and no `is_distributed`): a distributed trainer reads the table's rows
    from the pservers (docs/transpiler.md, section 6); None: the release's default for a
    sparse lookup of a trainable table that is not distributed (`default_remote_prefetch`)."""
    return _embedding("lookup_table", input, size, is_sparse, is_distributed, padding_idx,
                      param_attr, dtype, remote_prefetch)


def embedding_v2(input: Var, size: Sequence[int], is_sparse: bool = False,
                 is_distributed: bool = False, padding_idx: int | None = None,
                 param_attr: ParamAttr | str | None = None, dtype: str = "float32",
                 remote_prefetch: bool | None = None) -> Var:
    """`lookup_table_v2` (Paddle's ``fluid.embedding``): ids of any shape, [N] or [N, L], and
    Out is their shape + [dim], a trailing 1 kept. `remote_prefetch` as `embedding`'s."""
    return _embedding("lookup_table_v2", input, size, is_sparse, is_distributed, padding_idx,
                      param_attr, dtype, remote_prefetch)


def _embedding(op_type: str, input: Var, size: Sequence[int], is_sparse: bool,
               is_distributed: bool, padding_idx: int | None, param_attr: ParamAttr | str | None,
               dtype: str, remote_prefetch: bool | None) -> Var:
    input = _check_var(input, "embedding", "input")
    pattr = ParamAttr.of(param_attr)
    assert pattr is not None
    remote_prefetch = _lookup_remote_prefetch(remote_prefetch, is_sparse, is_distributed,
                                              pattr.trainable)
    if input.dtype not in ("int64", "int32"):
        raise TypeError(f"embedding: ids {input.name!r} must be int64, got {input.dtype}")
    if len(size) != 2:
        raise ValueError(f"embedding: size must be [vocab, dim], got {list(size)}")
    vocab, dim = int(size[0]), int(size[1])
    pad = -1 if padding_idx is None else (padding_idx if padding_idx >= 0 else vocab + padding_idx)
    if not -1 <= pad < vocab:
        raise ValueError(f"embedding: padding_idx {padding_idx} outside vocabulary of {vocab}")
    w = create_parameter(pattr, [vocab, dim], dtype, Xavier(), "embedding.w")
    v1_drops_one = op_type == "lookup_table" and input.shape[-1] == 1
    out_shape = (tuple(input.shape[:-1]) if v1_drops_one else tuple(input.shape)) + (dim,)
    out = create_tmp_var("embedding", out_shape, dtype, lod_level=input.lod_level)
    append_op(op_type, {"W": [w], "Ids": [input]}, {"Out": [out]},
              {"is_sparse": is_sparse, "is_distributed": is_distributed, "padding_idx": pad,
               "remote_prefetch": remote_prefetch})
    return out


def _lookup_remote_prefetch(asked: bool | None, is_sparse: bool, is_distributed: bool,
                            trainable: bool) -> bool:
    """A lookup's ``remote_prefetch``: `asked`, or the default when None (for a `trainable`
    table); ValueError where it is asked of a lookup that is not sparse or is the distributed
    table."""
    eligible = is_sparse and not is_distributed
    if asked is None:
        return default_remote_prefetch(eligible and trainable)
    if asked and not eligible:
        raise ValueError("embedding: remote_prefetch needs is_sparse and no is_distributed "
                         "(the pservers take a sparse grad; the distributed table has its own "
                         "prefetch)")
    return bool(asked)


REMOTE_PREFETCH_ENV = "PADDLE_ENABLE_REMOTE_PREFETCH"
"""Read when a layer is built: "0" turns the default remote prefetch off in every release,
any other non-empty value turns it on in every release (`default_remote_prefetch`)."""
REMOTE_PREFETCH_RELEASES = frozenset({"1.8", "2.x"})
"""The releases whose layers marked every sparse lookup that is not distributed, and every
sparse `nce`, ``remote_prefetch`` unasked; 1.2's did so only under the switch."""


def default_remote_prefetch(eligible: bool) -> bool:
    """Whether an `eligible` layer (sparse, not the distributed table, its table trainable:
    the transpiler refuses to prefetch a table no optimizer updates) prefetches its rows
    remotely when the call leaves it to the default (docs/transpiler.md §9): as
    ``PADDLE_ENABLE_REMOTE_PREFETCH`` says when it is set ("0" off, anything else on), else as
    the release in force when the layer is built (`env_paddle_version`: on with "1.8", the
    default, and "2.x"; off with "1.2")."""
    if not eligible:
        return False
    switch = os.environ.get(REMOTE_PREFETCH_ENV, "")
    if switch:
        return switch != "0"
    return env_paddle_version() in REMOTE_PREFETCH_RELEASES


NCE_SAMPLERS = {"uniform": 0, "log_uniform": 1, "custom_dist": 2}
NCE_STEP = "@NCE_STEP@"


def nce(input: Var, label: Var, num_total_classes: int, sample_weight: Var | None = None,
        param_attr: ParamAttr | str | None = None,
        bias_attr: ParamAttr | str | bool | None = None, num_neg_samples: int | None = None,
        name: str | None = None, sampler: str = "uniform",
        custom_dist: Sequence[float] | None = None, seed: int = 0, is_sparse: bool = False,
        remote_prefetch: bool | None = None) -> Var:
    """Paddle's ``fluid.layers.nce``: noise-contrastive estimation of `input` ([N, D]) against
    the int64 `label` ([N, num_true]) over a [num_total_classes, D] weight (and a
    [num_total_classes, 1] bias), with `num_neg_samples` (default 10) negatives per row drawn
    by `sampler` (``uniform``, ``log_uniform``, or ``custom_dist`` with `custom_dist` the
    probability of each class). Returns the `nce` op's Cost / (num_neg_samples + 1), as Paddle's
    layer does. `is_sparse`: the weight's gradient is SELECTED_ROWS; `remote_prefetch` (needs
    `is_sparse`): a distributed trainer prefetches only the rows of the sampled classes from
    the pservers (docs/transpiler.md, section 6); None: the release's default for a sparse
    nce of a trainable weight (`default_remote_prefetch`). The draws are keyed by `seed` (the program's
    random seed when 0) and a step counter, ``@NCE_STEP@``, raised once per step
    (`runtime.execution.kernels.sampling`)."""
    input = _check_var(input, "nce", "input")
    label = _check_var(label, "nce", "label")
    if label.dtype != "int64":
        raise TypeError(f"nce: label {label.name!r} must be int64, got {label.dtype}")
    if sampler not in NCE_SAMPLERS:
        raise ValueError(f"nce: sampler {sampler!r} is not one of {sorted(NCE_SAMPLERS)}")
    wattr = ParamAttr.of(param_attr) or ParamAttr()
    if remote_prefetch is None:
        remote_prefetch = default_remote_prefetch(is_sparse and wattr.trainable)
    if remote_prefetch and not is_sparse:
        raise ValueError("nce: remote_prefetch needs is_sparse (the pservers take a sparse grad)")
    classes, neg = int(num_total_classes), 10 if num_neg_samples is None else int(num_neg_samples)
    if classes < 2 or neg < 1:
        raise ValueError(f"nce: num_total_classes {classes} must be at least 2 and "
                         f"num_neg_samples {neg} at least 1")
    dim, prefix = int(input.shape[-1]), name or unique_name.generate("nce")
    w = create_parameter(wattr, [classes, dim], input.dtype, Xavier(), prefix + ".w")
    inputs: dict[str, list[Var]] = {"Input": [input], "Label": [label], "Weight": [w],
                                    "Step": [_nce_step()]}
    battr = ParamAttr.of(bias_attr)
    if battr is not None:
        inputs["Bias"] = [create_parameter(battr, [classes, 1], input.dtype, Constant(0.0),
                                           prefix + ".b")]
    if sample_weight is not None:
        inputs["SampleWeight"] = [_check_var(sample_weight, "nce", "sample_weight")]
    if sampler == "custom_dist":
        inputs.update(_custom_dist(custom_dist, classes))
    width = int(label.shape[-1]) + neg
    cost = create_tmp_var(prefix, (input.shape[0], 1), input.dtype)
    logits = create_tmp_var(prefix, (input.shape[0], width), input.dtype, stop_gradient=True)
    labels = create_tmp_var(prefix, (input.shape[0], width), "int64", stop_gradient=True)
    append_op("nce", inputs, {"Cost": [cost], "SampleLogits": [logits], "SampleLabels": [labels]},
              {"num_total_classes": classes, "num_neg_samples": neg, "seed": int(seed),
               "sampler": NCE_SAMPLERS[sampler], "is_sparse": is_sparse,
               "remote_prefetch": remote_prefetch, "custom_neg_classes": []})
    return scale(cost, 1.0 / (neg + 1))


def hsigmoid(input: Var, label: Var, num_classes: int,
             param_attr: ParamAttr | str | None = None,
             bias_attr: ParamAttr | str | bool | None = None, name: str | None = None,
             path_table: Var | None = None, path_code: Var | None = None,
             is_custom: bool = False, is_sparse: bool = False) -> Var:
    """fluid's ``fluid.layers.hsigmoid``: the hierarchical-sigmoid loss [N, 1] of `input`
    ([N, D]) for the int64 `label` ([N, 1]), one `hierarchical_sigmoid` op. Default tree:
    a [num_classes - 1, D] weight (and [num_classes - 1, 1] bias), a class's path fixed by
    its code (`runtime.execution.kernels.common.hsigmoid_codes`). Custom tree (`is_custom`,
    with int64 `path_table` and `path_code` [N, L], a path ending at its first negative id):
    [num_classes, D] and [num_classes, 1]. `is_sparse` (a custom tree only; fluid turns it off
    with the default tree, and so does this layer): W's gradient is SELECTED_ROWS of the path
    ids. The op's ``remote_prefetch`` is False: pslab's transpiler treats W as any sparse
    parameter (fluid marks it for prefetching when `is_sparse`)."""
    input = _check_var(input, "hsigmoid", "input")
    label = _check_var(label, "hsigmoid", "label")
    if not is_custom:
        if num_classes is None or int(num_classes) < 2:
            raise ValueError("hsigmoid: num_classes must be at least 2 with the default tree")
        if path_table is not None or path_code is not None:
            raise ValueError("hsigmoid: path_table and path_code need is_custom=True")
        is_sparse = False
    elif path_table is None or path_code is None or num_classes is None:
        raise ValueError("hsigmoid: a custom tree needs path_table, path_code and num_classes")
    rows = int(num_classes) if is_custom else int(num_classes) - 1
    dim, prefix = int(input.shape[-1]), name or unique_name.generate("hierarchical_sigmoid")
    w = create_parameter(ParamAttr.of(param_attr) or ParamAttr(), [rows, dim], input.dtype,
                         Xavier(), prefix + ".w")
    inputs: dict[str, list[Var]] = {"X": [input], "W": [w], "Label": [label]}
    if is_custom:
        assert path_table is not None and path_code is not None
        inputs["PathTable"] = [_check_var(path_table, "hsigmoid", "path_table")]
        inputs["PathCode"] = [_check_var(path_code, "hsigmoid", "path_code")]
        width = int(path_table.shape[-1])
    else:
        width = (int(num_classes) - 1).bit_length()
    battr = ParamAttr.of(bias_attr)
    if battr is not None:
        inputs["Bias"] = [create_parameter(battr, [rows, 1], input.dtype, Constant(0.0),
                                           prefix + ".b")]
    out = create_tmp_var(prefix, (input.shape[0], 1), input.dtype)
    pre_out = create_tmp_var(prefix, (input.shape[0], width), input.dtype, stop_gradient=True)
    append_op("hierarchical_sigmoid", inputs, {"Out": [out], "PreOut": [pre_out]},
              {"num_classes": int(num_classes), "is_sparse": bool(is_sparse),
               "remote_prefetch": False})
    return out


def _nce_step() -> Var:
    """The step counter the nce draws are keyed on: -1 at startup, raised by an `increment`
    put first in the main program (a forward op, so a trainer keeps it)."""
    block = default_main_program().global_block()
    if block.has_var(NCE_STEP):
        return block.var(NCE_STEP)
    counter = _framework_global_var(NCE_STEP, [1], -1, dtype="int64")
    block.prepend_op("increment", {"X": [NCE_STEP]}, {"Out": [NCE_STEP]},
                     {"step": 1.0, "op_role": int(OpRole.Forward)})
    return counter


def _custom_dist(probs: Sequence[float] | None, classes: int) -> dict[str, list[Var]]:
    """CustomDistProbs, CustomDistAlias, CustomDistAliasProbs: the distribution and its alias
    table, carried by `assign_value` ops."""
    if probs is None or len(probs) != classes:
        raise ValueError(f"nce: custom_dist must give the probability of each of the {classes} "
                         f"classes, got {None if probs is None else len(probs)}")
    values = [float(p) for p in probs]
    if min(values) < 0 or not math.isclose(sum(values), 1.0, rel_tol=1e-4):
        raise ValueError(f"nce: custom_dist must be probabilities adding up to 1, "
                         f"got a sum of {sum(values)}")
    alias, accept = _alias_table(values)
    slots: dict[str, tuple[str, str, list[Any]]] = {
        "CustomDistProbs": ("float32", "fp32_values", values),
        "CustomDistAlias": ("int32", "int32_values", alias),
        "CustomDistAliasProbs": ("float32", "fp32_values", accept)}
    out = {}
    for slot, (dtype, attr, data) in slots.items():
        var = create_tmp_var("nce.custom_dist", (classes,), dtype, stop_gradient=True)
        append_op("assign_value", {}, {"Out": [var]},
                  {"shape": [classes], "dtype": dtype, attr: list(data)})
        out[slot] = [var]
    return out


def _alias_table(probs: list[float]) -> tuple[list[int], list[float]]:
    """Walker's alias table (Vose's construction): each class's alias (-1: none) and the
    probability of keeping the class itself."""
    n = len(probs)
    scaled = [p * n for p in probs]
    alias, accept = [-1] * n, [1.0] * n
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        accept[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    return alias, accept


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


def sequence_conv(input: Var, num_filters: int, filter_size: int = 3, filter_stride: int = 1,
                  padding: bool = True, padding_start: int | None = None,
                  bias_attr: ParamAttr | str | bool | None = None,
                  param_attr: ParamAttr | str | None = None, act: str | None = None,
                  name: str | None = None) -> Var:
    """fluid's ``sequence_conv``: one `sequence_conv` op over the LoD sequences of `input` ([T,
    D]): row t of each sequence sees rows t + padding_start .. t + padding_start + filter_size -
    1 of its own sequence (zeros past either end; `padding_start` defaults to -(filter_size //
    2), centring the window), times a [filter_size * D, num_filters] filter; then a bias over
    the filters (`elementwise_add`, axis 1) and `act`. The output keeps the input's LoD.
    `padding` is fluid's and changes nothing there either: the padding is never trainable."""
    input = _check_var(input, "sequence_conv", "input")
    if input.lod_level < 1 or len(input.shape) != 2:
        raise ValueError(f"sequence_conv: input {input.name!r} must be [T, D] with LoD, got "
                         f"shape {input.shape}, lod_level {input.lod_level}")
    if filter_size < 1 or num_filters < 1 or filter_stride != 1:
        raise ValueError(f"sequence_conv: filter_size {filter_size} and num_filters "
                         f"{num_filters} must be positive and filter_stride 1")
    prefix = name or unique_name.generate("sequence_conv")
    start = -(filter_size // 2) if padding_start is None else int(padding_start)
    w = create_parameter(ParamAttr.of(param_attr) or ParamAttr(),
                         [filter_size * input.shape[1], num_filters], input.dtype, Xavier(),
                         prefix + ".w")
    out = create_tmp_var(prefix, (input.shape[0], num_filters), input.dtype,
                         lod_level=input.lod_level)
    append_op("sequence_conv", {"X": [input], "Filter": [w]}, {"Out": [out]},
              {"contextStride": filter_stride, "contextStart": start,
               "contextLength": filter_size})
    return _activation(_bias(out, bias_attr, prefix), act)


def _bias(x: Var, bias_attr: ParamAttr | str | bool | None, prefix: str) -> Var:
    """`x` plus a bias over its dim 1 (`elementwise_add`, axis 1), unless `bias_attr` is False."""
    battr = ParamAttr.of(bias_attr)
    if battr is None:
        return x
    b = create_parameter(battr, [x.shape[1]], x.dtype, Constant(0.0), prefix + ".b")
    out = create_tmp_var(prefix, x.shape, x.dtype, lod_level=x.lod_level)
    append_op("elementwise_add", {"X": [x], "Y": [b]}, {"Out": [out]}, {"axis": 1})
    return out


def cos_sim(X: Var, Y: Var) -> Var:
    """fluid's ``cos_sim``: the cosine of each row of X with Y's row (Y has X's rows, or one
    row for all), [N, 1], by a `cos_sim` op (which also writes the rows' norms)."""
    X, Y = _check_var(X, "cos_sim", "X"), _check_var(Y, "cos_sim", "Y")
    if len(X.shape) < 2 or len(X.shape) != len(Y.shape):
        raise ValueError(f"cos_sim: X {X.shape} and Y {Y.shape} must be of one rank, 2 or more")
    out = create_tmp_var("cos_sim", (X.shape[0], 1), X.dtype, lod_level=X.lod_level)
    xnorm = create_tmp_var("cos_sim", (X.shape[0], 1), X.dtype)
    ynorm = create_tmp_var("cos_sim", (Y.shape[0], 1), X.dtype)
    append_op("cos_sim", {"X": [X], "Y": [Y]}, {"Out": [out], "XNorm": [xnorm], "YNorm": [ynorm]})
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
    """fluid's ``layers.cross_entropy`` of probabilities `input` ([..., classes]) against `label`:
    [..., 1]. Hard labels write `cross_entropy2` (grad op `cross_entropy_grad2`), as fluid 1.8
    and later did, unless ``PSLAB_PADDLE_VERSION`` is "1.2" (`env_paddle_version`), whose
    layer, like soft labels in every release, wrote `cross_entropy`."""
    input, label = _check_var(input, "cross_entropy", "input"), _check_var(label, "cross_entropy", "label")
    lead = tuple(input.shape[:-1]) + (1,)
    out = create_tmp_var("cross_entropy", lead, input.dtype)
    if soft_label or env_paddle_version() == "1.2":
        append_op("cross_entropy", {"X": [input], "Label": [label]}, {"Y": [out]},
                  {"soft_label": soft_label, "ignore_index": ignore_index})
        return out
    match = create_tmp_var("cross_entropy", lead, input.dtype, stop_gradient=True)
    append_op("cross_entropy2", {"X": [input], "Label": [label]}, {"Y": [out], "MatchX": [match]},
              {"ignore_index": ignore_index})
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


def _elementwise(op_type: str, x: Var, y: Var, axis: int = -1, act: str | None = None,
                 name: str | None = None) -> Var:
    """X op Y (Paddle's broadcast by `axis`), then `act`; `name` prefixes the output's name."""
    x, y = _check_var(x, op_type, "x"), _check_var(y, op_type, "y")
    out = create_tmp_var(name or op_type, x.shape, x.dtype, lod_level=x.lod_level)
    append_op(op_type, {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": axis})
    return _activation(out, act)


def elementwise_add(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_add", x, y, axis, act, name)


def elementwise_sub(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_sub", x, y, axis, act, name)


def elementwise_mul(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_mul", x, y, axis, act, name)


def elementwise_div(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_div", x, y, axis, act, name)


def elementwise_max(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_max", x, y, axis, act, name)


def elementwise_min(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_min", x, y, axis, act, name)


def elementwise_pow(x: Var, y: Var, axis: int = -1, act: str | None = None,
                    name: str | None = None) -> Var:
    return _elementwise("elementwise_pow", x, y, axis, act, name)


def square_error_cost(input: Var, label: Var) -> Var:
    """(input - label)^2, elementwise: `elementwise_sub` + `square`."""
    return square(elementwise_sub(input, label))


def topk(input: Var, k: int, name: str | None = None) -> tuple[Var, Var]:
    """fluid's ``topk``: the `k` largest values along `input`'s last dim (largest first) and
    their int64 positions, by one `top_k` op. No gradient flows through it."""
    input = _check_var(input, "topk", "input")
    if k < 1:
        raise ValueError(f"topk: k must be positive, got {k}")
    shape = tuple(input.shape[:-1]) + (k,)
    values = create_tmp_var(name or "top_k", shape, input.dtype, input.lod_level,
                            stop_gradient=True)
    indices = create_tmp_var(name or "top_k", shape, "int64", input.lod_level,
                             stop_gradient=True)
    append_op("top_k", {"X": [input]}, {"Out": [values], "Indices": [indices]}, {"k": k})
    return values, indices


def accuracy(input: Var, label: Var, k: int = 1, correct: Var | None = None,
             total: Var | None = None) -> Var:
    """fluid's ``accuracy``: `topk` of the predictions, then an `accuracy` op, whose float32 [1]
    output this returns: the share of samples whose `label` is among their `k` best classes.
    The op also writes the count of those (`correct`) and of the samples (`total`) into the vars
    given, else into int64 temporaries (as fluid declares them; its kernel, and pslab's, store
    int32). No gradient."""
    input, label = _check_var(input, "accuracy", "input"), _check_var(label, "accuracy", "label")
    values, indices = topk(input, k)
    out = create_tmp_var("accuracy", (1,), "float32", stop_gradient=True)
    counts = [v if v is not None else create_tmp_var("accuracy", (1,), "int64", stop_gradient=True)
              for v in (correct, total)]
    append_op("accuracy", {"Out": [values], "Indices": [indices], "Label": [label]},
              {"Accuracy": [out], "Correct": [counts[0]], "Total": [counts[1]]})
    return out


def auc(input: Var, label: Var, curve: str = "ROC", num_thresholds: int = 2 ** 12 - 1,
        topk: int = 1, slide_steps: int = 1) -> tuple[Var, Var, list[Var]]:
    """fluid 1.x's ``auc``: the area under the ROC curve of `input` (the positive class's
    probability in its last column) against the int `label`, by two `auc` ops over
    persistable int64 counts per bucket of num_thresholds + 1, zeroed at startup: one over the
    last `slide_steps` batches (the batch AUC), one over every batch run (the global AUC).
    Returns (auc_out, batch_auc_out, [batch_stat_pos, batch_stat_neg, stat_pos, stat_neg]), as
    fluid does. Only the ROC curve; `topk` is fluid's and unused there too. No gradient."""
    input, label = _check_var(input, "auc", "input"), _check_var(label, "auc", "label")
    if curve != "ROC":
        raise ValueError(f"auc: curve {curve!r} is not supported; only ROC (fluid's kernel "
                         "computes ROC whatever it is asked)")
    if num_thresholds < 1 or slide_steps < 0:
        raise ValueError(f"auc: num_thresholds {num_thresholds} must be positive and "
                         f"slide_steps {slide_steps} not negative")
    batch = _auc_op(input, label, num_thresholds, slide_steps,
                    [(1 + slide_steps) * (num_thresholds + 1) + 1])
    whole = _auc_op(input, label, num_thresholds, 0, [1, num_thresholds + 1])
    return whole[0], batch[0], [*batch[1:], *whole[1:]]


def _auc_op(input: Var, label: Var, thresholds: int, steps: int,
            shape: list[int]) -> tuple[Var, Var, Var]:
    """One `auc` op over new zeroed counts of `shape`: its AUC and the two counts."""
    out = create_tmp_var("auc", (1,), "float64", stop_gradient=True)
    stats = [_framework_global_var(unique_name.generate("auc_stat"), shape, 0.0, "int64")
             for _ in range(2)]
    append_op("auc", {"Predict": [input], "Label": [label], "StatPos": [stats[0]],
                      "StatNeg": [stats[1]]},
              {"AUC": [out], "StatPosOut": [stats[0]], "StatNegOut": [stats[1]]},
              {"curve": "ROC", "num_thresholds": thresholds, "slide_steps": steps})
    return out, stats[0], stats[1]


def mean(x: Var) -> Var:
    x = _check_var(x, "mean", "x")
    out = create_tmp_var("mean", (1,), x.dtype)
    append_op("mean", {"X": [x]}, {"Out": [out]})
    return out


def _reduce(op_type: str, input: Var, dim: int | Sequence[int] | None, keep_dim: bool,
            name: str | None) -> Var:
    """fluid's reduce layers: ``dim`` None (or []) or every axis sets ``reduce_all``; the
    attribute ``dim`` is then [0], as fluid writes it."""
    input = _check_var(input, op_type, "input")
    dims = [] if dim is None else [int(dim)] if isinstance(dim, int) else [int(d) for d in dim]
    rank = len(input.shape)
    for d in dims:
        if not -rank <= d < rank:
            raise ValueError(f"{op_type}: dim {d} outside the rank-{rank} input {input.name!r}")
    reduce_all = not dims or len(dims) == rank
    axes = set(range(rank)) if reduce_all else {d % rank for d in dims}
    if keep_dim:
        shape = tuple(1 if i in axes else n for i, n in enumerate(input.shape))
    else:
        shape = tuple(n for i, n in enumerate(input.shape) if i not in axes) or (1,)
    out = create_tmp_var(name or op_type, shape, input.dtype)
    append_op(op_type, {"X": [input]}, {"Out": [out]},
              {"dim": dims or [0], "keep_dim": bool(keep_dim), "reduce_all": reduce_all})
    return out


def reduce_sum(input: Var, dim: int | Sequence[int] | None = None, keep_dim: bool = False,
               name: str | None = None) -> Var:
    """fluid's reduce_sum: the sum over `dim` (every axis when None), those axes dropped or
    kept as 1 (`keep_dim`); a `reduce_sum` op."""
    return _reduce("reduce_sum", input, dim, keep_dim, name)


def reduce_mean(input: Var, dim: int | Sequence[int] | None = None, keep_dim: bool = False,
                name: str | None = None) -> Var:
    """fluid's reduce_mean: the mean over `dim` (every axis when None); a `reduce_mean` op."""
    return _reduce("reduce_mean", input, dim, keep_dim, name)


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


def fill_constant_batch_size_like(input: Var, shape: Sequence[int], dtype: str, value: float,
                                  input_dim_idx: int = 0, output_dim_idx: int = 0,
                                  force_cpu: bool = False) -> Var:
    """fluid's layer: a tensor of `value` shaped `shape`, except that dim `output_dim_idx` is
    `input`'s dim `input_dim_idx` when run (its batch; for an input with LoD, its number of
    sequences). No gradient flows through it."""
    input = _check_var(input, "fill_constant_batch_size_like", "input")
    shape = [int(d) for d in shape]
    if not 0 <= input_dim_idx < len(input.shape):
        raise ValueError(f"fill_constant_batch_size_like: input_dim_idx {input_dim_idx} outside "
                         f"the rank-{len(input.shape)} input {input.name!r}")
    if not 0 <= output_dim_idx < len(shape):
        raise ValueError(f"fill_constant_batch_size_like: output_dim_idx {output_dim_idx} "
                         f"outside shape {shape}")
    declared = list(shape)
    declared[output_dim_idx] = input.shape[input_dim_idx]
    out = create_tmp_var("fill_constant_batch_size_like", declared, dtype, stop_gradient=True)
    append_op("fill_constant_batch_size_like", {"Input": [input]}, {"Out": [out]},
              {"shape": shape, "dtype": dtype, "value": float(value),
               "input_dim_idx": int(input_dim_idx), "output_dim_idx": int(output_dim_idx),
               "force_cpu": bool(force_cpu)})
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


# -- images, normalization, products and shaping ---------------------------------------------
def _pair(value: int | Sequence[int], what: str, layer: str) -> list[int]:
    items = [int(value), int(value)] if isinstance(value, int) else [int(v) for v in value]
    if len(items) != 2:
        raise ValueError(f"{layer}: {what} must be an int or [h, w], got {value!r}")
    return items


def _window_out(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    """Output extent of a window slid over `size` (-1 stays -1)."""
    if size < 0:
        return -1
    return (size + 2 * pad - ((kernel - 1) * dilation + 1)) // stride + 1


def _image(input: Var, layer: str) -> Var:
    input = _check_var(input, layer, "input")
    if len(input.shape) != 4:
        raise ValueError(f"{layer}: input {input.name!r} of shape {input.shape} is not NCHW")
    return input


def conv2d(input: Var, num_filters: int, filter_size: int | Sequence[int],
           stride: int | Sequence[int] = 1, padding: int | Sequence[int] = 0,
           dilation: int | Sequence[int] = 1, groups: int | None = None,
           param_attr: ParamAttr | str | None = None, bias_attr: ParamAttr | str | bool | None = None,
           act: str | None = None, name: str | None = None, data_format: str = "NCHW") -> Var:
    """`conv2d` of an NCHW image with [num_filters, C/groups, KH, KW] filters, plus a bias per
    filter (`elementwise_add` on axis 1) unless `bias_attr` is False, then `act`."""
    input = _image(input, "conv2d")
    if data_format != "NCHW":
        raise ValueError(f"conv2d: data_format {data_format!r} is not supported; only NCHW")
    groups = groups or 1
    channels = input.shape[1]
    if channels % groups or num_filters % groups:
        raise ValueError(f"conv2d: groups {groups} must divide the {channels} input channels "
                         f"and the {num_filters} filters")
    k, s = _pair(filter_size, "filter_size", "conv2d"), _pair(stride, "stride", "conv2d")
    p, d = _pair(padding, "padding", "conv2d"), _pair(dilation, "dilation", "conv2d")
    prefix = name or unique_name.generate("conv2d")
    fan_in = channels // groups * k[0] * k[1]
    pattr = ParamAttr.of(param_attr)
    assert pattr is not None
    w = create_parameter(pattr, [num_filters, channels // groups] + k, input.dtype,
                         Normal(0.0, math.sqrt(2.0 / fan_in)), prefix + ".w")
    hw = tuple(_window_out(n, *args) for n, args in zip(input.shape[2:], zip(k, s, p, d)))
    out = create_tmp_var(prefix, (input.shape[0], num_filters) + hw, input.dtype)
    append_op("conv2d", {"Input": [input], "Filter": [w]}, {"Output": [out]},
              {"strides": s, "paddings": p, "dilations": d, "groups": groups,
               "data_format": "NCHW", "padding_algorithm": "EXPLICIT", "use_cudnn": False})
    battr = ParamAttr.of(bias_attr)
    if battr is not None:
        b = create_parameter(battr, [num_filters], input.dtype, Constant(0.0), prefix + ".b")
        biased = create_tmp_var(prefix, out.shape, out.dtype)
        append_op("elementwise_add", {"X": [out], "Y": [b]}, {"Out": [biased]}, {"axis": 1})
        out = biased
    return _activation(out, act)


def pool2d(input: Var, pool_size: int | Sequence[int] = -1, pool_type: str = "max",
           pool_stride: int | Sequence[int] = 1, pool_padding: int | Sequence[int] = 0,
           global_pooling: bool = False, ceil_mode: bool = False, exclusive: bool = True,
           name: str | None = None, data_format: str = "NCHW") -> Var:
    """`pool2d`: max or average over `pool_size` windows (the whole image with
    `global_pooling`); `exclusive` averages count only the unpadded elements."""
    input = _image(input, "pool2d")
    if pool_type not in ("max", "avg"):
        raise ValueError(f"pool2d: pool_type {pool_type!r} is not 'max' or 'avg'")
    if ceil_mode or data_format != "NCHW":
        raise ValueError("pool2d: ceil_mode and layouts other than NCHW are not supported")
    if global_pooling:
        k, s, p = list(input.shape[2:]), [1, 1], [0, 0]
        hw: tuple[int, ...] = (1, 1)
    else:
        if pool_size == -1:
            raise ValueError("pool2d: pool_size is required unless global_pooling")
        k, s = _pair(pool_size, "pool_size", "pool2d"), _pair(pool_stride, "pool_stride", "pool2d")
        p = _pair(pool_padding, "pool_padding", "pool2d")
        hw = tuple(_window_out(n, *args) for n, args in zip(input.shape[2:], zip(k, s, p)))
    out = create_tmp_var(name or "pool2d", tuple(input.shape[:2]) + hw, input.dtype)
    append_op("pool2d", {"X": [input]}, {"Out": [out]},
              {"pooling_type": pool_type, "ksize": k, "strides": s, "paddings": p,
               "global_pooling": global_pooling, "ceil_mode": False, "exclusive": exclusive,
               "adaptive": False, "data_format": "NCHW", "use_cudnn": False})
    return out


def batch_norm(input: Var, act: str | None = None, is_test: bool = False, momentum: float = 0.9,
               epsilon: float = 1e-5, param_attr: ParamAttr | str | None = None,
               bias_attr: ParamAttr | str | None = None, data_layout: str = "NCHW",
               name: str | None = None, moving_mean_name: str | None = None,
               moving_variance_name: str | None = None, use_global_stats: bool = False) -> Var:
    """`batch_norm` over axis 1 (channels): a trainable scale (1) and bias (0) per channel, and
    the running mean (0) and variance (1): persistable vars, not parameters, that the op itself
    updates in place in training (MeanOut, VarianceOut) and reads with `is_test`."""
    input = _check_var(input, "batch_norm", "input")
    if data_layout != "NCHW":
        raise ValueError(f"batch_norm: data_layout {data_layout!r} is not supported; only NCHW")
    if len(input.shape) < 2:
        raise ValueError(f"batch_norm: input {input.name!r} of shape {input.shape} has no channels")
    prefix = name or unique_name.generate("batch_norm")
    c, dtype = input.shape[1], input.dtype
    sattr, battr = ParamAttr.of(param_attr), ParamAttr.of(bias_attr)
    assert sattr is not None and battr is not None
    scale = create_parameter(sattr, [c], dtype, Constant(1.0), prefix + ".w")
    bias = create_parameter(battr, [c], dtype, Constant(0.0), prefix + ".b")
    mean = _framework_global_var(moving_mean_name or unique_name.generate(prefix + ".mean"),
                                 [c], 0.0, dtype)
    var = _framework_global_var(moving_variance_name or unique_name.generate(prefix + ".var"),
                                [c], 1.0, dtype)
    y = create_tmp_var(prefix, input.shape, dtype, lod_level=input.lod_level)
    saved = [create_tmp_var(prefix, (c,), dtype, stop_gradient=True) for _ in range(2)]
    append_op("batch_norm", {"X": [input], "Scale": [scale], "Bias": [bias], "Mean": [mean],
                             "Variance": [var]},
              {"Y": [y], "MeanOut": [mean], "VarianceOut": [var], "SavedMean": [saved[0]],
               "SavedVariance": [saved[1]]},
              {"momentum": float(momentum), "epsilon": float(epsilon), "is_test": is_test,
               "data_layout": "NCHW", "use_global_stats": use_global_stats})
    return _activation(y, act)


def layer_norm(input: Var, scale: bool = True, shift: bool = True, begin_norm_axis: int = 1,
               epsilon: float = 1e-5, param_attr: ParamAttr | str | None = None,
               bias_attr: ParamAttr | str | None = None, act: str | None = None,
               name: str | None = None) -> Var:
    """`layer_norm`: each row of input flattened at `begin_norm_axis` normalized, with a
    trainable scale and shift over the normalized dims."""
    input = _check_var(input, "layer_norm", "input")
    if not 1 <= begin_norm_axis < len(input.shape):
        raise ValueError(f"layer_norm: begin_norm_axis {begin_norm_axis} outside "
                         f"1..{len(input.shape) - 1}")
    right = math.prod(input.shape[begin_norm_axis:])
    if right < 0:
        raise ValueError(f"layer_norm: the normalized dims of {input.shape} must be known")
    prefix = name or unique_name.generate("layer_norm")
    inputs: dict[str, list[Var]] = {"X": [input]}
    for slot, wanted, attr, init, suffix in (("Scale", scale, param_attr, 1.0, ".w"),
                                             ("Bias", shift, bias_attr, 0.0, ".b")):
        pattr = ParamAttr.of(attr)
        if wanted and pattr is not None:
            inputs[slot] = [create_parameter(pattr, [right], input.dtype, Constant(init),
                                             prefix + suffix)]
    left = tuple(input.shape[:begin_norm_axis])
    rows = -1 if -1 in left else math.prod(left)
    y = create_tmp_var(prefix, input.shape, input.dtype, lod_level=input.lod_level)
    stats = [create_tmp_var(prefix, (rows,), input.dtype, stop_gradient=True) for _ in range(2)]
    append_op("layer_norm", inputs, {"Y": [y], "Mean": [stats[0]], "Variance": [stats[1]]},
              {"begin_norm_axis": begin_norm_axis, "epsilon": float(epsilon)})
    return _activation(y, act)


def dropout(x: Var, dropout_prob: float, is_test: bool = False, seed: int | None = None,
            name: str | None = None,
            dropout_implementation: str = "downgrade_in_infer") -> Var:
    """`dropout`: zero each element with probability `dropout_prob` in training; a `seed`
    fixes the mask. ``upscale_in_train`` scales the kept ones by 1/(1-p) in training,
    ``downgrade_in_infer`` scales by (1-p) at inference."""
    x = _check_var(x, "dropout", "x")
    if not 0.0 <= dropout_prob <= 1.0:
        raise ValueError(f"dropout: dropout_prob {dropout_prob} outside [0, 1]")
    if dropout_implementation not in ("downgrade_in_infer", "upscale_in_train"):
        raise ValueError(f"dropout: unknown dropout_implementation {dropout_implementation!r}")
    out = create_tmp_var(name or "dropout", x.shape, x.dtype, lod_level=x.lod_level)
    mask = create_tmp_var(name or "dropout", x.shape, "uint8", stop_gradient=True)
    append_op("dropout", {"X": [x]}, {"Out": [out], "Mask": [mask]},
              {"dropout_prob": float(dropout_prob), "is_test": is_test,
               "fix_seed": seed is not None, "seed": int(seed or 0),
               "dropout_implementation": dropout_implementation})
    return out


def matmul(x: Var, y: Var, transpose_x: bool = False, transpose_y: bool = False,
           alpha: float = 1.0, name: str | None = None) -> Var:
    """`matmul`: batched matrix product of x and y (each optionally transposed), times alpha."""
    x, y = _check_var(x, "matmul", "x"), _check_var(y, "matmul", "y")
    xs = list(x.shape) if len(x.shape) < 2 or not transpose_x else \
        list(x.shape[:-2]) + [x.shape[-1], x.shape[-2]]
    ys = list(y.shape) if len(y.shape) < 2 or not transpose_y else \
        list(y.shape[:-2]) + [y.shape[-1], y.shape[-2]]
    k_x, k_y = xs[-1], ys[0] if len(ys) == 1 else ys[-2]
    if k_x != k_y and -1 not in (k_x, k_y):
        raise ValueError(f"matmul: x {x.shape} and y {y.shape} do not share the contracted dim")
    lead = xs[:-2] if len(xs[:-2]) >= len(ys[:-2]) else ys[:-2]
    shape = tuple(lead) + tuple(xs[-2:-1]) + tuple(ys[-1:] if len(ys) > 1 else [])
    out = create_tmp_var(name or "matmul", shape, x.dtype)
    append_op("matmul", {"X": [x], "Y": [y]}, {"Out": [out]},
              {"transpose_X": transpose_x, "transpose_Y": transpose_y, "alpha": float(alpha)})
    return out


def _with_xshape(op_type: str, x: Var, shape: Sequence[int], attrs: dict,
                 share_lod: bool = True) -> Var:
    """An op that writes Out of `shape` and Paddle's XShape ([0] + x's shape). With
    `share_lod` (reshape2, squeeze2, unsqueeze2) Out keeps x's lod_level where its first dim
    is x's, as fluid's InferShape shares the LoD (so a reshaped LoD embedding can be
    sequence-pooled, as fluid's ``dist_simnet_bow.py`` does); transpose2 shares none."""
    out = create_tmp_var(op_type, tuple(shape), x.dtype,
                         lod_level=x.lod_level if share_lod and keeps_rows(x.shape, shape) else 0)
    xshape = create_tmp_var(op_type, (0,) + tuple(x.shape), x.dtype, stop_gradient=True)
    append_op(op_type, {"X": [x]}, {"Out": [out], "XShape": [xshape]}, attrs)
    return out


def reshape(x: Var, shape: Sequence[int], act: str | None = None, name: str | None = None) -> Var:
    """`reshape2`: 0 keeps x's dim at that position, one -1 is inferred."""
    x = _check_var(x, "reshape", "x")
    shape = [int(d) for d in shape]
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: shape {shape} has more than one -1")
    dims = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    copied = {i for i, d in enumerate(shape) if d == 0}
    rest = [n for i, n in enumerate(x.shape) if i not in copied]
    if -1 in shape and -1 not in rest:  # the -1 is inferable when x's unknowns are copied
        dims[shape.index(-1)] = math.prod(rest) // math.prod(
            d for i, d in enumerate(shape) if d not in (0, -1))
    return _activation(_with_xshape("reshape2", x, dims, {"shape": shape}), act)


def transpose(x: Var, perm: Sequence[int], name: str | None = None) -> Var:
    """`transpose2`: dim i of the result is dim perm[i] of x."""
    x = _check_var(x, "transpose", "x")
    perm = [int(a) for a in perm]
    if sorted(perm) != list(range(len(x.shape))):
        raise ValueError(f"transpose: perm {perm} is not a permutation of {len(x.shape)} dims")
    return _with_xshape("transpose2", x, [x.shape[a] for a in perm], {"axis": perm},
                        share_lod=False)


def squeeze(input: Var, axes: Sequence[int], name: str | None = None) -> Var:
    """`squeeze2`: drop the size-1 dims in `axes`."""
    input = _check_var(input, "squeeze", "input")
    rank = len(input.shape)
    picked = {int(a) % rank for a in axes}
    shape = [d for i, d in enumerate(input.shape) if not (i in picked and d == 1)]
    return _with_xshape("squeeze2", input, shape, {"axes": [int(a) for a in axes]})


def unsqueeze(input: Var, axes: Sequence[int], name: str | None = None) -> Var:
    """`unsqueeze2`: insert a dim of 1 at each of `axes`."""
    input = _check_var(input, "unsqueeze", "input")
    shape = list(input.shape)
    for a in axes:
        shape.insert(int(a) + len(shape) + 1 if a < 0 else int(a), 1)
    return _with_xshape("unsqueeze2", input, shape, {"axes": [int(a) for a in axes]})


def split(input: Var, num_or_sections: int | Sequence[int], dim: int = -1,
          name: str | None = None) -> list[Var]:
    """`split` along `dim` into `num_or_sections` equal parts, or parts of the given sizes (one
    may be -1)."""
    input = _check_var(input, "split", "input")
    axis = dim % len(input.shape)
    total = input.shape[axis]
    if isinstance(num_or_sections, int):
        if num_or_sections < 1 or (total > 0 and total % num_or_sections):
            raise ValueError(f"split: {num_or_sections} parts do not divide dim {axis} of "
                             f"{input.shape}")
        sizes = [total // num_or_sections if total > 0 else -1] * num_or_sections
        attrs = {"num": num_or_sections, "sections": [], "axis": axis}
    else:
        sizes = [int(s) for s in num_or_sections]
        if -1 in sizes and total > 0:
            sizes[sizes.index(-1)] = total - (sum(sizes) + 1)
        attrs = {"num": 0, "sections": [int(s) for s in num_or_sections], "axis": axis}
    outs = []
    for size in sizes:
        shape = list(input.shape)
        shape[axis] = size
        outs.append(create_tmp_var(name or "split", tuple(shape), input.dtype))
    append_op("split", {"X": [input]}, {"Out": outs}, attrs)
    return outs


def slice(input: Var, axes: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> Var:
    """`slice`: input[starts[i]:ends[i]] along each of `axes` (clamped like Python slices)."""
    input = _check_var(input, "slice", "input")
    if not len(axes) == len(starts) == len(ends):
        raise ValueError(f"slice: axes {list(axes)}, starts {list(starts)} and ends "
                         f"{list(ends)} differ in length")
    shape = list(input.shape)
    for a, s, e in zip(axes, starts, ends):
        if shape[a] >= 0:
            shape[a] = len(range(*builtins.slice(int(s), int(e)).indices(shape[a])))
    out = create_tmp_var("slice", tuple(shape), input.dtype)
    append_op("slice", {"Input": [input]}, {"Out": [out]},
              {"axes": [int(a) for a in axes], "starts": [int(s) for s in starts],
               "ends": [int(e) for e in ends], "decrease_axis": [], "infer_flags": [1] * len(axes)})
    return out


def gather(input: Var, index: Var, overwrite: bool = True) -> Var:
    """`gather`: the rows of input at int `index` ([K] or [K, 1]). `overwrite`: the gradient of
    a repeated row is its last one's, not their sum (Paddle's default)."""
    input, index = _check_var(input, "gather", "input"), _check_var(index, "gather", "index")
    if index.dtype not in ("int32", "int64"):
        raise TypeError(f"gather: index {index.name!r} must be int32 or int64, got {index.dtype}")
    out = create_tmp_var("gather", (index.shape[0],) + tuple(input.shape[1:]), input.dtype)
    append_op("gather", {"X": [input], "Index": [index]}, {"Out": [out]},
              {"overwrite": overwrite})
    return out


def sigmoid_cross_entropy_with_logits(x: Var, label: Var, ignore_index: int = -100,
                                      name: str | None = None, normalize: bool = False) -> Var:
    """Elementwise logistic loss of logits x against probabilities label; elements labelled
    `ignore_index` count 0 (and, with `normalize`, the rest are averaged)."""
    x = _check_var(x, "sigmoid_cross_entropy_with_logits", "x")
    label = _check_var(label, "sigmoid_cross_entropy_with_logits", "label")
    out = create_tmp_var(name or "sigmoid_cross_entropy_with_logits", x.shape, x.dtype,
                         lod_level=x.lod_level)
    append_op("sigmoid_cross_entropy_with_logits", {"X": [x], "Label": [label]}, {"Out": [out]},
              {"ignore_index": ignore_index, "normalize": normalize})
    return out
