"""The run record: one `metrics.json` schema for `sim run` and `runtime up`, defined once.

A run's ``OUT/metrics.json`` is a `JobMetrics` (the run record) written by `write_record`:
the job as a whole (`JobSummary`), a `TrainerMetrics` per trainer, a `PserverMetrics` per
pserver, the expectations checked (`ExpectationResult`), notes, the faults injected
(`FaultEvent`), and what only one of the two commands can measure: the simulated network's
links and NICs (`LinkMetrics`, `NicMetrics`; ``sim run``), the fault proxies and network
namespaces (`ProxyMetrics`, `NetnsMetrics`; ``runtime up``). `read_metrics` turns the file back
into a `JobMetrics`, so a reader never guesses the schema.

One rule makes the two commands' files alike: a field that both can fill has the same name,
unit and meaning in both (``job.train_seconds``, ``trainers[].step_times``,
``pservers[].bytes_in``, ...); a field that only one can fill is there in both files, null in
the other's (its description says whose it is). Times are seconds on the run's clock, which
``job.command`` names: simulated seconds for ``sim run`` (its file holds no wall-clock figure
but ``job.run``, so two runs of the same scenario and seed write the same bytes but for when,
where and how each was started), wall-clock seconds for ``runtime up``. JSON has no NaN: a
loss that is not a number (timing mode computes none) is written as null and read back as NaN.

The throughput (``job.samples_per_second``) and the step statistics count the time a job
really took, fault recovery included: a step given up for a pserver restart or a drop counts
into the step that replaced it. What they leave out is start-up: each trainer's first step,
which waits for the first round to form (a trainer started 48 s after another makes the
other's first step last 48 s), reported as ``startup_wait_seconds``. The per-step view, the
pace of a typical step with no recovery or slow step in it, is ``job.step_samples_per_second``.

The records are pydantic dataclasses: built by position or keyword like plain ones (and
`dataclasses.asdict` works on them), validated when built and read, and the source of the
JSON Schema that ``runtime/config/metrics.schema.json`` holds (`json_schema`; regenerate it with
``python -m runtime.config.metrics --write``; a test checks that it is current). Every field's
description in that file is its docstring here.

``runtime up``'s nodes write their own records (`write_record` to ``OUT/nodes/trainer-0.json``,
``OUT/nodes/pserver-1.json``) when they finish; the launcher reads them back (`read_record`) and
adds each node's exit code and log. With one node per host (``runtime up --role``), a node's
supervisor adds what it did of the faults (`NodeFaults`), which ``runtime collect`` merges.

DESIGN: ``job.wall_seconds`` (``runtime up``) and ``job.simulated_seconds`` (``sim run``) stay
two fields, not one on the run's clock: the real figure includes starting Python processes,
which the simulation does not model, so the two are not the same measure and a reader
comparing a simulation with a real run should compare ``train_seconds`` instead.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import inspect
import json
import math
import socket
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass as plain_dataclass
from dataclasses import field, fields, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeVar

import numpy as np
from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError, WithJsonSchema
from pydantic.dataclasses import dataclass

from runtime.config.atomic import atomic_open
from runtime.config.version import version

if TYPE_CHECKING:
    from runtime.config.scenario import Scenario

SCHEMA_VERSION: Final = 2
SCHEMA_FILE = Path(__file__).with_name("metrics.schema.json")
"""The JSON Schema of metrics.json, generated from these records (`json_schema`)."""
REGENERATE = "python -m runtime.config.metrics --write"

RECORD = ConfigDict(extra="forbid", use_attribute_docstrings=True,
                    json_schema_serialization_defaults_required=True)
"""Unknown fields are errors; docstrings describe fields; every field is in every file."""

Command = Literal["sim run", "runtime up"]
C = TypeVar("C", bound=type)

STARTED: Final = datetime.now(timezone.utc).replace(microsecond=0)
"""When this process started (to the second): when this module was first imported, which the
`sim` and `runtime` commands do as they start."""


def _described(cls: C) -> C:
    """Give each field of the dataclass `cls` its attribute docstring as its description, in
    the field's metadata.

    DESIGN: pydantic reads attribute docstrings (`use_attribute_docstrings`) only in the body of
    the record it builds, not in its bases; from a base's field it reads the description in the
    field's metadata. A base of a record is decorated with this, and its fields are described
    in metrics.schema.json as a record's own are."""
    docs = _attribute_docstrings(cls)
    for f in fields(cls):
        if f.name in docs:
            f.metadata = MappingProxyType({**f.metadata, "description": docs[f.name]})
    return cls


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string right after its annotated assignment in the class body."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    docs = {}
    for node, after in zip(body.body, body.body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and \
                isinstance(after.value.value, str):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _nan_for_null(value: Any) -> Any:
    return math.nan if value is None else value


Loss = Annotated[float, BeforeValidator(_nan_for_null),
                 WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "null"}]})]
