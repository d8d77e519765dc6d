"""Local sockets: the nodes of a job on one host talk over ZeroMQ ``ipc://`` sockets in a
directory only the job's user can open, instead of CurveZMQ over TCP.

On one host the kernel already keeps a job's messages from everyone else: a Unix socket lives
as a file, connecting to it needs search permission on its directory, and a directory of mode
0700 grants that to its owner alone (and to root, who can read any process's memory anyway);
the bytes go from one process to the other through the kernel and never reach a network. So
`runtime up` on one host gives its nodes such a directory (`make_socket_dir`) and no keys: no
handshakes, and no XSalsa20-Poly1305 over every byte on the cores the kernels need. What this
protects and what it does not is in SECURITY.md: every process of the job's user on the host
can connect, as every such process can read the job's key files under CurveZMQ too.

A node's endpoint (``host:port``, the name the programs give a pserver, or a collective
trainer) stays its name; only the address its socket binds and connects to changes
(`ipc_address`): ``<dir>/<host>-<port>``. Programs, messages and the simulator's model of them
are the same as over TCP.

`runtime up` removes the directory when its job ends; one killed outright (SIGKILL) cannot, and
its nodes, which end with it, remove it instead (`release_socket_dir`).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import tempfile
import time
from pathlib import Path

IPC_SCHEME = "ipc://"
SUN_PATH_MAX = 107
"""The longest path a Unix socket's address holds on Linux (``sun_path`` less its NUL)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
RELEASE_PATIENCE = 2.0
"""Seconds `release_socket_dir` waits for a socket still listening to close."""


class SocketDirError(ValueError):
    """A directory that cannot hold a job's local sockets, with the reason."""


def make_socket_dir() -> Path:
    """A fresh directory for a job's sockets, mode 0700, in the system's temporary folder (a
    short path: a socket's address is limited to `SUN_PATH_MAX` bytes)."""
    return Path(tempfile.mkdtemp(prefix="pslab-ipc-"))


def check_socket_dir(directory: Path) -> Path:
    """`directory`, if it can hold a job's local sockets privately: a directory owned by this
    user that no one else may open (no group or other permission bits); `SocketDirError`
    naming what is wrong otherwise."""
    try:
        info = directory.lstat()
    except OSError as exc:
        raise SocketDirError(f"{directory}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise SocketDirError(f"{directory}: not a directory")
    if info.st_uid != os.getuid():
        raise SocketDirError(f"{directory}: owned by uid {info.st_uid}, not by this user "
                             f"(uid {os.getuid()})")
    if info.st_mode & 0o077:
        raise SocketDirError(f"{directory}: mode {stat.S_IMODE(info.st_mode):04o} lets other "
                             "users in; the job's sockets need a directory of mode 0700")
    return directory


def socket_path(directory: Path, endpoint: str) -> Path:
    """The socket file of the node named by `endpoint` (``host:port``) in `directory`."""
    host, _, port = endpoint.rpartition(":")
    name = f"{_UNSAFE.sub('_', host.strip('[]'))}-{_UNSAFE.sub('_', port)}"
    path = directory / name
    if len(os.fsencode(str(path))) > SUN_PATH_MAX:
        raise SocketDirError(f"{path}: longer than the {SUN_PATH_MAX} bytes a Unix socket's "
                             "address holds; use a directory with a shorter path")
    return path


def ipc_address(directory: Path, endpoint: str) -> str:
    """The ZeroMQ address of `endpoint`'s socket in `directory` (an address that names its
    transport already is left as it is)."""
    if "://" in endpoint:
        return endpoint
    return IPC_SCHEME + str(socket_path(directory, endpoint))


def release_socket_dir(directory: Path, patience: float = RELEASE_PATIENCE) -> bool:
    """Remove, from a job's socket `directory`, every socket no process listens on any more,
    and the directory once nothing is left in it; whether it is gone. A node whose `runtime
    up` died (SIGKILL leaves it no chance to remove the directory) calls this after closing
    its own sockets. The nodes end together, and a closed ZeroMQ socket stops listening a
    moment after its close returns (its I/O thread closes it), so a socket still listening is
    looked at again for up to `patience` seconds: of the nodes that end so, the last to look
    finds every socket closed, and the directory goes with it. A socket that goes on
    listening, or anything else in the directory, is left, and so is the directory."""
    until = time.monotonic() + patience
    while True:
        try:
            entries = list(directory.iterdir())
        except OSError:
            return not directory.exists()
        listening = False
        for entry in entries:
            if not entry.is_socket():
                continue
            if _listening(entry):
                listening = True
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
        if not listening or time.monotonic() >= until:
            break
        time.sleep(0.02)
    try:
        directory.rmdir()
    except OSError:
        return not directory.exists()
    return True


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True
