"""The fault schedule and the fault registry: the contract (tests/support/fault_contract.py) on the
reference target, and the docs (docs/faults.md, the README's table) generated from the fault
classes, so that each fault is described once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.config.faults import FAULT_TYPES, readme_table, reference

from fault_contract import FaultTargetContract, Harness, ModelHarness

ROOT = Path(__file__).resolve().parents[2]


class TestModelTarget(FaultTargetContract):
    @pytest.fixture
    def harness(self) -> Callable[[], Harness]:
        return ModelHarness


def test_docs_faults_md_is_generated_from_the_fault_classes() -> None:
    assert (ROOT / "docs" / "faults.md").read_text() == reference(), \
        "run: python -m runtime.config.faults"


def test_the_readme_fault_table_is_generated_from_the_fault_classes() -> None:
    assert readme_table() in (ROOT / "README.md").read_text(), "run: python -m runtime.config.faults"


@pytest.mark.parametrize("kind", FAULT_TYPES, ids=[t.kind for t in FAULT_TYPES])
def test_each_fault_class_describes_itself_for_both_sides(kind: type) -> None:
    assert kind.__doc__ and kind.example and kind.in_simulator and kind.in_runtime_up
    assert all(info.description for info in kind.model_fields.values())
