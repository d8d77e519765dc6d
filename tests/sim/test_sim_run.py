"""`sim run` and `sim sweep`: the real runtime on the virtual clock.

Hand-computable step times come out exact, a straggler delays sync steps by exactly its extra
compute and the other trainers' async steps not at all, the parameters equal a real run's, every
shipped scenario replays with its `expect` block (``max_step_time`` included), and two runs of a
scenario write the same metrics.json and trace.json bytes."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.config.scenario import Scenario, load_scenario, parse_scenario
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import run_job, train_locally
from runtime.services.job import Job
from sim import cli
from sim.determinism import Difference, first_difference, first_json_difference
from sim.network import Network
from sim.report import plots_available
from sim.simulate import SimResult, simulate
from sim.trace import TraceRecorder

from cluster_helpers import free_endpoints
from metrics_schema import assert_valid_metrics

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = [p for p in sorted((ROOT / "scenarios").glob("*.yaml"))
             if load_scenario(p).backend.kernels != "phantom"]
"""The numeric-mode scenarios; timing mode (phantom kernels) is tests/sim/test_timing_mode.py's."""
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def sim(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


# -- exact step times -----------------------------------------------------------------------------

L, B, C = 100e-6, 100e6, 1e-3  # latency (s), bandwidth (bytes/s), the trainer's compute per step
CLOSED_FORM = """
name: closed_form
seed: 1
model: {name: linear, optimizer: {type: sgd, learning_rate: 0.01}}
data: {batch_size: 8}
cluster: {pservers: 1, trainers: 1}
transpiler: {mode: sync}
train: {steps: 5, protocol: PROTOCOL}
network: {default: {latency: 100us, bandwidth: 100MB/s}, framing: none}
compute: {model: profile, ops: {mul: 1ms}}
"""


def sizes(result: SimResult, src: str, start: float, end: float) -> list[int]:
    """Bytes of the messages `src` sent in [start, end), in the order it sent them."""
    sent = [m for m in result.trace.messages if m.src == src and start <= m.sent < end]
    return [m.nbytes for m in sorted(sent, key=lambda m: m.sent)]


def test_one_trainer_one_pserver_step_time_is_the_closed_form() -> None:
    """Linear regression, protocol per_op has two params, w and b, both on the one pserver. A step:

    compute C (the one `mul`; nothing else costs), then four exchanges, each waiting for the one
    before: SEND b and SEND w (q1, q2 bytes, leaving together) answered by p1, p2; SEND_BARRIER
    (qb) answered by pb; GET b and GET w (g1, g2, together) answered by r1, r2; FETCH_BARRIER
    (qf) answered by pf. One request and its reply take 2L + (q + p)/B. For two requests sent
    together, the second leaves the trainer q1/B after the first; the pserver answers each as it
    arrives, and its NIC sends the second answer once both the second request is in and the
    first answer is out: the pair takes 2L + (q1 + max(q2, p1) + p2)/B. So

        step = C + [2L + (q1 + max(q2, p1) + p2)/B] + [2L + (qb + pb)/B]
                 + [2L + (g1 + max(g2, r1) + r2)/B] + [2L + (qf + pf)/B]
    """
    result = simulate(parse_scenario(CLOSED_FORM.replace("PROTOCOL", "per_op")))
    trainer = result.trainers[0]
    assert len(trainer.step_times) == 5
    for end, seconds in zip(trainer.step_ends, trainer.step_times):
        start = end - seconds
        q1, q2, qb, g1, g2, qf = sizes(result, "trainer:0", start, end)
        p1, p2, pb, r1, r2, pf = sizes(result, "pserver:0", start, end)
        expected = (C + 2 * L + (q1 + max(q2, p1) + p2) / B + 2 * L + (qb + pb) / B
                    + 2 * L + (g1 + max(g2, r1) + r2) / B + 2 * L + (qf + pf) / B)
        assert seconds == pytest.approx(expected, rel=1e-12, abs=0)


def test_the_compact_protocols_step_is_two_exchanges() -> None:
    """As above, with the barriers carried by SEND w and GET w: the step is C and the two
    pairs, [2L + (q1 + max(q2, p1) + p2)/B] + [2L + (g1 + max(g2, r1) + r2)/B]."""
    result = simulate(parse_scenario(CLOSED_FORM.replace("PROTOCOL", "compact")))
    trainer = result.trainers[0]
    for end, seconds in zip(trainer.step_ends, trainer.step_times):
        start = end - seconds
        q1, q2, g1, g2 = sizes(result, "trainer:0", start, end)
        p1, p2, r1, r2 = sizes(result, "pserver:0", start, end)
        expected = (C + 2 * L + (q1 + max(q2, p1) + p2) / B
                    + 2 * L + (g1 + max(g2, r1) + r2) / B)
        assert seconds == pytest.approx(expected, rel=1e-12, abs=0)


STRAGGLER = """
name: straggler
seed: 2
model: {name: mlp, sizes: [16, 32, 4], optimizer: {type: sgd, learning_rate: 0.1}}
data: {batch_size: 8}
cluster: {pservers: 2, trainers: 3}
transpiler: {mode: MODE}
train: {steps: 6}
network: {default: {latency: 100us}}
compute: {model: profile, ops: {mul: 1ms, mul_grad: 2ms}}
"""
C_TRAINER = 2 * 1e-3 + 2 * 2e-3  # two layers: a mul and a mul_grad each
K = 3.0
SLOW = f"compute.stragglers=[{{node: 'trainer:1', slowdown: {K}}}]"


def straggler_runs(mode: str, protocol: str = "per_op") -> tuple[SimResult, SimResult]:
    text = STRAGGLER.replace("MODE", mode).replace("steps: 6}",
                                                   f"steps: 6, protocol: {protocol}}}")
    return simulate(parse_scenario(text)), simulate(parse_scenario(text, overrides=[SLOW]))


def test_a_sync_straggler_delays_every_step_by_its_extra_compute() -> None:
    """Constant latency, unlimited bandwidth, protocol per_op: a step is C + 8L (four exchanges
    with both pservers at once; compact: C + 4L, the barriers carried). With trainer 1 k times slower, every trainer's step takes (k-1)*C
    longer; only the fast trainers' first step is 2L shorter than that, since they start it
    with trainer 1 and leave it after their own fetch barrier instead of after trainer 1's."""
    compact, _ = straggler_runs("sync", "compact")
    for b in compact.trainers:
        assert b.step_times == pytest.approx([C_TRAINER + 4 * L] * 6, rel=1e-12, abs=0)
    base, slow = straggler_runs("sync")
    delay = (K - 1) * C_TRAINER
    for b, s in zip(base.trainers, slow.trainers):
        assert b.step_times == pytest.approx([C_TRAINER + 8 * L] * 6, rel=1e-12, abs=0)
        first = delay if b.index == 1 else delay - 2 * L
        assert s.step_times == pytest.approx([t + d for t, d in
                                              zip(b.step_times, [first] + [delay] * 5)],
                                             rel=1e-12, abs=0)


def test_an_async_straggler_leaves_the_others_steps_unchanged() -> None:
    base, slow = straggler_runs("async")
    for b, s in zip(base.trainers, slow.trainers):
        assert b.step_times == pytest.approx([C_TRAINER + 4 * L] * 6, rel=1e-12, abs=0)
        if b.index == 1:
            assert s.step_times == pytest.approx([t + (K - 1) * C_TRAINER for t in b.step_times],
                                                 rel=1e-12, abs=0)
        else:
            assert s.step_times == b.step_times


# -- the same numbers as a real run ---------------------------------------------------------------

def test_simulated_sync_training_equals_the_real_runtime_and_local_training() -> None:
    scenario = load_scenario(QUICKSTART, ["train.steps=40"])
    simulated = simulate(scenario)
    job = Job.from_scenario(scenario, free_endpoints(scenario.cluster.pservers))
    real = asyncio.run(run_job(job, ZmqTransport))
    assert simulated.trainers[0].losses == real.trainers[0].losses
    assert simulated.params.keys() == real.params.keys()
    for name, value in real.params.items():
        assert np.array_equal(simulated.params[name], value), name
    _, local = train_locally(job)
    spec = scenario.expect
    for name, value in local.items():
        np.testing.assert_allclose(simulated.params[name], value, rtol=spec.params_rtol,
                                   atol=spec.params_atol, err_msg=name)


@pytest.mark.timeout(60)
def test_pservers_stop_once_every_trainer_said_bye_not_after_a_drain() -> None:
    """A pserver that waited for retries of lost acknowledgements would drain 3 x retry_after
    (180 s) after the last COMPLETE: simulated, that would be the job's end; over loopback
    ZeroMQ, past this test's timeout."""
    scenario = load_scenario(QUICKSTART, ["train.steps=5", "train.retry_after=60s"])
    simulated = simulate(scenario)
    last_step = max(t.step_ends[-1] for t in simulated.trainers)
    assert simulated.simulated_seconds - last_step < 0.01
    assert [s.messages_by_kind["bye"] for s in simulated.pservers] == [2, 2]
    job = Job.from_scenario(scenario, free_endpoints(scenario.cluster.pservers))
    real = asyncio.run(run_job(job, ZmqTransport))
    assert [s.messages_by_kind["bye"] for s in real.pservers] == [2, 2]


# -- every shipped scenario -----------------------------------------------------------------------

@dataclass
class Run:
    code: int
    output: str
    out: Path

    def metrics(self) -> dict:
        """The run's metrics.json, checked against the schema file."""
        return assert_valid_metrics(self.out / "metrics.json")


pytestmark = pytest.mark.xdist_group("sim_run")
"""The module on one worker (pyproject.toml's ``--dist loadgroup``): its module-scoped run
below runs once, not once on each worker."""


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, int], Run]:
    """`sim run` of a scenario, the first time with plots, the second without; each run once."""
    cache: dict[tuple[Path, int], Run] = {}

    def run(path: Path, number: int) -> Run:
        if (path, number) not in cache:
            out = tmp_path_factory.mktemp(f"{path.stem}-{number}")
            plots = () if number == 1 else ("--no-plots",)
            cache[path, number] = Run(*sim("run", str(path), "--out", str(out), *plots), out)
        return cache[path, number]

    return run


