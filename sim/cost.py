"""Compute time in the simulator: how long each op takes on each node.

The runtime runs every compute op for real and then asks the run's `ComputeModel` what the op
"cost": `cost(node, op, scope, step)` sees the op and its inputs and outputs in `scope`, and the
runtime sleeps the sum on the virtual clock (`runtime.execution.compute.Charge`). A scenario's
`compute` section picks the model:

- ``{model: roofline, device: {flops: 2.0e12, mem_bandwidth: 50GB/s, op_overhead: 2us}}``: an
  op takes ``max(flops / device.flops, bytes / device.mem_bandwidth) + op_overhead``, its FLOPs
  and bytes moved counted from the shapes it worked on (`op_work`; in timing mode the shapes of
  the phantoms, so that a phantom op costs what its numeric twin does) by the rule and the FLOPs
  per element its entry in the op catalog gives (`transpiler.opcatalog.Cost`, `COST_RULES`).
  ``op_overhead`` (a kernel launch, an interpreter's dispatch) defaults to 0 so that hand
  computations come out exact.
  ``overrides: [{nodes: "pserver:*", device: {mem_bandwidth: 100GB/s}}]`` changes some figures
  for the nodes matching a pattern (later entries win).
- ``{model: profile, path: profile.json}``: measured seconds per op type, from a JSON file
  ``{"ops": {"mul": 2.5e-05, "sgd": {"per_element": 1e-09}}, "default": 0.0}``: an entry is
  seconds per call, or ``{"per_element": s}``: s times the elements of the op's outputs. An op
  type the profile does not list takes ``default`` seconds (0 if absent). The path is relative
  to the scenario file. ``ops:`` (and ``default:``) may also be given inline instead of
  ``path:``, with durations such as ``25us``. ``runtime profile SCENARIO -o profile.json``
  writes such a file from a real run of the scenario's job (`runtime.launch.profile`), with a
  ``meta`` mapping (what was run, where, calls and seconds per op type) that is not read here.
- ``stragglers: [{node: "trainer:3", slowdown: 3.0}, {nodes: "trainer:*", probability: 0.02,
  slowdown: 10.0}]`` (under either model): every op of a matching node takes ``slowdown`` times
  as long; with ``probability``, only during the training steps the rule picks for that node, at
  random but seeded by (scenario seed, rule, node, step), so a run is reproducible. The factors
  of all the rules that apply multiply. A pserver's step is its sync round (always 0 in the
  asynchronous modes); -1 is a trainer's startup.

The runtime's own costs (`runtime.execution.costs.RuntimeCosts`: each message's CPU on its sender
and receiver, by kind and size, and on their I/O threads; each op's dispatch; a trainer's step and
a pserver's round) are charged where a profile file has a ``runtime`` section (as `runtime
profile` writes it; ``runtime: false`` in the section turns them off), or, under the roofline,
from the profile file its ``runtime: profile.json`` names: a device you do not have still runs
the same runtime. With runtime costs or ``cluster.hosts``, a node's compute and costs run on its
CPU (`sim.cpu`, through `OnCpus`): one piece of work at a time, the nodes of a host sharing its
cores; without them compute is a sleep and every node always runs at full speed.

No `compute` section: `compute_model` returns None and compute takes no simulated time.
A bad section raises `ComputeConfigError` naming the field, e.g. ``compute.device.flops``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator

from runtime.config import units
from runtime.execution.compute import ComputeModel
from runtime.execution.costs import RuntimeCosts
from runtime.execution.curves import Curve
from runtime.execution.scope import Scope
from runtime.execution.tensor import Phantom
from runtime.execution.work import COST_RULES, Work, op_work, out_elements
from transpiler.ir import Op

from .cpu import Cpus

__all__ = [
    "COST_RULES", "ComputeConfigError", "Device", "Ledger", "OnCpus", "OpTime", "Profile",
    "Roofline", "Straggler", "Stragglers", "Work", "Calibrated", "compute_model",
    "load_calibrated", "load_profile", "model_notes", "model_sharing", "model_slices",
    "load_runtime_costs", "op_work", "parse_compute", "runtime_costs",
]


class ComputeConfigError(ValueError):
    """The scenario's `compute` section (or the profile it names) is invalid; `field` is the path
    of the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# ------------------------------------------------------------------------------- models

