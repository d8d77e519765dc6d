"""``--set path=value``: a scenario field overridden from the command line, and remembered, so
that an error about the value it gave names the ``--set``, not a line of the file.

`parse_override` reads ``cluster.trainers=8`` (the value is YAML, checked as strictly as the
file: ``--set 'cluster.trainers=[3'`` is ``--set cluster.trainers=[3: not valid YAML: ...``);
`apply_overrides` sets the values in a scenario's raw data, in order (a later one wins);
`blamed` says which override gave the value at a field path, if one did.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.config.yaml_source import FieldPath, ScenarioError, read_yaml

__all__ = ["Override", "apply_overrides", "blamed", "parse_override"]


@dataclass(frozen=True)
class Override:
    """One ``--set`` (or ``sim sweep --vary``) item: its `text` as given, the field `path` it
    sets and the `value`, parsed as YAML."""

    text: str
    path: tuple[str, ...]
    value: Any
    flag: str = "--set"

    @property
    def where(self) -> str:
        """How errors name it: ``--set cluster.trainers=8``."""
        return f"{self.flag} {self.text}"


def parse_override(text: str, flag: str = "--set") -> Override:
    """``section.field=value``; `ScenarioError` naming the item if it is not that."""
    path, sep, value = text.partition("=")
    keys = tuple(path.split("."))
    if not sep or not all(k.strip() for k in keys):
        raise ScenarioError(f"{flag} {text}: expected path=value, e.g. cluster.trainers=4")
    parsed, _ = read_yaml(value, f"{flag} {text}", keys, numbered=False)
    return Override(text, keys, parsed, flag)


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str | Override]) -> dict[str, Any]:
    """A copy of `raw` with each override's value set at its path, in order."""
    result = copy.deepcopy(raw)
    for item in overrides:
        override = item if isinstance(item, Override) else parse_override(item)
        node = result
        for key in override.path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ScenarioError(f"{override.where}: {key!r} is not a section")
            node = child
        node[override.path[-1]] = copy.deepcopy(override.value)
    return result


def blamed(overrides: Sequence[Override], paths: Iterable[FieldPath],
           within: bool = False) -> Override | None:
    """The override that gave a value at one of `paths` (at it or above it, the last given
    winning, as it overwrote the others); with `within`, one that set a value below a path too
    (the path names a whole section that a rule reads)."""
    for path in paths:
        keys = tuple(str(p) for p in path)
        for override in reversed(overrides):
            if keys[:len(override.path)] == override.path or \
                    (within and override.path[:len(keys)] == keys):
                return override
    return None
