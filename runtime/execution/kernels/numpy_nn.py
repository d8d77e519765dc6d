"""Neural-net ops: `mul` (the matmul of `fc`), softmax, the cross-entropy losses (fluid 1.2's
`cross_entropy`, 1.8's hard-label `cross_entropy2`, `softmax_with_cross_entropy`), the
embedding lookup (`lookup_table`, `lookup_table_v2`, dense or sparse gradient), `sequence_pool` over LoD
sequences, `nce` (noise-contrastive estimation, its samples drawn by `sampling`) and
`hierarchical_sigmoid` (fluid's hsigmoid, default or custom tree), each with its gradient
kernel; and fluid's evaluation ops, which have none: `top_k` (the k largest values along the
last dim and their positions) and `accuracy` (of those positions against the labels).
"""

from __future__ import annotations

import math

import numpy as np

from runtime.execution.kernels.common import (LOOKUP_V2, Segments, hard_labels, hsigmoid_codes,
                                              hsigmoid_rows, ignore_index, lookup_ids,
                                              lookup_lead, mul_dims, out_grad, padding_idx,
                                              pool_scale, soft_label)
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from runtime.execution.kernels.sampling import sample_labels, sampler_of, true_labels
from runtime.execution.tensor import SelectedRows

Array = np.ndarray


# -- mul ----------------------------------------------------------------------------------------
def _flatten2(a: Array, num_col_dims: int) -> Array:
    return a.reshape(math.prod(a.shape[:num_col_dims]), math.prod(a.shape[num_col_dims:]))


@register("mul")
def mul(ctx: KernelContext) -> None:
    x, y = ctx.input("X"), ctx.input("Y")
    xd, yd = mul_dims(ctx)
    out = _flatten2(x, xd) @ _flatten2(y, yd)
    ctx.set_output("Out", out.reshape(x.shape[:xd] + y.shape[yd:]), lod=ctx.lod("X"))


@register("mul_grad")
def mul_grad(ctx: KernelContext) -> None:
    x, y = ctx.input("X"), ctx.input("Y")
    xd, yd = mul_dims(ctx)
    x2, y2 = _flatten2(x, xd), _flatten2(y, yd)
    g = out_grad(ctx, ctx.input("Out")).reshape(x2.shape[0], y2.shape[1])
    if ctx.has_output("X@GRAD"):
        ctx.set_output("X@GRAD", (g @ y2.T).reshape(x.shape))
    if ctx.has_output("Y@GRAD"):
        ctx.set_output("Y@GRAD", (x2.T @ g).reshape(y.shape))


# -- softmax ------------------------------------------------------------------------------------
def softmax_of(x: Array, axis: int = -1) -> Array:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@register("softmax")
def softmax(ctx: KernelContext) -> None:
    ctx.set_output("Out", softmax_of(ctx.input("X"), int(ctx.attr("axis", -1))), lod=ctx.lod("X"))


@register("softmax_grad")
def softmax_grad(ctx: KernelContext) -> None:
    out = ctx.input("Out")
    g = out_grad(ctx, out)
    axis = int(ctx.attr("axis", -1))
    ctx.set_output("X@GRAD", out * (g - (g * out).sum(axis=axis, keepdims=True)))


# -- cross entropy ------------------------------------------------------------------------------
@register("cross_entropy")
def cross_entropy(ctx: KernelContext) -> None:
    x, label = ctx.input("X"), ctx.input("Label")
    p = x.reshape(-1, x.shape[-1])
    if soft_label(ctx):
        loss = -(label.reshape(p.shape) * np.log(p)).sum(axis=1)
    else:
        ids, keep = hard_labels(label, p.shape[0], ignore_index(ctx))
        loss = np.where(keep, -np.log(p[np.arange(p.shape[0]), ids]), 0)
    ctx.set_output("Y", loss.astype(x.dtype).reshape(x.shape[:-1] + (1,)))


