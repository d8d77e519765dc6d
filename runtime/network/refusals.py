"""Refusals logged so that no peer can flood the log: the first of each peer in full, then a
count.

A node refuses what it must not act on: a handshake with a key that is not the job's, a message
over the limits, a malformed or hostile request. Each is worth a line when it happens once; a
peer that sends ten thousand of them must not write ten thousand lines (megabytes of log, and
the node's time spent writing them). `RefusalLog` logs the first refusal of each peer in a
window of `interval` seconds in full, counts the rest, and when the window is over writes one
line per peer that had more ("12,345 more refusals from trainer:1 in the last 10s: not_own_var
12,000, held_too_much 345"). At most `peers` peers are tracked per window; refusals from any
further peer are counted together in one line. The totals by reason (`counts`, a few dozen
reasons at most) are kept for the run's record.

DESIGN: the window is one for all peers and its state is cleared when it ends, so what is held
is bounded by `peers` whatever the number of distinct senders (an outsider can claim a new name
with every message). A window's summary is written when the next refusal after it comes, or at
`flush` (a node calls it as it stops), so a quiet node costs nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.network.wire import MAX_VAR, clip

INTERVAL = 10.0
"""Seconds of one window: a peer's refusals beyond its first in it are summarised."""
PEERS = 32
"""Peers tracked in one window (their first refusal logged in full)."""
REASONS = 64
"""Distinct reasons counted by name; further ones are counted as ``other``."""


@dataclass
class _Seen:
    """A peer's refusals in the current window beyond its first, by reason."""

    more: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class RefusalLog:
    """The refusals of one node (see the module)."""

    def __init__(self, logger: logging.Logger, node: str, interval: float = INTERVAL,
                 peers: int = PEERS, clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.node = node
        self.interval = interval
        self.peers = peers
        self.clock = clock
        self.counts: dict[str, int] = {}
        """Reason -> refusals over the node's life."""
        self._seen: dict[str, _Seen] = {}
        self._unnamed = 0
        """Refusals in this window from peers beyond the `peers` tracked."""
        self._ends = -math.inf

    def refused(self, peer: str, reason: str, text: str) -> None:
        """Count a refusal of `peer`'s for `reason`; log `text` if it is the peer's first in
        this window."""
        now = self.clock()
        if now >= self._ends:
            self.flush()
            self._ends = now + self.interval
        key = reason if reason in self.counts or len(self.counts) < REASONS else "other"
        self.counts[key] = self.counts.get(key, 0) + 1
        seen = self._seen.get(peer)
        if seen is not None:
            seen.more += 1
            seen.reasons[key] = seen.reasons.get(key, 0) + 1
        elif len(self._seen) < self.peers:
            self._seen[peer] = _Seen()
            self.logger.warning("%s: %s", self.node, text)
        else:
            self._unnamed += 1

    def flush(self) -> None:
        """Write the current window's summary lines, and start afresh."""
        span = self.interval
        for peer, seen in self._seen.items():
            if seen.more:
                reasons = ", ".join(f"{reason} {count:,}" for reason, count in
                                    sorted(seen.reasons.items(), key=lambda item: -item[1]))
                self.logger.warning("%s: %s more refusal%s from %s in the last %gs: %s",
                                    self.node, f"{seen.more:,}", "s"[:seen.more - 1],
                                    clip(peer, MAX_VAR), span, reasons)
        if self._unnamed:
            self.logger.warning("%s: %s refusals from further peers in the last %gs (only the "
                                "first %d peers of a window are named)", self.node,
                                f"{self._unnamed:,}", span, self.peers)
        self._seen.clear()
        self._unnamed = 0
