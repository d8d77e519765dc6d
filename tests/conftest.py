"""Test-wide settings: hypothesis must not fail a test because the machine is busy (its
per-example deadline and its too-slow health check measure wall time); the contract modules'
asserts explain their failures as the tests' own do; every test of a module that starts
processes is marked ``slow``, so that ``pytest -m "not slow"`` is the quick inner loop.

DESIGN: the mark is derived from the module's source (`SPAWNS`), not written on each test, so a
new test that starts processes cannot be left out of it."""

import re
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

SPAWNS = re.compile(r"\b(subprocess|Popen|multiprocessing|ray\.init|os\.fork|netns)\b"
                    r"|sys\.executable|\blaunch\(|runtime\.cli|runtime\.launch\.(launcher|profile|calibrate|role)")
"""What in a test module's source starts processes (a node, the launcher, a sweep's workers)."""


@cache
def spawns(path: Path) -> bool:
    """Whether the test module at `path` starts processes (`SPAWNS`)."""
    return SPAWNS.search(path.read_text()) is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if spawns(Path(str(item.fspath))):
            item.add_marker(pytest.mark.slow)


pytest.register_assert_rewrite("fault_contract")

settings.register_profile("pslab", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pslab")
