"""An insider (a trainer holding only its own key) cannot poison, bloat or confuse a pserver.

Driven through the pserver's sans-IO core (`pserver_shell.Shell`), so each test reads
exactly what the core decided; `test_hostile` sends the same kinds of message over ZeroMQ,
with a trainer's CurveZMQ key, to a live pserver that then serves a normal job:

- non-finite and out-of-range gradients: refused by default, their step's update skipped with
  ``train.on_nonfinite: skip_step``, applied with ``allow``; counted per trainer;
- a compact-protocol barrier that claims fewer messages than the trainer owes is refused before
  anything of its SEND is stored, so no step applies a gradient it did not get (at step 0 the
  update would fail, at step 1 apply the step before's again);
- requests held for later steps are bounded per sender, in number and bytes;
- refusals are logged one line per peer and window, whatever their number.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from runtime.config.metrics import PserverMetrics
from runtime.launch.launcher import nonfinite_lines
from runtime.network.refusals import RefusalLog
from runtime.network.wire import Kind, Message
from runtime.services.pserver_actions import Action, Begin, Optimize, Reject, Tally
from runtime.services.pserver_core import held_messages
from runtime.services.pserver_store import _surely_sound, out_of_range

from pserver_shell import PARAM, Shell, grad, replies


def errors(actions: list[Action]) -> list[str]:
    """The reasons of the refusals among `actions`."""
    return [getattr(a.error, "reason", None) or type(a.error).__name__
            for a in actions if isinstance(a, Reject)]


def step(shell: Shell, values: dict[int, dict[str, np.ndarray]], at: int) -> list[Action]:
    """Every trainer's SENDs of step `at` (with `values`), barriers and fetch barriers."""
    done: list[Action] = []
    for trainer, grads in values.items():
        done += shell.send(shell.message(Kind.SEND, trainer, at, grads))
        done += shell.send(shell.message(Kind.SEND_BARRIER, trainer, at))
    for trainer in values:
        done += shell.send(shell.message(Kind.FETCH_BARRIER, trainer, at))
    return done


def held(actions: list[Action]) -> bool:
    """Whether `actions` are those of a request deferred: begun, nothing answered."""
    return actions == [Begin()]


def param(shell: Shell) -> bytes:
    return np.asarray(shell.store.scope.get(PARAM)).tobytes()


POISONS = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "3e38": 3e38}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_gradient_is_refused_by_default_and_counted(poison: str) -> None:
    shell = Shell("sync")
    before = param(shell)
    bad = grad(shell, 1, 0.0)
    next(iter(bad.values())).reshape(-1)[3] = POISONS[poison]
    refused = shell.send(shell.message(Kind.SEND, 1, 0, bad))
    assert errors(refused) == ["nonfinite"]
    assert Tally("nonfinite", key=1) in refused
    assert "from trainer 1" in str(refused[-1].error) and "1 NaN" in str(refused[-1].error)
    # nothing stored: the honest trainers' step goes on, and trainer 1's barrier is not in
    assert errors(shell.send(shell.message(Kind.SEND_BARRIER, 1, 0))) == ["barrier_early"]
    assert param(shell) == before


def test_skip_step_leaves_out_the_whole_update_of_that_step_then_goes_on() -> None:
    shell = Shell("sync", on_nonfinite="skip_step")
    before = param(shell)
    bad = {name: np.full_like(value, np.nan) for name, value in grad(shell, 1, 0.0).items()}
    done = step(shell, {0: grad(shell, 0, 1.0), 1: bad}, 0)
    assert errors(done) == [] and Tally("skipped_steps") in done
    assert not any(isinstance(a, Optimize) for a in done)
    assert param(shell) == before and shell.core.round.step == 1
    done = step(shell, {0: grad(shell, 0, 1.0), 1: grad(shell, 1, 1.0)}, 1)
    assert any(isinstance(a, Optimize) for a in done)
    assert np.isfinite(np.asarray(shell.store.scope.get(PARAM))).all()
    assert param(shell) != before


def test_allow_applies_what_comes_as_before() -> None:
    shell = Shell("sync", on_nonfinite="allow")
    bad = {name: np.full_like(value, np.inf) for name, value in grad(shell, 1, 0.0).items()}
    assert errors(step(shell, {0: grad(shell, 0, 1.0), 1: bad}, 0)) == []
    assert not np.isfinite(np.asarray(shell.store.scope.get(PARAM))).all()


