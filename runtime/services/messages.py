"""The PS protocol's header fields, and the trainer's requests and reply facts as types.

A `wire.Message` carries its kind-specific fields in a loose ``extra`` dict. Every field name a
trainer or a pserver writes or reads there is defined here, once (the `*_FIELD` constants):
the trainer builds its requests as the dataclasses below (`Request.header`), the pserver parses
them with the same names (`runtime.services.pserver_messages`), and both sides read and write
the replies' fields through them.

Requests (trainer to pserver): `SendRequest`, `GetRequest`, `PrefetchRequest`, `JoinRequest`,
`CheckpointRequest` and `Signal` (a request with no fields of its own: the barriers,
COMPLETE, HEARTBEAT, BYE). Every one carries the sender's trainer id (`TRAINER_FIELD`).

Replies (pserver to trainer), as the trainer reads them:

- every reply says the server's step (`SERVER_STEP_FIELD`);
- a notice (`notice_of`): ``rewind: <step>`` (`RewindAt`: the server restarted from the state
  before that step), ``rejoin: <step>`` (`RejoinAt`: it dropped the trainer from its fan-in),
  or ``pending: true`` (`HeldAt`: it holds the request, at its step);
- a fetch reply's fan-in state (`ServerState`, `FANIN_FIELDS`);
- a JOIN reply's entry step (`entry_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from runtime.network.rpc import PENDING_FIELD as PENDING_FIELD  # the RPC client reads it
from runtime.network.wire import Kind, Message
from runtime.services.protocol import Closes

# -- request fields ---------------------------------------------------------------------------------
TRAINER_FIELD = "trainer"
"""Every request: the sender's trainer id."""
NAMES_FIELD = "names"
"""GET: the var names asked for."""
MERGE_ADD_FIELD = "merge_add"
"""SEND: add the values to what the server holds (a counter), rather than taking them."""
BARRIER_FIELD = "barrier"
"""The field of a SEND or GET that carries its round's barrier: `Closes.count`."""
BARRIER_FROM_FIELD = "barrier_from"
"""`Closes.first`; absent: the carrier's own id."""
FETCH_FIELD = "fetch"
"""The field of a SEND that also asks for the values of these vars once the round's update is
done (the bundled protocol: the round's GET rides on its SEND; its reply carries them)."""
FETCH_BARRIER_FIELD = "fetch_barrier"
"""The count of the fetch barrier a SEND with `FETCH_FIELD` carries (its own id the first)."""
TABLE_FIELD = "table"
"""PREFETCH: the param block asked for by row (remote sparse update)."""
ENTRY_FIELD = "entry"
"""JOIN: the step the trainer asks to take part from; its reply: the step it is admitted at."""
DIR_FIELD = "dir"
"""CHECKPOINT_NOTIFY: the directory to save to."""

REQUEST_FIELDS = frozenset({TRAINER_FIELD, NAMES_FIELD, MERGE_ADD_FIELD, BARRIER_FIELD,
                            BARRIER_FROM_FIELD, FETCH_FIELD, FETCH_BARRIER_FIELD, TABLE_FIELD,
                            ENTRY_FIELD, DIR_FIELD})
"""Every field a trainer's request may carry."""

# -- reply fields -----------------------------------------------------------------------------------
SERVER_STEP_FIELD = "server_step"
"""Every reply: the server's step."""
REWIND_FIELD = "rewind"
"""A server restarted from a checkpoint: the step the trainer is to redo from."""
REJOIN_FIELD = "rejoin"
"""A sync server dropped the trainer from its fan-in: the first step it can join again at."""
IN_FANIN_FIELD = "in_fanin"
ENTRY_STEP_FIELD = "entry_step"
NEXT_STEP_FIELD = "next_step"
SYNC_FIELD = "sync"
FANIN_FIELDS = (SERVER_STEP_FIELD, IN_FANIN_FIELD, ENTRY_STEP_FIELD, NEXT_STEP_FIELD, SYNC_FIELD)
"""The fields of a fetch reply (`ServerState`), in order."""