"""A step's loss; null in the file (NaN in memory) where none was computed (timing mode)."""


@dataclass(config=RECORD)
class StepTimeStats:
    """Step times summed up: mean, median, 99th percentile and maximum, in seconds."""

    mean: float
    p50: float
    p99: float
    max: float

    @staticmethod
    def of(times: Sequence[float]) -> StepTimeStats | None:
        if not len(times):
            return None
        a = np.asarray(times, dtype=np.float64)
        return StepTimeStats(float(a.mean()), float(np.percentile(a, 50)),
                             float(np.percentile(a, 99)), float(a.max()))


def training_steps(step_times: Sequence[float]) -> Sequence[float]:
    """The step times that count as training: all but the first, which is start-up (it waits
    for the first round to form: every trainer started, the parameters fetched), where there
    are more than one. A trainer started long after another makes the other's first step last
    that long; counted as a step, it would swamp the step statistics and the throughput."""
    return step_times[1:] if len(step_times) > 1 else step_times


def startup_wait(step_times: Sequence[float]) -> float | None:
    """The first step's duration where `training_steps` leaves it out; else None."""
    return step_times[0] if len(step_times) > 1 else None


@dataclass(config=RECORD)
class TrainerMetrics:
    """One trainer: its steps' losses and times (of its last process, for a restarted one)."""

    index: int
    losses: list[Loss] = field(default_factory=list)
    """Each step's loss, in the order taken (redone steps included)."""
    step_times: list[float] = field(default_factory=list)
    """Each step's duration, seconds. A step given up for a fault (a pserver restarted and
    rewound it, or the pservers dropped this trainer) counts into the next step it completed,
    which lasts from the first attempt given up: the recovery is in the step times."""
    final_loss: float | None = None
    """The last step's loss; null: no step, or no loss computed."""
    step_time: StepTimeStats | None = None
    """Its step times summed up, its first step left out (startup_wait_seconds) where it took
    more than one; null: no step."""
    first_step: int = 0
    """The step its (last) process started at: later than 0 when it joined a job under way."""
    steps_redone: int = 0
    """Steps it took again because a pserver restarted from an earlier checkpoint."""
    resends: int = 0
    """Requests it sent again for want of an answer in time (lost, or their bytes or their
    reply's still on the way: `train.retry_after`), its startup and finish included; of its
    last process, for a restarted one."""
    startup_wait_seconds: float | None = None
    """Its first step's duration: start-up, not training, for that step waits for the first
    round to form (in sync mode, for every trainer to start); left out of step_time and of the
    job's throughput. Null: it took fewer than two steps (a single step counts as training)."""
    step_ends: list[float] | None = None
    """sim run only: the simulated time at the end of each step."""
    compute_seconds: float | None = None
    """sim run only: the modelled compute inside its steps."""
    barrier_wait_seconds: float | None = None
    """sim run only: time inside its send_barrier, recv and fetch_barrier ops during its steps
    (waiting for the pservers, and in sync mode for the other trainers)."""
    exit_code: int | None = None
    """runtime up only: its last process's exit status (negative: killed by that signal)."""
    log: str | None = None
    """runtime up only: its log file, relative to the output directory."""

    @staticmethod
    def from_steps(index: int, losses: Sequence[float], step_times: Sequence[float],
                   first_step: int = 0, steps_redone: int = 0, resends: int = 0
                   ) -> TrainerMetrics:
        return TrainerMetrics(index, list(losses), list(step_times),
                              _finite(losses[-1]) if losses else None,
                              StepTimeStats.of(training_steps(step_times)), first_step,
                              steps_redone, resends, startup_wait(step_times))


