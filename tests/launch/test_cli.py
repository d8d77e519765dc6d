"""The `runtime` and `sim` commands: output, falling loss, and errors that name the argument."""

from __future__ import annotations

import io
import re

import pytest

from runtime import cli
from sim import cli as sim_cli


def run(argv: list[str]) -> list[str]:
    out = io.StringIO()
    assert cli.main(argv, out=out) == 0
    return out.getvalue().splitlines()


def test_train_prints_falling_loss_and_a_summary() -> None:
    lines = run(["train", "--model", "mlp", "--steps", "60", "--log-every", "10", "--seed", "1"])
    assert lines[0].startswith("training mlp on synthetic_classification (2048 examples)")
    steps = [re.fullmatch(r"step +(\d+) +loss (\S+) +samples/s (\d+)", line) for line in lines[1:-1]]
    assert all(steps), lines
    assert [int(m.group(1)) for m in steps if m] == [10, 20, 30, 40, 50, 60]
    losses = [float(m.group(2)) for m in steps if m]
    assert losses[-1] < losses[0] / 5
    assert all(b < a for a, b in zip(losses, losses[1:3]))
    assert re.fullmatch(r"done: 60 steps in \S+s, \d+ samples/s, loss (\S+) -> (\S+)", lines[-1])
    assert lines[-1].endswith(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def test_train_logs_the_last_step_even_off_the_interval() -> None:
    lines = run(["train", "--model", "linear", "--steps", "7", "--log-every", "5",
                 "--optimizer", "momentum", "--lr", "0.01", "--batch-size", "8"])
    assert [line.split()[1] for line in lines[1:-1]] == ["5", "7"]


@pytest.mark.parametrize("argv,culprit", [
    (["train", "--model", "resnet"], "argument --model: invalid choice: 'resnet'"),
    (["train", "--model", "mlp", "--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    (["train", "--model", "mlp", "--lr", "fast"], "argument --lr: must be a positive number, got 'fast'"),
    (["train", "--model", "mlp", "--data", "mnist"], "argument --data: invalid choice: 'mnist'"),
    (["train", "--model", "linear", "--data", "ctr"], "argument --data: dataset 'ctr' has no field 'x'"),
    (["train", "--model", "mlp", "--optimizer", "lbfgs"], "argument --optimizer: invalid choice"),
    (["train"], "the following arguments are required: --model"),
    ([], "the following arguments are required: COMMAND"),
])
def test_bad_arguments_name_the_argument(argv: list[str], culprit: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert culprit in capsys.readouterr().err


def test_sim_names_a_scenario_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        sim_cli.main(["run", "scenarios/nowhere.yaml"])
    assert exit_info.value.code == 2
    assert "scenarios/nowhere.yaml: cannot read scenario" in capsys.readouterr().err
