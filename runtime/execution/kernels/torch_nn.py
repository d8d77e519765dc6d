"""Torch kernels of the neural-net ops: `mul`, softmax, the cross-entropy losses, `lookup_table` (and `_v2`)
(dense or `SelectedRows` gradient), `sequence_pool` and `nce` (its samples drawn on the host by
`sampling`, as the numpy kernel draws them) and `hierarchical_sigmoid` (its tree paths found on
the host), with their gradients: `numpy_nn` op for op; and `top_k` (a stable descending sort,
so equal values come lower index first as in numpy's) and `accuracy` (the numpy kernel: a
count on the host).

Index bookkeeping stays on the host in numpy, shared with the numpy backend: label ids and the
ignore mask (`hard_labels`), table ids (`lookup_ids`), LoD segments (`Segments`). Integer ids and
labels live in the scope as numpy (see `torch_common`), so reading them costs no copy; the table
itself is a tensor kept on the device, so a lookup moves only the rows it reads. Only the values
are computed in torch; scatters and gathers replace numpy's fancy indexing and
`ufunc.at`/`reduceat`.
"""

from __future__ import annotations

import math

import numpy as np

from runtime.execution.kernels.common import (LOOKUP_V2, Segments, hard_labels, hsigmoid_codes,
                                              hsigmoid_rows, ignore_index, lookup_ids,
                                              lookup_lead, mul_dims, padding_idx, pool_scale,
                                              soft_label)
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels import numpy_nn
from runtime.execution.kernels.numpy_nn import (HSIGMOID_CLIP, nce_terms, selected_positions,
                                                top_k_of)
from runtime.execution.kernels.sampling import sample_labels
from runtime.execution.kernels.torch_common import (Tensor, as_float, dtype_of, host, input_t,
                                                    kernel, on_host, out_grad_t, put, reshaped,
                                                    tensor, torch, zeros)
from runtime.execution.tensor import SelectedRows


# -- mul ----------------------------------------------------------------------------------------
def _flatten2(a: Tensor, num_col_dims: int) -> Tensor:
    if a.dim() == 2 and num_col_dims == 1:
        return a
    return a.reshape(math.prod(a.shape[:num_col_dims]), math.prod(a.shape[num_col_dims:]))


NARROW = 16
"""At most this many output columns, and more rows than that, a CPU product may be computed
transposed (`_mm`)."""


def _mkl_on_amd() -> bool:
    """Whether torch's CPU BLAS is MKL running on an AMD processor (Linux's /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            amd = any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in f)
    except OSError:
        return False
    return amd and bool(torch.backends.mkl.is_available())


TRANSPOSE_NARROW = _mkl_on_amd()
"""Whether `_mm` computes a narrow CPU product transposed. Decided by the processor, never by
timing, so every process on a machine computes the same bits."""


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in the promoted dtype of the two (torch's matmul wants equal dtypes, numpy's promotes)."""
    if a.dtype is b.dtype:
        return _mm(a, b)
    dtype = torch.promote_types(a.dtype, b.dtype)
    return _mm(a.to(dtype), b.to(dtype))


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """a @ b; with MKL on an AMD CPU, a product with few columns and many rows as
    (b^T a^T)^T, copied into rows (the scope holds contiguous values; the copy is of the
    narrow result).

    DESIGN: MKL takes a slow path for a narrow product on AMD: a [64, 1024] x [1024, 10]
    logits layer took 90 us against 20 us in numpy's OpenBLAS on a 2-core AMD EPYC, its weight
    gradient [1024, 64] x [64, 10] 200 us; transposed, 33 and 46 us. On an Intel Xeon the
    direct products take 17 and 18 us and the transposed ones 41 and 29, hence the switch."""
    if TRANSPOSE_NARROW and b.shape[1] <= NARROW < a.shape[0] and a.device.type == "cpu":
        return torch.mm(b.t(), a.t()).t().contiguous()
    return torch.mm(a, b)


