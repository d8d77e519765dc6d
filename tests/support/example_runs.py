"""Running a shipped example scenario the way a user would: `sim run` from another folder, and
`runtime up` as processes whose PYTHONPATH holds the project only."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from runtime.config.metrics import JobMetrics, read_metrics
from sim import cli as sim_cli

ROOT = Path(__file__).resolve().parents[2]


def sim_run(example: Path, tmp_path: Path) -> JobMetrics:
    """`sim run EXAMPLE` with the working directory `tmp_path` (call under monkeypatch.chdir)."""
    out = io.StringIO()
    code = sim_cli.main(["run", str(example), "--out", str(tmp_path / "sim"), "--no-plots",
                         "--no-trace"], out=out)
    assert code == 0, out.getvalue()
    return read_metrics(tmp_path / "sim" / "metrics.json")


def runtime_up(example: Path, tmp_path: Path, steps: int = 12) -> JobMetrics:
    """`runtime up EXAMPLE` for `steps` steps with no loss expectation, from `tmp_path`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "runtime.cli", "up", str(example), "--out",
                          str(tmp_path / "up"), "--set", f"train.steps={steps}", "--set",
                          "expect.loss_drop_factor=null"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=110)
    assert run.returncode == 0, run.stdout + run.stderr
    return read_metrics(tmp_path / "up" / "metrics.json")
