"""The executor: runs a program's block 0 op by op over a `Scope`, kernels doing the work.

A block is first turned into a `BlockPlan` (each op with its kernel and a "block b, op i (type)"
label for errors), cached per program and rebuilt when the block's list of ops or their types
change; executors whose kernels need no binding share one cache per backend. Kernels read slot names and attributes from the op itself, so renaming an op's vars in
place needs no re-planning. A backend with devices (torch: cpu or cuda) binds each kernel of a
plan to the executor's device.

RPC ops (send, recv, barriers, prefetch, ...) get no kernel in the plan: they are awaited by the
async runtime, which runs the same plans with `run_step` for the compute ops. `Executor.run`
refuses a block that holds any (`AsyncOpError`); `runtime.services.paddle_compat.FluidExecutor`
(Paddle's ``fluid.Executor``) runs such programs through the trainer and pserver services.

A distributed table's fused prefetch chain (one `split_ids` and one `merge_ids` for every
lookup of the table, as the transpiler writes the programs of every release) is planned with
`fused_ids_kernel`, which runs the backend's one-ids kernels over all the lookups.

`run_block` may run some ops with attributes over their own (`AttrOverrides`, by block and op
index): a copy of the op is given to the kernel, the program is never edited (a sync pserver
averages over the trainers that contributed to a round this way).

With the ``phantom`` backend (timing mode) feeds may be `Phantom`s, checked against their
declarations like arrays, and fetches return phantoms as they are.

Profiling (`runtime.launch.profile`): an executor given a `KernelTimer`, or made inside
``with timing_kernels(timer):`` (how the executors that `runtime.services.cluster` makes are
reached), wraps each kernel of its plans so that every call's real duration (`time.perf_counter`,
not the loop's clock, or the timer's own ``clock``: `runtime profile` measures CPU time) is reported
to the timer. A control-flow op's duration includes the ops of the
sub-blocks it ran. Without a timer the kernels are not wrapped and nothing is measured.
"""

from __future__ import annotations

import importlib
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, cast

import numpy as np

from transpiler.ir import Block, Op, Program, Var
from transpiler.opcatalog import runs_rpc

from runtime.execution.kernels import (BACKENDS, AsyncOpError, ExecutionError, FeedError,
                                       FetchError, KernelContext, KernelError, KernelNotFound,
                                       get_kernel, load_backend)
from runtime.execution.kernels.registry import Kernel
from runtime.execution.scope import Scope, global_scope
from runtime.execution.tensor import LoDTensor, Phantom, TensorError, Value, copy_value, to_dense


FeedValue = Any
"""A fed value: an array-like, a `LoDTensor`, or an ``(array, lod)`` tuple."""
Fingerprint = tuple[tuple[int, str], ...]
AttrOverrides = Mapping[tuple[int, int], Mapping[str, Any]]
"""(block index, op index) -> attributes that op runs with instead of its own."""
Binder = Callable[[Kernel], Kernel]
"""Makes a backend's kernel run on a device."""


@dataclass(frozen=True)
class OpStep:
    """One op of a plan; `kernel` is None for an RPC op (run by the async runtime)."""

    index: int
    op: Op
    kernel: Kernel | None
    where: str


@dataclass(frozen=True)
class BlockPlan:
    block_idx: int
    fingerprint: Fingerprint
    steps: tuple[OpStep, ...]
    rpc_steps: tuple[OpStep, ...]


def fingerprint(block: Block) -> Fingerprint:
    """Identity and type of every op: what a plan depends on."""
    return tuple((id(op), op.type) for op in block.ops)


def device_binder(backend: str, device: str, local_index: int = 0) -> Binder:
    """How `backend` kernels run on `device`, from the backend module's ``on_device(device,
    local_index)`` (which fails at once if the device cannot be used; `local_index` picks the GPU
    of ``cuda:local``); a backend without one is CPU-only."""
    on_device = getattr(importlib.import_module(BACKENDS[backend]), "on_device", None)
    if on_device is not None:
        return cast(Binder, on_device(device, local_index))
    if device != "cpu":
        raise ValueError(f"backend {backend} runs on the cpu only, not device {device!r}")
    return _unbound


def _unbound(kernel: Kernel) -> Kernel:
    return kernel


