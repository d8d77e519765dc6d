"""The pserver's sans-IO core, driven by events alone: no sockets, no event loop.

A `Shell` (tests/support/pserver_shell.py) stands in for `PserverService`: it performs each
action the core yields at once (blocks run through a numpy executor over the core's store,
replies recorded), so each test reads what the core asked for, in order.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import numpy as np
import pytest

from runtime.network.wire import Kind, Message, encode
from runtime.services.protocol import Dedupe, Phase, Recall
from runtime.services.pserver_actions import (Action, Begin, Optimize, Pay, Reject, Replay, Reply,
                                              RunBlocks, SaveCheckpoint, Stop, Tally, Work)
from runtime.services.pserver_core import DROPS_SUSPECT
from transpiler.distribute.contract import TRAINER_ID_VAR, ServeContract, bak_name

from pserver_shell import GRAD, PARAM, SHAPE, Shell, grad, kinds, programs, replies


# -- sync ---------------------------------------------------------------------------------------------

def test_a_sync_round_closes_only_after_every_trainers_send_barrier() -> None:
    shell = Shell("sync")
    for trainer in (0, 1):
        shell.send(shell.message(Kind.SEND, trainer, 0, grad(shell, trainer, 1.0)))
    first = shell.send(shell.message(Kind.SEND_BARRIER, 0, 0))
    assert kinds(first) == [Begin, Pay, Reply] and shell.core.round.phase is Phase.GRADS
    last = shell.send(shell.message(Kind.SEND_BARRIER, 1, 0))
    optimize = [a for a in last if isinstance(a, Optimize)]
    assert len(optimize) == 1 and optimize[0].blocks == shell.store.contract.sync_blocks
    assert shell.core.round.phase is Phase.PARAMS
    for trainer in (0, 1):
        shell.send(shell.message(Kind.FETCH_BARRIER, trainer, 0))
    assert (shell.core.round.step, shell.core.round.phase) == (1, Phase.GRADS)


def test_the_round_averages_over_the_trainers_that_contributed() -> None:
    shell = Shell("sync")
    before = shell.store.scope.get(PARAM).copy()
    shell.send(shell.message(Kind.SEND, 0, 0, grad(shell, 0, 1.0)))
    shell.send(shell.message(Kind.SEND, 1, 0, grad(shell, 1, 3.0)))
    shell.send(shell.message(Kind.SEND_BARRIER, 0, 0))
    last = shell.send(shell.message(Kind.SEND_BARRIER, 1, 0))
    (optimize,) = [a for a in last if isinstance(a, Optimize)]
    assert set(optimize.overrides) == set(shell.store.contract.fanin_scale_ops)
    assert all(attrs == {"scale": 0.5} for attrs in optimize.overrides.values())
    np.testing.assert_array_equal(shell.store.scope.get(PARAM), before - np.float32(0.5 * 2.0))


def test_a_dropped_trainer_leaves_the_round_and_its_copy_counts_as_zero() -> None:
    shell = Shell("sync")
    before = shell.store.scope.get(PARAM).copy()
    shell.send(shell.message(Kind.SEND, 1, 0, grad(shell, 1, 9.0)))  # never barriered
    shell.send(shell.message(Kind.SEND, 0, 0, grad(shell, 0, 2.0)))
    shell.send(shell.message(Kind.SEND_BARRIER, 0, 0))
    shell.now = 11.0  # trainer 1 silent for longer than the heartbeat timeout
    shell.send(shell.message(Kind.HEARTBEAT, 0, 0))
    ticked = shell.drive(shell.core.on_tick())
    assert ticked[0] == Tally("dropped", 1)
    (optimize,) = [a for a in ticked if isinstance(a, Optimize)]
    assert all(attrs == {"scale": 1.0} for attrs in optimize.overrides.values())
    np.testing.assert_array_equal(shell.store.scope.get(f"{GRAD}.trainer_1"), np.zeros(SHAPE))
    np.testing.assert_array_equal(shell.store.scope.get(PARAM), before - np.float32(0.5 * 2.0))
    scale_op = shell.program.block(optimize.blocks[-1]).ops[1]
    assert scale_op.type == "scale" and scale_op.attr("scale") == 0.5  # the program is as written


def test_a_pause_of_the_server_itself_is_not_counted_as_the_trainers_silence() -> None:
    """A server that was not running (the machine paused or overloaded: its watchdog woke
    `paused` seconds late) could not hear the heartbeats sent meanwhile; they wait unread.
    Silence is counted in time it was listening, so nobody is dropped for its own pause, and a
    trainer silent for the timeout on top of the pause still is."""
    shell = Shell("sync")
    for trainer in (0, 1):
        shell.send(shell.message(Kind.HEARTBEAT, trainer, 0))
    shell.now = 30.0  # 30 s later, 25 of them paused
    assert shell.drive(shell.core.on_tick(paused=25.0)) == []
    shell.send(shell.message(Kind.HEARTBEAT, 0, 0))  # what waited unread
    shell.now = 36.0  # trainer 1 silent 11 s of the server's running time
    assert shell.drive(shell.core.on_tick())[0] == Tally("dropped", 1)
    assert shell.core.round.live == {0}


def test_a_dropped_trainer_that_speaks_again_is_told_to_join_not_refused() -> None:
    """Dropped for its silence, a trainer that was only paused (or cut off) sends on: it gets
    a notice to join again at the first step it can, where a trainer that completed, or one
    of another job, gets an error."""
    shell = Shell("sync")
    shell.send(shell.message(Kind.HEARTBEAT, 1, 0))
    shell.now = 11.0  # trainer 1 silent for longer than the heartbeat timeout
    shell.send(shell.message(Kind.HEARTBEAT, 0, 0))
    assert Tally("dropped", 1) in shell.drive(shell.core.on_tick())
    (notice,) = replies(shell.send(shell.message(Kind.SEND, 1, 0, grad(shell, 1, 1.0))))
    assert notice.kind is Kind.REPLY and notice.extra["rejoin"] == shell.core.round.entry_step()
    shell.send(shell.message(Kind.COMPLETE, 0, 0))
    refused = shell.send(shell.message(Kind.SEND, 0, 1, grad(shell, 0, 1.0)))
    assert kinds(refused) == [Begin, Reject] and "already completed" in str(refused[1].error)


def test_a_trainer_dropped_again_and_again_makes_the_server_say_the_timeout_is_short(
        caplog: pytest.LogCaptureFixture) -> None:
    """Each drop but the first follows a return, so the trainer was alive: the third time the
    server says, once, that the heartbeat timeout is shorter than a live trainer's silences
    (a sync job whose timeout is below a round trip mostly drops and rejoins)."""
    shell = Shell("sync")
    with caplog.at_level(logging.WARNING, "runtime.services.pserver"):
        for _ in range(DROPS_SUSPECT + 2):
            shell.core._count_drop(1)
        shell.core._count_drop(0)
    said = [r.getMessage() for r in caplog.records if "heartbeat timeout" in r.getMessage()]
    assert said == [f"pserver:0: trainer 1 dropped {DROPS_SUSPECT} times, back each time: the "
                    "heartbeat timeout (10s, train.heartbeat_timeout) is shorter than a live "
                    "trainer's silences here; raise it"]


def test_a_step_nobody_can_take_part_in_passes_with_no_update() -> None:
    """Every trainer dropped here, and each joins again at step 1, where another pserver
    already is (joining, a trainer asks every pserver for the latest step any can admit it at).
    Nobody is left to send this server's step 0, so it passes with no update rather than hang
    the job; step 1 waits for both trainers again. Servers further apart than a step (as
    resumed from checkpoints of different steps) still wait: test_checkpoint.py."""
    shell = Shell("sync")
    before = shell.store.scope.get(PARAM).copy()
    shell.now = 61.0  # neither heard from within the start-up grace
    assert [a for a in shell.drive(shell.core.on_tick()) if isinstance(a, Tally)] == [
        Tally("dropped", 0), Tally("dropped", 1)]
    for trainer in (0, 1):
        (reply,) = replies(shell.send(shell.message(Kind.JOIN, trainer, 0, entry=1)))
        assert reply.extra["entry"] == 1
    assert (shell.core.round.step, shell.core.round.live) == (1, {0, 1})
    np.testing.assert_array_equal(shell.store.scope.get(PARAM), before)
    for trainer in (0, 1):
        shell.send(shell.message(Kind.SEND, trainer, 1, grad(shell, trainer, 1.0)))
    last = shell.send(shell.message(Kind.SEND_BARRIER, 0, 1))
    assert not any(isinstance(a, Optimize) for a in last)  # trainer 1's barrier is awaited
    assert any(isinstance(a, Optimize) for a in shell.send(shell.message(Kind.SEND_BARRIER, 1, 1)))


def test_a_retry_proves_its_trainer_alive() -> None:
    """A retry of a deferred request (answered `pending`) or of one already answered reaches
    the server from a live trainer as surely as a heartbeat does."""
    shell = Shell("sync")
    get = shell.message(Kind.GET, 0, 0, names=[PARAM])
    shell.send(get)  # deferred until the round's update
    beat = shell.message(Kind.HEARTBEAT, 1, 0)
    shell.send(beat)
    shell.now = 8.0
    assert replies(shell.send(get))[0].extra["pending"] is True
    assert replies(shell.send(beat))  # answered again from the cache
    shell.now = 16.0  # 16 s after the first messages, 8 s after the retries
    assert shell.drive(shell.core.on_tick()) == []


def test_a_get_of_the_running_step_is_deferred_then_replayed_after_the_update() -> None:
    shell = Shell("sync")
    get = shell.message(Kind.GET, 0, 0, names=[PARAM])
    assert shell.send(get) == [Begin()]  # deferred: no reply yet
    retry = shell.send(get)
    assert replies(retry)[0].extra["pending"] is True
    for trainer in (0, 1):
        shell.send(shell.message(Kind.SEND, trainer, 0, grad(shell, trainer, 1.0)))
    shell.send(shell.message(Kind.SEND_BARRIER, 0, 0))
    last = shell.send(shell.message(Kind.SEND_BARRIER, 1, 0))
    after = kinds(last)[kinds(last).index(Optimize):]
    assert after == [Optimize, Replay, Begin, Pay, Reply, Replay]
    answer = replies(last)[-1]
    assert answer.id == get.id
    np.testing.assert_array_equal(answer.vars[PARAM], shell.store.scope.get(PARAM))
    assert replies(shell.send(get))[0] is answer  # a retry now gets the same reply


def test_a_fast_trainers_next_step_waits_for_the_round_to_move_on() -> None:
    shell = Shell("sync")
    for trainer in (0, 1):
        shell.send(shell.message(Kind.SEND, trainer, 0, grad(shell, trainer, 1.0)))
        shell.send(shell.message(Kind.SEND_BARRIER, trainer, 0))
    shell.send(shell.message(Kind.FETCH_BARRIER, 0, 0))
    early = shell.message(Kind.SEND, 0, 1, grad(shell, 0, 5.0))
    assert shell.send(early) == [Begin()]
    closing = shell.send(shell.message(Kind.FETCH_BARRIER, 1, 0))
    assert Tally("steps") in closing
    assert replies(closing)[-1].id == early.id and shell.core.round.step == 1
    np.testing.assert_array_equal(shell.store.scope.get(f"{GRAD}.trainer_0"), np.full(SHAPE, 5.0))


def test_a_trainer_outside_the_job_is_refused_with_the_reason() -> None:
    shell = Shell("sync")
    actions = shell.send(shell.message(Kind.SEND, 5, 0, grad(shell, 0, 1.0)))
    (reject,) = [a for a in actions if isinstance(a, Reject)]
    assert "trainer 5 is not one of the 2 trainers" in str(reject.error)


def test_the_round_stops_once_every_trainer_completed() -> None:
    shell = Shell("sync")
    assert Stop() not in shell.send(shell.message(Kind.COMPLETE, 0, 0))
    assert Stop() in shell.send(shell.message(Kind.COMPLETE, 1, 0))


def test_the_server_stops_without_draining_once_every_completed_trainer_said_bye() -> None:
    shell = Shell("sync")
    shell.send(shell.message(Kind.COMPLETE, 0, 0))
    assert shell.send(shell.message(Kind.BYE, 0, 0)) == []  # trainer 1 still trains
    assert shell.send(shell.message(Kind.COMPLETE, 1, 0))[-1] == Stop(drain=True)
    assert shell.send(shell.message(Kind.BYE, 1, 0)) == [Stop(drain=False)]


def test_a_round_finished_by_a_drop_after_the_others_said_bye_stops_without_draining() -> None:
    shell = Shell("sync")
    shell.send(shell.message(Kind.HEARTBEAT, 1, 0))
    shell.send(shell.message(Kind.COMPLETE, 0, 0))
    shell.send(shell.message(Kind.BYE, 0, 0))
    shell.now += 11.0  # trainer 1 silent past the heartbeat timeout
    assert shell.drive(shell.core.on_tick())[-1] == Stop(drain=False)


def ignored(actions: list[Action]) -> bool:
    """Whether `actions` are a BYE's refusal: counted, unanswered."""
    return [(type(a), a.answered, a.error.reason) for a in actions
            if isinstance(a, Reject)] == [(Reject, False, "bye_ignored")] and len(actions) == 1


