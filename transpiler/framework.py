"""Front-end state: the default main/startup programs, `program_guard`, unique names, name scopes,
`ParamAttr`, and the helpers layers use to declare vars, parameters and ops.

As in Paddle's static graph, layers append ops to the *current block* of the default main program
and put parameter initializers into the default startup program. Initializers are *prepended* to
the startup block, so the most recently created variable's initializer runs first (the
acceptance op lists of docs/transpiler.md §9, depend on this order).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

from .initializer import Initializer
from .ir import Block, Op, OpRole, Program, Var, VarType, WeightDecayRegularizer

PADDLE_VERSION_ENV = "PSLAB_PADDLE_VERSION"
"""Where a config made without `paddle_version`, and the layers, take the release of the
original to follow (a ported script's, unchanged)."""
DEFAULT_PADDLE_VERSION = "1.8"
"""The release fluid's names follow when ``PSLAB_PADDLE_VERSION`` is unset."""


def env_paddle_version() -> str:
    """The release of the original the front end follows where releases wrote different ops
    (``PSLAB_PADDLE_VERSION``, else "1.8"; docs/transpiler.md §9): layers read it when they are
    built, a `DistributeTranspilerConfig` takes it as its default `paddle_version`."""
    return os.getenv(PADDLE_VERSION_ENV) or DEFAULT_PADDLE_VERSION


_main_program = Program()
_startup_program = Program()
_name_counters: dict[str, itertools.count[int]] = defaultdict(itertools.count)
_name_scopes: list[str] = []
_op_role_stack: list[tuple[int, list[str]]] = []


def default_main_program() -> Program:
    return _main_program


def default_startup_program() -> Program:
    return _startup_program


@contextlib.contextmanager
def program_guard(main: Program, startup: Program | None = None) -> Iterator[None]:
    """Make `main` (and `startup`) the default programs for the body of the `with`."""
    global _main_program, _startup_program
    if not isinstance(main, Program):
        raise TypeError(f"program_guard: main must be a Program, got {type(main).__name__}")
    old = (_main_program, _startup_program)
    _main_program = main
    if startup is not None:
        _startup_program = startup
    try:
        yield
    finally:
        _main_program, _startup_program = old


class unique_name:
    """`unique_name.generate("fc")` -> "fc_0", "fc_1", ...; `guard()` gives a fresh namespace."""

    @staticmethod
    def generate(key: str) -> str:
        return f"{key}_{next(_name_counters[key])}"

    @staticmethod
    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        global _name_counters
        old = _name_counters
        _name_counters = defaultdict(itertools.count)
        try:
            yield
        finally:
            _name_counters = old


def generate_tmp(prefix: str) -> str:
    """Name of a layer's temporary: ``fc_0.tmp_1``."""
    return unique_name.generate(prefix + ".tmp")


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[None]:
    _name_scopes.append(name)
    try:
        yield
    finally:
        _name_scopes.pop()


def current_name_scope() -> str:
    return "/" + "/".join(_name_scopes) + ("/" if _name_scopes else "")


@contextlib.contextmanager
def op_role_guard(role: int, role_var: list[str] | None = None) -> Iterator[None]:
    """Ops appended through `append_op` in the body get this op_role (and op_role_var)."""
    _op_role_stack.append((int(role), list(role_var or [])))
    try:
        yield
    finally:
        _op_role_stack.pop()


@dataclass
class ParamAttr:
    """How a layer creates its parameter: name, initializer, regularizer, trainability, and
    clipping: `need_clip` False keeps the optimizer's `grad_clip` off this parameter's
    gradient, and `gradient_clip` (fluid 1.x's per-parameter clip, e.g.
    ``GradientClipByValue(0.1)``) clips it when the optimizer has no `grad_clip` of its own."""

    name: str | None = None
    initializer: Initializer | None = None
    regularizer: WeightDecayRegularizer | None = None
    trainable: bool = True
    learning_rate: float = 1.0
    gradient_clip: Any = None
    need_clip: bool = True

    @staticmethod
    def of(attr: "ParamAttr | str | bool | None") -> "ParamAttr | None":
        """Normalize a layer's param_attr/bias_attr argument; False means "no such parameter"."""
        if attr is False:
            return None
        if attr is None or attr is True:
            return ParamAttr()
        if isinstance(attr, str):
            return ParamAttr(name=attr)
        if isinstance(attr, ParamAttr):
            return attr
        raise TypeError(f"param_attr must be ParamAttr, str, bool or None, not {type(attr).__name__}")


def main_block() -> Block:
    return _main_program.current_block()


def append_op(type: str, inputs: dict[str, Any] | None = None, outputs: dict[str, Any] | None = None,
              attrs: dict[str, Any] | None = None, block: Block | None = None) -> Op:
    """Append an op to `block` (default: the current block of the main program) with the role
    of the innermost `op_role_guard`."""
    attrs = dict(attrs or {})
    if _op_role_stack:
        role, role_var = _op_role_stack[-1]
        attrs.setdefault("op_role", role)
        if role_var:
            attrs.setdefault("op_role_var", list(role_var))
    if _name_scopes:
        attrs.setdefault("op_namescope", current_name_scope())
    target = block if block is not None else main_block()
    return target.append_op(type, inputs, outputs, attrs)


def create_tmp_var(prefix: str, shape: tuple[int, ...] | list[int], dtype: str = "float32",
                   lod_level: int = 0, block: Block | None = None,
                   type: VarType = VarType.LOD_TENSOR, stop_gradient: bool = False) -> Var:
    target = block if block is not None else main_block()
    return target.create_var(generate_tmp(prefix), shape=tuple(shape), dtype=dtype,
                             lod_level=lod_level, type=type, stop_gradient=stop_gradient)


def create_global_var(name: str, shape: list[int], value: float, dtype: str = "float32",
                      persistable: bool = True, force_cpu: bool = False) -> Var:
    """A persistable var in the main and startup programs, filled with `value` at startup."""
    var = _main_program.global_block().create_var(
        name, shape=tuple(shape), dtype=dtype, persistable=persistable, stop_gradient=True)
    sblock = _startup_program.global_block()
    if not sblock.has_var(name):
        sblock.create_var(name, shape=tuple(shape), dtype=dtype, persistable=persistable)
        sblock.prepend_op("fill_constant", outputs={"Out": [name]},
                          attrs={"shape": list(shape), "dtype": dtype, "value": float(value),
                                 "force_cpu": force_cpu})
    return var


def create_parameter(attr: ParamAttr, shape: list[int], dtype: str, default_initializer: Any,
                     prefix: str) -> Var:
    """Declare a parameter in the main program's global block and its initializer in startup."""
    name = attr.name or unique_name.generate(prefix)
    gblock = _main_program.global_block()
    if gblock.has_var(name):
        existing = gblock.var(name)
        if not existing.is_parameter or existing.shape != tuple(shape):
            raise ValueError(f"parameter {name!r}: already declared with shape {existing.shape}, "
                             f"asked for {tuple(shape)}")
        param = existing
    else:
        param = gblock.create_var(name, shape=tuple(shape), dtype=dtype, persistable=True,
                                  is_parameter=True, trainable=attr.trainable,
                                  stop_gradient=not attr.trainable)
        param.regularizer = attr.regularizer
        param.optimize_attr = {"learning_rate": attr.learning_rate}
        param.need_clip, param.gradient_clip = attr.need_clip, attr.gradient_clip
    sblock = _startup_program.global_block()
    if sblock.has_var(name):  # shared, or declared by ``Block.create_parameter``: initialized
        return param
    init = attr.initializer or default_initializer
    if not isinstance(init, Initializer):
        raise TypeError(f"parameter {name!r}: initializer must be an Initializer, got {init!r}")
    svar = sblock.create_var(name, shape=tuple(shape), dtype=dtype, persistable=True)
    init(svar, sblock)
    return param


__all__ = [
    "ParamAttr", "Program", "append_op", "create_global_var", "create_parameter",
    "create_tmp_var", "current_name_scope", "default_main_program", "default_startup_program",
    "generate_tmp", "name_scope", "op_role_guard", "program_guard", "unique_name", "OpRole",
]