@dataclass(frozen=True)
class Device:
    """A node's compute figures: FLOP/s, memory bytes/s, and seconds of overhead per op."""

    flops: float
    mem_bandwidth: float
    op_overhead: float = 0.0

    def seconds(self, work: Work) -> float:
        return max(work.flops / self.flops, work.bytes / self.mem_bandwidth) + self.op_overhead


class WorkCache:
    """`op_work` remembered for ops whose values are all phantoms (timing mode), by the op and
    the phantoms it sees: every trainer runs the same ops on the same shapes every step, and
    counting an op's work again each time would cost every op of every step.

    DESIGN: a phantom is immutable and hashable (its shape, dtype, height and LoD), so the
    values themselves are the key, and a cached work is always the work `op_work` would count.
    An op is known by identity, with its var names read once: a program does not change while
    it runs. Numeric values (arrays) are counted afresh each time."""

    def __init__(self) -> None:
        self._ops: dict[int, tuple[Op, tuple[str, ...], dict[tuple[Any, ...], Work]]] = {}

    def work(self, op: Op, scope: Scope) -> Work:
        known = self._ops.get(id(op))
        if known is None or known[0] is not op:
            names = (*op.input_arg_names, *op.output_arg_names)
            known = self._ops[id(op)] = (op, names, {})
        key = tuple(map(scope.find, known[1]))
        if not all(type(value) is Phantom or value is None for value in key):
            return op_work(op, scope)
        works = known[2]
        work = works.get(key)
        if work is None:
            work = works[key] = op_work(op, scope)
        return work


class Roofline:
    """Each op bound by the device's compute or its memory bandwidth, whichever is slower."""

    def __init__(self, device: Device,
                 overrides: Sequence[tuple[tuple[str, ...], Mapping[str, float]]] = ()) -> None:
        self.device = device
        self.overrides = list(overrides)
        self._devices: dict[str, Device] = {}
        self._works = WorkCache()

    def device_for(self, node: str) -> Device:
        device = self._devices.get(node)
        if device is None:
            device = self.device
            for patterns, figures in self.overrides:
                if _matches(node, patterns):
                    device = dataclasses.replace(device, **figures)
            self._devices[node] = device
        return device

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        return self.device_for(node).seconds(self._works.work(op, scope))


@dataclass(frozen=True)
class OpTime:
    """A profile entry: seconds per call plus seconds per element of the op's outputs."""

    per_call: float = 0.0
    per_element: float = 0.0


class Profile:
    """Measured seconds per op type; op types it does not list take `default` seconds."""

    def __init__(self, ops: Mapping[str, OpTime], default: float = 0.0) -> None:
        self.ops = dict(ops)
        self.default = default

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        time = self.ops.get(op.type)
        if time is None:
            return self.default
        if not time.per_element:
            return time.per_call
        return time.per_call + time.per_element * out_elements(op, scope)


class Calibrated:
    """Each op priced from its type's measured curve on this machine (`runtime calibrate`): the
    curve's feature (FLOPs or bytes) of the op's work (`op_work`) read off the curve
    (`runtime.execution.curves.Curve`). An op type the machine file lacks is priced by its
    fallback curve (elementwise ops, by bytes), an op beyond a curve's sizes by the curve's
    nearest end; each such op type is named once in `notes`."""

    def __init__(self, curves: Mapping[str, Curve], fallback: Curve | None,
                 source: str = "the machine file",
                 sharing: Mapping[float, tuple[float, ...]] | None = None,
                 slices: Mapping[float, float] | None = None) -> None:
        self.curves = dict(curves)
        self.fallback = fallback
        self.source = source
        self.sharing = dict(sharing or {})
        """Cores -> the measured rate of each busy thread while 1, 2, ... have work."""
        self.slices = dict(slices or {})
        """Cores -> the measured scheduler slice (`sim.cpu.SimHost.slice`)."""
        self._notes: dict[tuple[str, str], str] = {}
        """(op type, kind of approximation) -> its note, in the order first met."""
        self._works = WorkCache()

    @property
    def notes(self) -> list[str]:
        """What was priced by an approximation, once per op type and kind (the run's notes)."""
        return list(self._notes.values())

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        curve = self.curves.get(op.type)
        if curve is None:
            curve = self._fallback(op.type)
            if curve is None:
                return 0.0
        work = self._works.work(op, scope)
        x = work.flops if curve.feature == "flops" else work.bytes
        if x > 0 and not curve.covers(x) and (op.type, "range") not in self._notes:
            self._notes[op.type, "range"] = (
                f"compute: {op.type} of {x:.3g} {curve.feature} lies outside the sizes "
                f"{self.source} measured ({curve.points[0][0]:.3g} to "
                f"{curve.points[-1][0]:.3g}); priced from the nearest end of its curve")
        return curve.seconds(x)

    def _fallback(self, op_type: str) -> Curve | None:
        if (op_type, "type") not in self._notes:
            self._notes[op_type, "type"] = (
                f"compute: op type {op_type} was not calibrated in {self.source}; "
                + ("priced as an elementwise op of the bytes it moves"
                   if self.fallback is not None else "it costs nothing"))
        return self.fallback


