"""Async mode: each gradient is applied as it arrives, with no rounds and no barriers.

A SEND is stored and its grad's block runs at once (the LR block first, where there is one);
barriers are acknowledged and otherwise ignored, every request is taken whatever its step, and
each SEND counts as an update (optimize time, the furthest step reached). A trainer that falls
silent is dropped whatever it was doing, so that one dead for good does not keep the server up.
Periodic checkpoints follow the furthest step any trainer reached.
"""

from __future__ import annotations

from typing import ClassVar

from runtime.network.wire import Kind, Message
from runtime.services.protocol import Event, Verdict
from runtime.services.pserver_actions import RunBlocks, Work
from runtime.services.pserver_policy import ModePolicy


class AsyncPolicy(ModePolicy):
    name: ClassVar[str] = "async"

    def verdict(self, event: Event, trainer: int, msg: Message) -> Verdict:
        return Verdict.ACCEPT

    def barrier(self, event: Event, trainer: int, msg: Message) -> Verdict:
        return Verdict.ACCEPT

    def applied(self, trainer: int, msg: Message, names: list[str]) -> Work:
        yield from self.core.checkpoint_at(msg.step + 1)
        yield from self.apply(trainer, names)

    def apply(self, trainer: int, names: list[str]) -> Work:
        """Run the blocks of each grad in `names`, in order."""
        for name in names:
            blocks = self.contract.grad_blocks_of(name)
            if blocks:
                yield RunBlocks(blocks)

    def advance(self) -> Work:
        return False  # nothing waits for a round
        yield

    def idle(self) -> bool:
        return True

    def update_step(self, msg: Message) -> int | None:
        return msg.step + 1 if msg.kind is Kind.SEND else None
