"""Trainer 0's checkpoint notices (docs/transpiler.md §6.10).

The original saved a pserver job's state from its chief trainer: every ``step_interval`` steps
trainer 0 ran a `checkpoint_notify` (attributes ``epmap``, ``dir``, ``lookup_table``) that made
every pserver save what it holds into ``dir``; the other trainers saved nothing. Here
`append_checkpoint_notify` appends that to a transpiled trainer program: for trainer 0 (the
program's ``_is_chief``) a `conditional_block` at the end of each step that runs the notice every
``step_interval`` steps (counter ``@CHECKPOINT_STEP@``, see `edit.append_every_k_steps`); other
trainers' programs are left as they are.

DESIGN: the counter lives in the trainer's startup program, so it counts the steps this
trainer ran since it started; a trainer that restarts or resumes counts afresh, as the
original's did.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Block, OpRole, Program
from .edit import append_every_k_steps, rpc_attrs
from .rpc_plan import rpc_plan_pass

CHECKPOINT_STEP = "@CHECKPOINT_STEP@"


@dataclass(frozen=True)
class CheckpointConfig:
    """Where the pservers save (a directory every pserver can write; each saves into a
    subdirectory of its own) and every how many steps."""

    checkpoint_dir: str
    step_interval: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir:
            raise ValueError(f"checkpoint_dir: must be a directory path, got {self.checkpoint_dir!r}")
        if isinstance(self.step_interval, bool) or not isinstance(self.step_interval, int) \
                or self.step_interval < 1:
            raise ValueError(f"step_interval: must be an int >= 1, got {self.step_interval!r}")


def append_checkpoint_notify(main: Program, startup: Program, config: CheckpointConfig) -> None:
    """Give trainer 0's `main` (and `startup`, which starts the counter) its periodic
    `checkpoint_notify` to every pserver; leave other trainers' programs alone."""
    if not main.attrs.get("_is_distributed") or "_endpoints" not in main.attrs:
        raise ValueError("program: not a pserver-mode trainer program (no _endpoints); "
                         "transpile it first")
    if not main.attrs.get("_is_chief"):
        return
    attrs = rpc_attrs(epmap=list(main.attrs["_endpoints"]), dir=config.checkpoint_dir,
                      lookup_table=main.attrs.get("_distributed_lookup_table") or "",
                      trainer_id=int(main.attrs.get("_trainer_id", 0)))

    def notify(sub: Block) -> None:
        sub.append_op("checkpoint_notify", {}, {}, dict(attrs))

    append_every_k_steps(main, startup, CHECKPOINT_STEP, config.step_interval, notify, OpRole.RPC)
    rpc_plan_pass(main)  # the notice's block runs RPC ops: the rounds it stands in change