def set_kernel_threads(backend: str, threads: int) -> None:
    """Cap the threads `backend`'s kernels use in this process (its ``set_threads``; numpy's
    BLAS reads ``OMP_NUM_THREADS`` and the like at start, so it has none)."""
    set_threads = getattr(importlib.import_module(BACKENDS[backend]), "set_threads", None)
    if set_threads is not None:
        set_threads(threads)


class KernelTimer(Protocol):
    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        """A kernel ran `op` (its outputs now in `scope`) in `seconds` of real time."""
        ...


_ambient_timer: ContextVar[KernelTimer | None] = ContextVar("kernel_timer", default=None)


@contextmanager
def timing_kernels(timer: KernelTimer) -> Iterator[None]:
    """Every `Executor` made inside the block (or in tasks started from it) without a timer of
    its own reports its kernel calls to `timer`."""
    token = _ambient_timer.set(timer)
    try:
        yield
    finally:
        _ambient_timer.reset(token)


def timed_binder(bind: Binder, timer: KernelTimer) -> Binder:
    """`bind`, then wrap the kernel so that each call's duration is reported to `timer`, on
    the timer's ``clock`` where it has one (else `time.perf_counter`)."""
    clock: Callable[[], float] = getattr(timer, "clock", time.perf_counter)

    def bind_timed(kernel: Kernel) -> Kernel:
        bound = bind(kernel)

        def run(ctx: KernelContext) -> None:
            start = clock()
            bound(ctx)
            timer.record(ctx.op, ctx.scope, clock() - start)
        return run
    return bind_timed


FUSED_IDS_SUFFIX = "@FUSED_IDS"
"""The scope var a fused `split_ids` gathers its lookups' ids in (`fused_ids_kernel`)."""


def fused_ids_kernel(op: Op, backend: str, bind: Binder) -> Kernel | None:
    """The kernel of a distributed table's fused prefetch chain op (every release's: one
    `split_ids` and one `merge_ids` for every lookup of the table, each lookup's ids an ``Ids``
    and, for `merge_ids`, its out an ``Out``), or None for any other op. The backends' kernels
    take one ids var, so the fused `split_ids` cuts the `concat` of all the ids (the same set of
    ids per pserver, each once) and the fused `merge_ids` runs once per lookup over the same
    answered rows: what the original's fused kernels computed."""
    if op.type not in ("split_ids", "merge_ids") or len(op.inputs.get("Ids", ())) < 2:
        return None
    kernel = bind(get_kernel(op.type, backend))
    if op.type == "merge_ids":
        return lambda ctx: _merge_each(ctx, kernel)
    concat = bind(get_kernel("concat", backend))
    return lambda ctx: _split_joined(ctx, kernel, concat)


def _merge_each(ctx: KernelContext, kernel: Kernel) -> None:
    for ids, out in zip(ctx.op.input("Ids"), ctx.op.output("Out")):
        single = Op("merge_ids", {**ctx.op.inputs, "Ids": [ids]}, {"Out": [out]},
                    dict(ctx.op.attrs))
        kernel(KernelContext(single, ctx.scope, ctx.where, ctx.program))


def _split_joined(ctx: KernelContext, kernel: Kernel, concat: Kernel) -> None:
    joined = ctx.op.output("Out")[0] + FUSED_IDS_SUFFIX
    gather = Op("concat", {"X": ctx.op.input("Ids")}, {"Out": [joined]}, {"axis": 0})
    concat(KernelContext(gather, ctx.scope, ctx.where, ctx.program))
    single = Op("split_ids", {"Ids": [joined]}, dict(ctx.op.outputs), dict(ctx.op.attrs))
    kernel(KernelContext(single, ctx.scope, ctx.where, ctx.program))


def build_plan(block: Block, backend: str, bind: Binder = _unbound) -> BlockPlan:
    steps = []
    for i, op in enumerate(block.ops):
        where = f"block {block.idx}, op {i} ({op.type})"
        kernel = None
        if not runs_rpc(op):
            try:
                kernel = fused_ids_kernel(op, backend, bind) or bind(get_kernel(op.type, backend))
            except KernelNotFound:
                raise KernelNotFound(op.type, backend, where) from None
        steps.append(OpStep(i, op, kernel, where))
    rpc = tuple(s for s in steps if s.kernel is None)
    return BlockPlan(block.idx, fingerprint(block), tuple(steps), rpc)


