"""The simulator: the real runtime under a virtual clock (sim/loop.py) over a simulated
network (sim/network.py)."""

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
from sim.network import (
    LinkStats,
    Network,
    NetworkConfigError,
    NetworkSpec,
    NicStats,
    SimTransport,
)

__all__ = [
    "LinkStats",
    "Network",
    "NetworkConfigError",
    "NetworkSpec",
    "NicStats",
    "SimDeadlock",
    "SimError",
    "SimNestedRunError",
    "SimStats",
    "SimStepLimit",
    "SimTimeLimit",
    "SimTransport",
    "SimUnsupportedError",
    "TaskNote",
    "TaskWait",
    "VirtualTimeLoop",
    "annotate",
    "run",
    "task_note",
    "waiting_on",
]