@_described
@plain_dataclass
class PserverPlace:
    """Which pserver a record is of (the first fields of `PserverMetrics`)."""

    index: int
    endpoint: str
    """Where the trainers reach it (host:port)."""


@_described
@plain_dataclass
class PserverCounters:
    """What a pserver counts as it serves, defined once: the live counters
    (`runtime.services.pserver.ServerStats`) and the run record (`PserverMetrics`) are both
    these fields. A plain dataclass, so that counting is plain attribute updates; its
    docstrings are the descriptions in metrics.schema.json (`_described`)."""

    messages: int = 0
    """Messages it received."""
    messages_by_kind: dict[str, int] = field(default_factory=dict)
    """Of those, the requests it could read, by kind (send, send_barrier, get, fetch_barrier,
    prefetch, heartbeat, join, complete, checkpoint_notify): retries and duplicates included; a
    SEND or GET carrying a barrier (train.protocol bundled or compact) counts as a send or get."""
    bytes_in: int = 0
    bytes_out: int = 0
    heartbeat_bytes: int = 0
    """Of bytes_in and bytes_out, those of heartbeats (how many depends on how long the job
    runs, not on its steps)."""
    optimize_seconds: float = 0.0
    """Time inside sync optimize steps."""
    steps: int = 0
    """Steps it completed."""
    errors: int = 0
    """Requests it answered with an error."""
    refusals: dict[str, int] = field(default_factory=dict)
    """Requests it refused, by reason: those answered with an error (a wire reason such as
    too_large, or the pserver's: nonfinite, not_own_var, step_ahead, held_too_much,
    not_a_request, ProtocolViolation), and BYEs that change nothing (bye_ignored, no reply).
    Its log names each peer's first refusal in a 10 s window and sums up the rest."""
    refused: int = 0
    """Of those, requests refused for their sender: a header naming another node than the one
    whose key it came with."""
    unauthenticated: int = 0
    """Connections refused at the CurveZMQ handshake: a key that is not one of the job's."""
    dropped: list[int] = field(default_factory=list)
    """Trainers it dropped for missing heartbeats."""
    checkpoints: list[int] = field(default_factory=list)
    """Steps at which it took its periodic checkpoints."""
    restored_step: int | None = None
    """The step it started from after a crash (its checkpoint's, or 0); null: never crashed."""
    rewinds: int = 0
    """Messages it answered with a rewind (of a step it lost in a crash)."""
    late_copies: int = 0
    """Copies of requests whose sender had already moved past them (duplicated or reordered
    by the network and delivered late): ignored, neither handled nor answered."""
    read_staleness_max: int | None = None
    """ssp mode only: the most steps a read of the parameters it served ran ahead of the
    slowest live trainer's completed steps (at most transpiler.staleness)."""
    blocked_seconds: dict[int, float] | None = None
    """ssp mode only: per trainer (by index), the time its reads were held here waiting for
    the slowest trainer."""
    nonfinite: dict[int, int] = field(default_factory=dict)
    """Per trainer (by index), its SENDs holding NaN, infinities or out-of-range values
    (train.on_nonfinite): refused, or their step's update skipped."""
    skipped_steps: int = 0
    """Sync steps whose update it skipped for such values (train.on_nonfinite: skip_step)."""


# DESIGN: the fields are `PserverPlace`'s, then `PserverCounters`', then the record's own, in
# this order in the file: a dataclass lists its bases' fields first, from the last base to the
# first (`index` and `endpoint` come first, hence the base of their own). The class docstring
# is the record's description in metrics.schema.json.
@dataclass(config=RECORD)
class PserverMetrics(PserverCounters, PserverPlace):
    """One pserver: its traffic and work (of its last process, for a restarted one)."""

    busy_seconds: float | None = None
    """sim run only: its modelled compute (optimize blocks, and in the asynchronous modes the
    update each message runs)."""
    busy_share: float | None = None
    """sim run only: busy_seconds / job.steps_span_seconds."""
    nic_in_share: float | None = None
    """sim run only: the time its NIC spent taking in bytes, over job.steps_span_seconds (near
    1: the bottleneck)."""
    nic_out_share: float | None = None
    """sim run only: the same for sending out."""
    exit_code: int | None = None
    """runtime up only: its last process's exit status (negative: killed by that signal)."""
    log: str | None = None
    """runtime up only: its log file, relative to the output directory."""

    @staticmethod
    def from_stats(index: int, endpoint: str, stats: PserverCounters) -> PserverMetrics:
        """The record of pserver `index` at `endpoint` from what it counted: each counter
        copied; the refusals and the tables by trainer sorted, so that the file does not depend
        on the order things happened in; `blocked_seconds` only where reads were served in ssp
        mode."""
        counts = {f.name: copy.copy(getattr(stats, f.name)) for f in fields(PserverCounters)}
        counts.update(refusals=dict(sorted(stats.refusals.items())),
                      nonfinite=dict(sorted(stats.nonfinite.items())),
                      blocked_seconds=_blocked(stats))
        return PserverMetrics(index, endpoint, **counts)


