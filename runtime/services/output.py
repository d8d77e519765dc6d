"""Output that never blocks the event loop that writes it.

`runtime up`'s event loop reads every node's output and each trainer's progress from pipes.
Blocked writing its own display to a terminal that is not being read (paused with Ctrl-S, piped
into a pager nobody scrolls), it stopped reading them; the trainers then blocked writing their
progress and their log lines, froze, and the pservers dropped them for their silence. A node's
own writes block the same way while its launcher is stopped (Ctrl-Z). `DetachedOutput` takes
what is written into memory and writes it to the real stream from a thread of its own, so the
loop goes on whatever the reader does: the launcher's display, a node's stdout and stderr, a
trainer's progress channel. Past `limit` characters waiting, writes are dropped and counted
(and, where the stream is for people, a line says how many once it takes text again): output
not shown is lost, the run is not.
"""

from __future__ import annotations

import io
import threading
from collections import deque
from typing import Callable, TextIO

LIMIT = 1 << 20
"""Characters held for a stream that is not being read before writes are dropped."""


class DetachedOutput(io.TextIOBase):
    """A text stream over `stream` whose `write` never blocks (see the module docstring).
    `close` waits until everything held is written; `stream` itself stays open."""

    def __init__(self, stream: TextIO, limit: int = LIMIT,
                 notice: Callable[[int], str] | None = None,
                 broken: Callable[[Exception], None] | None = None) -> None:
        super().__init__()
        self.stream, self.limit = stream, limit
        self.notice = shown_dropped if notice is None else notice
        """The line written after `n` dropped writes (`quiet`: none, for a machine's reader)."""
        self.broken = broken
        """Called (from the thread) once the stream fails, its reader gone; later writes are
        dropped."""
        self.dropped = 0
        """Writes dropped because `limit` characters were already waiting."""
        self._held: deque[str] = deque()
        self._size = 0
        self._unreported = 0
        self._writing = False
        self._done = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._pump, name="runtime up output", daemon=True)
        self._thread.start()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._changed:
            if self._done:
                raise ValueError("write to a closed DetachedOutput")
            if self._size + len(text) > self.limit:
                self.dropped += 1
                self._unreported += 1
            else:
                self._held.append(text)
                self._size += len(text)
            self._changed.notify()
        return len(text)

    def flush(self) -> None:
        """Nothing to do here: the thread flushes the stream after each batch it writes."""

    @property
    def idle(self) -> bool:
        """Nothing is held or being written: a write straight to the stream now keeps the
        order (for a caller that can tell it would not block)."""
        with self._changed:
            return not self._busy()

    def drain(self) -> None:
        """Wait until everything written so far is out (however long its reader takes)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._busy())

    def _busy(self) -> bool:
        """Something is held, a drop not yet reported, or a batch being written (call with
        `_changed` held)."""
        return bool(self._held or self._unreported or self._writing)

    def close(self) -> None:
        """Write out what is held, then stop the thread."""
        if self.closed:
            return
        with self._changed:
            self._done = True
            self._changed.notify_all()
        self._thread.join()
        super().close()

    def _pump(self) -> None:
        broken = False
        while True:
            with self._changed:
                self._writing = False
                self._changed.notify_all()  # a `drain` may be waiting
                while not self._held and not self._unreported and not self._done:
                    self._changed.wait()
                if not self._held and not self._unreported:
                    return
                text = "".join(self._held)
                self._held.clear()
                self._size = 0
                dropped, self._unreported = self._unreported, 0
                self._writing = True
            if dropped:
                text += self.notice(dropped)
            if broken or not text:
                continue
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError) as exc:  # the reader went away: drop it all
                broken = True
                if self.broken is not None:
                    self.broken(exc)


def shown_dropped(dropped: int, who: str = "runtime up") -> str:
    """The line a person reads after `dropped` writes of `who` (the launcher, or a node) were
    dropped."""
    return f"[{who}] {dropped} write(s) of output not shown: it was not being read\n"


def quiet(dropped: int) -> str:
    """No line for dropped writes: the stream's reader is a program that parses each line."""
    return ""
