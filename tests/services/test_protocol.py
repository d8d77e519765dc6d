"""The sync round and dedupe state machines, in memory (no IO)."""

from __future__ import annotations

import pytest

from runtime.services.protocol import (INITIAL_STEP, Closes, Dedupe, Event, Phase, Recall,
                                      SyncRound, Verdict)


def test_a_step_goes_grads_then_params_then_next() -> None:
    r = SyncRound(2)
    assert r.classify(Event.SEND, 0, 0) is Verdict.ACCEPT
    assert r.classify(Event.GET, 0, 0) is Verdict.DEFER  # not optimized yet
    r.send_barrier(0)
    assert not r.ready_to_optimize
    r.send_barrier(1)
    assert r.ready_to_optimize
    r.optimized()
    assert r.phase is Phase.PARAMS
    assert r.classify(Event.GET, 1, 0) is Verdict.ACCEPT
    assert r.classify(Event.SEND, 0, 0) is Verdict.STALE  # a retry of an applied gradient
    assert r.classify(Event.SEND, 0, 1) is Verdict.DEFER  # a fast trainer's next step
    r.fetch_barrier(0, 0)
    assert not r.take_step_done()
    r.fetch_barrier(1, 0)
    assert r.take_step_done() and (r.step, r.phase) == (1, Phase.GRADS)
    assert r.classify(Event.SEND_BARRIER, 0, 0) is Verdict.STALE


def test_startup_fetches_are_served_and_never_counted() -> None:
    r = SyncRound(1)
    assert r.classify(Event.GET, 0, INITIAL_STEP) is Verdict.ACCEPT
    assert r.classify(Event.SEND, 0, INITIAL_STEP) is Verdict.REJECT
    r.fetch_barrier(0, INITIAL_STEP)
    assert r.fetched == set()


def test_optimizing_early_is_a_bug() -> None:
    r = SyncRound(2)
    r.send_barrier(0)
    with pytest.raises(RuntimeError, match="before every send barrier"):
        r.optimized()


def test_leaving_completes_a_barrier_that_waited_for_the_leaver() -> None:
    r = SyncRound(3)
    r.send_barrier(0)
    r.send_barrier(1)
    assert not r.ready_to_optimize
    assert r.leave(2, completed=False)
    assert r.ready_to_optimize and r.contributors == {0, 1}
    assert r.classify(Event.SEND, 2, 0) is Verdict.REJECT  # dropped: must join again
    assert not r.finished


def test_completed_trainers_end_the_round_and_cannot_return() -> None:
    r = SyncRound(2)
    r.leave(0, completed=True)
    r.leave(1, completed=True)
    assert r.finished
    assert r.classify(Event.GET, 0, INITIAL_STEP) is Verdict.REJECT
    with pytest.raises(ValueError, match="cannot join"):
        r.join(0, 5)


def test_a_joiner_enters_at_the_first_step_the_server_can_admit() -> None:
    r = SyncRound(2)
    r.leave(1, completed=False)
    r.send_barrier(0)  # step 0 is under way: too late for step 0
    assert r.entry_step() == 1
    assert r.join(1, 0) == 1
    assert r.classify(Event.SEND, 1, 1) is Verdict.DEFER  # its step has not come yet
    assert r.classify(Event.GET, 1, 0) is Verdict.DEFER  # the params step 0 leaves
    assert r.classify(Event.FETCH_BARRIER, 1, 0) is Verdict.STALE  # not counted
    assert r.classify(Event.SEND, 1, 0) is Verdict.REJECT  # it takes no part in step 0
    r.optimized()
    r.fetch_barrier(0, 0)
    assert r.take_step_done() and r.live == {0, 1}
    assert r.classify(Event.SEND, 1, 1) is Verdict.ACCEPT


def test_joining_again_moves_the_entry_later() -> None:
    r = SyncRound(2)
    r.leave(1, completed=False)
    assert r.join(1, 0) == 0 and 1 in r.live  # admitted at once: step 0 had not started
    assert r.join(1, 3) == 3 and 1 not in r.live and r.joining == {1: 3}


def test_unknown_trainers_are_rejected() -> None:
    assert SyncRound(2).classify(Event.SEND, 5, 0) is Verdict.REJECT
    with pytest.raises(ValueError, match="trainers must be >= 1"):
        SyncRound(0)


def test_dedupe_remembers_a_window_per_sender() -> None:
    d = Dedupe(window=2)
    d.remember("t0", 1, "a")
    d.remember("t0", 2, "b")
    d.remember("t1", 1, "c")
    assert d.lookup("t0", 1) == (Recall.ANSWERED, "a") and d.lookup("t1", 1) == (Recall.ANSWERED, "c")
    d.remember("t0", 3, "d")
    assert d.lookup("t0", 1) == (Recall.FORGOTTEN, None) and d.lookup("t0", 3) == (Recall.ANSWERED, "d")


def test_the_dedupe_window_holds_exactly_the_last_replies_and_refuses_older_ids() -> None:
    d = Dedupe(window=3)
    for i in range(1, 6):
        d.remember("t0", i, f"r{i}")
    assert d.held("t0") == [3, 4, 5]
    assert [d.lookup("t0", i)[0] for i in range(1, 8)] == [
        Recall.FORGOTTEN, Recall.FORGOTTEN, Recall.ANSWERED, Recall.ANSWERED, Recall.ANSWERED,
        Recall.NEW, Recall.NEW]
    d.remember("t0", 1, "late")  # a deferred request answered late is held like any other
    assert d.lookup("t0", 1) == (Recall.ANSWERED, "late") and d.held("t0") == [4, 5, 1]
    assert d.lookup("t1", 1) == (Recall.NEW, None)


