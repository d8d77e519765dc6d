"""Slicing: how a var is cut into row blocks for the pservers (docs/transpiler.md §4).

A var of N elements is cut into at most `slice_count` blocks of at least `min_block_size`
elements; for rank >= 2 the block size is rounded up to whole rows, so every block is a run of
rows of the var. `slice_variable` returns `VarBlock`s, written ``name:index:size`` like the
original; `slice_shapes` turns them into the blocks' shapes and first rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence


class Shaped(Protocol):
    name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class VarBlock:
    """Block `offset` (its index) of var `varname`, holding `size` elements."""

    varname: str
    offset: int
    size: int

    def __str__(self) -> str:
        return f"{self.varname}:{self.offset}:{self.size}"


def row_width(shape: Sequence[int]) -> int:
    """Elements per row: the product of the dims after the first (1 for rank <= 1)."""
    return math.prod(shape[1:]) if len(shape) >= 2 else 1


def _numel(var: Shaped) -> int:
    if any(d <= 0 for d in var.shape):
        raise ValueError(f"slice_variable: var {var.name!r} has shape {tuple(var.shape)}; "
                         "only vars of a known, non-empty shape can be sliced")
    return math.prod(var.shape)


def _blocks_of(var: Shaped, slice_count: int, min_block_size: int) -> list[VarBlock]:
    numel = _numel(var)
    split = min(slice_count, max(numel // min_block_size, 1))
    block_size = math.ceil(numel / split)
    width = row_width(var.shape)
    if len(var.shape) >= 2 and block_size % width:
        block_size += width - block_size % width
    count = math.ceil(numel / block_size)
    return [VarBlock(var.name, i, min(block_size, numel - i * block_size)) for i in range(count)]


def slice_variable(var_list: Sequence[Shaped], slice_count: int,
                   min_block_size: int) -> list[VarBlock]:
    """The blocks of every var of `var_list`, in order (docs/transpiler.md §4)."""
    if slice_count < 1:
        raise ValueError(f"slice_variable: slice_count must be >= 1, got {slice_count}")
    if min_block_size < 1:
        raise ValueError(f"slice_variable: min_block_size must be >= 1, got {min_block_size}")
    return [b for var in var_list for b in _blocks_of(var, slice_count, min_block_size)]


def slice_shapes(shape: Sequence[int], blocks: Sequence[VarBlock]) -> list[tuple[tuple[int, ...], int]]:
    """(shape, first row) of each block of a var of `shape`; one block keeps the whole shape."""
    if len(blocks) == 1:
        return [(tuple(shape), 0)]
    width = row_width(shape)
    out, row = [], 0
    for block in blocks:
        rows = block.size // width
        out.append(((rows,) + tuple(shape[1:]), row))
        row += rows
    return out
