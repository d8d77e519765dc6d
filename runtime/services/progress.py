"""A trainer's progress, reported to `runtime up`'s launcher over a pipe of its own.

The launcher makes a pipe for each trainer process it starts (`Channel`), lets the child
inherit the pipe's write end and names that file descriptor in the child's environment
(`PROGRESS_FD_VAR`). After every step the trainer writes one `Progress` to it as a JSON line
(`Reporter`); the launcher reads them (`read_progress`) for its display, for the faults
triggered at a step and for the record of a trainer that died before writing its own. The
trainer's stdout is for people and its log only: nothing reads it back.

DESIGN: an inherited pipe rather than a socket: it needs no address (under ``runtime up
--netns`` the child sits in another network namespace, which a file descriptor crosses as it
is), nothing to clean up, and the end of the process is the end of the stream (EOF), SIGKILL
included, so the launcher knows it has read everything a process reported once it has read
to the end. Each line is far below ``PIPE_BUF``, so a write is atomic. A trainer whose launcher
went away (the pipe broken) stops reporting and trains on; its stdout says the same. One whose
launcher is stopped (Ctrl-Z) or slow to read trains on too: its reports wait in memory
(`runtime.services.output.DetachedOutput`, up to 1 MiB) instead of blocking its loop once the
pipe is full, which froze it until the pservers dropped it. While the pipe has room they go
straight in, so the launcher sees everything a trainer killed right after had reported.

Shown where no one watches a live table (output piped to a file), the trainers' progress is
summed up (`ProgressSummary`): a line per interval (every 10% of all the steps, and at least
every `SUMMARY_SECONDS` while steps are taken) for all the trainers at once, with the slowest
and fastest trainer's step, the min and median of their latest step times and an estimate of
the time left, rather than a line per trainer per few steps (2,126 lines for 1,000 steps of
100 trainers).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import select
import statistics
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, fields

from runtime.services.output import DetachedOutput, quiet

log = logging.getLogger(__name__)

PROGRESS_FD_VAR = "PSLAB_PROGRESS_FD"
"""The environment variable naming the file descriptor a trainer reports its progress to."""


@dataclass(frozen=True)
class Progress:
    """A trainer has finished a step."""

    step: int
    """Steps done (1-based: the step just finished, counted from 1)."""
    steps: int
    """Steps it is to take (train.steps)."""
    loss: float
    """The step's loss (NaN: none computed, timing mode)."""
    step_time: float
    """The step's duration, seconds."""
    first_step: int = 0
    """The step this process started at (later than 0 when it joined a job under way)."""
    redone: int = 0
    """Steps this process took again so far (a pserver restarted from a checkpoint)."""

    def to_line(self) -> bytes:
        # not `asdict` (a deep copy): it took two thirds of a report's 15 us
        data = {name: getattr(self, name) for name in PROGRESS_FIELDS}
        data["loss"] = self.loss if math.isfinite(self.loss) else None
        return (json.dumps(data, allow_nan=False) + "\n").encode()

    @staticmethod
    def from_line(line: bytes) -> Progress:
        """The progress a line says; ValueError naming what is wrong with a line that says none."""
        try:
            data = json.loads(line)
        except ValueError as err:
            raise ValueError(f"not JSON: {line[:80]!r}") from err
        names = set(PROGRESS_FIELDS)
        if not isinstance(data, dict) or not names >= set(data) >= {"step", "steps", "loss",
                                                                    "step_time"}:
            raise ValueError(f"not a progress message (fields {sorted(names)}): {line[:80]!r}")
        if data["loss"] is None:
            data["loss"] = math.nan
        return Progress(**data)


PROGRESS_FIELDS = tuple(f.name for f in fields(Progress))


