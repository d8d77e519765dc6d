"""The trainer's side of the PS protocol with no IO: events in, actions out (as the pserver's
`pserver_core`).

`TrainerCore` holds what a trainer decides from what its pservers say, apart from any event
loop or socket. Events, one method each:

- `begin_step(step)`: a step (or the startup program, `INITIAL_STEP`) begins; its requests
  carry that step;
- `closes(kind, endpoint, next_id, count)`: a SEND (GET) to `endpoint` is about to leave, the
  last of a round of `count` that carries the round's barrier or not; `end_round(kind)`: the
  round's barrier op ran; `abandoned()`: the requests in flight were given up;
- bundling (the bundled protocol): `bundle_send` and `bundle_get` (an op's vars for an
  endpoint, held back for a later op or sent with those held before), `rides` and `ridden`
  (the SEND whose reply answers the round's GET, and the recv messages that take it);
  `sends_left` and `gets_left` check that nothing held back was forgotten;
- `on_reply(endpoint, reply)`: a reply (or a pending notice) came: `None` (it is the answer,
  or the request is only held a while), `GiveUp(Rewind)` (the pserver restarted from a
  checkpoint before this step), `GiveUp(Dropped)` (a sync pserver dropped this trainer from
  its fan-in) or `Fail(StepMismatch)` (a sync pserver holds a request at a step it can never
  reach);
- `on_fetched(endpoint, reply)`: a fetch reply's fan-in state (`server_state`);
- `started(endpoints)`: the startup program ran: `Train(step)` (take part from that step) or
  `JoinAll(entry)` (ask every pserver to admit it at that step first);
- `joined(asked, replies)`: the replies to `JoinAll`: `JoinAll` again at the latest step one
  admits, `Refetch(entry)` once all admit the same, or `Fail(BadReply)`;
- `gave_up(notice)`: the step in flight was given up for a `GiveUp`'s notice; with the
  notices that came since the step began merged (the earliest rewind, the latest entry):
  `Refetch(step)` (fetch the parameters the step before leaves, then redo from `step`) or
  `JoinAll(entry)`;
- `completed(endpoint, error)`: a COMPLETE's outcome: a timeout is logged (the pserver may have
  stopped already), another error is `Fail`.

The shell (`trainer.RpcOps`, `trainer.Trainer`) sends what the actions say and feeds the
replies back; `tests/services/test_trainer_core.py` drives the core by events alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from runtime.network.rpc import RpcTimeout
from runtime.network.wire import Kind, Message
from runtime.services.messages import (UNKNOWN, HeldAt, RejoinAt, RewindAt, ServerState, entry_of,
                                       notice_of)
from runtime.services.protocol import INITIAL_STEP, Closes

log = logging.getLogger(__name__)


class Rewind(Exception):
    """A pserver restarted from the state before `step`: redo the steps from there."""

    def __init__(self, endpoint: str, step: int) -> None:
        super().__init__(f"{endpoint} restarted at step {step}")
        self.endpoint = endpoint
        self.step = step


class Dropped(Exception):
    """A sync pserver dropped this trainer from its fan-in (it heard nothing from it for
    longer than the heartbeat timeout: a pause, a partition, an overloaded machine): it joins
    again, from `step` on at the earliest."""

    def __init__(self, endpoint: str, step: int) -> None:
        super().__init__(f"{endpoint} dropped this trainer from its fan-in; it can join again "
                         f"at step {step}")
        self.endpoint = endpoint
        self.step = step


class StepMismatch(RuntimeError):
    """A sync pserver holds this trainer's request at a step it can never reach: the pservers
    (or a pserver and this trainer) disagree on the step, and waiting would hang."""

    def __init__(self, trainer: int, endpoint: str, step: int, server_step: int) -> None:
        super().__init__(f"trainer {trainer} at step {step}: {endpoint} is at step {server_step} "
                         f"and holds the request; the pservers disagree on the step")
        self.endpoint = endpoint
        self.step = step
        self.server_step = server_step


class BadReply(RuntimeError):
    """A pserver's reply lacks what the request asked for (names the endpoint and what)."""


# -- actions ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Train:
    """Take part from `step` on."""

    step: int


@dataclass(frozen=True)
class Refetch:
    """Fetch the parameters again (the startup program, at the step before `step`: the core's
    step is that already), then take part from `step` on."""

    step: int


@dataclass(frozen=True)
class JoinAll:
    """Ask every pserver to admit this trainer at step `entry` (`JoinRequest`); feed the
    replies to `TrainerCore.joined`."""

    entry: int


@dataclass(frozen=True)
class GiveUp:
    """Abandon the step in flight: raise `notice` through it, then feed it to `gave_up`."""

    notice: Rewind | Dropped


