"""``fluid.profiler`` for a ported script: how long each op type's kernels took.

`start_profiler(state)` (or ``with profiler(state, sorted_key, profile_path):``) hands a timer
to every ``fluid.Executor`` (`runtime.services.paddle_compat.profile_kernels`), whose kernels
then report each call's wall time (`time.perf_counter`) to it through the executor's kernel
timer (`runtime.execution.executor.timed_binder`, as `runtime profile` times kernels);
`stop_profiler(sorted_key, profile_path)` takes it back and prints Paddle's table: one row per
op type, its calls and the total, least, largest and mean milliseconds of a call, and its share
of the time of all calls. Runs of a ``ParallelExecutor`` or a ``CompiledProgram`` are its
executor's and count alike; so do a trainer's steps (the kernels of its program; the RPC ops'
waiting is not a kernel and is not counted). A control-flow op's time includes the ops of the
sub-blocks it ran, which have their own rows too. Without a profiler running the kernels are
not wrapped and nothing is measured.

Differences from Paddle: ``profile_path`` receives the same table as text (Paddle writes a
protobuf of events for its timeline tool, and does so by default to ``/tmp/profile``; here
nothing is written unless a path is given); ``state`` is checked but every state times the same
kernels on the host's clock ('GPU' adds no CUDA events); `cuda_profiler` runs its body without
nvprof.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from transpiler.ir import Op

from runtime.config.atomic import write_atomic
from runtime.execution.scope import Scope
from runtime.services.paddle_compat import profile_kernels

STATES = ("CPU", "GPU", "All")
SORTED_KEYS = ("calls", "total", "max", "min", "ave")
"""`stop_profiler`'s orders besides the default (None: the order of each op type's first call);
each sorts its column from the largest down, as Paddle does."""
COLUMNS = ("Event", "Calls", "Total", "Min.", "Max.", "Ave.", "Ratio.")


@dataclass
class OpTimes:
    """The kernel calls of one op type while profiling, in seconds."""

    calls: int = 0
    total: float = 0.0
    min: float = math.inf
    max: float = 0.0

    @property
    def ave(self) -> float:
        return self.total / self.calls if self.calls else 0.0

    def add(self, seconds: float) -> None:
        self.calls += 1
        self.total += seconds
        self.min = min(self.min, seconds)
        self.max = max(self.max, seconds)


class OpProfile:
    """A `runtime.execution.executor.KernelTimer` that keeps each op type's `OpTimes`, by
    first call, on the wall clock."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, state: str = "CPU") -> None:
        self.state = state
        self.ops: dict[str, OpTimes] = {}

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        times = self.ops.get(op.type)
        if times is None:
            times = self.ops[op.type] = OpTimes()
        times.add(seconds)

    def table(self, sorted_key: str | None = None) -> str:
        """Paddle's report: a header, then a row per op type in `sorted_key`'s order (times in
        milliseconds)."""
        rows = list(self.ops.items())
        if sorted_key is not None:
            rows.sort(key=lambda row: getattr(row[1], sorted_key), reverse=True)
        order = "the order of first calls" if sorted_key is None else \
            f"{sorted_key} in descending order"
        everything = sum(times.total for _, times in rows) or 1.0
        width = max([len(COLUMNS[0]), *(len(name) for name, _ in rows)]) + 2
        lines = ["-------------------------     Profiling Report     -------------------------",
                 "", f"Place: {self.state}", "Time unit: ms", f"Sorted by {order}", "",
                 COLUMNS[0].ljust(width) + "".join(c.rjust(12) for c in COLUMNS[1:])]
        for name, t in rows:
            cells = [str(t.calls), *(f"{seconds * 1e3:.5f}" for seconds in
                                     (t.total, t.min, t.max, t.ave)), f"{t.total / everything:.6f}"]
            lines.append(name.ljust(width) + "".join(cell.rjust(12) for cell in cells))
        return "\n".join(lines) + "\n"


_running: OpProfile | None = None


def start_profiler(state: str) -> None:
    """Start timing every executor's kernels (nothing happens if a profiler is running already).
    `state` is 'CPU', 'GPU' or 'All' (ValueError otherwise)."""
    global _running
    if state not in STATES:
        raise ValueError("The state must be 'CPU' or 'GPU' or 'All'.")
    if _running is not None:
        return
    _running = OpProfile(state)
    profile_kernels(_running)


def stop_profiler(sorted_key: str | None = None, profile_path: str | Path | None = None) -> None:
    """Stop timing, print the table sorted by `sorted_key` (None, or one of `SORTED_KEYS`:
    ValueError otherwise), and write it to `profile_path` if one is given. Does nothing if no
    profiler is running."""
    global _running
    if sorted_key is not None and sorted_key not in SORTED_KEYS:
        raise ValueError("The sorted_key must be None or in 'calls', 'total', 'max', 'min' "
                         "and 'ave'")
    profile, _running = _running, None
    if profile is None:
        return
    profile_kernels(None)
    report = profile.table(sorted_key)
    print(report, end="", flush=True)
    if profile_path is not None:
        write_atomic(Path(profile_path), report)


def reset_profiler() -> None:
    """Forget the times recorded so far (the profiler, if running, goes on)."""
    if _running is not None:
        _running.ops.clear()


@contextmanager
def profiler(state: str, sorted_key: str | None = None,
             profile_path: str | Path | None = None) -> Iterator[None]:
    """`start_profiler(state)` for the body, then `stop_profiler(sorted_key, profile_path)`
    (also when the body raises)."""
    start_profiler(state)
    try:
        yield
    finally:
        stop_profiler(sorted_key, profile_path)


@contextmanager
def cuda_profiler(output_file: str, output_mode: str | None = None,
                  config: list[str] | None = None) -> Iterator[None]:
    """Paddle's nvprof range: here the body just runs, and nothing is written to `output_file`
    (pslab's kernels run on the CPU, or on a GPU through torch, with no nvprof hooks; use
    `profiler` for op times). `output_mode` is checked as Paddle does: 'kvp' or 'csv'."""
    if output_mode not in (None, "kvp", "csv"):
        raise ValueError("The output mode must be 'kvp' or 'csv'.")
    yield


__all__ = ["OpProfile", "OpTimes", "cuda_profiler", "profiler", "reset_profiler",
           "start_profiler", "stop_profiler"]
