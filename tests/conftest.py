"""Test-wide settings: hypothesis must not fail a test because the machine is busy (its
per-example deadline and its too-slow health check measure wall time); the shared helpers'
asserts (tests/support: the contract suites among them) explain their failures as the tests'
own do; every test of a module that starts processes is marked ``slow`` (`slow_mark.spawns`),
so that ``pytest -m "not slow"`` is the quick inner loop.

The test modules import the helpers by their names (``import fault_contract``): pyproject.toml
puts tests/support on the path, and test modules never import one another."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

SUPPORT = Path(__file__).parent / "support"

pytest.register_assert_rewrite(*sorted(path.stem for path in SUPPORT.glob("*.py")))

from slow_mark import spawns  # noqa: E402  (after the registration: rewritten like the others)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if spawns(Path(str(item.fspath))):
            item.add_marker(pytest.mark.slow)


settings.register_profile("pslab", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pslab")
