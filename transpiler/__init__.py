"""pslab's transpiler: the program IR, a Paddle-style front end, autodiff, optimizers, and the
distribute transpiler that turns one training program into trainer and pserver programs.

Pure program rewriting: nothing here computes tensors or does IO (see `runtime` for that).
"""

from . import clip, initializer, layers, lr, optimizer, regularizer
from .backward import append_backward
from .capture import from_torch
from .distribute import (DistributedMode, DistributeTranspiler, DistributeTranspilerConfig,
                         GeoSgdTranspiler, HashName, PSDispatcher, RoundRobin, VarBlock,
                         slice_variable)
from .framework import (ParamAttr, default_main_program, default_startup_program, name_scope,
                        program_guard, unique_name)
from .ir import (Block, BlockRef, IRError, Op, OpRole, Program, Var, VarType, dumps_json,
                 dumps_msgpack, grad_name, loads_json, loads_msgpack, verify)

__all__ = [
    "DistributeTranspiler", "DistributeTranspilerConfig", "DistributedMode", "GeoSgdTranspiler",
    "HashName", "PSDispatcher", "RoundRobin", "VarBlock", "slice_variable",
    "Block", "BlockRef", "IRError", "Op", "OpRole", "ParamAttr", "Program", "Var", "VarType",
    "append_backward", "clip", "from_torch", "default_main_program", "default_startup_program", "dumps_json",
    "dumps_msgpack", "grad_name", "initializer", "layers", "loads_json", "loads_msgpack", "lr",
    "name_scope", "optimizer", "program_guard", "regularizer", "unique_name", "verify",
]
