"""A virtual-time asyncio event loop: the simulator's clock.

The runtime does all its waiting through the running asyncio loop (`asyncio.sleep`,
`wait_for`, `asyncio.timeout`, `loop.call_later`, `loop.time()`). `VirtualTimeLoop` is that
loop with the wall clock taken out: `time()` starts at 0.0 and only moves when nothing is
ready to run, by jumping straight to the earliest pending timer. A one-hour `sleep` costs no
wall time, and the real runtime code runs unchanged, in one process, under simulated time.

Determinism. One thread; ready callbacks run first-in first-out; timers are ordered by
`(when, seq)`, where `seq` is the order of `call_at` calls, so timers due at the same virtual
time run in the order they were scheduled (SimPy's `(time, priority, seq)` rule without a
priority). They are kept so: a heap of the distinct due times (bare floats, which compare
several times faster than tuples; a heap of 100,000 timers is common at scale), each with the
list of its timers in scheduling order.
Nothing reads the wall clock or depends on hash order, so the same program gives the same
trace byte for byte.

Deadlock. When nothing is ready, no timer is pending and the loop was not asked to stop, no
event can ever happen again: a real loop would block forever. This loop raises `SimDeadlock`
instead, listing every pending task with its await chain and the note that higher layers
attach with `waiting_on(...)` / `annotate(...)` (node name, and what the task waits for).

Failing fast. A simulation is a test of the runtime, so an error nobody handles must end it
rather than scroll past in a log. Where a stock loop passes an exception to its exception
handler and goes on, this loop stops: a callback that raises stops it at once with
`SimCallbackError`; an exception that asyncio finds nobody retrieved (a task or future that
failed and was dropped unawaited, or an async generator that failed while being closed) stops
it at the end of the batch in progress with `SimLostError`, as does, at `shutdown()`, a finished
task still referenced whose exception nothing retrieved, or a leftover task that failed when
cancelled. Each names the callback or the task (and the node its note gives) and the virtual
time, and chains the original exception, traceback included, as its `__cause__`. Cancellation
is not an error: a cancelled task is never a lost one. Contexts without an exception ("Task was
destroyed but it is pending!") still go to the exception handler.

Holding. `hold(var, value)` makes every callback of a context where the context variable
`var` is `value` (a timer come due, a task's step, a future's callback) wait, when its turn
comes, until `release(value)`, then run late in the order they came: the pause fault stops one
node of a simulated cluster this way (its tasks, and what they schedule, run in a context
naming it). Without a hold the check costs one comparison per callback.

No real I/O. There is no selector: sockets, pipes, subprocesses and signals raise
`SimUnsupportedError` (the simulator's network is a `Transport`, not a socket).
`run_in_executor` (hence `asyncio.to_thread`) calls the function inline, at the current virtual
time. Other threads cannot wake the loop: when it is idle it reports a deadlock.

Speed. A large simulation is millions of callbacks, so the loop's own cost per callback
counts. Its handles skip what only debug mode needs (`_Handle`, `_Timer`); a `run_forever`
stays inside one `_run_once` call, batch after batch, until it is stopped; callbacks run
inline rather than through `Handle._run`; and tasks are remembered, for deadlock reports, by
weak references without callbacks. In debug mode the stock asyncio handles are made instead.

DESIGN: why subclass `asyncio.BaseEventLoop`. Futures, Tasks, `sleep`, `wait_for`,
`asyncio.timeout`, `gather`, `Queue`, `Event`, async generators and `run_until_complete` only
need `call_soon`, `call_at`, `time`, `create_future` and `create_task` from a loop, and
BaseEventLoop already implements all of them (plus task factories, exception handlers and
async-generator bookkeeping) on top of two data structures: the `_ready` deque and a timer
heap. Reusing it keeps the semantics identical to the stock loop; only `time()`, `call_at`
(to order timers by `(when, seq)`, in its own timer store) and `_run_once` (jump instead of
`select`) change. This is
trio's `MockClock` idea ("jump when every task waits") applied to asyncio.

asyncio internals. Subclassing, and the speed-ups above, rest on these private parts of
CPython's asyncio, which no release promises to keep; the loop checks at import that each is
there (`_check_internals`) and refuses, naming the missing one, on a Python that lacks it.
`requires-python` is bounded to the versions the loop's tests ran on (`TESTED_PYTHONS`): 3.11
(CI), and 3.12.1 and 3.13.0, on which tests/sim/test_sim_loop.py and tests/sim/test_sim_run.py passed.

- `BaseEventLoop._ready`: the deque of ready handles, appended to and run from here.
- `BaseEventLoop._stopping`: set by `stop()`; `_run_once` returns when it is.
- `BaseEventLoop._closed`: `call_soon`/`call_at` refuse on a closed loop.
- `BaseEventLoop._debug`: debug mode makes stock handles.
- `BaseEventLoop._timer_cancelled_count`: counts cancelled timers; purged here.
- `BaseEventLoop._timer_handle_cancelled()`: what `TimerHandle.cancel()` calls to count it.
- `BaseEventLoop._check_closed()`: `run_in_executor` refuses on a closed loop.
- `BaseEventLoop._run_once()`: overridden; `run_forever()` calls it until stopped.
- `BaseEventLoop._write_to_self()`: overridden (nothing to wake); `call_soon_threadsafe()`
  calls it.
- `Handle._callback`, `Handle._args`, `Handle._context`, `Handle._cancelled`: read to run a
  handle inline; with `Handle._loop`, `Handle._repr` and `Handle._source_traceback`, set by
  `_Handle` and `_Timer` without `Handle.__init__`.
- `TimerHandle._when`, `TimerHandle._scheduled`: set by `_Timer`; `_scheduled` is cleared when a
  timer leaves the store, as `BaseEventLoop` does.
- `Task._fut_waiter`: the future a suspended task waits on (deadlock reports).
- `Future._log_traceback`: whether a finished task's exception is still unretrieved (`shutdown`).
- `asyncio._get_running_loop()`: `run()` refuses to nest.
- `format_helpers._format_callback_source()`: how a failed callback is named.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import os
import platform
import sys
import warnings
import weakref
from asyncio import format_helpers
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, TypeVar, TypeVarTuple, Unpack, cast

__all__ = [
    "SimCallbackError",
    "SimDeadlock",
    "SimError",
    "SimLostError",
    "SimNestedRunError",
    "SimStats",
    "SimStepLimit",
    "SimTimeLimit",
    "SimUnsupportedError",
    "TaskNote",
    "TaskWait",
    "VirtualTimeLoop",
    "annotate",
    "run",
    "task_note",
    "waiting_on",
]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

TESTED_PYTHONS = "3.11 to 3.13"
"""The Python versions whose asyncio the loop's tests ran on (pyproject's `requires-python`)."""


def _uses(function: Callable[..., Any], name: str) -> Callable[[], bool]:
    """A check that `function`'s code names `name` (an attribute it sets or a method it calls)."""
    return lambda: name in function.__code__.co_names


