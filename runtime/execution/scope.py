"""`Scope`: the values of a program's variables, by name, as an executor leaves them.

A scope maps a var name to a dense numpy array, a `LoDTensor` or a `SelectedRows` (in timing
mode, a `Phantom` standing for one). Persistable vars (parameters, accumulators, counters) live
across runs because the same scope is passed to every run; temporaries are simply overwritten by
the next run.

Values are treated as immutable: kernels never write into an array they read, they store a new
one. `set` copies what it is given, so the caller may reuse its arrays; `get` returns the stored
array itself, which callers must not modify (store a new value with `set` instead). `put` is the
runtime's no-copy path for values it has just produced.

Backend tensors: with the torch backend the scope holds torch tensors (on the executor's device)
for what torch kernels computed or read, so nothing is converted between ops. `raw` gives the
stored value as it is, for kernels; `get` and `get_tensor` give its numpy form
(`tensor.host_value`), for everything else (the wire, fetches, checkpoints, the pserver's
bookkeeping): the conversion happens there, where bytes leave the kernels, and costs nothing
for numpy values or CPU tensors (a view of the same memory).

DESIGN: `put` and `raw` are one dict operation each and must stay so: a kernel's context
(`runtime.execution.kernels.context.KernelContext`) reads and writes `_values` itself, a few
times per op of every step, where a method call per value cost more than the dict access.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy.typing as npt

from runtime.execution.tensor import LoDTensor, Value, copy_value, host_value


class Scope:
    def __init__(self) -> None:
        self._values: dict[str, Value] = {}

    def get(self, name: str) -> Any:
        """The var's numpy array (a LoDTensor's data), or its `SelectedRows` (typed Any so that
        callers who know a var is dense need no narrowing)."""
        value = self.get_tensor(name)
        return value.data if isinstance(value, LoDTensor) else value

    def get_tensor(self, name: str) -> Value:
        """The stored value in numpy form (a LoDTensor keeps its LoD)."""
        return host_value(self.raw(name))

    def raw(self, name: str) -> Any:
        """The stored value as it is: what kernels read (a backend tensor stays one)."""
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"scope has no var {name!r}") from None

    def find(self, name: str) -> Any:
        """The stored value as it is (`raw`), or None if the scope has no var `name`."""
        return self._values.get(name)

    def set(self, name: str, value: Value | npt.ArrayLike) -> None:
        """Store a copy of `value` (an array-like, `LoDTensor` or `SelectedRows`)."""
        self._values[name] = copy_value(value)

    def put(self, name: str, value: Value) -> None:
        """Store `value` without copying; the caller hands its arrays over to the scope."""
        self._values[name] = value

    def has(self, name: str) -> bool:
        return name in self._values

    def drop(self, names: Iterable[str]) -> None:
        """Forget `names` (those it holds): a sub-block's own vars once the block has run."""
        for name in names:
            self._values.pop(name, None)

    def names(self) -> list[str]:
        return list(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __repr__(self) -> str:
        return f"Scope({len(self._values)} vars)"


_global_scope = Scope()


def global_scope() -> Scope:
    """The scope `Executor.run` uses when none is given (Paddle's global scope)."""
    return _global_scope


__all__ = ["Scope", "global_scope"]
