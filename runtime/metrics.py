"""The record of a real run: `metrics.json`, as dataclasses.

Each node of a `runtime up` run writes its own part when it finishes (`write_record` to
``OUT/nodes/trainer-0.json``, ``OUT/nodes/pserver-1.json``): a trainer its `TrainerMetrics`, a
pserver its `PserverMetrics`. The launcher reads them back (`read_record`), adds each node's exit
code and log, the job's figures (`JobSummary`) and the expectations it checked, and writes the
whole `JobMetrics` as ``OUT/metrics.json``. The file is exactly `dataclasses.asdict` of a
`JobMetrics`, and `read_metrics` turns it back into one, so a reader never guesses the schema:

    {"schema": 1,
     "job": {"scenario", "mode", "pservers", "trainers", "steps", "batch_size", "endpoints",
             "wall_seconds", "train_seconds", "samples", "samples_per_second",
             "success", "reason", "failed_node"},
     "trainers": [{"index", "losses", "step_times", "final_loss", "first_step",
                   "steps_redone", "exit_code", "log"}],
     "pservers": [{"index", "endpoint", "messages", "bytes_in", "bytes_out",
                   "optimize_seconds", "steps", "errors", "dropped", "exit_code", "log"}],
     "expectations": [{"name", "expected", "actual", "passed", "detail"}],
     "notes": ["what this run ignored of the scenario"],
     "faults": [{"fault", "kind", "what", "start", "end", "detail"}],
     "proxies": [{"pserver", "address", "upstream", "links": {client: {"up", "down"}}}],
     "netns": null or {"subnet", "hub", "nodes": [{"node", "namespace", "address", "rate",
                                                   "egress", "ingress"}]}}

Times are seconds. A node that failed before writing its part appears with empty figures and
its exit code (a trainer with what its progress lines told); a node restarted after a crash
appears as its last process left it. ``success`` says whether the run did what the scenario
expects: for a scenario whose ``expect.error`` says it must fail, a run that failed that way
is a success (``reason`` still says why it failed). ``faults`` lists the faults injected, when
(seconds since every node had started) and what was done; ``proxies`` the fault proxy in front
of each pserver (when the scenario has message faults, or ``--netns`` a latency) with its
counters per client link. ``netns`` (``runtime up --netns``) says where each node ran and what
the tbf qdiscs of its interface counted: ``egress`` on its own end of its veth, ``ingress`` on
the bridge's end (``kind``, ``rate`` in bytes per second, ``bytes``, ``packets``, ``drops``,
``overlimits``: times the bucket was empty and a packet had to wait).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .pserver import ServerStats

SCHEMA_VERSION = 1


@dataclass
class TrainerMetrics:
    index: int
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    final_loss: float | None = None
    first_step: int = 0
    """The step its (last) process started at: later than 0 when it joined a job under way."""
    steps_redone: int = 0
    """Steps it took again because a pserver restarted from an earlier checkpoint."""
    exit_code: int | None = None
    log: str | None = None

    @staticmethod
    def from_steps(index: int, losses: list[float], step_times: list[float],
                   first_step: int = 0, steps_redone: int = 0) -> "TrainerMetrics":
        return TrainerMetrics(index, list(losses), list(step_times),
                              losses[-1] if losses else None, first_step, steps_redone)


@dataclass
class PserverMetrics:
    index: int
    endpoint: str
    messages: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    optimize_seconds: float = 0.0
    steps: int = 0
    errors: int = 0
    dropped: list[int] = field(default_factory=list)
    exit_code: int | None = None
    log: str | None = None
    heartbeat_bytes: int = 0
    """Of bytes_in and bytes_out, those of heartbeats (how many depends on wall time)."""

    @staticmethod
    def from_stats(index: int, endpoint: str, stats: ServerStats) -> "PserverMetrics":
        return PserverMetrics(index, endpoint, stats.messages, stats.bytes_in, stats.bytes_out,
                              stats.optimize_seconds, stats.steps, stats.errors,
                              list(stats.dropped), heartbeat_bytes=stats.heartbeat_bytes)


@dataclass
class ExpectationResult:
    name: str
    expected: Any
    actual: Any
    passed: bool
    detail: str


@dataclass
class JobSummary:
    scenario: str
    mode: str
    pservers: int
    trainers: int
    steps: int
    batch_size: int
    endpoints: list[str]
    wall_seconds: float = 0.0
    train_seconds: float | None = None
    """The slowest trainer's time inside its steps (startup and process launch excluded)."""
    samples: int = 0
    """Examples in the steps the trainers reported."""
    samples_per_second: float | None = None
    """Samples trained by all trainers together / `train_seconds`."""
    success: bool = False
    reason: str | None = None
    failed_node: str | None = None


