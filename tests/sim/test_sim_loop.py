"""The virtual-time loop: exact (time, actor, what) traces, deadlock reports, limits, cleanup."""

from __future__ import annotations

import asyncio
import contextvars
import platform
import random
import selectors
import time
import traceback
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.loop as sim_loop
from sim.loop import (
    SimCallbackError,
    SimDeadlock,
    SimLostError,
    SimNestedRunError,
    SimStepLimit,
    SimTimeLimit,
    SimUnsupportedError,
    TaskNote,
    VirtualTimeLoop,
    annotate,
    run,
    task_note,
    waiting_on,
)

Trace = list[tuple[float, str, str]]


def recorder(trace: Trace) -> Callable[[str, str], None]:
    """A log function stamping entries with the running loop's virtual time."""

    def log(actor: str, what: str) -> None:
        trace.append((asyncio.get_running_loop().time(), actor, what))

    return log


def test_sleeps_finish_at_exact_virtual_times() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def sleeper(name: str, seconds: float) -> None:
        log(name, "sleep")
        await asyncio.sleep(seconds)
        log(name, "wake")

    async def main() -> float:
        await asyncio.gather(sleeper("a", 1.5), sleeper("b", 3))
        return asyncio.get_running_loop().time()

    assert run(main()) == 3.0
    assert trace == [
        (0.0, "a", "sleep"),
        (0.0, "b", "sleep"),
        (1.5, "a", "wake"),
        (3.0, "b", "wake"),
    ]


WHO: contextvars.ContextVar[str | None] = contextvars.ContextVar("who", default=None)


def test_a_held_contexts_timers_wait_for_release_and_then_run_late_in_order() -> None:
    """Tasks of node "a" are held from t=1 to t=5: its timer due meanwhile (at 2) runs at 5,
    one due at 2.5 and cancelled while held never runs, and "b"'s run on time throughout."""
    trace: Trace = []
    log = recorder(trace)

    async def node(name: str, naps: list[float]) -> None:
        WHO.set(name)
        for nap in naps:
            await asyncio.sleep(nap)
            log(name, "wake")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        tasks = [asyncio.create_task(node("a", [2, 1, 4])), asyncio.create_task(node("b", [2, 2]))]
        doomed = asyncio.create_task(node("a", [2.5]))
        await asyncio.sleep(1)
        loop.hold(WHO, "a")
        await asyncio.sleep(1.75)
        doomed.cancel()
        await asyncio.sleep(2.25)
        loop.release("a")
        await asyncio.gather(*tasks, doomed, return_exceptions=True)

    run(main())
    assert trace == [(2.0, "b", "wake"), (4.0, "b", "wake"), (5.0, "a", "wake"),
                     (6.0, "a", "wake"), (10.0, "a", "wake")]


def test_a_held_task_woken_from_another_context_waits_for_release() -> None:
    """A future node "a" awaits is resolved at t=2 by a callback of no node (a shared CPU's
    work done, a message handed over): "a"'s step waits until the release at t=3."""
    trace: Trace = []
    log = recorder(trace)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        done = loop.create_future()

        async def node() -> None:
            WHO.set("a")
            await done
            log("a", "woken")

        task = asyncio.create_task(node())
        await asyncio.sleep(1)
        loop.hold(WHO, "a")
        loop.call_later(1, done.set_result, None, context=contextvars.Context())
        await asyncio.sleep(2)
        loop.release("a")
        await task

    run(main())
    assert trace == [(3.0, "a", "woken")]


def test_clock_starts_at_zero_and_returns_float() -> None:
    loop = VirtualTimeLoop()
    assert loop.time() == 0.0
    loop.call_at(2, loop.stop)
    loop.run_forever()
    assert loop.time() == 2.0 and isinstance(loop.time(), float)
    loop.shutdown()


def test_same_time_events_run_in_scheduling_order() -> None:
    order: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # Many timers at one instant: a bare heap of TimerHandles would not keep this order.
        for i in range(50):
            loop.call_at(1.0, order.append, i)
        loop.call_later(0.5, order.append, -1)
        await asyncio.sleep(2)

    run(main())
    assert order == [-1, *range(50)]


