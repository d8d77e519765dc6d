"""Kernels: the functions that compute ops, registered per op type and backend.

`get_kernel(op_type, backend)` finds one (loading the backend's modules on first use);
a kernel is ``kernel(ctx: KernelContext) -> None``. Backends: `numpy` (default), `torch` with
the same ops, and `phantom` (timing mode: no arithmetic, outputs are `Phantom` shapes).
"""

from runtime.execution.kernels.context import KernelContext
from runtime.execution.kernels.errors import (AsyncOpError, ExecutionError, FeedError, FetchError,
                                              KernelError, KernelNotFound, MissingInputError)
from runtime.execution.kernels.registry import (BACKENDS, Kernel, get_kernel, load_backend,
                                                register, registered_ops)

__all__ = [
    "AsyncOpError", "BACKENDS", "ExecutionError", "FeedError", "FetchError", "Kernel",
    "KernelContext", "KernelError", "KernelNotFound", "MissingInputError", "get_kernel",
    "load_backend", "register", "registered_ops",
]
