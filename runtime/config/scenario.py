"""Scenario files: one YAML document describes a run that `sim run` and `runtime up` both replay.

The schema is a tree of pydantic models (`Scenario`), strict about unknown fields, so a typo is
an error and not a silently ignored setting, and so is a key given twice in one mapping, at any
depth (`runtime.config.yaml_source`). `load_scenario(path)` reports every problem on a line of
its own, naming the file, the line, the field path and a reason, e.g.
``quickstart.yaml:14: cluster.trainers: Input should be greater than or equal to 1``.
`--set path=value` overrides (`runtime.config.overrides`) are validated the same way, and a
problem with a value one gave names it instead of the file: ``--set cluster.trainerz=3:
cluster.trainerz: Extra inputs are not permitted (did you mean 'trainers'?)``. A rule over
several fields (`CrossFieldError`) names them all, and the ``--set`` or line of one
(`runtime.config.scenario_errors`).

`network` is checked here too (`runtime.config.netspec`: the simulator simulates it, `runtime up
--netns` applies it to real links); `compute` belongs to the simulator, which parses it
(`sim.cost`); `faults` is checked here (`runtime.config.faults`), against the cluster's nodes too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from transpiler.distribute.modes import MODES, TRAINER_RING_MODES, ModeName, conflicts
from transpiler.distribute.rpc_plan import DEFAULT_PROTOCOL, Protocol
from transpiler.opcatalog import optimizer_types

from runtime.config import units
from runtime.config.faults import Fault, check_against
from runtime.config.netspec import NetworkSection
from runtime.config.nodes import node_names
from runtime.config.overrides import Override, apply_overrides, parse_override
from runtime.config.scenario_errors import CrossFieldError, describe
from runtime.config.yaml_source import ScenarioError, read_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


if TYPE_CHECKING:
    OptimizerType = str
else:
    # DESIGN: a Literal built from the op catalog's optimizers (those that run), so pydantic
    # still reports "Input should be 'sgd', 'momentum', ... or 'ftrl'"; mypy sees a str.
    OptimizerType = Literal[optimizer_types("kernel")]


class OptimizerSpec(BaseModel):
    """The optimizer `transpiler.models` appends; keys other than these go to it
    (e.g. `momentum`, `beta1`)."""

    model_config = ConfigDict(extra="allow")
    type: OptimizerType = "sgd"
    """The optimizer op (`sgd`, `momentum`, `adam`, ...)."""
    learning_rate: float = Field(0.1, gt=0)
    """The base learning rate (an `lr` schedule starts from it)."""


class ModelSpec(BaseModel):
    """`name` picks a builder of `transpiler.models`; other keys go to it as arguments."""

    model_config = ConfigDict(extra="allow")
    name: str
    """A model of `transpiler.models.MODELS` (linear, mlp, ctr_dnn, word2vec, cnn) or a builder of
    one's own, ``module:function``, the module looked up in the scenario file's folder first
    (no PYTHONPATH needed); the builder contract is in the README."""
    optimizer: OptimizerSpec = OptimizerSpec()
    """The optimizer and its arguments."""
    lr: dict[str, Any] | None = None
    """A learning-rate schedule: ``{type: NAME, ...}``, a schedule of
    `transpiler.models.LR_SCHEDULES` and its arguments (none: a constant rate)."""

    def builder_kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


DATA_FORMATS = ("npz", "csv", "libsvm", "criteo")
"""The file formats `data.name` takes (`runtime.execution.datafiles`)."""

_FORMAT_OPTIONS = {"header": ("csv",), "delimiter": ("csv",), "zero_based": ("libsvm",),
                   "log_ints": ("criteo",)}


class DataSpec(_Strict):
    """What each trainer reads its shard of each global batch from: a built-in data set
    (`runtime.execution.data`) or a file of one's own (`runtime.execution.datafiles`)."""

    name: str | None = None
    """A built-in data set of `runtime.execution.data.DATASETS` (synthetic_regression,
    synthetic_classification, ctr, skipgram, digits), or the format of the file at `path`:
    npz, csv, libsvm or criteo; none: the model's own data set."""
    path: str | None = None
    """The file to read (npz, csv, libsvm, criteo); a relative path starts from the scenario
    file's folder. Every trainer opens it: across hosts, it must exist on each trainer's."""
    batch_size: int = Field(32, ge=1)
    """Examples each trainer reads a step: a step's global batch is ``batch_size x trainers``
    examples, trainer ``t`` reading the ``t``-th ``batch_size`` of them."""
    shard: Literal["by_trainer"] = "by_trainer"
    """How a global batch is cut: by trainer id (the only way)."""
    size: int | None = Field(None, ge=1)
    """Examples in the data set (none: the data set's own size); for a file, it reads only
    its first `size` records."""
    feeds: dict[str, str | list[str]] | None = None
    """For a file: which columns fill each of the model's feeds, ``{feed: column, or pattern
    such as "px*", or a list of them}``, e.g. ``{x: [c0, c1, c2], label: y}``; a feed not
    named reads the column of its own name (criteo and libsvm have defaults of their own)."""
    shuffle: bool | None = None
    """For a file: visit the records in a new seeded order every epoch (none or false: in file
    order). Built-in data sets are always reshuffled."""
    header: bool = True
    """csv: the first line names the columns (false: they are c0, c1, ...)."""
    delimiter: str = Field(",", min_length=1, max_length=1)
    """csv: the field separator."""
    zero_based: bool = False
    """libsvm: feature indices start at 0 (libsvm's own start at 1)."""
    log_ints: bool = True
    """criteo: the integer features x become log(1 + max(x, 0))."""

    @property
    def is_file(self) -> bool:
        return self.name in DATA_FORMATS

    @model_validator(mode="after")
    def _file_fields(self) -> "DataSpec":
        """A file format needs a `path`, a built-in data set takes none; format options belong
        to their formats."""
        if self.is_file and not self.path:
            raise CrossFieldError(f"name {self.name}: reading a file needs its path", "name",
                                 "path")
        if not self.is_file:
            stated = [f for f in ("path", "feeds") if getattr(self, f) is not None]
            if stated or self.shuffle is False:
                built = self.name or "the model's own data set"
                why = (f"{stated[0]} is for files" if stated else
                       "shuffle: false is for files; built-in data sets are always reshuffled")
                raise CrossFieldError(f"{why} (name: {' | '.join(DATA_FORMATS)}); {built} is "
                                      "built in", stated[0] if stated else "shuffle", "name")
        for option, formats in _FORMAT_OPTIONS.items():
            if option in self.model_fields_set and self.name not in formats:
                raise CrossFieldError(f"{option} is for data.name {' or '.join(formats)}, not "
                                      f"{self.name}", option, "name")
        return self


