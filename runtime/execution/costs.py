"""The runtime's own CPU costs: what a node spends besides its kernels, measured and modelled.

A real node spends CPU on more than its kernels: encoding and sending each message, receiving,
decoding and dispatching it (the server's handler and its dedupe, the client's resolution of
the waiting call), the executor's dispatch of each op, the trainer's per-step bookkeeping
(reading its batch, the loss, the progress line) and the pserver's per-round work. On a small
model these dominate the step. `RuntimeCosts` is the model of them the simulator charges as
CPU time on the node that spends it (`sim.cpu`); `Meter` measures them in a real run and
`fit_costs` turns the measurements of every node into a `RuntimeCosts`.

The model:

- a message of `kind` and S bytes costs its sender ``per_message + per_byte * S`` seconds
  before it leaves, and its receiver the same form (with its own figures) before its handler
  runs. Requests go from trainers to pservers; a pserver answers with ``reply`` (or ``error``);
- every op the executor runs costs ``op_overhead`` on top of its kernel;
- every training step costs the trainer ``step_overhead``, and ``step_residual`` if it makes
  an RPC (charged at its first RPC op that waits for an answer, once its sends have left: the
  residual is the event loop's unseen work around requests, which geo's local steps do not
  have, and it runs while the trainer waits); every sync round costs the pserver ``round_overhead``
  and ``round_residual`` on top of its optimize ops.

How `Meter` measures (DESIGN): the parts of the work that run as one stretch of Python are
timed where they happen, on the node's main thread's CPU clock (`time.thread_time`: a node that
shares its cores is not charged the slices the scheduler gave the others, as wall time would
be): a request from `RpcClient.start` to its send, a collective ring's part from its encode
to its send (untimed, it was priced as the average request, and a 3-trainer all-reduce job
came out 19% slow), a reply's decode and resolution, a pserver's handling of a message, a
reply's encode and send, each op, each optimize round.
Timers nest: an outer span is charged only the time its inner spans did not take (a pserver's
handler does not count the reply it sends). What no timer sees on the main thread (the event
loop waking up for a message and resuming the task that awaited it, the executor's loop
between ops, the collector) is the node's *residual*: the main thread's CPU time over the run
less everything timed, so that the model adds up to the CPU each role really used.

Measuring costs CPU too, which an unmeasured run (`runtime up`, what the simulator predicts)
does not spend. Three parts, each taken out of the model: the kernel timer's bookkeeping,
which it times itself (`KernelTimes.bookkeeping`); a span's own clock reads and bookkeeping
(`SpanCost.span`, of which `SpanCost.inner` lies inside the stretch the span records); and a
timed kernel call's (`SpanCost.kernel`). `calibrate_span` measures the last two on this machine
by running empty spans and an empty kernel through the same code; `fit_costs` takes each
span's inner part out of the figure it recorded (a message's, an op's, a step's, a round's) and
the rest out of the residual (a node's `measuring_seconds` in all).

The residual is split (`split_residual`): each message a node *received* costs it the event
loop's wake-up and dispatch (`loop_per_message`, calibrated on this machine by
`runtime.launch.profile.calibrate_loop`, at most the node's even share), and the rest is per
trainer step (``step_residual``) or per sync pserver round (``round_residual``), or, on a node
that has neither (an asynchronous pserver), per message as before. A machine file
(`runtime calibrate`) also says how the two grow (`RuntimeCosts.residual`), from the
reference job run again with one pserver and one trainer: a trainer's with the pservers it
talks to (``residual_peers``, the reference job's, and ``step_residual_per_peer``), a
pserver's with the nodes beyond the cores on its host (``residual_crowding``, the reference
job's, and ``round_residual_per_node``; a file from before says ``round_residual_per_peer``
per trainer in a round). DESIGN: most of what no
timer sees does not grow with the messages: the executor's loop, the RPC ops' own code and
the task switches happen once per op or step whatever the protocol, while a wake-up comes with
each message received. Spread evenly over the messages, the residual priced a protocol that
sends fewer, larger messages (``bundled``: a request per pserver a step where ``compact``
sends one per variable) as if each still carried the wake-ups of the four it replaces; split,
it carries over between protocols more closely (not exactly: a step's untimed work differs
somewhat between protocols too; the README's fidelity section says how far). Without `SpanCost` (or with a
record from before spans were counted) nothing is taken out for spans; without
`loop_per_message` the residual is spread evenly over the messages, as it was. A profile file
from before has no ``step_residual`` or ``round_residual``: none, and it predicts as it did.

The rest of the process's CPU time (`time.process_time` less the main thread's) is ZeroMQ's
I/O thread moving the bytes (and any helper threads of the kernels'): ``io``. Where what a
message's size adds is measured (``io_by_size``, a `SizeCurve` from
`runtime.launch.io_curve`), a message costs a small one's cost, measured between two processes
with the curve, plus what the curve says its size adds; else (a profile from before the
curves) ``per_message + per_byte * S`` fitted to the nodes' I/O time (`fit_io`). It runs
beside the main thread, so the simulator charges it on a processor of its own that shares the host's
cores: a message leaves after its sender's main thread and then its I/O thread have done their
part, and is handled after the receiver's I/O thread and then its main thread have.

CurveZMQ (`runtime.network.curve`) adds I/O-thread work too: `CurveCosts`, a handshake per
connection on each side and a per-byte cost of encrypting (sender) or decrypting (receiver)
each message. `runtime profile` measures them on its machine (`calibrate_curve`, beside the
run) rather than fitting them from the run; `CURVE` is the development machine's figures, the
default where none were measured. A profile's ``curve`` section holds those figures whether or
not the measured job was encrypted; an encrypted job's ``io`` is what ZeroMQ costs besides CURVE
(`fit_costs` takes the encryption out). The simulator charges the section to a job that talks
CurveZMQ (the scenario's ``cluster.security``: `runtime.config.scenario.ClusterSpec.secured`),
so one profile predicts the job over CurveZMQ, over local sockets and ``--insecure``. (The
``io`` of a job measured over local sockets is a Unix socket's, a little cheaper than
loopback TCP's.)
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from transpiler.ir import Op

from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor, SelectedRows, Value
from runtime.execution.work import op_work

__all__ = ["CURVE", "CurveCosts", "KernelTimes", "Linear", "Meter", "NodeCosts", "OpSamples",
           "RECEIVES", "REPLY_KINDS", "Residual", "RuntimeCosts", "SENDS", "Side", "SizeCurve",
           "SpanCost",
           "calibrate_curve", "calibrate_curve_least", "calibrate_span",
           "fit_costs", "fit_io",
           "fit_linear", "machine", "measuring_seconds", "output_elements", "split_residual"]

Side = Literal["send", "receive"]
SENDS: Side = "send"
RECEIVES: Side = "receive"
REPLY_KINDS = frozenset({"reply", "error"})
"""What a pserver sends back; every other kind is a trainer's request."""


