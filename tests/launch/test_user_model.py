"""A model of one's own: `model.name: "module:function"` found beside the scenario file, with
no PYTHONPATH, in `sim run`, `runtime up` and every node; a builder that fails is one error
naming the scenario, the builder and the cause, before anything starts."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from runtime import cli as runtime_cli
from runtime.config.scenario import load_scenario
from runtime.execution.executor import AsyncOpError
from runtime.services.cluster import train_locally
from runtime.services.job import Job, JobError, check_job
from sim import cli as sim_cli

import example_runs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_model.yaml"


def test_the_example_trains_in_sim_run_from_another_folder(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    metrics = example_runs.sim_run(EXAMPLE, tmp_path)
    assert metrics.job.success and all(e.passed for e in metrics.expectations)
    assert [e.name for e in metrics.expectations] == ["loss_drop_factor", "params_equal_to",
                                                      "no_lost_updates"]


def test_the_example_trains_under_runtime_up_with_no_pythonpath_to_it(tmp_path: Path) -> None:
    """Each node is a process of its own whose PYTHONPATH holds the project, not examples/."""
    assert str(EXAMPLE.parent) not in os.environ.get("PYTHONPATH", "").split(os.pathsep)
    metrics = example_runs.runtime_up(EXAMPLE, tmp_path)
    assert metrics.job.success and metrics.job.steps == 12


def test_the_builder_gets_the_scenario_keys_and_returns_a_model() -> None:
    scenario = load_scenario(EXAMPLE, ["model.hidden=4"])
    model = Job.from_scenario(scenario).model
    assert model.name == "regressor" and model.feeds == ["x", "y"]
    block = model.main.global_block()
    assert block.var("mine.fc0.w").shape == (13, 4)
    assert [op.type for op in model.main.global_block().ops][-1] == "sgd"
    assert model.main.random_seed == scenario.seed


BAD = {
    "missing": ("def other(**kw):\n    pass\n", "has no function 'build'"),
    "raising": ("def build(**kw):\n    raise RuntimeError('no weights here')\n",
                "the builder raised RuntimeError: no weights here"),
    "broken": ("import no_such_package_here\n",
               "cannot import 'MOD': ModuleNotFoundError: No module named 'no_such_package_here'"),
    "wrong": ("def build(**kw):\n    return 42\n",
              "the builder returned int, not a transpiler.models.Model"),
    "unexpected": ("def build(optimizer, lr, seed):\n    pass\n",
                   "got an unexpected keyword argument 'hidden'"),
}


def _bad_scenario(tmp_path: Path, case: str, test: str = "") -> tuple[Path, str]:
    module = f"user_model_{case}{test}"
    source, cause = BAD[case]
    (tmp_path / f"{module}.py").write_text(source)
    path = tmp_path / "bad.yaml"
    path.write_text(EXAMPLE.read_text().replace("my_model:regressor", f"{module}:build"))
    return path, cause.replace("MOD", module)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_failing_builder_is_one_error_naming_scenario_builder_and_cause(
        tmp_path: Path, case: str) -> None:
    path, cause = _bad_scenario(tmp_path, case)
    with pytest.raises(JobError) as err:
        check_job(load_scenario(path))
    assert str(err.value).startswith(f"{path}: model 'user_model_{case}:build'")
    assert cause in str(err.value)


def test_a_module_of_the_same_name_from_elsewhere_is_a_clash_not_a_silent_swap(
        tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first, _ = _bad_scenario(tmp_path / "a", "wrong", "_twice")
    with pytest.raises(JobError):
        check_job(load_scenario(first))
    (tmp_path / "b").mkdir()
    second, _ = _bad_scenario(tmp_path / "b", "wrong", "_twice")
    with pytest.raises(JobError, match=r"cannot import 'user_model_wrong_twice': ImportError: "
                       r".*/b/user_model_wrong_twice.py is shadowed by .*/a/"):
        check_job(load_scenario(second))


def test_runtime_up_refuses_a_failing_builder_before_starting_a_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, cause = _bad_scenario(tmp_path, "raising", "_up")
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_:
        runtime_cli.main(["up", str(path), "--out", str(tmp_path / "up")], out=out)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == f"runtime up: error: {path}: model 'user_model_raising_up:build': {cause}"
    assert not (tmp_path / "up" / "logs").exists() and out.getvalue() == ""


def test_sim_run_refuses_a_failing_builder(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, cause = _bad_scenario(tmp_path, "wrong", "_sim")
    with pytest.raises(SystemExit):
        sim_cli.main(["run", str(path), "--out", str(tmp_path / "sim")], out=io.StringIO())
    assert capsys.readouterr().err.strip().endswith(cause)


def test_executor_refuses_rpc_programs_saying_what_runs_them() -> None:
    from runtime import Executor, Scope
    job = Job.from_scenario(load_scenario(EXAMPLE))
    trainer, _ = job.trainer_programs(0)
    with pytest.raises(AsyncOpError) as err:
        Executor().run(trainer, scope=Scope())
    message = str(err.value)
    for part in ("RPC ops need the async runtime", "runtime up SCENARIO", "sim run SCENARIO",
                 "runtime.services.cluster.run_job", "send"):
        assert part in message


def test_local_training_of_the_example_is_deterministic() -> None:
    job = Job.from_scenario(load_scenario(EXAMPLE, ["train.steps=5"]))
    losses, params = train_locally(job)
    again_losses, again = train_locally(Job.from_scenario(load_scenario(EXAMPLE, ["train.steps=5"])))
    assert losses == again_losses
    for name, value in params.items():
        np.testing.assert_array_equal(value, again[name])
