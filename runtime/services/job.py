"""A job: what a scenario asks every node to run, built the same way on every node.

`Job.from_scenario` builds the model (`transpiler.models`), its data set
(`runtime.execution.data`) and the transpile arguments once; `trainer_programs(i)` and
`pserver_programs(j)` transpile for one role. In the nccl2 and collective modes
(`Job.collective`) there are no pservers: `endpoints` is empty, the trainers' own endpoints are
`peers`, and an nccl2 trainer runs its program with the all-reduce ops Paddle's executor would
add (`nccl2_executable`). Building is deterministic, so a trainer and a pserver in different
processes (or hosts) that read the same scenario agree on every program, name and placement
without talking.

A model named ``module:function`` is imported from the scenario file's folder first
(`Scenario.folder`), in every process that loads the scenario. A builder or data set that cannot
be made is a `JobError` naming the scenario, the builder or data set, and the cause;
`check_job` makes both, so the commands call it before they start anything.

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

Where the names differ too (sync mode: trainer t sends its copy of a grad block as
``<block>.trainer_{t}``), a job whose trainers all run in this process (`LocalCluster`, the
simulator) may still share: `programs_to_run(t)` gives every trainer from 2 on trainer 1's
programs and the renames that turn trainer 1's copies into trainer t's (`retarget_copy`), which
the trainer applies to the names its sends put on the wire (`RpcOps`); inside the trainer a
name is only a key of its own scope. That is safe when trainer 2's programs, renamed to trainer
1's, are trainer 1's (ids aside), no name with trainer 1's mark is in trainer 2's programs too,
and trainer 1's copies leave the trainer only through sends: no other RPC op, no attribute
(the role annotation ``op_role_var`` aside, which nothing reads) and no program attribute names
one. Otherwise each trainer runs its own. At 1,000 sync trainers this is 400 MB of programs
held once instead of a thousand times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from transpiler.distribute.collective import nccl2_executable
from transpiler.distribute.modes import MODES
from transpiler.distribute.from_spec import (TRAINER_RING_MODES, TranspileArgs, transpile_args,
                                             transpile_from_spec)
from transpiler.distribute.lookup_table import remote_prefetch_ops
from transpiler.distribute.plan import retarget_copy
from transpiler.distribute.transpiler import DistributeTranspiler
from transpiler.ir import Program
from transpiler.models import Model, ModelError, build_model
from transpiler.opcatalog import runs_rpc

from runtime.config.scenario import Scenario, ScenarioError
from runtime.execution.data import DataError, Dataset, dataset_for
from runtime.execution.datafiles import FileDataset, FileOptions
from runtime.execution.executor import device_binder
from runtime.execution.kernels import ExecutionError


class JobError(ScenarioError):
    """A scenario whose model or data cannot be made; names the scenario, the model or data set
    and the cause."""


class RunPrograms(NamedTuple):
    """What a trainer runs (`Job.programs_to_run`): its main and startup programs, and the
    names it sends under instead of the programs' own (empty: the programs' own)."""

    main: Program
    startup: Program
    renames: Mapping[str, str]


@dataclass
class Job:
    scenario: Scenario
    args: TranspileArgs
    _trainer_programs: dict[int, tuple[Program, Program]] = field(
        default_factory=dict, repr=False, compare=False)
    """Built trainer programs: by trainer id, or -1 for those every non-chief trainer shares."""

    @staticmethod
    def from_scenario(scenario: Scenario, endpoints: list[str] | None = None) -> "Job":
        """The job of `scenario`; `endpoints` replace the scenario's: the pservers', or in the
        nccl2 and collective modes the trainers'."""
        cluster = scenario.cluster.for_transpiler()
        role = "trainers" if scenario.transpiler.mode in TRAINER_RING_MODES else "pservers"
        if endpoints:
            cluster["endpoints"] = {role: list(endpoints)}
        transpiler = scenario.transpiler.model_dump()
        return Job(scenario, transpile_args(transpiler, cluster))

    @cached_property
    def model(self) -> Model:
        spec, scenario = self.scenario.model, self.scenario
        try:
            return build_model(spec.name, folder=str(scenario.folder),
                               optimizer=spec.optimizer.model_dump(), lr=spec.lr,
                               seed=scenario.seed, **spec.builder_kwargs())
        except Exception as err:  # a builder is user code: whatever it raises is its failure
            cause = str(err) if isinstance(err, ModelError) else \
                f"model {spec.name!r}: the builder raised {type(err).__name__}: {err}"
            raise JobError(f"{scenario.source}: {cause}") from err

    @cached_property
    def dataset(self) -> Dataset | FileDataset:
        data, scenario = self.scenario.data, self.scenario
        try:
            if data.is_file:
                return FileDataset(data.name or "", self.data_path, self.model, data.feeds,
                                   FileOptions(shuffle=bool(data.shuffle), seed=scenario.seed,
                                               size=data.size, header=data.header,
                                               delimiter=data.delimiter,
                                               zero_based=data.zero_based,
                                               log_ints=data.log_ints))
            params = {"size": data.size} if data.size else {}
            return dataset_for(self.model, data.name, seed=scenario.seed, **params)
        except DataError as err:
            raise JobError(f"{scenario.source}: data: {err}") from err

    @property
    def data_path(self) -> Path:
        """`data.path`, a relative one taken from the scenario file's folder."""
        return self.scenario.folder / (self.scenario.data.path or "")

    def check(self, data: bool = True) -> None:
        """Make the model and (with `data`) the data set now, and check that every role's
        device exists, so that a failure is a `JobError` before any node starts."""
        self.model  # noqa: B018 (made for its errors)
        if data:
            self.dataset  # noqa: B018
        check_devices(self.scenario)
        self.check_timing()

    def check_timing(self) -> None:
        """A `JobError` where timing mode meets a remote prefetch: a lookup or `nce` marked
        ``remote_prefetch`` (in the pserver modes but geo) makes its trainer ask the pservers
        for the rows of the ids it reads (`distributed_lookup_table`) or of the classes it
        samples (`nce`), and phantom kernels have no ids to ask for."""
        if not self.timing or not MODES[self.scenario.transpiler.mode].remote_prefetch:
            return
        for op, table in remote_prefetch_ops(self.model.main):
            raise JobError(
                f"{self.scenario.source}: {op.type} of {table!r} has remote_prefetch, which "
                "timing mode (backend.kernels: phantom) cannot run: its trainer fetches the "
                "table's rows for the ids it reads (nce: the classes it samples), and phantom "
                "kernels draw no real ids; use backend.kernels numpy or torch, or no "
                "remote_prefetch")

    @property
    def endpoints(self) -> list[str]:
        """The pservers' endpoints (none in the nccl2 and collective modes)."""
        return list(self.args.pservers)

    @property
    def collective(self) -> bool:
        """nccl2 or collective mode: no pservers, the trainers all-reduce among themselves."""
        return bool(self.args.trainer_endpoints)

    @property
    def peers(self) -> list[str]:
        """The trainers' endpoints in the nccl2 and collective modes (else none)."""
        return list(self.args.trainer_endpoints)

    @property
    def trainers(self) -> int:
        return self.args.trainers

    @property
    def sync(self) -> bool:
        return self.args.sync_mode

    @property
    def family(self) -> str | None:
        """The family of jobs whose runtime costs a machine file may price apart
        (`runtime.launch.calibrate.FAMILY_REFERENCES`): ``table`` where its trainers prefetch
        rows of a distributed table (a ``prefetch`` op); None for the rest."""
        if self.collective:
            return None
        main, _ = self.trainer_programs(0)
        if any(op.type == "prefetch" for block in main.blocks for op in block.ops):
            return "table"
        return None

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

    def programs_to_run(self, trainer_id: int) -> RunPrograms:
        """What trainer `trainer_id` of a job whose trainers all run in this process runs: its
        programs, or trainer 1's and the renames of its copies (see the module's DESIGN note)."""
        copies = self._renamed_copies if trainer_id >= 2 else None
        if copies is None:
            return RunPrograms(*self.trainer_programs(trainer_id), {})
        main, startup = self._trainer_programs[1]
        return RunPrograms(main, startup,
                           {name: retarget_copy(name, 1, trainer_id) for name in copies})

    def _transpile_trainer(self, trainer_id: int) -> tuple[Program, Program]:
        t = transpile_from_spec(self.model.main, self.model.startup, self.args, trainer_id)
        main = t.get_trainer_program()
        if self.args.config.mode == "nccl2":
            main = nccl2_executable(main)
        return main, t.get_trainer_startup_program()

    @cached_property
    def _shared_trainer_programs(self) -> bool:
        """Whether the non-chief trainers can share programs: trainers 1 and 2 have the same
        ones but for the trainer id written in them."""
        if self.trainers < 3:
            return False
        one, two = self._transpile_trainer(1), self._transpile_trainer(2)
        self._trainer_programs[1], self._trainer_programs[2] = one, two
        return all(_plain(a) == _plain(b) for a, b in zip(one, two))

    @cached_property
    def _renamed_copies(self) -> frozenset[str] | None:
        """The names of trainer 1's copies, where every trainer from 2 on can run trainer 1's
        programs with them renamed (see the module's DESIGN note); None where it cannot, or
        needs no renames."""
        if self.trainers < 3 or self._shared_trainer_programs:
            return None
        return renamed_copies(self._trainer_programs[1], self._trainer_programs[2])

    @cached_property
    def _pserver_transpiler(self) -> DistributeTranspiler:
        return transpile_from_spec(self.model.main, self.model.startup, self.args, 0)

    def pserver_programs(self, index: int) -> tuple[Program, Program]:
        return self._pserver_transpiler.get_pserver_programs(self.endpoints[index])


