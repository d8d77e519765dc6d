"""Test-wide settings: hypothesis must not fail a test because the machine is busy (its
per-example deadline and its too-slow health check measure wall time); the contract modules'
asserts explain their failures as the tests' own do."""

import pytest
from hypothesis import HealthCheck, settings

pytest.register_assert_rewrite("fault_contract")

settings.register_profile("pslab", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pslab")