class PlanCache:
    """Block plans per live program (held weakly), rebuilt when a block's ops change."""

    def __init__(self, backend: str, bind: Binder = _unbound) -> None:
        self.backend = backend
        self.bind = bind
        self._programs: dict[int, tuple[weakref.ref[Program], dict[int, BlockPlan]]] = {}

    def get(self, program: Program, block_idx: int) -> BlockPlan:
        key = id(program)
        entry = self._programs.get(key)
        if entry is None or entry[0]() is not program:
            entry = (weakref.ref(program, _forget(self._programs, key)), {})
            self._programs[key] = entry
        plans = entry[1]
        block = program.blocks[block_idx]
        plan = plans.get(block_idx)
        if plan is None or plan.fingerprint != fingerprint(block):
            plan = plans[block_idx] = build_plan(block, self.backend, self.bind)
        return plan


_SHARED: dict[str, PlanCache] = {}


def _shared_plans(backend: str) -> PlanCache:
    """The plan cache of every executor whose `backend` kernels run unbound (no device, no
    timer): a plan is then of the program alone, and the trainers of one process (the
    simulator's thousand) run the same programs, whose plans are made once."""
    plans = _SHARED.get(backend)
    if plans is None:
        plans = _SHARED[backend] = PlanCache(backend)
    return plans


def _forget(programs: dict[int, Any], key: int) -> Callable[[weakref.ref[Program]], None]:
    def drop(ref: weakref.ref[Program]) -> None:
        if key in programs and programs[key][0] is ref:
            del programs[key]
    return drop


def run_step(step: OpStep, scope: Scope, program: Program,
             run_block: Callable[[int], None]) -> None:
    """Run one compute op; an exception from its kernel becomes a `KernelError` naming the op."""
    run_steps((step,), scope, program, run_block)


def run_steps(steps: Iterable[OpStep], scope: Scope, program: Program,
              run_block: Callable[[int], None]) -> None:
    """`run_step` over compute ops in order, in one loop (no call per op besides its kernel's)."""
    step: OpStep | None = None
    try:
        for step in steps:
            step.kernel(KernelContext(step.op, scope, step.where, program, run_block))  # type: ignore[misc]
    except ExecutionError:
        raise
    except Exception as exc:
        assert step is not None
        if step.kernel is None:
            raise AssertionError(f"{step.where}: an RPC op has no kernel") from None
        raise KernelError(f"{step.where}: {type(exc).__name__}: {exc}") from exc


class Executor:
    def __init__(self, backend: str = "numpy", device: str = "cpu",
                 timer: KernelTimer | None = None, local_index: int = 0) -> None:
        load_backend(backend)
        self.backend = backend
        self.device = device
        self.timer = timer if timer is not None else _ambient_timer.get()
        bind = device_binder(backend, device, local_index)
        if self.timer is not None:
            bind = timed_binder(bind, self.timer)
        self.plans = _shared_plans(backend) if bind is _unbound else PlanCache(backend, bind)

    def run(self, program: Program, feed: Mapping[str, FeedValue] | None = None,
            fetch_list: Iterable[Var | str] | None = None, scope: Scope | None = None,
            return_numpy: bool = True) -> list[Any]:
        """Feed, run block 0 (and the sub-blocks its ops call), return the fetched values:
        numpy arrays with `return_numpy`, else the stored values (LoDTensor keeps its LoD)."""
        scope = global_scope() if scope is None else scope
        names = [_fetch_name(program, scope, item) for item in fetch_list or ()]
        block = program.global_block()
        fed = {name: check_feed(block, name, value) for name, value in (feed or {}).items()}
        for name, value in fed.items():
            scope.put(name, value)
        self.run_block(program, 0, scope)
        return [_fetch(scope, name, return_numpy) for name in names]

    def run_block(self, program: Program, block_idx: int, scope: Scope,
                  overrides: AttrOverrides | None = None, keep_locals: bool = False) -> None:
        """Run block `block_idx`'s ops (those `overrides` names with its attributes); a
        sub-block's own non-persistable vars are dropped from `scope` after it ran, unless
        `keep_locals` (a caller that still reads them, then drops `block_locals` itself)."""
        plan = self.plans.get(program, block_idx)
        if plan.rpc_steps:
            raise AsyncOpError(rpc_refusal(plan.rpc_steps))

        def run_sub(idx: int) -> None:
            self.run_block(program, idx, scope)

        steps: Sequence[OpStep] = plan.steps
        if overrides:
            steps = [step if (attrs := overrides.get((block_idx, step.index))) is None
                     else _with_attrs(step, attrs) for step in steps]
        run_steps(steps, scope, program, run_sub)
        if block_idx != 0 and not keep_locals:
            scope.drop(block_locals(program.blocks[block_idx]))


