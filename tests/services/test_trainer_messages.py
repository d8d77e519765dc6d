"""The trainer's requests and the facts it reads from replies (`runtime.services.messages`):
each type survives the wire and reads back as the pserver parses it, and every header field
name is spelled once, in that module, which both sides read and write through."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.network.wire import Kind, Message, decode, encode
from runtime.services import messages as m
from runtime.services.protocol import Closes
from runtime.services.pserver_messages import (CheckpointNotify, Get, Join, Plain, Prefetch, Send,
                                               parse, trainer_of)

ROOT = Path(__file__).resolve().parents[2]
FIELDS = m.REQUEST_FIELDS | m.REPLY_FIELDS

FULL_REQUESTS: list[m.Request] = [
    m.SendRequest({"w@GRAD": np.ones(3, np.float32)}, merge_add=True, fetch=["w"],
                  fetch_barrier=True, closes=Closes(2, 7)),
    m.GetRequest(["w", "b"], Closes(2, 7)),
    m.PrefetchRequest({"Ids": np.arange(3, dtype=np.int64).reshape(-1, 1)}, "emb.block0"),
    m.JoinRequest(4),
    m.CheckpointRequest("/tmp/ckpt"),
    m.SEND_BARRIER, m.FETCH_BARRIER, m.COMPLETE, m.HEARTBEAT, m.BYE,
]
"""One of each request, every optional field set."""


def _wire(request: m.Request, trainer: int = 3, msg_id: int = 8) -> Message:
    """`request` as the pserver receives it: through encode and decode."""
    sent = Message.of(request.kind, msg_id, "trainer:3", 5, request.vars or {},
                      request.header(trainer))
    return decode(encode(sent))


@pytest.mark.parametrize("request_", FULL_REQUESTS, ids=lambda r: r.kind.value)
def test_every_request_round_trips_to_the_pservers_parse(request_: m.Request) -> None:
    received = _wire(request_)
    assert received.kind is request_.kind and trainer_of(received) == 3
    assert received.extra.keys() <= m.REQUEST_FIELDS
    payload = parse(received)
    if isinstance(request_, m.SendRequest):
        assert isinstance(payload, Send) and payload.merge_add
        assert payload.values.keys() == {"w@GRAD"} and payload.closes == Closes(2, 7)
        assert payload.fetch == Get(("w",), Closes(1, 8))  # the fetch barrier: its carrier's id
    elif isinstance(request_, m.GetRequest):
        assert payload == Get(("w", "b"), Closes(2, 7))
    elif isinstance(request_, m.PrefetchRequest):
        assert isinstance(payload, Prefetch) and payload.by_row and payload.table == "emb.block0"
        assert payload.ids["Ids"].ravel().tolist() == [0, 1, 2]
    elif isinstance(request_, m.JoinRequest):
        assert payload == Join(4)
    elif isinstance(request_, m.CheckpointRequest):
        assert payload == CheckpointNotify("/tmp/ckpt")
    else:
        assert payload == Plain() and received.extra == {m.TRAINER_FIELD: 3}


def test_a_plain_send_and_get_carry_only_what_they_say() -> None:
    send = parse(_wire(m.SendRequest({"g": np.zeros(2)})))
    assert send == Send(send.values, False, None, None)  # type: ignore[union-attr]
    assert parse(_wire(m.GetRequest(["w"]))) == Get(("w",))
    fetched = parse(_wire(m.SendRequest({"g": np.zeros(2)}, fetch=["w"])))
    assert isinstance(fetched, Send) and fetched.fetch == Get(("w",))
    prefetch = parse(_wire(m.PrefetchRequest({"ids": np.zeros((1, 1), np.int64)})))
    assert isinstance(prefetch, Prefetch) and not prefetch.by_row


def test_a_signal_is_only_a_request_without_fields() -> None:
    with pytest.raises(ValueError, match="without fields"):
        m.Signal(Kind.GET)


def test_the_trainers_requests_write_exactly_the_request_fields() -> None:
    written = set().union(*(r.header(0).keys() for r in FULL_REQUESTS))
    assert written == m.REQUEST_FIELDS


def _reply(**extra: Any) -> Message:
    return decode(encode(Message.of(Kind.REPLY, 8, "pserver:0", 5, {}, extra)))


def test_reply_notices_round_trip() -> None:
    assert m.notice_of(_reply(**{m.SERVER_STEP_FIELD: 5})) is None
    assert m.notice_of(_reply(**{m.SERVER_STEP_FIELD: 5, m.REWIND_FIELD: 3})) == m.RewindAt(3)
    assert m.notice_of(_reply(**{m.SERVER_STEP_FIELD: 5, m.REJOIN_FIELD: 6})) == m.RejoinAt(6)
    held = _reply(**{m.PENDING_FIELD: True, m.SERVER_STEP_FIELD: 4})
    assert m.notice_of(held) == m.HeldAt(4)
    assert m.notice_of(_reply(**{m.PENDING_FIELD: True})) is None  # no step: nothing to check
    assert m.notice_of(_reply(**{m.REWIND_FIELD: True})) is None  # a flag is not a step
    assert m.entry_of(_reply(**{m.ENTRY_FIELD: 7})) == 7
    assert m.entry_of(_reply(**{m.ENTRY_FIELD: "7"})) is None


def test_the_server_state_of_a_fetch_reply_round_trips() -> None:
    fields = dict(zip(m.FANIN_FIELDS, (9, False, 10, 4, True)))
    state = m.ServerState.of(_reply(**fields))
    assert state == m.ServerState(server_step=9, in_fanin=False, entry_step=10, next_step=4,
                                  sync=True)
    assert m.ServerState.of(_reply(**fields)) is state  # the same fields: the same state
    assert m.ServerState.of(_reply(**{m.SERVER_STEP_FIELD: 0})) == m.UNKNOWN


# -- each field name spelled once ------------------------------------------------------------------

def _sources() -> list[Path]:
    return sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "sim").rglob("*.py")])


def _extra(node: ast.AST) -> bool:
    """`node` is some message's ``extra``."""
    return isinstance(node, ast.Attribute) and node.attr == "extra"


