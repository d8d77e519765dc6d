"""Running a Paddle-style script's roles as processes over loopback, each with its own log,
all waited for together: a ported script's pservers and trainers, and its local run."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

Start = Callable[[Path], "subprocess.Popen[bytes]"]
"""Starts one role's process with its output going to the log at the given path."""


def run_together(starts: Mapping[str, Start], logs: Path, timeout: float) -> dict[str, str]:
    """Start a process per role (its output in ``logs/<name>.log``), wait for all of them
    (killing every one still running if the wait fails or times out) and return each one's
    output; every process must exit 0."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, start in starts.items():
            procs[name] = start(logs / f"{name}.log")
        codes = {name: proc.wait(timeout=timeout) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = {name: (logs / f"{name}.log").read_text() for name in procs}
    assert codes == dict.fromkeys(procs, 0), output
    return output