def test_an_asynchronous_update_of_a_poisoned_gradient_is_skipped() -> None:
    shell = Shell("async", on_nonfinite="skip_step")
    before = param(shell)
    bad = {name: np.full(value.shape, np.nan, np.float32)
           for name, value in grad(shell, 0, 0.0).items()}
    done = shell.send(shell.message(Kind.SEND, 0, 0, bad))
    assert errors(done) == [] and [m.kind for m in replies(done)] == [Kind.REPLY]
    assert param(shell) == before


def test_the_bound_is_where_a_square_would_overflow() -> None:
    assert out_of_range(np.dtype(np.float32)) == pytest.approx(1.8446742e19, rel=1e-6)
    assert np.isfinite(np.float32(out_of_range(np.dtype(np.float32))) ** 2)
    assert out_of_range(np.dtype(np.float16)) == float(np.finfo(np.float16).max)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("edge", ["bound", "half bound", "just above"])
def test_values_at_the_bound_are_judged_exactly(dtype: type, edge: str) -> None:
    """The one-pass check leaves these to the exact one: the bound itself and half of it are
    taken, the next value up is refused."""
    bound = dtype(out_of_range(np.dtype(dtype)))
    value = {"bound": bound, "half bound": bound / 2,
             "just above": np.nextafter(bound, dtype(np.inf))}[edge]
    array = np.zeros(1000, dtype)
    array[17] = -value
    with np.errstate(over="ignore"):
        assert not _surely_sound(array, float(bound)) or edge == "half bound"
    exact = bool(np.all(np.abs(array) <= float(bound)))
    assert exact == (edge != "just above")


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]), hnp.array_shapes(max_side=64),
                  elements={"allow_nan": True, "allow_infinity": True}))