@dataclass(frozen=True)
class Straggler:
    """A slowdown of the nodes matching `nodes`: always, or in a step with `probability`."""

    nodes: tuple[str, ...]
    slowdown: float
    probability: float | None = None


class Stragglers:
    """`base`'s costs times the slowdown of each rule that applies to the node at that step."""

    def __init__(self, base: ComputeModel, rules: Sequence[Straggler], seed: int) -> None:
        self.base = base
        self.rules = list(rules)
        self.seed = seed
        self._last: dict[str, tuple[int, float]] = {}

    def slowdown(self, node: str, step: int) -> float:
        """The factor `node`'s ops take longer by during `step`."""
        last = self._last.get(node)
        if last is not None and last[0] == step:
            return last[1]
        factor = 1.0
        for index, rule in enumerate(self.rules):
            if _matches(node, rule.nodes) and self._fires(index, rule, node, step):
                factor *= rule.slowdown
        self._last[node] = (step, factor)
        return factor

    def _fires(self, index: int, rule: Straggler, node: str, step: int) -> bool:
        if rule.probability is None:
            return True
        return random.Random(f"{self.seed}:{index}:{node}:{step}").random() < rule.probability

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        return self.base.cost(node, op, scope, step) * self.slowdown(node, step)


class Ledger:
    """`model`, adding up what it charges each node during training steps (step >= 0; a
    trainer's startup is step -1) in the order the runtime adds the same costs up."""

    def __init__(self, model: ComputeModel) -> None:
        self.model = model
        self.in_steps: dict[str, float] = {}

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        return self._count(node, step, self.model.cost(node, op, scope, step))

    def _count(self, node: str, step: int, seconds: float) -> float:
        """Add `seconds` to what `node` was charged in the steps (if `step` is one); return it."""
        if step >= 0:
            self.in_steps[node] = self.in_steps.get(node, 0.0) + seconds
        return seconds


class OnCpus(Ledger):
    """A `Ledger` that also prices the runtime's own work (`runtime.execution.costs.RuntimeCosts`:
    each op's dispatch, a trainer's step, a pserver's round) and runs every node's compute on its
    CPU (`sim.cpu.Cpus`), where the nodes of a host share its cores;
    `runtime.execution.compute.Charge` uses `overhead` and `spend`."""

    def __init__(self, model: ComputeModel, costs: RuntimeCosts, cpus: Cpus,
                 pservers: int = 0, trainers: int = 0) -> None:
        super().__init__(model)
        self.costs = costs
        self.cpus = cpus
        # a trainer's peers are the pservers it talks to, a sync pserver's the round's trainers
        self._overheads = {"step": costs.step_overhead,
                           "rpc_step": costs.residual("rpc_step", pservers)}
        self._trainers = trainers
        self._rounds: dict[str, float] = {}
        """Pserver -> its round's overhead (its host's crowding moves the residual)."""

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        return self._count(node, step,
                           self.model.cost(node, op, scope, step) + self.costs.op_overhead)

    def overhead(self, node: str, what: str, step: int) -> float:
        if what == "round":
            return self._count(node, step, self._round(node))
        return self._count(node, step, self._overheads.get(what, 0.0))

    def _round(self, node: str) -> float:
        seconds = self._rounds.get(node)
        if seconds is None:
            seconds = self._rounds[node] = self.costs.round_overhead + self.costs.residual(
                "round", self._trainers, self.cpus.crowding(node))
        return seconds

    def spend(self, node: str, seconds: float) -> Awaitable[None]:
        return self.cpus.spend(node, seconds)


def _matches(node: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(node, pattern) for pattern in patterns)


