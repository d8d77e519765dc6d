"""The trainer's core (`runtime.services.trainer_core`), driven by events alone: no sockets,
no event loop. A normal sync round, a rewind, a rejoin, a step mismatch, a pending notice then
the real reply, where a trainer takes part once started, and the bundled protocol's held
requests."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.network.rpc import RpcTimeout
from runtime.network.wire import Kind, Message
from runtime.services import messages as m
from runtime.services.protocol import INITIAL_STEP, Closes
from runtime.services.trainer_core import (BadReply, Dropped, Fail, GiveUp, JoinAll, Refetch,
                                           Rewind, StepMismatch, Train, TrainerCore)

EPS = ["ep0", "ep1"]


def _core() -> TrainerCore:
    return TrainerCore(0, {"ep0": "pserver:0", "ep1": "pserver:1"})


def _reply(step: int = 0, msg_id: int = 1, **extra: Any) -> Message:
    return Message.of(Kind.REPLY, msg_id, "pserver:0", step, {},
                      {m.SERVER_STEP_FIELD: step, **extra})


def _fetched(step: int, sync: bool = True, **fields: Any) -> Message:
    return _reply(step, **{m.SYNC_FIELD: sync, m.IN_FANIN_FIELD: True, m.ENTRY_STEP_FIELD: step,
                           m.NEXT_STEP_FIELD: step, **fields})


def test_a_sync_round_closes_its_barrier_from_the_rounds_first_request() -> None:
    core = _core()
    core.begin_step(0)
    assert core.closes(Kind.SEND, "ep0", 5, None) is None  # the round's first SEND there
    assert core.closes(Kind.SEND, "ep1", 6, 1) == Closes(1, 6)
    assert core.closes(Kind.SEND, "ep0", 7, 2) == Closes(2, 5)  # the last: it carries the barrier
    assert core.on_reply("ep0", _reply(0)) is None  # an acknowledgement is the answer
    core.end_round(Kind.SEND)
    assert core.closes(Kind.GET, "ep0", 8, 1) == Closes(1, 8)  # GETs count their own rounds
    core.on_fetched("ep0", _fetched(1))
    assert core.server_state["ep0"].sync and core.server_state["ep0"].server_step == 1
    core.end_round(Kind.GET)
    core.begin_step(1)
    assert core.closes(Kind.SEND, "ep0", 9, 1) == Closes(1, 9)  # the next round starts afresh


def test_a_fresh_sync_trainer_trains_from_step_0_and_an_async_one_after_its_last() -> None:
    core = _core()
    for ep in EPS:
        core.on_fetched(ep, _fetched(0))
    assert core.started(EPS) == Train(0)
    later = _core()
    for ep in EPS:
        later.on_fetched(ep, _fetched(3, sync=False, **{m.NEXT_STEP_FIELD: 7}))
    assert later.started(EPS) == Train(7)


def test_a_rewind_gives_the_step_up_and_fetches_the_parameters_again() -> None:
    core = _core()
    core.begin_step(7)
    action = core.on_reply("ep1", _reply(4, **{m.REWIND_FIELD: 4}))
    assert isinstance(action, GiveUp) and isinstance(action.notice, Rewind)
    assert str(action.notice) == "pserver:1 restarted at step 4"
    assert core.gave_up(action.notice) == Refetch(4)
    assert core.step == 3  # its messages say it redoes the lost steps
    # a second pserver asks for a later rewind while the first is followed: the earliest wins
    assert core.gave_up(Rewind("pserver:0", 6)) == Refetch(4)
    core.begin_step(4)
    assert core.gave_up(Rewind("pserver:0", 6)) == Refetch(6)  # a new step: a new recovery


def test_a_dropped_trainer_joins_again_at_the_first_step_all_admit() -> None:
    core = _core()
    core.begin_step(5)
    action = core.on_reply("ep0", _reply(6, **{m.REJOIN_FIELD: 7}))
    assert isinstance(action, GiveUp) and isinstance(action.notice, Dropped)
    asked = core.gave_up(action.notice)
    assert asked == JoinAll(7)
    moved_on = core.joined(JoinAll(7), [("ep0", _reply(6, **{m.ENTRY_FIELD: 7})),
                                        ("ep1", _reply(7, **{m.ENTRY_FIELD: 8}))])
    assert moved_on == JoinAll(8)  # one had moved on: all are asked for the latest
    done = core.joined(JoinAll(8), [(ep, _reply(7, **{m.ENTRY_FIELD: 8})) for ep in EPS])
    assert done == Refetch(8) and core.step == 7


def test_a_rewind_while_rejoining_joins_no_earlier_than_the_rewind() -> None:
    core = _core()
    core.begin_step(9)
    assert core.gave_up(Dropped("pserver:0", 3)) == JoinAll(3)
    assert core.gave_up(Rewind("pserver:1", 6)) == JoinAll(6)
    assert core.step == 5


def test_a_late_sync_trainer_joins_at_the_latest_entry_step() -> None:
    core = _core()
    core.on_fetched("ep0", _fetched(4, **{m.IN_FANIN_FIELD: False, m.ENTRY_STEP_FIELD: 5}))
    core.on_fetched("ep1", _fetched(5, **{m.IN_FANIN_FIELD: False, m.ENTRY_STEP_FIELD: 6}))
    assert core.started(EPS) == JoinAll(6)


def test_a_join_reply_without_a_step_fails_naming_the_endpoint() -> None:
    action = _core().joined(JoinAll(3), [("ep0", _reply(3))])
    assert isinstance(action, Fail) and isinstance(action.error, BadReply)
    assert "ep0 to JOIN" in str(action.error)


def test_a_sync_pserver_two_steps_behind_holding_a_request_is_a_step_mismatch() -> None:
    core = _core()
    core.on_fetched("ep1", _fetched(3))
    core.begin_step(5)
    held = _reply(3, **{m.PENDING_FIELD: True})
    action = core.on_reply("ep1", held)
    assert isinstance(action, Fail) and isinstance(action.error, StepMismatch)
    assert "pserver:1 is at step 3" in str(action.error)
    async_core = _core()
    async_core.on_fetched("ep1", _fetched(3, sync=False))
    async_core.begin_step(5)
    assert async_core.on_reply("ep1", held) is None  # an async server may hold it (ssp)


def test_a_pending_notice_then_the_real_reply() -> None:
    core = _core()
    core.on_fetched("ep0", _fetched(4))
    core.begin_step(5)
    assert core.on_reply("ep0", _reply(4, 3, **{m.PENDING_FIELD: True})) is None  # held: wait
    assert core.on_reply("ep0", _reply(5, 3)) is None  # the answer
    core.on_fetched("ep0", _fetched(6))
    assert core.server_state["ep0"].server_step == 6


def test_the_startup_fetch_is_never_a_step_mismatch() -> None:
    core = _core()
    core.on_fetched("ep0", _fetched(0))
    core.begin_step(INITIAL_STEP)
    assert core.on_reply("ep0", _reply(0, **{m.PENDING_FIELD: True})) is None


def test_a_complete_that_times_out_is_no_failure_but_another_error_is() -> None:
    core = _core()
    assert core.completed("ep0", None) is None
    assert core.completed("ep0", RpcTimeout("trainer:0", "ep0", Kind.COMPLETE, -1, 3.0, 3)) is None
    boom = RuntimeError("boom")
    assert core.completed("ep0", boom) == Fail(boom)


def test_abandoning_forgets_the_rounds_under_way() -> None:
    core = _core()
    core.closes(Kind.SEND, "ep0", 3, None)
    core.abandoned()
    assert core.closes(Kind.SEND, "ep0", 9, 1) == Closes(1, 9)


@pytest.mark.parametrize("flag", [True, "3"])
def test_a_notice_field_of_the_wrong_type_is_no_notice(flag: object) -> None:
    core = _core()
    core.begin_step(4)
    assert core.on_reply("ep0", _reply(4, **{m.REWIND_FIELD: flag})) is None


def test_a_bundled_round_holds_vars_back_and_its_get_rides_on_the_send() -> None:
    core = _core()
    assert core.bundle_send("ep0", {"a@GRAD": 1}, hold=True) is None  # a later op sends it
    with pytest.raises(AssertionError, match="ep0.*never left"):
        core.sends_left()
    assert core.bundle_send("ep0", {"b@GRAD": 2}, hold=False) == {"a@GRAD": 1, "b@GRAD": 2}
    core.sends_left()
    core.rides("ep0", "the SEND's reply", takers=2)
    assert core.bundle_get("ep0", [("a", "a")], hold=True) is None
    with pytest.raises(AssertionError, match="gets bundled"):
        core.gets_left()
    assert core.bundle_get("ep0", [("b", "b")], hold=False) == [("a", "a"), ("b", "b")]
    assert core.ridden("ep0") == "the SEND's reply"  # two recv messages take it
    assert core.ridden("ep0") == "the SEND's reply"
    with pytest.raises(KeyError):
        core.ridden("ep0")  # forgotten once the last took it


def test_abandoning_forgets_what_was_held_back() -> None:
    core = _core()
    core.bundle_send("ep0", {"a@GRAD": 1}, hold=True)
    core.bundle_get("ep0", [("a", "a")], hold=True)
    core.rides("ep1", "reply", 1)
    core.abandoned()
    core.sends_left()
    core.gets_left()
    assert core.bundle_send("ep0", {"b@GRAD": 2}, hold=False) == {"b@GRAD": 2}
    with pytest.raises(KeyError):
        core.ridden("ep1")
