"""Errors raised while running programs. Every message names the block, op (index and type),
slot or var at fault, so a failure in a long program points at the line of its disassembly."""

from __future__ import annotations


class ExecutionError(RuntimeError):
    """A program could not run."""


class KernelNotFound(ExecutionError):
    """No kernel is registered for an op type in a backend."""

    def __init__(self, op_type: str, backend: str, where: str = "") -> None:
        self.op_type = op_type
        self.backend = backend
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}no {backend} kernel for op type {op_type!r}")


class MissingInputError(ExecutionError):
    """An op reads a var that has no value in the scope."""


class KernelError(ExecutionError):
    """A kernel raised; the original exception is the `__cause__`."""


class FeedError(ExecutionError):
    """A fed value does not match its var's declaration (name, shape or dtype)."""


class FetchError(ExecutionError):
    """A fetched var is unknown or has no value after the run."""


class AsyncOpError(ExecutionError):
    """A program holds RPC ops, which only the async runtime can run."""


__all__ = ["AsyncOpError", "ExecutionError", "FeedError", "FetchError", "KernelError",
           "KernelNotFound", "MissingInputError"]
