"""Small helpers shared by the kernel modules: value helpers for numpy, and the attribute and
LoD readers that the numpy and torch kernels of the same op share."""

from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np

from runtime.execution.kernels.context import KernelContext
from runtime.execution.tensor import SelectedRows


def out_grad(ctx: KernelContext, like: np.ndarray, slot: str = "Out@GRAD") -> np.ndarray:
    """The gradient flowing into an output; a missing one means zero."""
    g = ctx.input(slot)
    return np.zeros_like(like) if g is None else g


def scalar(value: np.ndarray) -> Any:
    """The single element of a [1]-shaped array, as a numpy scalar (keeps its dtype)."""
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"expected a single element, got shape {np.shape(value)}")
    return flat[0]


def check_height(value: SelectedRows, rows: int, what: str, of: str = "") -> None:
    """A `ValueError` naming input `what` unless the SelectedRows `value` has `rows` as its
    height (the rows of input `of`, where given)."""
    if value.height != rows:
        raise ValueError(f"{what}: SelectedRows height {value.height} != {rows} rows"
                         + (f" of {of}" if of else ""))


def dense_like(value: np.ndarray | SelectedRows, rows: int, what: str) -> np.ndarray:
    """`value` as a dense array; a SelectedRows must have `rows` as its height."""
    if isinstance(value, SelectedRows):
        check_height(value, rows, what)
        return value.to_dense()
    return value


__all__ = ["check_height", "dense_like", "out_grad", "scalar"]


Array = np.ndarray


def axis_of(axis: int, rank: int, op: str) -> int:
    """`axis` counted from 0 in a rank-`rank` input (negative from the end)."""
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis {axis} outside a rank-{rank} input")
    return axis % rank


def reduce_axes(ctx: KernelContext, rank: int) -> tuple[tuple[int, ...], bool]:
    """fluid's ``reduce_sum``/``reduce_mean`` attributes: the axes reduced (every axis with
    ``reduce_all``, else ``dim``, negative counting from the end) and ``keep_dim``."""
    if ctx.attr("reduce_all", False):
        axes: tuple[int, ...] = tuple(range(rank))
    else:
        dims = ctx.attr("dim", [0])
        dims = [dims] if isinstance(dims, int) else list(dims)
        axes = tuple(sorted({axis_of(int(d), rank, ctx.op.type) for d in dims}))
    return axes, bool(ctx.attr("keep_dim", False))


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keep_dim: bool) -> tuple[int, ...]:
    """The reduced axes made 1 (`keep_dim`) or dropped; nothing left gives [1], as in fluid."""
    if keep_dim:
        return tuple(1 if i in axes else int(d) for i, d in enumerate(shape))
    return tuple(int(d) for i, d in enumerate(shape) if i not in axes) or (1,)


def batch_size_like_shape(ctx: KernelContext, input_shape: Sequence[int],
                          lod: Sequence[Sequence[int]] = ()) -> tuple[int, ...]:
    """``fill_constant_batch_size_like``: the ``shape`` attribute with dim ``output_dim_idx``
    set to the input's dim ``input_dim_idx``; for dim 0 of an input with LoD, its number of
    sequences (the last level's), as fluid does."""
    shape = [int(d) for d in ctx.attr("shape", ())]
    i, o = int(ctx.attr("input_dim_idx", 0)), int(ctx.attr("output_dim_idx", 0))
    if not 0 <= i < len(input_shape):
        raise ValueError(f"{ctx.op.type}: input_dim_idx {i} outside the rank-"
                         f"{len(input_shape)} input")
    if not 0 <= o < len(shape):
        raise ValueError(f"{ctx.op.type}: output_dim_idx {o} outside shape {shape}")
    shape[o] = len(lod[-1]) - 1 if lod and i == 0 else int(input_shape[i])
    if any(d < 0 for d in shape):
        raise ValueError(f"{ctx.op.type}: shape {shape} must be known but for output_dim_idx")
    return tuple(shape)


def hsigmoid_code_length(num_classes: int) -> int:
    """Columns of PreOut with fluid's default tree: the bit length of num_classes - 1."""
    return max(int(num_classes) - 1, 0).bit_length()


