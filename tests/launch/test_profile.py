"""`runtime profile`: kernel timing in the executor, the per-op-type fits, and a profile of a real
run that the simulator's `compute: {model: profile}` reads and charges exactly."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from runtime import Executor, Scope, cli
from runtime.config.scenario import load_scenario
from runtime.execution.executor import timing_kernels
from runtime.execution.kernels import get_kernel
from runtime.launch.profile import (KernelTimes, OpFit, OpSamples, calibrate_loop, fit_op,
                                    format_table)
from sim.cost import load_profile
from sim.simulate import simulate
from transpiler.ir import Op

from program_helpers import double_program

QUICKSTART = "scenarios/quickstart.yaml"
STEPS = 3
FAST_DRAIN = "train.retry_after=0.05"  # a pserver drains 3 x retry_after after the last trainer


# -- timing kernels in the executor --------------------------------------------------------------
class Calls:
    def __init__(self) -> None:
        self.seen: list[tuple[str, list[float], float]] = []

    def record(self, op: Op, scope: Scope, seconds: float) -> None:
        self.seen.append((op.type, scope.get(op.output("Out")[0]).ravel().tolist(), seconds))


def test_an_executor_with_a_timer_reports_each_kernel_call_after_it_ran() -> None:
    calls = Calls()
    exe = Executor(timer=calls)
    for rows in (1, 2):
        exe.run(double_program(), feed={"x": np.ones((rows, 3), np.float32)}, scope=Scope())
    assert [(t, out) for t, out, _ in calls.seen] == [("scale", [2.0] * 3), ("scale", [2.0] * 6)]
    assert all(0 < s < 1 for _, _, s in calls.seen)


def test_executors_made_inside_timing_kernels_report_and_others_do_not() -> None:
    times = KernelTimes()
    with timing_kernels(times):
        inside = Executor()
    outside = Executor()
    for exe in (inside, outside):
        exe.run(double_program(), feed={"x": np.ones((4, 3), np.float32)}, scope=Scope())
    assert times.calls == 1 and times.samples["scale"].elements == [12]
    plain = outside.plans.get(double_program(), 0).steps[0].kernel
    assert plain is get_kernel("scale")  # unwrapped: no cost when not profiling


# -- fitting -------------------------------------------------------------------------------------
def test_one_output_size_is_fitted_per_call() -> None:
    fit = fit_op("relu", OpSamples([10, 10, 10], [1e-6, 2e-6, 3e-6]))
    assert (fit.kind, fit.calls, fit.elements) == ("per_call", 3, 30)
    assert fit.value == pytest.approx(2e-6) and fit.entry() == fit.value


def test_time_growing_with_size_is_fitted_per_element_keeping_the_total() -> None:
    fit = fit_op("sgd", OpSamples([100, 200, 400, 800], [1.1e-6, 2e-6, 4.1e-6, 7.9e-6]))
    assert fit.kind == "per_element"
    assert fit.value == pytest.approx(15.1e-6 / 1500)
    assert fit.entry() == {"per_element": fit.value}
    assert fit.value * fit.elements == pytest.approx(fit.seconds)


@pytest.mark.parametrize("elements,seconds", [
    ([1, 1000], [5e-6, 5e-6]),          # flat: the per-call fit is exact
    ([0, 0], [1e-6, 3e-6]),             # nothing counted: per element cannot apply
    ([10, 20, 30], [3e-6, 1e-6, 2e-6]),  # no trend: no clear gain
])
def test_no_clear_gain_stays_per_call(elements: list[int], seconds: list[float]) -> None:
    fit = fit_op("mul", OpSamples(elements, seconds))
    assert fit.kind == "per_call" and fit.value == pytest.approx(sum(seconds) / len(seconds))


def test_the_table_lists_the_top_op_types_and_sums_the_rest() -> None:
    fits = [OpFit("mul", 4, 4e-3, 40, "per_call", 1e-3),
            OpFit("sgd", 2, 2e-3, 2000, "per_element", 1e-6),
            OpFit("relu", 1, 1e-3, 10, "per_call", 1e-3)]
    lines = format_table(fits, top=2)
    assert lines[1].split() == ["mul", "4", "4.000", "57.1%", "1000.000us/call"]
    assert lines[2].split() == ["sgd", "2", "2.000", "28.6%", "1000.0000ns/element"]
    assert lines[3].split() == ["(1", "more)", "1", "1.000"]


# -- a real run, then the simulator --------------------------------------------------------------
pytestmark = pytest.mark.xdist_group("profile")
"""The module on one worker (pyproject.toml's ``--dist loadgroup``): its module-scoped run
below runs once, not once on each worker."""


@pytest.fixture(scope="module")
def quickstart_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("profile") / "quickstart.json"
    out = io.StringIO()
    argv = ["profile", QUICKSTART, "--steps", str(STEPS), "--set", FAST_DRAIN, "-o", str(path)]
    assert cli.main(argv, out=out) == 0
    return path, out.getvalue().splitlines()


def test_profile_prints_progress_and_a_table(quickstart_profile: tuple[Path, list[str]]) -> None:
    path, lines = quickstart_profile
    assert lines[0] == ("profiling quickstart: 2 pserver(s) x 2 trainer(s), 3 steps, "
                        "numpy kernels on cpu, every node measuring")
    assert any(line.startswith("runtime up quickstart") for line in lines)  # a real run
    assert "OK: quickstart" in lines
    header = lines.index(next(line for line in lines if line.startswith("op type")))
    costs = lines.index(next(line for line in lines if line.startswith("runtime cost")))
    assert len(lines[header + 1:costs]) == 11  # the top 10 and the rest
    assert any(line.startswith("send send ") for line in lines[costs:])
    assert any(line.startswith("receive reply ") for line in lines[costs:])
    assert lines[-2].startswith("median step time of the measured run: ")
    assert lines[-1] == f"wrote {path}"


def test_the_profile_covers_both_roles_and_loads(
        quickstart_profile: tuple[Path, list[str]]) -> None:
    path, _ = quickstart_profile
    document = json.loads(path.read_text())
    profile = load_profile(path)
    trainer_ops = {"mul", "mul_grad", "relu", "softmax_with_cross_entropy", "mean", "mean_grad"}
    assert trainer_ops | {"sum", "scale", "sgd"} <= set(profile.ops)  # pservers: fan-in and update
    assert all(t.per_call + t.per_element > 0 for t in profile.ops.values())
    meta = document["meta"]
    assert (meta["scenario"], meta["steps"], meta["backend"]) == (
        "quickstart", STEPS, {"kernels": "numpy", "device": "cpu", "pserver_device": "cpu"})
    assert meta["ops"]["mean"]["calls"] == STEPS * 2  # one a step on each of 2 trainers
    assert set(meta["ops"]) == set(document["ops"])


def test_the_simulator_charges_what_the_profile_says(quickstart_profile: tuple[Path, list[str]],
                                                     tmp_path: Path) -> None:
    path, _ = quickstart_profile
    result = simulate(load_scenario(QUICKSTART, [f"train.steps={STEPS}",
                                                 f"compute={{model: profile, path: {path}}}"]))
    assert set(result.compute) == {"trainer:0", "trainer:1", "pserver:0", "pserver:1"}
    assert all(seconds > 0 for seconds in result.compute.values())
    # only `mean` priced: one call a training step on each trainer, nothing on the pservers
    mean = load_profile(path).ops["mean"]
    assert mean.per_element == 0  # one output element a call: per call
    only_mean = tmp_path / "mean.json"
    only_mean.write_text(json.dumps({"ops": {"mean": mean.per_call}}))
    result = simulate(load_scenario(QUICKSTART, [f"train.steps={STEPS}",
                                                 f"compute={{model: profile, path: {only_mean}}}"]))
    assert result.compute["trainer:0"] == pytest.approx(STEPS * mean.per_call, rel=1e-12)
    assert result.compute["pserver:0"] == 0


def test_a_timing_mode_scenario_cannot_be_profiled(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["profile", "scenarios/scale.yaml", "-o", str(tmp_path / "p.json")])
    assert exit_info.value.code == 2
    assert "scenarios/scale.yaml: cannot profile backend.kernels phantom" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_the_profile_measures_the_runtimes_own_costs_and_the_machine(
        quickstart_profile: tuple[Path, list[str]]) -> None:
    path, _ = quickstart_profile
    document = json.loads(path.read_text())
    runtime = document["runtime"]
    requests = {"send", "get", "complete"}  # protocol compact: the barriers ride on these
    assert requests <= set(runtime["messages"]["send"]) and "reply" in runtime["messages"]["send"]
    assert requests <= set(runtime["messages"]["receive"])
    assert all(cost["per_message"] > 0 for side in runtime["messages"].values()
               for cost in side.values())
    assert runtime["op_overhead"] > 0 and runtime["step_overhead"] > 0
    assert runtime["machine"]["cores"] >= 1
    measured = document["meta"]["measured"]
    assert measured["step_time_median"] > 0
    assert set(measured["nodes"]) == {"trainer:0", "trainer:1", "pserver:0", "pserver:1"}
    # what measuring cost, and the calibrations the fit took it out and split the residual by
    assert all(node["measuring_seconds"] > 0 for node in measured["nodes"].values())
    calibration = measured["calibration"]
    assert 0 < calibration["span"]["inner"] <= calibration["span"]["span"]
    assert calibration["loop_per_message"] > 0 and calibration["io_per_message"] > 0
    # the run was encrypted (runtime up's default): CURVE priced at this machine's figures
    assert calibration["curve"]["handshake"] > 0 and calibration["curve"]["per_byte"] >= 0
    assert runtime["curve"] == calibration["curve"]
    assert runtime["step_residual"] >= 0 and runtime["round_residual"] >= 0


def test_waking_for_a_message_costs_the_loop_some_microseconds() -> None:
    assert 0 < calibrate_loop(messages=100, batches=1) < 1e-3


def test_a_simulation_with_the_profile_charges_the_runtime_and_shares_the_hosts_cores(
        quickstart_profile: tuple[Path, list[str]]) -> None:
    path, _ = quickstart_profile
    compute = f"compute={{model: profile, path: {path}}}"

    def median_step(*sets: str) -> float:
        result = simulate(load_scenario(QUICKSTART, [f"train.steps={STEPS}", compute, *sets]))
        return float(np.median([t for r in result.trainers for t in r.step_times]))

    kernels_only = median_step(f"compute={{model: profile, path: {path}, runtime: false}}")
    apart = median_step()
    one_core = median_step("cluster.hosts=[{nodes: '*', cores: 1}]")
    assert kernels_only < apart < one_core


def test_a_simulation_charging_the_runtime_on_shared_cores_is_deterministic(
        quickstart_profile: tuple[Path, list[str]]) -> None:
    path, _ = quickstart_profile
    sets = [f"train.steps={STEPS}", f"compute={{model: profile, path: {path}}}",
            "cluster.hosts=[{nodes: ['pserver:*', 'trainer:0'], cores: 1.5}]"]
    first, second = (simulate(load_scenario(QUICKSTART, sets)) for _ in range(2))
    assert [r.step_times for r in first.trainers] == [r.step_times for r in second.trainers]
    assert first.trace.chrome_trace() == second.trace.chrome_trace()
    for name, value in first.params.items():
        np.testing.assert_array_equal(value, second.params[name])


def test_with_several_runs_the_profile_is_the_median_runs(tmp_path: Path) -> None:
    path, out = tmp_path / "p.json", io.StringIO()
    argv = ["profile", QUICKSTART, "--steps", "2", "--set", FAST_DRAIN, "--set",
            "cluster.trainers=1", "--set", "cluster.pservers=1", "--runs", "3", "-o", str(path),
            "--out", str(tmp_path / "runs")]
    assert cli.main(argv, out=out) == 0
    lines = out.getvalue().splitlines()
    assert [line for line in lines if line.startswith("measured run ")] == \
        ["measured run 1 of 3", "measured run 2 of 3", "measured run 3 of 3"]
    totals = json.loads(path.read_text())["meta"]["runs_cpu_seconds"]
    assert len(totals) == 3 and all((tmp_path / "runs" / f"run-{i}" / "metrics.json").exists()
                                    for i in range(3))
    measured = json.loads(path.read_text())["meta"]["measured"]["nodes"]
    assert sum(n["cpu_seconds"] for n in measured.values()) == pytest.approx(sorted(totals)[1])
