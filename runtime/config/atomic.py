"""Writing a file whole or not at all: every file pslab writes goes through `atomic_open`.

A reader of ``metrics.json``, ``params.npz``, a profile, a trace or a checkpoint's files sees
the previous version or the new one, never half of one, and a crash or a full disk in the middle
of writing leaves the previous version in place. The bytes go to a temporary file beside the
target (same directory, so the same file system), are flushed and fsynced, and the temporary
file is renamed over the target with `os.replace`, which is atomic on POSIX; the directory is
then fsynced so that the rename itself survives a power cut. On any error the temporary file is
removed and the error propagates (an `OSError` with ``errno.ENOSPC`` for a full disk).

DESIGN: the temporary file is created with ``O_EXCL`` and mode 0o666 (the umask applies), not
with `tempfile.mkstemp`, whose 0o600 would make every output readable by its owner only. A
caller that needs another mode (a secret key's 0o600) gives it: the temporary file is created
with it, so it is never wider, not even for a moment, and then set to exactly it.
The logs ``runtime up`` writes are the exception: they are streamed as the nodes run.

A process killed while it writes (SIGKILL: no cleanup runs) leaves its temporary file, hidden
and named ``.<name>.<8 hex>.tmp``; `stale_temporaries` finds them, for a writer to remove from
a directory of its own. DESIGN: the temporary of a private file (a mode with no group or other
bits: a secret key) keeps the target's suffix, ``.<stem>.<8 hex>.tmp<suffix>``, so a pattern
that guards such files (``*.key_secret`` in ``.dockerignore``) covers every file that holds the
secret, a leftover too; other temporaries end in ``.tmp``, so that a reader's glob over a
directory's outputs (``nodes/*.json``) never takes a half-written one for an output.
"""

from __future__ import annotations

import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

TEMPORARY = re.compile(r"\..+\.[0-9a-f]{8}\.tmp(\.[^.]+)?")
"""The name of a temporary file of `atomic_open` (of a private file: with the target's suffix)."""


@contextmanager
def atomic_open(path: Path, binary: bool = False, mode: int | None = None) -> Iterator[IO[Any]]:
    """A file to write `path`'s new content to; it replaces `path` when the block ends without
    an error, and is removed otherwise. Makes `path`'s directory if needed. The new file's mode
    is 0o666 less the umask, or exactly `mode` when given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_of(path, private=mode is not None and not mode & 0o077)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)  # the umask may have narrowed it
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def temporary_of(path: Path, private: bool) -> Path:
    """A fresh temporary name beside `path` (see the module docstring)."""
    token = secrets.token_hex(4)
    if private:
        return path.with_name(f".{path.stem}.{token}.tmp{path.suffix}")
    return path.with_name(f".{path.name}.{token}.tmp")


def stale_temporaries(directory: Path) -> list[Path]:
    """The temporary files in `directory` that writes killed midway left (and any write under
    way: only the directory's one writer may remove them)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if TEMPORARY.fullmatch(p.name) and p.is_file())


def write_atomic(path: Path, data: str | bytes, mode: int | None = None) -> None:
    """Write `data` (text or bytes) to `path` whole or not at all (see `atomic_open`)."""
    with atomic_open(path, binary=isinstance(data, bytes), mode=mode) as f:
        f.write(data)


def fsync_dir(directory: Path) -> None:
    """Make the entries of `directory` (a rename into it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
