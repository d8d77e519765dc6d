"""``OUT/sweep.points.jsonl``: each point of a sweep saved as it finishes, for ``--resume``.

A line per finished point, ``{"sweep": KEY, "point": {the SweepPoint's fields}}``, KEY being
`SweepSpec.key`: a hash of the scenario's text, the sweep's overrides (``--set``, ``--seed``)
and its loss target. A sweep run again with ``--resume`` reads the file, takes the saved points
whose settings it plans (`done_by_index`) and runs only the others; a point's result depends on
nothing else, so the sweep ends with the sweep.json bytes an uninterrupted run writes. A line of
another KEY is another sweep's point: `load_points` refuses the file (`JournalMismatch`) rather
than mix two sweeps. The key does not cover the files a scenario names (a profile) nor the
code: a resumed sweep trusts them to be the same.

DESIGN: the file is appended to, a line per point, flushed and fsynced, rather than rewritten
whole through `atomic_open` as pslab's other outputs are: a sweep of thousands of points would
rewrite it thousands of times. A process killed in the middle of a write leaves at worst a torn
last line, which `load_points` skips (that point is simply run again), and `Journal` starts by
rewriting the file atomically with the points it keeps, so that appends begin on a whole line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from runtime.config.atomic import atomic_open

from .sweep import Settings, SweepPoint

__all__ = ["JOURNAL", "Journal", "JournalMismatch", "done_by_index", "load_points"]

JOURNAL = "sweep.points.jsonl"
"""The journal's name in a sweep's output folder."""


class JournalMismatch(ValueError):
    """A journal holding the points of another sweep (another scenario text, overrides or
    loss target)."""


def load_points(path: Path, key: str) -> list[SweepPoint]:
    """The points saved in `path` (none if it does not exist), skipping lines that are torn or
    unreadable; `JournalMismatch` if one was saved by a sweep of another key."""
    if not path.exists():
        return []
    points = []
    for line in path.read_text().split("\n"):
        entry = _entry(line)
        if entry is None:
            continue
        if entry.get("sweep") != key:
            raise JournalMismatch(
                f"{path} holds the points of another sweep (another scenario text, --set, "
                "--seed or --loss-target); pass --force to start this one afresh, or --out "
                "another folder")
        point = _point(entry.get("point"))
        if point is not None:
            points.append(point)
    return points


def _entry(line: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except ValueError:  # a torn last line, or an empty one
        return None
    return entry if isinstance(entry, dict) else None


def _point(fields: Any) -> SweepPoint | None:
    try:
        return SweepPoint(**fields)
    except TypeError:  # not the fields of a SweepPoint (of another version)
        return None


def done_by_index(plan: Sequence[Settings], saved: Iterable[SweepPoint]) -> dict[int, SweepPoint]:
    """The saved point of each planned point that has one, by the plan's index, its settings
    in the plan's order (the axes may have been given in another)."""
    by_settings = {frozenset(p.settings.items()): p for p in saved}
    done = {}
    for index, settings in enumerate(plan):
        point = by_settings.get(frozenset(settings.items()))
        if point is not None:
            done[index] = replace(point, settings=dict(settings))
    return done


class Journal:
    """The journal of one sweep, open for appending; rewritten first with `kept` (the points
    loaded from an earlier run, kept whether this run plans them or not)."""

    def __init__(self, path: Path, key: str, kept: Iterable[SweepPoint] = ()) -> None:
        self.path, self.key = path, key
        with atomic_open(path) as f:
            for point in kept:
                f.write(self._line(point))
        self._file: IO[str] = path.open("a")

    def _line(self, point: SweepPoint) -> str:
        return json.dumps({"sweep": self.key, "point": asdict(point)}) + "\n"

    def add(self, point: SweepPoint) -> None:
        """Save `point` for good: the line is on disk when this returns."""
        self._file.write(self._line(point))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