@register("cross_entropy_grad")
def cross_entropy_grad(ctx: KernelContext) -> None:
    x, label = ctx.input("X"), ctx.input("Label")
    p = x.reshape(-1, x.shape[-1])
    g = out_grad(ctx, ctx.input("Y"), "Y@GRAD").reshape(-1, 1)
    if soft_label(ctx):
        dp = -g * label.reshape(p.shape) / p
    else:
        ids, keep = hard_labels(label, p.shape[0], ignore_index(ctx))
        rows = np.arange(p.shape[0])
        dp = np.zeros_like(p)
        dp[rows, ids] = np.where(keep, -g[:, 0] / p[rows, ids], 0)
    ctx.set_output("X@GRAD", dp.reshape(x.shape))


@register("cross_entropy2")
def cross_entropy2(ctx: KernelContext) -> None:
    """fluid 1.8's hard-label cross entropy: MatchX is each row's probability of its label, Y
    its -log; both 0 in a row whose label is ``ignore_index``."""
    x = ctx.input("X")
    p = x.reshape(-1, x.shape[-1])
    ids, keep = hard_labels(ctx.input("Label"), p.shape[0], ignore_index(ctx))
    match = np.where(keep, p[np.arange(p.shape[0]), ids], 0)
    lead = x.shape[:-1] + (1,)
    ctx.set_output("MatchX", match.astype(x.dtype).reshape(lead))
    loss = np.where(keep, -np.log(np.where(keep, match, 1)), 0)
    ctx.set_output("Y", loss.astype(x.dtype).reshape(lead))


@register("cross_entropy_grad2")
def cross_entropy_grad2(ctx: KernelContext) -> None:
    """X@GRAD: -Y@GRAD / MatchX at each row's label, 0 elsewhere and in ignored rows."""
    x = ctx.input("X")
    p = x.reshape(-1, x.shape[-1])
    g = out_grad(ctx, ctx.input("Y"), "Y@GRAD").reshape(-1)
    ids, keep = hard_labels(ctx.input("Label"), p.shape[0], ignore_index(ctx))
    match = ctx.input("MatchX").reshape(-1)
    dp = np.zeros_like(p)
    dp[np.arange(p.shape[0]), ids] = np.where(keep, -g / np.where(keep, match, 1), 0)
    ctx.set_output("X@GRAD", dp.reshape(x.shape))


@register("softmax_with_cross_entropy")
def softmax_with_cross_entropy(ctx: KernelContext) -> None:
    logits, label = ctx.input("Logits"), ctx.input("Label")
    z = logits.reshape(-1, logits.shape[-1])
    shifted = z - z.max(axis=1, keepdims=True)
    log_sm = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    if soft_label(ctx):
        loss = -(label.reshape(z.shape) * log_sm).sum(axis=1)
    else:
        ids, keep = hard_labels(label, z.shape[0], ignore_index(ctx))
        loss = np.where(keep, -log_sm[np.arange(z.shape[0]), ids], 0)
    ctx.set_output("Softmax", np.exp(log_sm).reshape(logits.shape))
    ctx.set_output("Loss", loss.astype(logits.dtype).reshape(logits.shape[:-1] + (1,)))


@register("softmax_with_cross_entropy_grad")
def softmax_with_cross_entropy_grad(ctx: KernelContext) -> None:
    """d loss / d logits = softmax * sum(label) - label (one-hot for hard labels), from the
    forward Softmax and Loss@GRAD only."""
    sm, label = ctx.input("Softmax"), ctx.input("Label")
    s = sm.reshape(-1, sm.shape[-1])
    g = out_grad(ctx, ctx.input("Loss"), "Loss@GRAD").reshape(-1, 1)
    if soft_label(ctx):
        soft = label.reshape(s.shape)
        d = s * soft.sum(axis=1, keepdims=True) - soft
    else:
        ids, keep = hard_labels(label, s.shape[0], ignore_index(ctx))
        d = s.copy()
        d[np.arange(s.shape[0]), ids] -= 1
        d *= keep[:, None]
    ctx.set_output("Logits@GRAD", (d * g).reshape(sm.shape))


