"""`runtime collect OUT_DIR... [-o OUT]`: one run record from the nodes of a job run across hosts.

Across hosts each node runs on its own (``runtime up --role``, or Paddle's variables) and writes
what it did under its own output directory: its record ``nodes/<role>-<index>.json`` (when it
succeeded), ``nodes/<role>-<index>.job.json`` (the job as it resolved it, written as it starts;
`runtime.services.node.write_node_job`) and, for trainer 0, ``params.npz``. Copied to one
machine (or on a shared file system), those directories are what this command reads: it checks
that every node ran the same job, merges the records into the run record ``runtime up`` writes
(`runtime.config.metrics`, its ``job.command`` "runtime up": each node ran as ``runtime up
--role``), checks the scenario's ``expect`` block (`runtime.config.expect`) and writes
``OUT/metrics.json``, printing the same summary and verdict as ``runtime up``. A node that wrote
no record failed (or never ran): the run fails, naming it. What one host cannot know stays null:
the wall time of the whole run and each node's log.

The faults: a node that faults concerned ran under a supervisor (`runtime.launch.role`), which
wrote what it did beside the node's record, ``nodes/<role>-<index>.faults.json``. They become
metrics.json's ``faults`` and ``proxies`` as ``runtime up`` fills them (`merge_faults`): one
event per fault that fired, and each pserver's proxy's counters per connection, as its host
counted them. A fault several hosts acted out (a link rule on every pserver's links) is one
event, begun at the earliest of their starts and ended at the latest of their ends (never, if
it lasted to the end on any), its detail each host's in turn, named. Its times are its hosts'
own: seconds since each started its node, not one clock's.

The figures are ``runtime up``'s (`JobSummary.for_run`): the step statistics and the throughput
leave out each trainer's first step, start-up, which across hosts waits for the last node
started by hand (``job.startup_wait_seconds`` says how long). ``job.run`` holds this command's
pslab version and command line and the scenario's hash, with the nodes' earliest start and
their machines where their job descriptions hold them (a ``run`` of their own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO, TypeVar

from pydantic import TypeAdapter, ValidationError

from runtime.config.metrics import (FaultEvent, JobMetrics, JobSummary, NodeFaults,
                                    ProxyMetrics, PserverMetrics, RunFacts, TrainerMetrics,
                                    held_back, read_record, write_record)
from runtime.config.nodes import node_file_stem, node_name, node_names
from runtime.config.scenario import Scenario
from runtime.launch.launcher import (check_run, ignored_by_runtime, judge, summary_lines,
                                     verdict)
from runtime.launch.role import FAULTS_SUFFIX
from runtime.services.node import JOB_SUFFIX

R = TypeVar("R", TrainerMetrics, PserverMetrics)


class CollectError(ValueError):
    """Directories that do not hold one job's nodes; the message names the file at fault."""


@dataclass
class Collected:
    """What the output directories hold: the job and, per node, where its record is."""

    scenario: Scenario
    endpoints: list[str]
    records: dict[str, Path] = field(default_factory=dict)
    """node name -> its record file."""
    faults: dict[str, Path] = field(default_factory=dict)
    """node name -> what its supervisor did of the faults (`NodeFaults`), if it had one."""
    facts: dict[str, RunFacts] = field(default_factory=dict)
    """node name -> when and where it started, where its job description says (its ``run``)."""


def read_job(dirs: Sequence[Path]) -> Collected:
    """The job every ``nodes/*.job.json`` under `dirs` describes, which must be one and the
    same, and where each node's record lies."""
    described: list[tuple[Path, dict[str, Any]]] = []
    for d in dirs:
        if not d.is_dir():
            raise CollectError(f"{d}: not a directory")
        for path in sorted((d / "nodes").glob(f"*{JOB_SUFFIX}")):
            try:
                described.append((path, json.loads(path.read_text())))
            except (OSError, ValueError) as exc:
                raise CollectError(f"{path}: unreadable: {exc}") from None
    if not described:
        raise CollectError(f"no nodes/*{JOB_SUFFIX} in {', '.join(map(str, dirs))}: a node "
                           "describes its job there when it runs on its own with --out")
    (first, job), *others = described
    for path, other in others:
        for key in ("scenario", "endpoints"):
            if other.get(key) != job.get(key):
                raise CollectError(f"{path} and {first} describe different jobs (their "
                                   f"{key} differ)")
    try:
        collected = Collected(Scenario.model_validate(job["scenario"]), list(job["endpoints"]))
    except (KeyError, ValueError) as exc:
        raise CollectError(f"{first}: not a job description: {exc}") from None
    collected.facts = dict(_facts(path, document) for path, document in described
                           if "run" in document)
    for d in dirs:
        for path in sorted((d / "nodes").glob("*.json")):
            if path.name.endswith(JOB_SUFFIX) or path.name.endswith(".costs.json"):
                continue
            faults = path.name.endswith(FAULTS_SUFFIX)
            found = collected.faults if faults else collected.records
            name = _node_of(path.name.removesuffix(FAULTS_SUFFIX) if faults else path.stem)
            if name in found:
                raise CollectError(f"{name} has two {'fault records' if faults else 'records'}: "
                                   f"{found[name]} and {path}")
            found[name] = path
    return collected


def _facts(path: Path, document: dict[str, Any]) -> tuple[str, RunFacts]:
    """The node a job description is of, and its ``run`` (`RunFacts`)."""
    try:
        return str(document["node"]), TypeAdapter(RunFacts).validate_python(document["run"])
    except (KeyError, ValidationError) as exc:
        raise CollectError(f"{path}: not a job description: {exc}") from None