def test_same_time_task_wakeups_follow_creation_order() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def worker(name: str) -> None:
        await asyncio.sleep(1)
        log(name, "wake")
        await asyncio.sleep(0)
        log(name, "after yield")

    async def main() -> None:
        await asyncio.gather(*(worker(name) for name in ("w2", "w0", "w1")))

    run(main())
    assert trace == [
        (1.0, "w2", "wake"),
        (1.0, "w0", "wake"),
        (1.0, "w1", "wake"),
        (1.0, "w2", "after yield"),
        (1.0, "w0", "after yield"),
        (1.0, "w1", "after yield"),
    ]


def test_call_at_in_the_past_runs_now_without_moving_clock_back() -> None:
    seen: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(5)
        loop.call_at(1.0, lambda: seen.append(loop.time()))
        await asyncio.sleep(1)

    run(main())
    assert seen == [5.0]


def test_wait_for_timeout_fires_exactly_at_deadline() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def main() -> None:
        await asyncio.sleep(0.25)
        try:
            await asyncio.wait_for(asyncio.Event().wait(), timeout=2.5)
        except TimeoutError:
            log("main", "timed out")
        log("main", "fast result " + str(await asyncio.wait_for(asyncio.sleep(1, "ok"), 5)))

    run(main())
    assert trace == [(2.75, "main", "timed out"), (3.75, "main", "fast result ok")]


def test_asyncio_timeout_and_reschedule() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(4.0):
                await asyncio.sleep(10)
        log("main", "first timeout")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0) as scope:
                scope.reschedule(loop.time() + 0.5)
                await asyncio.sleep(10)
        log("main", "rescheduled timeout")
        async with asyncio.timeout_at(loop.time() + 3):
            await asyncio.sleep(2)
        log("main", "finished inside deadline")

    run(main())
    assert trace == [
        (4.0, "main", "first timeout"),
        (4.5, "main", "rescheduled timeout"),
        (6.5, "main", "finished inside deadline"),
    ]


def test_queue_producer_consumer_exact_trace() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def producer(queue: asyncio.Queue[int | None]) -> None:
        for item in range(3):
            await asyncio.sleep(1)
            await queue.put(item)
            log("producer", f"put {item}")
        await queue.put(None)

    async def consumer(queue: asyncio.Queue[int | None]) -> None:
        while (item := await queue.get()) is not None:
            log("consumer", f"got {item}")
            await asyncio.sleep(2.5)
            log("consumer", f"done {item}")

    async def main() -> None:
        queue: asyncio.Queue[int | None] = asyncio.Queue(maxsize=1)
        await asyncio.gather(producer(queue), consumer(queue))

    run(main())
    assert trace == [
        (1.0, "producer", "put 0"),
        (1.0, "consumer", "got 0"),
        (2.0, "producer", "put 1"),
        (3.5, "consumer", "done 0"),
        (3.5, "consumer", "got 1"),
        (3.5, "producer", "put 2"),
        (6.0, "consumer", "done 1"),
        (6.0, "consumer", "got 2"),
        (8.5, "consumer", "done 2"),
    ]


def test_ten_thousand_sleepers_wake_in_virtual_order_quickly() -> None:
    rng = random.Random(20240531)
    durations = [round(rng.uniform(0, 100), 3) for _ in range(10_000)]
    woke: list[tuple[float, int]] = []

    async def sleeper(index: int, seconds: float) -> None:
        await asyncio.sleep(seconds)
        woke.append((asyncio.get_running_loop().time(), index))

    async def main() -> float:
        await asyncio.gather(*(sleeper(i, d) for i, d in enumerate(durations)))
        return asyncio.get_running_loop().time()

    end = run(main())  # how fast: benchmarks/sim_loop_speed.py (no wall-clock bound here)
    assert woke == sorted((d, i) for i, d in enumerate(durations))
    assert end == max(durations)


def test_deadlock_reports_every_task_with_annotations() -> None:
    async def barrier_server(event: asyncio.Event) -> None:
        annotate(node="pserver:0")
        with waiting_on("send_barrier step 3 (2/4 trainers)"):
            await event.wait()

    async def trainer(event: asyncio.Event) -> None:
        with waiting_on("fetch_barrier step 3", node="trainer:1"):
            await event.wait()

    async def main() -> None:
        await asyncio.sleep(2)
        await asyncio.gather(
            asyncio.create_task(barrier_server(asyncio.Event()), name="serve"),
            asyncio.create_task(trainer(asyncio.Event()), name="train"),
        )

    with pytest.raises(SimDeadlock) as caught:
        run(main())
    error = caught.value
    assert error.now == 2.0
    assert [(w.task, w.note) for w in error.waits] == [
        ("main", TaskNote()),
        ("serve", TaskNote("pserver:0", "send_barrier step 3 (2/4 trainers)")),
        ("train", TaskNote("trainer:1", "fetch_barrier step 3")),
    ]
    assert error.waits[1].stack[0].startswith("test_deadlock_reports_every_task_with_annotations")
    assert error.waits[1].stack[1].startswith("Event.wait (locks.py:")
    assert error.waits[0].stack[-1] == "_GatheringFuture"
    message = str(error)
    assert message.startswith("deadlock at t=2.0: nothing is ready and no timer is pending")
    assert "'serve' [pserver:0] waiting on: send_barrier step 3 (2/4 trainers)" in message
    assert "'train' [trainer:1] waiting on: fetch_barrier step 3" in message


