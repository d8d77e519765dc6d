"""The phantom backend: timing mode's kernels, which compute nothing and yield output shapes.

Every kernel stores a `Phantom` (shape, dtype, and the LoD or row height its real twin would
have) for each output, so a whole job runs with no arithmetic and every message, op and byte
count stays what numeric mode would give. Each op's entry in the op catalog
(`transpiler.opcatalog`) names its shape rule (`SHAPE_RULES`); the rules:

- The generic rule: an output takes its declared shape and dtype (from the program), and a -1
  dim k takes dim k of the op's first input declared with -1 there; when that is dim 0 (the
  batch) the output also takes that input's LoD.
- Gradients: ``S@GRAD`` is shaped like the forward input of slot ``S`` it belongs to.
- Ops whose shapes depend on attributes or data: the elementwise and comparison ops (their
  operands broadcast), `mul` (the flattened product), `matmul` (batched, transposed), `conv2d`
  and `pool2d` (their windows), `batch_norm`, `layer_norm` and `dropout` (Y/Out like X, and
  their statistics and mask), `reshape`, `reshape2`, `transpose2`, `squeeze2`, `unsqueeze2`
  (with XShape), `split`, `slice`, `gather`, `lookup_table` and `lookup_table_v2` (a row per id),
  `sequence_pool` (a row per sequence), `sequence_conv` (a row per row, X's LoD kept),
  `cos_sim` (a value per row of X, and of Y for YNorm), `auc` (one float64, the counts like
  themselves), `nce` (a column per true label and negative; a sparse
  Weight@GRAD a row per sample label), `split_byref`, `split_selected_rows`, `split_ids` and
  `concat` (their sections), `sum` (SelectedRows add up their rows), `reduce_sum` and
  `reduce_mean` (their axes), `hierarchical_sigmoid` (a PreOut column per path node; a sparse
  W@GRAD a row per PathTable id, at most W's rows), `fill_constant_batch_size_like` (Input's batch), `accuracy` (its three
  [1] values; the `top_k` before it takes the generic rule), `scale`/`assign` (like X,
  SelectedRows too), the optimizers (every output like Param), the initializers (the ``shape``
  attribute) and `conditional_block` (see below).
- What only data could tell is apportioned: `split_ids` and `split_selected_rows` give each
  section a share of the rows in proportion to its height (numeric mode would send the rows or
  the unique ids each owner holds: as many, or fewer); geo's `sparse_delta` takes every row
  as moved (an upper bound).

Control values stay real: an op whose inputs hold no phantom and whose outputs are all
declared integer or bool (step counters, their limits and comparisons) runs its numpy kernel,
so a `conditional_block` on such a condition (geo-SGD's push every k steps) runs when numeric
mode would. A condition that is a phantom (say, on a float learning-rate step) is taken to hold.
`save` refuses: a phantom has nothing to write.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import numpy.typing as npt

from transpiler.ir import Var, strip_grad_suffix
from transpiler.opcatalog import OPS, OpDef

from runtime.execution.kernels.common import (LOOKUP_V2, batch_size_like_shape,
                                              hsigmoid_code_length, lookup_lead, lookup_version,
                                              reduce_axes, reduced_shape)
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.numpy_elementwise import align
from runtime.execution.kernels.numpy_math import grad_sources, reshape_target
from runtime.execution.kernels.registry import Kernel, get_kernel, register
from runtime.execution.kernels.shapes import (conv_out_shape, keeps_rows, matmul_flags,
                                              matmul_shape, norm_split, pool_window, reshaped,
                                              slice_bounds, split_sizes, transpose_perm, xshape)
from runtime.execution.tensor import (LoDTensor, Phantom, Value, nbytes_of, phantom_of, shape_of,
                                      shared_phantom)

BACKEND = "phantom"
Rule = Callable[[KernelContext], None]
Lod = tuple[tuple[int, ...], ...]
_NO_LOD: Lod = ()

__all__ = ["BACKEND", "RULES", "SHAPE_RULES", "apportion"]


# -- reading the op ----------------------------------------------------------------------------
def _declared(ctx: KernelContext, name: str) -> Var:
    """The declaration of var `name` in the op's program (block 0 first)."""
    if ctx.program is not None:
        for block in ctx.program.blocks:
            var = block.vars.get(name)
            if var is not None:
                return var
    raise ValueError(f"var {name!r} is not declared in the program; phantom kernels take "
                     "output shapes from declarations")