REPLY_FIELDS = frozenset({SERVER_STEP_FIELD, REWIND_FIELD, REJOIN_FIELD, PENDING_FIELD,
                          ENTRY_FIELD, *FANIN_FIELDS})
"""Every field a pserver's reply may carry for the trainer to read."""



# -- requests ---------------------------------------------------------------------------------------
class Request:
    """A trainer's request: its kind, its vars and the header fields it writes."""

    __slots__ = ()

    @property
    def kind(self) -> Kind:
        raise NotImplementedError

    @property
    def vars(self) -> Mapping[str, Any] | None:
        return None

    def header(self, trainer: int) -> dict[str, Any]:
        return {TRAINER_FIELD: trainer}


def _closing(header: dict[str, Any], closes: Closes | None) -> dict[str, Any]:
    if closes is not None:
        header[BARRIER_FIELD] = closes.count
        header[BARRIER_FROM_FIELD] = closes.first
    return header


@dataclass(frozen=True, slots=True)
class SendRequest(Request):
    """SEND: values; `merge_add` asks the server to add them to what it holds; `fetch`: the
    round's GET rides on it (bundled), carrying the fetch barrier if `fetch_barrier`;
    `closes`: it carries the round's send barrier (compact, bundled)."""

    values: Mapping[str, Any]
    merge_add: bool = False
    fetch: Sequence[str] | None = None
    fetch_barrier: bool = False
    closes: Closes | None = None

    @property
    def vars(self) -> Mapping[str, Any]:
        return self.values

    @property
    def kind(self) -> Kind:
        return Kind.SEND

    def header(self, trainer: int) -> dict[str, Any]:
        header: dict[str, Any] = {TRAINER_FIELD: trainer}
        if self.merge_add:
            header[MERGE_ADD_FIELD] = True
        if self.fetch is not None:
            header[FETCH_FIELD] = self.fetch
            if self.fetch_barrier:
                header[FETCH_BARRIER_FIELD] = 1
        return _closing(header, self.closes)


@dataclass(frozen=True, slots=True)
class GetRequest(Request):
    """GET of these vars; `closes`: it carries the round's fetch barrier."""

    names: Sequence[str]
    closes: Closes | None = None

    @property
    def kind(self) -> Kind:
        return Kind.GET

    def header(self, trainer: int) -> dict[str, Any]:
        return _closing({TRAINER_FIELD: trainer, NAMES_FIELD: self.names}, self.closes)


@dataclass(frozen=True, slots=True)
class PrefetchRequest(Request):
    """PREFETCH of rows by id: of the distributed table, or (`table`) of that param block."""

    ids: Mapping[str, Any]
    table: str | None = None

    @property
    def vars(self) -> Mapping[str, Any]:
        return self.ids

    @property
    def kind(self) -> Kind:
        return Kind.PREFETCH

    def header(self, trainer: int) -> dict[str, Any]:
        if self.table is None:
            return {TRAINER_FIELD: trainer}
        return {TRAINER_FIELD: trainer, TABLE_FIELD: self.table}


@dataclass(frozen=True, slots=True)
class JoinRequest(Request):
    """JOIN the fan-in from step `entry` on (or the first later step the server admits)."""

    entry: int

    @property
    def kind(self) -> Kind:
        return Kind.JOIN

    def header(self, trainer: int) -> dict[str, Any]:
        return {TRAINER_FIELD: trainer, ENTRY_FIELD: self.entry}


@dataclass(frozen=True, slots=True)
class CheckpointRequest(Request):
    """CHECKPOINT_NOTIFY: save the server's state under `directory`."""

    directory: str

    @property
    def kind(self) -> Kind:
        return Kind.CHECKPOINT_NOTIFY

    def header(self, trainer: int) -> dict[str, Any]:
        return {TRAINER_FIELD: trainer, DIR_FIELD: self.directory}


