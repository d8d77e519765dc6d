"""`trace.json` is a valid Chrome trace whose complete events never overlap on a thread: every
shipped scenario's trace (a short run of each) against the Trace Event Format's rules and for
overlaps in whole nanoseconds read exactly from the file; a slice that ends where the next
begins ends exactly there, however its times round; and, where Perfetto's trace processor can
run, it loads the trace whole."""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.config.scenario import Scenario, load_scenario
from sim.simulate import simulate
from sim.trace import TraceRecorder

from trace_format import format_problems, load, overlaps

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").rglob("*.yaml"))
STEPS = 55
"""Steps of each short run: enough for every shipped fault (the latest is at step 50)."""
SHELL_VAR = "PSLAB_TRACE_PROCESSOR"
"""A trace_processor_shell binary for the Perfetto test (else one on PATH)."""


def short(path: Path) -> Scenario:
    """`path`'s scenario cut short: at most `STEPS` steps; the 1,000-trainer one on 50
    trainers and 10 pservers (every span of its full run is minutes to trace)."""
    scenario = load_scenario(path)
    overrides = [f"train.steps={min(scenario.train.steps, STEPS)}"]
    if scenario.cluster.trainers > 100:
        overrides += ["cluster.trainers=50", "cluster.pservers=10"]
    return load_scenario(path, overrides)


def traced(path: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Simulate `path` cut short and write its whole trace to `out`, a run that fails as its
    scenario expects (a pserver lost for good) included: the trace as far as it went."""
    made: list[TraceRecorder] = []

    def recorder(*args: Any) -> TraceRecorder:
        made.append(TraceRecorder(*args))
        return made[-1]

    monkeypatch.setattr(sys.modules["sim.simulate"], "TraceRecorder", recorder)
    scenario = short(path)
    try:
        simulate(scenario, base_dir=path.parent)
    except Exception as exc:
        assert scenario.expect.error is not None and scenario.expect.error in str(exc), exc
    (trace,) = made
    trace.write(out, {"scenario": scenario.name, "seed": scenario.seed})
    return out


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(ROOT / "scenarios"))
                                               for p in SHIPPED])
def test_a_shipped_scenarios_trace_is_valid_and_no_slice_overlaps_another(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = load(traced(path, tmp_path / "trace.json", monkeypatch))
    assert format_problems(document) == []
    assert overlaps(document) == []
    assert sum(e["ph"] == "X" for e in document["traceEvents"]) > 100


def test_a_slice_that_ends_where_the_next_begins_never_overlaps_it(tmp_path: Path) -> None:
    """Back-to-back spans at random float times: rounding ts and dur each on its own overlapped
    some by a nanosecond; derived from one rounding of each end, none does."""
    rng, trace = random.Random(5), TraceRecorder()
    now = 0.0
    for i in range(5000):
        step = rng.uniform(1e-7, 1e-4)
        trace.span("trainer:0", f"op {i}", now, now + step, "compute")
        now += step
    document = load(_written(trace, tmp_path))
    assert format_problems(document) == [] and overlaps(document) == []


def test_nested_slices_are_not_overlaps_and_crossing_ones_are(tmp_path: Path) -> None:
    trace = TraceRecorder()
    trace.span("trainer:0", "step 0", 0.0, 1e-3, "step")
    trace.span("trainer:0", "mul", 1e-4, 2e-4, "step")  # inside step 0
    assert overlaps(load(_written(trace, tmp_path))) == []
    trace.span("trainer:0", "late", 9e-4, 2e-3, "step")  # begins in step 0, ends after it
    (found,) = overlaps(load(_written(trace, tmp_path)))
    assert "late [900000, 2000000] ns overlaps step 0 [0, 1000000] ns" in found


def _written(trace: TraceRecorder, path: Path) -> Path:
    trace.write(path / "trace.json")
    return path / "trace.json"


def _shell() -> str | None:
    return os.environ.get(SHELL_VAR) or shutil.which("trace_processor_shell")


def test_perfetto_loads_every_slice_of_the_quickstart_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Perfetto's own reading of the trace: every complete event a slice, nothing dropped or
    refused. Needs the ``perfetto`` package (the ``trace`` extra) and its trace processor
    binary, which the package downloads at run time: named by $PSLAB_TRACE_PROCESSOR or on
    PATH as trace_processor_shell where there is no network."""
    api = pytest.importorskip("perfetto.trace_processor",
                              reason="the perfetto package is not installed (extra: trace)")
    shell = _shell()
    if shell is None:
        pytest.skip(f"no Perfetto trace processor binary: ${SHELL_VAR} unset and no "
                    "trace_processor_shell on PATH (the perfetto package would download one)")
    path = traced(ROOT / "scenarios" / "quickstart.yaml", tmp_path / "trace.json", monkeypatch)
    complete = sum(e["ph"] == "X" for e in load(path)["traceEvents"])
    processor = api.TraceProcessor(trace=str(path),
                                   config=api.TraceProcessorConfig(bin_path=shell))
    try:
        (row,) = list(processor.query("select count(*) as n from slice"))
        problems = [(r.name, r.value) for r in processor.query(
            "select name, value from stats where severity in ('error', 'data_loss') "
            "and value > 0")]
    finally:
        processor.close()
    assert problems == [] and row.n == complete
