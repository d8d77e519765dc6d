"""The ops of fluid's text models: `sequence_conv` (a convolution over each LoD sequence's
rows, zeros past its ends) and `cos_sim` (the cosine of X's rows with Y's, Y possibly one row
for all), each with its gradient kernel; and `auc`, fluid's ROC-curve metric, forward only,
which bins the positive-class predictions into persistable counts (StatPos, StatNeg) that it
updates and reads the area from.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.execution.kernels.common import context_index, out_grad
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register

Array = np.ndarray


# -- sequence_conv ------------------------------------------------------------------------------
def context_columns(x: Array, index: Array) -> Array:
    """Each row's window as one row ``[rows, contextLength * D]``: X's rows at `index`, the
    index one past X reading zeros."""
    padded = np.concatenate([x, np.zeros((1, x.shape[1]), x.dtype)])
    return padded[index].reshape(x.shape[0], -1)


def sequence_window(ctx: KernelContext) -> tuple[Array, Array, Array]:
    """X, Filter (2-D both) and each row's window index (`common.context_index`)."""
    x, w = ctx.input("X"), ctx.input("Filter")
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"sequence_conv: X {x.shape} and Filter {w.shape} must be 2-D")
    return x, w, context_index(ctx, x.shape[0], x.shape[1], w.shape[0])


@register("sequence_conv")
def sequence_conv(ctx: KernelContext) -> None:
    """Out [T, M] = each row's context window [T, contextLength * D] times Filter, X's LoD
    kept (fluid's context projection and matmul)."""
    x, w, index = sequence_window(ctx)
    ctx.set_output("Out", context_columns(x, index) @ w, lod=ctx.lod("X"))


@register("sequence_conv_grad")
def sequence_conv_grad(ctx: KernelContext) -> None:
    """Filter@GRAD = windows^T Out@GRAD; X@GRAD: each window slot's share of
    Out@GRAD Filter^T added back to the row it read (none to the zero padding)."""
    x, w, index = sequence_window(ctx)
    g = out_grad(ctx, np.zeros((x.shape[0], w.shape[1]), x.dtype))
    if ctx.has_output("Filter@GRAD"):
        ctx.set_output("Filter@GRAD", (context_columns(x, index).T @ g).astype(w.dtype, copy=False))
    if ctx.has_output("X@GRAD"):
        dx = np.zeros((x.shape[0] + 1, x.shape[1]), x.dtype)
        np.add.at(dx, index.reshape(-1), (g @ w.T).reshape(-1, x.shape[1]))
        ctx.set_output("X@GRAD", dx[:-1])


