"""Attribute readers and output-shape arithmetic of the image and tensor-shaping ops (`conv2d`,
`pool2d`, `matmul`, `slice`, `squeeze2`, ...), shared by their numpy and torch kernels and by the
phantom backend, so that all three agree on every shape by construction.

Attributes follow Paddle: paddings are ``[ph, pw]`` or ``[top, bottom, left, right]``, ``ksize``,
``strides`` and ``dilations`` are ``[h, w]``, images are NCHW (other layouts are refused, naming
the attribute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from runtime.execution.kernels.common import axis_of
from runtime.execution.kernels.context import KernelContext
from runtime.execution.tensor import LoD
from runtime.execution.kernels.numpy_math import reshape_target
from transpiler.ir import keeps_rows

Shape = tuple[int, ...]


def _pair(value: Any, what: str) -> tuple[int, int]:
    items = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(items) != 2:
        raise ValueError(f"{what} must hold 2 values [h, w], got {value!r}")
    return int(items[0]), int(items[1])


def _paddings(value: Any) -> tuple[int, int, int, int]:
    """[top, bottom, left, right] from Paddle's [ph, pw] or [t, b, l, r]."""
    items = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * 2
    if len(items) == 2:
        return items[0], items[0], items[1], items[1]
    if len(items) == 4:
        return items[0], items[1], items[2], items[3]
    raise ValueError(f"paddings must be [ph, pw] or [top, bottom, left, right], got {value!r}")


def _nchw(ctx: KernelContext, attr: str) -> None:
    layout = str(ctx.attr(attr, "NCHW"))
    if layout not in ("NCHW", "AnyLayout"):
        raise ValueError(f"{ctx.op.type}: {attr} {layout!r} is not supported; only NCHW")


@dataclass(frozen=True)
class Window:
    """A sliding window over the H and W of an NCHW image: kernel size, strides, dilations,
    paddings (top, bottom, left, right), and the output's height and width."""

    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]
    out: tuple[int, int]

    @property
    def span(self) -> tuple[int, int]:
        """Input rows and columns one window covers (dilated kernel)."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))  # type: ignore[return-value]


def _window(op: str, hw: Sequence[int], kernel: tuple[int, int], strides: tuple[int, int],
            dilations: tuple[int, int], pads: tuple[int, int, int, int]) -> Window:
    t, b, l, r = pads
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    out = tuple((n + p0 + p1 - s) // st + 1
                for n, (p0, p1), s, st in zip(hw, ((t, b), (l, r)), spans, strides))
    if min(strides) < 1 or min(dilations) < 1 or min(kernel) < 1:
        raise ValueError(f"{op}: kernel {kernel}, strides {strides} and dilations {dilations} "
                         "must be positive")
    if min(out) < 1:
        raise ValueError(f"{op}: window {kernel} (dilations {dilations}) does not fit the "
                         f"{tuple(hw)} image padded by {pads}")
    return Window(kernel, strides, dilations, pads, out)  # type: ignore[arg-type]


def conv_window(ctx: KernelContext, x: Shape, w: Shape) -> Window:
    """conv2d's window over Input `x` [N, C, H, W] with Filter `w` [F, C/groups, KH, KW]."""
    _nchw(ctx, "data_format")
    if str(ctx.attr("padding_algorithm", "EXPLICIT")) != "EXPLICIT":
        raise ValueError(f"conv2d: padding_algorithm {ctx.attr('padding_algorithm')!r} is not "
                         "supported; only EXPLICIT")
    groups = int(ctx.attr("groups", 1) or 1)
    if len(x) != 4 or len(w) != 4:
        raise ValueError(f"conv2d: Input {list(x)} and Filter {list(w)} must be 4-D (NCHW)")
    if x[1] != w[1] * groups or w[0] % groups:
        raise ValueError(f"conv2d: Input has {x[1]} channels, Filter {list(w)} with groups "
                         f"{groups} wants {w[1] * groups} and a filter count divisible by groups")
    return _window("conv2d", x[2:], (w[2], w[3]), _pair(ctx.attr("strides", [1, 1]), "strides"),
                   _pair(ctx.attr("dilations", [1, 1]), "dilations"),
                   _paddings(ctx.attr("paddings", [0, 0])))


