"""``fluid.compiler`` and ``fluid.ParallelExecutor`` for a ported script, on one device.

Paddle compiles a program into a graph that runs on every device of the machine (the GPUs, or
``CPU_NUM`` CPU places), splitting each batch among them and all-reducing the gradients. pslab's
parallelism is the parameter-server job itself (trainers and pservers, each a process), so here
a compiled program runs as it is on the executor's one place, and a `ParallelExecutor` is a
``fluid.Executor`` on one place (a trainer program among them: it joins the job as any run of
the trainer's programs does, `runtime.services.paddle_compat`). A script written for a single
device (``CPU_NUM=1``, as Paddle's distributed tests set it, or one GPU) computes the same
losses; with several, Paddle's fetches would hold one value per device, here one for the whole
batch.

`ExecutionStrategy` and `BuildStrategy` hold Paddle's attributes with its defaults, so a script
can set them; none changes how the program runs (threads, op fusion, in-place reuse and
all-reduce strategies concern Paddle's multi-device graph). Setting a name Paddle does not have
is an AttributeError, as with Paddle's own objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from transpiler.framework import default_main_program
from transpiler.ir import Program, Var

from runtime.execution.scope import Scope, global_scope
from runtime.services.paddle_compat import CPUPlace, CUDAPlace, FluidExecutor


@dataclass(slots=True)
class ExecutionStrategy:
    """Paddle's ``fluid.ExecutionStrategy``: how its graph executor schedules ops. Kept, not
    used (see the module)."""

    num_threads: int = 0
    allow_op_delay: bool = False
    num_iteration_per_drop_scope: int = 100
    num_iteration_per_run: int = 1
    use_thread_barrier: bool = False


class ReduceStrategy(enum.IntEnum):
    """How Paddle gathers gradients across devices: every device all-reduces them, or each is
    reduced on one device that updates its parameters and broadcasts them."""

    AllReduce = 0
    Reduce = 1


class GradientScaleStrategy(enum.IntEnum):
    """How Paddle scales the loss's gradient across devices."""

    CoeffNumDevice = 0
    One = 1
    Customized = 2


_Reduce = ReduceStrategy
_Scale = GradientScaleStrategy


@dataclass(slots=True)
class BuildStrategy:
    """Paddle's ``fluid.BuildStrategy``: how its multi-device graph is built (reduction, op
    fusion, memory reuse). Kept, not used (see the module). ``BuildStrategy.ReduceStrategy``
    and ``BuildStrategy.GradientScaleStrategy`` are the enums."""

    ReduceStrategy: ClassVar[type[_Reduce]] = _Reduce
    GradientScaleStrategy: ClassVar[type[_Scale]] = _Scale

    reduce_strategy: _Reduce = _Reduce.AllReduce
    gradient_scale_strategy: _Scale = _Scale.CoeffNumDevice
    debug_graphviz_path: str = ""
    enable_sequential_execution: bool = False
    fuse_elewise_add_act_ops: bool = False
    fuse_bn_act_ops: bool = False
    fuse_relu_depthwise_conv: bool = False
    fuse_broadcast_ops: bool = False
    fuse_all_optimizer_ops: bool = False
    fuse_all_reduce_ops: bool = False
    enable_auto_fusion: bool = False
    sync_batch_norm: bool = False
    memory_optimize: bool | None = None
    enable_inplace: bool = False
    enable_backward_optimizer_op_deps: bool = False
    cache_runtime_context: bool = False
    remove_unnecessary_lock: bool = True
    num_trainers: int = 1
    trainer_id: int = 0
    trainers_endpoints: list[str] = field(default_factory=list)
    nccl_comm_num: int = 1
    use_hierarchical_allreduce: bool = False
    hierarchical_allreduce_inter_nranks: int = 0
    is_distribution: bool = False
    async_mode: bool = False
    mkldnn_enabled_op_types: set[str] = field(default_factory=set)


def _one_place(places: Any) -> None:
    """Refuse more than one place: the program runs on one (see the module)."""
    if places is None:
        return
    listed = list(places) if isinstance(places, (list, tuple)) else [places]
    if len(listed) > 1:
        raise ValueError(f"with_data_parallel: {len(listed)} places; pslab runs a compiled "
                         "program on one place (its parallelism is the parameter-server job: "
                         "run more trainers)")