def crowding(nodes: float, cores: float) -> float:
    """How crowded a host is: its nodes beyond its cores (I/O threads not counted), what a
    pserver's round residual grows with (`RuntimeCosts.round_residual_per_node`)."""
    return max(float(nodes - cores), 0.0)


@dataclass(frozen=True)
class Linear:
    """Seconds for one message of `nbytes`: ``per_message + per_byte * nbytes``, or, with
    `up_to`, that up to `up_to` bytes and `beyond` a byte past them."""

    per_message: float = 0.0
    per_byte: float = 0.0
    up_to: int = 0
    """Where a job of larger messages measured the cost past them (`runtime calibrate`'s
    `merge_bytes`): the bytes up to which `per_byte` holds; 0: it holds throughout."""
    beyond: float = 0.0
    """Seconds per byte past `up_to`."""

    def seconds(self, nbytes: int) -> float:
        if self.up_to and nbytes > self.up_to:
            return self.per_message + self.per_byte * self.up_to \
                + self.beyond * (nbytes - self.up_to)
        return self.per_message + self.per_byte * nbytes

    def document(self) -> dict[str, float]:
        document = {"per_message": self.per_message, "per_byte": self.per_byte}
        if self.up_to:
            document.update(up_to=self.up_to, beyond=self.beyond)
        return document


@dataclass(frozen=True)
class SizeCurve:
    """Seconds a message of `nbytes` costs beyond a small one: straight lines through the
    measured points (`sizes` ascending), `seconds[0]` at or below the first size (0 over the
    transport the small one was measured on, more over a dearer one), the last line's slope
    beyond the last. DESIGN: ZeroMQ's I/O thread does not cost a
    fixed amount per byte: on the development machine a message of 128 KiB cost each side 0.3
    us a KiB beyond a small one, one of 2 MiB 0.2 and one of 8 MiB 0.4 (the caches), so a line
    through a small and a 2 MiB message priced mid-sized messages at half what they cost."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) < 2 or len(self.sizes) != len(self.seconds):
            raise ValueError(f"a size curve needs two points or more, as many sizes as "
                             f"seconds: {self.sizes} against {self.seconds}")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])):
            raise ValueError(f"a size curve's sizes must rise: {self.sizes}")

    def extra(self, nbytes: int) -> float:
        sizes, seconds = self.sizes, self.seconds
        if nbytes <= sizes[0]:
            return seconds[0]
        i = min(bisect.bisect_left(sizes, nbytes), len(sizes) - 1)
        lo, hi = sizes[i - 1], sizes[i]
        slope = (seconds[i] - seconds[i - 1]) / (hi - lo)
        return max(seconds[i - 1] + slope * (nbytes - lo), 0.0)

    def document(self) -> dict[str, list[Any]]:
        return {"bytes": list(self.sizes), "seconds": list(self.seconds)}

    @staticmethod
    def of(raw: Mapping[str, Any] | None) -> SizeCurve | None:
        """The curve a document holds (`document`); None for none."""
        if raw is None:
            return None
        return SizeCurve(tuple(int(b) for b in raw["bytes"]),
                         tuple(float(s) for s in raw["seconds"]))


@dataclass(frozen=True)
class CurveCosts:
    """What CurveZMQ costs a node's I/O thread: `handshake` seconds per connection (each side),
    `per_byte` seconds per byte of each message it encrypts or decrypts."""

    handshake: float = 0.0
    per_byte: float = 0.0

    def document(self) -> dict[str, float]:
        return {"handshake": self.handshake, "per_byte": self.per_byte}


CURVE = CurveCosts(handshake=4.2e-4, per_byte=7e-10)
"""`calibrate_curve()` on the development machine (2 cores of a shared x86-64 VM, libzmq
4.3.5 with libsodium): ``python -c "from runtime.execution.costs import calibrate_curve;
print(calibrate_curve())"`` prints this machine's figures."""