def test_deadlock_in_run_forever_with_nothing_scheduled() -> None:
    loop = VirtualTimeLoop()
    with pytest.raises(SimDeadlock, match=r"but 0 task\(s\) still wait"):
        loop.run_forever()
    loop.shutdown()


def test_waiting_on_restores_previous_note() -> None:
    notes: list[TaskNote] = []

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        annotate(node="trainer:0", what="idle")
        with waiting_on("recv w@GRAD"):
            notes.append(task_note(task))
        notes.append(task_note(task))

    run(main())
    assert notes == [TaskNote("trainer:0", "recv w@GRAD"), TaskNote("trainer:0", "idle")]


def test_annotate_outside_a_task_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        annotate(node="x")
    loop = VirtualTimeLoop()
    errors: list[BaseException] = []

    def callback() -> None:
        try:
            annotate(node="x")
        except RuntimeError as exc:
            errors.append(exc)
        loop.stop()

    loop.call_soon(callback)
    loop.run_forever()
    loop.shutdown()
    assert [str(e) for e in errors] == [
        "annotate() must be called from inside a task, or be given task="
    ]


def program_trace(seed: int) -> str:
    """A small mixed program; its trace as text."""
    trace: Trace = []
    log = recorder(trace)
    rng = random.Random(seed)

    async def node(name: str, queue: asyncio.Queue[str]) -> None:
        for step in range(5):
            await asyncio.sleep(rng.choice([0.5, 1.0, 1.0, 2.0]))
            await queue.put(f"{name}:{step}")
            try:
                await asyncio.wait_for(asyncio.sleep(rng.random()), timeout=0.5)
                log(name, f"step {step} in time")
            except TimeoutError:
                log(name, f"step {step} timed out")

    async def sink(queue: asyncio.Queue[str]) -> None:
        while True:
            log("sink", await queue.get())

    async def main() -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        asyncio.create_task(sink(queue))
        await asyncio.gather(*(node(f"n{i}", queue) for i in range(4)))

    run(main())
    return "\n".join(repr(entry) for entry in trace)


def test_same_program_gives_byte_identical_traces() -> None:
    first, second = program_trace(7), program_trace(7)
    assert first.encode() == second.encode()
    assert first.count("\n") + 1 == 40
    assert program_trace(8) != first


