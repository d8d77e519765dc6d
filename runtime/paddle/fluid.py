"""``paddle.fluid`` for a ported script (`runtime.paddle`): ``import runtime.paddle.fluid as
fluid``. The front end and the transpiler are pslab's (`transpiler`: the same programs, ops
and names as Paddle's); the executor runs local, trainer and pserver programs
(`runtime.services.paddle_compat`). What a classic parameter-server script uses is here:
``fluid.layers``, ``fluid.optimizer``, ``fluid.initializer``, ``fluid.regularizer``,
``fluid.clip``, ``fluid.ParamAttr``, ``fluid.Program``, ``fluid.program_guard``,
``fluid.default_main_program()``, ``fluid.default_startup_program()``,
``fluid.unique_name``, ``fluid.embedding`` (`lookup_table_v2`; ``fluid.layers.embedding`` is
`lookup_table`), ``fluid.DistributeTranspiler`` and ``DistributeTranspilerConfig`` (also
as ``fluid.transpiler.*``, with ``fluid.transpiler.ServerRuntimeConfig``), ``fluid.Executor``, ``fluid.CPUPlace``, ``fluid.CUDAPlace``,
``fluid.DataFeeder``, ``fluid.global_scope()``, ``fluid.io.save_params`` and
``save_persistables`` (one ``.npy`` per var, not Paddle's format).
"""

from __future__ import annotations

from types import SimpleNamespace

from transpiler import clip, initializer, layers, optimizer, regularizer
from transpiler.distribute import (DistributeTranspiler, DistributeTranspilerConfig,
                                   ServerRuntimeConfig)
from transpiler.framework import (ParamAttr, default_main_program, default_startup_program,
                                  program_guard, unique_name)
from transpiler.ir import Program
from transpiler.layers import embedding_v2 as embedding

from runtime.execution.scope import Scope, global_scope
from runtime.services.paddle_compat import (CPUPlace, CUDAPlace, DataFeeder, save_params,
                                            save_persistables)
from runtime.services.paddle_compat import FluidExecutor as Executor  # Paddle's name for it

transpiler = SimpleNamespace(DistributeTranspiler=DistributeTranspiler,
                             DistributeTranspilerConfig=DistributeTranspilerConfig,
                             ServerRuntimeConfig=ServerRuntimeConfig)
"""``fluid.transpiler.DistributeTranspiler`` (and ``ServerRuntimeConfig``), as Paddle also
spells them."""
io = SimpleNamespace(save_params=save_params, save_persistables=save_persistables)
"""``fluid.io.save_params``, ``fluid.io.save_persistables``."""

__all__ = ["CPUPlace", "CUDAPlace", "DataFeeder", "DistributeTranspiler",
           "DistributeTranspilerConfig", "Executor", "ParamAttr", "Program", "Scope", "clip", "embedding",
           "default_main_program", "default_startup_program", "global_scope", "initializer", "io",
           "layers", "optimizer", "program_guard", "regularizer", "transpiler", "unique_name"]
