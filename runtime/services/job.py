"""A job: what a scenario asks every node to run, built the same way on every node.

`Job.from_scenario` builds the model (`transpiler.models`), its data set (`runtime.execution.data`)
and the transpile arguments once; `trainer_programs(i)` and `pserver_programs(j)` transpile for one
role. Building is deterministic, so a trainer and a pserver in different processes (or hosts) that
read the same scenario agree on every program, name and placement without talking.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from transpiler.distribute.from_spec import TranspileArgs, transpile_args, transpile_from_spec
from transpiler.ir import Program
from transpiler.models import Model, build_model

from runtime.config.scenario import Scenario
from runtime.execution.data import Dataset, dataset_for


@dataclass
class Job:
    scenario: Scenario
    args: TranspileArgs

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
        t = transpile_from_spec(self.model.main, self.model.startup, self.args, trainer_id)
        return t.get_trainer_program(), t.get_trainer_startup_program()

    def pserver_programs(self, index: int) -> tuple[Program, Program]:
        t = transpile_from_spec(self.model.main, self.model.startup, self.args, 0)
        return t.get_pserver_programs(self.endpoints[index])