@kernel("mul")
def mul(ctx: KernelContext) -> None:
    x, y = input_t(ctx, "X"), input_t(ctx, "Y")
    xd, yd = mul_dims(ctx)
    out = _matmul(_flatten2(x, xd), _flatten2(y, yd))
    shape = x.shape[:xd] + y.shape[yd:]
    put(ctx, "Out", reshaped(out, shape), lod=ctx.lod("X"))


@kernel("mul_grad")
def mul_grad(ctx: KernelContext) -> None:
    x, y = input_t(ctx, "X"), input_t(ctx, "Y")
    xd, yd = mul_dims(ctx)
    x2, y2 = _flatten2(x, xd), _flatten2(y, yd)
    g = reshaped(out_grad_t(ctx), (x2.shape[0], y2.shape[1]))
    if ctx.has_output("X@GRAD"):
        put(ctx, "X@GRAD", reshaped(_matmul(g, y2.T), x.shape))
    if ctx.has_output("Y@GRAD"):
        put(ctx, "Y@GRAD", reshaped(_matmul(x2.T, g), y.shape))


# -- softmax ------------------------------------------------------------------------------------
def softmax_of(x: Tensor, dim: int = -1) -> Tensor:
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


@kernel("softmax")
def softmax(ctx: KernelContext) -> None:
    x = as_float(input_t(ctx, "X"))
    put(ctx, "Out", softmax_of(x, int(ctx.attr("axis", -1))), lod=ctx.lod("X"))


@kernel("softmax_grad")
def softmax_grad(ctx: KernelContext) -> None:
    out = input_t(ctx, "Out")
    g = out_grad_t(ctx)
    dim = int(ctx.attr("axis", -1))
    put(ctx, "X@GRAD", out * (g - (g * out).sum(dim=dim, keepdim=True)))


# -- cross entropy ------------------------------------------------------------------------------
def _labels(ctx: KernelContext, label: np.ndarray, rows: int) -> tuple[Tensor, Tensor | None]:
    """Class ids per row as a [rows, 1] index, and the [rows, 1] mask of the rows that count,
    None where all do (the usual case: no masking op then), on the device."""
    ids, keep = hard_labels(host(label), rows, ignore_index(ctx))
    return tensor(ids.reshape(-1, 1)), (None if keep.all() else tensor(keep.reshape(-1, 1)))


def _masked(t: Tensor, keep: Tensor | None) -> Tensor:
    """`t` with zeros in the rows `keep` leaves out."""
    return t if keep is None else torch.where(keep, t, 0)


def _rows(t: Tensor, classes: int) -> Tensor:
    """`t` as a [rows, classes] matrix (itself when it is one already)."""
    return t if t.dim() == 2 else t.reshape(-1, classes)



@kernel("cross_entropy")
def cross_entropy(ctx: KernelContext) -> None:
    x, label = ctx.input("X"), ctx.input("Label")
    p = _rows(tensor(x), x.shape[-1])
    if soft_label(ctx):
        loss = -(tensor(label).reshape(p.shape) * torch.log(p)).sum(dim=1)
    else:
        ids, keep = _labels(ctx, label, p.shape[0])
        loss = _masked(-torch.log(p.gather(1, ids)), keep)
    put(ctx, "Y", reshaped(loss, x.shape[:-1] + (1,)), dtype=x.dtype)


@kernel("cross_entropy_grad")
def cross_entropy_grad(ctx: KernelContext) -> None:
    x, label = ctx.input("X"), ctx.input("Label")
    p = _rows(tensor(x), x.shape[-1])
    g = out_grad_t(ctx, "Y", "Y@GRAD").reshape(-1, 1)
    if soft_label(ctx):
        dp = -g * tensor(label).reshape(p.shape) / p
    else:
        ids, keep = _labels(ctx, label, p.shape[0])
        picked = _masked(-g / p.gather(1, ids), keep)
        dp = torch.zeros_like(p).scatter_(1, ids, picked.to(p.dtype))
    put(ctx, "X@GRAD", reshaped(dp, x.shape))


