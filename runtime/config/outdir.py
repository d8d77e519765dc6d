"""An output folder serves one run at a time: checked before any work, locked for the whole run.

`runtime up` (every mode), `runtime profile` and `sim run` write their results into a folder,
OUT. Two runs given the same one would rewrite each other's keys, logs and records, and one
would report a mix of both. `claim_output` therefore, before the run does anything:

- makes the folder (its parents too) and checks that it is a directory this process can write
  in, raising `OutputDirError`, one line naming the path and why (a file in the way, no
  permission, a read-only file system), rather than failing with a traceback after the work;
- takes an exclusive ``flock`` on ``OUT/.lock`` (`LOCK_NAME`) and holds it until the claim
  ends, writing into the file who holds it: pid, host, command line and since when. A second
  run into that folder gets `OutputLocked`, whose message names the folder and that holder.
  A node run on its own (``runtime up --role``) claims only its part: the nodes of a job may
  share a folder (each writes files named after itself), so it shares ``OUT/.lock`` with them
  and takes ``OUT/.<role>-<index>.lock`` (``.pserver-0.lock``) for itself; a whole run into
  that folder, or another run of the same node, is refused.

A command whose result is one file (``runtime profile -o``, ``runtime calibrate -o``) checks it
the same way before measuring anything (`check_output_file`): its folder made and writable, the
path not a folder.

DESIGN: ``flock``, not a pid file: the kernel drops the lock when the last descriptor of its
open file description is closed, so a holder that died (SIGKILL, a crash, a power cut) leaves no
stale lock behind and the next run takes the folder at once. The last holder of a lock file
removes it as it ends; a run that opened the file just before checks, once it has the lock, that
the file is still there, else it locks the one there now. `runtime up` passes the lock's
descriptor (`OutputClaim.fds`) to the nodes it starts, so the folder stays locked until the last
of them has ended, even when the launcher was SIGKILLed and its nodes are still writing their
records. A claim is reentrant within a process: `runtime profile` claims its folder for all its
runs, and the launcher it runs claims the same folder again; only the outermost claim locks and
unlocks.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

LOCK_NAME = ".lock"
"""The lock file in an output folder."""


class OutputDirError(ValueError):
    """An output folder that cannot be used; the message (one line) names it and says why."""


class OutputLocked(OutputDirError):
    """Another run holds the output folder; the message names it and the holder."""


@dataclass
class OutputClaim:
    """A folder claimed by this process: its lock files, and how many claims of this process
    hold it."""

    path: Path
    locks: tuple[tuple[str, int], ...]
    """Each lock file this claim holds, by name, and its descriptor; the last is the one it
    wrote its holder into."""
    depth: int = 1

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors of its locks, for a process that must hold them too."""
        return tuple(fd for _, fd in self.locks)


_HELD: dict[tuple[Path, str | None], OutputClaim] = {}
"""The folders this process holds, by resolved path and node (None: the whole folder)."""


def command_line(argv: Sequence[str] | None = None) -> str:
    """This process's command line (`argv`: the interpreter's, `sys.orig_argv`) as a shell
    would read it: a script by its base name without the interpreter that runs it
    (``runtime up scenarios/quickstart.yaml``), a module with it (``python -m runtime.cli up
    ...``)."""
    args = list(sys.orig_argv if argv is None else argv)
    if len(args) > 1 and not args[1].startswith("-"):
        args = args[1:]  # python SCRIPT ...: the script says what runs
    if args:
        args[0] = Path(args[0]).name
    return " ".join(shlex.quote(a) for a in args)


def check_output_dir(path: Path) -> None:
    """Make `path` (parents too); `OutputDirError` unless it is then a directory."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputDirError(f"output folder {path}: it is a file, not a folder") from None
    except NotADirectoryError:
        raise OutputDirError(f"output folder {path}: {_blocker(path)} is a file, not a "
                             "folder") from None
    except OSError as err:
        raise OutputDirError(f"output folder {path}: cannot create it: "
                             f"{_reason(err)}") from None
    if not path.is_dir():
        raise OutputDirError(f"output folder {path}: it is not a folder")


def check_output_file(path: Path, usual_name: str) -> None:
    """Before the work that a result file `path` ends: its folder made (`check_output_dir`) and
    writable (a nameless temporary file made there and dropped), `path` not a folder (the error
    suggests `usual_name` in it). `OutputDirError` naming why: a calibration or a profile is
    minutes lost otherwise."""
    if path.is_dir():
        raise OutputDirError(f"output file {path}: it is a folder; name a file in it, such as "
                             f"{path / usual_name}")
    check_output_dir(path.parent)
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as err:
        raise OutputDirError(f"output file {path}: cannot write in {path.parent}: "
                             f"{_reason(err)}") from None


def _blocker(path: Path) -> Path:
    """The first of `path`'s ancestors that exists and is not a directory (else `path`)."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return path