@dataclass
class FaultEvent:
    """One fault of the scenario as it was injected: when it began and (if it did) ended, in
    seconds since every node had started, and what was done."""

    fault: int
    """Its index in the scenario's `faults` list."""
    kind: str
    what: str
    start: float
    end: float | None = None
    detail: str = ""


@dataclass
class ProxyMetrics:
    """The fault proxy in front of one pserver: where it listens and forwards, and for each
    client identity the counters (`runtime.faultproxy.Counters` as a dict) of each direction."""

    pserver: int
    address: str
    upstream: str
    links: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    """client -> "up"/"down" -> counter -> value."""


@dataclass
class NetnsNodeMetrics:
    """One node of a ``runtime up --netns`` run: its namespace and address, the rate its
    interface was shaped at (bytes per second each way; None: not shaped), and the counters of
    the root qdisc each way (`runtime.netns`)."""

    node: str
    namespace: str
    address: str
    rate: float | None = None
    egress: dict[str, Any] = field(default_factory=dict)
    ingress: dict[str, Any] = field(default_factory=dict)


@dataclass
class NetnsMetrics:
    subnet: str
    hub: str
    """The namespace of the bridge."""
    nodes: list[NetnsNodeMetrics] = field(default_factory=list)


@dataclass
class JobMetrics:
    job: JobSummary
    trainers: list[TrainerMetrics]
    pservers: list[PserverMetrics]
    expectations: list[ExpectationResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)
    proxies: list[ProxyMetrics] = field(default_factory=list)
    netns: NetnsMetrics | None = None
    schema: int = SCHEMA_VERSION


R = TypeVar("R", TrainerMetrics, PserverMetrics)


def write_record(path: Path, record: TrainerMetrics | PserverMetrics | JobMetrics) -> None:
    """Write `record` as JSON, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    tmp.replace(path)


def read_record(path: Path, kind: type[R]) -> R:
    """One node's part, as its node wrote it."""
    return _build(kind, json.loads(path.read_text()), str(path))


def read_metrics(path: Path) -> JobMetrics:
    raw = json.loads(Path(path).read_text())
    if raw.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{path}: metrics schema {raw.get('schema')!r}, expected {SCHEMA_VERSION}")
    return JobMetrics(
        job=_build(JobSummary, raw["job"], f"{path}: job"),
        trainers=[_build(TrainerMetrics, t, f"{path}: trainers") for t in raw["trainers"]],
        pservers=[_build(PserverMetrics, p, f"{path}: pservers") for p in raw["pservers"]],
        expectations=[_build(ExpectationResult, e, f"{path}: expectations")
                      for e in raw["expectations"]],
        notes=list(raw["notes"]),
        faults=[_build(FaultEvent, f, f"{path}: faults") for f in raw.get("faults", [])],
        proxies=[_build(ProxyMetrics, p, f"{path}: proxies") for p in raw.get("proxies", [])],
        netns=_netns(raw.get("netns"), f"{path}: netns"))


def _netns(raw: dict[str, Any] | None, where: str) -> NetnsMetrics | None:
    if raw is None:
        return None
    nodes = [_build(NetnsNodeMetrics, n, where) for n in raw.get("nodes", [])]
    return _build(NetnsMetrics, {**raw, "nodes": nodes}, where)


T = TypeVar("T")


def _build(kind: type[T], raw: dict[str, Any], where: str) -> T:
    names = {f.name for f in fields(kind)}  # type: ignore[arg-type]
    unknown = set(raw) - names
    if unknown:
        raise ValueError(f"{where}: unknown {kind.__name__} field(s) {sorted(unknown)}")
    return kind(**raw)