def stated(scenario: Scenario) -> set[str]:
    spec = scenario.expect
    names = {"final_loss_below": spec.final_loss_below, "loss_drop_factor": spec.loss_drop_factor,
             "params_equal_to": spec.params_equal_to, "no_lost_updates": spec.no_lost_updates,
             "max_step_time": spec.max_step_time}
    return {name for name, value in names.items() if value}


def test_the_straggler_scenarios_are_shipped() -> None:
    assert {"quickstart", "straggler_sync", "straggler_async"} <= {p.stem for p in SCENARIOS}
    compute = load_scenario(QUICKSTART).compute
    assert compute is not None and compute["stragglers"] == [{"node": "trainer:1",
                                                               "slowdown": 2.0}]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_meets_its_expectations_in_simulation(
        path: Path, sim_runs: Callable[[Path, int], Run]) -> None:
    scenario, run = load_scenario(path), sim_runs(path, 1)
    assert run.code == 0, run.output
    expectations = run.metrics()["expectations"]
    assert {e["name"] for e in expectations} == stated(scenario)
    assert all(e["passed"] for e in expectations), expectations
    assert run.output.endswith(f"OK: {scenario.name}\n")


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_two_runs_of_a_shipped_scenario_write_the_same_bytes(
        path: Path, sim_runs: Callable[[Path, int], Run]) -> None:
    first, second = sim_runs(path, 1), sim_runs(path, 2)
    for name in ("metrics.json", "trace.json"):
        assert (first.out / name).read_bytes() == (second.out / name).read_bytes(), name