def _value(ctx: KernelContext, slot: str, index: int = 0) -> Value:
    """The stored value of the slot's `index`-th input, a LoDTensor with its LoD."""
    return ctx.scope.get_tensor(ctx.input_names(slot)[index])


def _values(ctx: KernelContext, slot: str) -> list[Value]:
    return [ctx.scope.get_tensor(name) for name in ctx.input_names(slot)]


def _lod(value: Value) -> Lod:
    if isinstance(value, LoDTensor):
        return tuple(map(tuple, value.lod))
    return value.lod if isinstance(value, Phantom) else ()


def _dense(shape: Sequence[int], dtype: npt.DTypeLike, lod: Lod = ()) -> Phantom:
    return shared_phantom(shape, dtype, lod)


def _has_phantom_input(ctx: KernelContext) -> bool:
    find = ctx.scope.find  # a stored value as it is: a phantom is never a backend's tensor
    return any(isinstance(find(name), Phantom)
               for names in ctx.op.inputs.values() for name in names)


def _control_values(ctx: KernelContext) -> bool:
    """Whether the op computes control values (see the module docstring): no phantom in, only
    integer or bool outputs declared."""
    if _has_phantom_input(ctx):  # most ops in timing mode: asked first, it settles them
        return False
    outputs = ctx.op.output_arg_names
    if not outputs:
        return False
    try:
        dtypes = [np.dtype(_declared(ctx, name).dtype) for name in outputs]
    except ValueError:
        return False
    return all(dtype.kind in "biu" for dtype in dtypes)


# -- the generic rules ----------------------------------------------------------------------------
def _generic(ctx: KernelContext) -> None:
    """Each output its declared shape and dtype, -1 dims resolved from the inputs."""
    for slot, names in ctx.op.outputs.items():
        for i, name in enumerate(names):
            ctx.set_output(slot, _resolved(ctx, name), index=i)


def _resolved(ctx: KernelContext, name: str) -> Phantom:
    var = _declared(ctx, name)
    shape, lod = list(var.shape), _NO_LOD
    for k, dim in enumerate(shape):
        if dim == -1:
            source = _batch_input(ctx, k, name)
            shape[k] = shape_of(source)[k]
            lod = _lod(source) if k == 0 else lod
    return _dense(shape, var.dtype, lod)


def _batch_input(ctx: KernelContext, k: int, output: str) -> Value:
    """The first input declared with -1 at dim k."""
    for name in ctx.op.input_arg_names:
        declared = _declared(ctx, name).shape
        if len(declared) > k and declared[k] == -1:
            return ctx.scope.get_tensor(name)
    raise ValueError(f"output {output!r}: dim {k} is -1 and no input is declared with -1 there")


def _gradient(ctx: KernelContext) -> None:
    """``S@GRAD`` like the input of slot ``S`` it is the gradient of."""
    for slot, names in ctx.op.outputs.items():
        forward = slot.removesuffix("@GRAD")
        inputs = _values(ctx, forward)
        for j, positions in enumerate(grad_sources(ctx, forward)):
            if not positions:
                raise ValueError(f"{names[j]!r} is the gradient of no input of {forward} "
                                 f"({strip_grad_suffix(names[j])!r})")
            like = inputs[positions[0]]
            ctx.set_output(slot, _dense(shape_of(like), phantom_of(like).dtype), index=j)


