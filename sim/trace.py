"""What every node did when, recorded during a simulated run and written as a Chrome trace.

`TraceRecorder` is both the runtime's `Tracer` (spans: the compute ops a node was charged for,
the RPC ops a trainer waited in, the training steps) and the `Network`'s message observer (each
message: sender, receiver, bytes, when sent, when delivered). `chrome_trace()` turns the record
into the Trace Event Format that Perfetto (ui.perfetto.dev) and chrome://tracing open:

- one process per node (pservers first, then trainers, by index), named after the node;
- one thread per kind of span: "steps", "compute", "rpc" (then any other category), each span an
  "X" (complete) event, in microseconds of simulated time;
- each message an instant slice "to <dst>" on the sender's "sent" thread and "from <src>" on the
  receiver's "received" thread, joined by a flow arrow ("s"/"f" events sharing the message's
  number, counted in delivery order).

The file holds nothing but simulated times and counters, keys sorted: the same run gives the
same bytes.

DESIGN: times are whole nanoseconds. Each span's begin and end are rounded to the nanosecond
once (`Slice`), and its ``ts`` and ``dur`` derived from those two integers, written as
microseconds with at most three decimals (``ns / 1000``, which Python prints as that exact
decimal). Rounding ``ts`` and ``dur`` each on its own made a span that ends where the next
begins overlap it by a nanosecond now and then, and Perfetto drops a slice that overlaps its
predecessor on a thread without nesting in it. Perfetto reads such a decimal exactly, digit by
digit, so the slices it builds end where they were written to end.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from runtime.config.atomic import write_atomic
from runtime.config.nodes import ROLES

__all__ = ["BARRIER_OPS", "MessageRecord", "REPORTED", "Slice", "Span", "TraceRecorder",
           "node_order"]

SPAN_THREADS = ("step", "compute", "rpc")
"""Span categories with a thread of their own, in display order; other categories follow."""
THREAD_NAMES = {"step": "steps", "compute": "compute", "rpc": "rpc"}
SENT, RECEIVED = "sent", "received"


@dataclass(frozen=True, slots=True)
class Span:
    node: str
    name: str
    start: float
    end: float
    category: str


@dataclass(frozen=True, slots=True)
class MessageRecord:
    src: str
    dst: str
    nbytes: int
    sent: float
    delivered: float


def node_order(node: str) -> tuple[int, str, int, str]:
    """Sort key: pservers, then trainers, then anything else; by numeric index within a role."""
    role, _, index = node.partition(":")
    rank = ROLES.index(role) if role in ROLES else len(ROLES)
    return (rank, role, int(index) if index.isdigit() else -1, index)


def ns(seconds: float) -> int:
    """`seconds` in whole nanoseconds, rounded."""
    return round(seconds * 1e9)


def us(nanoseconds: int) -> float:
    """Whole nanoseconds as microseconds: a float that prints as the exact decimal (three
    decimals at most), for any time under 100 days (2**43 us)."""
    return nanoseconds / 1000


@dataclass(frozen=True, slots=True)
class Slice:
    """A span's begin and end, each rounded to the nanosecond once: ``ts`` and ``dur`` are
    derived from them, so a slice that ends where another begins ends exactly there."""

    begin: int
    end: int

    @staticmethod
    def of(start: float, end: float) -> Slice:
        return Slice(ns(start), ns(end))

    def fields(self) -> dict[str, float]:
        """Its ``ts`` and ``dur``, microseconds."""
        return {"ts": us(self.begin), "dur": us(self.end - self.begin)}


BARRIER_OPS = frozenset({"send_barrier", "recv", "fetch_barrier"})
"""The RPC ops a trainer's barrier wait is made of (`sim.report`)."""
REPORTED = {"rpc": BARRIER_OPS}
"""The spans a run's report reads (category -> names): all a run without trace.json keeps."""