def _has(owner: object, name: str) -> Callable[[], bool]:
    return lambda: hasattr(owner, name)


def _slot(cls: type, name: str) -> tuple[str, Callable[[], bool]]:
    """`cls.name` as a slot of `cls` itself (a subclass with `__slots__ = ()` sets it)."""
    return f"{cls.__name__}.{name}", lambda: name in getattr(cls, "__slots__", ())


_Base = asyncio.BaseEventLoop
_INTERNALS: tuple[tuple[str, Callable[[], bool]], ...] = (
    ("BaseEventLoop._ready", _uses(_Base.__init__, "_ready")),
    ("BaseEventLoop._stopping", _uses(_Base.__init__, "_stopping")),
    ("BaseEventLoop._closed", _uses(_Base.__init__, "_closed")),
    ("BaseEventLoop._debug", _uses(_Base.set_debug, "_debug")),
    ("BaseEventLoop._timer_cancelled_count", _uses(_Base.__init__, "_timer_cancelled_count")),
    ("BaseEventLoop._timer_handle_cancelled", _uses(asyncio.TimerHandle.cancel,
                                                    "_timer_handle_cancelled")),
    ("BaseEventLoop._check_closed", _has(_Base, "_check_closed")),
    ("BaseEventLoop._run_once", _uses(_Base.run_forever, "_run_once")),
    ("BaseEventLoop._write_to_self", _uses(_Base.call_soon_threadsafe, "_write_to_self")),
    *(_slot(asyncio.Handle, slot) for slot in ("_callback", "_args", "_context", "_cancelled",
                                               "_loop", "_repr", "_source_traceback")),
    *(_slot(asyncio.TimerHandle, slot) for slot in ("_when", "_scheduled")),
    ("Task._fut_waiter", _has(asyncio.Task, "_fut_waiter")),
    ("Future._log_traceback", _has(asyncio.Future, "_log_traceback")),
    ("asyncio._get_running_loop", _has(asyncio, "_get_running_loop")),
    ("format_helpers._format_callback_source", _has(format_helpers, "_format_callback_source")),
)
"""The private parts of asyncio the loop rests on (the module doc says what each is for)."""