def test_a_bye_is_neither_answered_nor_remembered_and_only_a_completed_trainers_counts() -> None:
    shell = Shell("sync", trainers=1)
    not_completed = shell.message(Kind.BYE, 0, 0)
    assert ignored(shell.send(not_completed))
    assert shell.core.departed == set()
    shell.send(shell.message(Kind.COMPLETE, 0, 0))
    impostor = Message(Kind.BYE, 99, "trainer:7", 0, {}, {"trainer": 0})
    no_trainer = Message(Kind.BYE, 98, "trainer:0", 0, {}, {})
    assert ignored(shell.send(impostor)) and ignored(shell.send(no_trainer))
    assert shell.core.departed == set()
    assert shell.send(not_completed) == [Stop(drain=False)]  # its id, not remembered, again
    assert shell.core.dedupe.lookup("trainer:0", not_completed.id)[0] is Recall.NEW


def test_a_periodic_checkpoint_is_saved_as_the_round_reaches_its_step() -> None:
    shell = Shell("sync", trainers=1, checkpoint_every=1)
    shell.send(shell.message(Kind.SEND, 0, 0, grad(shell, 0, 1.0)))
    shell.send(shell.message(Kind.SEND_BARRIER, 0, 0))
    closing = shell.send(shell.message(Kind.FETCH_BARRIER, 0, 0))
    assert SaveCheckpoint(1) in closing


