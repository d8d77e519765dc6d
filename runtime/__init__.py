"""pslab's runtime: tensors, scopes, kernels and the executor that runs transpiled programs
(and, alongside, the wire protocol and transports of the parameter-server services)."""

from runtime.execution.executor import Executor
from runtime.execution.kernels import (AsyncOpError, ExecutionError, FeedError, FetchError,
                                       KernelError, KernelNotFound, MissingInputError)
from runtime.execution.scope import Scope, global_scope
from runtime.execution.tensor import LoDTensor, SelectedRows

__all__ = [
    "AsyncOpError", "ExecutionError", "Executor", "FeedError", "FetchError", "KernelError",
    "KernelNotFound", "LoDTensor", "MissingInputError", "Scope", "SelectedRows", "global_scope",
]
