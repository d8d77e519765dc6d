"""``paddle.fluid`` for a ported script (`runtime.paddle`): ``import runtime.paddle.fluid as
fluid``. The front end and the transpiler are pslab's (`transpiler`: the same programs, ops
and names as Paddle's); the executor runs local, trainer and pserver programs
(`runtime.services.paddle_compat`). What a classic parameter-server script uses is here:
``fluid.layers`` (with fluid's learning-rate schedules: ``fluid.layers.exponential_decay``,
``piecewise_decay``, ``natural_exp_decay``, ``inverse_time_decay``, ``polynomial_decay``,
``noam_decay``, ``cosine_decay``, `transpiler.lr`), ``fluid.optimizer``, ``fluid.initializer``, ``fluid.regularizer``,
``fluid.clip``, ``fluid.ParamAttr``, ``fluid.Program``, ``fluid.program_guard``,
``fluid.default_main_program()``, ``fluid.default_startup_program()``,
``fluid.unique_name``, ``fluid.embedding`` (`lookup_table_v2`; ``fluid.layers.embedding`` is
`lookup_table`), ``fluid.DistributeTranspiler`` and ``DistributeTranspilerConfig`` (also
as ``fluid.transpiler.*``, with ``fluid.transpiler.ServerRuntimeConfig``), ``fluid.Executor``, ``fluid.CPUPlace``, ``fluid.CUDAPlace``,
``fluid.DataFeeder``, ``fluid.global_scope()``, ``fluid.io.save_params`` and
``save_persistables`` (one ``.npy`` per var, not Paddle's format), and
``fluid.core.is_compiled_with_cuda()``.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

from transpiler import clip, initializer, lr, optimizer, regularizer
from transpiler import layers as _layers
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

LR_SCHEDULES = ("exponential_decay", "natural_exp_decay", "inverse_time_decay",
                "polynomial_decay", "piecewise_decay", "noam_decay", "cosine_decay")
"""fluid's learning-rate schedules, which fluid keeps in ``fluid.layers``."""


def _fluid_layers() -> ModuleType:
    """``fluid.layers``: pslab's layers (`transpiler.layers`) and the LR schedules of
    `transpiler.lr` under fluid's names."""
    module = ModuleType("runtime.paddle.fluid.layers", _layers.__doc__)
    module.__dict__.update((k, v) for k, v in vars(_layers).items() if not k.startswith("__"))
    for name in LR_SCHEDULES:
        setattr(module, name, getattr(lr, name))
    module.__dict__["__all__"] = list(_layers.__all__) + list(LR_SCHEDULES)
    return module


layers = _fluid_layers()


def is_compiled_with_cuda() -> bool:
    """fluid's ``core.is_compiled_with_cuda()``: whether ``CUDAPlace`` can run here, i.e. the
    torch backend (the ``[torch]`` extra) is installed and sees a CUDA device. torch is
    imported on the call, not before."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


core = SimpleNamespace(is_compiled_with_cuda=is_compiled_with_cuda)
"""``fluid.core``: what a script asks of it, ``is_compiled_with_cuda()``."""

__all__ = ["CPUPlace", "CUDAPlace", "DataFeeder", "DistributeTranspiler",
           "DistributeTranspilerConfig", "Executor", "ParamAttr", "Program", "Scope", "clip", "embedding",
           "core", "default_main_program", "default_startup_program", "global_scope", "initializer", "io",
           "layers", "optimizer", "program_guard", "regularizer", "transpiler", "unique_name"]