def test_a_senders_replies_are_held_for_its_latest_two_steps_only() -> None:
    d = Dedupe(window=100)
    d.remember("t0", 1, "startup get", step=INITIAL_STEP)
    d.remember("t0", 2, "send@0", step=0)
    d.remember("t0", 3, "get@0", step=0)
    d.remember("t1", 1, "send@0 (t1)", step=0)
    d.remember("t0", 4, "send@1", step=1)
    assert d.held("t0") == [2, 3, 4]  # the step before the latest is kept (a heartbeat)
    d.remember("t0", 5, "send@2", step=2)
    assert d.held("t0") == [4, 5]
    assert [d.lookup("t0", i)[0] for i in range(1, 7)] == [  # its sender moved past them
        Recall.OUTRUN, Recall.OUTRUN, Recall.OUTRUN, Recall.ANSWERED, Recall.ANSWERED,
        Recall.NEW]
    assert d.lookup("t1", 1) == (Recall.ANSWERED, "send@0 (t1)")  # another sender's: kept
    d.remember("t0", 6, "heartbeat@1", step=1)  # a step already held: nothing forgotten
    assert d.held("t0") == [4, 5, 6]
    d.remember("t0", 7, "rewound send@0", step=0)  # a rewind: later steps stay until passed
    assert d.held("t0") == [4, 5, 6, 7]


def test_a_senders_value_replies_are_held_for_its_latest_step_only() -> None:
    d = Dedupe(window=10)
    d.remember("t0", 1, "get a@0", values_of=0)
    d.remember("t0", 2, "get b@0", values_of=0)
    d.remember("t0", 3, "send@1")
    d.remember("t1", 4, "get a@0 (t1)", values_of=0)
    d.remember("t0", 4, "get a@1", values_of=1)
    assert d.held("t0") == [3, 4]
    assert d.lookup("t0", 1) == (Recall.FORGOTTEN, None) == d.lookup("t0", 2)
    assert d.lookup("t1", 4) == (Recall.ANSWERED, "get a@0 (t1)")  # another sender's: kept
    assert d.lookup("t0", 3) == (Recall.ANSWERED, "send@1")


def test_a_request_of_a_later_step_lets_go_of_the_senders_older_values() -> None:
    """A trainer moves on only once every reply of its step is in: its request of the next
    step means it will never ask for those values again, and a copy of the request that
    still comes is the network's (`Recall.OUTRUN`)."""
    d = Dedupe(window=10)
    d.remember("t0", 1, "get a@0", values_of=0, step=0)
    d.remember("t1", 1, "get a@0 (t1)", values_of=0, step=0)
    d.moved_on("t0", 0)  # another request of the same step: the values stay
    assert d.lookup("t0", 1) == (Recall.ANSWERED, "get a@0")
    d.moved_on("t0", 1)
    assert d.lookup("t0", 1) == (Recall.OUTRUN, None)
    assert d.lookup("t1", 1) == (Recall.ANSWERED, "get a@0 (t1)")  # another sender's: kept
    d.remember("t0", 2, "get a@1", values_of=1, step=1)
    assert d.lookup("t0", 2) == (Recall.ANSWERED, "get a@1")
    d.remember("t0", 3, "get a@2", values_of=2, step=2)  # answered another step's values
    assert d.lookup("t0", 2) == (Recall.FORGOTTEN, None)  # not known to be past: refused
    d.moved_on("t9", 5)  # a sender never answered: nothing to let go


def test_a_late_copy_stays_known_as_one_after_the_window_drops_it() -> None:
    d = Dedupe(window=2)
    d.remember("t0", 1, "get@0", values_of=0, step=0)
    d.moved_on("t0", 1)
    d.remember("t0", 2, "send@1", step=1)
    d.remember("t0", 3, "send@1 b", step=1)  # the window drops id 1
    d.remember("t0", 4, "send@1 c", step=1)  # and id 2, not known to be past
    assert [d.lookup("t0", i)[0] for i in range(1, 6)] == [
        Recall.OUTRUN, Recall.FORGOTTEN, Recall.ANSWERED, Recall.ANSWERED, Recall.NEW]


def test_a_carried_barrier_closes_only_when_the_messages_it_counts_are_in() -> None:
    r = SyncRound(2)
    # trainer 0's round: sends 10, 11, 12; the carrier (12) arrives first, then a duplicate
    assert not r.arrive(Event.SEND, 0, 12, Closes(3, 10))
    assert not r.arrive(Event.SEND, 0, 12, Closes(3, 10))
    assert not r.arrive(Event.SEND, 0, 7, None)   # an id outside the round counts for nothing
    assert not r.arrive(Event.SEND, 0, 10, None) and r.sent == set()
    assert r.arrive(Event.SEND, 0, 11, None) and r.sent == {0}
    assert not r.arrive(Event.SEND, 1, 5, Closes(2, 4)) and not r.ready_to_optimize
    assert r.arrive(Event.SEND, 1, 4, None) and r.ready_to_optimize
    r.optimized()
    assert not r.arrive(Event.GET, 0, 14, Closes(2, 13)) and r.arrive(Event.GET, 0, 13, None)
    assert r.arrive(Event.GET, 1, 6, Closes(1, 6)) and r.take_step_done()
    assert r.step == 1 and r.arrived == {} and r.closing == {}