def _blocked(stats: PserverCounters) -> dict[int, float] | None:
    """Each trainer's time held (ssp: the server served reads; no trainer held: empty)."""
    if stats.read_staleness_max is None:
        return None
    return dict(sorted((stats.blocked_seconds or {}).items()))


@dataclass(config=RECORD)
class ExpectationResult:
    """One check of the scenario's `expect` block."""

    name: str
    expected: Any
    actual: Any
    passed: bool
    detail: str


@dataclass(config=RECORD)
class RunFacts:
    """Which pslab made a run, when, where, how, and of which scenario: what tells two runs of
    the same scenario apart (and, for a simulation, the only part of the record that does)."""

    pslab_version: str
    """The pslab that ran it (``unknown``: run from a tree never installed)."""
    started_utc: str
    """When the command that wrote the record started, UTC, ISO 8601 to the second (runtime
    collect: when the earliest node started)."""
    hosts: list[str]
    """The machine it ran on (runtime collect: each node's machine, once each, in the job's
    node order)."""
    command_line: list[str]
    """The command's arguments as its process was given them."""
    scenario_sha256: str
    """sha256 of the resolved scenario (its file with the --set overrides and the defaults
    applied) as canonical JSON (`scenario_sha256`): the same hash, the same settings."""

    @staticmethod
    def of(scenario: Scenario) -> RunFacts:
        """This process's facts, for a run of `scenario`."""
        return RunFacts(version(), utc_text(STARTED), [socket.gethostname()], list(sys.argv),
                        scenario_sha256(scenario))


