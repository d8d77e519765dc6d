"""Training scripts in the style of Paddle's distributed unit-test scripts
(tests/launch/paddle_scripts: `dist_harness` and the models ``dist_mlp.py``, ``dist_cnn.py``,
``dist_word2vec.py``, ``dist_text.py``: LoD sequences through a sequence_conv), each run once locally and once as 2 pservers + 2 trainers in separate
processes over 127.0.0.1: at every step the mean of the two trainers' losses (each trained on
half of the local run's batch) equals the local run's loss.

No keys: every endpoint is loopback, so the executor runs without CurveZMQ and warns (the rule
of `runtime.services.paddle_compat.key_directory`); the test clears ``PSLAB_KEYS`` and
``PSLAB_INSECURE`` so that this rule, and nothing inherited, decides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from runtime.launch.launcher import free_endpoints

from script_runs import run_together

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "paddle_scripts"
STEPS = 5
BATCH_SIZE = 8
TRAINERS = 2
WAIT = 40.0
"""Seconds a run's processes may take, all together."""

DELTA = {"dist_mlp.py": 1e-5, "dist_cnn.py": 1e-5, "dist_word2vec.py": 1e-4,
         "dist_text.py": 1e-5}
"""How close the job's step losses must be to the local run's, per script: Paddle's harness
allows 1e-5 for its mnist script and 1e-4 for word2vec."""


def start(script: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PSLAB_KEYS": "", "PSLAB_INSECURE": ""}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(script), "--steps", str(STEPS), "--batch_size", str(BATCH_SIZE),
             *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def run_all(script: Path, roles: dict[str, list[str]], tmp_path: Path) -> dict[str, str]:
    """Every role of `script` as a process (`run_together`); each one's output."""
    return run_together({name: partial(start, script, args) for name, args in roles.items()},
                        tmp_path, timeout=WAIT)


def losses(path: Path) -> list[float]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    return [float(r["loss"]) for r in records]


@pytest.mark.timeout(100)
@pytest.mark.parametrize("name", sorted(DELTA))
def test_two_pservers_by_two_trainers_train_as_the_local_run(name: str, tmp_path: Path) -> None:
    if name == "dist_cnn.py":
        pytest.importorskip("sklearn")  # the digits data set
    script = SCRIPTS / name
    run_all(script, {"local": ["--role", "local", "--out", str(tmp_path / "local.jsonl")]},
            tmp_path)
    endpoints = ",".join(free_endpoints("127.0.0.1", 2))
    job = ["--endpoints", endpoints, "--trainers", str(TRAINERS)]
    roles = {f"pserver-{j}": ["--role", "pserver", "--current_endpoint", ep, *job]
             for j, ep in enumerate(endpoints.split(","))}
    roles.update({f"trainer-{i}": ["--role", "trainer", "--trainer_id", str(i), *job,
                                   "--out", str(tmp_path / f"trainer-{i}.jsonl")]
                  for i in range(TRAINERS)})
    logs = run_all(script, roles, tmp_path)
    assert "no PSLAB_KEYS: no CurveZMQ" in logs["pserver-0"]

    local = losses(tmp_path / "local.jsonl")
    per_trainer = [losses(tmp_path / f"trainer-{i}.jsonl") for i in range(TRAINERS)]
    # each trainer trained on its own half of the batch, not on the whole of it
    assert np.abs(np.subtract(per_trainer[0], per_trainer[1])).max() > 100 * DELTA[name]
    job_losses = np.mean(per_trainer, axis=0)  # halves of equal size: the whole batch's mean
    np.testing.assert_allclose(job_losses, local, rtol=0, atol=DELTA[name])
    assert local[-1] < local[0]  # it trains