class TraceRecorder:
    """Spans and messages of one simulated run (a `Tracer` and a `MessageObserver`).

    `only` (category -> span names): keep just those spans, e.g. `REPORTED` for a run that
    writes no trace.json (a span per op a node is charged for, kept for the whole run, is
    over a hundred megabytes at 1,000 trainers x 10 steps); None: every span."""

    def __init__(self, only: dict[str, frozenset[str]] | None = None) -> None:
        self.spans: dict[str, list[Span]] = defaultdict(list)
        self.messages: list[MessageRecord] = []
        self.only = only

    def span(self, node: str, name: str, start: float, end: float, category: str) -> None:
        only = self.only
        if only is not None and name not in only.get(category, ()):
            return
        self.spans[node].append(Span(node, name, start, end, category))

    def message(self, src: str, dst: str, nbytes: int, t_send: float, t_deliver: float) -> None:
        self.messages.append(MessageRecord(src, dst, nbytes, t_send, t_deliver))

    def seconds(self, node: str, category: str, names: frozenset[str], since: float) -> float:
        """Total time of `node`'s spans of `category` named one of `names` that start at
        `since` or later."""
        return sum(s.end - s.start for s in self.spans.get(node, ())
                   if s.category == category and s.name in names and s.start >= since)

    def nodes(self) -> list[str]:
        seen = set(self.spans) | {m.src for m in self.messages} | {m.dst for m in self.messages}
        return sorted(seen, key=node_order)

    def chrome_trace(self, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """The record in the Trace Event Format (see the module doc)."""
        pids = {node: pid for pid, node in enumerate(self.nodes(), start=1)}
        threads = self._threads()
        events = list(self._metadata(pids, threads, self._used()))
        for node, spans in sorted(self.spans.items(), key=lambda item: node_order(item[0])):
            events += [{"ph": "X", "pid": pids[node], "tid": threads[s.category], "name": s.name,
                        "cat": s.category, **Slice.of(s.start, s.end).fields()}
                       for s in spans]
        for number, message in enumerate(self.messages, start=1):
            events += self._message_events(number, message, pids, threads)
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"clock": "simulated", **(metadata or {})}}

    def write(self, path: Path, metadata: dict[str, Any] | None = None) -> None:
        """Write `chrome_trace()` as JSON, one event a line, keys sorted."""
        trace = self.chrome_trace(metadata)
        lines = [json.dumps(event, sort_keys=True, separators=(",", ":"))
                 for event in trace.pop("traceEvents")]
        rest = json.dumps(trace, sort_keys=True, separators=(",", ":"))
        write_atomic(path, '{"traceEvents":[\n' + ",\n".join(lines) + "\n]," + rest[1:] + "\n")

    def _threads(self) -> dict[str, int]:
        categories = {s.category for spans in self.spans.values() for s in spans}
        names = [c for c in SPAN_THREADS if c in categories]
        names += sorted(categories - set(SPAN_THREADS))
        return {name: tid for tid, name in enumerate([*names, SENT, RECEIVED], start=1)}

    def _used(self) -> dict[str, set[str]]:
        """The threads each node has events on."""
        used: dict[str, set[str]] = defaultdict(set)
        for node, spans in self.spans.items():
            used[node].update(s.category for s in spans)
        for m in self.messages:
            used[m.src].add(SENT)
            used[m.dst].add(RECEIVED)
        return used

    @staticmethod
    def _metadata(pids: dict[str, int], threads: dict[str, int],
                  used: dict[str, set[str]]) -> Iterator[dict[str, Any]]:
        for node, pid in pids.items():
            yield {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": node}}
            yield {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}
            for name, tid in threads.items():
                if name not in used[node]:
                    continue
                yield {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                       "args": {"name": THREAD_NAMES.get(name, name)}}
                yield {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}}

    @staticmethod
    def _message_events(number: int, m: MessageRecord, pids: dict[str, int],
                        threads: dict[str, int]) -> list[dict[str, Any]]:
        src, dst = (pids[m.src], threads[SENT]), (pids[m.dst], threads[RECEIVED])
        flight = Slice.of(m.sent, m.delivered)
        sent, delivered = us(flight.begin), us(flight.end)
        args = {"bytes": m.nbytes, "message": number, "flight_us": us(flight.end - flight.begin)}
        return [
            {"ph": "X", "pid": src[0], "tid": src[1], "name": f"to {m.dst}", "cat": "message",
             "ts": sent, "dur": 0, "args": args},
            {"ph": "X", "pid": dst[0], "tid": dst[1], "name": f"from {m.src}", "cat": "message",
             "ts": delivered, "dur": 0, "args": args},
            {"ph": "s", "pid": src[0], "tid": src[1], "name": "message", "cat": "message",
             "id": number, "ts": sent},
            {"ph": "f", "bp": "e", "pid": dst[0], "tid": dst[1], "name": "message",
             "cat": "message", "id": number, "ts": delivered},
        ]
