"""A node started by `runtime up` dies with it: no orphaned pserver serves on for its deadline.

`runtime up` names itself in each node's environment (``PSLAB_LAUNCHER_PID``). The node then
asks Linux to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG)``, through ctypes)
and checks, right after, that its parent is still that launcher: a launcher that died between
starting the node and the ``prctl`` would otherwise leave it orphaned all the same. Where there
is no ``prctl`` (not Linux) a daemon thread watches the parent's pid instead.

Why SIGKILL: the launcher stops its nodes with SIGTERM when it can, so this signal only comes
when it could not (it was SIGKILLed, or crashed), and then it must work on a node paused by a
``slow`` fault (SIGSTOP) too, which only SIGKILL does.

DESIGN: Linux sends the parent-death signal when the *thread* that forked the child exits,
not the process. The launcher starts its nodes from its event loop, on its main thread, which
lives as long as the launcher does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Mapping

LAUNCHER_VAR = "PSLAB_LAUNCHER_PID"
"""The pid of the `runtime up` that started this node; absent when none did (role mode)."""
PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
POLL_SECONDS = 0.5
"""How often the fallback watcher (no prctl) looks at the parent's pid."""


def launcher_environment() -> dict[str, str]:
    """What `runtime up` adds to each node's environment: its own pid."""
    return {LAUNCHER_VAR: str(os.getpid())}


def launcher_pid(env: Mapping[str, str]) -> int | None:
    """The launcher that started this node, from its environment (None: none did)."""
    text = env.get(LAUNCHER_VAR, "").strip()
    return int(text) if text.isdigit() else None


def die_with_launcher(launcher: int) -> bool:
    """Have this process killed when its parent, the launcher `launcher`, dies; False when it
    is gone already (this process's parent is no longer it), and the node must not start."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(launcher,), daemon=True,
                         name="launcher watch").start()
    return os.getppid() == launcher


def _watch_parent(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)