Security = Literal["auto", "local", "curve", "none"]
"""`ClusterSpec.security`'s choices; `ClusterSpec.secured` resolves ``auto``."""


class HostSpec(_Strict):
    """Nodes that share one machine's cores (the simulator's `sim.cpu`)."""

    name: str | None = None
    """A name for reports (none: ``host<i>``)."""
    nodes: list[str] = Field(min_length=1, description="node names or patterns, e.g. trainer:*")
    cores: float = Field(gt=0, allow_inf_nan=False, description="the cores the nodes share")

    @field_validator("nodes", mode="before")
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class ClusterSpec(_Strict):
    """How many nodes of each role, where the pservers listen, and which nodes share
    a machine."""

    pservers: int = Field(1, ge=0, le=4096)
    """Parameter servers, ``pserver:0`` ... ``pserver:<n-1>``; 0 (none) only in the nccl2
    and collective modes, which have none and take any value as 0."""
    trainers: int = Field(1, ge=1, le=65536)
    """Trainers, ``trainer:0`` ... ``trainer:<n-1>``."""
    endpoints: dict[str, list[str]] | None = None
    """``{pservers: [host:port, ...]}``: one endpoint per pserver, in order; in the nccl2
    and collective modes ``{trainers: [...]}``, one per trainer (none: ``host:base_port+i``,
    or free ports under `runtime up`)."""
    host: str = "127.0.0.1"
    """The host the pservers' (nccl2, collective: the trainers') endpoints are on when
    `endpoints` does not list them."""
    base_port: int = Field(0, ge=0, le=65535)
    """The first pserver's (nccl2, collective: trainer's) port, the others' following it (0:
    6170 for the programs; `runtime up` then picks free ports)."""
    hosts: list[HostSpec] | None = Field(None, description="which nodes share a machine and "
                                         "its cores; a node on none has a machine of its own")
    security: Security = Field(
        "auto", description="how nodes keep their messages to themselves: local (ZeroMQ ipc "
        "sockets in a directory only the job's user can open, no encryption: one host), curve "
        "(CurveZMQ over TCP: every connection authenticated, every byte encrypted), none (plain "
        "TCP, as runtime up --insecure), or auto: local where every node runs on one host in "
        "one network namespace (runtime up without --netns or message faults; in the "
        "simulator, cluster.hosts puts every node on one host), curve otherwise. runtime up's "
        "--insecure and --keys override it; see SECURITY.md")

    @field_validator("hosts")
    @classmethod
    def _hosts_place_nodes(cls, hosts: list[HostSpec] | None,
                           info: ValidationInfo) -> list[HostSpec] | None:
        """Every pattern of `hosts` names a node of the cluster, and no node is on two hosts."""
        pservers, trainers = info.data.get("pservers"), info.data.get("trainers")
        if not hosts or pservers is None or trainers is None:
            return hosts
        nodes = node_names(pservers, trainers)
        owner: dict[str, int] = {}
        for h, host in enumerate(hosts):
            for pattern in host.nodes:
                matched = [n for n in nodes if fnmatchcase(n, pattern)]
                if not matched:
                    raise ValueError(f"[{h}].nodes: {pattern!r} names no node of the cluster "
                                     f"(pserver:0..{pservers - 1}, trainer:0..{trainers - 1})")
                for node in matched:
                    if owner.setdefault(node, h) != h:
                        raise ValueError(f"[{h}].nodes: {node} is on hosts[{owner[node]}] "
                                         "already; a node runs on one host")
        return hosts

    def for_transpiler(self) -> dict[str, Any]:
        """The fields the transpiler reads (`transpiler.distribute.from_spec`): all but where
        the nodes run and how they talk."""
        return self.model_dump(exclude_none=True, exclude={"hosts", "security"})

    def secured(self, one_host: bool) -> Security:
        """`security` for a job whose nodes all run on one host in one network namespace
        (`one_host`) or not: ``auto`` is ``local`` there and ``curve`` elsewhere."""
        if self.security == "auto":
            return "local" if one_host else "curve"
        return self.security

    def on_one_host(self) -> bool:
        """Whether `hosts` puts every node on one simulated host."""
        if not self.hosts or len(self.hosts) != 1:
            return False
        patterns = self.hosts[0].nodes
        return all(any(fnmatchcase(node, p) for p in patterns)
                   for node in node_names(self.pservers, self.trainers))

    @model_validator(mode="after")
    def _endpoints_match(self) -> "ClusterSpec":
        """`endpoints` has only a ``pservers`` list, of one distinct ``host:port`` per pserver."""
        if self.endpoints is None:
            return self
        unknown = set(self.endpoints) - {"pservers", "trainers"}
        if unknown:
            raise ValueError(f"endpoints: unknown role(s) {sorted(unknown)} (pservers, trainers)")
        for role, count in (("pservers", self.pservers), ("trainers", self.trainers)):
            eps = self.endpoints.get(role, [])
            if eps and len(eps) != count:
                raise CrossFieldError(f"endpoints.{role} lists {len(eps)} endpoints for {count} "
                                      f"{role}", f"endpoints.{role}", role)
            for ep in eps:
                host, _, port = ep.rpartition(":")
                if not host or not port.isdigit():
                    raise ValueError(f"endpoint {ep!r} is not host:port")
            if len(set(eps)) != len(eps):
                raise ValueError(f"endpoints.{role} has duplicates: {eps}")
        return self


