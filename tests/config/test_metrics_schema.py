"""The run record: metrics.json's JSON Schema file is what `runtime.config.metrics` generates, the
schema itself is valid, and the files both commands write conform to it (`runtime up`'s are
checked in tests/launch/test_runtime_up.py, `sim run`'s in tests/sim/test_sim_run.py)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from runtime.config.metrics import (REGENERATE, SCHEMA_FILE, FaultEvent, JobMetrics, JobSummary,
                                    NetnsMetrics, NetnsNodeMetrics, ProxyMetrics, PserverMetrics,
                                    TrainerMetrics, read_metrics, read_record, schema_text,
                                    write_record)
from runtime.config.scenario import parse_scenario

from metrics_schema import assert_valid_metrics, validator

SMALL = parse_scenario("name: s\nmodel: {name: mlp}\ncluster: {pservers: 1, trainers: 1}\n"
                       "data: {batch_size: 4}\ntrain: {steps: 2}\n")


def test_the_schema_file_is_what_the_records_generate() -> None:
    assert SCHEMA_FILE.read_text() == schema_text(), \
        f"{SCHEMA_FILE} is stale: regenerate it with `{REGENERATE}`"


def test_the_schema_is_a_valid_json_schema_requiring_every_field() -> None:
    schema = validator().schema  # checked against the JSON Schema metaschema
    trainer = schema["$defs"]["TrainerMetrics"]
    assert set(trainer["required"]) == set(trainer["properties"])
    assert trainer["additionalProperties"] is False
    assert schema["properties"]["schema"]["const"] == 2


def runtime_record() -> JobMetrics:
    counters = {"messages": 3, "dropped": 1}
    trainers = [TrainerMetrics.from_steps(0, [2.0, 1.0], [0.25, 0.25], first_step=3,
                                          steps_redone=1)]
    summary = JobSummary.for_run("runtime up", SMALL, ["127.0.0.1:1"], trainers)
    summary.wall_seconds, summary.success = 1.5, True
    return JobMetrics(
        summary, trainers, [PserverMetrics(0, "127.0.0.1:1", messages=10, bytes_in=100)],
        faults=[FaultEvent(0, "crash", "crash pserver:0", 1.25, 2.25, "at 1.25s")],
        proxies=[ProxyMetrics(0, "127.0.0.1:1", "127.0.0.1:2",
                              {"trainer:0": {"up": counters, "down": counters}})],
        netns=NetnsMetrics("10.147.1.0/24", "pslab-hub", [
            NetnsNodeMetrics("pserver:0", "pslab-p0", "10.147.1.2", 25e6, {"bytes": 10})]))


def test_a_record_round_trips_and_conforms(tmp_path: Path) -> None:
    metrics = runtime_record()
    assert metrics.job.samples == 8 and metrics.job.train_seconds == 0.25  # the first: start-up
    assert metrics.job.startup_wait_seconds == 0.25 and metrics.job.final_loss == 1.0
    assert metrics.job.trained_samples == 0 == metrics.job.samples_per_second  # a step redone
    write_record(tmp_path / "m.json", metrics)
    assert read_metrics(tmp_path / "m.json") == metrics
    assert_valid_metrics(tmp_path / "m.json")


def test_a_loss_not_computed_is_null_in_the_file_and_nan_in_memory(tmp_path: Path) -> None:
    record = TrainerMetrics.from_steps(1, [math.nan, math.nan], [0.5, 0.25])
    assert record.final_loss is None
    write_record(tmp_path / "trainer-1.json", record)
    assert json.loads((tmp_path / "trainer-1.json").read_text())["losses"] == [None, None]
    back = read_record(tmp_path / "trainer-1.json", TrainerMetrics)
    assert len(back.losses) == 2 and all(math.isnan(x) for x in back.losses)
    metrics = runtime_record()
    metrics.trainers = [record]
    write_record(tmp_path / "m.json", metrics)
    assert_valid_metrics(tmp_path / "m.json")


def test_a_record_is_written_as_the_indented_json_of_its_plain_copy(tmp_path: Path) -> None:
    """Streamed, dataclass by dataclass: the bytes of `json.dumps` of `asdict` (nested
    dataclasses, maps and lists; floats that are not finite as null)."""
    metrics = runtime_record()
    metrics.trainers = [TrainerMetrics.from_steps(1, [math.nan, 2.0], [0.5, 0.25])]

    def finite(data: object) -> object:
        if isinstance(data, float):
            return data if math.isfinite(data) else None
        if isinstance(data, dict):
            return {key: finite(value) for key, value in data.items()}
        if isinstance(data, list):
            return [finite(value) for value in data]
        return data

    write_record(tmp_path / "m.json", metrics)
    expected = json.dumps(finite(asdict(metrics)), indent=2, allow_nan=False) + "\n"
    assert (tmp_path / "m.json").read_text() == expected


def test_an_unknown_field_or_schema_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    write_record(path, runtime_record())
    raw = json.loads(path.read_text())
    raw["trainers"][0]["loss_es"] = []
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"{path}: not a JobMetrics record: .*loss_es"):
        read_metrics(path)
    raw["schema"] = 1
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=rf"{path}: metrics schema 1, expected 2"):
        read_metrics(path)
