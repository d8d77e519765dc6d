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

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, model_validator

from runtime.config import units
from runtime.execution.compute import ComputeModel
from runtime.execution.costs import RuntimeCosts
from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, nbytes_of, shape_of
from transpiler.ir import Op
from transpiler.opcatalog import OPS, Cost, OpDef

from .cpu import Cpus

__all__ = [
    "COST_RULES", "ComputeConfigError", "Device", "Ledger", "OnCpus", "OpTime", "Profile",
    "Roofline", "Straggler", "Stragglers", "Work", "compute_model", "load_profile",
    "load_runtime_costs", "op_work", "parse_compute", "runtime_costs",
]


class ComputeConfigError(ValueError):
    """The scenario's `compute` section (or the profile it names) is invalid; `field` is the path
    of the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# ------------------------------------------------------------------------------- op work

@dataclass(frozen=True, slots=True)
class Work:
    """What an op does, as a roofline sees it."""

    flops: float
    bytes: float


_VALUES = (np.ndarray, LoDTensor, SelectedRows, Phantom)
"""What a cost counts: numeric values and the phantoms that stand for them in timing mode."""


def _shape(value: Any) -> tuple[int, ...] | None:
    """The shape of the data `value` holds (or, a phantom, would hold); None for anything else."""
    return shape_of(value) if isinstance(value, _VALUES) else None


def _nbytes(value: Any) -> int:
    return nbytes_of(value) if isinstance(value, _VALUES) else 0


def _elements(value: Any) -> int:
    shape = _shape(value)
    return 0 if shape is None else math.prod(shape)


def _is_rows(value: Any) -> bool:
    """Whether `value` is a `SelectedRows` or the phantom of one."""
    return isinstance(value, SelectedRows) or (isinstance(value, Phantom) and value.is_rows)


def _values(scope: Scope, names: list[str]) -> list[Any]:
    return [scope.get_tensor(name) for name in names if scope.has(name)]


def _first(op: Op, scope: Scope, slot: str, output: bool = False) -> Any | None:
    values = _values(scope, op.output(slot) if output else op.input(slot))
    return values[0] if values else None


def _moved(op: Op, scope: Scope, skip: frozenset[str] = frozenset()) -> int:
    """Bytes of every input read (but those of the `skip` slots) and every output written."""
    read = sum(_nbytes(v) for slot, names in op.inputs.items() if slot not in skip
               for v in _values(scope, names))
    return read + sum(_nbytes(v) for names in op.outputs.values() for v in _values(scope, names))


def _out_elements(op: Op, scope: Scope) -> int:
    return sum(_elements(v) for names in op.outputs.values() for v in _values(scope, names))


def _generic(op: Op, scope: Scope) -> Work:
    """Any other op: one FLOP per output element; every input and output moved once."""
    return Work(_out_elements(op, scope), _moved(op, scope))


def _matmul(op: Op, scope: Scope, products: int) -> Work:
    """`mul` and `mul_grad`: X and Y flattened to [M, K] and [K, N] by their num_col_dims;
    each product is 2*M*K*N FLOPs."""
    x, y = _shape(_first(op, scope, "X")), _shape(_first(op, scope, "Y"))
    if x is None or y is None:
        return _generic(op, scope)
    xd, yd = int(op.attr("x_num_col_dims", 1)), int(op.attr("y_num_col_dims", 1))
    m, k, n = math.prod(x[:xd]), math.prod(x[xd:]), math.prod(y[yd:])
    return Work(2.0 * m * k * n * products, _moved(op, scope))


def _mul(op: Op, scope: Scope, flops: float) -> Work:
    return _matmul(op, scope, 1)


def _mul_grad(op: Op, scope: Scope, flops: float) -> Work:
    products = sum(1 for slot in ("X@GRAD", "Y@GRAD") if _first(op, scope, slot, output=True)
                   is not None)
    return _matmul(op, scope, products)


def _in_or_out(op: Op, scope: Scope, slot: str) -> Any | None:
    """The value of `slot`: an output of a forward op, an input of its grad op."""
    value = _first(op, scope, slot, output=True)
    return value if value is not None else _first(op, scope, slot)


def _grads_written(op: Op, scope: Scope, slots: tuple[str, ...]) -> int:
    return sum(1 for slot in slots if _first(op, scope, slot, output=True) is not None)


def _batched(op: Op, scope: Scope, products: int) -> Work:
    """`matmul`, `matmul_v2` and their grads: 2*K FLOPs per element of Out per product, K the
    contracted dim of X (after its transpose)."""
    x, out = _shape(_first(op, scope, "X")), _shape(_in_or_out(op, scope, "Out"))
    if x is None or out is None:
        return _generic(op, scope)
    transposed = op.attr("trans_x" if op.type.startswith("matmul_v2") else "transpose_X", False)
    k = x[-2] if transposed and len(x) > 1 else x[-1]
    return Work(2.0 * k * math.prod(out) * products, _moved(op, scope))


def _batched_matmul(op: Op, scope: Scope, flops: float) -> Work:
    return _batched(op, scope, 1)


def _batched_matmul_grad(op: Op, scope: Scope, flops: float) -> Work:
    return _batched(op, scope, _grads_written(op, scope, ("X@GRAD", "Y@GRAD")))


def _conv(op: Op, scope: Scope, products: int) -> Work:
    """`conv2d` and its grad: 2 * C/groups * KH * KW FLOPs per Output element per product (the
    forward's, the Input's and the Filter's gradient each one)."""
    w, out = _shape(_first(op, scope, "Filter")), _shape(_in_or_out(op, scope, "Output"))
    if w is None or out is None:
        return _generic(op, scope)
    return Work(2.0 * math.prod(w[1:]) * math.prod(out) * products, _moved(op, scope))


def _conv2d(op: Op, scope: Scope, flops: float) -> Work:
    return _conv(op, scope, 1)


def _conv2d_grad(op: Op, scope: Scope, flops: float) -> Work:
    return _conv(op, scope, _grads_written(op, scope, ("Input@GRAD", "Filter@GRAD")))


def _pool(op: Op, scope: Scope, flops: float) -> Work:
    """`pool2d` and its grad: `flops` per window element of each Out element."""
    x, out = _shape(_first(op, scope, "X")), _shape(_in_or_out(op, scope, "Out"))
    if x is None or out is None:
        return _generic(op, scope)
    window = x[2:] if op.attr("global_pooling", False) else op.attr("ksize", x[2:])
    return Work(flops * math.prod(window) * math.prod(out), _moved(op, scope))


def _lookup(op: Op, scope: Scope, flops: float) -> Work:
    """`lookup_table`: the ids read, the rows read from the table and written to Out."""
    out = _first(op, scope, "Out", output=True)
    return Work(0.0, _moved(op, scope, skip=frozenset({"W"})) + _nbytes(out))


def _lookup_grad(op: Op, scope: Scope, flops: float) -> Work:
    """`lookup_table_grad`: the table itself is not read, only the rows' gradients."""
    return Work(_out_elements(op, scope), _moved(op, scope, skip=frozenset({"W"})))


def _nce(op: Op, scope: Scope, flops: float) -> Work:
    """`nce` and its grad: `flops` per element of Input's rows times the sample labels (a dot
    product per sample; its grad two more); only the sampled rows of Weight are read."""
    x = _shape(_first(op, scope, "Input"))
    samples = _in_or_out(op, scope, "SampleLabels")
    if x is None or _shape(samples) is None:
        return _generic(op, scope)
    elements = _elements(samples) * math.prod(x[1:])
    w = _first(op, scope, "Weight")
    rows = elements * (w.dtype.itemsize if isinstance(w, _VALUES) else 4)
    return Work(flops * elements, _moved(op, scope, skip=frozenset({"Weight"})) + rows)


def _sum(op: Op, scope: Scope, flops: float) -> Work:
    adds = max(len(_values(scope, op.input("X"))) - 1, 0)
    return Work(_out_elements(op, scope) * adds, _moved(op, scope))


def _softmax(op: Op, scope: Scope, flops: float) -> Work:
    """Softmax and cross-entropy: `flops` per element of the largest input."""
    largest = max((_elements(v) for names in op.inputs.values() for v in _values(scope, names)),
                  default=0)
    return Work(flops * largest, _moved(op, scope))


def _reduction(op: Op, scope: Scope, flops: float) -> Work:
    """Reductions: `flops` per element of X."""
    elements = sum(_elements(v) for v in _values(scope, op.input("X")))
    return Work(flops * elements, _moved(op, scope))


def _optimizer(op: Op, scope: Scope, flops: float) -> Work:
    """The gradient read, and each parameter-shaped state (Param, moments, accumulators) read
    and written at the elements updated: `flops` per element updated, which are the rows of a
    sparse gradient for an optimizer that updates only those (`sgd`), the whole parameter
    otherwise (the other optimizers densify a sparse gradient)."""
    param, grad = _first(op, scope, "Param"), _first(op, scope, "Grad")
    update = OPS[op.type].update
    if not isinstance(param, _VALUES) or grad is None or update is None:
        return _generic(op, scope)
    sparse = update.sparse_rows and _is_rows(grad)
    updated = _elements(grad) if sparse else _elements(param)
    states = sum(1 for slot, names in op.inputs.items()
                 if slot not in update.scalar_slots and _values(scope, names))
    moved = _nbytes(grad) + 2 * states * updated * param.dtype.itemsize
    return Work(flops * updated, moved)


def _elementwise(op: Op, scope: Scope, flops: float) -> Work:
    """Elementwise ops and activations: `flops` per element of the op's outputs."""
    return Work(flops * _out_elements(op, scope), _moved(op, scope))


CostRule = Callable[[Op, Scope, float], Work]

COST_RULES: dict[str, CostRule] = {
    "elementwise": _elementwise, "softmax": _softmax, "reduction": _reduction,
    "optimizer": _optimizer, "matmul": _mul, "matmul_grad": _mul_grad, "sum": _sum,
    "lookup": _lookup, "lookup_grad": _lookup_grad, "batched_matmul": _batched_matmul,
    "batched_matmul_grad": _batched_matmul_grad, "conv2d": _conv2d, "conv2d_grad": _conv2d_grad,
    "pool": _pool, "nce": _nce,
}
"""The cost rules by the names the op catalog's entries give (`transpiler.opcatalog.Cost`)."""


def _priced(op_def: OpDef, cost: Cost) -> tuple[CostRule, float]:
    if cost.rule not in COST_RULES:
        raise ValueError(f"op {op_def.type!r}: the catalog names cost rule {cost.rule!r}, "
                         f"which is not one of {sorted(COST_RULES)}")
    return COST_RULES[cost.rule], cost.flops


_RULES: dict[str, tuple[CostRule, float]] = {
    op.type: _priced(op, op.cost) for op in OPS.values() if op.cost is not None}
"""Each op type's cost rule and FLOPs per element; op types not here get `_generic`."""


def op_work(op: Op, scope: Scope) -> Work:
    """FLOPs and bytes moved by `op`, from the values its inputs and outputs hold in `scope`
    (phantoms count as the values they stand for: `shape_of`, `nbytes_of`)."""
    priced = _RULES.get(op.type)
    if priced is None:
        return _generic(op, scope)
    rule, flops = priced
    return rule(op, scope, flops)


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
        return time.per_call + time.per_element * _out_elements(op, scope)


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

    def __init__(self, model: ComputeModel, costs: RuntimeCosts, cpus: Cpus) -> None:
        super().__init__(model)
        self.costs = costs
        self.cpus = cpus
        self._overheads = {"step": costs.step_overhead + costs.step_residual,
                           "round": costs.round_overhead + costs.round_residual}

    def cost(self, node: str, op: Op, scope: Scope, step: int) -> float:
        return self._count(node, step,
                           self.model.cost(node, op, scope, step) + self.costs.op_overhead)

    def overhead(self, node: str, what: str, step: int) -> float:
        return self._count(node, step, self._overheads.get(what, 0.0))

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceSpec(_Strict):
    """A device's figures: an op takes ``max(flops / device.flops, bytes / mem_bandwidth) +
    op_overhead``."""

    flops: FlopRate
    """Compute rate."""
    mem_bandwidth: ByteRate
    """Memory bandwidth."""
    op_overhead: Seconds = 0.0
    """Added to every op (a kernel launch, a dispatch)."""


class DevicePatch(_Strict):
    """Figures that replace the device's (none: kept)."""

    flops: FlopRate | None = None
    """Compute rate."""
    mem_bandwidth: ByteRate | None = None
    """Memory bandwidth."""
    op_overhead: Seconds | None = None
    """Seconds added to every op."""


class DeviceOverride(_Strict):
    """Other device figures for some nodes; later entries win."""

    nodes: Patterns
    """The nodes it applies to."""
    device: DevicePatch
    """The figures that change."""


class StragglerSpec(_Strict):
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


class RooflineSpec(_Strict):
    """Each op bound by compute or memory bandwidth, its FLOPs and bytes counted from the
    shapes it worked on (`sim.cost.op_work`)."""

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


class ProfileSpec(_Strict):
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


class LinearSpec(_Strict):
    """A message of S bytes costs ``per_message + per_byte * S`` seconds of CPU."""

    per_message: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per message."""
    per_byte: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per byte."""


class CurveSpec(_Strict):
    """What CurveZMQ costs a node's I/O thread (`runtime.execution.costs.CurveCosts`)."""

    handshake: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per connection, on each side."""
    per_byte: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Seconds per byte encrypted (sender) or decrypted (receiver)."""


class RuntimeSection(_Strict):
    """A profile's ``runtime`` section (`runtime.execution.costs.RuntimeCosts.document`)."""

    messages: dict[Literal["send", "receive"], dict[str, LinearSpec]] = {}
    """Side -> message kind (``send``, ``get``, ``reply``..., ``*`` for any other) -> the main
    thread's cost of one message of that kind on that side."""
    io: LinearSpec = LinearSpec()
    """A message's cost on its node's I/O thread, on either side."""
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
    machine: dict[str, Any] = {}
    """What it was measured on (cores, processor); for people."""
    curve: CurveSpec | None = None
    """The measured job was encrypted (CurveZMQ): its cost on top of `io`; none: it was not
    (remove the section to predict a job run with `--insecure`)."""


class ProfileFile(_Strict):
    """A profile: measured op times and the runtime's own costs (`runtime.launch.profile`)."""

    ops: OpTimes
    """Seconds per op type."""
    default: Seconds = 0.0
    """Seconds of an op type `ops` does not list."""
    runtime: RuntimeSection | None = None
    """The runtime's own costs (none: an older or hand-made profile; kernels only)."""
    meta: dict[str, Any] = {}  # free-form, for people: `runtime profile` says what it measured
    """Free-form, for people: what was run, where, and each op type's calls and fit; not read."""


_SPECS: dict[str, type[RooflineSpec] | type[ProfileSpec]] = {
    "roofline": RooflineSpec, "profile": ProfileSpec,
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


def parse_compute(section: Any) -> RooflineSpec | ProfileSpec:
    """Validate a scenario's `compute` section."""
    if not isinstance(section, Mapping):
        raise ComputeConfigError("compute", f"must be a mapping, got {section!r}")
    name = section.get("model")
    kind = _SPECS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ComputeConfigError("compute.model", f"must be one of {sorted(_SPECS)}, got {name!r}")
    return _validated(kind, section, "compute")


def _profile_file(path: Path, field: str = "compute.path") -> ProfileFile:
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ComputeConfigError(field, f"cannot read profile {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ComputeConfigError(field, f"profile {path} is not JSON: {exc}") from None
    try:
        return _validated(ProfileFile, raw, "profile")
    except ComputeConfigError as exc:
        raise ComputeConfigError(field, f"{path}: {exc}") from None


def load_profile(path: Path) -> Profile:
    """A profile file: ``{"ops": {op_type: seconds or {"per_element": seconds}}, "default": s}``."""
    data = _profile_file(path)
    return Profile(data.ops, data.default)


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
    return load_runtime_costs(base_dir / spec.path)


def _base_model(spec: RooflineSpec | ProfileSpec, base_dir: Path) -> ComputeModel:
    if isinstance(spec, RooflineSpec):
        overrides = [(o.nodes, o.device.model_dump(exclude_none=True)) for o in spec.overrides]
        return Roofline(Device(**spec.device.model_dump()), overrides)
    if spec.path is not None:
        return load_profile(base_dir / spec.path)
    return Profile(spec.ops or {}, spec.default)


def compute_model(section: Mapping[str, Any] | None, seed: int,
                  base_dir: Path = Path(".")) -> ComputeModel | None:
    """The model a scenario's `compute` section describes (None: compute takes no time);
    `base_dir` is where a profile's relative path starts (the scenario file's folder)."""
    if section is None:
        return None
    spec = parse_compute(section)
    base = _base_model(spec, base_dir)
    if not spec.stragglers:
        return base
    return Stragglers(base, [s.rule() for s in spec.stragglers], seed)