# -- cos_sim ------------------------------------------------------------------------------------
def cos_shapes(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """X's and Y's shapes flattened to rows; Y must have X's rows or one row, of X's width."""
    x2, y2 = (x[0], math.prod(x[1:])), (y[0], math.prod(y[1:]))
    if y2[0] not in (1, x2[0]) or y2[1] != x2[1]:
        raise ValueError(f"cos_sim: Y {list(y)} must have X's {x[0]} rows or one, each of X's "
                         f"{x2[1]} values")
    return x2, y2


def cos_operands(x: Array, y: Array) -> tuple[Array, Array]:
    """X and Y flattened to rows (`cos_shapes`)."""
    x2, y2 = cos_shapes(tuple(x.shape), tuple(y.shape))
    return x.reshape(x2), y.reshape(y2)


@register("cos_sim")
def cos_sim(ctx: KernelContext) -> None:
    """Out [N, 1] = x.y / (|x| |y|) per row (fluid's: no epsilon); XNorm [N, 1], YNorm
    [N or 1, 1] the norms; X's LoD kept."""
    x2, y2 = cos_operands(ctx.input("X"), ctx.input("Y"))
    xn = np.sqrt((x2 * x2).sum(axis=1, keepdims=True))
    yn = np.sqrt((y2 * y2).sum(axis=1, keepdims=True))
    ctx.set_output("Out", (x2 * y2).sum(axis=1, keepdims=True) / (xn * yn), lod=ctx.lod("X"))
    ctx.set_output("XNorm", xn)
    ctx.set_output("YNorm", yn)


@register("cos_sim_grad")
def cos_sim_grad(ctx: KernelContext) -> None:
    """d/dx = g (y / (|x||y|) - out x / |x|^2), and d/dy alike; a broadcast Y's gradient is
    the sum over X's rows."""
    x, y = ctx.input("X"), ctx.input("Y")
    x2, y2 = cos_operands(x, y)
    xn, yn, out = ctx.input("XNorm"), ctx.input("YNorm"), ctx.input("Out")
    g = out_grad(ctx, out)
    if ctx.has_output("X@GRAD"):
        dx = g * (y2 / (xn * yn) - out * x2 / (xn * xn))
        ctx.set_output("X@GRAD", dx.astype(x.dtype, copy=False).reshape(x.shape))
    if ctx.has_output("Y@GRAD"):
        dy = g * (x2 / (xn * yn) - out * y2 / (yn * yn))
        if y2.shape[0] != x2.shape[0]:
            dy = dy.sum(axis=0, keepdims=True)
        ctx.set_output("Y@GRAD", dy.astype(y.dtype, copy=False).reshape(y.shape))


# -- auc ----------------------------------------------------------------------------------------
AUC_THRESHOLDS = 2 ** 12 - 1
"""fluid 1.x's default num_thresholds (its layer's; the op's own default differs)."""


def stat_size(thresholds: int, steps: int) -> int:
    """Counts in a StatPos/StatNeg: a bucket row per slide step and their sum, and (sliding)
    the step counter at the end; one row without sliding (fluid's layout)."""
    return (1 + steps) * (thresholds + 1) + (1 if steps else 0)


def bucket_counts(ctx: KernelContext, thresholds: int) -> tuple[Array, Array]:
    """This batch's positives and negatives per bucket: each row's last Predict column (the
    positive class's probability) times num_thresholds, truncated; a nonzero label is
    positive."""
    predict = np.asarray(ctx.input("Predict"))
    p = predict.reshape(predict.shape[0], -1)[:, -1]
    label = np.asarray(ctx.input("Label")).reshape(-1)
    if label.size != p.size:
        raise ValueError(f"auc: {label.size} labels for {p.size} predictions")
    if p.size and (p.min() < 0 or p.max() > 1):
        raise ValueError("auc: Predict must lie in [0, 1]")
    bins = (p * np.asarray(thresholds, p.dtype)).astype(np.int64)
    positive = label != 0
    return (np.bincount(bins[positive], minlength=thresholds + 1),
            np.bincount(bins[~positive], minlength=thresholds + 1))


def area(pos: Array, neg: Array) -> float:
    """The ROC area of per-bucket counts: trapezoids from the highest threshold down,
    normalized by the positives times the negatives (0 while either is missing)."""
    tp = np.concatenate([[0], np.cumsum(pos[::-1], dtype=np.float64)])
    fp = np.concatenate([[0], np.cumsum(neg[::-1], dtype=np.float64)])
    total = float((np.abs(np.diff(fp)) * (tp[1:] + tp[:-1]) / 2.0).sum())
    return total / tp[-1] / fp[-1] if tp[-1] > 0 and fp[-1] > 0 else total


def accumulate(stats: tuple[Array, Array], batch: tuple[Array, Array], steps: int,
               buckets: int) -> None:
    """Add the batch's counts into `stats` in place: the single row, or (sliding) the step's
    row after taking its old counts out of the sum row, then the counter."""
    for stat, counts in zip(stats, batch):
        if not steps:
            stat[:buckets] += counts
            continue
        cur = (int(stat[(steps + 1) * buckets]) % steps) * buckets
        total = steps * buckets
        stat[total:total + buckets] += counts - stat[cur:cur + buckets]
        stat[cur:cur + buckets] = counts


def auc_stats(ctx: KernelContext, thresholds: int,
              steps: int) -> tuple[list[Array], tuple[Array, Array]]:
    """StatPos and StatNeg as given, and flat int64 copies of them to update, checked against
    the attributes."""
    if thresholds < 1 or steps < 0:
        raise ValueError(f"auc: num_thresholds {thresholds} must be positive and slide_steps "
                         f"{steps} not negative")
    given = [np.asarray(ctx.input(s)) for s in ("StatPos", "StatNeg")]
    stats = (given[0].astype(np.int64).reshape(-1), given[1].astype(np.int64).reshape(-1))
    if any(s.size != stat_size(thresholds, steps) for s in stats):
        raise ValueError(f"auc: StatPos and StatNeg must hold {stat_size(thresholds, steps)} "
                         f"counts, got {given[0].size} and {given[1].size}")
    return given, stats


@register("auc")
def auc(ctx: KernelContext) -> None:
    """fluid's auc (ROC): StatPosOut/StatNegOut are StatPos/StatNeg with this batch's bucket
    counts added (sliding over the last ``slide_steps`` batches, or all of them with 0), AUC
    (float64 [1]) their curve's area. A batch of one sample with a negative label is skipped,
    as fluid skips it (the counts stay, the area is theirs). No gradient."""
    thresholds = int(ctx.attr("num_thresholds", AUC_THRESHOLDS))
    steps, buckets = int(ctx.attr("slide_steps", 1)), thresholds + 1
    given, stats = auc_stats(ctx, thresholds, steps)
    label = np.asarray(ctx.input("Label")).reshape(-1)
    counted = not (label.size == 1 and label[0] < 0)
    if counted:
        accumulate(stats, bucket_counts(ctx, thresholds), steps, buckets)
    total = steps * buckets
    value = area(stats[0][total:total + buckets], stats[1][total:total + buckets])
    if steps and counted:
        for stat in stats:
            stat[(steps + 1) * buckets] += 1
    ctx.set_output("AUC", np.array([value], np.float64))
    ctx.set_output("StatPosOut", stats[0].reshape(given[0].shape))
    ctx.set_output("StatNegOut", stats[1].reshape(given[1].shape))
