"""Measurements guarded by speed probes (`runtime.launch.speed`): taken again while the machine
runs slow, the least slow try kept and named; and the calibration's and profile's use of it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.launch import profile
from runtime.launch.calibrate import summary
from runtime.launch.speed import PROBE_SLOW, PROBE_TRIES, SpeedGuard


def scripted(*probes: float) -> tuple[SpeedGuard, Iterator[float]]:
    values = iter(probes)
    return SpeedGuard(lambda: next(values)), values


def test_a_measurement_at_speed_is_taken_once() -> None:
    guard, rest = scripted(1.0, 1.0, 1.1)  # the first probe sets the bar; one before, one after
    attempts: list[int] = []

    def work(attempt: int) -> int:
        attempts.append(attempt)
        return attempt

    assert guard.measure("x", work) == (0, None)
    assert attempts == [0] and guard.slow == {} and list(rest) == []


def test_a_measurement_taken_while_slow_is_taken_again_and_the_calm_try_counts() -> None:
    slow = PROBE_SLOW * 1.01
    guard, _ = scripted(1.0, 1.0, slow, slow, 1.0, 1.0, 1.0)
    assert guard.measure("x", lambda a: f"try {a}") == ("try 2", None)
    assert guard.slow == {}


def test_slow_every_time_keeps_the_least_slow_try_and_names_it() -> None:
    probes = [1.0] + [1.0, 2.0, 1.0, 1.5, 1.8, 1.0][:2 * PROBE_TRIES]
    guard, _ = scripted(*probes)
    result, slowness = guard.measure("cores", lambda a: a)
    assert (result, slowness) == (1, 1.5) and guard.slow == {"cores": 1.5}
    # named until a later measurement of the same thing runs at speed
    guard.probe = lambda: 1.0
    assert guard.measure("cores", lambda a: a) == (0, None) and guard.slow == {}


def test_past_its_deadline_a_slow_measurement_is_kept_and_named_without_another_try() -> None:
    guard, _ = scripted(1.0, 1.0, 2.0)
    guard.deadline = 0.0
    assert guard.measure("x", lambda a: a) == (0, 2.0) and guard.slow == {"x": 2.0}


def test_a_faster_probe_later_raises_the_bar() -> None:
    guard, _ = scripted(2.0, 2.0, 2.0, 1.0, 1.0)
    guard.measure("a", lambda a: a)
    guard.measure("b", lambda a: a)
    assert guard.fastest == 1.0


def test_a_guarded_profile_run_taken_slow_is_run_again_in_a_folder_of_its_own(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    where: list[Path] = []

    def measure(path: Path, overrides: list[str], scenario: Any, out: Path, stream: Any,
                netns: bool) -> Path:
        where.append(out)
        return out

    monkeypatch.setattr(profile, "measure", measure)
    monkeypatch.setattr(profile, "cpu_total", lambda run: len(str(run)))
    scenario = type("S", (), {"name": "job"})()
    guard, _ = scripted(1.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0)  # run 2's first try ran slow
    stream = io.StringIO()
    profile.measure_runs(Path("job.yaml"), [], scenario, tmp_path, stream, runs=2, guard=guard)
    assert where == [tmp_path / "run-0", tmp_path / "run-1", tmp_path / "run-1-again1"]
    assert "measuring it again (try 2 of 3)" in stream.getvalue() and guard.slow == {}


def test_the_summary_names_what_was_measured_slow_and_says_what_to_do() -> None:
    document: dict[str, Any] = {"kernels": {}, "meta": {"slow": {
        "numpy": {"mlp-64-b32": 1.4}, "machine": {"cores": 1.6}}}}
    line = next(line for line in summary(document) if "ran slow" in line)
    assert "2 times (up to x1.60)" in line and "cores, mlp-64-b32" in line
    assert "calibrate again on a quiet machine" in line
    quiet: dict[str, Any] = {"kernels": {}, "meta": {"slow": {"numpy": {}, "machine": {}}}}
    assert not any("ran slow" in line for line in summary(quiet))
