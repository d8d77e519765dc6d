"""Node identity: what a node of a job is called, and which node's work is running.

A job's nodes are its pservers and its trainers, each known by its role and index. That
identity has three spellings, all made and read here and nowhere else:

- the node name, ``pserver:0`` / ``trainer:3``: its name on the wire, in the scenario
  (``faults``, ``cluster.hosts``), in logs and in the run record (`pserver_name`,
  `trainer_name`, `node_name`; `parse_node` reads one back);
- the file stem, ``pserver-0``: its name in file names (logs, node records, key files),
  since a colon does not belong in one (`node_file_stem`);
- the node context, `NODE`: which node's work the current asyncio context runs (an
  in-process cluster's node tasks set it), so that the simulator's pause fault can hold
  exactly that node's callbacks; `no_node` is a context of no node's.

DESIGN: this lives in `runtime/config/`, the top part of `runtime`, because the scenario's
checks (`runtime.config.faults`, `runtime.config.scenario`) name nodes as much as the services,
the launcher and the simulator do; it imports nothing of pslab.
"""

from __future__ import annotations

import contextvars
import re
from functools import lru_cache
from typing import Literal

RoleName = Literal["pserver", "trainer"]
PSERVER: RoleName = "pserver"
TRAINER: RoleName = "trainer"
ROLES: tuple[RoleName, ...] = (PSERVER, TRAINER)
"""The roles, pservers first: the order nodes are listed in."""

NODE_NAME = re.compile(r"(pserver|trainer):(\d+)")
"""A node name: its role and its index (`re.fullmatch` it)."""


@lru_cache(maxsize=1 << 16)
def pserver_name(index: int) -> str:
    """Node `index`'s name, one string object per index: every pserver holds every trainer's
    name and every trainer every pserver's (100,000 each way at 1,000 x 100)."""
    return f"{PSERVER}:{index}"


@lru_cache(maxsize=1 << 16)
def trainer_name(index: int) -> str:
    """Trainer `index`'s node name (one string object per index, as `pserver_name`)."""
    return f"{TRAINER}:{index}"


def node_name(role: str, index: int) -> str:
    """The name of node `index` of `role` (a pserver's if `role` is ``pserver``, else a
    trainer's)."""
    return pserver_name(index) if role == PSERVER else trainer_name(index)


def claimed_trainer(trainer: object) -> str:
    """The node a message's ``trainer`` field claims to come from. The field is a decoded,
    untrusted value of any type, so this formats it as it is (never through `trainer_name`'s
    cache, which takes ``True`` for ``1``)."""
    return f"{TRAINER}:{trainer}"


def node_names(pservers: int, trainers: int) -> list[str]:
    """Every node of a cluster, pservers then trainers, each by index."""
    return [pserver_name(j) for j in range(pservers)] + [trainer_name(i) for i in range(trainers)]


def parse_node(node: str) -> tuple[str, int]:
    """``pserver:3`` -> ``("pserver", 3)``; ValueError where no number follows the colon."""
    role, _, index = node.partition(":")
    return role, int(index)


def is_pserver(node: str) -> bool:
    return node.startswith(f"{PSERVER}:")


def is_trainer(node: str) -> bool:
    return node.startswith(f"{TRAINER}:")


def node_file_stem(role: str, index: int) -> str:
    """``pserver-0``: the node's name as a file name (logs, records)."""
    return f"{role}-{index}"


NODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("pslab_node", default=None)
"""The node whose work runs in the current context (an in-process cluster's node tasks set it;
the simulator's pause fault holds whatever runs in a paused node's context,
`sim.loop.VirtualTimeLoop.hold`)."""


def no_node() -> contextvars.Context:
    """A fresh context in which no node's work runs, for what belongs to none (the fault
    schedule, a simulated host's clock, the network handing over messages): a pause of a
    node must not hold it. Fresh each time, so nothing one sets in it leaks into another."""
    return contextvars.Context()