@dataclass(frozen=True)
class RuntimeCosts:
    """What a node spends besides kernels (see the module doc)."""

    messages: Mapping[tuple[Side, str], Linear] = field(default_factory=dict)
    default: Mapping[Side, Linear] = field(default_factory=dict)
    """A kind the profile never saw costs what the side's messages cost on average."""
    op_overhead: float = 0.0
    step_overhead: float = 0.0
    round_overhead: float = 0.0
    io: Linear = Linear()
    """A message's cost on its node's I/O thread, on either side (CURVE's besides)."""
    machine: Mapping[str, Any] = field(default_factory=dict)
    curve: CurveCosts | None = None
    """What CurveZMQ costs on this machine, charged to a job that talks it (the simulator asks
    the scenario's ``cluster.security``); None: not measured, never charged."""
    step_residual: float = 0.0
    """What no timer sees on a trainer's main thread, per step (`split_residual`)."""
    round_residual: float = 0.0
    """What no timer sees on a sync pserver's main thread, per round."""
    residual_peers: float = 0.0
    """The peers of each node of the job the residuals were measured on (pservers a trainer
    talks to, trainers in a pserver's round); 0: not measured, the residuals do not vary."""
    step_residual_per_peer: float = 0.0
    """What `step_residual` grows by for each pserver more a trainer talks to."""
    round_residual_per_peer: float = 0.0
    """What `round_residual` grows by for each trainer more in a round (a machine file from
    before `round_residual_per_node`)."""
    residual_crowding: float = 0.0
    """The nodes beyond its host's cores that shared the host of each node of the job the
    residuals were measured on (`runtime calibrate`: 2 of 4 nodes on a 2-core machine)."""
    round_residual_per_node: float = 0.0
    """What `round_residual` grows by for each node more beyond its host's cores.

    DESIGN: the work no timer sees in a round follows how crowded the pserver's host is, not
    its round's trainers. Twelve jobs of the reference model on the development machine, 1 to 4
    pservers and 1 to 6 trainers, gave a least-squares fit of 53 us per node on the host
    (7 us per trainer beside it; residuals within 38 us rms) against 62 us per trainer alone
    (62 us rms): 1 x 6 spent 0.43 ms a round, as 3 x 3 did (0.45), where 2 x 2 spent 0.29 and
    1 x 1 0.18. A trainer's step residual follows its pservers (152 us each; the nodes add
    12 us), so it keeps its per-peer line."""
    variants: Mapping[str, RuntimeCosts] = field(default_factory=dict)
    """Where measured (`runtime calibrate`'s family reference jobs): the costs of a family of
    jobs whose runtime works apart (`runtime.services.job.Job.family`), by family. DESIGN: a
    distributed table's sends carry rows that the pserver merges and its steps await two round
    trips; priced by the dense job's figures, a ctr_dnn job of 2 x 2 came out 36% fast (5%
    from its own profile's runtime figures). Asynchronous pservers priced by an async
    reference job came out 18 to 36 points slower than by the sync one's figures, in two
    calibrations: not kept."""

    io_by_size: SizeCurve | None = None
    """Where measured (`runtime.launch.io_curve`): what a message costs the I/O thread beyond a
    small one over local sockets, by its size; `io` is then the small one's (its ``per_byte``
    0), measured between two processes too. DESIGN: not the run's own I/O time per message
    beyond the curve, though a job's I/O threads spend 16-40 us a message where two processes'
    round trips show 7-8: charged on each message's way, that time made two transfer runs'
    step predictions worse (median 11.7% to 14.4% and 18.9% to 20.2%, small jobs up to 12
    points slower), and the curve with the small message's own cost put them within a point
    of the old line (12.5%, 18.4%), the wide jobs closer; the rest seems to fill cores that the
    simulation keeps busy and the real machine leaves idle (docs/fidelity.md)."""
    io_by_size_tcp: SizeCurve | None = None
    """The same over TCP, beyond the same small message over local sockets (`over_tcp`)."""

    def over_tcp(self) -> RuntimeCosts:
        """These costs for a job whose nodes talk TCP (CurveZMQ, ``--insecure``, several
        hosts): its I/O threads priced by the TCP curve where measured."""
        if self.io_by_size_tcp is None:
            return self
        return dataclasses.replace(self, io_by_size=self.io_by_size_tcp,
                                   variants={family: costs.over_tcp()
                                             for family, costs in self.variants.items()})

    def for_job(self, family: str | None) -> RuntimeCosts:
        """The costs that price a job of `family` (`runtime.services.job.Job.family`): its
        variant's where measured, else these."""
        return self.variants.get(family, self) if family is not None else self

    def residual(self, what: str, peers: int, crowding: float = 0.0) -> float:
        """A trainer's step residual (``rpc_step``) or a pserver's round residual (``round``)
        with `peers` peers, on a host with `crowding` nodes beyond its cores: the measured one,
        moved by its slopes where measured."""
        base, slope = ((self.step_residual, self.step_residual_per_peer) if what == "rpc_step"
                       else (self.round_residual, self.round_residual_per_peer))
        if what != "rpc_step" and self.round_residual_per_node:
            base += self.round_residual_per_node * (crowding - self.residual_crowding)
        if not self.residual_peers:
            return max(base, 0.0)
        return max(base + slope * (peers - self.residual_peers), 0.0)

    def message(self, side: Side, kind: str, nbytes: int) -> float:
        cost = self.messages.get((side, kind)) or self.default.get(side)
        return 0.0 if cost is None else cost.seconds(nbytes)

    def io_seconds(self, nbytes: int) -> float:
        """A message's cost on its node's I/O thread, its encryption included."""
        seconds = self.io.seconds(nbytes)
        if self.io_by_size is not None:
            seconds += self.io_by_size.extra(nbytes)
        return seconds if self.curve is None else seconds + self.curve.per_byte * nbytes

    def handshake(self) -> float:
        """What opening a connection costs each side's I/O thread."""
        return 0.0 if self.curve is None else self.curve.handshake

    def document(self) -> dict[str, Any]:
        """The ``runtime`` section of a profile file."""
        sides: dict[str, dict[str, Any]] = {SENDS: {}, RECEIVES: {}}
        for (side, kind), cost in sorted(self.messages.items()):
            sides[side][kind] = cost.document()
        for side, cost in self.default.items():
            sides[side]["*"] = cost.document()
        document = {"messages": sides, "io": self.io.document(),
                    "op_overhead": self.op_overhead, "step_overhead": self.step_overhead,
                    "round_overhead": self.round_overhead, "step_residual": self.step_residual,
                    "round_residual": self.round_residual, "machine": dict(self.machine)}
        if self.residual_peers:
            document.update(residual_peers=self.residual_peers,
                            step_residual_per_peer=self.step_residual_per_peer,
                            round_residual_per_peer=self.round_residual_per_peer)
        if self.round_residual_per_node:
            document.update(residual_crowding=self.residual_crowding,
                            round_residual_per_node=self.round_residual_per_node)
        if self.io_by_size is not None:
            document["io_by_size"] = self.io_by_size.document()
        if self.io_by_size_tcp is not None:
            document["io_by_size_tcp"] = self.io_by_size_tcp.document()
        if self.curve is not None:
            document["curve"] = self.curve.document()
        if self.variants:
            document["variants"] = {family: costs.document()
                                    for family, costs in sorted(self.variants.items())}
        return document

    @staticmethod
    def from_document(raw: Mapping[str, Any]) -> RuntimeCosts:
        """The inverse of `document` (the caller validated the shape)."""
        messages: dict[tuple[Side, str], Linear] = {}
        default: dict[Side, Linear] = {}
        for side in (SENDS, RECEIVES):
            for kind, entry in raw.get("messages", {}).get(side, {}).items():
                cost = Linear(float(entry.get("per_message", 0.0)),
                              float(entry.get("per_byte", 0.0)), int(entry.get("up_to", 0)),
                              float(entry.get("beyond", 0.0)))
                if kind == "*":
                    default[side] = cost
                else:
                    messages[side, kind] = cost
        io = raw.get("io") or {}
        curve = raw.get("curve")
        return RuntimeCosts(messages, default, float(raw.get("op_overhead", 0.0)),
                            float(raw.get("step_overhead", 0.0)),
                            float(raw.get("round_overhead", 0.0)),
                            Linear(float(io.get("per_message", 0.0)),
                                   float(io.get("per_byte", 0.0))),
                            dict(raw.get("machine", {})),
                            None if curve is None else CurveCosts(
                                float(curve.get("handshake", 0.0)),
                                float(curve.get("per_byte", 0.0))),
                            float(raw.get("step_residual", 0.0)),
                            float(raw.get("round_residual", 0.0)),
                            float(raw.get("residual_peers", 0.0)),
                            float(raw.get("step_residual_per_peer", 0.0)),
                            float(raw.get("round_residual_per_peer", 0.0)),
                            float(raw.get("residual_crowding", 0.0)),
                            float(raw.get("round_residual_per_node", 0.0)),
                            {family: RuntimeCosts.from_document(section)
                             for family, section in (raw.get("variants") or {}).items()},
                            SizeCurve.of(raw.get("io_by_size")),
                            SizeCurve.of(raw.get("io_by_size_tcp")))