def hsigmoid_codes(ctx: KernelContext, label: Array, rows: int) -> tuple[Array, Array, Array]:
    """Each row's path in ``hierarchical_sigmoid``'s tree: the W/Bias row of each node
    (``index``, 0 past the path), whether the path turns right there (``bit``, 0/1), and which
    columns are on the path (``valid``), all [rows, code length].

    With PathTable and PathCode (a custom tree) they are those, a path ending at its first
    negative id. Otherwise fluid's default tree: class c is coded ``k = c + num_classes``; its
    path has ``bit_length(k) - 1`` nodes, node j at row ``(k >> (j + 1)) - 1`` with bit
    ``(k >> j) & 1``."""
    table = ctx.input("PathTable")
    if table is not None:
        index = np.asarray(table, np.int64).reshape(rows, -1)
        code = np.asarray(ctx.input("PathCode"), np.int64).reshape(index.shape)
        valid = np.cumprod(index >= 0, axis=1).astype(bool)
        return np.where(valid, index, 0), np.where(valid, code, 0), valid
    num_classes = int(ctx.attr("num_classes"))
    k = np.asarray(label, np.int64).reshape(rows) + num_classes
    if k.size and (k.min() < num_classes or k.max() >= 2 * num_classes):
        raise ValueError(f"hierarchical_sigmoid: Label holds a class outside 0..{num_classes - 1}")
    j = np.arange(hsigmoid_code_length(num_classes))
    lengths = np.array([int(c).bit_length() - 1 for c in k], np.int64).reshape(rows, 1)
    valid = j[None, :] < lengths
    index = np.where(valid, (k[:, None] >> (j[None, :] + 1)) - 1, 0)
    return index, np.where(valid, (k[:, None] >> j[None, :]) & 1, 0), valid


def hsigmoid_rows(ctx: KernelContext) -> Array:
    """The W rows a sparse ``hierarchical_sigmoid_grad`` writes: every id of PathTable that is
    not negative, once, sorted (as fluid's)."""
    table = np.asarray(ctx.input("PathTable"), np.int64).reshape(-1)
    return np.unique(table[table >= 0])


def mul_dims(ctx: KernelContext) -> tuple[int, int]:
    return int(ctx.attr("x_num_col_dims", 1)), int(ctx.attr("y_num_col_dims", 1))


def hard_labels(label: Array, rows: int, ignored: int) -> tuple[Array, Array]:
    """Class ids per row (ignored rows point at class 0) and the mask of rows that count. The
    ids may be a view of `label` (int64 labels, none ignored): callers only read them."""
    ids = label.reshape(-1).astype(np.int64, copy=False)
    if ids.shape[0] != rows:
        raise ValueError(f"Label holds {ids.shape[0]} ids for {rows} rows")
    keep = ids != ignored
    return (ids if keep.all() else np.where(keep, ids, 0)), keep


def soft_label(ctx: KernelContext) -> bool:
    return bool(ctx.attr("soft_label", False))


def ignore_index(ctx: KernelContext) -> int:
    return int(ctx.attr("ignore_index", -100))


def lookup_ids(ctx: KernelContext, vocab: int, given: Array | None = None) -> Array:
    """The Ids input (or the `given` host copy of it) as flat int64 ids, checked against the
    table's `vocab` rows."""
    ids = (ctx.input("Ids") if given is None else given).reshape(-1).astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise IndexError(f"Ids {ids.min()}..{ids.max()} outside the table's {vocab} rows")
    return ids


LOOKUP_V2 = "lookup_table_v2"


def lookup_lead(ids_shape: tuple[int, ...], version: str = "lookup_table") -> tuple[int, ...]:
    """The leading dims of a lookup's Out for ids shaped `ids_shape`: `lookup_table` drops the
    ids' trailing 1 ([N, 1] -> [N, D]); `lookup_table_v2` keeps every dim ([N] -> [N, D],
    [N, L] -> [N, L, D])."""
    if version != LOOKUP_V2 and len(ids_shape) > 1 and ids_shape[-1] == 1:
        return tuple(ids_shape[:-1])
    return tuple(ids_shape)


def lookup_version(ctx: KernelContext) -> str:
    """Which lookup's shape an op that stands in for one gives (``lookup_table_version``, as
    Paddle's `distributed_lookup_table` says it)."""
    return str(ctx.attr("lookup_table_version", "lookup_table") or "lookup_table")


def padding_idx(ctx: KernelContext) -> int:
    pad = ctx.attr("padding_idx", -1)
    return -1 if pad is None else int(pad)


class Segments:
    """The last LoD level of X as start offsets, lengths and a row -> sequence map."""

    def __init__(self, ctx: KernelContext, rows: int) -> None:
        lod = ctx.lod("X")
        if not lod:
            raise ValueError(f"input X {ctx.input_names('X')[0]!r} has no LoD")
        offsets = np.asarray(lod[-1], dtype=np.int64)
        if offsets[-1] != rows:
            raise ValueError(f"LoD {lod[-1]} does not cover the {rows} rows of X")
        self.outer_lod = lod[:-1]
        self.starts, self.ends = offsets[:-1], offsets[1:]
        self.lengths = self.ends - self.starts
        self.count = self.lengths.shape[0]
        self.nonempty = self.lengths > 0
        self.row_seq = np.repeat(np.arange(self.count), self.lengths)


