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
``fluid.core`` (``is_compiled_with_cuda()``, ``CPUPlace``, ``CUDAPlace``, ``LoDTensor``,
``Scope``; ``fluid.LoDTensor`` too).

What the harness of fluid's distributed tests (``test_dist_base.py``) and such scripts add:
``fluid.ParallelExecutor``, ``fluid.ExecutionStrategy``, ``fluid.BuildStrategy`` and
``fluid.compiler.CompiledProgram`` (also ``fluid.CompiledProgram``), which run the program on
one device (`runtime.paddle.compiler`); ``fluid.profiler`` (``profiler``, ``start_profiler``,
``stop_profiler``, ``reset_profiler``, ``cuda_profiler``: each op type's kernel times,
`runtime.paddle.profiler`); ``fluid.memory_optimize`` and ``fluid.release_memory`` (also in
``fluid.transpiler``), which have nothing to do here; ``fluid.param_attr.ParamAttr``; and
``fluid.layers.create_tensor``. ``Program.clone(for_test=True)`` is the program's own
(`transpiler.ir.Program.clone`). For ``dist_mnist.py``: ``fluid.nets.simple_img_conv_pool``,
``fluid.layers.accuracy`` (`transpiler.layers.accuracy`), ``Variable.is_data`` (how the harness
finds the feeds) and ``Executor.run``'s ``feed_var_name``, ``fetch_var_name`` and
``use_program_cache`` keywords. For the text scripts (``dist_text_classification.py``,
``dist_simnet_bow.py``): ``fluid.nets.sequence_conv_pool``, ``fluid.layers.sequence_conv``,
``softsign``, ``cos_sim`` and ``auc``, and ``DataFeeder`` of ``lod_level`` vars. For
``dist_ctr_reader.py``: ``fluid.log_helper.get_logger`` (`runtime.paddle.log_helper`),
importable as ``from ...fluid.log_helper import get_logger``: this module is registered as the
package that submodule is in, as are ``fluid.profiler`` and ``fluid.compiler``
(``import paddle.fluid.profiler as profiler``, as the scripts write it). The harness's own
imports of fluid's imperative mode (``fluid.dygraph``, ``dygraph.base``, ``dygraph.parallel``)
and of fleet's collective training (``fluid.incubate.fleet.collective``,
``fluid.incubate.fleet.base.role_maker``) import too; their names raise `NotPorted` when used
(the harness uses them only on its dygraph and NCCL paths; `fluid_modules`).
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace
from typing import Any, NoReturn, Sequence

import numpy as np

from transpiler import clip, initializer, lr, optimizer, regularizer
from transpiler import layers as _layers
from transpiler.distribute import (DistributeTranspiler, DistributeTranspilerConfig,
                                   ServerRuntimeConfig)
from transpiler.framework import (ParamAttr, default_main_program, default_startup_program,
                                  main_block, program_guard, unique_name)
from transpiler.ir import Program, Var
from transpiler.layers import embedding_v2 as embedding

from runtime.execution.scope import Scope, global_scope
from runtime.paddle import compiler, log_helper, profiler
from runtime.paddle.compiler import (BuildStrategy, CompiledProgram, ExecutionStrategy,
                                     ParallelExecutor)
from runtime.services.paddle_compat import (CPUPlace, CUDAPlace, DataFeeder, save_params,
                                            save_persistables)
from runtime.services.paddle_compat import FluidExecutor as Executor  # Paddle's name for it
from runtime.services.paddle_compat import FluidLoDTensor as LoDTensor


def memory_optimize(input_program: Program | None = None, skip_opt_set: Any = None,
                    print_log: bool = False, level: int = 0, skip_grads: bool = True) -> None:
    """fluid's memory-reuse pass, which has nothing to do here: Paddle's executor keeps every
    var's buffer for the program's life, and the pass renames vars so that later ones reuse the
    buffers of earlier ones. pslab's kernels store a new value for each output and never write
    into one they read (`runtime.execution.scope`), so a temporary is freed as soon as the next
    run replaces it; renaming vars would only make fetching them unreliable. The program is left
    as it is; `level` is checked as Paddle does (0 or 1)."""
    if level not in (0, 1):
        raise ValueError("only support opt_level 0 or 1.")


def release_memory(input_program: Program | None = None, skip_opt_set: Any = None) -> None:
    """fluid's pass that inserts ops freeing vars early, which has nothing to do here for the
    reason `memory_optimize` gives; the program is left as it is."""


transpiler = SimpleNamespace(DistributeTranspiler=DistributeTranspiler,
                             DistributeTranspilerConfig=DistributeTranspilerConfig,
                             ServerRuntimeConfig=ServerRuntimeConfig,
                             memory_optimize=memory_optimize, release_memory=release_memory)
"""``fluid.transpiler.DistributeTranspiler`` (and ``ServerRuntimeConfig``, ``memory_optimize``,
``release_memory``), as Paddle also spells them."""
param_attr = SimpleNamespace(ParamAttr=ParamAttr)
"""``fluid.param_attr.ParamAttr``, the module Paddle keeps it in."""
io = SimpleNamespace(save_params=save_params, save_persistables=save_persistables)
"""``fluid.io.save_params``, ``fluid.io.save_persistables``."""

