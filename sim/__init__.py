"""The simulator: the real runtime under a virtual clock (see sim/loop.py)."""

from sim.loop import (
    SimDeadlock,
    SimError,
    SimNestedRunError,
    SimStats,
    SimStepLimit,
    SimTimeLimit,
    SimUnsupportedError,
    TaskNote,
    TaskWait,
    VirtualTimeLoop,
    annotate,
    run,
    task_note,
    waiting_on,
)

__all__ = [
    "SimDeadlock",
    "SimError",
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