# ------------------------------------------------------------------------------- the section

def _quantity(parse: Callable[[Any], float], example: str,
              positive: bool) -> Callable[[Any], float]:
    """A validator of a number or a string with a unit (`runtime.config.units`), > 0 or >= 0."""
    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"must be {example}, got {value!r}")
        number = parse(value)  # a UnitError is a ValueError: pydantic reports it at the field
        if not (number > 0 if positive else number >= 0) or number == math.inf:
            raise ValueError(f"must be finite and {'> 0' if positive else '>= 0'}, got {value!r}")
        return number

    return convert


_duration = _quantity(units.duration, "a duration such as 25us", positive=False)


def _patterns(value: Any) -> tuple[str, ...]:
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not patterns \
            or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError(f"must be a node pattern or a list of them, got {value!r}")
    return tuple(patterns)


def _op_time(value: Any) -> OpTime:
    if isinstance(value, Mapping):
        if set(value) != {"per_element"}:
            raise ValueError(f"must be seconds per call or {{per_element: seconds}}, got {value!r}")
        return OpTime(per_element=_duration(value["per_element"]))
    return OpTime(per_call=_duration(value))


Seconds = Annotated[float, PlainValidator(_duration)]
"""A duration: seconds, or a number with a unit (``25us``); finite, >= 0."""
FlopRate = Annotated[float, PlainValidator(
    _quantity(units.flops, "a compute rate such as 2.0e12 or 2TFLOPS", positive=True))]
"""FLOP/s: a number or a rate with a unit (``2TFLOPS``, ``900GFLOP/s``); finite, > 0."""
ByteRate = Annotated[float, PlainValidator(
    _quantity(units.rate, "a rate such as 50GB/s", positive=True))]
"""Bytes per second: a number or a rate with a unit (``50GB/s``); finite, > 0."""
Patterns = Annotated[tuple[str, ...], PlainValidator(_patterns)]
"""A node name pattern (``trainer:*``) or a list of them."""
OpTimes = dict[str, Annotated[OpTime, PlainValidator(_op_time)]]
"""Op type -> seconds per call (a `Seconds`), or ``{per_element: seconds}``: seconds per element
of the op's outputs."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceSpec(_Section):
    """A device's figures: an op takes ``max(flops / device.flops, bytes / mem_bandwidth) +
    op_overhead``."""

    flops: FlopRate
    """Compute rate."""
    mem_bandwidth: ByteRate
    """Memory bandwidth."""
    op_overhead: Seconds = 0.0
    """Added to every op (a kernel launch, a dispatch)."""


class DevicePatch(_Section):
    """Figures that replace the device's (none: kept)."""

    flops: FlopRate | None = None
    """Compute rate."""
    mem_bandwidth: ByteRate | None = None
    """Memory bandwidth."""
    op_overhead: Seconds | None = None
    """Seconds added to every op."""


class DeviceOverride(_Section):
    """Other device figures for some nodes; later entries win."""

    nodes: Patterns
    """The nodes it applies to."""
    device: DevicePatch
    """The figures that change."""


class StragglerSpec(_Section):
    """Every op of the matching nodes takes `slowdown` times as long: always, or in the steps
    drawn with `probability` (seeded by scenario seed, rule, node and step). The factors of
    all the rules that apply multiply."""

    node: str | None = None
    """One node (or give `nodes`)."""
    nodes: Patterns | None = None
    """Node patterns (or give `node`)."""
    slowdown: float = Field(gt=0, allow_inf_nan=False)
    """The factor its ops' costs are multiplied by."""
    probability: float | None = Field(None, gt=0, le=1)
    """The chance a given step of a given node is slowed (none: every step)."""

    @model_validator(mode="after")
    def _one_target(self) -> StragglerSpec:
        """Exactly one of `node` and `nodes`."""
        if (self.node is None) == (self.nodes is None):
            raise ValueError("name the slowed nodes with either node or nodes (not both)")
        return self

    def rule(self) -> Straggler:
        nodes = (self.node,) if self.node is not None else self.nodes
        assert nodes is not None
        return Straggler(nodes, self.slowdown, self.probability)