def machine() -> dict[str, Any]:
    """What the measurements were taken on: the cores and the processor, for the profile."""
    model = ""
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info
                          if line.startswith("model name")), "")
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "cpu": model or platform.processor(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__}


# -- measuring -------------------------------------------------------------------------------

@dataclass
class OpSamples:
    """The kernel calls of one op type: output elements and seconds of each, and its work
    (`runtime.execution.work.op_work`: FLOPs and bytes moved), which `runtime calibrate` fits
    curves to for the op types only its reference jobs run."""

    elements: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    bytes: list[float] = field(default_factory=list)

    def document(self) -> dict[str, list[Any]]:
        """A node's record of them (``kernels`` in its costs file)."""
        return {"elements": self.elements, "seconds": self.seconds, "flops": self.flops,
                "bytes": self.bytes}


class KernelTimes:
    """A `runtime.execution.executor.KernelTimer` that keeps every kernel call's sample, per op
    type. Calls are timed on `clock`: the calling thread's CPU time by default, which a node sharing
    its cores with others does not inflate (wall time would count the slices the scheduler gave
    the others)."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.samples: dict[str, OpSamples] = {}
        self.clock = clock
        self.bookkeeping = 0.0
        """Seconds spent recording the samples (counting outputs' elements): measuring's own
        cost, which an op's span includes and an unmeasured run does not spend."""

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        start = self.clock()
        samples = self.samples.setdefault(op.type, OpSamples())
        samples.elements.append(output_elements(op, scope))
        samples.seconds.append(seconds)
        work = op_work(op, scope)
        samples.flops.append(work.flops)
        samples.bytes.append(work.bytes)
        self.bookkeeping += self.clock() - start

    def merge(self, op_type: str, elements: list[int], seconds: list[float],
              flops: list[float] | None = None, nbytes: list[float] | None = None) -> None:
        """Another node's samples of `op_type` added (a record from before the work was kept
        has none: `flops` and `bytes` then stay shorter than `seconds`)."""
        samples = self.samples.setdefault(op_type, OpSamples())
        samples.elements.extend(elements)
        samples.seconds.extend(seconds)
        samples.flops.extend(flops or [])
        samples.bytes.extend(nbytes or [])

    @property
    def calls(self) -> int:
        return sum(len(s.seconds) for s in self.samples.values())


def _elements(value: Value) -> int:
    if isinstance(value, LoDTensor):
        return int(value.data.size)
    if isinstance(value, SelectedRows):
        return int(value.values.size)
    return int(value.size) if isinstance(value, np.ndarray) else 0


def output_elements(op: Op, scope: Scope) -> int:
    """Elements of the values `op`'s outputs hold in `scope` (as `sim.cost.Profile` counts)."""
    return sum(_elements(scope.get_tensor(name)) for names in op.outputs.values()
               for name in names if scope.has(name))


class Meter:
    """One node's measurements in a real run (see the module doc): exclusive seconds and byte
    counts per (side, kind), ops, steps and rounds, and its process CPU over the run."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.samples: dict[tuple[str, str], list[tuple[int, float]]] = {}
        """(side, kind) -> (bytes, seconds) of each message."""
        self.extra: dict[tuple[str, str], float] = {}
        """(side, kind) -> seconds spent on such messages again (a deferred request replayed)."""
        self.ops = 0
        self.op_seconds = 0.0
        self.steps = 0
        self.step_seconds = 0.0
        self.rounds = 0
        self.round_seconds = 0.0
        self.spans = 0
        """Spans started (each costs measuring's own CPU: `calibrate_span`)."""
        self.op_spans = 0
        self.step_spans = 0
        self.again_spans: dict[tuple[str, str], int] = {}
        self._stack: list[float] = []
        self._cpu_start: tuple[float, float] | None = None
        self.cpu_seconds = 0.0
        """The process's CPU time over the run, every thread."""
        self.main_seconds = 0.0
        """The main thread's."""

    # spans: start() ... stop*(); an outer span is charged its time less its inner spans'
    def start(self) -> float:
        self.spans += 1
        self._stack.append(0.0)
        return time.thread_time()

    def _exclusive(self, started: float) -> float:
        elapsed = time.thread_time() - started
        inner = self._stack.pop() if self._stack else 0.0
        if self._stack:
            self._stack[-1] += elapsed
        return max(elapsed - inner, 0.0)

    def stop_message(self, started: float, side: Side, kind: str, nbytes: int,
                     again: bool = False) -> None:
        seconds = self._exclusive(started)
        if again:
            self.extra[side, kind] = self.extra.get((side, kind), 0.0) + seconds
            self.again_spans[side, kind] = self.again_spans.get((side, kind), 0) + 1
        else:
            self.samples.setdefault((side, kind), []).append((nbytes, seconds))

    def stop_ops(self, started: float, count: int) -> None:
        seconds = self._exclusive(started)  # first: every span's timed stretch ends alike
        self.op_seconds += seconds
        self.ops += count
        self.op_spans += 1

    def stop_step(self, started: float) -> None:
        seconds = self._exclusive(started)
        self.step_seconds += seconds
        self.steps += 1
        self.step_spans += 1

    def add_step_time(self, started: float) -> None:
        """More of the current step's bookkeeping (not another step)."""
        seconds = self._exclusive(started)
        self.step_seconds += seconds
        self.step_spans += 1

    def stop_round(self, started: float) -> None:
        self.rounds += 1
        self.round_seconds += self._exclusive(started)

    def discard(self, started: float) -> None:
        """A span that turned out to be none of the above (its time stays in the residual)."""
        self._exclusive(started)

    # the node's whole run
    def begin_run(self) -> None:
        self._cpu_start = (time.process_time(), time.thread_time())

    def end_run(self) -> None:
        if self._cpu_start is not None:
            self.cpu_seconds += time.process_time() - self._cpu_start[0]
            self.main_seconds += time.thread_time() - self._cpu_start[1]
            self._cpu_start = None

    def record(self, kernel_seconds: float, kernel_calls: int,
               bookkeeping: float = 0.0) -> dict[str, Any]:
        """What the node writes for `runtime profile` (JSON data); `bookkeeping`: seconds the
        kernel timer spent recording, inside the op spans."""
        return {"role": self.role, "cpu_seconds": self.cpu_seconds,
                "main_seconds": self.main_seconds, "bookkeeping_seconds": bookkeeping,
                "kernel_seconds": kernel_seconds, "kernel_calls": kernel_calls,
                "ops": self.ops, "op_seconds": self.op_seconds,
                "steps": self.steps, "step_seconds": self.step_seconds,
                "rounds": self.rounds, "round_seconds": self.round_seconds,
                "spans": self.spans, "op_spans": self.op_spans, "step_spans": self.step_spans,
                "messages": [{"side": side, "kind": kind, "bytes": [b for b, _ in samples],
                              "seconds": [s for _, s in samples],
                              "again": self.extra.get((side, kind), 0.0),
                              "again_spans": self.again_spans.get((side, kind), 0)}
                             for (side, kind), samples in sorted(self.samples.items())]}


# -- fitting ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeCosts:
    """What `fit_costs` read off one node's record, for the profile's meta."""

    node: str
    role: str
    cpu_seconds: float
    main_seconds: float
    timed_seconds: float
    messages: int
    bytes: int
    residual_per_message: float
    """What no timer saw, on each of its messages on average (`split_residual`)."""
    measuring_seconds: float = 0.0
    """Main-thread CPU it spent measuring (the kernel timer's bookkeeping, and
    `measuring_seconds`), which the model leaves out."""
    residual_per_step: float = 0.0
    """What no timer saw, on each of its steps (a trainer) or rounds (a pserver)."""


def fit_linear(nbytes: Iterable[int], seconds: Iterable[float], total: float | None = None) -> Linear:
    """``per_message + per_byte * bytes`` through the samples by least squares, both >= 0
    (per-byte only where the sizes differ clearly); then the intercept moved so that the
    samples' predicted total is `total` (default: their measured total)."""
    n = np.asarray(list(nbytes), dtype=np.float64)
    t = np.asarray(list(seconds), dtype=np.float64)
    if n.size == 0:
        return Linear()
    target = float(t.sum()) if total is None else total
    per_byte = 0.0
    if n.size >= 4 and n.max() >= 2 * max(n.min(), 1.0) and n.max() - n.min() >= 4096:
        slope, _ = np.polyfit(n, t, 1)
        per_byte = max(float(slope), 0.0)
    per_message = max((target - per_byte * float(n.sum())) / n.size, 0.0)
    return Linear(per_message, per_byte)


def fit_io(counts: list[int], nbytes: list[int], seconds: list[float],
           per_message: float | None = None) -> Linear:
    """The I/O thread's ``per_message + per_byte * S`` from each node's messages, bytes and I/O
    seconds. With `per_message` known, the rest is per byte. Else least
    squares over the nodes, both >= 0, or per message alone where the nodes' bytes per
    message do not differ enough to tell the two apart."""
    total, messages = sum(seconds), sum(counts)
    if not messages:
        return Linear()
    if per_message is not None:
        per_message = min(per_message, total / messages)
        left = total - per_message * messages
        return Linear(per_message, left / sum(nbytes) if sum(nbytes) else 0.0)
    a = np.array([counts, nbytes], dtype=np.float64).T
    per_kib = [b / max(c, 1) / 1024 for c, b in zip(counts, nbytes)]
    if len(counts) >= 2 and max(per_kib) - min(per_kib) >= 4:
        (per_message, per_byte), *_ = np.linalg.lstsq(a, np.array(seconds), rcond=None)
        if per_message >= 0 and per_byte >= 0:
            return Linear(float(per_message), float(per_byte))
        if per_message < 0 < per_byte:
            return Linear(0.0, total / max(sum(nbytes), 1))
    return Linear(total / messages, 0.0)


def calibrate_curve_least(processes: int = 3) -> CurveCosts:
    """`calibrate_curve` in `processes` fresh processes, the least of each figure: in one
    process of two or three, on the development machine, every run read 2.5 times the cost per
    byte of the others (1.3-1.4 ns against 0.52-0.56), however often it repeated; the nodes
    of a real run spend what the low figure says (a 2 x 2 job of 4 MB messages: 0.82 ns a
    byte on each I/O thread, ZeroMQ's own work included)."""
    import json
    import subprocess
    import sys

    code = ("import json; from runtime.execution.costs import calibrate_curve; "
            "print(json.dumps(calibrate_curve(repeats=2).document()))")
    # at once: each measures its own CPU time, so they may share the cores
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 text=True) for _ in range(processes)]
    found = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        if child.returncode != 0:
            raise RuntimeError(f"calibrating CurveZMQ failed (exit {child.returncode})")
        found.append(json.loads(out.strip().splitlines()[-1]))
    return CurveCosts(min(f["handshake"] for f in found), min(f["per_byte"] for f in found))