def utc_text(when: datetime) -> str:
    """`when` as ISO 8601 in UTC, to the second: ``2025-01-31T12:00:00Z``."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def scenario_sha256(scenario: Scenario) -> str:
    """sha256 of `scenario` resolved (every field, defaults included) as JSON with sorted keys
    and no spaces."""
    resolved = scenario.model_dump(mode="json", warnings=False)  # a list for a tuple: as is
    text = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(config=RECORD)
class JobSummary:
    """The job as a whole: what ran, whether it did what the scenario expects, its figures."""

    command: Command
    """Which command ran it, and so which clock its times are on: "sim run" simulated
    seconds, "runtime up" wall-clock seconds."""
    scenario: str
    seed: int
    mode: str
    """The transpiler's mode: sync, async, ssp, half_async, geo, nccl2 or collective."""
    pservers: int
    trainers: int
    steps: int
    """Steps each trainer was to take (train.steps)."""
    batch_size: int
    endpoints: list[str]
    """The pservers' endpoints, where the trainers reached them (none in the nccl2 and
    collective modes)."""
    success: bool = False
    """Whether the run did what the scenario expects: for a scenario whose expect.error says it
    must fail, a run that failed that way is a success (reason still says why it failed)."""
    reason: str | None = None
    """Why the run failed; null: it did not."""
    failed_node: str | None = None
    """runtime up only: the node whose failure ended the run first; null: none."""
    train_seconds: float | None = None
    """The slowest trainer's time training: from the end of its first step (start-up, see
    startup_wait_seconds) to the end of its last, fault recovery included (the step times
    hold it); process launch excluded."""
    samples: int = 0
    """Examples in the steps the trainers took, all trainers together (first steps and steps
    redone included)."""
    trained_samples: int = 0
    """Examples trained on in train_seconds, all trainers together: each trainer's steps after
    its first, less the steps it redid (a step lost to a pserver restart counts once)."""
    samples_per_second: float | None = None
    """trained_samples / train_seconds: the job's throughput, the time lost to faults and
    stragglers included."""
    step_samples_per_second: float | None = None
    """The per-step view: what the job trains at the pace of a typical step, each trainer's
    batch_size over its median step time (trainers[].step_time.p50), summed over the trainers.
    It leaves out what samples_per_second counts of recovery and slow steps."""
    startup_wait_seconds: float | None = None
    """The longest of the trainers' first steps (trainers[].startup_wait_seconds): the wait
    for the first round to form, left out of the step statistics and of the throughput."""
    step_time: StepTimeStats | None = None
    """Trainer 0's step times summed up (its first step left out: trainers[].step_time)."""
    step_time_all: StepTimeStats | None = None
    """Every step of every trainer summed up, each trainer's first step left out (start-up)
    where it took more than one."""
    final_loss: float | None = None
    """Trainer 0's last loss."""
    wall_seconds: float | None = None
    """runtime up only: wall-clock time from starting the first node until every node ended."""
    simulated_seconds: float | None = None
    """sim run only: simulated time from the start until the last node finished (startup
    included, and the pservers' final drain, the quiet time they wait to answer a retried
    request, where a trainer's BYE was lost)."""
    steps_span_seconds: float | None = None
    """sim run only: from the first step's start to the last step's end, over all trainers."""
    network: str | None = None
    """sim run only: "from the scenario" or "ideal" (none given)."""
    compute: str | None = None
    """sim run only: the compute model ("none": compute takes no time)."""
    protocol: str = "compact"
    """How requests travelled (train.protocol): compact (a request per op, the barriers on the
    round's last SEND / GET), bundled (one SEND per pserver and step, carrying the barriers and
    the step's GET) or per_op (a message per RPC op)."""
    messages_per_step: dict[str, float] = field(default_factory=dict)
    """Job-wide: the requests every pserver received, by kind, over the trainer-steps taken
    (every trainer's steps added up), so per trainer and step, summed over the pservers;
    "total" adds the kinds up. Startup fetches, joins, COMPLETE and heartbeats are counted too
    (heartbeats depend on how long the job ran, not on its steps)."""
    read_staleness_max: int | None = None
    """ssp mode only: the most steps any read of the parameters ran ahead of the slowest live
    trainer (the pservers' largest read_staleness_max; at most transpiler.staleness)."""
    blocked_seconds: float | None = None
    """ssp mode only: the trainers' time with a read held back, added up over the trainers
    (each trainer's the longest it was held at any one pserver: its reads to the pservers are
    held at once)."""
    messages: int | None = None
    """sim run only: messages the simulated network carried."""
    bytes: int | None = None
    """sim run only: bytes the simulated network carried."""
    run: RunFacts | None = None
    """Which pslab ran it, when, where, how, and the scenario's hash."""

    @staticmethod
    def for_run(command: Command, scenario: Scenario, endpoints: Sequence[str],
                trainers: Sequence[TrainerMetrics],
                pservers: Sequence[PserverMetrics] = ()) -> JobSummary:
        """What `scenario` asked for and the figures both commands derive from the trainers'
        records alike; the caller adds its outcome and its own fields."""
        first = trainers[0] if trainers else None
        return JobSummary(
            command, scenario.name, scenario.seed, scenario.transpiler.mode,
            scenario.cluster.pservers, scenario.cluster.trainers, scenario.train.steps,
            scenario.data.batch_size, list(endpoints),
            samples=sum(len(t.losses) for t in trainers) * scenario.data.batch_size,
            **throughput(trainers, scenario.data.batch_size),
            step_time=first.step_time if first else None,
            step_time_all=StepTimeStats.of([x for t in trainers
                                            for x in training_steps(t.step_times)]),
            final_loss=first.final_loss if first else None, protocol=scenario.train.protocol,
            messages_per_step=messages_per_step(pservers, sum(len(t.losses) for t in trainers)),
            **held_back(pservers), run=RunFacts.of(scenario))