def _check_internals() -> None:
    """Refuse to load on a Python whose asyncio lacks one of `_INTERNALS`, naming it."""
    missing = [name for name, present in _INTERNALS if not present()]
    if missing:
        raise ImportError(
            f"sim.loop: the asyncio of Python {platform.python_version()} lacks "
            f"{', '.join(missing)}, which the virtual-time loop relies on; "
            f"it is tested on Python {TESTED_PYTHONS}"
        )


_check_internals()

# Rebuild the timer heap once this many cancelled timers make up more than half of it.
_PURGE_MIN_CANCELLED = 100


class SimError(RuntimeError):
    """Base of the errors the simulator's loop raises."""


class SimDeadlock(SimError):
    """Nothing is ready, no timer is pending, and tasks still wait: no event can ever come."""

    def __init__(self, now: float, waits: list[TaskWait]) -> None:
        self.now = now
        self.waits = waits
        lines = [
            f"deadlock at t={now!r}: nothing is ready and no timer is pending, "
            f"but {len(waits)} task(s) still wait:"
        ]
        lines += [f"  {wait}" for wait in waits]
        super().__init__("\n".join(lines))


class SimTimeLimit(SimError):
    """The next event lies past the loop's `max_time`."""

    def __init__(self, now: float, limit: float, next_when: float) -> None:
        self.now = now
        self.limit = limit
        self.next_when = next_when
        super().__init__(
            f"virtual time limit max_time={limit!r} reached at t={now!r}: "
            f"the next timer is due at t={next_when!r}"
        )


class SimStepLimit(SimError):
    """The loop has run `max_steps` callbacks and still has work."""

    def __init__(self, now: float, limit: int) -> None:
        self.now = now
        self.limit = limit
        super().__init__(
            f"step limit max_steps={limit} reached at t={now!r}: "
            "the loop still has work (a task may be spinning without sleeping)"
        )


class SimCallbackError(SimError):
    """A callback raised: the simulation stops (the exception is the `__cause__`)."""

    def __init__(self, now: float, callback: str, error: BaseException) -> None:
        self.now = now
        self.callback = callback
        self.error = error
        super().__init__(
            f"callback {callback} raised {type(error).__name__} at t={now!r}: {error}")


class SimLostError(SimError):
    """An exception nothing retrieved (a dropped task's, say): the simulation stops (the
    exception is the `__cause__`)."""

    def __init__(self, now: float, what: str, error: BaseException) -> None:
        self.now = now
        self.what = what
        self.error = error
        super().__init__(f"{what} at t={now!r}: {type(error).__name__}: {error}")