class CompressionSpec(_Strict):
    """How trainers pack the gradients they send to pservers, with error feedback
    (`runtime.network.compression`; docs/wire.md, "Compressed gradients")."""

    method: Literal["none", "topk", "fp16", "int8"] = "none"
    """none; topk (the largest `ratio` of each gradient block's values by magnitude, with
    their indices); fp16 (half precision); int8 (a scale per block and a byte per value)."""
    ratio: float = Field(0.01, gt=0, le=1)
    """topk: the share of each block's values sent."""


class TranspilerSpec(_Strict):
    """How the distribute transpiler splits the program (docs/transpiler.md)."""

    mode: ModeName = "sync"
    """The distributed mode: sync (barriers each step), async, ssp (async with bounded
    staleness, `staleness`), half_async or geo (Geo-SGD), with pservers; or nccl2 or
    collective, without: the trainers all-reduce among themselves (docs/architecture.md,
    "Collective modes")."""
    slice_var_up: bool = True
    """Cut large vars into blocks spread over the pservers (false: whole vars)."""
    split_method: Literal["round_robin", "hash_name"] = "round_robin"
    """How blocks are placed on pservers: in turn, or by a hash of the name."""
    min_block_size: int = Field(8192, ge=8192)
    """The fewest elements of a block when a var is cut."""
    dc_asgd: bool = False
    """Delay-compensated async SGD (DC-ASGD); async mode only."""
    geo_push_every: int = Field(100, ge=1)
    """Geo mode: a trainer pushes its parameter deltas every this many steps."""
    collective_mode: Literal["grad_allreduce", "local_sgd",
                             "single_process_multi_thread"] = "grad_allreduce"
    """Collective mode: all-reduce the mean gradient every step, or train locally and
    average the parameters every `local_sgd_k_steps` steps; or single_process_multi_thread,
    the original's mode of one process driving several devices, with one ring that never
    connects processes: one trainer (`cluster.trainers: 1`) here, which trains as a local
    run does (docs/transpiler.md §8)."""
    local_sgd_k_steps: int = Field(1, ge=1)
    """Collective mode, local_sgd: steps between two parameter averages."""
    nccl_comm_num: int = Field(1, ge=1, le=64)
    """nccl2 and collective modes: rings, used by the parameters in turn."""
    staleness: Annotated[int, Field(ge=0)] | Literal["inf"] | None = None
    """ssp mode (and only it): how many steps a trainer may run ahead of the slowest live
    trainer (0: every read waits for every trainer's last step, as in sync; inf: no bound, as
    in async)."""
    compression: CompressionSpec = CompressionSpec()
    """sync, async, ssp and half_async: how the gradients sent to pservers are packed."""

    @model_validator(mode="after")
    def _mode_fields(self) -> "TranspilerSpec":
        """`dc_asgd` needs `mode: async`; `staleness` goes with `mode: ssp`; `compression` needs
        a mode that sends gradients to pservers."""
        for message, fields in conflicts(self.mode, self.dc_asgd, self.staleness,
                                         self.compression.method):
            raise CrossFieldError(message, *fields)
        return self


