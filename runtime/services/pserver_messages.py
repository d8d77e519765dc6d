"""The requests a pserver reads, as typed payloads: one dataclass per message kind.

A decoded `wire.Message` carries its kind-specific fields in a loose ``extra`` dict; `parse`
turns it into the payload the pserver core reads, checking each field's type, and raises a
`ProtocolViolation` naming the field otherwise. The field names are the protocol's
(`runtime.services.messages`, where the trainer's requests are built with them). `trainer_of` reads the one field every request
has (the sender's trainer id), which the core needs before it parses the rest (a trainer's
liveness counts even when its request is malformed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from runtime.network.wire import MAX_DETAIL, MAX_VAR, Kind, Message, clip
from runtime.services.messages import (BARRIER_FIELD, BARRIER_FROM_FIELD, DIR_FIELD, ENTRY_FIELD,
                                       FETCH_BARRIER_FIELD, FETCH_FIELD, MERGE_ADD_FIELD,
                                       NAMES_FIELD, TABLE_FIELD, TRAINER_FIELD)
from runtime.services.protocol import Closes


class ProtocolViolation(ValueError):
    """A well-formed message that this server cannot accept; sent back as an error reply. Its
    text and var are clipped: what it quotes of the message stays small."""

    def __init__(self, detail: str, var: str | None = None, reason: str | None = None) -> None:
        super().__init__(clip(detail, MAX_DETAIL))
        self.var = None if var is None else clip(var, MAX_VAR)
        self.reason = reason
        """The error reply's reason (`wire.error_reply`); None: the class's name."""


class NotInFanIn(ProtocolViolation):
    """A sync request from a trainer that was dropped from the fan-in (silent for longer than
    the heartbeat timeout) and is alive after all: answered with a notice to join again
    (``rejoin``: the first step it can), not with an error."""


@dataclass(frozen=True)
class Send:
    """SEND: gradients, deltas or counters; `merge_add` adds them to what is held (a counter)."""

    values: dict[str, Any]
    merge_add: bool
    closes: Closes | None = None
    """The send barrier it carries (the compact protocol), if any."""
    fetch: Get | None = None
    """The round's GET riding on it (the bundled protocol), answered in its reply."""


@dataclass(frozen=True)
class Get:
    names: tuple[str, ...]
    closes: Closes | None = None
    """The fetch barrier it carries (the compact protocol), if any."""


@dataclass(frozen=True)
class Prefetch:
    """PREFETCH: rows of the distributed table by id, or (`table`) rows of that param block."""

    ids: dict[str, Any]
    table: object
    """The param block asked for by row (checked by the core); meaningful with `by_row`."""
    by_row: bool


@dataclass(frozen=True)
class Join:
    entry: int


@dataclass(frozen=True)
class CheckpointNotify:
    directory: str


@dataclass(frozen=True)
class Plain:
    """A request with no fields of its own: a barrier, COMPLETE, HEARTBEAT."""


Payload = Send | Get | Prefetch | Join | CheckpointNotify | Plain


def trainer_of(msg: Message) -> int:
    trainer = msg.extra.get(TRAINER_FIELD)
    if not isinstance(trainer, int) or isinstance(trainer, bool):
        raise ProtocolViolation(f"{msg.kind} from {msg.src!r} lacks an int {TRAINER_FIELD!r} "
                                "field")
    return trainer


def parse(msg: Message) -> Payload:
    """The payload of request `msg`."""
    parser = _PARSERS.get(msg.kind)
    return Plain() if parser is None else parser(msg)


def _send(msg: Message) -> Send:
    return Send(dict(msg.vars), msg.extra.get(MERGE_ADD_FIELD) is True, closes_of(msg), _fetch(msg))


def _fetch(msg: Message) -> Get | None:
    """The GET a SEND carries (``fetch``: var names; ``fetch_barrier``: the count of the fetch
    barrier it carries, from its own id), if any."""
    names = msg.extra.get(FETCH_FIELD)
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolViolation(f"SEND: {FETCH_FIELD!r} must be a list of var names")
    count = msg.extra.get(FETCH_BARRIER_FIELD)
    if count is None:
        return Get(tuple(names))
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ProtocolViolation(f"SEND: {FETCH_BARRIER_FIELD!r} must be an int >= 1, got "
                                f"{count!r}")
    return Get(tuple(names), Closes(count, msg.id))


def _get(msg: Message) -> Get:
    names = msg.extra.get(NAMES_FIELD)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolViolation(f"GET needs a list of var names in {NAMES_FIELD!r}")
    return Get(tuple(names), closes_of(msg))


def closes_of(msg: Message) -> Closes | None:
    """The barrier request `msg` carries (``barrier``, ``barrier_from``), if any."""
    count = msg.extra.get(BARRIER_FIELD)
    if count is None:
        return None
    first = msg.extra.get(BARRIER_FROM_FIELD, msg.id)
    for name, value in ((BARRIER_FIELD, count), (BARRIER_FROM_FIELD, first)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolViolation(f"{msg.kind}: {name!r} must be an int, got {value!r}")
    if count < 1 or first > msg.id:
        raise ProtocolViolation(f"{msg.kind}: a barrier of {count} message(s) from id {first} "
                                f"cannot be carried by message {msg.id}")
    return Closes(count, first)


def _prefetch(msg: Message) -> Prefetch:
    return Prefetch(dict(msg.vars), msg.extra.get(TABLE_FIELD), TABLE_FIELD in msg.extra)


def _join(msg: Message) -> Join:
    entry = msg.extra.get(ENTRY_FIELD)
    if not isinstance(entry, int) or isinstance(entry, bool):
        raise ProtocolViolation(f"JOIN needs an int {ENTRY_FIELD!r} step")
    return Join(entry)


def _checkpoint(msg: Message) -> CheckpointNotify:
    directory = msg.extra.get(DIR_FIELD)
    if not isinstance(directory, str) or not directory or "\0" in directory:
        raise ProtocolViolation(f"CHECKPOINT_NOTIFY needs a directory path in {DIR_FIELD!r}")
    return CheckpointNotify(directory)


_PARSERS: dict[Kind, Callable[[Message], Payload]] = {Kind.SEND: _send, Kind.GET: _get, Kind.PREFETCH: _prefetch, Kind.JOIN: _join,
            Kind.CHECKPOINT_NOTIFY: _checkpoint}