def calibrate_curve(connections: int = 50, megabytes: int = 32, repeats: int = 3) -> CurveCosts:
    """This machine's `CurveCosts`: process CPU time (all threads) of `connections` CURVE
    handshakes between a DEALER and a ROUTER over loopback TCP, over two sides; and of
    `megabytes` MiB sent one way in 1 MiB messages with CURVE less the same without, per byte
    over two sides (one encrypts, the other decrypts). Each figure is the least of `repeats`
    runs of each kind, taken in turn, after one to warm up: measured once each, the first
    calibration in a process read 2.2 to 2.7 times the per-byte cost of the next, and a
    calibration's 1.7 ns a byte priced a 4 MB message's encryption twice what it cost."""
    import zmq  # here: the model itself needs no ZeroMQ

    def run(curve: bool, handshakes: int, messages: int) -> float:
        context = zmq.Context(io_threads=1)
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        payload = b"x" * (1 << 20)
        started = time.process_time()
        for _ in range(handshakes):
            router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
            for socket in (router, dealer):
                socket.setsockopt(zmq.LINGER, 0)
            if curve:
                router.setsockopt(zmq.CURVE_SERVER, 1)
                router.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
                dealer.setsockopt(zmq.CURVE_SERVERKEY, server_public)
                dealer.setsockopt(zmq.CURVE_PUBLICKEY, client_public)
                dealer.setsockopt(zmq.CURVE_SECRETKEY, client_secret)
            port = router.bind_to_random_port("tcp://127.0.0.1")
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"h")
            router.recv_multipart()
            for _ in range(messages):
                dealer.send(payload, copy=False)
                router.recv_multipart(copy=False)
            router.close()
            dealer.close()
        seconds = time.process_time() - started
        context.term()
        return seconds

    def extra(handshakes: int, messages: int) -> float:
        """The least CURVE run less the least plain one, the two taken in turn (a machine
        that speeds up while it works slows the first of either, not one of them only)."""
        curve, plain = [], []
        for _ in range(repeats):
            curve.append(run(True, handshakes, messages))
            plain.append(run(False, handshakes, messages))
        return min(curve) - min(plain)

    run(True, 2, megabytes)  # warm up
    handshake = extra(connections, 0) / (2 * connections)
    per_byte = extra(1, megabytes) / (2 * megabytes * (1 << 20))
    return CurveCosts(max(handshake, 0.0), max(per_byte, 0.0))


