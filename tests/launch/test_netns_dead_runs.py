"""`runtime up --netns` after a launcher killed with SIGKILL: its namespaces stay behind, and
the next run's start-up (`netns.remove_dead_runs`) deletes them, whatever subnet the dead run
had, while the namespaces of a run whose launcher lives (it holds its subnet's lock) stay. Skipped
where namespaces cannot be made (not root, no iproute2, an unprivileged container)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from runtime.launch import netns


def why_not() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating them needs root"
    name = f"pslab-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                          timeout=10)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None if made.returncode == 0 else f"they cannot be made here: {made.stderr.strip()}"


@pytest.fixture
def made() -> Iterator[list[str]]:
    """The namespaces a test makes (append each name before making it), deleted afterwards."""
    names: list[str] = []
    reason = why_not()
    if reason is not None:
        pytest.skip(f"network namespaces: {reason}")
    try:
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def make(names: list[str], name: str) -> None:
    names.append(name)
    netns.run_command(["ip", "netns", "add", name])


def free_subnet(taken: int) -> int:
    """A subnet index other than `taken` whose lock no launcher holds (taken by none)."""
    for index in reversed(range(netns.SUBNETS)):
        fd = netns._lock_file(index)
        try:
            if index != taken and netns._try_lock(fd):
                return index
        finally:
            os.close(fd)
    raise AssertionError("every subnet is held")


@pytest.mark.timeout(60)
def test_the_namespaces_of_dead_runs_go_and_those_of_live_runs_stay(made: list[str]) -> None:
    live, lock = netns._claim()  # a launcher running on subnet `live`
    try:
        assert (netns.LOCK_DIR / f"{live}.lock").read_text() == f"{os.getpid()}\n"
        dead = free_subnet(live)  # and one SIGKILLed on subnet `dead`
        dead_names = [f"pslab-n{dead}-hub", f"pslab-n{dead}-ps0", f"pslab-n{dead}-t1"]
        live_names = [f"pslab-n{live}-hub", f"pslab-n{live}-t0"]
        for name in dead_names + live_names + ["pslab-probe-other"]:
            make(made, name)

        removed = netns.remove_dead_runs()
        assert set(dead_names) <= set(removed) and set(live_names).isdisjoint(removed)
        assert set(netns.namespaces()) >= {*live_names, "pslab-probe-other"}
        assert set(dead_names).isdisjoint(netns.namespaces())

        # the launcher's own subnet: what is there, an earlier run left
        assert set(live_names) <= set(netns.remove_dead_runs(own=live))
        assert set(live_names).isdisjoint(netns.namespaces())
    finally:
        os.close(lock)