class SimNestedRunError(SimError):
    """`run()` was called while an event loop is already running in this thread."""


class SimUnsupportedError(SimError, NotImplementedError):
    """The virtual-time loop was asked for real I/O (sockets, pipes, processes, signals)."""


@dataclass(frozen=True, slots=True)
class TaskNote:
    """What a higher layer says about a task: the node it runs for and what it waits on."""

    node: str | None = None
    what: str | None = None


@dataclass(frozen=True, slots=True)
class TaskWait:
    """One pending task in a deadlock report."""

    task: str
    note: TaskNote
    stack: tuple[str, ...]

    def __str__(self) -> str:
        head = repr(self.task)
        if self.note.node is not None:
            head += f" [{self.note.node}]"
        if self.note.what is not None:
            head += f" waiting on: {self.note.what}"
        return f"{head}\n      at " + " -> ".join(self.stack)


@dataclass(slots=True)
class SimStats:
    """Counters for benchmarks: callbacks run, timers fired, clock jumps."""

    callbacks: int = 0
    timers: int = 0
    jumps: int = 0


_NOTES: weakref.WeakKeyDictionary[asyncio.Task[Any], TaskNote] = weakref.WeakKeyDictionary()


def _current_task(task: asyncio.Task[Any] | None, caller: str) -> asyncio.Task[Any]:
    found = task if task is not None else asyncio.current_task()
    if found is None:
        raise RuntimeError(f"{caller}() must be called from inside a task, or be given task=")
    return found


def task_note(task: asyncio.Task[Any]) -> TaskNote:
    """The note attached to `task` (empty if none)."""
    return _NOTES.get(task, TaskNote())


def annotate(
    *, node: str | None = None, what: str | None = None, task: asyncio.Task[Any] | None = None
) -> None:
    """Set the node and/or wait description of `task` (default: the current task).

    Fields left as None keep their previous value.
    """
    target = _current_task(task, "annotate")
    old = task_note(target)
    _NOTES[target] = TaskNote(
        node=old.node if node is None else node, what=old.what if what is None else what
    )


@contextlib.contextmanager
def waiting_on(what: str, *, node: str | None = None) -> Iterator[None]:
    """Describe what the current task waits for while inside the block.

    The previous note comes back on exit; `node` defaults to the node already set.
    """
    target = _current_task(None, "waiting_on")
    previous = task_note(target)
    annotate(node=node, what=what, task=target)
    try:
        yield
    finally:
        _NOTES[target] = previous


def _frame_of(awaitable: Any) -> FrameType | None:
    for attr in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(awaitable, attr, None)
        if frame is not None:
            return frame
    return None


def _inner_awaitable(awaitable: Any) -> Any:
    inner = getattr(awaitable, "cr_await", None)
    return inner if inner is not None else getattr(awaitable, "gi_yieldfrom", None)


def _describe_future(future: Any) -> str:
    if future is None:
        return "(ready to run)"
    if isinstance(future, asyncio.Task):
        return f"task {future.get_name()!r}"
    return type(future).__name__


def _describe_task(task: asyncio.Task[Any]) -> str:
    """`task 'name' [node]`: the task and the node its note names."""
    node = task_note(task).node
    return f"task {task.get_name()!r}" + ("" if node is None else f" [{node}]")