@kernel("cross_entropy2")
def cross_entropy2(ctx: KernelContext) -> None:
    x = ctx.input("X")
    p = _rows(tensor(x), x.shape[-1])
    ids, keep = _labels(ctx, ctx.input("Label"), p.shape[0])
    match = _masked(p.gather(1, ids), keep)
    lead = x.shape[:-1] + (1,)
    put(ctx, "MatchX", reshaped(match, lead), dtype=x.dtype)
    # an ignored row's -log(0) is never selected
    put(ctx, "Y", reshaped(_masked(-torch.log(match), keep), lead), dtype=x.dtype)


@kernel("cross_entropy_grad2")
def cross_entropy_grad2(ctx: KernelContext) -> None:
    x = ctx.input("X")
    p = _rows(tensor(x), x.shape[-1])
    g = out_grad_t(ctx, "Y", "Y@GRAD").reshape(-1, 1)
    ids, keep = _labels(ctx, ctx.input("Label"), p.shape[0])
    picked = _masked(-g / tensor(ctx.input("MatchX")).reshape(-1, 1), keep)
    put(ctx, "X@GRAD", reshaped(torch.zeros_like(p).scatter_(1, ids, picked.to(p.dtype)), x.shape))


@kernel("softmax_with_cross_entropy")
def softmax_with_cross_entropy(ctx: KernelContext) -> None:
    logits, label = ctx.input("Logits"), ctx.input("Label")
    z = _rows(tensor(logits), logits.shape[-1])
    log_sm = torch.log_softmax(z, dim=1)  # numpy's shifted - log(sum(exp(shifted))), fused
    if soft_label(ctx):
        loss = -(tensor(label).reshape(z.shape) * log_sm).sum(dim=1)
    else:
        ids, keep = _labels(ctx, label, z.shape[0])
        loss = _masked(log_sm.gather(1, ids).neg_(), keep)
    put(ctx, "Softmax", reshaped(torch.exp(log_sm), logits.shape))
    put(ctx, "Loss", reshaped(loss, logits.shape[:-1] + (1,)), dtype=logits.dtype)


@kernel("softmax_with_cross_entropy_grad")
def softmax_with_cross_entropy_grad(ctx: KernelContext) -> None:
    """d loss / d logits = softmax * sum(label) - label (one-hot for hard labels)."""
    sm, label = ctx.input("Softmax"), ctx.input("Label")
    s = _rows(tensor(sm), sm.shape[-1])
    g = out_grad_t(ctx, "Loss", "Loss@GRAD").reshape(-1, 1)
    if soft_label(ctx):
        soft = tensor(label).reshape(s.shape)
        d = s * soft.sum(dim=1, keepdim=True) - soft
    else:
        ids, keep = _labels(ctx, label, s.shape[0])
        # numpy's (s - one_hot) * keep * g; s + -1 is s - 1 to the bit, and the 0/1 mask
        # folds into g exactly
        d = s.scatter_add(1, ids, torch.full(ids.shape, -1, dtype=s.dtype, device=s.device))
        if keep is not None:
            g = g * keep
    put(ctx, "Logits@GRAD", reshaped(d * g, sm.shape))


# -- lookup_table, lookup_table_v2 --------------------------------------------------------------
@kernel("lookup_table")
def lookup_table(ctx: KernelContext) -> None:
    _lookup(ctx, "lookup_table")


@kernel(LOOKUP_V2)
def lookup_table_v2(ctx: KernelContext) -> None:
    """`lookup_table` without dropping a trailing 1 of the ids: Out is Ids' shape + [D]."""
    _lookup(ctx, LOOKUP_V2)


def _lookup(ctx: KernelContext, version: str) -> None:
    w, ids_in = ctx.input("W"), ctx.input("Ids")
    ids = lookup_ids(ctx, w.shape[0], host(ids_in))
    out = tensor(w)[tensor(ids)]
    pad = padding_idx(ctx)
    if pad >= 0:
        out[tensor(ids == pad)] = 0
    put(ctx, "Out", out.reshape(lookup_lead(tuple(ids_in.shape), version) + tuple(w.shape[1:])),
        lod=ctx.lod("Ids"))