# -- ops with shapes of their own ---------------------------------------------------------------
def _like_x(ctx: KernelContext) -> None:
    """Out like X: its shape, dtype, LoD, or rows and height (`scale`, `assign`)."""
    ctx.set_output("Out", phantom_of(_value(ctx, "X")))


def _sparse_delta(ctx: KernelContext) -> None:
    """Geo's sparse delta: which rows moved only data could tell; every row of X is taken to
    (an upper bound on what the push carries)."""
    x = phantom_of(_value(ctx, "X"))
    ctx.set_output("Out", Phantom(x.shape, x.dtype, x.shape[0]))


def _mul(ctx: KernelContext) -> None:
    x, y = _value(ctx, "X"), _value(ctx, "Y")
    xd, yd = int(ctx.attr("x_num_col_dims", 1)), int(ctx.attr("y_num_col_dims", 1))
    ctx.set_output("Out", _dense(shape_of(x)[:xd] + shape_of(y)[yd:], phantom_of(x).dtype, _lod(x)))


def _reshape(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "X"))
    ctx.set_output("Out", _dense(reshape_target(list(ctx.attr("shape")), x.shape), x.dtype))


def _elementwise(ctx: KernelContext) -> None:
    """Out of X and Y broadcast under Paddle's `axis` rule, keeping X's LoD."""
    x, y = phantom_of(_value(ctx, "X")), shape_of(_value(ctx, "Y"))
    shape = np.broadcast_shapes(*align(x.shape, y, int(ctx.attr("axis", -1))))
    ctx.set_output("Out", _dense(shape, _declared(ctx, ctx.output_names("Out")[0]).dtype, x.lod))


def _lookup(ctx: KernelContext) -> None:
    """A row of W per id, keeping the ids' LoD (`lookup_table`, `lookup_sparse_table`)."""
    w, ids = phantom_of(_value(ctx, "W")), _value(ctx, "Ids")
    ctx.set_output("Out", _dense(lookup_lead(tuple(shape_of(ids))) + w.shape[1:], w.dtype,
                                 _lod(ids)))


def _lookup_v2(ctx: KernelContext) -> None:
    """`lookup_table_v2`: a row of W per id, the ids' trailing 1 kept."""
    w, ids = phantom_of(_value(ctx, "W")), _value(ctx, "Ids")
    ctx.set_output("Out", _dense(lookup_lead(tuple(shape_of(ids)), LOOKUP_V2) + w.shape[1:],
                                 w.dtype, _lod(ids)))


def _lookup_grad(ctx: KernelContext) -> None:
    w, ids = phantom_of(_value(ctx, "W")), shape_of(_value(ctx, "Ids"))
    if not ctx.attr("is_sparse", False):
        ctx.set_output("W@GRAD", _dense(w.shape, w.dtype))
        return
    ctx.set_output("W@GRAD", Phantom((math.prod(ids),) + w.shape[1:], w.dtype, w.shape[0]))


def _nce(ctx: KernelContext) -> None:
    """Cost [N, 1]; SampleLogits and SampleLabels a column per true label and negative."""
    x, label = phantom_of(_value(ctx, "Input")), shape_of(_value(ctx, "Label"))
    n = x.shape[0]
    width = math.prod(label[1:]) + int(ctx.attr("num_neg_samples", 10))
    ctx.set_output("Cost", _dense((n, 1), x.dtype))
    ctx.set_output("SampleLogits", _dense((n, width), x.dtype))
    ctx.set_output("SampleLabels", _dense((n, width), np.int64))


def _weighted_grads(ctx: KernelContext, slots: Sequence[str], weight: str,
                    sparse_rows: Callable[[Phantom], int]) -> None:
    """The `slots`' gradients like their inputs; the `weight`'s too, or (``is_sparse``)
    `sparse_rows` of its rows."""
    for slot in slots:
        if ctx.has_output(f"{slot}@GRAD"):
            like = phantom_of(_value(ctx, slot))
            ctx.set_output(f"{slot}@GRAD", _dense(like.shape, like.dtype))
    if not ctx.has_output(f"{weight}@GRAD"):
        return
    w = phantom_of(_value(ctx, weight))
    if not ctx.attr("is_sparse", False):
        ctx.set_output(f"{weight}@GRAD", _dense(w.shape, w.dtype))
        return
    ctx.set_output(f"{weight}@GRAD", Phantom((sparse_rows(w),) + w.shape[1:], w.dtype, w.shape[0]))