def _reason(err: OSError) -> str:
    """An `OSError`'s reason in words, without the file name it repeats."""
    return (err.strerror or str(err)).lower()


def holder_text(lock_file: Path) -> str | None:
    """Who holds the lock of `lock_file`, in words, from what it wrote there (None: nothing,
    or not yet)."""
    try:
        holder: dict[str, Any] = json.loads(lock_file.read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
        command, since = str(holder["command"]), str(holder["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    text = f"pid {pid} on {host}, since {since}: {command}"
    if host == socket.gethostname() and not _alive(pid):
        text += " (that process has ended; processes it started still hold the folder)"
    return text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _held(lock_file: Path) -> bool:
    """Whether some process holds a lock on `lock_file`."""
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def holders(path: Path) -> str:
    """Who holds the output folder `path`, in words: the run that locked it whole, else the
    nodes run on their own that write into it."""
    whole = holder_text(path / LOCK_NAME)
    if whole is not None:
        return f"another run, {whole}"
    nodes = [f"{f.name[1:-len(LOCK_NAME)]} ({holder_text(f) or 'starting'})"
             for f in sorted(path.glob(f".*{LOCK_NAME}")) if f.name != LOCK_NAME and _held(f)]
    if nodes:
        return "nodes run on their own: " + "; ".join(nodes)
    return "another run (it has not said which yet)"


def _open(path: Path, name: str) -> int:
    try:
        return os.open(path / name, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise OutputDirError(f"output folder {path}: cannot write in it: "
                             f"{_reason(err)}") from None


def _lock(path: Path, name: str, shared: bool, who: Callable[[], str]) -> int:
    """Open and lock ``path/name`` (`shared`: among nodes run on their own); its descriptor.
    `OutputLocked`, naming the holder (`who` says), when a lock is in the way."""
    while True:
        fd = _open(path, name)
        locked = _try_lock(fd, shared)
        if _is_at(fd, path / name):
            if locked:
                return fd
            os.close(fd)
            raise OutputLocked(f"output folder {path} is in use by {who()}; wait for it to "
                               "end, or give another output folder")
        os.close(fd)  # its last holder removed it as this opened it: lock the one there now


def _try_lock(fd: int, shared: bool) -> bool:
    """Lock `fd` if no other process holds it (exclusively, or at all); whether it did."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except BaseException:
        os.close(fd)
        raise
    return True


def _is_at(fd: int, lock_file: Path) -> bool:
    """Whether `fd` is the file at `lock_file` (not one removed since it was opened)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(lock_file))
    except FileNotFoundError:
        return False


def _write_holder(fd: int, command: str) -> None:
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)


def _take(path: Path, node: str | None, command: str) -> tuple[tuple[str, int], ...]:
    """The locks of a claim on `path`: the folder's, exclusive; or, for `node`, the folder's
    shared with other nodes and the node's own, exclusive. The last holds the holder."""
    if node is None:
        locks = [(LOCK_NAME, _lock(path, LOCK_NAME, False, lambda: holders(path)))]
    else:
        locks = [(LOCK_NAME, _lock(path, LOCK_NAME, True, lambda: holders(path)))]
        os.ftruncate(locks[0][1], 0)  # whoever it names, a run that died, holds it no more
        own = f".{node}{LOCK_NAME}"
        try:
            locks.append((own, _lock(path, own, False, lambda: f"another run of {node}, "
                                     f"{holder_text(path / own) or 'starting'}")))
        except BaseException:
            _release(path, locks)
            raise
    _write_holder(locks[-1][1], command)
    return tuple(locks)


def _release(path: Path, locks: Sequence[tuple[str, int]]) -> None:
    """Unlock `locks`, removing each lock file that no other process holds (`_lock` checks
    that the file it locked is still there)."""
    for name, fd in reversed(locks):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the last of its holders?
        except BlockingIOError:
            pass
        else:
            (path / name).unlink(missing_ok=True)
        os.close(fd)


@contextmanager
def claim_output(path: Path, command: str | None = None,
                 node: str | None = None) -> Iterator[OutputClaim]:
    """Check the output folder `path` (`check_output_dir`) and hold it until the context ends:
    the whole folder, or with `node` (a node's file stem, ``pserver-0``) that node's part of it,
    which nodes of one job run on their own may share (each writes files of its own); another
    claim of the whole folder, or of the same node, is refused. `command`: the holder's command
    line (default: this process's). `OutputDirError` when the folder cannot be used,
    `OutputLocked` when another run holds it."""
    key = (path.resolve(), node)
    held = _HELD.get(key)
    if held is not None:
        held.depth += 1
        try:
            yield held
        finally:
            held.depth -= 1
        return
    check_output_dir(path)
    claim = _HELD[key] = OutputClaim(path, _take(path, node, command or command_line()))
    try:
        yield claim
    finally:
        del _HELD[key]
        _release(path, claim.locks)
