"""Checks of a Chrome trace (the Trace Event Format that ``sim run`` writes as ``trace.json``):
`format_problems` against the format's rules for the events pslab writes, `overlaps` of the
complete events on each thread, in whole nanoseconds read exactly from the file's text."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

METADATA = {"process_name": ("name", str), "process_sort_index": ("sort_index", int),
            "thread_name": ("name", str), "thread_sort_index": ("sort_index", int)}
"""Metadata event name -> the key its args hold, and that key's type."""
REQUIRED = {"X": {"name": str, "cat": str, "pid": int, "tid": int, "ts": Decimal,
                  "dur": Decimal},
            "M": {"name": str, "pid": int, "args": dict},
            "s": {"name": str, "cat": str, "pid": int, "tid": int, "ts": Decimal, "id": int},
            "f": {"name": str, "cat": str, "pid": int, "tid": int, "ts": Decimal, "id": int}}
"""Phase -> the keys every event of that phase must have, with their types (numbers read as
`Decimal`: exactly as written)."""


def load(path: Path) -> dict[str, Any]:
    """The trace, its numbers with a fraction read as `Decimal` (exactly as written)."""
    document: dict[str, Any] = json.loads(Path(path).read_text(), parse_float=Decimal)
    return document


def format_problems(document: Any) -> list[str]:
    """What in `document` breaks the Trace Event Format (JSON object form) as pslab uses it:
    the top-level keys, each event's phase, required keys and their types, times that are
    whole nanoseconds and not negative, metadata args, and flows begun and ended once each."""
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    problems = [] if document.get("displayTimeUnit") in ("ms", "ns") else ["displayTimeUnit"]
    flows: dict[int, list[str]] = defaultdict(list)
    for i, event in enumerate(document["traceEvents"]):
        problems += [f"event {i}: {p}" for p in _event_problems(event)]
        if isinstance(event, dict) and event.get("ph") in ("s", "f"):
            flows[event.get("id", -1)].append(event["ph"])
    problems += [f"flow {k}: phases {v}" for k, v in flows.items() if sorted(v) != ["f", "s"]]
    return problems


def _event_problems(event: Any) -> list[str]:
    if not isinstance(event, dict) or event.get("ph") not in REQUIRED:
        return [f"not an event of a known phase: {event!r:.80}"]
    problems = [f"{key}: {type(event.get(key)).__name__}, not {kind.__name__}"
                for key, kind in REQUIRED[event["ph"]].items()
                if not _is(event.get(key), kind)]
    for key in ("ts", "dur"):
        value = event.get(key)
        if isinstance(value, (int, Decimal)) and (value < 0 or (value * 1000) % 1 != 0):
            problems.append(f"{key} {value}: not a whole number of nanoseconds >= 0")
    if event["ph"] == "M":
        problems += _metadata_problems(event)
    return problems


def _is(value: Any, kind: type) -> bool:
    if kind is Decimal:  # a number: an integer or a number with a fraction
        return isinstance(value, (int, Decimal)) and not isinstance(value, bool)
    return isinstance(value, kind) and not isinstance(value, bool)


def _metadata_problems(event: dict[str, Any]) -> list[str]:
    name = event["name"]
    if name not in METADATA:
        return [f"unknown metadata {name!r}"]
    key, kind = METADATA[name]
    problems = [] if _is(event["args"].get(key), kind) else [f"{name}: args.{key}"]
    if name.startswith("thread") and not _is(event.get("tid"), int):
        problems.append(f"{name}: no tid")
    return problems


def nanoseconds(value: int | Decimal) -> int:
    """A time as written (microseconds), in nanoseconds; exact."""
    product = Decimal(value) * 1000
    assert product == product.to_integral_value(), f"{value} us is not whole nanoseconds"
    return int(product)


def overlaps(document: dict[str, Any]) -> list[str]:
    """Each complete ("X") event that overlaps another on its thread (pid, tid) without
    nesting in it: one that begins inside another and ends after it."""
    threads: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for event in document["traceEvents"]:
        if event["ph"] == "X":
            begin = nanoseconds(event["ts"])
            threads[event["pid"], event["tid"]].append(
                (begin, begin + nanoseconds(event["dur"]), event["name"]))
    found = []
    for thread, slices in threads.items():
        open_: list[tuple[int, int, str]] = []  # the slices the next one may nest in
        for begin, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1][1] <= begin:
                open_.pop()
            if open_ and end > open_[-1][1]:
                found.append(f"{thread}: {name} [{begin}, {end}] ns overlaps {open_[-1][2]} "
                             f"[{open_[-1][0]}, {open_[-1][1]}] ns")
            open_.append((begin, end, name))
    return found