def conv_out_shape(ctx: KernelContext, x: Shape, w: Shape) -> Shape:
    win = conv_window(ctx, x, w)
    return (x[0], w[0]) + win.out


def pool_window(ctx: KernelContext, x: Shape) -> Window:
    """pool2d's window over X [N, C, H, W]: the whole image with ``global_pooling``."""
    _nchw(ctx, "data_format")
    if len(x) != 4:
        raise ValueError(f"pool2d: X {list(x)} must be 4-D (NCHW)")
    if ctx.attr("adaptive", False) or ctx.attr("ceil_mode", False):
        raise ValueError("pool2d: adaptive and ceil_mode pooling are not supported")
    if ctx.attr("global_pooling", False):
        return _window("pool2d", x[2:], (x[2], x[3]), (1, 1), (1, 1), (0, 0, 0, 0))
    return _window("pool2d", x[2:], _pair(ctx.attr("ksize"), "ksize"),
                   _pair(ctx.attr("strides", [1, 1]), "strides"), (1, 1),
                   _paddings(ctx.attr("paddings", [0, 0])))


def pool_kind(ctx: KernelContext) -> str:
    kind = str(ctx.attr("pooling_type", "max"))
    if kind not in ("max", "avg"):
        raise ValueError(f"pool2d: pooling_type {kind!r} is not 'max' or 'avg'")
    return kind


def norm_split(shape: Shape, axis: int) -> tuple[int, int]:
    """layer_norm's [left, right] flattening of X at `begin_norm_axis`."""
    if not 1 <= axis < len(shape) + (len(shape) == 1):
        raise ValueError(f"layer_norm: begin_norm_axis {axis} outside 1..{len(shape) - 1}")
    return math.prod(shape[:axis]), math.prod(shape[axis:])


# -- matmul ---------------------------------------------------------------------------------------
def matmul_flags(ctx: KernelContext) -> tuple[bool, bool, float]:
    """(transpose X, transpose Y, alpha) of `matmul` (transpose_X/Y, alpha) or `matmul_v2`."""
    if ctx.op.type.startswith("matmul_v2"):
        return bool(ctx.attr("trans_x", False)), bool(ctx.attr("trans_y", False)), 1.0
    return (bool(ctx.attr("transpose_X", False)), bool(ctx.attr("transpose_Y", False)),
            float(ctx.attr("alpha", 1.0)))


def matmul_shape(x: Shape, y: Shape, tx: bool, ty: bool) -> Shape:
    """numpy's matmul shape after the transposes (a 1-D operand is a vector, not transposed)."""
    xs = list(x) if len(x) < 2 or not tx else list(x[:-2]) + [x[-1], x[-2]]
    ys = list(y) if len(y) < 2 or not ty else list(y[:-2]) + [y[-1], y[-2]]
    xk = xs[-1]
    yk = ys[0] if len(ys) == 1 else ys[-2]
    if xk != yk:
        raise ValueError(f"matmul: X {list(x)} and Y {list(y)} (transposed {tx}, {ty}) do not "
                         "share the contracted dim")
    batch = _broadcast(xs[:-2], ys[:-2])
    rows = [xs[-2]] if len(xs) > 1 else []
    cols = [ys[-1]] if len(ys) > 1 else []
    return tuple(batch + rows + cols)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> list[int]:
    out = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da != db and 1 not in (da, db):
            raise ValueError(f"matmul: batch dims {list(a)} and {list(b)} do not broadcast")
        out.append(max(da, db))
    return out[::-1]


# -- shaping ops ----------------------------------------------------------------------------------
def squeeze_shape(shape: Shape, axes: Sequence[int]) -> Shape:
    """squeeze2: drop the size-1 dims in `axes` (all size-1 dims when empty); others stay."""
    rank = len(shape)
    picked = {axis_of(int(a), rank, "squeeze2") for a in axes} if axes else \
        {i for i, d in enumerate(shape) if d == 1}
    return tuple(d for i, d in enumerate(shape) if not (i in picked and d == 1))


