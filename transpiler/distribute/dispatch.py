"""Placement of var blocks on pservers: `PSDispatcher` and its two policies.

`dispatch(blocks)` returns one endpoint per block, in order. The transpiler resets the dispatcher,
dispatches the grad blocks, resets it again and dispatches the param blocks, so each policy must
put block i of a param where block i of its grad went.

- `RoundRobin` cycles through the endpoints in order; the two passes see the same number of
  blocks in the same order, so they agree.
- `HashName` hashes the block's *placement key*: its name without ``@GRAD`` and without a
  ``.trainer_N`` suffix, so ``fc_w@GRAD.block1.trainer_3`` and ``fc_w.block1`` land together and
  every trainer sends a grad block to the same server. The hash is BLAKE2b, the same in every
  process (the original called ``var.name()`` on a property, crashing on any input, and used
  Python's ``hash``, which is salted per process, so trainers and pservers disagreed). A linear
  hash such as CRC-32 would not do: names differing only in the block digit would always land
  on the same server of two.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol, Sequence

_TRAINER_SUFFIX = re.compile(r"\.trainer_\d+")


class Named(Protocol):
    name: str


def _name_of(block: "str | Named") -> str:
    return block if isinstance(block, str) else block.name


def placement_key(name: str) -> str:
    """The part of a block name that grad and param blocks, and all trainers, share."""
    return _TRAINER_SUFFIX.sub("", name.replace("@GRAD", ""))


class PSDispatcher:
    """Base class: holds the pserver endpoints; subclasses choose one per block."""

    def __init__(self, pserver_endpoints: Sequence[str]) -> None:
        if not pserver_endpoints:
            raise ValueError(f"{type(self).__name__}: pserver_endpoints is empty")
        self._eps = list(pserver_endpoints)
        self._step = 0

    @property
    def eps(self) -> list[str]:
        return list(self._eps)

    def reset(self) -> None:
        self._step = 0

    def dispatch(self, varlist: Sequence["str | Named"]) -> list[str]:
        raise NotImplementedError


class RoundRobin(PSDispatcher):
    """Endpoint i mod n for the i-th block dispatched since the last `reset`."""

    def dispatch(self, varlist: Sequence["str | Named"]) -> list[str]:
        eplist = []
        for _ in varlist:
            eplist.append(self._eps[self._step % len(self._eps)])
            self._step += 1
        return eplist


class HashName(PSDispatcher):
    """Endpoint blake2b(placement key) mod n: stable across processes and Python runs."""

    def dispatch(self, varlist: Sequence["str | Named"]) -> list[str]:
        return [self._eps[self._hash(_name_of(v))] for v in varlist]

    def _hash(self, name: str) -> int:
        digest = hashlib.blake2b(placement_key(name).encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % len(self._eps)