class RooflineSpec(_Section):
    """Each op bound by compute or memory bandwidth, its FLOPs and bytes counted from the
    shapes it worked on (`runtime.execution.work.op_work`)."""

    model: Literal["roofline"]
    """Picks this model."""
    device: DeviceSpec
    """Every node's device."""
    overrides: list[DeviceOverride] = []
    """Other figures for some nodes."""
    stragglers: list[StragglerSpec] = []
    """Slowdowns on top."""
    runtime: str | None = None
    """A profile file (from `runtime profile`) whose runtime costs are charged too."""


class ProfileSpec(_Section):
    """Measured seconds per op type, from a profile file (`runtime profile`) or inline."""

    model: Literal["profile"]
    """Picks this model."""
    path: str | None = None
    """The profile file, relative to the scenario's folder."""
    ops: OpTimes | None = None
    """The op times inline, instead of `path`."""
    default: Seconds = 0.0
    """Seconds of an op type `ops` does not list (inline only; a file has its own)."""
    stragglers: list[StragglerSpec] = []
    """Slowdowns on top."""
    runtime: bool = True
    """Charge the runtime costs the profile file has (false: its kernels only)."""

    @model_validator(mode="after")
    def _one_source(self) -> ProfileSpec:
        """Exactly one of `path` and `ops`."""
        if (self.path is None) == (self.ops is None):
            raise ValueError("give the measured times either in a file (path) or inline (ops)")
        return self


class CalibratedSpec(_Section):
    """Each op priced from this machine's measured curves (`runtime calibrate`)."""

    model: Literal["calibrated"]
    """Picks this model."""
    path: str
    """The machine file `runtime calibrate` wrote, relative to the scenario's folder."""
    kernels: Literal["numpy", "torch"] | None = None
    """Whose kernels' curves price the ops (none: the scenario's backend.kernels; timing mode
    (phantom) uses numpy's)."""
    stragglers: list[StragglerSpec] = []
    """Slowdowns on top."""
    runtime: bool = True
    """Charge the runtime costs the machine file has (false: its kernels only)."""


class LinearSpec(_Section):
    """A message of S bytes costs ``per_message + per_byte * S`` seconds of CPU."""

    per_message: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per message."""
    per_byte: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per byte (up to `up_to` bytes, where given)."""
    up_to: int = Field(0, ge=0)
    """Bytes up to which `per_byte` holds, `beyond` a byte past them (`runtime calibrate`: the
    reference job's messages, past which a job of larger ones measured the cost); 0: it
    holds throughout."""
    beyond: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per byte past `up_to`."""


class SizeCurveSpec(_Section):
    """What a message costs beyond a small one, by its size
    (`runtime.execution.costs.SizeCurve`)."""

    bytes: list[int] = Field(min_length=2)
    """Message sizes, rising from 0 or more."""
    seconds: list[float] = Field(min_length=2)
    """Seconds beyond a message of the first size, at each size (straight lines between),
    each finite and >= 0."""

    @model_validator(mode="after")
    def _points(self) -> SizeCurveSpec:
        if len(self.bytes) != len(self.seconds):
            raise ValueError(f"{len(self.bytes)} sizes against {len(self.seconds)} seconds")
        if self.bytes[0] < 0 or any(b <= a for a, b in zip(self.bytes, self.bytes[1:])):
            raise ValueError(f"the sizes must rise from 0 or more: {self.bytes}")
        if not all(math.isfinite(t) and t >= 0 for t in self.seconds):
            raise ValueError(f"the seconds must be finite and >= 0: {self.seconds}")
        return self


class CurveSpec(_Section):
    """What CurveZMQ costs a node's I/O thread (`runtime.execution.costs.CurveCosts`)."""

    handshake: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per connection, on each side."""
    per_byte: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per byte encrypted (sender) or decrypted (receiver)."""