def describe(actions: list[Action]) -> list[Any]:
    """The actions, a reply as its message's fields but its values (arrays do not compare)."""
    return [(type(a).__name__, a.peer, a.message.kind, a.message.id, a.message.step,
             sorted(a.message.vars), a.message.extra) if isinstance(a, Reply) else a
            for a in actions]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_idle_round_is_not_asked_to_advance_and_that_changes_nothing(mode: str) -> None:
    """After each request the core moves the round on, asking the policy's `advance` only if
    it is not `idle`: whenever it says so `advance` indeed does nothing, and a server that
    always asks answers every request with the same actions."""
    skipping, asking = Shell(mode), Shell(mode)
    policy = asking.core.policy
    advance, idle = policy.advance, policy.idle
    idle_asked = []

    def checked_advance() -> Work:
        was_idle = idle()
        moved = yield from advance()
        assert not (was_idle and moved)
        idle_asked.append(was_idle)
        return moved

    policy.advance, policy.idle = checked_advance, lambda: False  # type: ignore[method-assign]
    get = {"names": [PARAM]}
    script: list[tuple[Kind, int, int, dict[str, Any]]] = [
        (Kind.GET, 0, 0, get), (Kind.SEND, 0, 0, {}), (Kind.SEND_BARRIER, 0, 0, {}),
        (Kind.SEND, 1, 0, {}), (Kind.SEND, 0, 1, {}), (Kind.SEND_BARRIER, 1, 0, {}),
        (Kind.GET, 1, 0, get), (Kind.FETCH_BARRIER, 0, 0, {}), (Kind.FETCH_BARRIER, 1, 0, {}),
        (Kind.COMPLETE, 0, 1, {}), (Kind.COMPLETE, 1, 1, {})]
    for kind, trainer, step, extra in script:
        got = [shell.send(shell.message(kind, trainer, step, grad(shell, trainer, 1.0)
                                        if kind is Kind.SEND else None, **extra))
               for shell in (skipping, asking)]
        assert describe(got[0]) == describe(got[1])
    assert Stop() in got[0] and True in idle_asked and (mode == "async" or False in idle_asked)