LR_SCHEDULES = ("exponential_decay", "natural_exp_decay", "inverse_time_decay",
                "polynomial_decay", "piecewise_decay", "noam_decay", "cosine_decay")
"""fluid's learning-rate schedules, which fluid keeps in ``fluid.layers``."""


def create_tensor(dtype: Any, name: str | None = None, persistable: bool = False) -> Var:
    """fluid's ``layers.create_tensor``: declare a var of `dtype` (a name or a numpy dtype) in
    the main program's current block, named `name` (else ``create_tensor_N``), with no shape
    yet, for an op to write (``accuracy(..., total=t)``) or a script to assign."""
    return main_block().create_var(name or unique_name.generate("create_tensor"),
                                   dtype=np.dtype(dtype).name, persistable=persistable)


def simple_img_conv_pool(input: Var, num_filters: int, filter_size: int | Sequence[int],
                         pool_size: int | Sequence[int], pool_stride: int | Sequence[int],
                         pool_padding: int | Sequence[int] = 0, pool_type: str = "max",
                         global_pooling: bool = False, conv_stride: int | Sequence[int] = 1,
                         conv_padding: int | Sequence[int] = 0,
                         conv_dilation: int | Sequence[int] = 1, conv_groups: int = 1,
                         param_attr: Any = None, bias_attr: Any = None, act: str | None = None,
                         use_cudnn: bool = True) -> Var:
    """fluid's ``nets.simple_img_conv_pool``: `conv2d` (with its bias and `act`), then
    `pool2d` of its output, the layers' ops as fluid writes them. `use_cudnn` picks nothing
    here: the executor's backend computes either way."""
    conv = _layers.conv2d(input, num_filters, filter_size, stride=conv_stride,
                          padding=conv_padding, dilation=conv_dilation, groups=conv_groups,
                          param_attr=param_attr, bias_attr=bias_attr, act=act)
    return _layers.pool2d(conv, pool_size, pool_type, pool_stride, pool_padding, global_pooling)


def sequence_conv_pool(input: Var, num_filters: int, filter_size: int, param_attr: Any = None,
                       act: str = "sigmoid", pool_type: str = "max",
                       bias_attr: Any = None) -> Var:
    """fluid's ``nets.sequence_conv_pool``: `sequence_conv` of the LoD `input` (with its bias
    and `act`), then `sequence_pool` of each sequence (`pool_type`), a row per sequence."""
    conv = _layers.sequence_conv(input, num_filters, filter_size, param_attr=param_attr,
                                 bias_attr=bias_attr, act=act)
    return _layers.sequence_pool(conv, pool_type)


nets = SimpleNamespace(simple_img_conv_pool=simple_img_conv_pool,
                       sequence_conv_pool=sequence_conv_pool)
"""``fluid.nets``: the composite layers fluid's image scripts (``dist_mnist.py``) and text
scripts (``dist_text_classification.py``) build with."""

FLUID_LAYERS = {"create_tensor": create_tensor}
"""fluid layers that pslab's front end does not have as such, added to ``fluid.layers``."""


def _fluid_layers() -> ModuleType:
    """``fluid.layers``: pslab's layers (`transpiler.layers`), the LR schedules of
    `transpiler.lr` under fluid's names and `FLUID_LAYERS`."""
    module = ModuleType("runtime.paddle.fluid.layers", _layers.__doc__)
    module.__dict__.update((k, v) for k, v in vars(_layers).items() if not k.startswith("__"))
    for name in LR_SCHEDULES:
        setattr(module, name, getattr(lr, name))
    extra = [name for name in FLUID_LAYERS if not hasattr(_layers, name)]
    for name in extra:
        setattr(module, name, FLUID_LAYERS[name])
    module.__dict__["__all__"] = list(_layers.__all__) + list(LR_SCHEDULES) + extra
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


core = SimpleNamespace(is_compiled_with_cuda=is_compiled_with_cuda, CPUPlace=CPUPlace,
                       CUDAPlace=CUDAPlace, LoDTensor=LoDTensor, Scope=Scope)
"""``fluid.core``: what a script asks of it, ``is_compiled_with_cuda()``, the places,
``LoDTensor`` (`runtime.services.paddle_compat.FluidLoDTensor`) and ``Scope``."""

DYGRAPH = ("fluid's imperative mode (dygraph) is not ported to pslab, which runs programs: "
           "declare the model with fluid.layers in a Program")
COLLECTIVE = ("fleet's collective (NCCL all-reduce) training is not ported to pslab, whose "
              "jobs are parameter-server jobs: transpile with fluid.DistributeTranspiler")


class NotPorted(NotImplementedError):
    """A fluid name that pslab does not port was used: the message names it and says why."""


def _refuse(name: str, why: str) -> NoReturn:
    raise NotPorted(f"{name}: {why}")


