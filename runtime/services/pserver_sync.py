"""Sync mode: every trainer's gradients of a step are averaged, then applied once.

The round (`protocol.SyncRound`) classifies each request by its step and the round's phase:
gradients and send barriers of the current step are taken (a barrier carried by a trainer's last
SEND or GET of the round closes once the messages it counts are in: `SyncRound.arrive`), requests of a later step wait
(deferred, replayed when the round moves on), retries of a finished step are acknowledged as
stale. When every live trainer's send barrier is in, `advance` runs the step's update: the copies
of trainers that did not contribute are emptied, the table's pieces averaged, then the LR and
optimize blocks run, the fan-in `scale` ops with 1/contributors (the program's attribute says
1/trainers: fewer may have contributed). When every fetch barrier is in, the next step begins.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from runtime.network.wire import Message
from runtime.services.protocol import INITIAL_STEP, Closes, Event, Phase, Verdict
from runtime.services.pserver_actions import Optimize, Tally, Work
from runtime.services.pserver_messages import NotInFanIn, ProtocolViolation
from runtime.services.pserver_policy import ModePolicy, PolicyCore

log = logging.getLogger("runtime.services.pserver")


class SyncPolicy(ModePolicy):
    name: ClassVar[str] = "sync"
    sync: ClassVar[bool] = True
    rewinds: ClassVar[bool] = True

    def verdict(self, event: Event, trainer: int, msg: Message) -> Verdict:
        if msg.step > self.round.step + 1 and trainer in self.round.live:
            raise ProtocolViolation(
                f"{msg.kind} of step {msg.step} from trainer {trainer}, which this server at "
                f"step {self.round.step} has not served the parameters of step "
                f"{msg.step - 2} (a sync trainer is at most one step ahead of it)",
                reason="step_ahead")
        verdict = self.round.classify(event, trainer, msg.step)
        if verdict is Verdict.REJECT:
            reason = self.core.reject_reason(trainer, msg)
            raise (NotInFanIn if self.round.dropped(trainer) else ProtocolViolation)(reason)
        return verdict

    def __init__(self, core: PolicyCore) -> None:
        super().__init__(core)
        self.grads: dict[int, tuple[int, tuple[str, ...]]] = {}
        """Trainer -> the step of the latest gradients it sent here, and their names."""
        self.skipping: int | None = None
        """The step whose update is skipped (a trainer's values were non-finite, and
        ``on_nonfinite: skip_step``); None: none."""
        copies = self.contract.trainer_copies
        received = tuple(sorted(self.contract.received))
        self.expected: dict[int, tuple[str, ...]] = dict.fromkeys(
            range(self.contract.trainers), () if copies else received)
        """Trainer -> the vars it sends here each step (its copies; all received vars when
        there are no per-trainer copies, the one tuple for all).

        DESIGN: tuples, grouped in one pass over the copies: a pserver of a 1,000-trainer
        sync job keeps a thousand of them, mostly of one or two names."""
        by_trainer: dict[int, list[str]] = {}
        for name, owner in copies.items():
            by_trainer.setdefault(owner, []).append(name)
        for trainer, names in by_trainer.items():
            if trainer in self.expected:
                self.expected[trainer] = tuple(names)

    def barrier(self, event: Event, trainer: int, msg: Message) -> Verdict:
        verdict = self.verdict(event, trainer, msg)
        if verdict is Verdict.ACCEPT:
            if event is Event.SEND_BARRIER:
                self._check_sent(trainer, msg)
                self.round.send_barrier(trainer)
            else:
                self.round.fetch_barrier(trainer, msg.step)
        return verdict

    def _check_sent(self, trainer: int, msg: Message, names: tuple[str, ...] | None = None) -> None:
        """A send barrier closes the gradients a trainer sent of its step (`names`; None: those
        recorded): one that comes before all of them is refused, since counting it would apply
        whatever the missing grads held before (the last step's, or nothing at step 0: the
        optimize would fail)."""
        if names is None:
            names = self._sent(trainer, msg.step)
        missing = sorted(set(self.expected[trainer]).difference(names))
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ProtocolViolation(
                f"send_barrier of step {msg.step} from trainer {trainer} before its gradients "
                f"{missing[:3]}{more} of that step", var=missing[0], reason="barrier_early")

    def arrived(self, event: Event, trainer: int, msg: Message, closes: Closes | None) -> None:
        """Count a SEND or GET toward the trainer's barrier of this step, which it may carry;
        a message whose barrier would not count (a retry of a finished step, a joiner's fetch,
        the startup fetch) counts toward nothing."""
        if self._counts(event, trainer, msg):
            self.round.arrive(event, trainer, msg.id, closes)

    def check_send(self, trainer: int, msg: Message, names: list[str],
                   closes: Closes | None) -> None:
        """Refuse a SEND of `names` that would close its trainer's send barrier (the one it
        carries, or one carried before) before every gradient the trainer owes this step is
        in (`_check_sent`), however many messages the barrier says it counts."""
        if not self._counts(Event.SEND, trainer, msg) \
                or not self.round.would_close(Event.SEND, trainer, msg.id, closes):
            return
        self._check_sent(trainer, msg, self._sent(trainer, msg.step) + tuple(names))

    def _counts(self, event: Event, trainer: int, msg: Message) -> bool:
        """Whether a SEND or GET counts toward its trainer's barrier of this step."""
        barrier = Event.SEND_BARRIER if event is Event.SEND else Event.FETCH_BARRIER
        return msg.step != INITIAL_STEP and msg.step == self.round.step \
            and self.round.classify(barrier, trainer, msg.step) is Verdict.ACCEPT

    def skipped(self, trainer: int, msg: Message, names: list[str]) -> None:
        """The values count as sent (the barrier is not held up), and the step's update is
        skipped: applying the others' gradients alone would be another step than the one the
        trainers computed."""
        self._record(trainer, msg, names)
        self.skipping = msg.step

    def applied(self, trainer: int, msg: Message, names: list[str]) -> Work:
        self._record(trainer, msg, names)  # applied with the others' at the round's end
        return
        yield

    def _record(self, trainer: int, msg: Message, names: list[str]) -> None:
        """`names` of trainer `trainer` are in for `msg.step`; a tuple, as `expected` (a name
        sent twice is there twice, which `_check_sent` does not mind)."""
        self.grads[trainer] = (msg.step, self._sent(trainer, msg.step) + tuple(names))

    def _sent(self, trainer: int, step: int) -> tuple[str, ...]:
        """The gradients `trainer` has sent here of `step` so far."""
        sent_step, sent = self.grads.get(trainer, (None, ()))
        return sent if sent_step == step else ()

    def advance(self) -> Work:
        progressed = False
        if self.round.ready_to_optimize:
            yield from self._optimize()
            progressed = True
        unused = self._passes_unused()
        if unused:
            log.warning("%s: step %d passes with no update: no trainer is in the fan-in, and "
                        "those joining enter at the next", self.core.name, self.round.step)
        if self.round.take_step_done(unused):
            yield Tally("steps")
            yield from self.core.checkpoint_at(self.round.step)
            progressed = True
        return progressed

    def idle(self) -> bool:
        return not (self.round.ready_to_optimize or self.round.fetched_all
                    or self._passes_unused())

    def _passes_unused(self) -> bool:
        """`SyncRound.passes_unused`, in a running job: a server recovering from a checkpoint
        (restarted, or the job resumed) a step behind the others keeps waiting, and its trainers
        fail naming the mismatch (`StepMismatch`) rather than lose its update silently."""
        return self.core.resynced is None and self.round.passes_unused

    def _optimize(self) -> Work:
        if self.skipping == self.round.step:
            log.warning("%s: step %d's update skipped: a trainer's gradients held NaN, "
                        "infinities or out-of-range values", self.core.name, self.round.step)
            yield Tally("skipped_steps")
            self.round.optimized()
            return
        self.core.optimizing = True
        try:
            contributors = self.round.contributors
            self.store.empty_copies(set(range(self.contract.trainers)) - contributors)
            self.store.average_table(contributors)
            scale = {"scale": 1.0 / len(contributors)}
            self.core.updating()
            yield Optimize(self.contract.sync_blocks,
                           {op: scale for op in self.contract.fanin_scale_ops})
        finally:
            self.core.optimizing = False
        self.round.optimized()

    def join(self, trainer: int, entry: int) -> int:
        return self.round.join(trainer, entry)

    def in_fanin(self, trainer: int) -> bool:
        return trainer in self.round.live

    def waited_for(self) -> set[int]:
        """The live trainers whose barrier of the current phase is not in."""
        done = self.round.sent if self.round.phase is Phase.GRADS else self.round.fetched
        return self.round.live - done

    def checkpoint_step(self, step: int) -> int:
        return self.core.steps_applied()