# -- asynchronous modes
# ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, policy", [("async", "async"), ("half_async", "half_async")])
def test_async_applies_each_send_at_once(mode: str, policy: str) -> None:
    shell = Shell(mode)
    assert shell.core.policy.name == policy
    before = shell.store.scope.get(PARAM).copy()
    actions = shell.send(shell.message(Kind.SEND, 1, 3, {GRAD: np.ones(SHAPE, np.float32)}))
    blocks = shell.store.contract.grad_blocks_of(GRAD)
    assert actions[:3] == [Begin(), RunBlocks(blocks), Pay(update_step=4)]
    assert kinds(actions)[3:] == [Reply]
    np.testing.assert_array_equal(shell.store.scope.get(PARAM), before - np.float32(0.5))
    barrier = shell.send(shell.message(Kind.SEND_BARRIER, 1, 3))
    assert kinds(barrier) == [Begin, Pay, Reply]  # acknowledged, nothing waits for it


def test_geo_adds_each_delta_to_the_parameter_as_it_comes() -> None:
    shell = Shell("geo", transpiler="geo_push_every: 2")
    assert shell.core.policy.name == "geo"
    before = shell.store.scope.get(PARAM).copy()
    delta = np.full(SHAPE, 0.25, np.float32)
    actions = shell.send(shell.message(Kind.SEND, 0, 1, {f"{PARAM}.delta": delta}))
    (run,) = [a for a in actions if isinstance(a, RunBlocks)]
    assert run.blocks == (shell.store.contract.grad_blocks[f"{PARAM}.delta"],)  # no LR block
    np.testing.assert_array_equal(shell.store.scope.get(PARAM), before + delta)