def context_attrs(ctx: KernelContext) -> tuple[int, int]:
    """``sequence_conv``'s ``contextLength`` and ``contextStart``; fluid's op supports only
    ``contextStride`` 1, and pslab pads with zeros only (``paddingTrainable`` false)."""
    length = int(ctx.attr("contextLength", 0))
    if length < 1:
        raise ValueError(f"sequence_conv: contextLength {length} must be at least 1")
    if int(ctx.attr("contextStride", 1)) != 1:
        raise ValueError("sequence_conv: contextStride must be 1 (fluid's op supports no other)")
    if ctx.attr("paddingTrainable", False):
        raise ValueError("sequence_conv: paddingTrainable is not supported; the window pads "
                         "with zeros")
    return length, int(ctx.attr("contextStart", 0))


def context_index(ctx: KernelContext, rows: int, width: int, filter_rows: int) -> Array:
    """The rows of X each row's ``sequence_conv`` window reads, int64 ``[rows,
    contextLength]``: row t of a sequence [s, e) (X's last LoD level) reads t + contextStart + j
    for j < contextLength, and `rows` (one past X: a row of zeros) where that leaves [s, e).
    `width`: X's row width, which times contextLength must be Filter's `filter_rows`."""
    length, start = context_attrs(ctx)
    if filter_rows != length * width:
        raise ValueError(f"sequence_conv: Filter has {filter_rows} rows, not contextLength "
                         f"{length} x X's width {width}")
    seg = Segments(ctx, rows)
    src = np.arange(rows, dtype=np.int64)[:, None] + start + np.arange(length)[None, :]
    inside = (src >= seg.starts[seg.row_seq][:, None]) & (src < seg.ends[seg.row_seq][:, None])
    return np.where(inside, src, rows)


def pool_scale(kind: str, lengths: Array, dtype: np.dtype) -> Array:
    """Per-sequence factor of SUM-like pools: 1, 1/len (AVERAGE) or 1/sqrt(len) (SQRT)."""
    n = np.maximum(lengths, 1).astype(dtype)
    return {"SUM": np.ones_like(n), "AVERAGE": 1 / n, "SQRT": 1 / np.sqrt(n)}[kind]


def dropout_prob(ctx: KernelContext) -> tuple[float, bool]:
    """dropout's ``dropout_prob`` and whether it scales in training (``upscale_in_train``) rather
    than at inference (``downgrade_in_infer``, Paddle's default)."""
    p = float(ctx.attr("dropout_prob", 0.5))
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: dropout_prob {p} outside [0, 1]")
    impl = str(ctx.attr("dropout_implementation", "downgrade_in_infer"))
    if impl not in ("downgrade_in_infer", "upscale_in_train"):
        raise ValueError(f"dropout: dropout_implementation {impl!r} is not downgrade_in_infer "
                         "or upscale_in_train")
    return p, impl == "upscale_in_train"


def dropout_mask(ctx: KernelContext, x: Array) -> Array:
    """The uint8 keep-mask of a training dropout over `x`, drawn on the host for both backends.

    DESIGN: kernels keep no state between runs, so the stream cannot advance from step to step.
    With ``fix_seed`` it is seeded by the ``seed`` attribute alone (the same mask every run, as
    in Paddle); otherwise by the program's random seed and a CRC of X's bytes, so each batch gets
    its own mask and a rerun (or the other backend) the same one."""
    p, _ = dropout_prob(ctx)
    if ctx.attr("fix_seed", False):
        key = [int(ctx.attr("seed", 0))]
    else:
        key = [ctx.random_seed, zlib.crc32(np.ascontiguousarray(x).tobytes())]
    return (np.random.default_rng(key).random(x.shape) >= p).astype(np.uint8)


def dropout_factor(ctx: KernelContext, x: Array) -> tuple[Array | None, float]:
    """What dropout (and its grad, for Out@GRAD) multiplies X by: the keep-mask (None at
    inference) times a scale: 1/(1 - p) in training with ``upscale_in_train`` (else 1), 1 - p
    at inference with ``downgrade_in_infer`` (else 1). The forward op also stores its Mask."""
    p, upscale = dropout_prob(ctx)
    if ctx.attr("is_test", False):
        return None, 1.0 if upscale else 1.0 - p
    mask = ctx.input("Mask") if ctx.op.type.endswith("_grad") else dropout_mask(ctx, x)
    if ctx.op.type == "dropout":
        ctx.set_output("Mask", mask)
    return mask, (0.0 if p == 1.0 else 1.0 / (1.0 - p)) if upscale else 1.0