class TrainSpec(_Strict):
    """How long the job trains, and the runtime's timeouts and checkpoints. Durations
    are seconds or a number with a unit (``2s``, ``500ms``)."""

    steps: int = Field(100, ge=1)
    """Training steps every trainer takes."""
    deadline: float = Field(600.0, gt=0, description="seconds a whole run may take")
    heartbeat_timeout: float = Field(10.0, gt=0, description="a pserver drops a trainer silent "
                                     "this long from the fan-in (a trainer heartbeats between "
                                     "its kernel ops, not during one: exceed the longest op)")
    startup_timeout: float = Field(60.0, gt=0, description="a pserver drops a trainer it has "
                                   "never heard from this long after it started serving")
    retry_after: float = Field(1.0, gt=0, description="seconds before an unanswered request is "
                               "sent again (then twice as long each time, up to 10 s, unless "
                               "the pserver shows the answer was lost; a call of megabytes "
                               "waits 3 times what its bytes took to that pserver if longer)")
    request_timeout: float = Field(120.0, gt=0, description="seconds a request may go "
                                   "unanswered before its node fails, naming the pserver")
    protocol: Protocol = Field(
        DEFAULT_PROTOCOL, description="how a step's requests travel: bundled (the default, the "
        "fastest for real) sends each pserver one SEND a step (when the last send op to it "
        "runs) carrying send_barrier, the step's GET and fetch_barrier, its reply the values "
        "(async: the GET alone); compact sends a SEND per send op and a GET per recv op, the "
        "barriers on the last to each pserver; per_op also sends the barriers as requests of "
        "their own, a message per RPC op, as Paddle's traces read (the same semantics in all "
        "three; profile a job in the protocol it will run: see the README)")
    on_nonfinite: Literal["refuse", "skip_step", "allow"] = Field(
        "refuse", description="what a pserver does with a gradient holding NaN, an infinity or "
        "a magnitude beyond the square root of its dtype's largest value (1.8e19 in float32): "
        "refuse (an error reply naming the var; the trainer fails, and the run's verdict names "
        "it), skip_step (the update of that step is left out; sync: the whole step's on that "
        "pserver) or allow; counted per trainer in metrics.json (pservers' nonfinite)")
    log_every: int = Field(10, ge=1)
    """A progress line per trainer every this many steps."""
    checkpoint_every: int | None = Field(None, ge=1, description="pservers save their state "
                                         "every this many steps (and restart from the last)")
    checkpoint_dir: str | None = Field(None, description="where; default <outputs.dir>/"
                                       "checkpoints, or a temporary directory")
    checkpoint_by: Literal["pserver", "trainer"] = Field(
        "pserver", description="who starts the checkpoints every checkpoint_every steps: each "
        "pserver on its own, or trainer 0 with a checkpoint_notify to every pserver, as "
        "Paddle's chief trainer did (pserver modes)")

    @field_validator("deadline", "heartbeat_timeout", "startup_timeout", "retry_after",
                     "request_timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        """The timeouts may be written with a unit (``2s``, ``500ms``)."""
        return units.duration(v)


DEVICE_PATTERN = r"^(cpu|cuda|cuda:[0-9]+|cuda:local)$"
"""The devices a role's kernels may run on (checked against the machine by the torch backend)."""


class BackendSpec(_Strict):
    """`kernels`: numpy or torch compute (numeric mode), or phantom: shapes only, no arithmetic
    (timing mode, for the simulator at scale; `runtime up` refuses it, and so does the simulator
    for a job with a remote prefetch, a lookup or `nce` marked ``remote_prefetch`` in a
    pserver mode but geo: its trainer needs real ids to fetch rows for). With torch, `device`
    places the trainers' kernels and `pserver_device` the pservers': ``cpu``, ``cuda`` (the
    first visible GPU), ``cuda:N``, or ``cuda:local``: GPU ``local rank % visible GPUs``, where
    a node's local rank is ``LOCAL_RANK`` if its environment sets it, else its index among its
    role's nodes (trainer 3 on a 4-GPU host: GPU 3). A GPU that is not there is reported before
    any node starts."""

    kernels: Literal["numpy", "torch", "phantom"] = "numpy"
    """What runs the ops: numpy, torch, or phantom (timing mode)."""
    device: str = Field("cpu", pattern=DEVICE_PATTERN)
    """Where the trainers' torch kernels run: cpu, cuda, cuda:N or cuda:local."""
    pserver_device: str = Field("cpu", pattern=DEVICE_PATTERN)
    """Where the pservers' torch kernels run (cpu, cuda, cuda:N or cuda:local); cpu unless
    set: a pserver's work is the optimizer update and the bookkeeping of what trainers send,
    which the wire brings to the host anyway."""

    @model_validator(mode="after")
    def _cuda_needs_torch(self) -> "BackendSpec":
        """A cuda device needs `kernels: torch`."""
        for field, device in (("device", self.device), ("pserver_device", self.pserver_device)):
            if device != "cpu" and self.kernels != "torch":
                raise CrossFieldError(f"{field} {device} needs kernels: torch (kernels "
                                      f"{self.kernels} runs on the cpu only)", field, "kernels")
        return self

    def device_for(self, role: str) -> str:
        """The device of a `role` ("trainer" or "pserver") node's kernels."""
        return self.pserver_device if role == "pserver" else self.device


COLLECTIVE_BACKENDS = ("ring", "torch")
"""What carries the collective ops of the nccl2 and collective modes (`CollectiveSpec.backend`)."""


class CollectiveSpec(_Strict):
    """What carries the trainers' collective ops in the nccl2 and collective modes (the
    pserver modes ignore it, so one scenario can be swept over both): pslab's own ring
    all-reduce over the runtime's transport, or `torch.distributed` (a real run's backend:
    `runtime up` and role mode; the simulator and the in-process cluster run the ring in its
    place, docs/architecture.md "Collective modes")."""

    backend: Literal["ring", "torch"] = "ring"
    """``ring``: pslab's ring all-reduce over ZeroMQ (or the simulated network); ``torch``:
    torch.distributed (needs the ``[torch]`` extra), its process group rendezvousing at rank
    0's endpoint."""
    torch_backend: Literal["auto", "nccl", "gloo"] = "auto"
    """With ``backend: torch``, torch.distributed's own backend: ``auto`` is NCCL where the
    trainers' kernels run on a GPU (`backend.device` cuda, which is there) and gloo elsewhere;
    ``nccl`` or ``gloo`` asks for one."""

    @model_validator(mode="after")
    def _torch_backend_needs_torch(self) -> "CollectiveSpec":
        """`torch_backend` other than auto needs `backend: torch`."""
        if self.torch_backend != "auto" and self.backend != "torch":
            raise CrossFieldError(f"torch_backend {self.torch_backend} needs backend: torch, "
                                  f"not {self.backend}", "torch_backend", "backend")
        return self


class ExpectSpec(_Strict):
    """What a run must show to pass; each check is described in `runtime.config.expect`."""

    final_loss_below: float | None = None
    """Trainer 0's mean loss over its last 10 steps is below this."""
    loss_drop_factor: float | None = Field(None, gt=1)
    """Trainer 0's mean loss over its first 10 steps is at least this many times
    its mean over the last 10."""
    params_equal_to: Literal["local", "fault_free"] | None = None
    """The final parameters equal single-process training on the same global
    batches (`local`, within the tolerances) or, bit for bit, the same scenario without its
    faults (`fault_free`)."""
    params_rtol: float = Field(1e-5, gt=0)
    """Relative tolerance of `params_equal_to: local`."""
    params_atol: float = Field(1e-5, ge=0)
    """Absolute tolerance of `params_equal_to: local`."""
    no_lost_updates: bool = False
    """Every pserver rejected no message and, in sync mode, ran exactly
    `train.steps` optimize steps."""
    max_step_time: float | None = None
    """No trainer's step took longer than this (simulated time; `sim run` only)."""
    max_steps_redone: int | None = Field(None, ge=0, description="no trainer redoes more steps "
                                         "than this after pserver restarts")
    error: str | None = Field(None, description="the run must fail with an error whose message "
                              "contains this (a fault the job cannot survive)")

    @field_validator("max_step_time", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float | None:
        """`max_step_time` may be written with a unit (``20ms``)."""
        return None if v is None else units.duration(v)


class OutputsSpec(_Strict):
    """Where a run writes its files and which."""

    dir: str | None = None
    """The output folder (none: ``out/<name>``; `sim run` writes into its ``sim``
    subfolder)."""
    trace: bool = False
    """`sim run`: false turns the Perfetto trace.json off (written unless set
    false or ``--no-trace``)."""
    plots: bool = False
    """`sim run`: false turns the PNG plots off (written unless set false or
    ``--no-plots``)."""


class Scenario(_Strict):
    """One run, as `sim run` and `runtime up` replay it."""

    name: str
    """The run's name: outputs go to ``out/<name>`` by default."""
    description: str = ""
    """Free text for people."""
    seed: int = 0
    """Seeds the model's initial values, the data, the network's latencies and the
    faults' draws: the same seed gives the same run."""
    model: ModelSpec
    """The model to train."""
    data: DataSpec = DataSpec()
    """Its data."""
    cluster: ClusterSpec = ClusterSpec()
    """The nodes."""
    transpiler: TranspilerSpec = TranspilerSpec()
    """How the program is split."""
    train: TrainSpec = TrainSpec()
    """Steps, timeouts, checkpoints."""
    backend: BackendSpec = BackendSpec()
    """Which kernels compute."""
    collective: CollectiveSpec = CollectiveSpec()
    """What carries the trainers' all-reduce in the nccl2 and collective modes."""
    network: NetworkSection | None = None
    """Latency and bandwidth of the links (none: an ideal network)."""
    compute: dict[str, Any] | None = None
    """The simulator's compute model: `roofline`, `profile` (one job measured) or
    `calibrated` (this machine measured, any job priced), see below (none: compute takes no
    simulated time). Each model has its own fields: to change the model on the command line,
    set the whole section (``--set 'compute={model: calibrated, path: machine.json}'``).
    `runtime up` ignores it."""
    faults: list[Fault] = []
    """What goes wrong, where and when."""
    expect: ExpectSpec = ExpectSpec()
    """What the run must show."""
    outputs: OutputsSpec = OutputsSpec()
    """Where it writes."""

    # DESIGN: where the scenario came from is no field of the file but travels with it (a
    # private attribute survives `model_copy`), so every node that loads the same file resolves
    # a model builder or a data file beside it the same way, with no PYTHONPATH.
    _source: str = PrivateAttr("<scenario>")
    _folder: Path | None = PrivateAttr(None)

    @property
    def source(self) -> str:
        """The file the scenario was read from (``<scenario>`` when parsed from text)."""
        return self._source

    @property
    def folder(self) -> Path:
        """The folder paths in the scenario start from: the scenario file's (resolved), else
        the working directory."""
        return self._folder if self._folder is not None else Path.cwd()

    def located(self, source: str, folder: Path | None) -> "Scenario":
        """This scenario, marked as read from `source` in `folder`."""
        self._source, self._folder = source, folder
        return self

    @model_validator(mode="after")
    def _pservers_of_the_mode(self) -> "Scenario":
        """The nccl2 and collective modes have no pservers: `cluster.pservers` is taken as 0
        (so one scenario can be swept over modes with and without); the others need one at
        least. Collective mode needs 2 trainers at least, but single_process_multi_thread,
        which never connects trainer processes, exactly 1."""
        if self.transpiler.mode in TRAINER_RING_MODES:
            self.cluster.pservers = 0
            single = self.transpiler.collective_mode == "single_process_multi_thread"
            if self.transpiler.mode == "collective" and single and self.cluster.trainers != 1:
                raise CrossFieldError(
                    "transpiler.collective_mode single_process_multi_thread never connects "
                    f"trainer processes: it needs cluster.trainers 1, not "
                    f"{self.cluster.trainers} (use grad_allreduce for several)",
                    "transpiler.collective_mode", "cluster.trainers")
            if self.transpiler.mode == "collective" and not single and self.cluster.trainers < 2:
                raise CrossFieldError("transpiler.mode collective needs cluster.trainers >= 2",
                                      "cluster.trainers", "transpiler.mode")
        elif self.cluster.pservers < 1:
            raise CrossFieldError(f"cluster.pservers: 0 only with transpiler.mode nccl2 or "
                                  f"collective, not {self.transpiler.mode}", "cluster.pservers",
                                  "transpiler.mode")
        return self

    @model_validator(mode="after")
    def _sync_only(self) -> "Scenario":
        """`expect.params_equal_to` needs a mode whose every step averages the trainers'
        gradients: sync, nccl2, or collective with grad_allreduce (or
        single_process_multi_thread, its one-trainer form)."""
        averaged = MODES[self.transpiler.mode].averaged or (
            self.transpiler.mode == "collective"
            and self.transpiler.collective_mode in ("grad_allreduce",
                                                    "single_process_multi_thread"))
        if self.expect.params_equal_to and not averaged:
            raise CrossFieldError(f"expect.params_equal_to needs transpiler.mode sync, nccl2 or "
                                  f"collective (grad_allreduce, single_process_multi_thread), "
                                  f"not {self.transpiler.mode}", "expect.params_equal_to",
                                  "transpiler.mode")
        return self

    @model_validator(mode="after")
    def _nccl_reduces_gpu_tensors(self) -> "Scenario":
        """`collective.torch_backend: nccl` needs the trainers' kernels on a GPU
        (`backend.kernels: torch`, `backend.device` cuda): NCCL reduces GPU tensors only."""
        if self.collective.torch_backend == "nccl" and not self.backend.device.startswith("cuda"):
            raise CrossFieldError(f"collective.torch_backend nccl needs the trainers on a GPU "
                                  f"(backend.kernels torch, backend.device cuda...), not device "
                                  f"{self.backend.device}: NCCL reduces GPU tensors only; use "
                                  f"gloo (or auto) on the cpu", "collective.torch_backend",
                                  "backend.device")
        return self

    @model_validator(mode="after")
    def _faults_fit_the_cluster(self) -> "Scenario":
        """Every fault names nodes of the cluster, and the mode can recover from it
        (`runtime.config.faults.check_against`)."""
        try:
            check_against(self.faults, self.cluster.pservers, self.cluster.trainers,
                          mode=self.transpiler.mode)
        except ValueError as err:
            index = re.match(r"faults\[(\d+)\]", str(err))
            fault = f"faults.{index.group(1)}" if index else "faults"
            raise CrossFieldError(str(err), fault, "cluster", "transpiler.mode") from None
        return self

    @model_validator(mode="after")
    def _numbers_need_numeric_mode(self) -> "Scenario":
        """`final_loss_below`, `loss_drop_factor` and `params_equal_to` need numbers:
        not with `backend.kernels: phantom`."""
        numeric = ("final_loss_below", "loss_drop_factor", "params_equal_to")
        stated = [name for name in numeric if getattr(self.expect, name)]
        if self.backend.kernels == "phantom" and stated:
            raise CrossFieldError(f"expect.{stated[0]} needs numbers, and backend.kernels "
                                  "phantom (timing mode) computes none", f"expect.{stated[0]}",
                                  "backend.kernels")
        return self


# -- loading ----------------------------------------------------------------------------------

def parse_scenario(text: str, source: str = "<scenario>",
                   overrides: Sequence[str | Override] | None = None) -> Scenario:
    """The scenario in YAML `text` (from the file `source`) with `overrides` applied;
    `ScenarioError` naming where each problem is (`runtime.config.scenario_errors`)."""
    raw, lines = read_yaml(text, source)
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping of sections, got "
                            f"{type(raw).__name__}")
    given = [o if isinstance(o, Override) else parse_override(o) for o in overrides or ()]
    raw = apply_overrides(raw, given)
    try:
        return Scenario.model_validate(raw).located(source, None)
    except ValidationError as exc:
        raise ScenarioError(describe(exc, Scenario, source, lines, given)) from None
    except units.UnitError as exc:
        raise ScenarioError(f"{source}: {exc}") from None


def load_scenario(path: str | Path, overrides: Sequence[str | Override] | None = None) -> Scenario:
    """The scenario in the YAML file at `path`, with `overrides` (``path=value``) applied."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read scenario: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{p}: cannot read scenario: not UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from None
    return parse_scenario(text, str(p), overrides).located(str(p), p.resolve().parent)
