"""A scenario's validation errors as lines that say where each problem is and what it is.

Each pydantic error becomes ``<where>: <field>: <what>``. `<where>` is the ``--set`` that gave
the value (``--set cluster.trainerz=3``) when one did, else ``FILE:LINE``, the line of the field
or of its nearest ancestor in the file. A rule over several fields raises `CrossFieldError`,
which lists them: its `<field>` is those fields (for a rule of the whole scenario) and its
`<where>` the ``--set`` of one of them, else the line of the first the file states. An unknown
field says which known one it may be a typo of:
``s.yaml:7: train.stepz: Extra inputs are not permitted (did you mean 'steps'?)``.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Tag, ValidationError

from runtime.config.faults import FAULT_KINDS
from runtime.config.netspec import strip_tags
from runtime.config.overrides import Override, blamed
from runtime.config.yaml_source import FieldPath, LineIndex, dotted, line_of

__all__ = ["CrossFieldError", "describe", "known_fields"]


class CrossFieldError(ValueError):
    """A rule over several fields broken: `fields` are their paths (dotted, relative to the
    model whose validator raised it), the first the one the message is about."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


def describe(err: ValidationError, root: type[BaseModel], source: str, lines: LineIndex,
             overrides: Sequence[Override] = ()) -> str:
    """One line per error of `err` (validating `root` from the file `source`)."""
    return "\n".join(_line(e, root, source, lines, overrides) for e in err.errors())


def _line(e: Any, root: type[BaseModel], source: str, lines: LineIndex,
          overrides: Sequence[Override]) -> str:
    raw = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    loc = _plain_loc(raw)
    message = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        message += _suggestion(root, raw)
    cause = (e.get("ctx") or {}).get("error")
    fields = [loc + _path(f) for f in getattr(cause, "fields", ())]
    label = dotted(loc) or ", ".join(dotted(f) for f in fields) or "(top level)"
    return f"{_where(loc, fields, source, lines, overrides)}: {label}: {message}"


def _plain_loc(loc: FieldPath) -> FieldPath:
    """`loc` without the tags pydantic adds for a fault's shape and a latency's distribution."""
    if len(loc) > 2 and loc[0] == "faults" and loc[2] in FAULT_KINDS:
        loc = loc[:2] + loc[3:]
    if loc and loc[0] == "network":
        loc = strip_tags(loc)
    return loc


def _path(text: str) -> FieldPath:
    return tuple(int(p) if p.isdigit() else p for p in text.split("."))


def _where(loc: FieldPath, fields: list[FieldPath], source: str, lines: LineIndex,
           overrides: Sequence[Override]) -> str:
    """The ``--set`` that gave the value, else ``source:LINE``."""
    override = blamed(overrides, fields, within=True) if fields else blamed(overrides, [loc])
    if override is not None:
        return override.where
    stated = [line for line in (line_of(lines, f, exact=True) for f in fields) if line]
    line = stated[0] if stated else line_of(lines, fields[0] if fields else loc)
    return f"{source}:{line}" if line else source


def _suggestion(root: type[BaseModel], loc: FieldPath) -> str:
    """`` (did you mean 'steps'?)`` for the unknown key at the end of `loc`, or the known keys
    there when none is close; empty when they cannot be told."""
    known = known_fields(root, loc[:-1])
    if not known or not isinstance(loc[-1], str):
        return ""
    key, colon, value = loc[-1].partition(":")
    if colon and key in known:
        return (f" (YAML read {loc[-1]!r} as one key: put a space after the colon, "
                f"'{key}: {value}')")
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (known here: {', '.join(known)})"


def known_fields(root: type[BaseModel], loc: FieldPath) -> list[str]:
    """The field names of the model(s) at `loc` (a pydantic error location, tags included)
    under `root`; empty when no model is there."""
    kinds: list[Any] = [root]
    for step in loc:
        kinds = [after for kind in kinds for after in _step(kind, step)]
    names: list[str] = []
    for kind in (_bare(o) for k in kinds for o in _options(k)):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names += [n for n in kind.model_fields if n not in names]
    return names


def _step(kind: Any, step: str | int) -> list[Any]:
    """The types one `step` (a key, an index or a union's tag) below a value of type `kind`."""
    options = _options(kind)
    tagged = [_bare(o) for o in options if _tag(o) == step]
    if tagged:
        return tagged
    found: list[Any] = []
    for option in map(_bare, options):
        origin = get_origin(option)
        if isinstance(option, type) and issubclass(option, BaseModel):
            field = option.model_fields.get(str(step))
            found += [field.annotation] if field is not None else []
        elif origin is list and isinstance(step, int):
            found += list(get_args(option)[:1])
        elif origin is dict and isinstance(step, str):
            found += list(get_args(option)[1:2])
    return found


def _options(kind: Any) -> list[Any]:
    """The alternatives of a union (Annotated kept on each), else `kind` alone."""
    kind = _bare(kind) if get_origin(kind) is Annotated and _tag(kind) is None else kind
    if get_origin(kind) in (Union, types.UnionType):
        return [o for arg in get_args(kind) for o in _options(arg)]
    return [kind]


def _bare(kind: Any) -> Any:
    while get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    return kind


def _tag(kind: Any) -> str | None:
    if get_origin(kind) is not Annotated:
        return None
    tags = [m.tag for m in kind.__metadata__ if isinstance(m, Tag)]
    return tags[0] if tags else None
