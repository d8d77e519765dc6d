"""`runtime up`'s output never blocks its event loop: `DetachedOutput` holds what the display
writes and writes it from a thread of its own, dropping (and then reporting) what a reader who
has stopped reading would make it hold past its limit."""

from __future__ import annotations

import io
import os
import re
import threading
from pathlib import Path
from typing import TextIO, cast

import pytest

from runtime.launch.launcher import LiveDisplay, NodeRun, PlainDisplay, make_display
from runtime.services.output import DetachedOutput
from runtime.services.progress import Progress

LINE = "x" * 99 + "\n"


@pytest.mark.timeout(30)
def test_writes_never_wait_for_a_reader_that_is_not_reading() -> None:
    """1 MiB written to a pipe nobody reads (its buffer holds 64 KiB): every write returns at
    once, what passes the limit is dropped, and once the reader reads, it gets the lines held,
    in order, and lines saying how many writes it missed (where they were missed: what came
    after a drop may fit again)."""
    read_fd, write_fd = os.pipe()
    with open(write_fd, "w") as stream:
        output = DetachedOutput(stream, limit=256 * 1024)
        for i in range(10_000):  # a blocking write here would hang the test until its timeout
            output.write(f"{i:08d}" + LINE[8:])
        assert output.dropped > 0
        chunks: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(read_fd, chunks))
        reader.start()
        output.close()
    reader.join()
    lines = b"".join(chunks).decode().splitlines()
    notice = re.compile(r"\[runtime up\] (\d+) write\(s\) of output not shown: it was not "
                        r"being read")
    numbers = [int(line[:8]) for line in lines if not notice.fullmatch(line)]
    dropped = [int(m[1]) for line in lines if (m := notice.fullmatch(line))]
    assert numbers[0] == 0 and numbers == sorted(set(numbers))  # in order, none twice
    assert len(numbers) + output.dropped == 10_000
    assert dropped and sum(dropped) == output.dropped  # each drop said, once the reader read


def _read_all(fd: int, chunks: list[bytes]) -> None:
    with open(fd, "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [False, True])
def test_the_display_over_it_shows_everything_by_close_and_keeps_the_stream_open(
        tmp_path: Path, terminal: bool) -> None:
    """Both displays, the plain lines and rich's live table (which asks the stream whether it
    is a terminal), write through it; its `close` waits until all is written."""
    stream = Terminal() if terminal else io.StringIO()
    output = DetachedOutput(stream)
    with (tmp_path / "t.log").open("w") as log:
        node = NodeRun("trainer", 0, log, seen=[Progress(2, 2, 0.5, 0.001)])
        display = make_display(cast(TextIO, output), [node], every=1)
        assert isinstance(display, LiveDisplay if terminal else PlainDisplay)
        display.progress(node)
        display.message("pserver:0 exited with status 0")
        display.close()
    output.close()
    screen = stream.getvalue()
    assert "pserver:0 exited with status 0" in screen
    assert all(cell in screen for cell in ("trainer:0", "2/2", "0.5000", "1.0ms"))
    assert not stream.closed and output.closed
    with pytest.raises(ValueError):
        output.write("late")