def run_facts(collected: Collected) -> RunFacts:
    """The run's `RunFacts`: this command's (pslab version, command line, the scenario's hash),
    with the nodes' earliest start and their machines where their job descriptions hold them
    (each node's ``run``)."""
    facts = RunFacts.of(collected.scenario)
    cluster = collected.scenario.cluster
    nodes = [collected.facts[name] for name in node_names(cluster.pservers, cluster.trainers)
             if name in collected.facts]
    if nodes:
        facts.started_utc = min(f.started_utc for f in nodes)  # ISO 8601 UTC: text order
        facts.hosts = list(dict.fromkeys(host for f in nodes for host in f.hosts))
    return facts


def _node_of(stem: str) -> str:
    role, _, index = stem.rpartition("-")
    return node_name(role, int(index)) if index.isdigit() else stem


def merge(collected: Collected, dirs: Sequence[Path]) -> JobMetrics:
    """The run record of the collected nodes (no expectation checked yet)."""
    scenario = collected.scenario
    cluster = scenario.cluster
    trainers = [_record(collected, "trainer", i, TrainerMetrics) for i in range(cluster.trainers)]
    pservers = [_record(collected, "pserver", j, PserverMetrics) for j in range(cluster.pservers)]
    summary = JobSummary.for_run("runtime up", scenario, collected.endpoints, trainers)
    summary.run = run_facts(collected)
    for name, value in held_back(pservers).items():  # ssp: from the pservers' records
        setattr(summary, name, value)
    missing = [(role, i) for role, count in (("pserver", cluster.pservers),
                                             ("trainer", cluster.trainers))
               for i in range(count) if node_name(role, i) not in collected.records]
    summary.success = not missing
    if missing:
        names = ", ".join(node_name(*m) for m in missing)
        stems = ", ".join(f"nodes/{node_file_stem(*m)}.json" for m in missing)
        summary.reason = (f"{names} wrote no record ({stems}) in any of "
                          f"{', '.join(map(str, dirs))}: failed, or never ran")
        summary.failed_node = node_name(*missing[0])
    notes = [f"collected by runtime collect from {', '.join(map(str, dirs))}",
             *ignored_by_runtime(scenario)]
    reports = [_faults_of(collected, name) for name in _node_order(collected.faults, scenario)]
    events, proxies = merge_faults(reports)
    return JobMetrics(summary, trainers, pservers, [], notes, events, proxies=proxies)


def _node_order(names: dict[str, Path], scenario: Scenario) -> list[str]:
    """`names` in the job's order: the pservers, then the trainers."""
    cluster = scenario.cluster
    order = node_names(cluster.pservers, cluster.trainers)
    unknown = sorted(set(names) - set(order))
    if unknown:
        raise CollectError(f"{names[unknown[0]]}: {unknown[0]} is not a node of the job")
    return [name for name in order if name in names]


def _faults_of(collected: Collected, name: str) -> NodeFaults:
    path = collected.faults[name]
    try:
        report = read_record(path, NodeFaults)
    except (OSError, ValueError) as exc:
        raise CollectError(f"{path}: unreadable: {exc}") from None
    if report.node != name:
        raise CollectError(f"{path}: the faults of {report.node}, not of {name}")
    return report


def merge_faults(reports: Sequence[NodeFaults]) -> tuple[list[FaultEvent], list[ProxyMetrics]]:
    """metrics.json's ``faults`` and ``proxies`` from what each host did (see the module doc):
    the events by start, then fault; the proxies by pserver."""
    acted: dict[int, list[tuple[str, FaultEvent]]] = {}
    for report in reports:
        for event in report.faults:
            acted.setdefault(event.fault, []).append((report.node, event))
    events = []
    for fault, by_host in acted.items():
        first = by_host[0][1]
        ends = [e.end for _, e in by_host]
        end = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
        events.append(FaultEvent(fault, first.kind, first.what, min(e.start for _, e in by_host),
                                 end, "; ".join(f"{node}: {e.detail}" for node, e in by_host)))
    events.sort(key=lambda e: (e.start, e.fault))
    proxies = sorted((r.proxy for r in reports if r.proxy is not None), key=lambda p: p.pserver)
    return events, proxies


def _record(collected: Collected, role: str, index: int, kind: type[R]) -> R:
    path = collected.records.get(node_name(role, index))
    if path is None:
        empty: Any = (TrainerMetrics.from_steps(index, [], [], 0, 0) if kind is TrainerMetrics
                      else PserverMetrics(index, collected.endpoints[index]))
        return empty  # type: ignore[no-any-return]
    record = read_record(path, kind)
    record.exit_code = 0  # a node writes its record only when it succeeded
    return record


def params_file(collected: Collected) -> Path:
    """Where trainer 0 left its final parameters (beside its record)."""
    record = collected.records.get(node_name("trainer", 0))
    return record.parent.parent / "params.npz" if record is not None else Path("/nonexistent")


def collect(dirs: Sequence[Path], out: Path, stream: TextIO) -> int:
    """Merge, check and write ``OUT/metrics.json``; the exit status (0 OK, 1 not)."""
    try:
        collected = read_job(dirs)
        metrics = merge(collected, dirs)
    except CollectError as exc:
        print(f"FAILED: {exc}", file=stream, flush=True)
        return 1
    judge(collected.scenario, metrics, lambda: check_run(
        collected.scenario, collected.endpoints, params_file(collected), metrics))
    write_record(out / "metrics.json", metrics)
    for line in summary_lines(metrics):
        print(line, file=stream)
    print(f"metrics: {out / 'metrics.json'}", file=stream)
    print(verdict(metrics), file=stream, flush=True)
    return 0 if metrics.job.success else 1