@dataclass(frozen=True)
class SpanCost:
    """What measuring costs a node's main thread, per span and per timed kernel call
    (`calibrate_span`): `span` seconds of CPU a span costs in all, `inner` of them inside the
    stretch it times (and so in what it records), the rest around it; `kernel` seconds a timed
    kernel call adds to its op's span besides the kernel's own sample and the bookkeeping the
    timer counts itself (`KernelTimes.bookkeeping`)."""

    span: float = 0.0
    inner: float = 0.0
    kernel: float = 0.0

    def document(self) -> dict[str, float]:
        return {"span": self.span, "inner": self.inner, "kernel": self.kernel}


def calibrate_span(spans: int = 20000) -> SpanCost:
    """This machine's `SpanCost`: `spans` empty spans through `Meter` (the thread's CPU time
    over them, and what they recorded), then as many spans around an empty kernel timed by
    `KernelTimes` as the executor times one (`runtime.execution.executor.timed_binder`)."""
    from runtime.execution.executor import timed_binder  # the executor imports this module
    from runtime.execution.kernels import KernelContext

    kind = "calibration"
    Meter(kind).stop_message(Meter(kind).start(), SENDS, kind, 0)  # warm up the code paths
    meter = Meter(kind)
    started = time.thread_time()
    for _ in range(spans):
        meter.stop_message(meter.start(), SENDS, kind, 0)
    span = (time.thread_time() - started) / spans
    inner = sum(seconds for _, seconds in meter.samples[SENDS, kind]) / spans

    times = KernelTimes()
    timed = timed_binder(lambda kernel: kernel, times)(lambda ctx: None)
    scope = Scope()
    scope.put("out", np.zeros(1, np.float32))
    context = KernelContext(Op(kind, {}, {"Out": ["out"]}, {}), scope)
    ops = Meter(kind)
    for _ in range(spans):
        started = ops.start()
        timed(context)
        ops.stop_ops(started, 1)
    kernel = (ops.op_seconds - sum(times.samples[kind].seconds) - times.bookkeeping) / spans
    return SpanCost(span, min(inner, span), max(kernel - inner, 0.0))