def test_dc_asgd_keeps_what_each_trainer_fetched_and_names_the_trainer_it_applies() -> None:
    shell = Shell("async", transpiler="dc_asgd: true")
    assert shell.core.policy.name == "dc_asgd"
    fetched = replies(shell.send(shell.message(Kind.GET, 1, 0, names=[PARAM])))[0]
    np.testing.assert_array_equal(shell.store.scope.get(bak_name(PARAM, 1)), fetched.vars[PARAM])
    shell.send(shell.message(Kind.SEND, 1, 0, {GRAD: np.ones(SHAPE, np.float32)}))
    assert shell.store.scope.get(TRAINER_ID_VAR).tolist() == [1]


def test_async_modes_never_defer() -> None:
    shell = Shell("async")
    get = shell.send(shell.message(Kind.GET, 0, 7, names=[PARAM]))
    assert replies(get)[0].extra["sync"] is False and replies(get)[0].extra["in_fanin"] is True


def test_fetches_of_the_same_tensors_share_one_values_map() -> None:
    shell = Shell("async")
    first, second = (replies(shell.send(shell.message(Kind.GET, t, 0, names=[PARAM])))[0]
                     for t in (0, 1))
    assert second.vars is first.vars and list(first.vars) == [PARAM]
    shell.send(shell.message(Kind.SEND, 0, 0, grad(shell, 0, 1.0)))  # a new value
    third = replies(shell.send(shell.message(Kind.GET, 1, 1, names=[PARAM])))[0]
    assert third.vars[PARAM] is shell.store.scope.get_tensor(PARAM)
    assert (third.vars is first.vars) == (first.vars[PARAM] is third.vars[PARAM])


# -- the contract
# ---------------------------------------------------------------------------------------

def test_the_transpiler_says_which_trainer_sends_which_copy_and_where_the_fanin_scales_are() -> None:
    program, _ = programs("sync")
    contract = ServeContract.of(program)
    assert {name: t for name, t in contract.trainer_copies.items() if name.startswith(GRAD)} == \
        {f"{GRAD}.trainer_0": 0, f"{GRAD}.trainer_1": 1}
    for block, op in contract.fanin_scale_ops:
        assert program.block(block).ops[op].type == "scale"
        assert program.block(block).ops[op - 1].type == "sum"
    assert len(contract.fanin_scale_ops) == 4  # one per param (no slicing, one pserver)
    single = ServeContract.of(programs("async")[0])
    assert not single.trainer_copies and not single.fanin_scale_ops


# -- the compact protocol: barriers carried by the round's last SEND / GET -----------------------------
def split_sends(shell: Shell, trainer: int, step: int, first_id: int) -> list[Message]:
    """`trainer`'s gradients of `step` as one SEND per var, the last carrying the send barrier."""
    grads = sorted(grad(shell, trainer, 1.0 + trainer).items())
    last = len(grads) - 1
    return [shell.message(Kind.SEND, trainer, step, {name: value}, msg_id=first_id + i,
                          **({"barrier": len(grads), "barrier_from": first_id} if i == last else {}))
            for i, (name, value) in enumerate(grads)]


