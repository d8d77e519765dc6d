"""A scenario's YAML read strictly, with the line of every key, for errors that name it.

`read_yaml(text, where)` parses one YAML document with PyYAML's safe loader and returns the
data and `LineIndex`, the 1-based line of each field path (``("cluster", "trainers")``). It
refuses, as a `ScenarioError` of one line:

- text that is not YAML: ``quickstart.yaml:3: not valid YAML: expected ',' or ']', but got
  '<stream end>' (column 7)``;
- a key given twice in one mapping, at any depth, which YAML loaders otherwise resolve silently
  by keeping the last: ``s.yaml:12: train: duplicate key 'train' (first at line 9)``.

`where` is what the message names first: a file name (then with the line) or a ``--set``
item (then without: the value is one line).
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["FieldPath", "LineIndex", "ScenarioError", "dotted", "line_of", "read_yaml"]

FieldPath = tuple[str | int, ...]
"""Where a value sits in a scenario: its keys and list indexes from the top."""
LineIndex = dict[FieldPath, int]
"""The 1-based line of each field path of a YAML file."""

MERGE_TAG = "tag:yaml.org,2002:merge"


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the file, line and field (or the
    ``--set`` that gave the value), a problem a line."""


def dotted(path: FieldPath) -> str:
    """``cluster.hosts.0.cores``: a field path as errors write it."""
    return ".".join(str(p) for p in path)


def read_yaml(text: str, where: str, at: FieldPath = (),
              numbered: bool = True) -> tuple[Any, LineIndex]:
    """The data of the one YAML document in `text` and the line of each of its field paths
    (`at` prefixed to them); `ScenarioError` naming `where` (with the line when `numbered`)
    if it is not YAML or repeats a key."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_unique(node, where if numbered else None, where, at)
        return loader.construct_document(node), _line_index(node, at)
    except yaml.MarkedYAMLError as exc:
        raise ScenarioError(_yaml_problem(exc, where, numbered)) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{where}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.MarkedYAMLError, where: str, numbered: bool) -> str:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or exc.context or "unreadable"
    if mark is None:
        return f"{where}: not valid YAML: {problem}"
    context = exc.context_mark if exc.context and exc.problem else None
    if numbered:
        since = "" if context is None else \
            f"; {exc.context} from line {context.line + 1}, column {context.column + 1}"
        return (f"{where}:{mark.line + 1}: not valid YAML: {problem} (column {mark.column + 1}"
                f"{_excerpt(mark)}{since})")
    since = "" if context is None else f"; {exc.context} from column {context.column + 1}"
    return f"{where}: not valid YAML: {problem} (column {mark.column + 1}{since})"


def _excerpt(mark: Any, width: int = 60) -> str:
    """`` of "LINE"``: the text of the line `mark` is on, cut to `width` around its column."""
    buffer = getattr(mark, "buffer", None)
    if not isinstance(buffer, str):
        return ""
    line = buffer.split("\n")[mark.line].rstrip("\0").rstrip() if buffer else ""
    if not line.strip():
        return ""
    start = max(0, min(mark.column - width // 2, len(line) - width))
    cut = line[start:start + width]
    return f" of {('...' if start else '') + cut + ('...' if start + width < len(line) else '')!r}"


def _check_unique(node: yaml.Node, file: str | None, where: str, path: FieldPath,
                  seen: set[int] | None = None) -> None:
    """Raise `ScenarioError` at the second occurrence of a key in any mapping under `node`."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, Any], int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != MERGE_TAG:
                line, name = key.start_mark.line + 1, (key.tag, key.value)
                if name in first:
                    _duplicate(file, where, path + (key.value,), line, first[name])
                first[name] = line
            _check_unique(value, file, where, path + (_key(key),), seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique(item, file, where, path + (i,), seen)


def _duplicate(file: str | None, where: str, path: FieldPath, line: int, earlier: int) -> None:
    if file is None:
        raise ScenarioError(f"{where}: {dotted(path)}: duplicate key {path[-1]!r}; a mapping "
                            "takes each key once")
    first = "given before on this line" if earlier == line else f"first at line {earlier}"
    raise ScenarioError(f"{file}:{line}: {dotted(path)}: duplicate key {path[-1]!r} ({first}); "
                        "a mapping takes each key once, YAML would keep only the last")


def _key(node: yaml.Node) -> str | int:
    return node.value if isinstance(node, yaml.ScalarNode) else str(node.start_mark.line)


def _line_index(node: yaml.Node, path: FieldPath, out: LineIndex | None = None,
                seen: set[int] | None = None) -> LineIndex:
    """Map each field path in a composed YAML tree to its 1-based line."""
    out = {} if out is None else out
    seen = set() if seen is None else seen
    out.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:
        return out
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[path + (_key(key),)] = key.start_mark.line + 1
            _line_index(value, path + (_key(key),), out, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, path + (i,), out, seen)
    return out


def line_of(lines: LineIndex, path: FieldPath, exact: bool = False) -> int | None:
    """The line of `path`, else (unless `exact`) of its nearest ancestor the file has."""
    for n in range(len(path), -1 if not exact else len(path) - 1, -1):
        key = tuple(p if isinstance(p, int) else str(p) for p in path[:n])
        if key in lines:
            return lines[key]
    return None
