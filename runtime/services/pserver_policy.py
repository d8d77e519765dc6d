"""What a distributed mode decides at the pserver: the `ModePolicy` interface.

The pserver core (`pserver_core`) does what every mode does alike: dedupe, defer and replay,
liveness, the fan-in's membership, checkpoints, the typed requests and their replies. Where the
modes differ it asks the server's policy, one object per mode, each in a module of its own:

- `verdict` / `barrier`: what to do with a request of a step (act, defer, acknowledge as stale);
- `read`: the same for a GET or PREFETCH, where a mode may hold reads back (SSP);
- `arrived`: a SEND or GET taken, which may carry the round's barrier (compact protocol);
- `applied`: what follows storing a trainer's values (run the grad's blocks at once, or wait
  for the round); `skipped`: what follows values left out (non-finite);
- `advance`: move a round on when its barriers are in (the sync round's optimize);
- `served`: what follows serving a trainer the parameters (DC-ASGD keeps its backups);
- `join`, `in_fanin`, `waited_for`, `checkpoint_step`, `update_step`, `rewinds`: the fan-in's
  rules.

A new mode is one module with a subclass (registered in `pserver_core.POLICIES`) and its tests.

DESIGN: a policy sees the core through `PolicyCore`, the few things of it that the modes read
or set, not as the `pserver_core.PserverCore` class: the core imports the policies to choose
one, and the policies do not import the core back (the modules form no cycle), nor can a mode
reach into the rest of the core's state unnoticed.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Protocol

from runtime.network.wire import Message
from runtime.services.protocol import Closes, Event, SyncRound, Verdict
from runtime.services.pserver_actions import Work
from runtime.services.pserver_store import Store


class PolicyCore(Protocol):
    """What a mode's policy sees of the pserver core (`pserver_core.PserverCore` is one)."""

    optimizing: bool
    """Set by the policy while the sync round's optimize blocks run."""
    clock: Callable[[], float]
    """The server's clock (seconds; the event loop's)."""

    @property
    def name(self) -> str:
        """The server's node name, for its log."""

    @property
    def round(self) -> SyncRound:
        """The fan-in: the trainers, their barriers and the round's step."""

    @property
    def store(self) -> Store:
        """The values and the program's contract."""

    @property
    def deferred(self) -> list[tuple[str, Message]]:
        """The requests deferred until the round moves on, with their senders."""

    @property
    def resynced(self) -> set[int] | None:
        """Recovering: the trainers told to rewind, or rewound; None: not recovering."""

    def reject_reason(self, trainer: int, msg: Message) -> str:
        """Why a request of `trainer` outside the fan-in is refused."""

    def steps_applied(self) -> int:
        """The first step whose gradients the state has not seen."""

    def checkpoint_at(self, step: int) -> Work:
        """Save the periodic checkpoint if `step` is the next one due."""

    def updating(self) -> None:
        """A sync round's update is about to run (the core lets go of what pins the values)."""


class ModePolicy:
    """One distributed mode's rules; subclasses override what their mode does differently."""

    name: ClassVar[str]
    sync: ClassVar[bool] = False
    """Whether trainers are told they take part in sync rounds (in a fetch's reply)."""
    rewinds: ClassVar[bool] = False
    """Whether a recovering server makes trainers redo the steps it lost."""

    def __init__(self, core: PolicyCore) -> None:
        self.core = core
        self.round = core.round
        self.store = core.store
        self.contract = core.store.contract

    def verdict(self, event: Event, trainer: int, msg: Message) -> Verdict:
        """What to do with a SEND, GET or PREFETCH of `msg.step` (REJECT: raise)."""
        raise NotImplementedError

    def read(self, event: Event, trainer: int, msg: Message) -> Work:
        """A GET or PREFETCH: its verdict (`verdict`'s, unless the mode holds reads back, which
        may tally what it measured)."""
        return self.verdict(event, trainer, msg)
        yield

    def barrier(self, event: Event, trainer: int, msg: Message) -> Verdict:
        """A SEND_BARRIER or FETCH_BARRIER: record it if it counts, and say what to do."""
        raise NotImplementedError

    def applied(self, trainer: int, msg: Message, names: list[str]) -> Work:
        """Trainer `trainer`'s values `names` were stored: what follows."""
        raise NotImplementedError

    def check_send(self, trainer: int, msg: Message, names: list[str],
                   closes: Closes | None) -> None:
        """Raise if a SEND of `names` must be refused before anything of it is stored (a
        barrier it would close too early); by default nothing is."""

    def skipped(self, trainer: int, msg: Message, names: list[str]) -> None:
        """Trainer `trainer`'s values `names` were not stored (non-finite, with
        ``on_nonfinite: skip_step``): the update they belong to is left out. By default
        nothing follows: an asynchronous update is its SEND's alone."""

    def arrived(self, event: Event, trainer: int, msg: Message, closes: Closes | None) -> None:
        """A SEND or GET of `trainer` was taken, carrying the round's barrier (`closes`) or not
        (the compact protocol); only modes with barriers count it."""

    def advance(self) -> Work:
        """Move the round on as far as it can go now; returns whether it moved."""
        raise NotImplementedError

    def idle(self) -> bool:
        """Whether `advance` would do nothing now (yield nothing, change nothing, return
        False): the core, which moves the round on after every answered request, then need
        not ask it. False (the default) always asks; a mode overriding `advance` sees to this
        too."""
        return False

    def served(self, trainer: int, values: dict[str, object]) -> None:
        """Trainer `trainer` was sent `values` of the parameters."""

    def join(self, trainer: int, entry: int) -> int:
        """A trainer joins from step `entry`; the step it actually takes part from."""
        return entry

    def in_fanin(self, trainer: int) -> bool:
        return True

    def waited_for(self) -> set[int]:
        """The trainers whose silence drops them."""
        return set(self.round.live)

    def checkpoint_step(self, step: int) -> int:
        """The step a periodic checkpoint taken as the server reaches `step` is saved as."""
        return step

    def update_step(self, msg: Message) -> int | None:
        """If answering `msg` completes an update of a step (asynchronous SENDs): that step."""
        return None
