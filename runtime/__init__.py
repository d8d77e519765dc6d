"""pslab's runtime: tensors, scopes, kernels and the executor that runs transpiled programs
(and, alongside, the wire protocol and transports of the parameter-server services)."""

from .executor import Executor
from .kernels import (AsyncOpError, ExecutionError, FeedError, FetchError, KernelError,
                      KernelNotFound, MissingInputError)
from .scope import Scope, global_scope
from .tensor import LoDTensor, SelectedRows

__all__ = [
    "AsyncOpError", "ExecutionError", "Executor", "FeedError", "FetchError", "KernelError",
    "KernelNotFound", "LoDTensor", "MissingInputError", "Scope", "SelectedRows", "global_scope",
]
