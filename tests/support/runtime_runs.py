"""`runtime up` and `runtime collect` as tests drive them: a scenario file of a small sync job,
the command in this process or a job's nodes as processes of their own, and what is left of
them in /proc."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from runtime import cli
from runtime.network.curve import write_keys
from runtime.services.lifeline import LAUNCHER_VAR

from cluster_helpers import free_endpoints


SGD = "{type: sgd, learning_rate: 0.1}"


SCENARIO = """\
name: up-test
seed: 3
model: {{name: mlp, sizes: [64, 32, 10], optimizer: {optimizer}{lr}}}
data: {{batch_size: 16}}
cluster: {cluster}
transpiler: {{mode: sync}}
train: {{steps: {steps}, deadline: 60s, heartbeat_timeout: 10s, retry_after: 100ms, log_every: 5}}
expect: {expect}
"""
"""`retry_after: 100ms`: the pservers drain 0.3 s after the last trainer, not 3 s (see
`cluster_helpers.make_job`)."""


def scenario_file(tmp_path: Path, optimizer: str = SGD, lr: str = "", steps: int = 20,
                  cluster: str = "{pservers: 2, trainers: 2}",
                  expect: str = "{params_equal_to: local, no_lost_updates: true}") -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO.format(optimizer=optimizer, lr=lr, steps=steps, cluster=cluster,
                                    expect=expect))
    return path


def up(*argv: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = cli.main(["up", *argv], out=out)
    return code, out.getvalue().splitlines()


def load_params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def children_of(pid: int) -> list[int]:
    """Pids whose parent is `pid`, from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            after_name = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(after_name[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """`pid` runs (a zombie, dead but not yet reaped by whoever adopted it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


NODES = [("pserver", 0), ("pserver", 1), ("trainer", 0), ("trainer", 1)]


def collect(*argv: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = cli.main(["collect", *argv], out=out)
    return code, out.getvalue().splitlines()


def run_roles(scenario: Path, tmp: Path, timeout: float) -> tuple[list[Path], list[str]]:
    """Each node of `NODES` in a `runtime up --role` process of its own, on loopback, with a
    keypair per node as `runtime keys` writes them, as four hosts would run the job: their out
    dirs under `tmp`, and what each printed (stdout and stderr), once all exited 0."""
    endpoints = ",".join(free_endpoints(2))
    env = {k: v for k, v in os.environ.items() if k != LAUNCHER_VAR}
    dirs = [tmp / f"host-{role}-{index}" for role, index in NODES]
    keys = tmp / "keys"
    write_keys(keys, [f"{role}-{index}" for role, index in NODES])
    procs = [subprocess.Popen([sys.executable, "-m", "runtime.cli", "up", str(scenario), "--role",
                               role, "--index", str(index), "--endpoints", endpoints, "--out",
                               str(d), "--keys", str(keys)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for (role, index), d in zip(NODES, dirs)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 4, outputs
    return dirs, outputs