def test_another_process_with_another_hash_seed_writes_the_same_bytes(
        tmp_path: Path, sim_runs: Callable[[Path, int], Run]) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-m", "sim.cli", "run", str(QUICKSTART), "--out",
                    str(tmp_path), "--no-plots"], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    first = sim_runs(QUICKSTART, 1)
    assert (first.out / "trace.json").read_bytes() == (tmp_path / "trace.json").read_bytes()
    ours, theirs = (json.loads((d / "metrics.json").read_text()) for d in (first.out, tmp_path))
    assert ours["job"].pop("run")["command_line"] != theirs["job"].pop("run")["command_line"]
    assert ours == theirs  # but for when, where and how each process ran


# -- what sim run writes and prints ---------------------------------------------------------------

def test_quickstart_metrics_hold_the_run(sim_runs: Callable[[Path, int], Run]) -> None:
    metrics = sim_runs(QUICKSTART, 1).metrics()
    assert set(metrics) == {"schema", "job", "trainers", "pservers", "links", "nics",
                            "expectations", "notes", "faults", "proxies", "netns"}
    assert metrics["proxies"] is metrics["netns"] is None  # runtime up's only
    s, trainers, pservers = metrics["job"], metrics["trainers"], metrics["pservers"]
    assert s["command"] == "sim run" and s["wall_seconds"] is None and s["failed_node"] is None
    assert (s["scenario"], s["mode"], s["pservers"], s["trainers"], s["steps"]) == \
        ("quickstart", "sync", 2, 2, 150)
    assert s["success"] and s["reason"] is None and s["compute"] == "roofline"
    assert s["samples"] == 150 * 32 * 2 and s["trained_samples"] == 149 * 32 * 2
    assert s["train_seconds"] == max(sum(t["step_times"][1:]) for t in trainers)  # start-up out
    assert s["samples_per_second"] == s["trained_samples"] / s["train_seconds"]
    assert s["startup_wait_seconds"] == max(t["step_times"][0] for t in trainers)
    assert s["step_time"]["mean"] == pytest.approx(np.mean(trainers[0]["step_times"][1:]),
                                                   rel=1e-12)
    assert s["step_time"]["max"] <= 2e-3  # expect.max_step_time
    assert s["final_loss"] == trainers[0]["losses"][-1] == trainers[0]["final_loss"]
    assert s["messages"] == sum(link["messages"] for link in metrics["links"])
    for t in trainers:
        assert len(t["losses"]) == len(t["step_times"]) == len(t["step_ends"]) == 150
        assert t["step_ends"] == sorted(t["step_ends"])
        assert t["step_ends"][-1] - (t["step_ends"][0] - t["step_times"][0]) \
            <= s["steps_span_seconds"] < s["simulated_seconds"]
        assert 0 < t["barrier_wait_seconds"] < sum(t["step_times"])
    # trainer 1 is the straggler: twice the compute, and trainer 0 waits for it at the barriers
    assert trainers[1]["compute_seconds"] == pytest.approx(2 * trainers[0]["compute_seconds"],
                                                           rel=1e-9)
    assert trainers[0]["barrier_wait_seconds"] > trainers[1]["barrier_wait_seconds"]
    for p in pservers:
        assert p["steps"] == 150 and p["errors"] == 0 and p["dropped"] == []
        assert p["busy_share"] == p["busy_seconds"] / s["steps_span_seconds"] > 0
        assert 0 < p["optimize_seconds"] and 0 < p["nic_in_share"] < 1
        received = sum(link["bytes"] for link in metrics["links"]
                       if link["dst"] == f"pserver:{p['index']}")
        assert p["bytes_in"] == received