def measuring_seconds(record: Mapping[str, Any], spans: SpanCost) -> float:
    """Main-thread CPU a node's record says it spent measuring, besides the bookkeeping it
    counted itself: every span and every timed kernel call at `spans`' price. A record from
    before spans were counted says none."""
    return int(record.get("spans", 0)) * spans.span + \
        int(record.get("kernel_calls", 0)) * spans.kernel if "spans" in record else 0.0


@dataclass(frozen=True)
class Residual:
    """A node's residual (`split_residual`): seconds on each message it received, on each
    message it sent or received, and on each of its steps (a trainer) or rounds (a pserver)."""

    per_received: float = 0.0
    per_message: float = 0.0
    per_period: float = 0.0


def split_residual(residual: float, received: int, messages: int, periods: int,
                   loop_per_message: float | None = None) -> Residual:
    """Split a node's `residual` seconds. Without `loop_per_message`, evenly over its
    `messages`. With it (`runtime.launch.profile.calibrate_loop`: the event loop's cost to wake
    for one message and dispatch it), each of the `received` messages costs that much (at most
    its even share) and the rest is the node's per step or round (`periods`), or per message
    where it has none (an asynchronous pserver)."""
    if loop_per_message is None:
        return Residual(per_message=residual / messages if messages else 0.0)
    per_received = min(loop_per_message, residual / received) if received else 0.0
    rest = max(residual - per_received * received, 0.0)
    if periods:
        return Residual(per_received, per_period=rest / periods)
    return Residual(per_received, per_message=rest / messages if messages else 0.0)


