"""`KernelContext`: what a kernel sees of the op it runs and the scope it runs in.

Inputs are read by slot: `input(slot)` gives the first var's value (a numpy array, a LoDTensor's
data, or a `SelectedRows`), or None when the op has no var in that slot; `lod(slot)` gives the
LoD separately. Outputs are stored by slot; storing into a slot the op does not have is a no-op,
so a grad kernel can simply skip the input gradients nobody asked for (`has_output`).

A missing value is reported with the block, op index and type, slot and var (`MissingInputError`).
The executor builds one context per op run; kernels keep no state between runs.

How a kernel sees scope values is its context's `view`: numpy (`host_value`) by default, so a
numpy kernel reads numpy whatever the scope holds; a backend with tensors of its own (torch) sets
a view that turns values into its tensors and, with `keep_view`, stores the converted value back
in the scope, so that a var fed or received as numpy is converted once, not by every op reading
it. Values are immutable, so swapping one for its converted twin changes nothing else. What a
kernel only reads on the host (a learning rate) it reads with `host_input`, unconverted.

DESIGN: `input` and `set_output` run a few times for every op of every step, so they read and
write the scope's dict directly (`Scope.raw` and `Scope.put` as one dict operation each) and
call the view only for a value it may change: `as_is` is the type a view returns as it is
(numpy arrays under the default view, the backend's tensors under its own), checked with
``type(value) is`` before any call.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from transpiler.ir import Op, Program

from runtime.execution.kernels.errors import ExecutionError, MissingInputError
from runtime.execution.scope import Scope
from runtime.execution.tensor import Dense, LoD, LoDTensor, Value, host_value, is_native

RunBlock = Callable[[int], None]
View = Callable[[Any], Any]
"""How a kernel sees a stored value (numpy, or a backend's tensors)."""


class KernelContext:
    __slots__ = ("op", "scope", "where", "program", "_run_block", "view", "keep_view", "as_is",
                 "_values")

    def __init__(self, op: Op, scope: Scope, where: str = "", program: Program | None = None,
                 run_block: RunBlock | None = None) -> None:
        self.op = op
        self.scope = scope
        self.where = where or f"op {op.type}"
        self.program = program
        self._run_block = run_block
        self.view: View = host_value
        self.keep_view = False
        self.as_is: type = np.ndarray
        """Stored values of this type are what the view would return (no call needed)."""
        self._values = scope._values

    # -- inputs ---------------------------------------------------------------------------------
    def input(self, slot: str) -> Any:
        """The value of the slot's first var (array or SelectedRows), None if the slot is empty."""
        names = self.op.inputs.get(slot)
        if not names:
            return None
        try:
            value = self._values[names[0]]
        except KeyError:
            raise self._missing(slot, names[0]) from None
        if type(value) is self.as_is:
            return value
        value = self._seen(names[0], value)
        return value.data if type(value) is LoDTensor else value

    def host_input(self, slot: str) -> Any:
        """The slot's first value in numpy form, like `input` under the default view, whatever
        this context's view: for what a kernel reads on the host (a learning rate). Nothing is
        converted into the scope, so such a value fed or initialized as numpy stays numpy."""
        names = self.op.inputs.get(slot)
        if not names:
            return None
        value = host_value(self._stored(slot, names[0]))
        return value.data if type(value) is LoDTensor else value

    def inputs(self, slot: str) -> list[Any]:
        values = [self._read(slot, n) for n in self.op.inputs.get(slot, ())]
        return [v.data if type(v) is LoDTensor else v for v in values]

    def lod(self, slot: str, index: int = 0) -> LoD:
        names = self.op.inputs.get(slot)
        if not names:
            return []
        value = self._stored(slot, names[index])  # a view keeps the LoD: no need to make one
        return value.lod if type(value) is LoDTensor else []

    def input_names(self, slot: str) -> list[str]:
        return self.op.inputs.get(slot, [])

    def has_input(self, slot: str) -> bool:
        return bool(self.op.inputs.get(slot))

    def _missing(self, slot: str, name: str) -> MissingInputError:
        return MissingInputError(f"{self.where}: input {slot} var {name!r} has no value in the scope")

    def _stored(self, slot: str, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise self._missing(slot, name) from None

    def _seen(self, name: str, stored: Any) -> Any:
        """`stored` through the view, kept in the scope in its viewed form with `keep_view`."""
        value = self.view(stored)
        if self.keep_view and value is not stored:
            self._values[name] = value
        return value

    def _read(self, slot: str, name: str) -> Any:
        stored = self._stored(slot, name)
        return stored if type(stored) is self.as_is else self._seen(name, stored)

    # -- attributes -----------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        return self.op.attrs.get(name, default)

    @property
    def random_seed(self) -> int:
        return self.program.random_seed if self.program is not None else 0

    # -- outputs --------------------------------------------------------------------------------
    def output_names(self, slot: str) -> list[str]:
        return self.op.outputs.get(slot, [])

    def has_output(self, slot: str) -> bool:
        return bool(self.op.outputs.get(slot))

    def set_output(self, slot: str, value: Value | Dense, index: int = 0,
                   lod: LoD | None = None) -> None:
        """Store `value` as the slot's `index`-th var (with `lod` when given and non-empty)."""
        names = self.op.outputs.get(slot)
        if not names:
            return
        if lod and (isinstance(value, np.ndarray) or is_native(value)):
            value = LoDTensor(value, lod)
        self._values[names[index]] = value  # Scope.put

    # -- control flow ---------------------------------------------------------------------------
    def run_block(self, block_idx: int) -> None:
        """Run a sub-block of the program on the same scope (conditional_block)."""
        if self._run_block is None:
            raise ExecutionError(f"{self.where}: cannot run block {block_idx} outside an executor")
        self._run_block(block_idx)


__all__ = ["KernelContext", "RunBlock"]