@kernel("lookup_table_grad")
@kernel("lookup_table_v2_grad")
def lookup_table_grad(ctx: KernelContext) -> None:
    """Rows of Out@GRAD go to the rows they were read from; the padding row gets none. Sparse
    (`is_sparse`): a SelectedRows with one row per id, repeats kept."""
    w = ctx.input("W")
    ids = lookup_ids(ctx, w.shape[0], host(ctx.input("Ids")))
    g = out_grad_t(ctx).reshape((ids.shape[0],) + w.shape[1:])
    keep = ids != padding_idx(ctx)
    kept = g[tensor(keep)]
    if ctx.attr("is_sparse", False):
        ctx.set_output("W@GRAD", SelectedRows(ids[keep], kept, w.shape[0]))
        return
    dw = zeros(w.shape, w.dtype)
    put(ctx, "W@GRAD", dw.index_add_(0, tensor(ids[keep]), kept.to(dw.dtype)))


# -- sequence_pool ------------------------------------------------------------------------------
def _segment_index(seg: Segments, width: int) -> Tensor:
    """For each row, its sequence, repeated over the `width` columns (a scatter index)."""
    return tensor(seg.row_seq).reshape(-1, 1).expand(-1, width)


@kernel("sequence_pool")
def sequence_pool(ctx: KernelContext) -> None:
    x = ctx.input("X")
    kind = str(ctx.attr("pooltype", "AVERAGE")).upper()
    seg = Segments(ctx, x.shape[0])
    x2 = tensor(x).reshape(x.shape[0], -1)
    out = zeros((seg.count, x2.shape[1]), x.dtype)
    index = torch.full(out.shape, -1, dtype=torch.int32, device=out.device)
    ne = seg.nonempty
    if kind in ("SUM", "AVERAGE", "SQRT"):
        out.index_add_(0, tensor(seg.row_seq), x2)
        out *= tensor(pool_scale(kind, seg.lengths, dtype_of(x)))[:, None]
    elif kind == "MAX":
        where = _segment_index(seg, x2.shape[1])
        out.scatter_reduce_(0, where, x2, "amax", include_self=False)
        rows = torch.arange(x2.shape[0], device=x2.device)[:, None].expand_as(x2)
        candidates = torch.where(x2 == out[where[:, 0]], rows, x2.shape[0]).to(torch.int32)
        index.scatter_reduce_(0, where, candidates, "amin", include_self=False)
    elif kind == "FIRST":
        out[tensor(ne)] = x2[tensor(seg.starts[ne])]
    elif kind == "LAST":
        out[tensor(ne)] = x2[tensor(seg.ends[ne] - 1)]
    else:
        raise ValueError(f"unknown pooltype {kind!r}")
    put(ctx, "Out", out.reshape((seg.count,) + x.shape[1:]), lod=seg.outer_lod)
    put(ctx, "MaxIndex", index)


@kernel("sequence_pool_grad")
def sequence_pool_grad(ctx: KernelContext) -> None:
    x = ctx.input("X")
    kind = str(ctx.attr("pooltype", "AVERAGE")).upper()
    seg = Segments(ctx, x.shape[0])
    g = out_grad_t(ctx).reshape(seg.count, -1)
    ne = seg.nonempty
    if kind in ("SUM", "AVERAGE", "SQRT"):
        dx = (g * tensor(pool_scale(kind, seg.lengths, dtype_of(x)))[:, None])[tensor(seg.row_seq)]
    else:
        dx = zeros((x.shape[0], g.shape[1]), x.dtype)
        picked = g[tensor(ne)].to(dx.dtype)
        if kind == "MAX":
            dx.scatter_(0, input_t(ctx, "MaxIndex")[tensor(ne)].long(), picked)
        elif kind == "FIRST":
            dx[tensor(seg.starts[ne])] = picked
        else:
            dx[tensor(seg.ends[ne] - 1)] = picked
    put(ctx, "X@GRAD", dx.reshape(x.shape))


