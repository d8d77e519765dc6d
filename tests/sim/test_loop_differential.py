"""The virtual-time loop against asyncio's own: the same programs, the same order of events.

The runtime runs unchanged on `sim.loop.VirtualTimeLoop`, so wherever its order of events is
decided by the loop (which ready callback runs first, when a woken task resumes, when a done
callback or a `call_soon` runs), the virtual loop must decide it as the stock loop does.
Hypothesis writes programs of a few tasks that yield, put to and take from queues, set and wait
for events, resolve futures, schedule callbacks and spawn and await subtasks; each program runs
on both loops and the logs of what happened, in order, must be equal.

Timers are left out: the stock loop reads the wall clock, so two timers' order there depends on
how long the code between them took (the virtual loop's timer order has its own tests in
test_sim_loop.py). A task waits only for an event of a task before it, so no program can
deadlock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.loop import VirtualTimeLoop


@dataclass(frozen=True)
class Step:
    what: str
    arg: int = 0


def steps_for(task: int) -> st.SearchStrategy[list[Step]]:
    """A task's steps: it may wait for the event of a task before it (never its own or a later
    one's), and it sets its own event last but always."""
    kinds = [st.just(Step("yield")),
             st.builds(Step, st.just("put"), st.integers(0, 1)),
             st.builds(Step, st.just("take"), st.integers(0, 1)),
             st.builds(Step, st.just("soon"), st.integers(0, 3)),
             st.builds(Step, st.just("resolve"), st.integers(0, 2)),
             st.builds(Step, st.just("spawn"), st.integers(0, 2))]
    if task > 0:
        kinds.append(st.builds(Step, st.just("wait"), st.integers(0, task - 1)))
    return st.lists(st.one_of(kinds), max_size=8)


programs = st.integers(1, 4).flatmap(
    lambda n: st.tuples(*(steps_for(i) for i in range(n))))


async def play(program: tuple[list[Step], ...]) -> list[str]:
    """Run `program` on the running loop; the log of what happened, in order."""
    log: list[str] = []
    loop = asyncio.get_running_loop()
    queues = [asyncio.Queue[str]() for _ in range(2)]
    events = [asyncio.Event() for _ in program]
    futures = [loop.create_future() for _ in range(3)]
    for i, future in enumerate(futures):
        future.add_done_callback(lambda f, i=i: log.append(f"future {i} done callback"))

    async def child(owner: int, n: int) -> int:
        log.append(f"child {owner}.{n} runs")
        await asyncio.sleep(0)
        log.append(f"child {owner}.{n} resumes")
        return n

    async def task(me: int, steps: list[Step]) -> None:
        for k, step in enumerate(steps):
            log.append(f"task {me} step {k} {step.what} {step.arg}")
            if step.what == "yield":
                await asyncio.sleep(0)
            elif step.what == "put":
                queues[step.arg].put_nowait(f"{me}.{k}")
            elif step.what == "take":
                q = queues[step.arg]
                log.append(f"task {me} took {q.get_nowait() if not q.empty() else 'nothing'}")
            elif step.what == "soon":
                loop.call_soon(log.append, f"callback {me}.{k}.{step.arg}")
            elif step.what == "resolve":
                if not futures[step.arg].done():
                    futures[step.arg].set_result(me)
            elif step.what == "spawn":
                sub = asyncio.create_task(child(me, k))
                sub.add_done_callback(lambda t, me=me, k=k: log.append(f"child {me}.{k} done"))
                if step.arg:
                    log.append(f"task {me} got {await sub}")
            elif step.what == "wait":
                await events[step.arg].wait()
                log.append(f"task {me} woken by {step.arg}")
        events[me].set()
        log.append(f"task {me} ends")

    tasks = [asyncio.create_task(task(i, steps)) for i, steps in enumerate(program)]
    for t in tasks:
        t.add_done_callback(lambda t: log.append(f"{t.get_name()} done callback"))
    await asyncio.gather(*tasks)
    for i, future in enumerate(futures):
        if not future.done():
            future.cancel()
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.gather(*pending)
    return log


def on_stock_loop(program: tuple[list[Step], ...]) -> list[str]:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(play(program))
    finally:
        loop.close()


def on_virtual_loop(program: tuple[list[Step], ...]) -> list[str]:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(play(program))
    finally:
        loop.close()


def _names_reset(log: list[str]) -> list[str]:
    """Task names count up process-wide (Task-17): number them by first appearance."""
    names: dict[str, str] = {}
    out = []
    for line in log:
        if line.startswith("Task-"):
            name, rest = line.split(" ", 1)
            line = f"{names.setdefault(name, f'task#{len(names)}')} {rest}"
        out.append(line)
    return out


@pytest.mark.timeout(120)
@settings(max_examples=150)
@given(programs)
def test_the_virtual_loop_runs_every_program_in_the_stock_loops_order(
        program: tuple[list[Step], ...]) -> None:
    assert _names_reset(on_virtual_loop(program)) == _names_reset(on_stock_loop(program))


def test_a_program_with_every_kind_of_step_logs_the_same_on_both() -> None:
    program = ([Step("spawn", 1), Step("put", 0), Step("soon", 1), Step("resolve", 0),
                Step("yield")],
               [Step("wait", 0), Step("take", 0), Step("spawn", 0), Step("soon", 2)],
               [Step("take", 1), Step("wait", 1), Step("resolve", 0), Step("yield")])
    stock = on_stock_loop(program)
    assert "task 1 took 0.1" in stock and "future 0 done callback" in stock
    assert _names_reset(on_virtual_loop(program)) == _names_reset(stock)
