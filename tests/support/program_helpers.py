"""Programs as tests make them: a model's main and startup programs from a function that builds
it with the layers, and small hand-built ones."""

from __future__ import annotations

from typing import Any, Callable

import transpiler as T
from transpiler.ir import Program


def build(fn: Callable[[], Any], seed: int = 0) -> tuple[Program, Program, Any]:
    """What `fn` builds with the layers, in a fresh main and startup program both seeded with
    `seed`, its names counted afresh: the two programs and what `fn` returned."""
    main, startup = Program(), Program()
    main.random_seed = startup.random_seed = seed
    with T.program_guard(main, startup), T.unique_name.guard():
        out = fn()
    return main, startup, out


def double_program() -> Program:
    """out = 2 * x for x of shape [-1, 3] float32."""
    prog = Program()
    block = prog.global_block()
    block.create_var("x", shape=(-1, 3), dtype="float32")
    block.create_var("out", shape=(-1, 3), dtype="float32")
    block.append_op("scale", {"X": ["x"]}, {"Out": ["out"]}, {"scale": 2.0})
    return prog