def throughput(trainers: Sequence[TrainerMetrics], batch_size: int) -> dict[str, Any]:
    """`JobSummary`'s train_seconds, trained_samples, samples_per_second,
    step_samples_per_second and startup_wait_seconds, from the trainers' step times."""
    training = [training_steps(t.step_times) for t in trainers]
    in_steps = [sum(times) for times in training if times]
    train_seconds = max(in_steps) if in_steps else None
    trained = sum(max(0, len(times) - t.steps_redone) for t, times in zip(trainers, training))
    paces = [batch_size / m for m in (float(np.median(x)) for x in training if x) if m > 0]
    waits = [w for w in (startup_wait(t.step_times) for t in trainers) if w is not None]
    return {"train_seconds": train_seconds, "trained_samples": trained * batch_size,
            "samples_per_second": trained * batch_size / train_seconds if train_seconds
            else None,
            "step_samples_per_second": sum(paces) if paces else None,
            "startup_wait_seconds": max(waits) if waits else None}


def held_back(pservers: Sequence[PserverMetrics]) -> dict[str, Any]:
    """`JobSummary.read_staleness_max` and `blocked_seconds` of the pservers' (None: not ssp)."""
    ssp = [p for p in pservers if p.read_staleness_max is not None]
    if not ssp:
        return {"read_staleness_max": None, "blocked_seconds": None}
    longest: dict[int, float] = {}
    for p in ssp:
        for trainer, seconds in (p.blocked_seconds or {}).items():
            longest[trainer] = max(longest.get(trainer, 0.0), seconds)
    return {"read_staleness_max": max(p.read_staleness_max or 0 for p in ssp),
            "blocked_seconds": sum(longest.values())}


def messages_per_step(pservers: Sequence[PserverMetrics], trainer_steps: int) -> dict[str, float]:
    """The requests the pservers received by kind, per trainer-step (see
    `JobSummary.messages_per_step`); empty when no step was taken."""
    if trainer_steps <= 0:
        return {}
    totals: dict[str, int] = {}
    for p in pservers:
        for kind, n in p.messages_by_kind.items():
            totals[kind] = totals.get(kind, 0) + n
    per_step = {kind: n / trainer_steps for kind, n in sorted(totals.items())}
    per_step["total"] = sum(totals.values()) / trainer_steps
    return per_step


@dataclass(config=RECORD)
class FaultEvent:
    """One fault of the scenario as it was injected: when it began and (if it did) ended, in
    seconds since every node had started, and what was done."""

    fault: int
    """Its index in the scenario's `faults` list."""
    kind: str
    what: str
    start: float
    end: float | None = None
    """null: it lasted until the end."""
    detail: str = ""
    """runtime up: how it was triggered and injected; empty in a simulation."""


@dataclass(config=RECORD)
class LinkMetrics:
    """sim run: one direction of a simulated link between two nodes, and what crossed it."""

    src: str
    dst: str
    messages: int
    bytes: int
    dropped: int
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0


@dataclass(config=RECORD)
class NicMetrics:
    """sim run: a node's simulated NIC each way: what it carried, the time it was busy and the
    time messages waited for it (seconds)."""

    node: str
    messages_out: int
    bytes_out: int
    busy_out: float
    wait_out: float
    messages_in: int
    bytes_in: int
    busy_in: float
    wait_in: float


@dataclass(config=RECORD)
class ProxyMetrics:
    """runtime up: the fault proxy in front of one pserver: where it listens and forwards, and
    for each client identity the counters (`runtime.faults.proxy.Counters`) of each direction."""

    pserver: int
    address: str
    upstream: str
    links: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    """client -> "up"/"down" -> counter -> value."""


@dataclass(config=RECORD)
class NetnsNodeMetrics:
    """One node of a ``runtime up --netns`` run: its namespace and address, the rate its
    interface was shaped at (bytes per second each way; null: not shaped), and the counters of
    the root tbf qdisc each way: ``egress`` on its own end of its veth, ``ingress`` on the
    bridge's end (kind, rate, bytes, packets, drops, overlimits: times the bucket was empty and
    a packet had to wait)."""

    node: str
    namespace: str
    address: str
    rate: float | None = None
    egress: dict[str, Any] = field(default_factory=dict)
    ingress: dict[str, Any] = field(default_factory=dict)


@dataclass(config=RECORD)
class NetnsMetrics:
    """runtime up --netns: where each node ran, and what its interface's qdiscs counted."""

    subnet: str
    hub: str
    """The namespace of the bridge."""
    nodes: list[NetnsNodeMetrics] = field(default_factory=list)