def test_one_hour_virtual_sleep_never_waits_on_the_wall_clock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock jumps to the hour: nothing sleeps or selects on real time meanwhile."""
    def wait(*args: object) -> None:
        raise AssertionError(f"waited on the wall clock: {args}")

    monkeypatch.setattr(time, "sleep", wait)
    monkeypatch.setattr(selectors.DefaultSelector, "select", wait)

    async def main() -> float:
        await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert run(main()) == 3600.0


def test_main_exception_propagates_unchanged() -> None:
    failure = ValueError("bad gradient for w@GRAD")

    async def main() -> None:
        await asyncio.sleep(1)
        raise failure

    with pytest.raises(ValueError) as caught:
        run(main())
    assert caught.value is failure


def test_main_result_is_returned() -> None:
    async def main() -> dict[str, int]:
        return {"steps": 3}

    assert run(main()) == {"steps": 3}


def test_run_needs_a_coroutine() -> None:
    with pytest.raises(TypeError, match="run\\(\\) needs a coroutine"):
        run(asyncio.sleep)  # type: ignore[arg-type]


def test_nested_run_is_a_clear_error() -> None:
    async def inner() -> None:
        await asyncio.sleep(1)

    async def main() -> str:
        with pytest.raises(SimNestedRunError, match="await the coroutine instead"):
            run(inner())
        coro = inner()
        with pytest.raises(RuntimeError, match="already running"):
            asyncio.get_running_loop().run_until_complete(coro)
        coro.close()
        return "survived"

    assert run(main()) == "survived"


@pytest.mark.parametrize(
    ("name", "attempt"),
    [
        ("create_connection", lambda loop: asyncio.open_connection("127.0.0.1", 9)),
        ("create_server", lambda loop: asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)),
        ("add_reader", lambda loop: loop.add_reader(0, print)),
        ("sock_recv", lambda loop: loop.sock_recv(None, 10)),
        ("getaddrinfo", lambda loop: loop.getaddrinfo("localhost", 80)),
        ("subprocess_exec", lambda loop: asyncio.create_subprocess_exec("true")),
    ],
)
def test_real_io_is_refused_with_a_clear_error(
    name: str, attempt: Callable[[asyncio.AbstractEventLoop], object]
) -> None:
    async def main() -> None:
        call = attempt(asyncio.get_running_loop())
        if asyncio.iscoroutine(call):
            await call

    with pytest.raises(SimUnsupportedError, match=rf"VirtualTimeLoop\.{name}\(\): .* no real I/O"):
        run(main())
    assert issubclass(SimUnsupportedError, NotImplementedError)


def test_leftover_tasks_are_cancelled_and_asyncgens_finalized_on_close() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def heartbeat() -> None:
        try:
            while True:
                await asyncio.sleep(1)
                log("heartbeat", "beat")
        except asyncio.CancelledError:
            log("heartbeat", "cancelled")
            raise

    async def ticks():  # type: ignore[no-untyped-def]
        try:
            for tick in range(10):
                yield tick
        finally:
            log("ticks", "finalized")

    unfinished = ticks()  # kept alive past main, so only the loop's shutdown can finalize it

    async def main() -> None:
        asyncio.create_task(heartbeat())
        async for tick in unfinished:
            if tick == 1:
                break
        await asyncio.sleep(2.5)
        log("main", "done")

    run(main())
    assert trace == [
        (1.0, "heartbeat", "beat"),
        (2.0, "heartbeat", "beat"),
        (2.5, "main", "done"),
        (2.5, "heartbeat", "cancelled"),
        (2.5, "ticks", "finalized"),
    ]


def test_leftover_task_that_refuses_cancellation_warns_instead_of_hanging() -> None:
    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.Event().wait()

    async def main() -> None:
        asyncio.create_task(stubborn(), name="stubborn")
        await asyncio.sleep(1)

    with pytest.warns(RuntimeWarning, match="leftover tasks did not finish when cancelled"):
        run(main())


def test_max_time_stops_before_the_clock_passes_it() -> None:
    trace: Trace = []
    log = recorder(trace)

    async def main() -> None:
        while True:
            await asyncio.sleep(3)
            log("main", "tick")

    with pytest.raises(SimTimeLimit) as caught:
        run(main(), max_time=10)
    assert (caught.value.now, caught.value.limit, caught.value.next_when) == (9.0, 10, 12.0)
    assert [t for t, _, _ in trace] == [3.0, 6.0, 9.0]
    assert "max_time=10 reached at t=9.0" in str(caught.value)


def test_timer_exactly_at_max_time_still_runs() -> None:
    async def main() -> float:
        await asyncio.sleep(10)
        return asyncio.get_running_loop().time()

    assert run(main(), max_time=10.0) == 10.0


def test_max_steps_stops_a_task_spinning_at_one_instant() -> None:
    async def main() -> None:
        while True:
            await asyncio.sleep(0)

    with pytest.raises(SimStepLimit, match="max_steps=1000 reached at t=0.0"):
        run(main(), max_steps=1000)  # and the cleanup, with a fresh budget, cancels the spinner


def test_bad_limits_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_time must be >= 0"):
        VirtualTimeLoop(max_time=-1)
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        VirtualTimeLoop(max_steps=0)


def test_stats_count_callbacks_timers_and_jumps() -> None:
    loop = VirtualTimeLoop()
    loop.call_later(1, print)
    loop.call_later(1, lambda: None)
    loop.call_later(3, print).cancel()
    loop.call_later(2, loop.stop)
    loop.call_soon(lambda: None)
    loop.run_forever()
    assert (loop.stats.callbacks, loop.stats.timers, loop.stats.jumps) == (4, 3, 2)
    assert loop.time() == 2.0
    loop.shutdown()


def test_many_cancelled_timers_are_purged_and_never_fire() -> None:
    fired: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for round_ in range(5):
            handles = [loop.call_later(10 + i, fired.append, i) for i in range(300)]
            for handle in handles[:-1]:
                handle.cancel()
            await asyncio.sleep(1)
            assert loop._timer_count <= 300 * (round_ + 1)  # type: ignore[attr-defined]
        await asyncio.sleep(400)

    run(main())
    assert fired == [299] * 5


def test_run_in_executor_runs_inline_at_current_time() -> None:
    def boom() -> None:
        raise OSError("disk")

    async def main() -> tuple[float, int]:
        await asyncio.sleep(1.25)
        result = await asyncio.to_thread(sum, [1, 2, 3])
        with pytest.raises(OSError, match="disk"):
            await asyncio.get_running_loop().run_in_executor(None, boom)
        return asyncio.get_running_loop().time(), result

    assert run(main()) == (1.25, 6)


def test_call_soon_threadsafe_from_the_loop_thread() -> None:
    async def main() -> str:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon_threadsafe(future.set_result, "woken")
        return await future

    assert run(main()) == "woken"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 7.25]), max_size=40))
def test_timers_fire_in_when_then_scheduling_order(delays: list[float]) -> None:
    fired: list[tuple[float, int]] = []
    loop = VirtualTimeLoop()

    def record(index: int) -> None:
        fired.append((loop.time(), index))

    for index, delay in enumerate(delays):
        loop.call_later(delay, record, index)
    loop.call_later(10, loop.stop)
    loop.run_forever()
    loop.shutdown()
    assert fired == sorted((delay, index) for index, delay in enumerate(delays))


def test_a_callback_that_raises_stops_the_loop_naming_it_and_the_time() -> None:
    ran: list[str] = []

    def boom() -> None:
        raise ValueError("bad callback")

    loop = VirtualTimeLoop()
    loop.call_later(1.5, boom)
    loop.call_later(1.5, ran.append, "same instant, after")
    loop.call_later(2, ran.append, "later")
    with pytest.raises(SimCallbackError) as caught:
        loop.run_forever()
    error = caught.value
    assert str(error).startswith("callback test_a_callback_that_raises_stops_the_loop_naming_it_"
                                 "and_the_time.<locals>.boom() at ")
    assert str(error).endswith(" raised ValueError at t=1.5: bad callback")
    assert (error.now, type(error.error)) == (1.5, ValueError)
    assert error.__cause__ is error.error
    assert traceback.extract_tb(error.error.__traceback__)[-1].name == "boom"
    assert ran == [] and loop.time() == 1.5
    loop.shutdown()


def test_a_done_callback_that_raises_stops_the_run() -> None:
    def check(future: asyncio.Future[int]) -> None:
        raise KeyError(future.result())

    async def main() -> None:
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(check)
        await asyncio.sleep(2)
        future.set_result(7)
        await asyncio.sleep(1)

    # (the callback's arguments are shown by Python < 3.13, or in debug mode)
    with pytest.raises(SimCallbackError, match=r"^callback .*\.check\(.*\) at .*test_sim_loop\.py:"
                                               r"\d+ raised KeyError at t=2\.0: 7$"):
        run(main())


async def fail_after(delay: float, text: str) -> None:
    await asyncio.sleep(delay)
    raise ValueError(text)


def test_a_dropped_task_that_fails_stops_the_run_when_it_fails() -> None:
    async def node() -> None:
        annotate(node="pserver:0")
        await fail_after(2, "heartbeat lost its socket")

    async def main() -> None:
        asyncio.create_task(node(), name="heartbeat")  # nothing keeps or awaits it
        await asyncio.sleep(5)

    with pytest.raises(SimLostError) as caught:
        run(main())
    assert str(caught.value) == (
        "task 'heartbeat' [pserver:0] failed and nothing retrieved its exception at t=2.0: "
        "ValueError: heartbeat lost its socket")
    assert caught.value.__cause__ is caught.value.error
    assert traceback.extract_tb(caught.value.error.__traceback__)[-1].name == "fail_after"


def test_a_dropped_future_that_fails_stops_the_run() -> None:
    async def main() -> None:
        await asyncio.sleep(1)
        asyncio.get_running_loop().create_future().set_exception(OSError("reply lost"))
        await asyncio.sleep(1)

    with pytest.raises(SimLostError, match=r"^a Future failed and nothing retrieved its exception "
                                           r"at t=1\.0: OSError: reply lost$"):
        run(main())


def test_a_kept_task_whose_exception_nothing_retrieves_fails_the_run_at_shutdown() -> None:
    kept: list[asyncio.Task[None]] = []

    async def main() -> None:
        kept.append(asyncio.create_task(fail_after(1, "never looked at"), name="kept"))
        await asyncio.sleep(3)

    with pytest.raises(SimLostError, match=r"^task 'kept' failed and nothing retrieved its "
                                           r"exception at t=3\.0: ValueError: never looked at$"):
        run(main())


def test_a_leftover_task_that_fails_when_cancelled_fails_the_run() -> None:
    async def server() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("checkpoint half written") from None

    async def main() -> None:
        asyncio.create_task(server(), name="server")
        await asyncio.sleep(1)

    with pytest.raises(SimLostError, match=r"^task 'server' failed when cancelled at shutdown at "
                                           r"t=1\.0: RuntimeError: checkpoint half written$"):
        run(main())


def test_the_runs_own_error_wins_and_a_lost_one_becomes_a_note() -> None:
    kept: list[asyncio.Task[None]] = []

    async def main() -> None:
        kept.append(asyncio.create_task(fail_after(1, "lost"), name="kept"))
        await fail_after(2, "main's own")

    with pytest.raises(ValueError, match="main's own") as caught:
        run(main())
    assert caught.value.__notes__ == [
        "and while the loop shut down: task 'kept' failed and nothing retrieved its exception "
        "at t=2.0: ValueError: lost"]


def test_cancelled_and_retrieved_failures_are_not_errors() -> None:
    async def main() -> str:
        doomed = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(1)
        doomed.cancel()
        del doomed  # cancelled, then dropped: expected
        late = asyncio.create_task(fail_after(1, "seen later"))
        await asyncio.sleep(3)
        with pytest.raises(ValueError, match="seen later"):
            await late  # failed at t=2, retrieved at t=4
        try:
            async with asyncio.timeout(1):
                await asyncio.sleep(5)
        except TimeoutError:
            pass
        results = await asyncio.gather(fail_after(1, "gathered"), return_exceptions=True)
        return f"{asyncio.get_running_loop().time()} {results}"

    assert run(main()) == "6.0 [ValueError('gathered')]"


def test_the_loop_checks_its_asyncio_internals_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    names = [name for name, _ in sim_loop._INTERNALS]
    assert len(names) == 22
    assert [name for name in names if f"`{name}" not in (sim_loop.__doc__ or "")] == []
    sim_loop._check_internals()  # this Python has them all
    gone = ("BaseEventLoop._gone", lambda: False)
    monkeypatch.setattr(sim_loop, "_INTERNALS", (*sim_loop._INTERNALS, gone))
    with pytest.raises(ImportError, match=rf"the asyncio of Python {platform.python_version()} "
                                          r"lacks BaseEventLoop\._gone, .* tested on Python 3\.11"):
        sim_loop._check_internals()


def test_debug_mode_runs_the_same_trace() -> None:
    def traced(debug: bool) -> Trace:
        trace: Trace = []
        loop = VirtualTimeLoop()
        loop.set_debug(debug)
        log = recorder(trace)

        async def worker(name: str, delay: float) -> None:
            for _ in range(3):
                await asyncio.sleep(delay)
                log(name, "tick")

        async def main() -> None:
            await asyncio.gather(worker("a", 0.5), worker("b", 0.75), worker("c", 0.5))

        loop.run_until_complete(main())
        loop.shutdown()
        return trace

    assert traced(debug=True) == traced(debug=False)
    assert len(traced(debug=False)) == 9


def test_deadlock_lists_tasks_in_creation_order_among_thousands_of_finished_ones() -> None:
    async def main() -> None:
        for _ in range(5000):  # finished tasks: their references are pruned as tasks come
            await asyncio.create_task(asyncio.sleep(0))
        never = asyncio.Event()
        for name in ("late", "early", "middle"):
            asyncio.create_task(never.wait(), name=name)
        await never.wait()

    loop = VirtualTimeLoop()
    with pytest.raises(SimDeadlock) as caught:
        loop.run_until_complete(loop.create_task(main(), name="main"))
    assert [w.task for w in caught.value.waits] == ["main", "late", "early", "middle"]
    assert len(loop._task_refs) < 5000  # type: ignore[attr-defined]
    loop.shutdown()
