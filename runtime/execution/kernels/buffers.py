"""Writing a numpy kernel's output into an array the scope already holds, where nobody can see it.

The scope's rule is that a stored array is never written: a kernel stores a new array, so that
whoever holds the old one (a frame being sent, a view a receiver decoded, a fetched result, a
kept backup) keeps what it saw. For large values that rule costs a fresh allocation each step:
a 16 MB parameter reassembled by `concat`, a pserver's summed gradient, its `scale` and its
`sgd` update. A fresh block of that size comes from the kernel as untouched pages, and the
first write of each page faults, which on the development machine made these ops 2 to 5 times
slower in a job than the same numpy call in a loop.

So a kernel may write into an array the scope holds where nobody else can see the write: the
array owns its memory, is writable and C-contiguous, and CPython's reference count says nothing
but the scope holds it (against a baseline measured the same way at import). Anything that
holds the array, or a view of it (a view keeps its base alive), raises the count, and the kernel
then allocates as before. Two forms:

- `writable_input`: the op's output is its input var itself (a pserver's in-place ``scale``,
  ``sgd``'s ``ParamOut = Param``), and the input's array is exclusive: the kernel may compute in
  place.
- `output_buffer`: the output var's array from the op's last run, of the same shape and dtype,
  exclusive, and not an input of this op: the kernel may compute into it (``out=``).

Neither changes a number: the same numpy operations run in the same order, into other memory.
Values under `MIN_BYTES` are left to numpy's allocator, whose small blocks are reused anyway.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from runtime.execution.kernels.context import KernelContext

__all__ = ["MIN_BYTES", "exclusive", "output_buffer", "writable_input"]

Array = np.ndarray

MIN_BYTES = 1 << 16
"""Outputs smaller than this are allocated afresh: numpy's and malloc's small blocks are
reused without faults, and the check would cost more than it saves."""


def _refs(array: Any) -> int:
    return sys.getrefcount(array)


def _baseline_refs() -> int:
    """References to an array held by a scope only, counted as `exclusive` counts them."""
    scope = {"var": np.zeros(1)}
    array = scope["var"]
    return _refs(array)


_SCOPE_ONLY = _baseline_refs()


def exclusive(array: Any) -> bool:
    """Whether `array`, just read from a scope by the caller (one reference, the caller's own,
    besides the scope's), may be written in place: an ndarray that owns writable, C-contiguous
    memory and that nothing else holds."""
    return bool(type(array) is np.ndarray and array.flags.owndata and array.flags.writeable
                and array.flags.c_contiguous and _refs(array) <= _SCOPE_ONLY + 1)


def writable_input(ctx: KernelContext, in_slot: str, out_slot: str) -> Array | None:
    """Input `in_slot`'s own array, to be computed into in place, when output `out_slot` is the
    same var and the array is `exclusive`; else None. Call it before reading the input any other
    way: a reference the kernel holds counts as someone else's."""
    name = ctx.input_names(in_slot)[:1]
    if not name or name != ctx.op.outputs.get(out_slot, [])[:1]:
        return None
    array = ctx.scope.find(name[0])
    if not exclusive(array) or array.nbytes < MIN_BYTES:
        return None
    return array  # type: ignore[no-any-return]


def output_buffer(ctx: KernelContext, slot: str, shape: tuple[int, ...],
                  dtype: np.dtype[Any]) -> Array | None:
    """The array output `slot`'s var holds from the op's last run, to be computed into
    (``out=``), when it has `shape` and `dtype`, is `exclusive` and the var is no input of the
    op; else None."""
    names = ctx.op.outputs.get(slot)
    if not names or any(names[0] in inputs for inputs in ctx.op.inputs.values()):
        return None
    array = ctx.scope.find(names[0])
    if type(array) is not np.ndarray or array.shape != tuple(shape) or array.dtype != dtype \
            or array.nbytes < MIN_BYTES or not exclusive(array):
        return None
    return array