class Reporter:
    """A trainer's end of its channel: `report` writes each step's progress to it, through a
    `DetachedOutput`: a launcher stopped (Ctrl-Z) or slow to read never blocks the trainer."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self._gone = False
        """The launcher is gone (the pipe broken): nothing more is reported."""
        self._out: DetachedOutput | None = DetachedOutput(
            open(fd, "w", encoding="utf-8", closefd=False), notice=quiet, broken=self._broken)

    @staticmethod
    def from_environment(env: Mapping[str, str]) -> Reporter | None:
        """The reporter the environment names (`PROGRESS_FD_VAR`); None where it names none."""
        text = env.get(PROGRESS_FD_VAR, "").strip()
        if not text:
            return None
        try:
            fd = int(text)
            os.fstat(fd)
        except (ValueError, OSError) as err:
            raise ValueError(f"{PROGRESS_FD_VAR}={text!r}: not an open file descriptor "
                             f"({err})") from None
        return Reporter(fd)

    def report(self, progress: Progress) -> None:
        """Write `progress` to the pipe now where it has room (the launcher sees what a
        trainer killed right after reported), else have it wait in memory."""
        out, fd = self._out, self.fd
        if out is None or fd is None or self._gone:
            return
        line = progress.to_line()
        if out.idle and select.select([], [fd], [], 0)[1]:
            try:  # a free page in the pipe: a line under PIPE_BUF goes in whole, at once
                os.write(fd, line)
            except BrokenPipeError as exc:
                self._broken(exc)
            return
        out.write(line.decode())

    def _broken(self, error: Exception) -> None:
        """The launcher is gone: said once, whichever write finds it first (this thread's,
        or the detached output's)."""
        if not self._gone:
            self._gone = True
            log.warning("the progress channel (fd %s) is closed: no more progress reported "
                        "(%s)", self.fd, error)

    def close(self) -> None:
        """Write out what is held (however long the launcher takes to read it), then close."""
        out, self._out = self._out, None
        if out is not None:
            out.close()
            out.stream.close()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Channel:
    """The launcher's pipe to one trainer process: the child inherits `write_fd`
    (`pass_fds`, and its number in `environment`); the launcher reads `read_fd`."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def environment(self) -> dict[str, str]:
        return {PROGRESS_FD_VAR: str(self.write_fd)}

    def started(self) -> None:
        """The child has its copy of the write end: close the launcher's, so that the child's
        exit ends the stream."""
        os.close(self.write_fd)

    def close(self) -> None:
        """Both ends, when no child was started."""
        os.close(self.read_fd)
        os.close(self.write_fd)


async def read_progress(fd: int, limit: int) -> AsyncIterator[Progress | ValueError]:
    """Each progress message on the pipe `fd` until its writers have all closed it (a
    malformed line as the ValueError saying what is wrong with it); the pipe is closed after.
    `limit`: the longest line read."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    try:
        async for line in reader:
            try:
                yield Progress.from_line(line)
            except (ValueError, TypeError) as err:
                yield ValueError(str(err))
    finally:
        transport.close()


SUMMARY_SECONDS = 10.0
"""The longest `ProgressSummary` goes without a line while trainers report steps."""


PER_TRAINER = 8
"""Most trainers whose progress a pipe gets line by line (beyond: `ProgressSummary`'s lines
only: 100 trainers logging every 10 steps of 1,000 wrote 2,126 lines)."""


@dataclass
class ProgressSummary:
    """The progress of every trainer of a job in one line per interval: `update` takes each
    report and says when a line is due (a tenth more of all the steps done, or `every` seconds
    since the last line), `line` writes it; the line that says all is done is the last. `clock`: seconds, for the
    intervals and the estimate of the time left (monotonic; a test passes its own)."""

    trainers: int
    steps: int
    """Steps each trainer is to take (train.steps)."""
    every: float = SUMMARY_SECONDS
    clock: Callable[[], float] = time.monotonic
    latest: dict[int, Progress] = field(default_factory=dict)
    """Each trainer's latest report, by index."""
    _first: tuple[float, int] | None = field(default=None, init=False)
    """When the first report came, and the steps done then: where the pace is taken from."""
    _shown: float = field(default=-math.inf, init=False)
    """When the last line was shown."""
    _tenths: int = field(default=0, init=False)
    """The tenths of all the steps done when the last line was shown."""

    def update(self, trainer: int, progress: Progress) -> str | None:
        """Take `trainer`'s report; the line to show now, or None while none is due."""
        now = self.clock()
        self.latest[trainer] = progress
        done = self.done()
        if self._first is None:
            self._first = (now, done)
        tenths = 10 * done // self.total
        if self._tenths >= 10 or (tenths <= self._tenths and now - self._shown < self.every):
            return None  # all shown done, or no tenth more and not yet time
        self._shown, self._tenths = now, tenths
        return self.line(now)

    @property
    def each_trainer(self) -> bool:
        """Whether a pipe also gets every trainer's own lines (`PER_TRAINER` trainers at most)."""
        return self.trainers <= PER_TRAINER

    @property
    def total(self) -> int:
        return max(1, self.trainers * self.steps)

    def done(self) -> int:
        """Steps the trainers have done, all together (as far as they reported)."""
        return sum(min(p.step, p.steps) for p in self.latest.values())

    def line(self, now: float) -> str:
        """Steps done of all, the slowest and fastest trainer's step, the min and median of
        the trainers' latest step times, their median loss (if computed), the time left."""
        done, reports = self.done(), list(self.latest.values())
        at = [p.step for p in reports] + [0] * (self.trainers - len(reports))
        times = [p.step_time for p in reports]
        losses = [p.loss for p in reports if math.isfinite(p.loss)]
        loss = f", loss median {statistics.median(losses):.4f}" if losses else ""
        return (f"steps {done:,}/{self.total:,} ({100 * done // self.total}%), {self.trainers} "
                f"trainer(s) at step {min(at)} to {max(at)} of {self.steps}: step time min "
                f"{min(times) * 1e3:.1f}ms median {statistics.median(times) * 1e3:.1f}ms{loss}, "
                f"{self._eta(now, done)}")

    def _eta(self, now: float, done: int) -> str:
        """The time left at the pace since the first report."""
        if done >= self.total:
            return "done"
        first_at, first_done = self._first or (now, done)
        if done <= first_done or now <= first_at:
            return "ETA unknown"
        left = (now - first_at) / (done - first_done) * (self.total - done)
        return f"ETA {_duration(left)}"


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
