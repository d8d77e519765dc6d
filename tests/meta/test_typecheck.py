"""The packages and the benchmarks type-check: mypy over transpiler, runtime, sim and
benchmarks finds nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_mypy_is_clean() -> None:
    pytest.importorskip("mypy")
    done = subprocess.run([sys.executable, "-m", "mypy", "transpiler", "runtime", "sim",
                           "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=590)
    assert done.returncode == 0, done.stdout + done.stderr