def _nce_grad(ctx: KernelContext) -> None:
    """Input@GRAD and Bias@GRAD like their inputs; Weight@GRAD too, or (``is_sparse``) a row
    per sample label (numeric mode sends each label once: as many or fewer)."""
    _weighted_grads(ctx, ("Input", "Bias"), "Weight",
                    lambda w: math.prod(shape_of(_value(ctx, "SampleLabels"))))


def _hsigmoid(ctx: KernelContext) -> None:
    """Out [N, 1]; PreOut a column per node of the longest path (PathTable's width, or the
    default tree's code length)."""
    x = phantom_of(_value(ctx, "X"))
    width = shape_of(_value(ctx, "PathTable"))[1] if ctx.has_input("PathTable") \
        else hsigmoid_code_length(int(ctx.attr("num_classes")))
    ctx.set_output("Out", _dense((x.shape[0], 1), x.dtype))
    ctx.set_output("PreOut", _dense((x.shape[0], width), x.dtype))


def _hsigmoid_grad(ctx: KernelContext) -> None:
    """X@GRAD and Bias@GRAD like their inputs; W@GRAD too, or (``is_sparse``) a row per id of
    PathTable, at most W's rows (numeric mode sends each id once: as many or fewer)."""
    _weighted_grads(ctx, ("X", "Bias"), "W",
                    lambda w: min(math.prod(shape_of(_value(ctx, "PathTable"))), w.shape[0]))


def _sequence_pool(ctx: KernelContext) -> None:
    x = _value(ctx, "X")
    lod, shape = _lod(x), shape_of(x)
    if not lod:
        raise ValueError(f"input X {ctx.input_names('X')[0]!r} has no LoD")
    count = len(lod[-1]) - 1
    ctx.set_output("Out", _dense((count,) + shape[1:], phantom_of(x).dtype, lod[:-1]))
    ctx.set_output("MaxIndex", _dense((count, math.prod(shape[1:])), np.int32))


def _sequence_conv(ctx: KernelContext) -> None:
    """`sequence_conv`: a row per row of X, a column per column of Filter, X's LoD kept."""
    x, w = _value(ctx, "X"), phantom_of(_value(ctx, "Filter"))
    ctx.set_output("Out", _dense((shape_of(x)[0], w.shape[1]), w.dtype, _lod(x)))


def _cos_sim(ctx: KernelContext) -> None:
    """`cos_sim`: Out and XNorm a value per row of X (Out keeps X's LoD), YNorm per row of Y."""
    x, y = _value(ctx, "X"), shape_of(_value(ctx, "Y"))
    dtype = phantom_of(x).dtype
    ctx.set_output("Out", _dense((shape_of(x)[0], 1), dtype, _lod(x)))
    ctx.set_output("XNorm", _dense((shape_of(x)[0], 1), dtype))
    ctx.set_output("YNorm", _dense((y[0], 1), dtype))


def _auc(ctx: KernelContext) -> None:
    """`auc`: AUC one float64; the counts out like the counts in."""
    ctx.set_output("AUC", _dense((1,), np.float64))
    ctx.set_output("StatPosOut", phantom_of(_value(ctx, "StatPos")))
    ctx.set_output("StatNegOut", phantom_of(_value(ctx, "StatNeg")))


