"""A job: what a scenario asks every node to run, built the same way on every node.

`Job.from_scenario` builds the model (`transpiler.models`), its data set (`runtime.execution.data`)
and the transpile arguments once; `trainer_programs(i)` and `pserver_programs(j)` transpile for one
role. Building is deterministic, so a trainer and a pserver in different processes (or hosts) that
read the same scenario agree on every program, name and placement without talking.

One job serving many roles (the simulator, a local cluster) transpiles as little as it can: the
pservers' programs all come from one transpile, and trainers whose programs differ only by the
trainer id written in them share one pair of programs.

DESIGN: sharing trainer programs. A trainer program names its trainer in the ``trainer_id``
attribute of its RPC ops and in the program's ``_trainer_id``; nothing in the runtime reads them
(a trainer's id is its node's, `RpcOps.trainer_id`), and the trainer only reads ``_is_chief``,
which trainer 0 alone has. Some modes write the id into names too (a sync distributed table's
per-trainer gradient pieces), so programs are shared only when trainers 1 and 2 prove it safe:
their programs, with those attributes left out, are equal op for op. Then every trainer but the
chief runs trainer 1's programs (the same objects: a shared program costs its memory and its
transpile once, which at 1,000 trainers are most of a simulation's start-up), else each trainer
gets its own. The programs are never changed once built (the executor only caches its plan of
them), so sharing them is safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from transpiler.distribute.from_spec import TranspileArgs, transpile_args, transpile_from_spec
from transpiler.distribute.transpiler import DistributeTranspiler
from transpiler.ir import Program
from transpiler.models import Model, build_model

from runtime.config.scenario import Scenario
from runtime.execution.data import Dataset, dataset_for


@dataclass
class Job:
    scenario: Scenario
    args: TranspileArgs
    _trainer_programs: dict[int, tuple[Program, Program]] = field(
        default_factory=dict, repr=False, compare=False)
    """Built trainer programs: by trainer id, or -1 for those every non-chief trainer shares."""

    @staticmethod
    def from_scenario(scenario: Scenario, endpoints: list[str] | None = None) -> "Job":
        cluster = scenario.cluster.model_dump(exclude_none=True, exclude={"hosts"})
        if endpoints:
            cluster["endpoints"] = {"pservers": list(endpoints)}
        transpiler = scenario.transpiler.model_dump()
        return Job(scenario, transpile_args(transpiler, cluster))

    @cached_property
    def model(self) -> Model:
        spec = self.scenario.model
        optimizer = spec.optimizer.model_dump()
        return build_model(spec.name, optimizer=optimizer, lr=spec.lr, seed=self.scenario.seed,
                           **spec.builder_kwargs())

    @cached_property
    def dataset(self) -> Dataset:
        data = self.scenario.data
        params = {"size": data.size} if data.size else {}
        return dataset_for(self.model, data.name, seed=self.scenario.seed, **params)

    @property
    def endpoints(self) -> list[str]:
        return list(self.args.pservers)

    @property
    def trainers(self) -> int:
        return self.args.trainers

    @property
    def sync(self) -> bool:
        return self.args.sync_mode

    @property
    def timing(self) -> bool:
        """Timing mode: every node runs the phantom kernels (shapes, no arithmetic)."""
        return self.scenario.backend.kernels == "phantom"

    def trainer_programs(self, trainer_id: int) -> tuple[Program, Program]:
        """Trainer `trainer_id`'s main and startup programs (shared with the other non-chief
        trainers where theirs differ only by the id: see the module's DESIGN note)."""
        key = -1 if trainer_id > 0 and self._shared_trainer_programs else trainer_id
        programs = self._trainer_programs.get(key)
        if programs is None:
            programs = self._trainer_programs[key] = self._transpile_trainer(
                1 if key == -1 else trainer_id)
        return programs

    def _transpile_trainer(self, trainer_id: int) -> tuple[Program, Program]:
        t = transpile_from_spec(self.model.main, self.model.startup, self.args, trainer_id)
        return t.get_trainer_program(), t.get_trainer_startup_program()

    @cached_property
    def _shared_trainer_programs(self) -> bool:
        """Whether the non-chief trainers can share programs: trainers 1 and 2 have the same
        ones but for the trainer id written in them."""
        if self.trainers < 3:
            return False
        one, two = self._transpile_trainer(1), self._transpile_trainer(2)
        self._trainer_programs[1], self._trainer_programs[2] = one, two
        return all(_without_id(a) == _without_id(b) for a, b in zip(one, two))

    @cached_property
    def _pserver_transpiler(self) -> DistributeTranspiler:
        return transpile_from_spec(self.model.main, self.model.startup, self.args, 0)

    def pserver_programs(self, index: int) -> tuple[Program, Program]:
        return self._pserver_transpiler.get_pserver_programs(self.endpoints[index])


_ID_ATTRS = {"trainer_id", "_trainer_id"}
"""Attributes that name the trainer a program was transpiled for."""


def _without_id(program: Program) -> list[Any]:
    """`program` as comparable data, without the attributes naming its trainer."""
    return [{k: v for k, v in program.attrs.items() if k not in _ID_ATTRS},
            [[(op.type, op.inputs, op.outputs,
               {k: v for k, v in op.attrs.items() if k not in _ID_ATTRS})
              for op in block.ops] for block in program.blocks],
            [sorted(block.vars.items()) for block in program.blocks]]
