"""The simulator: the real runtime under a virtual clock (sim/loop.py), over a simulated
network (sim/network.py), charged for compute by a cost model (sim/cost.py) and traced
(sim/trace.py). `simulate(scenario)` runs a scenario so (sim/simulate.py); `sim.report` and
the `sim` command (sim/cli.py) report on it."""

from sim.cost import ComputeConfigError, compute_model
from sim.loop import (
    SimCallbackError,
    SimDeadlock,
    SimError,
    SimLostError,
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
from sim.simulate import SimResult, TrainerRun, simulate
from sim.trace import TraceRecorder

__all__ = [
    "ComputeConfigError",
    "LinkStats",
    "Network",
    "NetworkConfigError",
    "NetworkSpec",
    "NicStats",
    "SimCallbackError",
    "SimDeadlock",
    "SimError",
    "SimLostError",
    "SimNestedRunError",
    "SimResult",
    "SimStats",
    "SimStepLimit",
    "SimTimeLimit",
    "SimTransport",
    "SimUnsupportedError",
    "TaskNote",
    "TaskWait",
    "TraceRecorder",
    "TrainerRun",
    "VirtualTimeLoop",
    "annotate",
    "compute_model",
    "run",
    "simulate",
    "task_note",
    "waiting_on",
]
