"""Writing a torch kernel's output into a tensor the scope already holds, where nobody can see it
(`buffers` does the same for numpy's).

A scope's value is never written: a kernel stores a new tensor. For large values a new tensor
each step costs a fresh allocation, whose untouched pages fault on first write, and a second
pass over memory: a pserver's summed gradient and its `scale`, its `sgd` update, a trainer's
parameter reassembled by `concat`. So a kernel may compute into a tensor the scope holds where
nobody else can see the write. A tensor qualifies when it is the scope's stored value on the
kernel's device, contiguous and no view, referenced by nothing but the scope (CPython's
reference count, against a baseline measured at import), and alone on memory a torch kernel
allocated: it is registered here (`own`: a tensor made from a numpy array views the array's
memory, which others may hold, and torch cannot tell) and no other tensor shares its storage (a
view, or the numpy view `Scope.get` hands the wire: torch's storage use count). Where torch
cannot count storage users nothing is written in place.

Two forms, as numpy's, for values of `MIN_BYTES` or more: `writable_input` (the output is the
input var itself) and `output_buffer` (the output var's tensor from the op's last run, of the
same shape, dtype and device, and no input of the op); `exclusive` alone serves the sparse
updates, whatever their size. Neither changes a number: the same torch operations run in the
same order, into other memory.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from runtime.execution.kernels.buffers import MIN_BYTES
from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.torch_common import Tensor, tensor, torch

__all__ = ["exclusive", "large", "output_buffer", "own", "writable_input"]


def large(t: Any) -> bool:
    """A tensor of `MIN_BYTES` or more: smaller ones are left to the allocator, whose small
    blocks are reused anyway, and the checks would cost more than they save."""
    return type(t) is Tensor and t.numel() * t.element_size() >= MIN_BYTES


def _refs(t: Tensor) -> int:
    return sys.getrefcount(t)


def _storage_users(t: Tensor) -> int | None:
    """How many tensors (and storage objects) share `t`'s memory; None where this torch cannot
    tell (then nothing is written in place)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else int(count(t.untyped_storage()._cdata))


def _baseline() -> tuple[int, int | None]:
    """References to a tensor held by a scope only, and users of its storage, counted as
    `exclusive` counts them."""
    scope = {"var": torch.zeros(1)}
    t = scope["var"]
    return _refs(t), _storage_users(t)


_SCOPE_ONLY, _STORAGE_ONLY = _baseline()
_OWN: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
"""Tensors a torch kernel allocated, by id: memory nothing outside torch can hold."""


def own(t: Tensor) -> Tensor:
    """Register `t`, which a kernel just allocated, as memory nothing outside torch holds."""
    _OWN[id(t)] = t
    return t


def _alone(t: Tensor) -> bool:
    """`t` (held by the caller's caller as one local, besides the scope) is owned and unshared."""
    users = _storage_users(t)
    return bool(users is not None and _STORAGE_ONLY is not None and users <= _STORAGE_ONLY
                and _OWN.get(id(t)) is t and _refs(t) <= _SCOPE_ONLY + 1)


def exclusive(ctx: KernelContext, slot: str) -> bool:
    """Whether input `slot`'s tensor may be written in place: it is the scope's stored value on
    the kernel's device, contiguous, referenced by nothing but the scope, and alone on memory a
    torch kernel allocated. Call it holding no reference to the input."""
    t = ctx.input(slot)
    if not (type(t) is Tensor and tensor(t) is t and t.is_contiguous() and t._base is None
            and ctx.scope.raw(ctx.input_names(slot)[0]) is t):
        return False
    return _alone(t)


def writable_input(ctx: KernelContext, in_slot: str, out_slot: str) -> Tensor | None:
    """Input `in_slot`'s own tensor, to be computed into in place, when output `out_slot` is the
    same var, the tensor is `exclusive` and of `MIN_BYTES` or more; else None."""
    name = ctx.input_names(in_slot)[:1]
    if not name or name != ctx.op.outputs.get(out_slot, [])[:1] \
            or not large(ctx.scope.find(name[0])) or not exclusive(ctx, in_slot):
        return None
    return tensor(ctx.input(in_slot))


def output_buffer(ctx: KernelContext, slot: str, shape: tuple[int, ...], dtype: torch.dtype,
                  device: Any) -> Tensor | None:
    """The tensor output `slot`'s var holds from the op's last run, to be computed into
    (``out=``), when it has `shape`, `dtype` and `device`, is contiguous, of `MIN_BYTES` or more
    and alone on memory a torch kernel allocated, and the var is no input of the op; else
    None."""
    names = ctx.op.outputs.get(slot)
    if not names or any(names[0] in inputs for inputs in ctx.op.inputs.values()):
        return None
    held = ctx.scope.find(names[0])
    if not (large(held) and tuple(held.shape) == tuple(shape) and held.dtype == dtype
            and held.device == device and held.is_contiguous() and held._base is None):
        return None
    return held if _alone(held) else None