def fit_costs(records: Mapping[str, Mapping[str, Any]],
              io_per_message: float | None = None,
              curve: CurveCosts = CURVE, spans: SpanCost | None = None,
              loop_per_message: float | None = None,
              io_by_size: SizeCurve | None = None,
              io_by_size_tcp: SizeCurve | None = None) -> tuple[RuntimeCosts, list[NodeCosts]]:
    """The `RuntimeCosts` of a run from every node's `Meter.record` (node name -> record);
    `io_per_message`: a small message's I/O-thread cost where measured. A run
    gets `curve` as its `RuntimeCosts.curve`; one whose nodes say they were ``encrypted`` has
    the I/O thread's figures fitted to its time less that (each node's bytes, and a
    handshake with each node of the other role). `spans` (`calibrate_span`): what measuring
    cost, taken out of the spans that recorded it and out of the residual (an unmeasured run
    does not spend it); `loop_per_message` (`calibrate_loop`): how the residual is split
    (`split_residual`); `io_by_size` and `io_by_size_tcp` (`runtime.launch.io_curve`): what a
    message costs the I/O thread beyond a small one, by its size, over local sockets and over
    TCP, measured with `io_per_message` (which they need; `io_by_size`'s DESIGN says why the
    run's own I/O time does not set it)."""
    spans = spans or SpanCost()
    inner = spans.inner
    ops = sum(int(r["ops"]) for r in records.values())
    measuring = sum(r.get("bookkeeping_seconds", 0.0)
                    + (inner * r.get("op_spans", 0) + spans.kernel * r["kernel_calls"]
                       if "spans" in r else 0.0) for r in records.values())
    op_overhead = max((sum(r["op_seconds"] for r in records.values())
                       - sum(r["kernel_seconds"] for r in records.values())
                       - measuring) / ops, 0.0) if ops else 0.0
    trainers = [r for r in records.values() if r["role"] == "trainer"]
    pservers = [r for r in records.values() if r["role"] == "pserver"]
    steps = sum(int(r["steps"]) for r in trainers)
    rounds = sum(int(r["rounds"]) for r in pservers)
    step_overhead = max(sum(r["step_seconds"] - inner * r.get("step_spans", 0)
                            for r in trainers) / steps, 0.0) if steps else 0.0
    round_overhead = max(sum(r["round_seconds"] - (inner * r["rounds"] if "spans" in r else 0.0)
                             for r in pservers) / rounds, 0.0) if rounds else 0.0

    samples: dict[tuple[Side, str], tuple[list[int], list[float], float]] = {}
    residuals: dict[tuple[Side, str], float] = {}
    per_period = {"trainer": 0.0, "pserver": 0.0}
    nodes = []
    for node, r in sorted(records.items()):
        counted = "spans" in r
        count = sum(len(m["seconds"]) for m in r["messages"])
        received = sum(len(m["seconds"]) for m in r["messages"] if m["side"] == RECEIVES)
        nbytes = sum(sum(m["bytes"]) for m in r["messages"])
        timed_spans = (count + sum(m.get("again_spans", 0) for m in r["messages"])
                       + r.get("op_spans", 0) + r.get("step_spans", 0)
                       + r["rounds"]) if counted else 0
        measured = measuring_seconds(r, spans)
        bookkeeping = r.get("bookkeeping_seconds", 0.0)  # measuring's own: not the runtime's
        timed = (r["op_seconds"] + r["step_seconds"] + r["round_seconds"]
                 + sum(sum(m["seconds"]) + m["again"] for m in r["messages"])
                 - bookkeeping - inner * timed_spans - (spans.kernel * r["kernel_calls"]
                                                        if counted else 0.0))
        residual = max(r["main_seconds"] - bookkeeping - measured - timed, 0.0)
        periods = int(r["steps"]) if r["role"] == "trainer" else int(r["rounds"])
        split = split_residual(residual, received, count, periods, loop_per_message)
        per_period[r["role"]] = per_period.get(r["role"], 0.0) + split.per_period * periods
        nodes.append(NodeCosts(node, r["role"], r["cpu_seconds"], r["main_seconds"], timed,
                               count, nbytes, (residual - split.per_period * periods) / count
                               if count else 0.0, bookkeeping + measured, split.per_period))
        for m in r["messages"]:
            key = (m["side"], m["kind"])
            sizes, seconds, again = samples.setdefault(key, ([], [], 0.0))
            sizes.extend(m["bytes"])
            seconds.extend(m["seconds"])
            spent = m["again"] - (inner * m.get("again_spans", 0) if counted else 0.0)
            samples[key] = (sizes, seconds, again + spent - (inner * len(m["seconds"])
                                                             if counted else 0.0))
            share = split.per_message + (split.per_received if m["side"] == RECEIVES else 0.0)
            residuals[key] = residuals.get(key, 0.0) + share * len(m["seconds"])
    messages = {}
    for key, (sizes, seconds, again) in samples.items():
        messages[key] = fit_linear(sizes, seconds, sum(seconds) + again + residuals[key])
    default = {}
    for side in (SENDS, RECEIVES):
        fits = [(len(samples[k][0]), c) for k, c in messages.items() if k[0] == side]
        count = sum(n for n, _ in fits)
        if count:
            default[side] = Linear(sum(n * c.per_message for n, c in fits) / count,
                                   sum(n * c.per_byte for n, c in fits) / count)
    encrypted = any(r.get("encrypted") for r in records.values())
    peers = {"trainer": len(pservers), "pserver": len(trainers)}
    io_seconds = [max(n.cpu_seconds - n.main_seconds - (curve.per_byte * n.bytes
                                                        + curve.handshake * peers[n.role]
                                                        if encrypted else 0.0), 0.0)
                  for n in nodes]
    if io_by_size is None:
        io = fit_io([n.messages for n in nodes], [n.bytes for n in nodes], io_seconds,
                    io_per_message)
    elif io_per_message is None:
        raise ValueError("fit_costs: io_by_size prices what a message's size adds to a small "
                         "message's cost, so it needs io_per_message, measured with it")
    else:
        io = Linear(io_per_message, 0.0)
    costs = RuntimeCosts(messages, default, op_overhead, step_overhead, round_overhead, io,
                         machine(), curve,
                         per_period["trainer"] / steps if steps else 0.0,
                         per_period["pserver"] / rounds if rounds else 0.0,
                         io_by_size=io_by_size, io_by_size_tcp=io_by_size_tcp)
    return costs, nodes
