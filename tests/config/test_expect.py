"""`params_equal_to`'s verdicts: a failure that is float32 drift says so and names the knob; one
that is not (a parameter moved by a whole update) does not."""

from __future__ import annotations

import numpy as np

from runtime.config.expect import params_equal

REFERENCE = {"w": np.array([[0.5, -0.25], [0.125, 1.0]], np.float32),
             "b": np.array([0.1, -0.2], np.float32)}


def _off_by(delta: float) -> dict[str, np.ndarray]:
    return {"w": REFERENCE["w"] + np.float32(delta), "b": REFERENCE["b"].copy()}


def test_a_small_difference_over_the_tolerance_is_named_as_drift() -> None:
    result = params_equal(_off_by(1e-3), REFERENCE, atol=2e-4)
    assert not result.passed
    assert "w (max |diff| 0.001)" in result.detail
    assert "under 0.001 of its parameter's largest value" in result.detail
    assert "raise it" in result.detail and "expect.params_atol" in result.detail


def test_a_difference_of_a_whole_update_is_not_called_drift() -> None:
    result = params_equal(_off_by(0.05), REFERENCE, atol=2e-4)
    assert not result.passed
    assert "params_atol" not in result.detail


def test_against_the_fault_free_run_no_drift_is_allowed_for() -> None:
    result = params_equal(_off_by(1e-3), REFERENCE, rtol=0, atol=0, against="fault-free")
    assert not result.passed and "bit for bit" in result.detail
    assert "params_atol" not in result.detail


def test_a_pass_says_how_close() -> None:
    result = params_equal(_off_by(1e-6), REFERENCE, atol=2e-4)
    assert result.passed and "largest |diff|" in result.detail