def test_the_one_pass_check_never_passes_what_the_exact_one_refuses(array: np.ndarray) -> None:
    bound = out_of_range(array.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        sound = _surely_sound(array, bound)
    if sound:
        assert not np.isnan(array).any() and np.all(np.abs(array) <= bound / 2 * (1 + 1e-6))


def test_a_gradient_just_over_the_bound_is_refused_and_one_at_it_taken() -> None:
    shell = Shell("sync")
    bound = np.float32(out_of_range(np.dtype(np.float32)))
    over = grad(shell, 1, 0.0)
    next(iter(over.values())).reshape(-1)[3] = np.nextafter(bound, np.float32(np.inf))
    assert errors(shell.send(shell.message(Kind.SEND, 1, 0, over))) == ["nonfinite"]
    at = grad(shell, 1, 0.0)
    next(iter(at.values())).reshape(-1)[3] = bound
    assert errors(shell.send(shell.message(Kind.SEND, 1, 0, at))) == []


@pytest.mark.parametrize("at", [0, 1])
def test_a_barrier_that_claims_fewer_sends_than_owed_is_refused_and_stores_nothing(at: int) -> None:
    """Trainer 0 owes this server 4 gradients a step; a SEND of one of them saying
    ``barrier: 1`` would close its barrier: at step 0 the update would fail on the missing
    three, at step 1 it would apply step 0's three again."""
    shell = Shell("sync")
    if at:
        step(shell, {0: grad(shell, 0, 1.0), 1: grad(shell, 1, 1.0)}, 0)
    before = param(shell)
    one = dict([next(iter(grad(shell, 0, 2.0).items()))])
    refused = shell.send(shell.message(Kind.SEND, 0, at, one, barrier=1))
    assert errors(refused) == ["barrier_early"]
    assert not shell.core.round.sent and not shell.core.round.arrived
    # the honest messages of the step then close it as usual, to the honest result
    done = step(shell, {0: grad(shell, 0, 1.0), 1: grad(shell, 1, 1.0)}, at)
    assert errors(done) == [] and any(isinstance(a, Optimize) for a in done)
    assert param(shell) != before


def test_a_compact_barrier_carried_by_the_last_send_closes_as_before() -> None:
    shell = Shell("sync")
    for trainer in (0, 1):
        grads = list(grad(shell, trainer, 1.0).items())
        first = shell.ids + 1
        for k, (name, value) in enumerate(grads):
            extra: dict[str, Any] = {"barrier": len(grads), "barrier_from": first} \
                if k == len(grads) - 1 else {}
            assert errors(shell.send(shell.message(Kind.SEND, trainer, 0, {name: value},
                                                   **extra))) == []
    assert shell.core.round.sent == {0, 1}


def test_requests_held_for_a_later_step_are_bounded_per_sender() -> None:
    shell = Shell("sync")
    most = held_messages(shell.store.contract)
    for k in range(most):
        assert held(shell.send(shell.message(Kind.GET, 0, 1, names=[PARAM]))), k
    assert shell.core.holding["trainer:0"] == (most, 0)
    assert errors(shell.send(shell.message(Kind.GET, 0, 1, names=[PARAM]))) == ["held_too_much"]
    junk = {"x": np.zeros(2, np.float32)}  # a var that could never be stored: refused now
    assert errors(shell.send(Message(Kind.SEND, 998, "trainer:1", 1, junk, {"trainer": 1}))) \
        == ["ProtocolViolation"]
    grads = grad(shell, 1, 1.0)
    size = sum(value.nbytes for value in grads.values())
    shell.core.held_budget = (most, size - 1)  # one byte short of holding these
    refused = shell.send(shell.message(Kind.SEND, 1, 1, grads))
    assert errors(refused) == ["held_too_much"]
    shell.core.held_budget = (most, size)
    assert held(shell.send(shell.message(Kind.SEND, 1, 1, grads)))
    assert shell.core.holding["trainer:1"] == (1, size)
    # the held requests are answered once the rounds move on, and the count falls to zero
    step(shell, {0: grad(shell, 0, 1.0), 1: grad(shell, 1, 1.0)}, 0)
    step(shell, {0: grad(shell, 0, 1.0), 1: grad(shell, 1, 1.0)}, 1)
    assert "trainer:0" not in shell.core.holding


def test_a_sync_request_two_steps_ahead_is_refused() -> None:
    shell = Shell("sync")
    assert errors(shell.send(shell.message(Kind.SEND, 0, 2, grad(shell, 0, 1.0)))) \
        == ["step_ahead"]
    assert held(shell.send(shell.message(Kind.SEND, 0, 1, grad(shell, 0, 1.0))))


@pytest.mark.parametrize("kind", [Kind.REPLY, Kind.ERROR, Kind.COLLECTIVE])
def test_a_kind_no_pserver_serves_is_named(kind: Kind) -> None:
    shell = Shell("sync")
    assert errors(shell.send(shell.message(kind, 0, 0))) == ["not_a_request"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_refusals_log_one_line_per_peer_and_window(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    refusals = RefusalLog(logging.getLogger("test.refusals"), "pserver:0", interval=10.0,
                          peers=2, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for k in range(10_000):
            refusals.refused("trainer:1", "nonfinite" if k % 2 else "step_ahead", f"bad {k}")
        refusals.refused("trainer:2", "x", "first of trainer:2")
        for k in range(500):
            refusals.refused(f"stranger-{k}", "bad_header", "never logged")
        clock.now = 10.0  # the window is over: the next refusal writes its summary first
        refusals.refused("trainer:1", "nonfinite", "bad again")
        refusals.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "pserver:0: bad 0",
        "pserver:0: first of trainer:2",
        "pserver:0: 9,999 more refusals from trainer:1 in the last 10s: nonfinite 5,000, "
        "step_ahead 4,999",
        "pserver:0: 500 refusals from further peers in the last 10s (only the first 2 peers of "
        "a window are named)",
        "pserver:0: bad again",
    ]
    assert refusals.counts == {"step_ahead": 5000, "nonfinite": 5001, "x": 1, "bad_header": 500}
    assert not refusals._seen  # flushed: nothing held per peer


def test_the_summary_names_the_trainer_that_sent_nonfinite_gradients() -> None:
    pservers = [PserverMetrics(0, "a:1", nonfinite={1: 3}, skipped_steps=2),
                PserverMetrics(1, "a:2", nonfinite={1: 1, 0: 2})]
    assert nonfinite_lines(pservers) == [
        "trainer:0 sent NaN, infinite or out-of-range gradients: SENDs 2 at pserver:1; 2 step "
        "update(s) skipped",
        "trainer:1 sent NaN, infinite or out-of-range gradients: SENDs 3 at pserver:0, 1 at "
        "pserver:1; 2 step update(s) skipped"]