# -- lookup_table, lookup_table_v2 --------------------------------------------------------------
@register("lookup_table")
def lookup_table(ctx: KernelContext) -> None:
    _lookup(ctx, "lookup_table")


@register(LOOKUP_V2)
def lookup_table_v2(ctx: KernelContext) -> None:
    """`lookup_table` without dropping a trailing 1 of the ids: Out is Ids' shape + [D]."""
    _lookup(ctx, LOOKUP_V2)


def _lookup(ctx: KernelContext, version: str) -> None:
    w, ids_in = ctx.input("W"), ctx.input("Ids")
    ids = lookup_ids(ctx, w.shape[0])
    out = w[ids]
    pad = padding_idx(ctx)
    if pad >= 0:
        out[ids == pad] = 0
    ctx.set_output("Out", out.reshape(lookup_lead(ids_in.shape, version) + w.shape[1:]),
                   lod=ctx.lod("Ids"))


@register("lookup_table_grad")
@register("lookup_table_v2_grad")
def lookup_table_grad(ctx: KernelContext) -> None:
    """Rows of Out@GRAD go to the rows they were read from; the padding row gets none. Sparse
    (`is_sparse`): a SelectedRows with one row per id, repeats kept."""
    w = ctx.input("W")
    ids = lookup_ids(ctx, w.shape[0])
    g = out_grad(ctx, ctx.input("Out")).reshape((ids.shape[0],) + w.shape[1:])
    keep = ids != padding_idx(ctx)
    if ctx.attr("is_sparse", False):
        ctx.set_output("W@GRAD", SelectedRows(ids[keep], g[keep], w.shape[0]))
        return
    dw = np.zeros_like(w)
    np.add.at(dw, ids[keep], g[keep])
    ctx.set_output("W@GRAD", dw)


# -- sequence_pool ------------------------------------------------------------------------------
@register("sequence_pool")
def sequence_pool(ctx: KernelContext) -> None:
    x = ctx.input("X")
    kind = str(ctx.attr("pooltype", "AVERAGE")).upper()
    seg = Segments(ctx, x.shape[0])
    x2 = x.reshape(x.shape[0], -1)
    out = np.zeros((seg.count, x2.shape[1]), dtype=x.dtype)
    index = np.full(out.shape, -1, dtype=np.int32)
    ne, starts = seg.nonempty, seg.starts[seg.nonempty]
    if kind in ("SUM", "AVERAGE", "SQRT"):
        if starts.size:
            out[ne] = np.add.reduceat(x2, starts, axis=0)
        out *= pool_scale(kind, seg.lengths, x.dtype)[:, None]
    elif kind == "MAX":
        if starts.size:
            out[ne] = np.maximum.reduceat(x2, starts, axis=0)
            rows = np.arange(x2.shape[0])[:, None]
            candidates = np.where(x2 == out[seg.row_seq], rows, x2.shape[0])
            index[ne] = np.minimum.reduceat(candidates, starts, axis=0)
    elif kind == "FIRST":
        out[ne] = x2[starts]
    elif kind == "LAST":
        out[ne] = x2[seg.ends[ne] - 1]
    else:
        raise ValueError(f"unknown pooltype {kind!r}")
    ctx.set_output("Out", out.reshape((seg.count,) + x.shape[1:]), lod=seg.outer_lod)
    ctx.set_output("MaxIndex", index)


@register("sequence_pool_grad")
def sequence_pool_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    kind = str(ctx.attr("pooltype", "AVERAGE")).upper()
    seg = Segments(ctx, x.shape[0])
    g = out_grad(ctx, ctx.input("Out")).reshape(seg.count, -1)
    ne = seg.nonempty
    if kind in ("SUM", "AVERAGE", "SQRT"):
        dx = (g * pool_scale(kind, seg.lengths, x.dtype)[:, None])[seg.row_seq]
    else:
        dx = np.zeros((x.shape[0], g.shape[1]), dtype=x.dtype)
        if kind == "MAX":
            dx[ctx.input("MaxIndex")[ne], np.arange(g.shape[1])] = g[ne]
        elif kind == "FIRST":
            dx[seg.starts[ne]] = g[ne]
        else:
            dx[seg.ends[ne] - 1] = g[ne]
    ctx.set_output("X@GRAD", dx.reshape(x.shape))