def block_locals(block: Block) -> list[str]:
    """The vars a sub-block declares that live only while it runs (its non-persistable ones),
    as in Paddle, where a sub-block runs in a child scope dropped after it."""
    return [name for name, var in block.vars.items() if not var.persistable]


def rpc_refusal(rpc_steps: tuple[OpStep, ...]) -> str:
    """Why `Executor.run` refuses a block with RPC ops, and what runs such a program."""
    kinds = sorted({s.op.type for s in rpc_steps})
    return (f"{rpc_steps[0].where}: RPC ops need the async runtime; Executor.run only runs "
            f"compute ops, and this block has {len(rpc_steps)} RPC op(s) ({', '.join(kinds)}). "
            "A transpiled trainer or pserver program (send, recv, barriers, listen_and_serv, "
            "...) runs under the runtime's services, which talk to the other nodes: describe "
            "the job in a scenario and run `runtime up SCENARIO` (every node as a process; "
            "`--role trainer --index I` for one node) or `sim run SCENARIO` (simulated); in "
            "Python, `runtime.services.cluster.run_job(Job.from_scenario(scenario), "
            "ZmqTransport)`; or, as in a Paddle script, `runtime.paddle.fluid.Executor`, which "
            "runs a trainer's or a pserver's program itself. Executor.run takes the program "
            "before transpiling (local training).")


def _with_attrs(step: OpStep, attrs: Mapping[str, Any]) -> OpStep:
    """`step` running a copy of its op with `attrs` over the op's own."""
    op = step.op
    return replace(step, op=Op(op.type, op.inputs, op.outputs, {**op.attrs, **attrs}))


def check_feed(block: Block, name: str, value: FeedValue) -> Value:
    """The value to store for a fed var, checked against its declaration (copied)."""
    var = block.vars.get(name)
    if var is None:
        raise FeedError(f"feed var {name!r} is not declared in the program's global block")
    if isinstance(value, Phantom):
        _check_fits(var, name, value.dtype, value.shape)
        return value
    data, lod = _split_feed(name, value)
    expected = np.dtype(var.dtype)
    array = np.array(data, copy=True) if isinstance(data, np.ndarray) else np.array(data, dtype=expected)
    _check_fits(var, name, array.dtype, array.shape)
    if not lod:
        return array
    try:
        return LoDTensor(array, lod)
    except TensorError as exc:
        raise FeedError(f"feed var {name!r}: {exc}") from None


def _check_fits(var: Var, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    if dtype != np.dtype(var.dtype):
        raise FeedError(f"feed var {name!r}: expected dtype {var.dtype}, got {dtype}")
    if len(shape) != len(var.shape) or any(e not in (-1, a) for e, a in zip(var.shape, shape)):
        raise FeedError(f"feed var {name!r}: expected shape {list(var.shape)} (-1: any), "
                        f"got {list(shape)}")


def _split_feed(name: str, value: FeedValue) -> tuple[Any, list[list[int]]]:
    """(data, lod) of a fed array, LoDTensor or (array, lod) tuple."""
    if isinstance(value, LoDTensor):
        return value.data, value.lod
    if isinstance(value, tuple):
        if len(value) != 2:
            raise FeedError(f"feed var {name!r}: a tuple must be (array, lod), got {len(value)} items")
        return value[0], list(value[1])
    return value, []


def _fetch_name(program: Program, scope: Scope, item: Var | str) -> str:
    name = item.name if isinstance(item, Var) else str(item)
    if name not in scope and not any(b.has_var(name) for b in program.blocks):
        raise FetchError(f"fetch var {name!r} is not declared in the program nor held by the scope")
    return name


def _fetch(scope: Scope, name: str, return_numpy: bool) -> Any:
    if name not in scope:
        raise FetchError(f"fetch var {name!r} has no value after the run (no op wrote it)")
    value = scope.get_tensor(name)
    if isinstance(value, Phantom):
        return value
    return np.array(to_dense(value), copy=True) if return_numpy else copy_value(value)


__all__ = ["AttrOverrides", "Binder", "BlockPlan", "Executor", "KernelTimer", "OpStep", "PlanCache",
           "build_plan", "check_feed", "device_binder", "fingerprint", "run_step", "run_steps",
           "set_kernel_threads",
           "timed_binder",
           "timing_kernels"]
