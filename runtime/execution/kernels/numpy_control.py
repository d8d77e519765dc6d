"""Initializers and control ops: `fill_constant`, `fill_constant_batch_size_like`,
`assign_value`, `increment`, the random initializers and `conditional_block`.

Random initializers are deterministic across processes: with a non-zero `seed` attribute that
seed is used, otherwise the seed is ``crc32(f"{program.random_seed}:{output var name}")``, so a
trainer and a pserver (or a rerun) draw the same values for the same var.
"""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np

from runtime.execution.kernels.common import batch_size_like_shape, scalar
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.registry import register
from transpiler.initializer import VALUE_ATTRS

Array = np.ndarray


def _shape(ctx: KernelContext) -> tuple[int, ...]:
    shape = tuple(int(d) for d in ctx.attr("shape", ()))
    if any(d < 0 for d in shape):
        raise ValueError(f"shape {list(shape)} must be fully known (no -1)")
    return shape


def _dtype(ctx: KernelContext) -> np.dtype:
    return np.dtype(ctx.attr("dtype", "float32"))


@register("fill_constant")
def fill_constant(ctx: KernelContext) -> None:
    ctx.set_output("Out", np.full(_shape(ctx), ctx.attr("value", 0.0), dtype=_dtype(ctx)))


@register("fill_constant_batch_size_like")
def fill_constant_batch_size_like(ctx: KernelContext) -> None:
    """fluid's op: ``value`` in the ``shape`` attribute with one dim taken from Input's batch
    (`common.batch_size_like_shape`)."""
    shape = batch_size_like_shape(ctx, np.shape(ctx.input("Input")), ctx.lod("Input"))
    ctx.set_output("Out", np.full(shape, ctx.attr("value", 0.0), dtype=_dtype(ctx)))


@register("increment")
def increment(ctx: KernelContext) -> None:
    x = ctx.input("X")
    ctx.set_output("Out", x + np.asarray(ctx.attr("step", 1.0)).astype(x.dtype))


def seed_for(ctx: KernelContext) -> int:
    seed = int(ctx.attr("seed", 0))
    if seed:
        return seed
    name = ctx.attr("origin_name") or ctx.output_names("Out")[0]
    return zlib.crc32(f"{ctx.random_seed}:{name}".encode())


def _rng(ctx: KernelContext) -> np.random.Generator:
    return np.random.default_rng(seed_for(ctx))


def _draw(ctx: KernelContext, draw: Callable[[np.random.Generator, tuple[int, ...]], Array]) -> None:
    """Draw the op's output; a slice of a var (``origin_name``) draws the whole var's values
    and keeps its rows, so it equals the unsliced draw. Rows of a slice past the var's last row
    (the last shard of a distributed table, which has as many rows as the others) are zeros:
    no id reaches them."""
    shape = _shape(ctx)
    if ctx.attr("origin_name") is None:
        ctx.set_output("Out", draw(_rng(ctx), shape).astype(_dtype(ctx)))
        return
    full = draw(_rng(ctx), (int(ctx.attr("origin_shape")[0]),) + shape[1:])
    ctx.set_output("Out", _rows(ctx, full, shape).astype(_dtype(ctx)))


def _rows(ctx: KernelContext, full: Array, shape: tuple[int, ...]) -> Array:
    """The `shape[0]` rows of the whole var `full` from ``row_offset`` on, zeros past its end."""
    offset = int(ctx.attr("row_offset", 0))
    rows = full[offset:offset + shape[0]]
    past_end = np.zeros((shape[0] - rows.shape[0],) + shape[1:], dtype=full.dtype)
    return np.concatenate([rows, past_end])


@register("assign_value")
def assign_value(ctx: KernelContext) -> None:
    """Out from the values the op carries, row-major in the attribute of its dtype; a slice of
    a var (``origin_name``) keeps its rows of the whole var's values, as a random draw does."""
    dtype, shape = _dtype(ctx), _shape(ctx)
    values = np.asarray(ctx.attr(VALUE_ATTRS[dtype.name]), dtype=dtype)
    if ctx.attr("origin_name") is None:
        ctx.set_output("Out", values.reshape(shape))
        return
    full = values.reshape(tuple(int(d) for d in ctx.attr("origin_shape")))
    ctx.set_output("Out", _rows(ctx, full, shape))


@register("uniform_random")
def uniform_random(ctx: KernelContext) -> None:
    low, high = float(ctx.attr("min", -1.0)), float(ctx.attr("max", 1.0))
    _draw(ctx, lambda rng, shape: rng.uniform(low, high, shape))


@register("gaussian_random")
def gaussian_random(ctx: KernelContext) -> None:
    mean, std = float(ctx.attr("mean", 0.0)), float(ctx.attr("std", 1.0))
    _draw(ctx, lambda rng, shape: rng.normal(mean, std, shape))


@register("truncated_gaussian_random")
def truncated_gaussian_random(ctx: KernelContext) -> None:
    """Standard normal draws outside two standard deviations are drawn again."""
    mean, std = float(ctx.attr("mean", 0.0)), float(ctx.attr("std", 1.0))

    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> Array:
        z = rng.standard_normal(shape)
        outside = np.abs(z) > 2
        while outside.any():
            z[outside] = rng.standard_normal(int(outside.sum()))
            outside = np.abs(z) > 2
        return mean + std * z

    _draw(ctx, draw)


@register("conditional_block")
def conditional_block(ctx: KernelContext) -> None:
    """Run `sub_block` on the same scope when the condition holds: the one-element Cond when
    `is_scalar_condition`, else when every Cond tensor is non-empty (Paddle's rule)."""
    conds = ctx.inputs("Cond")
    if ctx.attr("is_scalar_condition", False):
        holds = bool(scalar(conds[0]))
    else:
        holds = all(np.asarray(c).size > 0 for c in conds)
    if holds:
        ctx.run_block(ctx.attr("sub_block").idx)
