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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO, TypeVar

from runtime.config.metrics import (JobMetrics, JobSummary, PserverMetrics, TrainerMetrics,
                                    held_back, read_record, write_record)
from runtime.config.scenario import Scenario
from runtime.launch.launcher import (check_run, ignored_by_runtime, judge, summary_lines,
                                     verdict)
from runtime.services.node import JOB_SUFFIX, node_file_stem, node_name

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
    for d in dirs:
        for path in sorted((d / "nodes").glob("*.json")):
            if path.name.endswith(JOB_SUFFIX) or path.name.endswith(".costs.json"):
                continue
            name = _node_of(path.stem)
            if name in collected.records:
                raise CollectError(f"{name} has two records: {collected.records[name]} and "
                                   f"{path}")
            collected.records[name] = path
    return collected


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
    return JobMetrics(summary, trainers, pservers, [], notes, [])


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
    except CollectError as exc:
        print(f"FAILED: {exc}", file=stream, flush=True)
        return 1
    metrics = merge(collected, dirs)
    judge(collected.scenario, metrics, lambda: check_run(
        collected.scenario, collected.endpoints, params_file(collected), metrics))
    write_record(out / "metrics.json", metrics)
    for line in summary_lines(metrics):
        print(line, file=stream)
    print(f"metrics: {out / 'metrics.json'}", file=stream)
    print(verdict(metrics), file=stream, flush=True)
    return 0 if metrics.job.success else 1
