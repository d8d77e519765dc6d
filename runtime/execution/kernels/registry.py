"""The kernel registry: op type -> kernel function, one table per backend.

A backend is a module whose import registers its kernels with `@register(op_type, backend)`;
`get_kernel` imports it on first use. A kernel is ``kernel(ctx: KernelContext) -> None``: it
reads its inputs and attributes from the context and stores its outputs through it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

from runtime.execution.kernels.errors import KernelNotFound

if TYPE_CHECKING:
    from runtime.execution.kernels.context import KernelContext

Kernel = Callable[["KernelContext"], None]

BACKENDS: dict[str, str] = {
    "numpy": "runtime.execution.kernels.numpy_ops",
    "torch": "runtime.execution.kernels.torch_ops",
    "phantom": "runtime.execution.kernels.phantom",
}

_kernels: dict[tuple[str, str], Kernel] = {}


def register(op_type: str, backend: str = "numpy") -> Callable[[Kernel], Kernel]:
    """Decorator: make the function the `backend` kernel of `op_type`."""
    def wrap(fn: Kernel) -> Kernel:
        key = (backend, op_type)
        if key in _kernels:
            raise ValueError(f"a {backend} kernel for op type {op_type!r} is already registered")
        _kernels[key] = fn
        return fn
    return wrap


def load_backend(backend: str) -> None:
    """Import the backend's kernel modules (which registers them)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; one of {sorted(BACKENDS)}")
    importlib.import_module(BACKENDS[backend])


def get_kernel(op_type: str, backend: str = "numpy") -> Kernel:
    load_backend(backend)
    try:
        return _kernels[(backend, op_type)]
    except KeyError:
        raise KernelNotFound(op_type, backend) from None


def registered_ops(backend: str = "numpy") -> list[str]:
    load_backend(backend)
    return sorted(op for b, op in _kernels if b == backend)


__all__ = ["BACKENDS", "Kernel", "get_kernel", "load_backend", "register", "registered_ops"]