class RuntimeSection(_Section):
    """A profile's ``runtime`` section (`runtime.execution.costs.RuntimeCosts.document`)."""

    messages: dict[Literal["send", "receive"], dict[str, LinearSpec]] = {}
    """Side -> message kind (``send``, ``get``, ``reply``..., ``*`` for any other) -> the main
    thread's cost of one message of that kind on that side."""
    io: LinearSpec = LinearSpec()
    """A message's cost on its node's I/O thread, on either side."""
    io_by_size: SizeCurveSpec | None = None
    """What a message's size adds to `io` over local sockets (`runtime calibrate` and `runtime
    profile` measure it between two processes); none: `io` alone."""
    io_by_size_tcp: SizeCurveSpec | None = None
    """The same over TCP, beyond the same small message over local sockets: what prices a job
    whose nodes talk TCP (`cluster.security` curve or none, or nodes on several hosts)."""
    op_overhead: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds of the executor's dispatch per op, on top of its kernel."""
    step_overhead: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds of a trainer's bookkeeping per step."""
    round_overhead: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds of a sync pserver's bookkeeping per round, on top of its optimize ops."""
    step_residual: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds a trainer's event loop spends per step that no timer sees (charged with
    `step_overhead`; none in a profile from before the residual was split)."""
    round_residual: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds a sync pserver's event loop spends per round that no timer sees."""
    residual_peers: float = Field(0.0, ge=0, allow_inf_nan=False)
    """The peers of each node of the job the residuals were measured on (`runtime
    calibrate`: 2); 0: the residuals do not vary with a job's peers."""
    step_residual_per_peer: float = Field(0.0, allow_inf_nan=False)
    """What `step_residual` grows by for each pserver more a trainer talks to."""
    round_residual_per_peer: float = Field(0.0, allow_inf_nan=False)
    """What `round_residual` grows by for each trainer more in a round (a file from before
    `round_residual_per_node`)."""
    residual_crowding: float = Field(0.0, ge=0, allow_inf_nan=False)
    """The nodes beyond its host's cores on the host of each node of the job the residuals
    were measured on (`runtime calibrate`: 2, 4 nodes on 2 cores)."""
    round_residual_per_node: float = Field(0.0, allow_inf_nan=False)
    """What `round_residual` grows by for each node more beyond the cores of its pserver's
    host (`cluster.hosts`; a node on no host has a machine of its own)."""
    machine: dict[str, Any] = {}
    """What it was measured on (cores, processor); for people."""
    curve: CurveSpec | None = None
    """What CurveZMQ costs here, on top of `io`: charged to a job that talks it (the scenario's
    `cluster.security`: curve, or auto with nodes on several hosts); none: never charged."""
    variants: dict[Literal["table"], RuntimeSection] = {}
    """The costs of a family of jobs (`runtime calibrate`'s family reference jobs), in this
    section's form: ``table``, a job whose trainers prefetch rows of a distributed table. A
    family without one is priced by this section."""


class CurveDoc(_Section):
    """A curve as the machine file holds it (`runtime.execution.curves.Curve`)."""

    feature: Literal["flops", "bytes"]
    """What of an op's work its time follows."""
    points: list[tuple[float, float]]
    """(size, seconds) at rising sizes, seconds non-decreasing."""

    @model_validator(mode="after")
    def _a_curve(self) -> CurveDoc:
        Curve.of(self.model_dump())  # raises naming what is wrong
        return self


class CoresDoc(_Section):
    """How busy processes share a machine's cores (`runtime calibrate`)."""

    count: int = Field(ge=1)
    """The machine's cores."""
    rates: list[Annotated[float, Field(gt=0, le=1)]] = Field(min_length=1)
    """The rate of each of m busy processes against one alone, for m = 1, 2, ...: what a
    simulated host of `count` cores gives each busy thread (`sim.cpu.SimHost.rates`)."""
    slice: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Seconds a busy process ran, at the median, before the scheduler gave its core to another
    while processes outnumbered the cores: a simulated host of `count` cores time-slices with
    it (`sim.cpu.SimHost.slice`); none: processor sharing."""


class MachineFile(_Section):
    """A machine's calibration (`runtime.launch.calibrate`)."""

    format: Literal["pslab-machine"]
    version: Literal[1]
    kernels: dict[str, dict[str, CurveDoc]]
    """Backend -> op type -> its curve: ``{"feature": "flops" | "bytes", "points": [[size,
    seconds], ...]}``."""
    fallback: dict[str, CurveDoc] = {}
    """Backend -> the curve of an op type it lacks (elementwise ops pooled, by bytes)."""
    cores: CoresDoc | None = None
    """How busy processes shared this machine's cores."""
    runtime: RuntimeSection | None = None
    """The runtime's own costs, as a profile's."""
    meta: dict[str, Any] = {}


class ProfileFile(_Section):
    """A profile: measured op times and the runtime's own costs (`runtime.launch.profile`)."""

    ops: OpTimes
    """Seconds per op type."""
    default: Seconds = 0.0
    """Seconds of an op type `ops` does not list."""
    runtime: RuntimeSection | None = None
    """The runtime's own costs (none: an older or hand-made profile; kernels only)."""
    meta: dict[str, Any] = {}  # free-form, for people: `runtime profile` says what it measured
    """Free-form, for people: what was run, where, and each op type's calls and fit; not read."""


