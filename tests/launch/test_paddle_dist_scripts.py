"""Training scripts in the style of Paddle's distributed unit-test scripts
(tests/launch/paddle_scripts: `dist_harness` and the models ``dist_mlp.py``, ``dist_cnn.py``,
``dist_word2vec.py``, ``dist_text.py``: LoD sequences through a sequence_conv), each run once locally and once as 2 pservers + 2 trainers in separate
processes over 127.0.0.1: at every step the mean of the two trainers' losses (each trained on
half of the local run's batch) equals the local run's loss, and the parameters the pservers
hold at the end equal the local run's. ``dist_word2vec.py`` runs twice: with its distributed
lookup table, and with ``IS_DISTRIBUTED=0``, an ``is_sparse`` table that 1.8's default
prefetches remotely (docs/transpiler.md §9).

No keys: every endpoint is loopback, so the executor runs without CurveZMQ and warns (the rule
of `runtime.services.paddle_compat.key_directory`); the test clears ``PSLAB_KEYS`` and
``PSLAB_INSECURE`` so that this rule, and nothing inherited, decides."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import transpiler as T
from transpiler.ir import Program

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


CASES = [(name, {}) for name in sorted(DELTA)] + [("dist_word2vec.py", {"IS_DISTRIBUTED": "0"})]
"""Each script with the environment it runs in: its variants, as fluid's scripts take them."""


def start(script: Path, args: list[str], variant: dict[str, str],
          log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PSLAB_KEYS": "", "PSLAB_INSECURE": "",
           **variant}
    for inherited in ("PSLAB_PADDLE_VERSION", "PADDLE_ENABLE_REMOTE_PREFETCH"):
        env.pop(inherited, None)  # the release's defaults, whatever this process has
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(script), "--steps", str(STEPS), "--batch_size", str(BATCH_SIZE),
             *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def run_all(script: Path, roles: dict[str, list[str]], variant: dict[str, str],
            tmp_path: Path) -> dict[str, str]:
    """Every role of `script` as a process (`run_together`); each one's output."""
    return run_together({name: partial(start, script, args, variant)
                         for name, args in roles.items()}, tmp_path, timeout=WAIT)


def losses(path: Path) -> list[float]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    return [float(r["loss"]) for r in records]


def held(pserver_dirs: list[Path], name: str) -> np.ndarray:
    """Parameter `name` as the pservers saved it, its rows joined in order: the files of its
    name (one, or the distributed table's id range on each pserver, in endpoint order), else
    its blocks (``name.block<i>``)."""
    parts = [d / f"{name}.npy" for d in pserver_dirs if (d / f"{name}.npy").exists()]
    if not parts:
        blocks = {int(f.stem.rsplit(".block", 1)[1]): f for d in pserver_dirs
                  for f in d.glob(f"{name}.block*.npy")}
        parts = [blocks[i] for i in range(len(blocks))]
    assert parts, f"no pserver saved {name}"
    return np.concatenate([np.load(part) for part in parts])


@pytest.mark.parametrize("switch, prefetched", [(None, True), ("0", False)])
def test_the_sparse_word2vec_table_is_prefetched_by_the_releases_default(
        switch: str | None, prefetched: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``IS_DISTRIBUTED=0`` variant, built as its processes build it: by 1.8's default
    its trainer reads shared_w's rows from the pservers (one `distributed_lookup_table` for
    the 4 lookups) and never receives the table; ``PADDLE_ENABLE_REMOTE_PREFETCH=0`` keeps
    the table on the trainer, received and looked up there."""
    monkeypatch.setenv("IS_DISTRIBUTED", "0")
    monkeypatch.delenv("PSLAB_PADDLE_VERSION", raising=False)
    monkeypatch.delenv("PADDLE_ENABLE_REMOTE_PREFETCH", raising=False)
    if switch is not None:
        monkeypatch.setenv("PADDLE_ENABLE_REMOTE_PREFETCH", switch)
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location("dist_word2vec_sparse",
                                                  SCRIPTS / "dist_word2vec.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    main, startup = Program(), Program()
    with T.program_guard(main, startup), T.unique_name.guard():
        script.TestDistWord2vec().get_model()
    T.DistributeTranspiler().transpile(0, program=main, startup_program=startup,
                                       pservers="127.0.0.1:6174,127.0.0.1:6175", trainers=2)
    types = [op.type for op in main.global_block().ops]
    received = {n for op in main.global_block().ops if op.type == "recv" for n in op.output("Out")}
    assert (types.count("distributed_lookup_table"), types.count("lookup_table")) == \
        ((1, 0) if prefetched else (0, 4))
    assert ("shared_w" in received) is not prefetched


@pytest.mark.timeout(100)
@pytest.mark.parametrize("name, variant", CASES,
                         ids=[" ".join([n, *(f"{k}={v}" for k, v in e.items())]) for n, e in CASES])
def test_two_pservers_by_two_trainers_train_as_the_local_run(name: str, variant: dict[str, str],
                                                             tmp_path: Path) -> None:
    if name == "dist_cnn.py":
        pytest.importorskip("sklearn")  # the digits data set
    script = SCRIPTS / name
    run_all(script, {"local": ["--role", "local", "--out", str(tmp_path / "local.jsonl"),
                               "--params", str(tmp_path / "local")]}, variant, tmp_path)
    endpoints = ",".join(free_endpoints("127.0.0.1", 2))
    job = ["--endpoints", endpoints, "--trainers", str(TRAINERS)]
    roles = {f"pserver-{j}": ["--role", "pserver", "--current_endpoint", ep, *job,
                              "--params", str(tmp_path / f"pserver-{j}")]
             for j, ep in enumerate(endpoints.split(","))}
    roles.update({f"trainer-{i}": ["--role", "trainer", "--trainer_id", str(i), *job,
                                   "--out", str(tmp_path / f"trainer-{i}.jsonl")]
                  for i in range(TRAINERS)})
    logs = run_all(script, roles, variant, tmp_path)
    assert "no PSLAB_KEYS: no CurveZMQ" in logs["pserver-0"]

    local = losses(tmp_path / "local.jsonl")
    per_trainer = [losses(tmp_path / f"trainer-{i}.jsonl") for i in range(TRAINERS)]
    # each trainer trained on its own half of the batch, not on the whole of it
    assert np.abs(np.subtract(per_trainer[0], per_trainer[1])).max() > 100 * DELTA[name]
    job_losses = np.mean(per_trainer, axis=0)  # halves of equal size: the whole batch's mean
    np.testing.assert_allclose(job_losses, local, rtol=0, atol=DELTA[name])
    assert local[-1] < local[0]  # it trains
    pservers = [tmp_path / f"pserver-{j}" for j in range(len(endpoints.split(",")))]
    for path in sorted((tmp_path / "local").glob("*.npy")):
        np.testing.assert_allclose(held(pservers, path.stem), np.load(path), rtol=0,
                                   atol=DELTA[name], err_msg=path.stem)