class _Refusing:
    """A fluid function or class that raises `NotPorted` when called."""

    def __init__(self, name: str, why: str) -> None:
        self._name, self._why = name, why

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self._name, self._why)

    def __repr__(self) -> str:
        return f"<{self._name}: not ported>"


class _RefusingObject:
    """A fluid object (the collective ``fleet``) each of whose attributes raises `NotPorted`."""

    def __init__(self, name: str, why: str) -> None:
        self._name, self._why = name, why

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        _refuse(f"{self._name}.{attr}", self._why)

    def __repr__(self) -> str:
        return f"<{self._name}: not ported>"


def _module(name: str, why: str, names: tuple[str, ...], objects: tuple[str, ...] = (),
            **submodules: ModuleType) -> ModuleType:
    """A module `name` whose functions and classes `names` refuse when called, whose objects
    `objects` refuse any attribute, with `submodules` as attributes."""
    module = ModuleType(name, f"fluid's {name.split('.', 3)[-1]}: not ported ({why}).")
    for item in names:
        setattr(module, item, _Refusing(f"{name.split('.', 2)[-1]}.{item}", why))
    for item in objects:
        setattr(module, item, _RefusingObject(f"{name.split('.', 2)[-1]}.{item}", why))
    for attr, sub in submodules.items():
        setattr(module, attr, sub)
    module.__all__ = [*names, *objects, *submodules]  # type: ignore[attr-defined]
    return module


def fluid_modules(fluid: str) -> dict[str, ModuleType]:
    """The modules fluid has and pslab does not port, under the fluid package named `fluid`
    (``runtime.paddle.fluid``), by their full names, for ``sys.modules``: importable so that a
    script which imports them but runs as a parameter-server job still runs. Paddle's harness
    of its distributed tests (``test_dist_base.py``) imports ``fluid.dygraph``
    (``dygraph.base.to_variable``, ``dygraph.parallel.DataParallel``),
    ``fluid.incubate.fleet.collective`` (``fleet``, ``DistributedStrategy``) and
    ``fluid.incubate.fleet.base.role_maker`` at its top and uses them only on its dygraph and
    NCCL paths; ``dist_mnist.py`` imports the collective ``fleet`` too. Using any of their
    names raises `NotPorted`, saying why (`DYGRAPH`, `COLLECTIVE`)."""
    dy_base = _module(f"{fluid}.dygraph.base", DYGRAPH, ("to_variable", "guard", "no_grad"))
    dy_parallel = _module(f"{fluid}.dygraph.parallel", DYGRAPH,
                          ("DataParallel", "ParallelStrategy", "prepare_context", "Env"))
    dygraph = _module(f"{fluid}.dygraph", DYGRAPH,
                      ("to_variable", "guard", "no_grad", "DataParallel", "ParallelStrategy",
                       "prepare_context"), base=dy_base, parallel=dy_parallel)
    role_maker = _module(f"{fluid}.incubate.fleet.base.role_maker", COLLECTIVE,
                         ("PaddleCloudRoleMaker", "UserDefinedRoleMaker",
                          "UserDefinedCollectiveRoleMaker"))
    fleet_base = _module(f"{fluid}.incubate.fleet.base", COLLECTIVE, (), role_maker=role_maker)
    collective = _module(f"{fluid}.incubate.fleet.collective", COLLECTIVE,
                         ("DistributedStrategy", "CollectiveOptimizer"), ("fleet",))
    fleet = _module(f"{fluid}.incubate.fleet", COLLECTIVE, (), base=fleet_base,
                    collective=collective)
    incubate = _module(f"{fluid}.incubate", COLLECTIVE, (), fleet=fleet)
    return {m.__name__: m for m in (dygraph, dy_base, dy_parallel, incubate, fleet, fleet_base,
                                    role_maker, collective)}


sys.modules[f"{__name__}.log_helper"] = log_helper  # ``from fluid.log_helper import ...``
sys.modules[f"{__name__}.profiler"] = profiler  # ``import paddle.fluid.profiler as profiler``
sys.modules[f"{__name__}.compiler"] = compiler  # ``import paddle.fluid.compiler``
sys.modules.update(fluid_modules(__name__))
dygraph = sys.modules[f"{__name__}.dygraph"]
"""``fluid.dygraph``: importable, not ported (`fluid_modules`)."""
incubate = sys.modules[f"{__name__}.incubate"]
"""``fluid.incubate`` (``incubate.fleet.collective``, ``incubate.fleet.base.role_maker``):
importable, not ported (`fluid_modules`)."""

__all__ = ["BuildStrategy", "CPUPlace", "CUDAPlace", "CompiledProgram", "DataFeeder",
           "DistributeTranspiler", "DistributeTranspilerConfig", "ExecutionStrategy", "Executor",
           "LoDTensor", "NotPorted", "ParallelExecutor", "ParamAttr", "Program", "Scope", "clip",
           "compiler", "core", "default_main_program", "default_startup_program", "dygraph",
           "embedding", "global_scope", "incubate", "initializer", "io", "layers", "log_helper",
           "memory_optimize", "nets", "optimizer", "param_attr", "profiler", "program_guard",
           "regularizer", "release_memory", "transpiler", "unique_name"]
