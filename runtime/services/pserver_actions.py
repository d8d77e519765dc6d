"""What the pserver core asks its IO shell to do: the actions, one dataclass each.

The core (`pserver_core`) yields actions one at a time; the shell performs each before it
resumes the core, sending back what the action produced (the path a checkpoint was saved to)
or throwing what it raised into the core, which turns a failure in handling a request into an
error reply and lets a failed optimize stop the server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generator, Mapping

from runtime.network.wire import Message


@dataclass(frozen=True)
class Reply:
    """Send `message` to `peer`; `heartbeat`: it answers a heartbeat (its bytes are counted
    apart)."""

    peer: str
    message: Message
    heartbeat: bool = False


@dataclass(frozen=True)
class Reject:
    """`request` (None: it could not be decoded) is refused for `error`: an error reply, unless
    it wants none (`answered` False: a BYE that changes nothing), then only counted."""

    peer: str
    error: Exception
    request: Message | None
    answered: bool = True


@dataclass(frozen=True)
class Begin:
    """The handling of a request starts: an update it causes is timed from here."""


@dataclass(frozen=True)
class RunBlocks:
    """Run these blocks of the program now, in order, charging their ops."""

    blocks: tuple[int, ...]


@dataclass(frozen=True)
class Pay:
    """Wait for the compute the request's handling owes; `update_step`: it applied a trainer's
    update of that step (asynchronous modes), which counts as optimize time and a step."""

    update_step: int | None = None


@dataclass(frozen=True)
class Optimize:
    """A sync round's update: run `blocks` (ops named in `overrides` with those attributes),
    then wait for their compute. The core resumes when it is done."""

    blocks: tuple[int, ...]
    overrides: Mapping[tuple[int, int], Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SaveCheckpoint:
    """Save the whole state as the state before `step` to `directory`, or (None) to the
    configured periodic checkpoint directory; the core is resumed with the path written."""

    step: int
    directory: Path | None = None


@dataclass(frozen=True)
class Tally:
    """Count an event in the server's stats: `stat` += `value`, or `value` appended to a list;
    with `key`, the stat maps keys to sums and `value` is added at `key`; with `peak`, the stat
    keeps the larger of itself and `value` (None: nothing yet)."""

    stat: str
    value: int | float = 1
    key: int | None = None
    peak: bool = False


@dataclass(frozen=True)
class Replay:
    """A deferred request is handled again (`done`: its handling, and what it set off, ended)."""

    kind: str
    done: bool


@dataclass(frozen=True)
class Stop:
    """Every trainer has completed or been dropped: the server may stop, once retries of lost
    replies have had time to come (`drain`), or at once (every completed trainer said BYE)."""

    drain: bool = True


Action = Reply | Reject | Begin | RunBlocks | Pay | Optimize | SaveCheckpoint | Tally | Replay | Stop
Work = Generator[Action, Any, Any]
"""A stream of actions; what it returns at the end is its own (an answer, a flag)."""