# -- nce ----------------------------------------------------------------------------------------
def _class_rows(w: Tensor | SelectedRows, classes: np.ndarray) -> Tensor:
    """`numpy_nn.class_rows` on the device: dense W, or the prefetched rows' SelectedRows."""
    if isinstance(w, SelectedRows):
        return tensor(w.values)[tensor(selected_positions(w, classes, "nce: Weight"))]
    if classes.size and classes.max() >= w.shape[0]:
        raise IndexError(f"nce: Weight: class {classes.max()} outside its {w.shape[0]} rows")
    return tensor(w)[tensor(classes)]


def _sample_weights(ctx: KernelContext, rows: int, like: Tensor) -> Tensor:
    sw = ctx.input("SampleWeight")
    return torch.ones(rows, dtype=like.dtype, device=like.device) if sw is None \
        else tensor(sw).to(like.dtype).reshape(rows)


@kernel("nce")
def nce(ctx: KernelContext) -> None:
    x = input_t(ctx, "Input")
    labels = sample_labels(ctx)
    logits = torch.einsum("nd,nsd->ns", x, _class_rows(ctx.input("Weight"), labels).to(x.dtype))
    if ctx.has_input("Bias"):
        logits = logits + input_t(ctx, "Bias").reshape(-1)[tensor(labels)].to(x.dtype)
    o = torch.sigmoid(logits)
    b, true = nce_terms(ctx, labels, dtype_of(x))
    bt, tt = tensor(b), tensor(true)
    cost = torch.where(tt, -torch.log(o / (o + bt)), -torch.log(bt / (o + bt)))
    put(ctx, "Cost", (cost.sum(dim=1) * _sample_weights(ctx, x.shape[0], x)).reshape(-1, 1))
    put(ctx, "SampleLogits", o)
    ctx.set_output("SampleLabels", labels)


@kernel("nce_grad")
def nce_grad(ctx: KernelContext) -> None:
    x, w = input_t(ctx, "Input"), ctx.input("Weight")
    labels, o = host(ctx.input("SampleLabels")), input_t(ctx, "SampleLogits")
    b, true = nce_terms(ctx, labels, dtype_of(o))
    bt, tt = tensor(b), tensor(true)
    g = torch.where(tt, (bt / (o + bt)) * (o - 1), o * (1 - o) / (o + bt))
    dcost = ctx.input("Cost@GRAD")  # missing: zero
    scale = _sample_weights(ctx, x.shape[0], o) * (
        0 if dcost is None else tensor(dcost).reshape(-1).to(o.dtype))
    g = g * scale[:, None]
    flat = tensor(labels.reshape(-1))
    if ctx.has_output("Bias@GRAD"):
        bias = input_t(ctx, "Bias")
        db = zeros((bias.numel(),), dtype_of(bias)).index_add_(0, flat, g.reshape(-1).to(bias.dtype))
        put(ctx, "Bias@GRAD", db.reshape(bias.shape))
    if ctx.has_output("Weight@GRAD"):
        contrib = (g[:, :, None] * x[:, None, :]).reshape(-1, x.shape[1])
        ctx.set_output("Weight@GRAD", _nce_weight_grad(ctx, w, labels, contrib))
    if ctx.has_output("Input@GRAD"):
        put(ctx, "Input@GRAD", torch.einsum("ns,nsd->nd", g, _class_rows(w, labels).to(g.dtype)),
            dtype=dtype_of(x))