def _merge_ids(ctx: KernelContext) -> None:
    ids, rows = _value(ctx, "Ids"), phantom_of(_value(ctx, "X"))
    lead = lookup_lead(tuple(shape_of(ids)), lookup_version(ctx))
    ctx.set_output("Out", _dense(lead + rows.shape[1:], rows.dtype, _lod(ids)))


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` cut in proportion to `weights` (largest remainders first), summing to `total`."""
    whole = sum(weights)
    if whole <= 0:
        return [0] * len(weights)
    exact = [total * w / whole for w in weights]
    shares = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: shares[i] - exact[i])
    for i in by_remainder[:total - sum(shares)]:
        shares[i] += 1
    return shares


def _sections(ctx: KernelContext, attr: str, total: int) -> list[int]:
    sections = [int(s) for s in ctx.attr(attr)]
    if sum(sections) != total:
        raise ValueError(f"{attr} {sections} add up to {sum(sections)}, not {total} rows")
    return sections


def _split_byref(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "X"))
    total = x.height if x.height is not None else x.shape[0]
    for i, rows in enumerate(_sections(ctx, "sections", total)):
        ctx.set_output("Out", _dense((rows,) + x.shape[1:], x.dtype), index=i)


def _split_rows(ctx: KernelContext, slot: str, rebase: bool) -> None:
    """Rows of a SelectedRows X shared among the sections of ``height_sections``."""
    x = phantom_of(_value(ctx, slot))
    if x.height is None:
        raise TypeError(f"{slot} must be SelectedRows, got a dense {list(x.shape)}")
    sections = _sections(ctx, "height_sections", x.height)
    for i, rows in enumerate(apportion(x.shape[0], sections)):
        height = sections[i] if rebase else x.height
        ctx.set_output("Out", Phantom((rows,) + x.shape[1:], x.dtype, height), index=i)


def _split_selected_rows(ctx: KernelContext) -> None:
    _split_rows(ctx, "X", rebase=True)


def _split_ids(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "Ids"))
    if x.height is not None:
        _split_rows(ctx, "Ids", rebase=False)
        return
    sections = [int(s) for s in ctx.attr("height_sections")]
    for i, count in enumerate(apportion(math.prod(x.shape), sections)):
        ctx.set_output("Out", _dense((count, 1), np.int64), index=i)


def _concat(ctx: KernelContext) -> None:
    shapes = [shape_of(v) for v in _values(ctx, "X")]
    axis = int(ctx.attr("axis", 0)) % len(shapes[0])
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    ctx.set_output("Out", _dense(out, phantom_of(_value(ctx, "X")).dtype))


def _accuracy(ctx: KernelContext) -> None:
    """`accuracy`: one float32 ratio and two int32 counts, whatever the outputs' declarations
    (a script's ``create_tensor`` declares no shape)."""
    for slot, dtype in (("Accuracy", np.float32), ("Correct", np.int32), ("Total", np.int32)):
        ctx.set_output(slot, _dense((1,), dtype))


def _conv2d(ctx: KernelContext) -> None:
    x, w = phantom_of(_value(ctx, "Input")), shape_of(_value(ctx, "Filter"))
    ctx.set_output("Output", _dense(conv_out_shape(ctx, x.shape, w), x.dtype))


def _pool2d(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "X"))
    ctx.set_output("Out", _dense(x.shape[:2] + pool_window(ctx, x.shape).out, x.dtype))


def _batch_norm(ctx: KernelContext) -> None:
    """Y like X; the running stats like themselves; the saved batch stats [C]."""
    x = phantom_of(_value(ctx, "X"))
    ctx.set_output("Y", _dense(x.shape, x.dtype, x.lod))
    ctx.set_output("MeanOut", phantom_of(_value(ctx, "Mean")))
    ctx.set_output("VarianceOut", phantom_of(_value(ctx, "Variance")))
    for slot in ("SavedMean", "SavedVariance"):
        ctx.set_output(slot, _dense(x.shape[1:2], x.dtype))


def _layer_norm(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "X"))
    left, _ = norm_split(x.shape, int(ctx.attr("begin_norm_axis", 1)))
    ctx.set_output("Y", _dense(x.shape, x.dtype, x.lod))
    for slot in ("Mean", "Variance"):
        ctx.set_output(slot, _dense((left,), x.dtype))


def _dropout(ctx: KernelContext) -> None:
    """Out like X; in training, a uint8 Mask like X too."""
    x = phantom_of(_value(ctx, "X"))
    ctx.set_output("Out", _dense(x.shape, x.dtype, x.lod))
    if not ctx.attr("is_test", False):
        ctx.set_output("Mask", _dense(x.shape, np.uint8))


def _matmul(ctx: KernelContext) -> None:
    x, y = phantom_of(_value(ctx, "X")), shape_of(_value(ctx, "Y"))
    tx, ty, _ = matmul_flags(ctx)
    ctx.set_output("Out", _dense(matmul_shape(x.shape, y, tx, ty), x.dtype))


def _reshaped(ctx: KernelContext, shape: Callable[[tuple[int, ...]], Sequence[int]],
              share_lod: bool = True) -> None:
    """Out in the shape `shape` gives for X's (with X's LoD where its first dim stays and
    `share_lod`, as `shapes.shared_lod`); XShape [0] + X's shape."""
    value = _value(ctx, "X")
    x = phantom_of(value)
    out = list(shape(x.shape))
    keep = share_lod and keeps_rows(x.shape, out)
    ctx.set_output("Out", _dense(out, x.dtype, _lod(value) if keep else ()))
    ctx.set_output("XShape", _dense(xshape(x.shape), x.dtype))


def _reshape2(ctx: KernelContext) -> None:
    """reshape2, squeeze2, unsqueeze2."""
    _reshaped(ctx, lambda s: reshaped(ctx, s))


def _transpose2(ctx: KernelContext) -> None:
    _reshaped(ctx, lambda s: [s[a] for a in transpose_perm(ctx, len(s))], share_lod=False)


def _split(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "X"))
    axis, sizes = split_sizes(ctx, x.shape)
    for i, size in enumerate(sizes):
        ctx.set_output("Out", _dense(x.shape[:axis] + (size,) + x.shape[axis + 1:], x.dtype),
                       index=i)


def _slice(ctx: KernelContext) -> None:
    x = phantom_of(_value(ctx, "Input"))
    ctx.set_output("Out", _dense(slice_bounds(ctx, x.shape)[1], x.dtype))


def _gather(ctx: KernelContext) -> None:
    x, ids = phantom_of(_value(ctx, "X")), shape_of(_value(ctx, "Index"))
    ctx.set_output("Out", _dense((math.prod(ids),) + x.shape[1:], x.dtype))


def _sum(ctx: KernelContext) -> None:
    """All SelectedRows: their rows together; otherwise dense like the first dense input."""
    values = [phantom_of(v) for v in _values(ctx, "X")]
    dense = [v for v in values if v.height is None]
    if dense:
        ctx.set_output("Out", _dense(dense[0].shape, dense[0].dtype, values[0].lod))
        return
    rows = sum(v.shape[0] for v in values)
    ctx.set_output("Out", Phantom((rows,) + values[0].shape[1:], values[0].dtype, values[0].height))


def _reduce(ctx: KernelContext) -> None:
    """`reduce_sum`, `reduce_mean`: X's shape less (or 1 at, `keep_dim`) the reduced axes."""
    x = phantom_of(_value(ctx, "X"))
    axes, keep = reduce_axes(ctx, len(x.shape))
    ctx.set_output("Out", _dense(reduced_shape(x.shape, axes, keep), x.dtype))


def _batch_size_like(ctx: KernelContext) -> None:
    """`fill_constant_batch_size_like`: the ``shape`` attribute, one dim Input's batch."""
    x = _value(ctx, "Input")
    shape = batch_size_like_shape(ctx, shape_of(x), [list(level) for level in _lod(x)])
    ctx.set_output("Out", _dense(shape, ctx.attr("dtype", "float32")))


def _optimizer(ctx: KernelContext) -> None:
    """Every output (the parameter and its accumulators) shaped like Param."""
    param = phantom_of(_value(ctx, "Param"))
    for slot, names in ctx.op.outputs.items():
        for i in range(len(names)):
            ctx.set_output(slot, _dense(param.shape, param.dtype), index=i)


def _initializer(ctx: KernelContext) -> None:
    """Out of the ``shape`` and ``dtype`` attributes (initializers, `fill_constant`)."""
    shape = [int(d) for d in ctx.attr("shape", ())]
    ctx.set_output("Out", _dense(shape, ctx.attr("dtype", "float32")))


def _ref_by_trainer_id(ctx: KernelContext) -> None:
    ctx.set_output("Out", _dense(shape_of(_value(ctx, "X")), phantom_of(_value(ctx, "X")).dtype))


def _conditional_block(ctx: KernelContext) -> None:
    """Run the sub-block when the condition holds; a phantom condition is taken to hold."""
    if any(isinstance(c, Phantom) for c in _values(ctx, "Cond")):
        ctx.run_block(ctx.attr("sub_block").idx)
    else:
        get_kernel("conditional_block", "numpy")(ctx)


def _save(ctx: KernelContext) -> None:
    x = _value(ctx, "X")
    raise TypeError(f"save: X {ctx.input_names('X')[0]!r} is a phantom of {nbytes_of(x)} bytes "
                    "with no data to write (timing mode)")


# -- the table ----------------------------------------------------------------------------------
SHAPE_RULES: dict[str, Rule] = {
    "generic": _generic, "broadcast": _elementwise, "gradient": _gradient,
    "like_param": _optimizer, "from_attrs": _initializer, "like_x": _like_x, "mul": _mul,
    "reshape": _reshape, "lookup": _lookup, "lookup_v2": _lookup_v2,
    "lookup_grad": _lookup_grad,
    "sequence_pool": _sequence_pool, "merge_ids": _merge_ids, "split_byref": _split_byref,
    "split_selected_rows": _split_selected_rows, "sparse_delta": _sparse_delta, "split_ids": _split_ids, "concat": _concat,
    "sum": _sum, "ref_by_trainer_id": _ref_by_trainer_id,
    "conditional_block": _conditional_block, "save": _save, "conv2d": _conv2d,
    "pool2d": _pool2d, "batch_norm": _batch_norm, "layer_norm": _layer_norm,
    "dropout": _dropout, "matmul": _matmul, "reshape2": _reshape2, "transpose2": _transpose2,
    "split": _split, "slice": _slice,
    "gather": _gather, "nce": _nce, "nce_grad": _nce_grad, "reduce": _reduce,
    "batch_size_like": _batch_size_like, "hsigmoid": _hsigmoid, "hsigmoid_grad": _hsigmoid_grad,
    "accuracy": _accuracy, "sequence_conv": _sequence_conv, "cos_sim": _cos_sim, "auc": _auc,
}
"""The shape rules by the names the op catalog's entries give (`OpDef.shape`)."""


def _rule_of(op: OpDef) -> Rule:
    rule = SHAPE_RULES.get(op.shape or "")
    if rule is None:
        raise ValueError(f"op {op.type!r}: the catalog names phantom shape rule {op.shape!r}, "
                         f"which is not one of {sorted(SHAPE_RULES)}")
    return rule


RULES: dict[str, Rule] = {op.type: _rule_of(op) for op in OPS.values() if op.runs == "kernel"}
"""Each op type's shape rule: every op the catalog runs through kernels."""


def _kernel(op_type: str, rule: Rule) -> Kernel:
    numpy_kernel = get_kernel(op_type, "numpy")

    def kernel(ctx: KernelContext) -> None:
        if _control_values(ctx):
            numpy_kernel(ctx)
        else:
            rule(ctx)

    kernel.__name__ = kernel.__qualname__ = f"phantom_{op_type}"
    return kernel


for _op_type, _rule in RULES.items():
    register(_op_type, BACKEND)(_kernel(_op_type, _rule))
