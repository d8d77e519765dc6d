"""``runtime --version`` and ``sim --version`` say which pslab runs: the installed one's."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from runtime.config.version import version

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_the_installed_distributions() -> None:
    assert version() == metadata.version("pslab")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["runtime", "sim"])
def test_each_command_prints_it_and_exits_0(command: str) -> None:
    done = subprocess.run([sys.executable, "-m", f"{command}.cli", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{command} (pslab) {metadata.version('pslab')}\n"
