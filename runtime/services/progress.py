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
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import select
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, fields

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
        data = asdict(self)
        data["loss"] = self.loss if math.isfinite(self.loss) else None
        return (json.dumps(data, allow_nan=False) + "\n").encode()

    @staticmethod
    def from_line(line: bytes) -> Progress:
        """The progress a line says; ValueError naming what is wrong with a line that says none."""
        try:
            data = json.loads(line)
        except ValueError as err:
            raise ValueError(f"not JSON: {line[:80]!r}") from err
        names = {f.name for f in fields(Progress)}
        if not isinstance(data, dict) or not names >= set(data) >= {"step", "steps", "loss",
                                                                    "step_time"}:
            raise ValueError(f"not a progress message (fields {sorted(names)}): {line[:80]!r}")
        if data["loss"] is None:
            data["loss"] = math.nan
        return Progress(**data)


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
