"""The pserver's sans-IO core driven by events alone, no sockets and no event loop: a `Shell`
stands in for `PserverService`, performing each action the core yields at once (blocks run
through a numpy executor over the core's store, replies recorded), so a test reads what the
core asked for, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtime.config.scenario import parse_scenario
from runtime.execution.executor import Executor
from runtime.execution.scope import Scope
from runtime.network.wire import Kind, Message
from runtime.services.job import Job
from runtime.services.pserver_actions import Action, Optimize, Reply, RunBlocks, SaveCheckpoint, Work
from runtime.services.pserver_core import PserverCore
from runtime.services.pserver_store import Store
from transpiler.distribute.contract import ServeContract
from transpiler.ir import Program


MODEL = "{name: mlp, sizes: [8, 4, 2], optimizer: {type: sgd, learning_rate: 0.5}}"


GRAD = "mlp.fc1.w@GRAD"


PARAM = "mlp.fc1.w"


SHAPE = (4, 2)


def programs(mode: str, trainers: int = 2, transpiler: str = "",
             model: str = MODEL) -> tuple[Program, Program]:
    """Pserver 0's main and startup programs of a one-pserver job (no slicing)."""
    text = f"""
name: core
model: {model}
cluster: {{pservers: 1, trainers: {trainers}, endpoints: {{pservers: [127.0.0.1:7001]}}}}
transpiler: {{mode: {mode}{", " + transpiler if transpiler else ""}}}
train: {{steps: 4, heartbeat_timeout: 10s}}
"""
    return Job.from_scenario(parse_scenario(text)).pserver_programs(0)


class Shell:
    """Performs the core's actions at once and records them."""

    def __init__(self, mode: str, trainers: int = 2, transpiler: str = "",
                 checkpoint_every: int | None = None, model: str = MODEL, **core: Any) -> None:
        self.program, startup = programs(mode, trainers, transpiler, model)
        self.executor = Executor()
        scope = Scope()
        self.executor.run(startup, scope=scope)
        self.store = Store(self.program, ServeContract.of(self.program), scope, timing=False)
        self.now = 0.0
        self.core = PserverCore(self.store, name="pserver:0", clock=lambda: self.now,
                                heartbeat_timeout=10.0, startup_grace=60.0,
                                checkpoint_every=checkpoint_every, **core)
        self.core.start()
        self.ids = 0

    def drive(self, work: Work) -> list[Action]:
        done: list[Action] = []
        result: Any = None
        while True:
            try:
                action = work.send(result)
            except StopIteration:
                return done
            done.append(action)
            result = self.perform(action)

    def perform(self, action: Action) -> Any:
        if isinstance(action, RunBlocks):
            for idx in action.blocks:
                self.executor.run_block(self.program, idx, self.store.scope)
        elif isinstance(action, Optimize):
            for idx in action.blocks:
                self.executor.run_block(self.program, idx, self.store.scope, action.overrides)
        elif isinstance(action, SaveCheckpoint):
            return Path("/nowhere") / str(action.step)
        return None

    def message(self, kind: Kind, trainer: int, step: int, vars: dict[str, Any] | None = None,
                msg_id: int | None = None, **extra: Any) -> Message:
        if msg_id is None:
            self.ids += 1
            msg_id = self.ids
        return Message(kind, msg_id, f"trainer:{trainer}", step, vars or {},
                       {"trainer": trainer, **extra})

    def send(self, msg: Message) -> list[Action]:
        return self.drive(self.core.on_message(f"peer{msg.src}", msg))


def replies(actions: list[Action]) -> list[Message]:
    return [a.message for a in actions if isinstance(a, Reply)]


def kinds(actions: list[Action]) -> list[type]:
    return [type(a) for a in actions]


def grad(shell: Shell, trainer: int, value: float) -> dict[str, np.ndarray]:
    """Every gradient `trainer` sends this server, each all `value`."""
    contract, block = shell.store.contract, shell.program.global_block()
    copies = contract.trainer_copies
    names = [n for n, t in copies.items() if t == trainer] if copies else sorted(contract.received)
    return {n: np.full(block.var(n).shape, value, np.float32) for n in names}