def _spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each protocol field written as a string in `tree`: read from an
    ``extra`` (``.get``, subscript, ``in``), or a key of a dict literal handed to a message."""
    found: list[tuple[int, str]] = []

    def literal(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and node.value in FIELDS:
            found.append((node.lineno, node.value))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and _extra(func.value):
                literal(node.args[0] if node.args else None)
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            dicts = [k.value for k in node.keywords if k.arg == "extra"]
            if name in ("Message", "of", "start", "tell", "_reply"):
                dicts += node.args
                found += [(node.lineno, k.arg) for k in node.keywords if k.arg in FIELDS]
            for value in dicts:
                if isinstance(value, ast.Dict):
                    for key in value.keys:
                        literal(key)
        elif isinstance(node, ast.Subscript) and _extra(node.value):
            literal(node.slice)
        elif isinstance(node, ast.Compare) and any(_extra(c) for c in node.comparators):
            literal(node.left)
    return found


def test_no_field_name_is_spelled_outside_the_protocol_module() -> None:
    home = {ROOT / "runtime/services/messages.py", ROOT / "runtime/network/rpc.py"}
    spelled = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in _sources()
               if path not in home
               for line, name in _spelled(ast.parse(path.read_text(), str(path)))]
    assert spelled == [], "use the constants of runtime/services/messages.py"


def test_the_scan_finds_a_field_spelled_by_hand() -> None:
    tree = ast.parse('msg.extra.get("rewind"); x = msg.extra["trainer"]; "entry" in msg.extra\n'
                     'client.start(ep, kind, 0, None, {"names": []}); core._reply(msg, rejoin=3)')
    assert sorted(name for _, name in _spelled(tree)) == [
        "entry", "names", "rejoin", "rewind", "trainer"]


def _constants_used(path: Path) -> set[str]:
    """The values of the `messages` field constants that module `path` names."""
    names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
    return {getattr(m, n) for n in names if n.endswith("_FIELD") and hasattr(m, n)}


def test_the_pserver_reads_every_request_field_the_trainer_writes_and_no_other() -> None:
    read = _constants_used(ROOT / "runtime/services/pserver_messages.py")
    assert read == m.REQUEST_FIELDS


def test_the_pserver_writes_the_reply_fields_the_trainer_reads() -> None:
    written = _constants_used(ROOT / "runtime/services/pserver_core.py")
    assert "FANIN_FIELDS" in (ROOT / "runtime/services/pserver_core.py").read_text()
    assert written | set(m.FANIN_FIELDS) == m.REPLY_FIELDS | {m.FETCH_FIELD, m.TRAINER_FIELD}