@dataclass(frozen=True)
class Fail:
    """Fail with `error`."""

    error: BaseException


class TrainerCore:
    """The decisions of one trainer's RPC ops (see the module)."""

    def __init__(self, trainer_id: int, labels: Mapping[str, str] | None = None) -> None:
        self.trainer_id = trainer_id
        self.labels = labels if labels is not None else {}
        """Endpoint -> the name its errors call it by (the RPC client's map, shared)."""
        self.step = INITIAL_STEP
        self.server_state: dict[str, ServerState] = {}
        """Endpoint -> what its last fetch reply said of its fan-in."""
        self._round_first: dict[Kind, dict[str, int]] = {Kind.SEND: {}, Kind.GET: {}}
        """SEND or GET -> endpoint -> the id of the round's first such request (a map per
        kind: no (kind, endpoint) key per endpoint and round)."""
        self._rewind_to: int | None = None
        self._entry: int | None = None
        """The earliest rewind and the latest entry asked for since the step began."""
        self._held_sends: dict[str, dict[str, Any]] = {}
        """Endpoint -> the vars of its SEND being bundled (bundled protocol)."""
        self._held_gets: dict[str, list[tuple[str, str]]] = {}
        """Endpoint -> the (var, wire name) pairs of its GET being bundled."""
        self._rides: dict[str, tuple[Any, int]] = {}
        """Endpoint -> the reply (the shell's handle) of the SEND that the round's GET there
        rode on, and how many recv messages are still to take their values from it
        (`Fetch.takers`)."""

    def _label(self, endpoint: str) -> str:
        return self.labels.get(endpoint, endpoint)

    # -- steps and rounds -------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """A step begins (a recovery, if any, is over): the requests from now carry `step`."""
        self.step = step
        self._rewind_to = self._entry = None

    def closes(self, kind: Kind, endpoint: str, next_id: int, count: int | None) -> Closes | None:
        """A SEND (GET) to `endpoint` with id `next_id` is about to leave: the round of them
        there goes on (or starts with it). `count`: it is the last of a round of that many and
        carries the round's barrier, which closes them from the round's first."""
        first = self._round_first[kind].setdefault(endpoint, next_id)
        return None if count is None else Closes(count, first)

    def end_round(self, kind: Kind) -> None:
        """The round of SENDs (GETs) is over: the next such request starts the next one."""
        self._round_first[kind].clear()

    def abandoned(self) -> None:
        """The requests in flight were given up: no round is under way, nothing is held."""
        self._held_sends, self._held_gets, self._rides = {}, {}, {}
        for firsts in self._round_first.values():
            firsts.clear()

    # -- bundling ---------------------------------------------------------------------------------
    def bundle_send(self, endpoint: str, vars: dict[str, Any],
                    hold: bool) -> dict[str, Any] | None:
        """A send op's `vars` for `endpoint`: None while the plan holds them back for a later
        op (`hold`), else them and those held back before, for one SEND."""
        bundled = self._held_sends.pop(endpoint, None)
        if bundled is not None:
            vars = {**bundled, **vars}
        if hold:
            self._held_sends[endpoint] = vars
            return None
        return vars

    def bundle_get(self, endpoint: str, pairs: list[tuple[str, str]],
                   hold: bool) -> list[tuple[str, str]] | None:
        """A recv op's (var, wire name) `pairs` for `endpoint`, as `bundle_send`'s vars."""
        pairs = self._held_gets.pop(endpoint, []) + pairs
        if hold:  # the next recv op fetches them, before any op can read them
            self._held_gets[endpoint] = pairs
            return None
        return pairs

    def rides(self, endpoint: str, reply: Any, takers: int) -> None:
        """The round's GET to `endpoint` rode on a SEND; its `reply` answers `takers` recv
        messages."""
        self._rides[endpoint] = (reply, takers)

    def ridden(self, endpoint: str) -> Any:
        """The reply of the SEND to `endpoint` that the round's GET there rode on, for one of
        the recv messages it answers (forgotten once the last has taken it)."""
        reply, takers = self._rides[endpoint]
        if takers > 1:
            self._rides[endpoint] = (reply, takers - 1)
        else:
            del self._rides[endpoint]
        return reply

    def sends_left(self) -> None:
        """Every send held back has left (before a barrier, or a wait for the sends)."""
        assert not self._held_sends, f"sends bundled for {list(self._held_sends)} never left"

    def gets_left(self) -> None:
        """Every recv held back has left (before a wait for received values)."""
        assert not self._held_gets, f"gets bundled for {list(self._held_gets)} never left"

    # -- replies ----------------------------------------------------------------------------------
    def on_reply(self, endpoint: str, reply: Message) -> GiveUp | Fail | None:
        """What `reply` (or a pending notice) from `endpoint` means beyond its answer. A sync
        pserver that holds a request while more than one step behind this trainer accepted its
        fetch barrier of the step before, so it can only be there if it lost or never had that
        step, and it would hold the request forever."""
        notice = notice_of(reply)
        if notice is None:
            return None
        if isinstance(notice, RewindAt):
            return GiveUp(Rewind(self._label(endpoint), notice.step))
        if isinstance(notice, RejoinAt):
            return GiveUp(Dropped(self._label(endpoint), notice.step))
        assert isinstance(notice, HeldAt)
        if self.server_state.get(endpoint, UNKNOWN).sync \
                and 0 <= notice.server_step < self.step - 1:
            return Fail(StepMismatch(self.trainer_id, self._label(endpoint), self.step,
                                     notice.server_step))
        return None  # held a while: the call goes on waiting

    def on_fetched(self, endpoint: str, reply: Message) -> None:
        """A fetch reply (to a GET, or a SEND carrying one) came from `endpoint`."""
        self.server_state[endpoint] = ServerState.of(reply)

    def completed(self, endpoint: str, error: BaseException | None) -> Fail | None:
        """The outcome of COMPLETE to `endpoint`: the work is finished either way, so a
        pserver whose acknowledgement never came (lost, or it stopped once every trainer had
        completed) is reported, not a failure."""
        if isinstance(error, RpcTimeout):
            log.warning("trainer %d: %s did not acknowledge COMPLETE (%s); it may have "
                        "stopped already", self.trainer_id, endpoint, error)
            return None
        return None if error is None else Fail(error)

    # -- taking part ------------------------------------------------------------------------------
    def started(self, endpoints: Sequence[str]) -> Train | JoinAll:
        """The first step this trainer takes part in, once the startup program ran: 0 when
        every pserver is at step 0, waits for it and has heard nothing from it yet; otherwise
        (it started late, was dropped or restarted, or the job resumed from checkpoints) it
        joins every pserver at the first step all of them can admit. An asynchronous one goes
        on after the latest step the pservers saw from it."""
        states = [self.server_state.get(ep, UNKNOWN) for ep in endpoints]
        seen = max((state.next_step for state in states), default=0)
        if not any(state.sync for state in states):
            return Train(seen)  # asynchronous: fresh, or restarted and going on after its last
        if all(state.in_fanin for state in states) and seen == 0 \
                and all(state.server_step == 0 for state in states):
            return Train(0)
        return JoinAll(max(state.entry_step for state in states))

    def joined(self, asked: JoinAll,
               replies: Sequence[tuple[str, Message]]) -> JoinAll | Refetch | Fail:
        """The (endpoint, reply) of each pserver to `asked`: servers that moved on admit later,
        and all are then asked for the latest; once all admit the step asked, the parameters
        the step before leaves are fetched (`Refetch`)."""
        admitted = set()
        for endpoint, reply in replies:
            entry = entry_of(reply)
            if entry is None:
                return Fail(BadReply(f"the reply of {endpoint} to JOIN lacks an int step to "
                                     f"join at: {reply.extra!r}"[:300]))
            admitted.add(entry)
        if admitted != {asked.entry}:
            return JoinAll(max(admitted))
        log.warning("trainer %d: not in the fan-in; joined at step %d", self.trainer_id,
                    asked.entry)
        self.step = asked.entry - 1
        return Refetch(asked.entry)

    def gave_up(self, notice: Rewind | Dropped) -> Refetch | JoinAll:
        """Where to go on after giving up the step in flight for `notice`. `Rewind`: a pserver
        restarted from the state before that step, so the parameters that step needs are
        fetched again and the steps from there redone (the earliest, if several pservers ask).
        `Dropped`: this trainer joins every pserver again, at the first step all of them admit;
        the steps in between went on without it.

        Either notice may come while recovering from the other (a pserver restarted while
        this trainer was cut off) and is merged with it. A rewound trainer's messages carry a
        step before the restored one, which tells the restarted pserver it redoes the lost
        steps (else it would ask for the rewind again); a dropped one joins at a step all
        admit."""
        if isinstance(notice, Rewind):
            rewind_to = self._rewind_to = notice.step if self._rewind_to is None \
                else min(self._rewind_to, notice.step)
            log.warning("trainer %d: %s; redoing from step %d", self.trainer_id, notice,
                        rewind_to)
        else:
            self._entry = notice.step if self._entry is None else max(self._entry, notice.step)
            log.warning("trainer %d: %s", self.trainer_id, notice)
        if self._rewind_to is not None:
            self.step = self._rewind_to - 1
        if self._entry is not None:
            return JoinAll(max(self._entry, self._rewind_to or 0))
        assert self._rewind_to is not None  # no Dropped: a Rewind came
        return Refetch(self._rewind_to)