def unsqueeze_shape(shape: Shape, axes: Sequence[int]) -> Shape:
    """unsqueeze2: insert a 1 at each of `axes`, in order, each against the shape so far."""
    out = list(shape)
    for a in axes:
        a = int(a)
        pos = a + len(out) + 1 if a < 0 else a
        if not 0 <= pos <= len(out):
            raise ValueError(f"unsqueeze2: axis {a} outside a rank-{len(out)} shape")
        out.insert(pos, 1)
    return tuple(out)


def transpose_perm(ctx: KernelContext, rank: int) -> list[int]:
    perm = [int(a) for a in ctx.attr("axis")]
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"transpose2: axis {perm} is not a permutation of the {rank} dims")
    return perm


def slice_bounds(ctx: KernelContext, shape: Shape) -> tuple[tuple[slice, ...], Shape]:
    """slice: the index of ``axes``/``starts``/``ends`` (clamped as Python slices are) and the
    output shape, with the ``decrease_axis`` dims (each of size 1) dropped."""
    axes, starts, ends = (list(ctx.attr(k)) for k in ("axes", "starts", "ends"))
    if not len(axes) == len(starts) == len(ends):
        raise ValueError(f"slice: axes {axes}, starts {starts} and ends {ends} differ in length")
    index = [slice(None)] * len(shape)
    for a, s, e in zip(axes, starts, ends):
        index[axis_of(int(a), len(shape), "slice")] = slice(int(s), int(e))
    dims = [len(range(*sl.indices(n))) for sl, n in zip(index, shape)]
    drop = {axis_of(int(a), len(shape), "slice") for a in ctx.attr("decrease_axis", []) or []}
    for a in drop:
        if dims[a] != 1:
            raise ValueError(f"slice: decrease_axis {a} has {dims[a]} elements, not 1")
    out = tuple(d for i, d in enumerate(dims) if i not in drop)
    return tuple(index), out


def split_sizes(ctx: KernelContext, shape: Shape) -> tuple[int, list[int]]:
    """split: the axis and each output's extent along it (``sections``, one -1 inferred, or
    ``num`` equal parts)."""
    axis = axis_of(int(ctx.attr("axis", 0)), len(shape), "split")
    total = shape[axis]
    sections = [int(s) for s in ctx.attr("sections", []) or []]
    if sections:
        if sections.count(-1) > 1:
            raise ValueError(f"split: sections {sections} have more than one -1")
        if -1 in sections:
            sections[sections.index(-1)] = total - (sum(sections) + 1)
        if sum(sections) != total or min(sections) < 0:
            raise ValueError(f"split: sections {sections} do not cover the {total} of axis {axis}")
        return axis, sections
    num = int(ctx.attr("num", 0))
    if num < 1 or total % num:
        raise ValueError(f"split: num {num} does not divide the {total} of axis {axis}")
    return axis, [total // num] * num


def reshaped(ctx: KernelContext, shape: Shape) -> Shape:
    """Out's shape of `reshape2`, `squeeze2` or `unsqueeze2` (the op `ctx` runs) on X of `shape`."""
    kind = ctx.op.type.removesuffix("_grad")
    if kind == "reshape2":
        return reshape_target(list(ctx.attr("shape")), shape)
    if kind == "squeeze2":
        return squeeze_shape(shape, list(ctx.attr("axes", []) or []))
    return unsqueeze_shape(shape, list(ctx.attr("axes")))


def shared_lod(ctx: KernelContext, x_shape: Sequence[int], shape: Sequence[int]) -> LoD:
    """What `reshape2`, `squeeze2` and `unsqueeze2` pass on of X's LoD to Out of `shape`: all
    of it where the first dim stays X's (`keeps_rows`), else none (fluid's InferShape shares it
    so)."""
    return ctx.lod("X") if keeps_rows(x_shape, shape) else []


def xshape(shape: Shape) -> Shape:
    """The XShape output of reshape2, transpose2, squeeze2, unsqueeze2: [0] + X's shape, an
    empty tensor that carries X's shape to the gradient."""
    return (0,) + tuple(shape)


__all__ = ["Window", "axis_of", "conv_out_shape", "conv_window", "keeps_rows", "matmul_flags",
           "matmul_shape", "norm_split", "pool_kind", "pool_window", "reshaped", "shared_lod",
           "slice_bounds", "split_sizes", "squeeze_shape", "transpose_perm", "unsqueeze_shape",
           "xshape"]