ComputeSpec = RooflineSpec | ProfileSpec | CalibratedSpec
_SPECS: dict[str, type[RooflineSpec] | type[ProfileSpec] | type[CalibratedSpec]] = {
    "roofline": RooflineSpec, "profile": ProfileSpec, "calibrated": CalibratedSpec,
}
S = TypeVar("S", bound=BaseModel)


def _validated(kind: type[S], raw: Any, where: str) -> S:
    """`raw` as a `kind`; the first problem becomes a `ComputeConfigError` naming its field."""
    try:
        return kind.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = where
        for part in error["loc"]:
            field += f"[{part}]" if isinstance(part, int) else f".{part}"
        raise ComputeConfigError(field, error["msg"].removeprefix("Value error, ")) from None


def parse_compute(section: Any) -> ComputeSpec:
    """Validate a scenario's `compute` section."""
    if not isinstance(section, Mapping):
        raise ComputeConfigError("compute", f"must be a mapping, got {section!r}")
    if "model" not in section:
        keys = ", ".join(repr(k) for k in section) or "none"
        colon = any(":" in str(k) for k in section)
        raise ComputeConfigError("compute.model", f"missing: one of {sorted(_SPECS)} (the "
                                 f"section's keys: {keys}"
                                 + ("; in YAML a key needs ': ', with a space)" if colon else ")"))
    name = section["model"]
    kind = _SPECS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ComputeConfigError("compute.model", f"must be one of {sorted(_SPECS)}, got {name!r}")
    _refuse_other_models_fields(kind, str(name), section)
    return _validated(kind, section, "compute")


def _refuse_other_models_fields(kind: type[BaseModel], name: str,
                                section: Mapping[str, Any]) -> None:
    """A field of another model's section, named with how to change the model: what
    ``--set compute.model=...`` leaves behind of the file's section."""
    for key in section:
        owners = [other for other, spec in _SPECS.items()
                  if spec is not kind and key in spec.model_fields]
        if key not in kind.model_fields and owners:
            raise ComputeConfigError(
                f"compute.{key}",
                f"a field of model {' and '.join(owners)}, not of {name} (its fields: "
                f"{', '.join(kind.model_fields)}); to change the model, set the whole section: "
                f"--set 'compute={{model: {name}, ...}}'")