# -- nce ----------------------------------------------------------------------------------------
def class_rows(w: Array | SelectedRows, classes: Array, what: str = "nce: Weight") -> Array:
    """Rows of W for `classes` (any shape; result `classes.shape + [D]`). W may be the
    SelectedRows of the rows a trainer prefetched (remote_prefetch): each class must be one."""
    if not isinstance(w, SelectedRows):
        if classes.size and classes.max() >= w.shape[0]:
            raise IndexError(f"{what}: class {classes.max()} outside its {w.shape[0]} rows")
        return w[classes]
    return np.asarray(w.values)[selected_positions(w, classes, what)]


def selected_positions(w: SelectedRows, classes: Array, what: str) -> Array:
    """Where each of `classes` sits among the rows of the SelectedRows `w`."""
    rows = np.asarray(w.rows, np.int64)
    order = np.argsort(rows, kind="stable")
    at = np.minimum(np.searchsorted(rows[order], classes), max(rows.size - 1, 0))
    found = order[at] if rows.size else np.zeros_like(classes)
    if rows.size == 0 or (rows[found] != classes).any():
        missing = classes if rows.size == 0 else classes[rows[found] != classes]
        raise ValueError(f"{what}: the prefetched rows lack classes "
                         f"{np.unique(missing)[:8].tolist()}")
    return found


def nce_terms(ctx: KernelContext, labels: Array, dtype: np.dtype) -> tuple[Array, Array]:
    """b = q(class) * num_neg_samples per sample label, and the mask of the true ones."""
    b = sampler_of(ctx).probability(labels) * int(ctx.attr("num_neg_samples", 10))
    num_true = true_labels(ctx, labels.shape[0]).shape[1]
    return b.astype(dtype), np.arange(labels.shape[1]) < num_true


def sample_weights(ctx: KernelContext, rows: int, dtype: np.dtype) -> Array:
    sw = ctx.input("SampleWeight")
    return np.ones(rows, dtype) if sw is None else np.asarray(sw, dtype).reshape(rows)


@register("nce")
def nce(ctx: KernelContext) -> None:
    """Paddle's nce: o = sigmoid(Input . W[c] + Bias[c]) per sample label c (SampleLogits holds
    o, as Paddle's does); Cost_i = SampleWeight_i * sum_j (-log(o/(o+b)) for the true labels,
    -log(b/(o+b)) for the negatives), b = q(c) * num_neg_samples (`sampling`)."""
    x = ctx.input("Input")
    labels = sample_labels(ctx)
    logits = np.einsum("nd,nsd->ns", x, class_rows(ctx.input("Weight"), labels))
    bias = ctx.input("Bias")
    if bias is not None:
        logits = logits + np.asarray(bias).reshape(-1)[labels]
    o = (1.0 / (1.0 + np.exp(-logits))).astype(x.dtype)
    b, true = nce_terms(ctx, labels, x.dtype)
    cost = np.where(true, -np.log(o / (o + b)), -np.log(b / (o + b)))
    cost = cost.sum(axis=1) * sample_weights(ctx, x.shape[0], x.dtype)
    ctx.set_output("Cost", cost.astype(x.dtype).reshape(-1, 1))
    ctx.set_output("SampleLogits", o)
    ctx.set_output("SampleLabels", labels)


def nce_sample_grad(ctx: KernelContext, o: Array, labels: Array, dcost: Array) -> Array:
    """d Cost / d logit of each sample label (Paddle's nce_grad)."""
    b, true = nce_terms(ctx, labels, o.dtype)
    g = np.where(true, (b / (o + b)) * (o - 1), o * (1 - o) / (o + b))
    return g * (sample_weights(ctx, o.shape[0], o.dtype) * dcost.reshape(-1))[:, None]


