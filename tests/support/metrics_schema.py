"""Checking a metrics.json against the JSON Schema file shipped in the package
(``runtime/config/metrics.schema.json``), with the `jsonschema` library (a [dev] dependency)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.config.metrics import SCHEMA_FILE


def validator() -> Any:
    """A validator of the schema file (imported here, so that a missing library fails the
    tests that validate, not the collection of every test in their modules)."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - the [dev] extra installs it
        raise AssertionError("jsonschema is missing: pip install -e '.[dev]'") from None
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def assert_valid_metrics(path: Path) -> dict[str, Any]:
    """The metrics.json at `path`, after checking it against the schema file; AssertionError
    naming the first places where it does not conform."""
    metrics = json.loads(path.read_text())
    errors = sorted(validator().iter_errors(metrics), key=lambda e: list(e.absolute_path))
    assert not errors, f"{path} does not conform to {SCHEMA_FILE.name}: " + "; ".join(
        f"at {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors[:5])
    return metrics
