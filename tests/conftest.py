"""Test-wide settings: hypothesis must not fail a test because the machine is busy (its
per-example deadline and its too-slow health check measure wall time)."""

from hypothesis import HealthCheck, settings

settings.register_profile("pslab", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pslab")