def nce_weight_grad(w: Array | SelectedRows, labels: Array, contrib: Array,
                    sparse: bool) -> Array | SelectedRows:
    """Weight@GRAD from each sample's row gradient `contrib` ([N*S, D]): dense, or (is_sparse)
    a SelectedRows of the sample labels, each once, sorted (as Paddle's)."""
    height = w.height if isinstance(w, SelectedRows) else w.shape[0]
    if sparse:
        rows, inverse = np.unique(labels.reshape(-1), return_inverse=True)
        values = np.zeros((rows.size, contrib.shape[1]), contrib.dtype)
        np.add.at(values, inverse, contrib)
        return SelectedRows(rows, values, height)
    if isinstance(w, SelectedRows):
        raise TypeError("nce_grad: Weight is the prefetched rows (remote_prefetch), which needs "
                        "is_sparse")
    dw = np.zeros_like(w)
    np.add.at(dw, labels.reshape(-1), contrib)
    return dw


@register("nce_grad")
def nce_grad(ctx: KernelContext) -> None:
    x, w = ctx.input("Input"), ctx.input("Weight")
    labels, o = ctx.input("SampleLabels"), ctx.input("SampleLogits")
    g = nce_sample_grad(ctx, o, labels, out_grad(ctx, np.zeros(x.shape[0], x.dtype), "Cost@GRAD"))
    if ctx.has_output("Bias@GRAD"):
        bias = ctx.input("Bias")
        db = np.zeros(bias.size, bias.dtype)
        np.add.at(db, labels.reshape(-1), g.reshape(-1).astype(bias.dtype))
        ctx.set_output("Bias@GRAD", db.reshape(bias.shape))
    if ctx.has_output("Weight@GRAD"):
        contrib = (g[:, :, None] * x[:, None, :]).reshape(-1, x.shape[1])
        ctx.set_output("Weight@GRAD", nce_weight_grad(w, labels, contrib,
                                                      bool(ctx.attr("is_sparse", False))))
    if ctx.has_output("Input@GRAD"):
        ctx.set_output("Input@GRAD", np.einsum("ns,nsd->nd", g, class_rows(w, labels))
                       .astype(x.dtype))


# -- hierarchical_sigmoid -----------------------------------------------------------------------
HSIGMOID_CLIP = 40.0
"""fluid clips each node's logit to [-40, 40] before the loss."""


@register("hierarchical_sigmoid")
def hierarchical_sigmoid(ctx: KernelContext) -> None:
    """fluid's hsigmoid: per row, the logit of each node on its class's path,
    p_j = clip(X . W[index_j] + Bias[index_j], -40, 40) (0 past the path); PreOut =
    log(1 + exp(p)); Out = sum_j PreOut_j - sum_j bit_j p_j. As fluid's kernel, each column
    past a shorter path adds log 2 to Out (a constant: no gradient)."""
    x, w, bias = ctx.input("X"), ctx.input("W"), ctx.input("Bias")
    index, bit, valid = hsigmoid_codes(ctx, ctx.input("Label"), x.shape[0])
    pre = np.einsum("nd,nld->nl", x, w[index])
    if bias is not None:
        pre = pre + np.asarray(bias).reshape(-1)[index]
    pre = np.clip(np.where(valid, pre, 0.0), -HSIGMOID_CLIP, HSIGMOID_CLIP).astype(x.dtype)
    soft = np.log1p(np.exp(pre))
    out = soft.sum(axis=1) - (bit * pre).sum(axis=1)
    ctx.set_output("Out", out.astype(x.dtype).reshape(-1, 1))
    ctx.set_output("PreOut", soft)


