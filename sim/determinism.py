"""Whether two runs of a scenario wrote the same bytes, and where they first part if not.

`sim run --check-determinism` simulates the scenario a second time with the same seed and hands
both runs' files to `first_difference`. The same scenario and seed must give the same bytes
(`sim.loop`'s ordering, seeded draws, no wall clock in the files); where they do not, the first
difference is located twice over: by byte (offset, line and column), which always exists, and
by JSON key path (`trainers[1].losses[17]`), which says which figure moved.

DESIGN: the key path is found by walking both parsed documents in their own key order, so it is
the first differing key in file order, the one the byte offset falls in or before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Difference", "first_difference", "first_json_difference"]

_SHOWN = 60
"""Characters of each side shown around a differing value."""


@dataclass(frozen=True)
class Difference:
    """Where two versions of one file first differ."""

    name: str
    offset: int
    line: int
    column: int
    key: str | None
    """The first differing JSON key path, or None where either side is not JSON."""
    first: str
    second: str
    """What each side holds there (the values at `key`, else the bytes from `offset`)."""

    def __str__(self) -> str:
        where = f"{self.name} differs first at byte {self.offset} (line {self.line}, " \
                f"column {self.column})"
        if self.key is not None:
            where += f", key {self.key or '(the document)'}"
        return f"{where}: {self.first} in the first run, {self.second} in the second"


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def first_difference(name: str, first: bytes, second: bytes) -> Difference | None:
    """The first difference between two versions of the file `name`; None if they are equal."""
    if first == second:
        return None
    offset = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                  min(len(first), len(second)))
    head = first[:offset]
    line = head.count(b"\n") + 1
    column = offset - (head.rfind(b"\n") + 1) + 1
    found = _json_difference(first, second)
    if found is not None:
        key, a, b = found
        return Difference(name, offset, line, column, key, a, b)
    return Difference(name, offset, line, column, None,
                      _clip(repr(first[offset:offset + _SHOWN])),
                      _clip(repr(second[offset:offset + _SHOWN])))


def _json_difference(first: bytes, second: bytes) -> tuple[str, str, str] | None:
    try:
        a, b = json.loads(first), json.loads(second)
    except ValueError:
        return None
    return first_json_difference(a, b)


def first_json_difference(a: Any, b: Any, path: str = "") -> tuple[str, str, str] | None:
    """(key path, value in `a`, value in `b`) of the first place two JSON documents differ, in
    `a`'s order; None if they are equal. A key only one side has differs as `(absent)`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            inner = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                return inner, _shown(a, key), _shown(b, key)
            found = first_json_difference(a[key], b[key], inner)
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for index, (x, y) in enumerate(zip(a, b)):
            found = first_json_difference(x, y, f"{path}[{index}]")
            if found is not None:
                return found
        if len(a) != len(b):
            return f"{path} (length)", str(len(a)), str(len(b))
        return None
    if a == b and type(a) is type(b):
        return None
    return path, _clip(json.dumps(a)), _clip(json.dumps(b))


def _shown(document: dict[str, Any], key: str) -> str:
    return _clip(json.dumps(document[key])) if key in document else "(absent)"
