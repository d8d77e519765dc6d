"""A node started by `runtime up` dies with it: no orphaned pserver serves on for its deadline.

`runtime up` names itself in each node's environment (``PSLAB_LAUNCHER_PID``). The node then
asks Linux to signal it when its parent dies (``prctl(PR_SET_PDEATHSIG)``, through ctypes)
and checks, right after, that its parent is still that launcher: a launcher that died between
starting the node and the ``prctl`` would otherwise leave it orphaned all the same. Where there
is no ``prctl`` (not Linux) a daemon thread watches the parent's pid instead.

Which signal: SIGTERM, which a pserver answers by writing its record before it exits
(`runtime.services.node`): what it served is kept even when its launcher was SIGKILLed. A node
that a ``slow`` or ``pause`` fault may stop (SIGSTOP) gets SIGKILL instead, the only signal
that ends a stopped process: its launcher, gone, will never resume it. The launcher says which
in ``PSLAB_LIFELINE_SIGNAL`` (`lifeline_environment`); without it, SIGKILL.

DESIGN: Linux sends the parent-death signal when the *thread* that forked the child exits,
not the process. The launcher starts its nodes from its event loop, on its main thread, which
lives as long as the launcher does. When the launcher dies, the signal comes again as each of
its other threads ends (the node is handed from one to the next): a node that answers SIGTERM
ignores the repeats (`runtime.services.node.until_sigterm`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Mapping

LAUNCHER_VAR = "PSLAB_LAUNCHER_PID"
"""The pid of the `runtime up` that started this node; absent when none did (role mode)."""
PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
SIGNAL_VAR = "PSLAB_LIFELINE_SIGNAL"
"""The signal a node asks for when its launcher dies: ``SIGTERM`` or ``SIGKILL``."""
POLL_SECONDS = 0.5
"""How often the fallback watcher (no prctl) looks at the parent's pid."""


def launcher_environment() -> dict[str, str]:
    """What `runtime up` adds to each node's environment: its own pid."""
    return {LAUNCHER_VAR: str(os.getpid())}


def lifeline_environment(pausable: bool) -> dict[str, str]:
    """What `runtime up` adds to a node's environment to choose the signal it gets when the
    launcher dies: SIGKILL for a node that a fault may pause (`pausable`), else SIGTERM."""
    return {SIGNAL_VAR: "SIGKILL" if pausable else "SIGTERM"}


def lifeline_signal(env: Mapping[str, str]) -> signal.Signals:
    """The signal this node asks for when its launcher dies (`SIGNAL_VAR`; SIGKILL unless it
    says SIGTERM)."""
    return signal.SIGTERM if env.get(SIGNAL_VAR) == "SIGTERM" else signal.SIGKILL


def launcher_pid(env: Mapping[str, str]) -> int | None:
    """The launcher that started this node, from its environment (None: none did)."""
    text = env.get(LAUNCHER_VAR, "").strip()
    return int(text) if text.isdigit() else None


def die_with_launcher(launcher: int, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Have this process sent `sig` when its parent, the launcher `launcher`, dies; False when
    it is gone already (this process's parent is no longer it), and the node must not start."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    else:
        threading.Thread(target=_watch_parent, args=(launcher, sig), daemon=True,
                         name="launcher watch").start()
    return os.getppid() == launcher


def launcher_gone(launcher: int) -> bool:
    """Whether the launcher `launcher` that started this node has died or is dying. Its parent
    is then no longer it, or (the signal comes as the launcher's main thread exits, while its
    other threads, still ending, keep its pid) that main thread is a zombie."""
    if os.getppid() != launcher:
        return True
    try:
        state = Path(f"/proc/{launcher}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # no /proc (not Linux): its parent is still the launcher
        return False
    return state in ("Z", "X")


def _watch_parent(launcher: int, sig: signal.Signals) -> None:
    while os.getppid() == launcher:
        time.sleep(POLL_SECONDS)
    os.kill(os.getpid(), sig)