def test_a_duplicated_or_reordered_carried_barrier_never_closes_the_round_early() -> None:
    shell = Shell("sync")
    sends = {t: split_sends(shell, t, 0, 100 * (t + 1)) for t in (0, 1)}
    assert len(sends[0]) >= 2
    carrier = sends[0][-1]
    for attempt in range(2):  # the carrier first (reordered), then again (a retry)
        assert Optimize not in kinds(shell.send(carrier))
        assert shell.core.round.sent == set()
    for msg in sends[1]:
        shell.send(msg)
    assert shell.core.round.sent == {1} and shell.core.round.phase is Phase.GRADS
    for msg in sends[0][:-1]:
        done = shell.send(msg)
    assert Optimize in kinds(done) and shell.core.round.phase is Phase.PARAMS
    gets = {t: shell.message(Kind.GET, t, 0, names=[PARAM], msg_id=1000 * (t + 1), barrier=1)
            for t in (0, 1)}
    shell.send(gets[0])
    assert shell.core.round.fetched == {0}
    assert replies(shell.send(gets[0]))[0].id == gets[0].id  # a retry: same reply, counted once
    closing = shell.send(gets[1])
    assert Tally("steps") in closing and shell.core.round.step == 1
    assert shell.core.round.arrived == {} and shell.core.round.closing == {}


def test_a_carried_barrier_counts_only_the_messages_of_its_round() -> None:
    """A send of an abandoned attempt (id below `barrier_from`) is not one of the round's."""
    shell = Shell("sync")
    old = split_sends(shell, 0, 0, 10)
    shell.send(old[0])  # then trainer 0 abandoned the step (a rewind) and redid it
    redone = split_sends(shell, 0, 0, 20)
    shell.send(redone[-1])
    assert shell.core.round.sent == set()
    for msg in redone[:-1]:
        shell.send(msg)
    assert shell.core.round.sent == {0}


def test_a_retried_acknowledgement_is_the_first_one_again_held_as_its_step_alone() -> None:
    shell = Shell("sync")
    send = shell.message(Kind.SEND, 0, 0, grad(shell, 0, 1.0))
    (first,) = replies(shell.send(send))
    assert shell.core.dedupe.lookup(send.src, send.id)[1] == 0  # the step, not the message
    (again,) = replies(shell.send(send))
    assert again == first and encode(again) == encode(first)
    join = shell.message(Kind.JOIN, 1, 0, entry=0)
    (joined,) = replies(shell.send(join))
    assert shell.core.dedupe.lookup(join.src, join.id)[1] is joined  # fields of its own: as is
    assert replies(shell.send(join))[0] is joined


def test_a_retry_of_a_reply_no_longer_held_gets_an_error_naming_it() -> None:
    """A request whose reply fell out of the dedupe window, its sender not known to have
    moved past it: the pserver cannot answer it again and will not handle it twice."""
    shell = Shell("sync")
    shell.core.dedupe = Dedupe(window=2)
    send = shell.message(Kind.SEND, 0, 0, grad(shell, 0, 1.0), msg_id=6)
    shell.send(send)
    for msg_id in (7, 8):  # two more requests of the same step: the SEND's reply is dropped
        shell.send(shell.message(Kind.HEARTBEAT, 0, 0, msg_id=msg_id))
    assert shell.core.dedupe.lookup(send.src, send.id)[0] is Recall.FORGOTTEN
    refused = shell.send(send)
    assert kinds(refused) == [Reject]
    assert "send id 6 from 'trainer:0' (step 0): a retry" in str(refused[0].error)