@dataclass(config=RECORD)
class JobMetrics:
    """metrics.json: the record of one run of a scenario, by ``sim run`` or ``runtime up``."""

    job: JobSummary
    trainers: list[TrainerMetrics]
    pservers: list[PserverMetrics]
    expectations: list[ExpectationResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What of the scenario this run did not do, or did otherwise (e.g. settings only the
    simulator applies)."""
    faults: list[FaultEvent] = field(default_factory=list)
    links: list[LinkMetrics] | None = None
    """sim run only: every simulated link's counters."""
    nics: list[NicMetrics] | None = None
    """sim run only: every node's simulated NIC."""
    proxies: list[ProxyMetrics] | None = None
    """runtime up only: the fault proxy in front of each pserver (when the scenario has message
    faults, or --netns a latency); empty: none."""
    netns: NetnsMetrics | None = None
    """runtime up --netns only."""
    schema: Literal[2] = SCHEMA_VERSION
    """The version of this schema."""


@dataclass(config=RECORD)
class NodeFaults:
    """``runtime up --role``: what the supervisor of one node did of the scenario's faults,
    written beside the node's record (``OUT/nodes/<role>-<index>.faults.json``) for ``runtime
    collect``, which merges every host's into metrics.json's `faults` and `proxies`. Not part of
    metrics.json itself."""

    node: str
    """The node, ``pserver:<i>`` or ``trainer:<i>``."""
    faults: list[FaultEvent] = field(default_factory=list)
    """The events of the faults that concern this node, in seconds since this host started
    it."""
    proxy: ProxyMetrics | None = None
    """A pserver's host with message faults: the fault proxy in front of it."""


R = TypeVar("R", TrainerMetrics, PserverMetrics, NodeFaults)


def write_record(path: Path, record: Any) -> None:
    """Write the dataclass `record` as indented JSON, atomically (a reader never sees half a
    file); a float that is not finite is written as null.

    DESIGN: the JSON is streamed to the file, each dataclass turned into a dict only when the
    encoder reaches it (`_fields_of`): the record of a 1,000 x 100 simulation is tens of
    megabytes of JSON, which `json.dumps` with an indent builds as millions of pieces held at
    once (hundreds of megabytes) before joining them, and `asdict` would copy whole first.
    The bytes are those of `json.dumps(asdict(record))` with the same replacement."""
    with atomic_open(path) as f:
        json.dump(record, f, indent=2, allow_nan=False, default=_fields_of)
        f.write("\n")


def _fields_of(obj: Any) -> dict[str, Any]:
    """What the JSON encoder writes for an object it cannot write itself: a dataclass as the
    dict of its fields in order, as `asdict` makes it (the dataclasses within converted in
    turn, by the encoder), with the floats that are not finite as None."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _finite_all(getattr(obj, f.name)) for f in fields(obj)}
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _finite_all(data: Any) -> Any:
    if isinstance(data, float):
        return _finite(data)
    if isinstance(data, dict):
        return {key: _finite_all(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_finite_all(value) for value in data]
    return data


def read_record(path: Path, kind: type[R]) -> R:
    """One node's part, as its node wrote it."""
    return _read(path, kind)


def read_metrics(path: Path) -> JobMetrics:
    raw = json.loads(Path(path).read_text())
    if raw.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: metrics schema {raw.get('schema')!r}, expected {SCHEMA_VERSION}")
    return _read(path, JobMetrics, raw)


T = TypeVar("T")


def _read(path: Path, kind: type[T], raw: Any = None) -> T:
    try:
        return TypeAdapter(kind).validate_python(
            json.loads(Path(path).read_text()) if raw is None else raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ValueError(f"{path}: not a {kind.__name__} record: {problems}") from None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of metrics.json, as the records define it (every field required: the
    writers write them all)."""
    schema = TypeAdapter(JobMetrics).json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "pslab metrics.json", **{k: v for k, v in schema.items() if k != "title"}}


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.config.metrics",
        description="Print the JSON Schema of metrics.json, generated from runtime/config/metrics.py.")
    parser.add_argument("--write", action="store_true", help=f"write it to {SCHEMA_FILE}")
    args = parser.parse_args(argv)
    if args.write:
        SCHEMA_FILE.write_text(schema_text())
        print(f"wrote {SCHEMA_FILE}")
    else:
        sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