def hsigmoid_node_grad(ctx: KernelContext, pre_out: Array, bit: Array, valid: Array) -> Array:
    """d Out / d p_j for each node on the path, times Out@GRAD: sigmoid(p_j) - bit_j (fluid's,
    read back from PreOut = log(1 + exp(p)); the clip is not differentiated, as in fluid)."""
    g = out_grad(ctx, np.zeros((pre_out.shape[0], 1), pre_out.dtype)).reshape(-1, 1)
    return np.where(valid, (1.0 - np.exp(-pre_out)) - bit, 0.0).astype(pre_out.dtype) * g


@register("hierarchical_sigmoid_grad")
def hierarchical_sigmoid_grad(ctx: KernelContext) -> None:
    x, w = ctx.input("X"), ctx.input("W")
    index, bit, valid = hsigmoid_codes(ctx, ctx.input("Label"), x.shape[0])
    d = hsigmoid_node_grad(ctx, ctx.input("PreOut"), bit, valid)
    ctx.set_output("X@GRAD", np.einsum("nl,nld->nd", d, w[index]).astype(x.dtype))
    nodes, per_node = index[valid], d[valid]
    if ctx.has_output("Bias@GRAD"):
        bias = ctx.input("Bias")
        db = np.zeros(np.shape(bias), np.asarray(bias).dtype)
        np.add.at(db.reshape(-1), nodes, per_node)
        ctx.set_output("Bias@GRAD", db)
    if not ctx.has_output("W@GRAD"):
        return
    rows_of = np.nonzero(valid)[0]
    dw = np.zeros_like(w)
    np.add.at(dw, nodes, (per_node[:, None] * x[rows_of]).astype(w.dtype, copy=False))
    if ctx.attr("is_sparse", False):
        rows = hsigmoid_rows(ctx)
        ctx.set_output("W@GRAD", SelectedRows(rows, dw[rows], w.shape[0]))
    else:
        ctx.set_output("W@GRAD", dw)


# -- top_k and accuracy -------------------------------------------------------------------------
def top_k_of(ctx: KernelContext, width: int) -> int:
    """The ``k`` attribute, checked against the last dim's `width`."""
    k = int(ctx.attr("k", 1))
    if not 1 <= k <= width:
        raise ValueError(f"k = {k} is not in [1, {width}] (X's last dim)")
    return k


@register("top_k")
def top_k(ctx: KernelContext) -> None:
    """The `k` largest values along X's last dim, largest first (equal values: lower index
    first), and their int64 positions; X's LoD kept."""
    x = ctx.input("X")
    order = np.argsort(-x, axis=-1, kind="stable")[..., :top_k_of(ctx, x.shape[-1])]
    ctx.set_output("Out", np.take_along_axis(x, order, axis=-1), lod=ctx.lod("X"))
    ctx.set_output("Indices", order.astype(np.int64), lod=ctx.lod("X"))


def correct_rows(indices: Array, label: Array) -> int:
    """How many rows of `indices` (top-k class ids, a row per sample) hold that sample's label."""
    rows = indices.shape[0]
    labels = np.asarray(label).reshape(-1)
    if labels.size < rows:
        raise ValueError(f"{labels.size} labels for {rows} samples")
    labels = labels[:rows]
    if (labels < 0).any():
        raise ValueError(f"label {int(labels.min())} is negative")
    return int((indices.reshape(rows, -1) == labels[:, None]).any(axis=1).sum())


@register("accuracy")
def accuracy(ctx: KernelContext) -> None:
    """fluid's accuracy of top-k predictions (Indices, from `top_k`) against Label: Correct
    (int32 [1]) counts the samples whose label is among their k ids, Total (int32 [1]) the
    samples, Accuracy (float32 [1]) is Correct / Total (0 for no sample). No gradient."""
    indices = np.asarray(ctx.input("Indices"))
    rows = indices.shape[0]
    correct = correct_rows(indices, ctx.input("Label")) if rows else 0
    ratio = np.float32(correct) / np.float32(rows) if rows else np.float32(0)
    ctx.set_output("Accuracy", np.array([ratio], np.float32))
    ctx.set_output("Correct", np.array([correct], np.int32))
    ctx.set_output("Total", np.array([rows], np.int32))