def _nce_weight_grad(ctx: KernelContext, w: Tensor | SelectedRows, labels: np.ndarray,
                     contrib: Tensor) -> Tensor | SelectedRows:
    """`numpy_nn.nce_weight_grad` on the device."""
    height = w.height if isinstance(w, SelectedRows) else w.shape[0]
    if ctx.attr("is_sparse", False):
        rows, inverse = np.unique(labels.reshape(-1), return_inverse=True)
        values = zeros((rows.size, contrib.shape[1]), dtype_of(contrib))
        return SelectedRows(rows, values.index_add_(0, tensor(inverse.reshape(-1)), contrib), height)
    if isinstance(w, SelectedRows):
        raise TypeError("nce_grad: Weight is the prefetched rows (remote_prefetch), which needs "
                        "is_sparse")
    dw = zeros(tuple(w.shape), dtype_of(w))
    return dw.index_add_(0, tensor(labels.reshape(-1)), contrib.to(dw.dtype))


# -- hierarchical_sigmoid -----------------------------------------------------------------------
def _paths(ctx: KernelContext, rows: int) -> tuple[Tensor, Tensor, Tensor]:
    index, bit, valid = hsigmoid_codes(ctx, ctx.input("Label"), rows)
    return tensor(index), tensor(bit), tensor(valid)


@kernel("hierarchical_sigmoid")
def hierarchical_sigmoid(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    index, bit, valid = _paths(ctx, x.shape[0])
    pre = torch.einsum("nd,nld->nl", x, input_t(ctx, "W").to(x.dtype)[index])
    if ctx.has_input("Bias"):
        pre = pre + input_t(ctx, "Bias").to(x.dtype).reshape(-1)[index]
    pre = torch.clamp(torch.where(valid, pre, 0), -HSIGMOID_CLIP, HSIGMOID_CLIP)
    soft = torch.log1p(torch.exp(pre))
    out = soft.sum(dim=1) - (bit.to(x.dtype) * pre).sum(dim=1)
    put(ctx, "Out", out.reshape(-1, 1))
    put(ctx, "PreOut", soft)


@kernel("hierarchical_sigmoid_grad")
def hierarchical_sigmoid_grad(ctx: KernelContext) -> None:
    x, pre_out = input_t(ctx, "X"), input_t(ctx, "PreOut")
    w_dtype = dtype_of(ctx.input("W"))
    w = input_t(ctx, "W").to(x.dtype)
    index, bit, valid = _paths(ctx, x.shape[0])
    g = ctx.input("Out@GRAD")
    scale = torch.zeros((x.shape[0], 1), dtype=x.dtype, device=x.device) if g is None \
        else tensor(g).to(x.dtype).reshape(-1, 1)
    d = torch.where(valid, (1.0 - torch.exp(-pre_out)) - bit.to(x.dtype), 0) * scale
    put(ctx, "X@GRAD", torch.einsum("nl,nld->nd", d, w[index]))
    nodes, per_node = index[valid], d[valid]
    if ctx.has_output("Bias@GRAD"):
        bias = ctx.input("Bias")
        db = zeros((math.prod(bias.shape),), dtype_of(bias))
        db.index_add_(0, nodes, per_node.to(db.dtype))
        put(ctx, "Bias@GRAD", db.reshape(tuple(bias.shape)))
    if not ctx.has_output("W@GRAD"):
        return
    rows_of = torch.nonzero(valid)[:, 0]
    dw = zeros(tuple(w.shape), w_dtype)
    dw.index_add_(0, nodes, (per_node[:, None] * x[rows_of]).to(dw.dtype))
    if ctx.attr("is_sparse", False):
        rows = hsigmoid_rows(ctx)
        ctx.set_output("W@GRAD", SelectedRows(rows, dw[tensor(rows)], int(w.shape[0])))
    else:
        put(ctx, "W@GRAD", dw)


# -- top_k and accuracy -------------------------------------------------------------------------
@kernel("top_k")
def top_k(ctx: KernelContext) -> None:
    x = input_t(ctx, "X")
    k = top_k_of(ctx, x.shape[-1])
    values, order = torch.sort(x, dim=-1, descending=True, stable=True)
    lod = ctx.lod("X")
    put(ctx, "Out", values[..., :k].contiguous(), lod=lod)
    ctx.set_output("Indices", np.ascontiguousarray(host(order[..., :k]), np.int64), lod=lod)


kernel("accuracy")(on_host(numpy_nn.accuracy))