def check_devices(scenario: Scenario) -> None:
    """Raise `JobError`, naming the role and the device, unless the trainers' and pservers'
    devices exist on this machine (a cpu-only backend has nothing to check)."""
    backend = scenario.backend
    for role in ("trainer", "pserver"):
        device = backend.device_for(role)
        if device == "cpu":
            continue
        try:
            device_binder(backend.kernels, device)
        except ExecutionError as err:
            field = "pserver_device" if role == "pserver" else "device"
            raise JobError(f"{scenario.source}: backend.{field} {device} ({role}s): {err}") from err


def check_job(scenario: Scenario, data: bool = True) -> None:
    """Raise `JobError` unless `scenario`'s model and (with `data`) data set can be made and its
    devices exist."""
    Job.from_scenario(scenario).check(data)


_ID_ATTRS = {"trainer_id", "_trainer_id"}
"""Attributes that name the trainer a program was transpiled for."""

_LOCAL_ATTRS = {"op_role_var"}
"""Attributes that name vars but never leave the trainer (nothing in the runtime reads them)."""

Programs = tuple[Program, Program]


def renamed_copies(one: Programs, two: Programs) -> frozenset[str] | None:
    """The names in trainer 1's programs `one` that are its copies, if every trainer t can run
    `one` with those renamed to trainer t's (`retarget_copy`) where they leave it: `two`,
    trainer 2's programs, with its copies renamed to trainer 1's, are `one` (ids aside), no
    name of trainer 1's copies is in `two` as well, and they leave trainer 1 through sends only
    (the module's DESIGN note). None otherwise, or when there are no copies."""
    ones, twos = set(_strings(one)), set(_strings(two))
    mine = {name for name in ones if retarget_copy(name, 1, 2) != name}
    back = {name: retarget_copy(name, 2, 1) for name in twos}
    back = {old: new for old, new in back.items() if old != new}
    if not mine or mine & twos or set(back.values()) != mine:
        return None
    if any(_plain(a) != _plain(b, back) for a, b in zip(one, two)):
        return None
    if any(_names_beyond_sends(program, mine) for program in one):
        return None
    return frozenset(mine)