class CompiledProgram:
    """Paddle's ``fluid.CompiledProgram(program)``: a program marked for the executor. An
    executor's ``run`` runs the program it holds (``_program``) as it is; `with_data_parallel`
    records its arguments and returns the compiled program (see the module)."""

    def __init__(self, program_or_graph: Program,
                 build_strategy: BuildStrategy | None = None) -> None:
        if not isinstance(program_or_graph, Program):
            raise TypeError(f"CompiledProgram: expected a Program, got "
                            f"{type(program_or_graph).__name__}")
        self._program = program_or_graph
        self._build_strategy = build_strategy
        self._exec_strategy: ExecutionStrategy | None = None
        self._loss_name: str | None = None
        self._is_data_parallel = False

    def with_data_parallel(self, loss_name: str | None = None,
                           build_strategy: BuildStrategy | None = None,
                           exec_strategy: ExecutionStrategy | None = None,
                           share_vars_from: CompiledProgram | None = None,
                           places: Any = None) -> CompiledProgram:
        """Paddle's data-parallel compilation, on one place here: more than one place is a
        ValueError, a second call an AssertionError as in Paddle."""
        assert not self._is_data_parallel, "Already compiled with data parallel."
        _one_place(places)
        self._is_data_parallel = True
        self._loss_name = loss_name
        self._build_strategy = build_strategy or self._build_strategy
        self._exec_strategy = exec_strategy
        return self


class ParallelExecutor:
    """Paddle's ``fluid.ParallelExecutor``, on one device: ``CUDAPlace(0)`` with `use_cuda`,
    else the CPU. `run(fetch_list, feed)` runs `main_program` (the default main program when
    made) once in `scope` (``global_scope()``; `share_vars_from`'s, if given) with a
    ``fluid.Executor`` and returns the fetched values, as ``Executor.run`` would. `loss_name`,
    the strategies, `num_trainers` and `trainer_id` are kept (Paddle's collective training;
    the parameter-server job's trainers are the ones its programs name)."""

    def __init__(self, use_cuda: bool, loss_name: str | None = None,
                 main_program: Program | None = None,
                 share_vars_from: ParallelExecutor | None = None,
                 exec_strategy: ExecutionStrategy | None = None,
                 build_strategy: BuildStrategy | None = None, num_trainers: int = 1,
                 trainer_id: int = 0, scope: Scope | None = None) -> None:
        if share_vars_from is not None and not isinstance(share_vars_from, ParallelExecutor):
            raise TypeError("share_vars_from must be a ParallelExecutor")
        self.place: CPUPlace | CUDAPlace = CUDAPlace(0) if use_cuda else CPUPlace()
        self.program = main_program if main_program is not None else default_main_program()
        if share_vars_from is not None:
            scope = share_vars_from.scope
        self.scope: Scope = scope if scope is not None else global_scope()
        self.loss_name = loss_name
        self.exec_strategy = exec_strategy or ExecutionStrategy()
        self.build_strategy = build_strategy or BuildStrategy()
        self.build_strategy.num_trainers = num_trainers
        self.build_strategy.trainer_id = trainer_id
        self.executor = FluidExecutor(self.place)

    @property
    def device_count(self) -> int:
        """The devices the program runs on: one."""
        return 1

    def run(self, fetch_list: Iterable[Var | str], feed: Any = None,
            feed_dict: Mapping[str, Any] | None = None, return_numpy: bool = True) -> list[Any]:
        """One run of the program: `feed` is a dict of var name to value (or a list of one
        such dict, one per device as Paddle takes it); `feed_dict` is its old name."""
        if feed is None:
            feed = feed_dict
        if isinstance(feed, Sequence) and not isinstance(feed, (str, bytes)):
            if len(feed) != 1:
                raise ValueError(f"ParallelExecutor.run: {len(feed)} feeds, one per device; "
                                 "this executor has one device")
            feed = feed[0]
        return self.executor.run(self.program, feed, fetch_list, self.scope, return_numpy)

    def drop_local_exe_scopes(self) -> None:
        """Paddle frees its per-device scopes; there are none here."""


__all__ = ["BuildStrategy", "CompiledProgram", "ExecutionStrategy", "GradientScaleStrategy",
           "ParallelExecutor", "ReduceStrategy"]