def _json_file(path: Path, kind: type[S], what: str, field: str, missing: str = "") -> S:
    """The `kind` document in the JSON file `path` (a `what`); any problem a
    `ComputeConfigError` on `field` naming the file (`missing`: a hint when it is absent)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ComputeConfigError(field, f"cannot read {what} {path}: {exc.strerror}{missing}"
                                 ) from None
    except json.JSONDecodeError as exc:
        raise ComputeConfigError(field, f"{what} {path} is not JSON: {exc}") from None
    try:
        return _validated(kind, raw, what.split()[0])
    except ComputeConfigError as exc:
        raise ComputeConfigError(field, f"{path}: {exc}{_mistaken(what, raw)}") from None


_OTHER_KIND = {"profile": (("format", "kernels"), "a machine file (`runtime calibrate`): "
                                                  "model: calibrated reads it"),
               "machine file": (("ops",), "a profile (`runtime profile`): model: profile "
                                          "reads it")}
"""A file read as `what` -> the keys that mark the other kind of file, and what to say."""


def _mistaken(what: str, raw: Any) -> str:
    """`` (it is a machine file ...)`` where `raw` is the other kind of file than `what`."""
    marks, instead = _OTHER_KIND.get(what, ((), ""))
    if marks and isinstance(raw, dict) and all(mark in raw for mark in marks):
        return f" (it is {instead})"
    return ""


def _profile_file(path: Path, field: str = "compute.path") -> ProfileFile:
    return _json_file(path, ProfileFile, "profile", field)


def load_profile(path: Path) -> Profile:
    """A profile file: ``{"ops": {op_type: seconds or {"per_element": seconds}}, "default": s}``."""
    data = _profile_file(path)
    return Profile(data.ops, data.default)


def _machine_file(path: Path, field: str = "compute.path") -> MachineFile:
    return _json_file(path, MachineFile, "machine file", field,
                      "; `runtime calibrate -o FILE` writes one")


def load_calibrated(path: Path, kernels: str) -> Calibrated:
    """The model a machine file gives for `kernels` (numpy or torch)."""
    data = _machine_file(path)
    curves = data.kernels.get(kernels)
    if curves is None:
        raise ComputeConfigError("compute.kernels", f"{path} holds no calibration of {kernels} "
                                 f"kernels, only of {', '.join(sorted(data.kernels)) or 'none'}")
    fallback = data.fallback.get(kernels)
    sharing = {} if data.cores is None else {float(data.cores.count): tuple(data.cores.rates)}
    slices = {} if data.cores is None or data.cores.slice is None else \
        {float(data.cores.count): data.cores.slice}
    return Calibrated({op: Curve.of(doc.model_dump()) for op, doc in curves.items()},
                      None if fallback is None else Curve.of(fallback.model_dump()),
                      path.name, sharing, slices)


def load_runtime_costs(path: Path, field: str = "compute.path") -> RuntimeCosts | None:
    """The runtime costs a profile file has (None: it has none, an older or hand-made one)."""
    section = _profile_file(path, field).runtime
    return None if section is None else RuntimeCosts.from_document(section.model_dump())


def runtime_costs(section: Mapping[str, Any] | None,
                  base_dir: Path = Path(".")) -> RuntimeCosts | None:
    """The runtime costs a scenario's `compute` section charges, if any: a profile's own
    (unless ``runtime: false``), or the profile a roofline's ``runtime`` names."""
    if section is None:
        return None
    spec = parse_compute(section)
    if isinstance(spec, RooflineSpec):
        if spec.runtime is None:
            return None
        return load_runtime_costs(base_dir / spec.runtime, "compute.runtime")
    if not spec.runtime or spec.path is None:
        return None
    if isinstance(spec, CalibratedSpec):
        measured = _machine_file(base_dir / spec.path).runtime
        return None if measured is None else RuntimeCosts.from_document(measured.model_dump())
    return load_runtime_costs(base_dir / spec.path)


def _base_model(spec: ComputeSpec, base_dir: Path, kernels: str) -> ComputeModel:
    if isinstance(spec, CalibratedSpec):
        return load_calibrated(base_dir / spec.path, spec.kernels or kernels)
    if isinstance(spec, RooflineSpec):
        overrides = [(o.nodes, o.device.model_dump(exclude_none=True)) for o in spec.overrides]
        return Roofline(Device(**spec.device.model_dump()), overrides)
    if spec.path is not None:
        return load_profile(base_dir / spec.path)
    return Profile(spec.ops or {}, spec.default)


def _calibrated(model: ComputeModel | None) -> Calibrated | None:
    """`model`, or the model it wraps, if it is a `Calibrated` one."""
    while model is not None and not isinstance(model, Calibrated):
        model = getattr(model, "base", None) or getattr(model, "inner", None)
    return model


def model_notes(model: ComputeModel | None) -> list[str]:
    """What `model` (or the model it wraps) priced by an approximation (`Calibrated.notes`)."""
    calibrated = _calibrated(model)
    return [] if calibrated is None else calibrated.notes


def model_sharing(model: ComputeModel | None) -> dict[float, tuple[float, ...]]:
    """How a calibrated `model`'s machine shared its cores, by its cores (else nothing)."""
    calibrated = _calibrated(model)
    return {} if calibrated is None else calibrated.sharing


def model_slices(model: ComputeModel | None) -> dict[float, float]:
    """A calibrated `model`'s machine's scheduler slice, by its cores (else nothing)."""
    calibrated = _calibrated(model)
    return {} if calibrated is None else calibrated.slices


def compute_model(section: Mapping[str, Any] | None, seed: int,
                  base_dir: Path = Path("."), kernels: str = "numpy") -> ComputeModel | None:
    """The model a scenario's `compute` section describes (None: compute takes no time);
    `base_dir` is where a profile's relative path starts (the scenario file's folder);
    `kernels`: the scenario's backend, whose curves a calibrated model reads (phantom: numpy's)."""
    if section is None:
        return None
    spec = parse_compute(section)
    base = _base_model(spec, base_dir, "numpy" if kernels == "phantom" else kernels)
    if not spec.stragglers:
        return base
    return Stragglers(base, [s.rule() for s in spec.stragglers], seed)