def test_quickstart_trace_has_a_track_per_node_and_an_arrow_per_message(
        sim_runs: Callable[[Path, int], Run]) -> None:
    run = sim_runs(QUICKSTART, 1)
    events = json.loads((run.out / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == ["pserver:0", "pserver:1", "trainer:0", "trainer:1"]
    for pid, node in names.items():
        cats = {e["cat"] for e in events if e["ph"] == "X" and e["pid"] == pid}
        assert cats == ({"step", "compute", "rpc", "message"} if node.startswith("trainer")
                        else {"compute", "message"}), node
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == run.metrics()["job"]["messages"]
    assert all(ends[i]["ts"] >= starts[i]["ts"] for i in starts)
    steps = [e for e in events if e.get("cat") == "step" and names[e["pid"]] == "trainer:0"]
    assert len(steps) == 150


def test_quickstart_prints_progress_a_summary_and_draws_plots(
        sim_runs: Callable[[Path, int], Run]) -> None:
    run = sim_runs(QUICKSTART, 1)
    lines = run.output.splitlines()
    assert lines[0].startswith("sim run quickstart: 2 pserver(s) x 2 trainer(s), sync, 150 steps")
    progress = [line.split() for line in lines if line.startswith("trainer:0 ")]
    assert [words[2] for words in progress] == [f"{k}/150" for k in range(10, 151, 10)]
    for label in ("simulated time of the steps", "step time, trainer 0", "samples/s (simulated)",
                  "barrier wait", "busy share", "expect max_step_time: PASS"):
        assert label in run.output, label
    assert any(line.startswith("wall ") and "simulated messages/s" in line for line in lines)
    if plots_available():
        for name in ("loss.png", "step_times.png"):
            assert (run.out / name).read_bytes().startswith(b"\x89PNG"), name


def test_a_failed_expectation_exits_1_naming_it(tmp_path: Path) -> None:
    code, output = sim("run", str(QUICKSTART), "--set", "train.steps=5", "--set",
                       "expect.final_loss_below=null", "--set", "expect.max_step_time=100us",
                       "--out", str(tmp_path), "--no-plots")
    assert code == 1
    assert "expect max_step_time: FAIL: the longest step" in output
    assert output.splitlines()[-1].startswith("FAILED: expectation not met: max_step_time (")
    assert not assert_valid_metrics(tmp_path / "metrics.json")["job"]["success"]


def test_a_scenario_can_turn_the_trace_and_plots_off(tmp_path: Path) -> None:
    code, output = sim("run", str(QUICKSTART), "--set", "train.steps=3", "--set",
                       "outputs.trace=false", "--set", "outputs.plots=false", "--set",
                       "expect={}", "--out", str(tmp_path))
    assert code == 0, output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_run_past_its_deadline_exits_1_saying_why(tmp_path: Path) -> None:
    code, output = sim("run", str(QUICKSTART), "--set", "train.deadline=1ms", "--out",
                       str(tmp_path), "--no-plots")
    assert code == 1
    assert "FAILED: the simulation stopped: SimTimeLimit: virtual time limit" in output


def test_a_bad_compute_section_is_a_usage_error_naming_the_field(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        sim("run", str(QUICKSTART), "--set", "compute.device.flops=0")
    assert info.value.code == 2
    assert "compute.device.flops: must be finite and > 0, got 0" in capsys.readouterr().err


# -- sim sweep ------------------------------------------------------------------------------------

def test_sweep_runs_every_point_and_tabulates_the_outcomes(tmp_path: Path) -> None:
    code, output = sim("sweep", str(QUICKSTART), "--vary", "cluster.pservers=1,2", "--vary",
                       "cluster.trainers=2,3",
                       "--set", "train.steps=5", "--set", "expect.final_loss_below=null",
                       "--out", str(tmp_path))
    assert code == 0, output
    record = json.loads((tmp_path / "sweep.json").read_text())
    points = record["points"]
    assert [tuple(p["settings"].values()) for p in points] == \
        [("1", "2"), ("1", "3"), ("2", "2"), ("2", "3")]
    assert all(p["error"] is None for p in points)
    assert "cluster.pservers" in output and "samples/s" in output and "outcome" in output
    assert output.splitlines()[-1] == "OK: 4 point(s) simulated"
    if plots_available():
        assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_a_sweep_whose_points_miss_their_expectations_exits_1_saying_how_many(
        tmp_path: Path) -> None:
    """Three steps are too few for quickstart's final loss: every point runs and fails it."""
    code, output = sim("sweep", str(QUICKSTART), "--vary", "cluster.trainers=1,2",
                       "--set", "train.steps=3", "--out", str(tmp_path), "--no-plots")
    assert code == 1, output
    points = json.loads((tmp_path / "sweep.json").read_text())["points"]
    assert [p["error"] for p in points] == [None, None] and not any(p["passed"] for p in points)
    assert output.splitlines()[-1] == ("FAILED: 2 of 2 point(s) missed their expectations (the "
                                       "table says which)")


ALLREDUCE = ROOT / "scenarios" / "allreduce.yaml"


@pytest.mark.timeout(120)
def test_sweep_compares_pservers_with_all_reduce(tmp_path: Path) -> None:
    """The README's "pservers or all-reduce?" sweep, small: sync mode with 2 pservers and
    collective grad_allreduce with none, 2 trainers, 4 steps. Both rows run, train the local
    parameters (the scenario's `params_equal_to: local`) and so end at the same loss; only the
    sync row has pservers, each receiving at least its half of every trainer's gradients."""
    steps, trainers = 4, 2
    code, output = sim("sweep", str(ALLREDUCE), "--vary", "transpiler.mode=sync,collective",
                       "--set", f"train.steps={steps}", "--set", f"cluster.trainers={trainers}",
                       "--out", str(tmp_path), "--no-plots")
    assert code == 0, output
    sync, ring = json.loads((tmp_path / "sweep.json").read_text())["points"]
    assert (sync["settings"], ring["settings"]) == \
        ({"transpiler.mode": "sync"}, {"transpiler.mode": "collective"})
    for point in (sync, ring):
        assert point["error"] is None and point["passed"] and point["failed"] == [], point
        assert 0 < point["step_time_mean"] <= point["step_time_p99"]
        assert point["samples_per_second"] > 0 and np.isfinite(point["final_loss"])
    assert ring["final_loss"] == pytest.approx(sync["final_loss"], rel=1e-4)
    grad_bytes = 4 * (784 * 512 + 512 + 512 * 10 + 10)  # float32 gradients of the MLP
    assert sync["pserver_bytes_in"] >= steps * trainers * grad_bytes / 2
    assert ring["pserver_bytes_in"] is None
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[1:-1]]
            for line in output.splitlines() if line.startswith("│")}
    header = next(line for line in output.splitlines() if line.startswith("┃"))
    columns = [cell.strip() for cell in header.split("┃")[1:-1]]
    assert "MB/pserver" in columns and set(rows) == {"sync", "collective"}
    mb = columns.index("MB/pserver")
    assert float(rows["sync"][mb]) == pytest.approx(sync["pserver_bytes_in"] / 1e6, abs=0.01)
    assert rows["collective"][mb] == "-"


def test_a_bad_vary_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        sim("sweep", str(QUICKSTART), "--vary", "cluster.pservers")
    assert info.value.code == 2
    assert "--vary 'cluster.pservers': expected path=value,value..." in capsys.readouterr().err


# -- the trace format -----------------------------------------------------------------------------

def test_the_chrome_trace_of_a_span_and_a_message() -> None:
    trace = TraceRecorder()
    trace.span("trainer:0", "mul", 0.001, 0.0015, "compute")
    trace.message("trainer:0", "pserver:0", 120, 0.0015, 0.0016)
    events = trace.chrome_trace({"scenario": "t"})
    assert events["otherData"] == {"clock": "simulated", "scenario": "t"}
    by_phase = [e for e in events["traceEvents"] if e["ph"] != "M"]
    args = {"bytes": 120, "message": 1, "flight_us": 100.0}
    assert by_phase == [
        {"ph": "X", "pid": 2, "tid": 1, "name": "mul", "cat": "compute", "ts": 1000.0,
         "dur": 500.0},
        {"ph": "X", "pid": 2, "tid": 2, "name": "to pserver:0", "cat": "message", "ts": 1500.0,
         "dur": 0, "args": args},
        {"ph": "X", "pid": 1, "tid": 3, "name": "from trainer:0", "cat": "message",
         "ts": 1600.0, "dur": 0, "args": args},
        {"ph": "s", "pid": 2, "tid": 2, "name": "message", "cat": "message", "id": 1,
         "ts": 1500.0},
        {"ph": "f", "bp": "e", "pid": 1, "tid": 3, "name": "message", "cat": "message", "id": 1,
         "ts": 1600.0},
    ]
    threads = {(e["pid"], e["args"]["name"]) for e in events["traceEvents"]
               if e["name"] == "thread_name"}
    assert threads == {(2, "compute"), (2, "sent"), (1, "received")}


def test_a_run_without_a_trace_keeps_spans_but_no_record_per_message() -> None:
    scenario = load_scenario(QUICKSTART, ["train.steps=5"])
    traced, untraced = simulate(scenario), simulate(scenario, trace_messages=False)
    assert traced.trace.messages and not untraced.trace.messages
    assert untraced.trace.spans == traced.trace.spans
    assert untraced.messages == traced.messages  # the network still counts them


# -- sim run --check-determinism ------------------------------------------------------------------

def test_check_determinism_runs_twice_and_confirms_the_same_bytes(tmp_path: Path) -> None:
    code, output = sim("run", str(QUICKSTART), "--set", "train.steps=3", "--set", "expect={}",
                       "--out", str(tmp_path), "--no-plots", "--check-determinism")
    assert code == 0, output
    lines = output.splitlines()
    sizes = {name: (tmp_path / name).stat().st_size for name in ("metrics.json", "trace.json")}
    assert lines[-3:] == [
        "determinism: simulating quickstart again with seed 7",
        "determinism: OK, both runs wrote the same "
        f"metrics.json ({sizes['metrics.json']:,} bytes), trace.json ({sizes['trace.json']:,} bytes)",
        "OK: quickstart"]


def test_check_determinism_names_the_first_difference_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original, calls = Network.from_spec, itertools.count()

    def drifting(spec: Any, seed: int, *rest: Any) -> Network:  # the second run draws anew
        return original(spec, seed + next(calls), *rest)

    monkeypatch.setattr(Network, "from_spec", staticmethod(drifting))
    code, output = sim("run", str(QUICKSTART), "--set", "train.steps=3", "--set", "expect={}",
                       "--set", "train.protocol=per_op", "--out", str(tmp_path), "--no-plots",
                       "--check-determinism")
    assert code == 1, output
    assert next(calls) == 2
    assert output.splitlines()[-1] == (
        "FAILED: not deterministic: metrics.json differs first at byte 347 (line 18, column 29), "
        "key job.train_seconds: 0.0017257472922768725 in the first run, "
        "0.0017268509402643818 in the second")


def test_the_first_difference_is_located_by_byte_and_by_key() -> None:
    first = b'{\n  "a": 1,\n  "b": {"c": [1, 2, 3], "d": "x"}\n}'
    second = b'{\n  "a": 1,\n  "b": {"c": [1, 2, 4], "d": "y"}\n}'
    assert first_difference("m.json", first, first) is None
    difference = first_difference("m.json", first, second)
    assert difference == Difference("m.json", 32, 3, 21, "b.c[2]", "3", "4")
    assert str(difference) == ("m.json differs first at byte 32 (line 3, column 21), key b.c[2]: "
                               "3 in the first run, 4 in the second")
    assert first_json_difference({"a": [1]}, {"a": [1, 2]}) == ("a (length)", "1", "2")
    assert first_json_difference({"a": 1}, {"a": 1, "z": 0}) == ("z", "(absent)", "0")
    assert first_json_difference({"a": 1}, {"a": 1.0}) == ("a", "1", "1.0")
    assert first_difference("t.bin", b"abc", b"abd") == Difference(
        "t.bin", 2, 1, 3, None, "b'c'", "b'd'")


def test_a_run_without_trace_keeps_only_the_spans_its_report_reads() -> None:
    from sim.report import collect
    from sim.trace import BARRIER_OPS, REPORTED
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["train.steps=3"])
    full = simulate(scenario, base_dir=ROOT / "scenarios")
    lean = simulate(scenario, base_dir=ROOT / "scenarios", trace_messages=False,
                    trace_spans=False)
    assert lean.trace.only is REPORTED and not lean.trace.messages and lean.trace.spans
    kept = {node: [s for s in spans if s.category == "rpc" and s.name in BARRIER_OPS]
            for node, spans in full.trace.spans.items()}
    assert {node: spans for node, spans in lean.trace.spans.items()} == {
        node: spans for node, spans in kept.items() if spans}
    assert asdict(collect(lean)) == asdict(collect(full))
    assert collect(lean).trainers[0].barrier_wait_seconds > 0