def _strings(programs: Programs) -> list[str]:
    """Every string in `programs` (names, attributes, op types)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
    for program in programs:
        walk(program.to_dict())
    return found


def _names_beyond_sends(program: Program, names: set[str]) -> bool:
    """Whether any of `names` is in `program` where a trainer would put it on the wire other
    than as a sent var's name (a send's input or ``send_varnames``): an RPC op's input or
    output but a send's, any other attribute, a program attribute."""
    if names & set(_strings_of(program.attrs)):
        return True
    for block in program.blocks:
        for op in block.ops:
            if runs_rpc(op) and op.type != "send" and names & set(
                    op.input_arg_names + op.output_arg_names):
                return True
            local = _LOCAL_ATTRS | {"send_varnames"} if op.type == "send" else _LOCAL_ATTRS
            if names & set(_strings_of({k: v for k, v in op.attrs.items() if k not in local})):
                return True
    return False


def _strings_of(attrs: Mapping[str, Any]) -> list[str]:
    """The strings among `attrs`' values, in lists too."""
    out: list[str] = []
    for value in attrs.values():
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out += [v for v in value if isinstance(v, str)]
    return out


def _plain(program: Program, renames: Mapping[str, str] | None = None) -> Any:
    """`program` as plain data, without the attributes naming its trainer and with its strings
    renamed by `renames`."""
    renames = renames or {}

    def plain(value: Any) -> Any:
        if isinstance(value, str):
            return renames.get(value, value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k not in _ID_ATTRS}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value
    return plain(program.to_dict())