def _await_chain(task: asyncio.Task[Any]) -> tuple[str, ...]:
    """The frames a suspended task is awaiting through, outermost first, then its future."""
    steps: list[str] = []
    awaitable: Any = task.get_coro()
    frame = _frame_of(awaitable)
    while frame is not None:
        code = frame.f_code
        steps.append(f"{code.co_qualname} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
        awaitable = _inner_awaitable(awaitable)
        frame = _frame_of(awaitable)
    steps.append(_describe_future(getattr(task, "_fut_waiter", None)))
    return tuple(steps)


def _refuse_io(name: str) -> Callable[..., NoReturn]:
    def refuse(self: VirtualTimeLoop, *args: Any, **kwargs: Any) -> NoReturn:
        raise SimUnsupportedError(
            f"VirtualTimeLoop.{name}(): the simulator's loop has no real I/O "
            "(sockets, pipes, subprocesses, signals); use the simulated Transport instead"
        )

    refuse.__name__ = refuse.__qualname__ = name
    return refuse


_REAL_IO_METHODS = (
    "add_reader", "remove_reader", "add_writer", "remove_writer",
    "add_signal_handler", "remove_signal_handler",
    "sock_recv", "sock_recv_into", "sock_recvfrom", "sock_recvfrom_into",
    "sock_sendall", "sock_sendto", "sock_connect", "sock_accept", "sock_sendfile",
    "create_connection", "create_server", "create_unix_connection", "create_unix_server",
    "create_datagram_endpoint", "connect_accepted_socket", "connect_read_pipe",
    "connect_write_pipe", "subprocess_exec", "subprocess_shell",
    "getaddrinfo", "getnameinfo", "sendfile", "start_tls",
)  # fmt: skip


class _Handle(asyncio.Handle):
    """A `call_soon` handle made without the debug-mode checks of `asyncio.Handle`."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop, context: contextvars.Context | None) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _Timer(asyncio.TimerHandle):
    """A `call_at` handle made without the debug-mode checks of `asyncio.TimerHandle`."""

    __slots__ = ()

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...],
                 loop: asyncio.AbstractEventLoop, context: contextvars.Context | None) -> None:
        self._context = contextvars.copy_context() if context is None else context
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = True


# Prune the dead task references once there are this many more than twice the live ones left
# by the last pruning.
_PRUNE_TASKS_MIN = 1024


def _check_limits(max_time: float | None, max_steps: int | None) -> None:
    if max_time is not None and not max_time >= 0:
        raise ValueError(f"max_time must be >= 0, got {max_time!r}")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An asyncio event loop whose clock jumps to the next timer when nothing is ready.

    `max_time`: raise `SimTimeLimit` instead of moving the clock past this virtual time.
    `max_steps`: raise `SimStepLimit` once one `run_forever` / `run_until_complete` call has
    dequeued this many ready callbacks and the loop still has work (guards against tasks that
    spin at one virtual instant).
    """

    virtual_time = True
    """Time measured on this loop is simulated time (`runtime.execution.compute.Charge.clock` asks)."""

    def __init__(self, *, max_time: float | None = None, max_steps: int | None = None) -> None:
        super().__init__()
        try:
            _check_limits(max_time, max_steps)
        except ValueError:
            super().close()  # a half-built loop must not warn "unclosed event loop"
            raise
        self._now = 0.0
        self._max_time = max_time
        self._max_steps = max_steps
        self._steps_left = sys.maxsize
        self._timers: list[float] = []
        """A heap of the distinct times timers are due at (`_due`'s keys)."""
        self._due: dict[float, list[asyncio.TimerHandle]] = {}
        """Time -> the timers due then, in the order they were scheduled."""
        self._timer_count = 0
        """Timers in `_due`, cancelled ones not yet dropped included."""
        self._task_refs: list[weakref.ref[asyncio.Task[Any]]] = []
        """Every task made here, in creation order (dead references pruned now and then)."""
        self._tasks_pruned_to = 0
        self._lost: SimLostError | None = None
        """The first exception found unretrieved, raised at the end of the batch."""
        self._holding: contextvars.ContextVar[Any] | None = None
        self._held: dict[Any, list[asyncio.Handle]] = {}
        """Value of `_holding` -> the callbacks of contexts with that value (timers come due,
        task steps, future callbacks) that came to run while held, in that order."""
        self.stats = SimStats()

    def hold(self, var: contextvars.ContextVar[Any], value: Any) -> None:
        """From the next batch on, a callback of a context where `var` is `value` (a timer come
        due, a task's step, a future's callback) waits, when its turn comes, until
        `release(value)`: whatever a paused node would run (its sleeps, compute, retries,
        watchdog, the steps of its tasks) stops with it. One variable for every hold at a
        time."""
        if self._holding is not None and self._holding is not var:
            raise ValueError(f"holding by {self._holding.name} already, not {var.name}")
        self._holding = var
        self._held.setdefault(value, [])

    def release(self, value: Any) -> None:
        """End `hold(var, value)`: the callbacks it held run now (late), in the order they came
        to run."""
        handles = self._held.pop(value, None)
        if handles is None:
            return
        self._ready.extend(handles)  # type: ignore[attr-defined]
        if not self._held:
            self._holding = None

    def run_forever(self) -> None:
        """Run until stopped; `max_steps` counts callbacks afresh for each call."""
        self._steps_left = sys.maxsize if self._max_steps is None else self._max_steps
        super().run_forever()

    def time(self) -> float:
        """Virtual seconds since the loop was created."""
        return self._now

    def call_soon(
        self,
        callback: Callable[[Unpack[Ts]], object],
        *args: Unpack[Ts],
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        """Schedule `callback(*args)` after the callbacks already ready (first in, first out)."""
        if self._debug:  # type: ignore[attr-defined]
            return super().call_soon(callback, *args, context=context)
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: Unpack[Ts],
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Schedule `callback(*args)` `delay` virtual seconds from now."""
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[Ts]], object],
        *args: Unpack[Ts],
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        """Schedule `callback(*args)` at virtual time `when`; ties run in scheduling order."""
        if when is None:
            raise TypeError("when cannot be None")
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        if self._debug:  # type: ignore[attr-defined]
            timer = asyncio.TimerHandle(when, callback, args, self, context)
            timer._scheduled = True  # type: ignore[attr-defined]
        else:
            timer = _Timer(when, callback, args, self, context)
        bucket = self._due.get(when)
        if bucket is None:
            self._due[when] = [timer]
            heapq.heappush(self._timers, when)
        else:
            bucket.append(timer)
        self._timer_count += 1
        return timer

    def create_task(  # type: ignore[override]
        self, coro: Coroutine[Any, Any, T], *, name: str | None = None, context: Any = None
    ) -> asyncio.Task[T]:
        """Create a task and remember its creation order (deadlock reports list tasks so)."""
        task = super().create_task(coro, name=name, context=context)
        refs = self._task_refs
        refs.append(weakref.ref(task))
        if len(refs) > 2 * self._tasks_pruned_to + _PRUNE_TASKS_MIN:
            refs[:] = [ref for ref in refs if ref() is not None]
            self._tasks_pruned_to = len(refs)
        return task

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[Ts]], T], *args: Unpack[Ts]
    ) -> asyncio.Future[T]:
        """Call `func(*args)` inline, at the current virtual time; return a done future."""
        self._check_closed()  # type: ignore[attr-defined]
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except Exception as exc:  # the future carries it, as an executor's would
            future.set_exception(exc)
        return future

    def _write_to_self(self) -> None:
        """Nothing to wake: the loop never blocks."""

    def pending_tasks(self) -> list[asyncio.Task[Any]]:
        """Unfinished tasks of this loop, in creation order."""
        alive = (ref() for ref in self._task_refs)
        known = [task for task in alive if task is not None and not task.done()]
        others = asyncio.all_tasks(self).difference(known)
        return known + sorted(others, key=lambda task: task.get_name())

    def pending_waits(self) -> list[TaskWait]:
        """What every unfinished task awaits, with its note."""
        return [
            TaskWait(task.get_name(), task_note(task), _await_chain(task))
            for task in self.pending_tasks()
        ]

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """Keep an exception that asyncio reports unhandled (a dropped task's, say) to stop the
        loop with at the end of the batch; pass other contexts, and any once the loop is
        closed, to the exception handler."""
        error = context.get("exception")
        if not isinstance(error, Exception) or self.is_closed():
            super().call_exception_handler(context)
            return
        future = context.get("future")
        if isinstance(future, asyncio.Task):
            what = f"{_describe_task(future)} failed and nothing retrieved its exception"
        elif future is not None:
            what = f"a {type(future).__name__} failed and nothing retrieved its exception"
        else:
            what = str(context.get("message") or "unhandled exception")
        self._lose(SimLostError(self._now, what, error))

    def _lose(self, lost: SimLostError) -> None:
        """Keep `lost` (chained to its exception) unless an earlier loss is kept already."""
        lost.__cause__ = lost.error
        if self._lost is None:
            self._lost = lost

    def _raise_lost(self) -> None:
        lost, self._lost = self._lost, None
        if lost is not None:
            raise lost

    def shutdown(self) -> None:
        """Cancel leftover tasks, finalize async generators, and close the loop; then raise
        `SimLostError` for the first exception nothing retrieved: one found on the way, a
        leftover task's that failed when cancelled, or a finished task's still unretrieved."""
        try:
            self._cancel_leftovers()
            self._find_unretrieved()
        finally:
            self.close()
        self._raise_lost()

    def _find_unretrieved(self) -> None:
        """Keep as lost the exception of the first task (in creation order) that finished with
        one nothing retrieved and is still referenced (so asyncio never reported it)."""
        for task in (ref() for ref in self._task_refs):
            if task is not None and task._log_traceback:  # type: ignore[attr-defined]
                what = f"{_describe_task(task)} failed and nothing retrieved its exception"
                self._lose(SimLostError(self._now, what, cast(Exception, task.exception())))
                return

    def close(self) -> None:
        super().close()
        self._timers.clear()
        self._due.clear()
        self._timer_count = 0

    def _cancel_leftovers(self) -> None:
        tasks = self.pending_tasks()
        for task in tasks:
            task.cancel()
        try:
            if tasks:
                self.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.run_until_complete(self.shutdown_asyncgens())
        except (SimDeadlock, SimTimeLimit, SimStepLimit) as exc:
            warnings.warn(f"leftover tasks did not finish when cancelled: {exc}", RuntimeWarning)
            return
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                what = f"{_describe_task(task)} failed when cancelled at shutdown"
                self._lose(SimLostError(self._now, what, cast(Exception, task.exception())))

    def _run_once(self) -> None:
        """Run batches until the loop is stopped: jump the clock if nothing is ready, move due
        timers, run the callbacks ready at the start of the batch (those they schedule wait for
        the next batch, as in asyncio)."""
        ready = self._ready  # type: ignore[attr-defined]
        popleft = ready.popleft
        stats = self.stats
        while True:
            if (
                self._timer_cancelled_count > _PURGE_MIN_CANCELLED
                and 2 * self._timer_cancelled_count > self._timer_count
            ):
                self._purge_cancelled_timers()
            if self._steps_left == 0:
                raise SimStepLimit(self._now, self._max_steps or 0)
            if not ready and not self._stopping:  # type: ignore[attr-defined]
                self._jump_to_next_timer()
            timers = self._timers
            if timers and timers[0] <= self._now:
                self._move_due_timers(ready)
            ntodo = min(len(ready), self._steps_left)
            self._steps_left -= ntodo
            stats.callbacks += ntodo
            holding, held = self._holding, self._held
            for _ in range(ntodo):
                handle = popleft()
                if handle._cancelled:
                    stats.callbacks -= 1
                    continue
                if holding is not None and (
                        waiting := held.get(handle._context.get(holding))) is not None:
                    waiting.append(handle)  # its node is paused: it runs at `release`
                    stats.callbacks -= 1
                    continue
                try:
                    handle._context.run(handle._callback, *handle._args)
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    raise self._callback_failed(handle, exc) from exc
            handle = None  # a task its callback finished must not outlive the batch through it
            if self._lost is not None:
                self._raise_lost()
            if self._stopping:  # type: ignore[attr-defined]
                return

    def _callback_failed(self, handle: asyncio.Handle, exc: BaseException) -> SimCallbackError:
        """The error that stops the loop when a callback raised (where `Handle._run` would
        only report it)."""
        source = format_helpers._format_callback_source(  # type: ignore[attr-defined]
            handle._callback, handle._args)  # type: ignore[attr-defined]
        return SimCallbackError(self._now, source, exc)

    def _jump_to_next_timer(self) -> None:
        timers, due = self._timers, self._due
        while timers:  # drop the earliest buckets whose timers are all cancelled
            bucket = due[timers[0]]
            if not bucket[0]._cancelled or not all(  # type: ignore[attr-defined]
                    timer._cancelled for timer in bucket):  # type: ignore[attr-defined]
                break
            self._drop_bucket(heapq.heappop(timers))
        else:
            raise SimDeadlock(self._now, self.pending_waits())
        when = timers[0]
        if self._max_time is not None and when > self._max_time:
            raise SimTimeLimit(self._now, self._max_time, when)
        if when > self._now:
            self._now = float(when)
            self.stats.jumps += 1

    def _drop_bucket(self, when: float) -> None:
        """Forget the timers due at `when`, every one of them cancelled."""
        bucket = self._due.pop(when)
        for timer in bucket:
            timer._scheduled = False  # type: ignore[attr-defined]
        self._timer_cancelled_count -= len(bucket)
        self._timer_count -= len(bucket)

    def _move_due_timers(self, ready: Any) -> None:
        timers, due = self._timers, self._due
        now = self._now
        heappop = heapq.heappop
        fired = moved = 0
        while timers and timers[0] <= now:
            bucket = due.pop(heappop(timers))
            moved += len(bucket)
            for timer in bucket:
                timer._scheduled = False  # type: ignore[attr-defined]
                if timer._cancelled:  # type: ignore[attr-defined]
                    self._timer_cancelled_count -= 1
                else:
                    ready.append(timer)
                    fired += 1
        self._timer_count -= moved
        self.stats.timers += fired

    def _purge_cancelled_timers(self) -> None:
        live: dict[float, list[asyncio.TimerHandle]] = {}
        for when, bucket in self._due.items():
            kept = []
            for timer in bucket:
                if timer.cancelled():
                    timer._scheduled = False  # type: ignore[attr-defined]
                else:
                    kept.append(timer)
            if kept:
                live[when] = kept
        self._due = live
        self._timers = list(live)
        heapq.heapify(self._timers)
        self._timer_count = sum(len(bucket) for bucket in live.values())
        self._timer_cancelled_count = 0


for _name in _REAL_IO_METHODS:
    setattr(VirtualTimeLoop, _name, _refuse_io(_name))


def run(
    main: Coroutine[Any, Any, T], *, max_time: float | None = None, max_steps: int | None = None
) -> T:
    """Run `main` on a fresh `VirtualTimeLoop` and return its result.

    Exceptions from `main` propagate unchanged, as do `SimDeadlock`, `SimTimeLimit`,
    `SimStepLimit`, `SimCallbackError` and `SimLostError`. Afterwards leftover tasks are
    cancelled, async generators finalized and the loop closed; an error found then (an exception
    nothing retrieved, a callback that raised) is raised after a successful run, and added as a
    note to the error of a failed one (whose own error wins).
    """
    if not asyncio.iscoroutine(main):
        raise TypeError(f"run() needs a coroutine, got {main!r}")
    if asyncio._get_running_loop() is not None:
        main.close()
        raise SimNestedRunError(
            "sim.loop.run() was called while an event loop is running in this thread; "
            "await the coroutine instead of nesting run()"
        )
    loop = VirtualTimeLoop(max_time=max_time, max_steps=max_steps)
    try:
        result = loop.run_until_complete(loop.create_task(main, name="main"))
    except BaseException as failure:
        try:
            loop.shutdown()
        except (SimCallbackError, SimLostError) as later:
            failure.add_note(f"and while the loop shut down: {later}")
        raise
    loop.shutdown()
    return result
