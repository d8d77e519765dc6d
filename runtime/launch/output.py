"""The launcher's output to the user, written without ever blocking the launcher.

`runtime up`'s event loop reads every node's output and each trainer's progress from pipes.
Blocked writing its own display to a terminal that is not being read (paused with Ctrl-S, piped
into a pager nobody scrolls), it stopped reading them; the trainers then blocked writing their
progress, froze, and the pservers dropped them for their silence. `DetachedOutput` takes what
the display writes into memory and writes it to the real stream from a thread of its own, so the
loop goes on whatever the reader does. Past `limit` characters waiting, writes are dropped and
counted, and a line says how many once the stream takes text again: progress not shown is lost,
the run is not.
"""

from __future__ import annotations

import io
import threading
from collections import deque
from typing import TextIO

LIMIT = 1 << 20
"""Characters held for a stream that is not being read before writes are dropped."""


class DetachedOutput(io.TextIOBase):
    """A text stream over `stream` whose `write` never blocks (see the module docstring).
    `close` waits until everything held is written; `stream` itself stays open."""

    def __init__(self, stream: TextIO, limit: int = LIMIT) -> None:
        super().__init__()
        self.stream, self.limit = stream, limit
        self.dropped = 0
        """Writes dropped because `limit` characters were already waiting."""
        self._held: deque[str] = deque()
        self._size = 0
        self._unreported = 0
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

    def close(self) -> None:
        """Write out what is held, then stop the thread."""
        if self.closed:
            return
        with self._changed:
            self._done = True
            self._changed.notify()
        self._thread.join()
        super().close()

    def _pump(self) -> None:
        broken = False
        while True:
            with self._changed:
                while not self._held and not self._unreported and not self._done:
                    self._changed.wait()
                if not self._held and not self._unreported:
                    return
                text = "".join(self._held)
                self._held.clear()
                self._size = 0
                dropped, self._unreported = self._unreported, 0
            if dropped:
                text += (f"[runtime up] {dropped} write(s) of progress not shown: the output "
                         f"was not being read\n")
            if broken:
                continue
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):  # the reader went away (a closed pipe): drop it all
                broken = True