def test_a_late_copy_of_a_request_its_trainer_moved_past_is_ignored_not_refused() -> None:
    """A trainer moves on only once every reply of its step is in: a copy of one of its
    requests that arrives after its request of a later step is the network's (a duplicate
    delivered late), and nobody waits for its answer. The values the GET's reply held are let
    go at the next step's first request, so the round's update may write them in place."""
    shell = Shell("sync")
    get = shell.message(Kind.GET, 0, -1, names=[PARAM])
    (reply,) = replies(shell.send(get))
    assert reply.vars[PARAM] is shell.store.scope.get(PARAM)  # held by the reply
    shell.send(shell.message(Kind.SEND, 0, 0, grad(shell, 0, 1.0)))
    assert shell.core.dedupe.lookup(get.src, get.id)[0] is Recall.OUTRUN
    late = shell.send(get)
    assert kinds(late) == [Tally] and late[0].stat == "late_copies"
    assert shell.core.dedupe.held(get.src) == [get.id + 1]  # the SEND's reply alone


def test_a_sync_rounds_update_writes_the_parameter_in_place_once_every_trainer_moved_on() -> None:
    """Every trainer fetched the parameter (its reply held for a retry, pinning the array)
    and then sent its gradients of the next step: nothing holds the array any more, so the
    round's sgd subtracts into it (a [256, 128] weight: above `MIN_BYTES`) with the numbers
    of a new one."""
    shell = Shell("sync", model="{name: mlp, sizes: [8, 256, 128], "
                                "optimizer: {type: sgd, learning_rate: 0.5}}")
    param = weakref.ref(shell.store.scope.get(PARAM))  # the test must not pin it either
    expected = shell.store.scope.get(PARAM) - np.float32(0.5 * 2.0)
    assert expected.shape == (256, 128)
    for trainer in (0, 1):
        assert replies(shell.send(shell.message(Kind.GET, trainer, -1, names=[PARAM])))
    for trainer, value in ((0, 1.0), (1, 3.0)):
        shell.send(shell.message(Kind.SEND, trainer, 0, grad(shell, trainer, value)))
    for trainer in (0, 1):
        shell.send(shell.message(Kind.SEND_BARRIER, trainer, 0))
    assert shell.core.round.phase is Phase.PARAMS
    assert shell.store.scope.get(PARAM) is param()
    np.testing.assert_array_equal(shell.store.scope.get(PARAM), expected)


def test_a_retried_heartbeat_no_longer_held_is_acknowledged_again_not_refused() -> None:
    """A heartbeat changes nothing here, so a retry of one whose reply was let go (its
    trainer has sent requests of two later steps since, as a slow link or a busy machine) is
    answered again as it was the first time: the trainer's heartbeats run beside its steps,
    so it may still be waiting for that one, where a later step's request shows that any
    other request of the step before is answered."""
    shell = Shell("sync")
    beat = shell.message(Kind.HEARTBEAT, 0, 0)
    (first,) = replies(shell.send(beat))
    for step in (1, 2):  # its later heartbeats, of two later steps
        shell.send(shell.message(Kind.HEARTBEAT, 0, step))
    assert shell.core.dedupe.lookup(beat.src, beat.id)[0] is Recall.OUTRUN
    again = shell.send(beat)
    assert kinds(again) == [Reply] and again[0].heartbeat
    assert again[0].message.kind is Kind.REPLY and again[0].message.id == beat.id
    assert again[0].message.extra == {"server_step": shell.core.round.step}


def test_a_send_carrying_the_rounds_get_is_answered_with_the_values_after_the_update() -> None:
    """The bundled protocol: each trainer's one SEND carries both barriers and the GET. The
    first is deferred (its gradients taken once, a retry gets a pending notice), the second
    closes the round; both are answered with the updated values, and the step moves on."""
    shell = Shell("sync")
    sends = {t: shell.message(Kind.SEND, t, 0, grad(shell, t, 1.0 + t), barrier=1,
                              fetch=[PARAM], fetch_barrier=1) for t in (0, 1)}
    first = shell.send(sends[0])
    assert Reply not in kinds(first) and shell.core.round.sent == {0}
    assert replies(shell.send(sends[0]))[0].extra["pending"] is True
    last = shell.send(sends[1])
    assert kinds(last).count(Optimize) == 1 and Tally("steps") in last
    answers = {m.id: m for m in replies(last)}
    assert set(answers) == {sends[0].id, sends[1].id}
    for answer in answers.values():
        np.testing.assert_array_equal(answer.vars[PARAM], shell.store.scope.get(PARAM))
    assert (shell.core.round.step, shell.core.round.phase) == (1, Phase.GRADS)
    assert replies(shell.send(sends[0]))[0] is answers[sends[0].id]  # a retry: the same reply