SIGNALS = frozenset({Kind.SEND_BARRIER, Kind.FETCH_BARRIER, Kind.COMPLETE, Kind.HEARTBEAT,
                     Kind.BYE})


@dataclass(frozen=True, slots=True)
class Signal(Request):
    """A request with no fields of its own (`SIGNALS`): a barrier, COMPLETE, HEARTBEAT, BYE."""

    signal: Kind

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"{self.signal} is not a request without fields")

    @property
    def kind(self) -> Kind:
        return self.signal


SEND_BARRIER = Signal(Kind.SEND_BARRIER)
FETCH_BARRIER = Signal(Kind.FETCH_BARRIER)
COMPLETE = Signal(Kind.COMPLETE)
HEARTBEAT = Signal(Kind.HEARTBEAT)
BYE = Signal(Kind.BYE)


# -- replies ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RewindAt:
    """``rewind``: the server restarted from the state before `step`."""

    step: int


@dataclass(frozen=True, slots=True)
class RejoinAt:
    """``rejoin``: the server dropped this trainer from its fan-in; it can join at `step`."""

    step: int


@dataclass(frozen=True, slots=True)
class HeldAt:
    """``pending``: the server holds the request, at its step `server_step`."""

    server_step: int


Notice = RewindAt | RejoinAt | HeldAt


def notice_of(reply: Message) -> Notice | None:
    """What `reply` tells the trainer beyond its answer, if anything."""
    extra = reply.extra
    rewind = extra.get(REWIND_FIELD)
    if isinstance(rewind, int) and not isinstance(rewind, bool):
        return RewindAt(rewind)
    rejoin = extra.get(REJOIN_FIELD)
    if type(rejoin) is int:
        return RejoinAt(rejoin)
    if extra.get(PENDING_FIELD) is True:
        server_step = extra.get(SERVER_STEP_FIELD)
        if isinstance(server_step, int):
            return HeldAt(server_step)
    return None


def entry_of(reply: Message) -> int | None:
    """The step a reply to JOIN admits the trainer at (None: it says none)."""
    entry = reply.extra.get(ENTRY_FIELD)
    if not isinstance(entry, int) or isinstance(entry, bool):
        return None
    return entry


@dataclass(frozen=True, slots=True)
class ServerState:
    """What a fetch reply says of its server's fan-in (`FANIN_FIELDS`); a field the reply
    lacks has its default."""

    server_step: int = 0
    in_fanin: bool = True
    entry_step: int = 0
    next_step: int = 0
    sync: bool = False

    @classmethod
    def of(cls, reply: Message) -> ServerState:
        """The state `reply` says, the same (immutable) one for the same fields: the trainers
        of one process keep every pserver's latest, mostly equal (at 1,000 trainers x 100
        pservers, 100,000 of them)."""
        extra = reply.extra
        key = tuple(extra.get(name) for name in FANIN_FIELDS)
        try:
            state = _STATES.get(key)
        except TypeError:  # a list or map among the values
            return cls._parse(extra)
        if state is None:
            if len(_STATES) >= _MAX_STATES:
                _STATES.clear()
            state = _STATES[key] = cls._parse(extra)
        return state

    @classmethod
    def _parse(cls, extra: Mapping[str, Any]) -> ServerState:
        return cls(_int(extra, SERVER_STEP_FIELD, 0), bool(extra.get(IN_FANIN_FIELD, True)),
                   _int(extra, ENTRY_STEP_FIELD, 0), _int(extra, NEXT_STEP_FIELD, 0),
                   bool(extra.get(SYNC_FIELD)))


UNKNOWN = ServerState()
"""The state of a server no fetch reply has come from."""

_STATES: dict[tuple[Any, ...], ServerState] = {}
_MAX_STATES = 256


def _int(extra: Mapping[str, Any], name: str, default: int) -> int:
    return int(extra.get(name, default))
