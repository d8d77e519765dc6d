"""The scenario's `faults:` section: what goes wrong, where and when, for `sim run` and `runtime up`.

A fault is one entry of the list, in one of four shapes:

- crash ``{at: "step 80", crash: "pserver:1", restart_after: 2s}``: the node dies (its process is
  SIGKILLed; in the simulator its tasks are cancelled and its transport closed, messages in
  flight to it lost) and, with ``restart_after``, comes back that long after: a pserver from its
  last checkpoint (`train.checkpoint_every`; without one, from its initial state), the trainers
  redoing the steps it lost; a trainer joining the fan-in afresh.
- partition ``{at: 1.5s, partition: [["trainer:0"], ["pserver:*"]], heal_after: 300ms}``: every
  message between a node of the first group and one of the second (either way) is lost, as
  over a cut cable, until it heals.
- link ``{links: ["trainer:*", "pserver:*"], drop: 0.05, duplicate: 0.05, reorder: 0.05,
  delay: 0.1, delay_by: 20ms}``: each message on a matching link (either direction) is dropped,
  duplicated, held back behind the next one, or delayed by ``delay_by``, each with its
  probability, drawn per link from a generator seeded by the run's seed and the link; ``at`` and
  ``for`` limit it to a window.
- slow ``{at: 2s, slow: "trainer:1", slowdown: 3.0, for: 1s}``: the node computes that many
  times slower for a while (for good without ``for``).

``at`` is a time since the job started (``1.5s``) or ``"step N"``: the moment the first trainer
has finished N steps. Node names are ``pserver:<i>`` / ``trainer:<i>``; groups and links take
shell patterns (``trainer:*``), and each must name at least one node of the cluster.
`check_against(faults, pservers, trainers, ...)` checks the names and what recovery needs.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, \
    field_validator

from . import units

_STEP = re.compile(r"\s*step\s+(\d+)\s*")


class Trigger(BaseModel):
    """When a fault starts: `seconds` after the job started, or when a trainer finished `step`
    steps."""

    model_config = ConfigDict(frozen=True)
    seconds: float | None = None
    step: int | None = None

    @staticmethod
    def parse(value: Any) -> "Trigger":
        if isinstance(value, Trigger):
            return value
        if isinstance(value, str):
            m = _STEP.fullmatch(value)
            if m:
                return Trigger(step=int(m.group(1)))
        seconds = units.duration(value)
        if seconds < 0:
            raise ValueError(f"at {value!r}: a time cannot be negative")
        return Trigger(seconds=seconds)

    def __str__(self) -> str:
        return f"step {self.step}" if self.step is not None else f"{self.seconds:g}s"


def _trigger(value: Any) -> Trigger:
    try:
        return Trigger.parse(value)
    except units.UnitError as exc:
        raise ValueError(f"{exc}; or \"step N\"") from None


def _duration(value: Any) -> float | None:
    if value is None:
        return None
    seconds = units.duration(value)
    if seconds <= 0:
        raise ValueError(f"{value!r}: a duration must be > 0")
    return seconds


At = Annotated[Trigger, BeforeValidator(_trigger)]
"""When: a time since the job started (``1.5s``, or seconds) or ``"step N"`` (when the first
trainer has finished N steps)."""
Duration = Annotated[float, BeforeValidator(_duration)]
"""A duration > 0: seconds, or a number with a unit (``300ms``)."""


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Crash(_Fault):
    """A node dies at `at` and, with `restart_after`, comes back."""

    at: At
    """When it dies."""
    crash: str
    """The node, ``pserver:<i>`` or ``trainer:<i>``."""
    restart_after: Duration | None = None
    """How long it stays down (none: for good)."""


    @field_validator("crash")
    @classmethod
    def _one_node(cls, v: str) -> str:
        """`crash` names one node, ``pserver:<i>`` or ``trainer:<i>`` (no pattern)."""
        if not _NODE.fullmatch(v):
            raise ValueError(f"crash names one node, pserver:<i> or trainer:<i>, not {v!r}")
        return v


class Partition(_Fault):
    """Messages between two groups of nodes are lost from `at` until it heals."""

    at: At
    """When the cut starts."""
    partition: tuple[tuple[str, ...], tuple[str, ...]]
    """The two groups, each a list of node patterns."""
    heal_after: Duration | None = None
    """How long the cut lasts (none: for good)."""


    def cuts(self, a: str, b: str) -> bool:
        """Whether the link between nodes `a` and `b` (either way) crosses the partition."""
        left, right = self.partition
        return (_any(left, a) and _any(right, b)) or (_any(left, b) and _any(right, a))


Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
"""A probability in [0, 1)."""


class LinkFaults(_Fault):
    """Each message on the matching links is dropped, duplicated, reordered or delayed, each
    with its probability, drawn per link from the run's seed."""

    links: tuple[str, str]
    """Two node patterns: the links between nodes matching them, either way."""
    drop: Probability = 0.0
    """Probability a message is lost."""
    duplicate: Probability = 0.0
    """Probability a second copy follows it."""
    reorder: Probability = 0.0
    """Probability it is held back behind the link's next message."""
    delay: Probability = 0.0
    """Probability it is delayed by `delay_by`."""
    delay_by: Duration = 0.01
    """How long a delayed message is late."""
    at: At | None = None
    """When the rule starts (none: from the start)."""
    duration: Duration | None = Field(None, alias="for")
    """How long it lasts (none: to the end)."""


    def matches(self, src: str, dst: str) -> bool:
        a, b = self.links
        return (fnmatchcase(src, a) and fnmatchcase(dst, b)) or \
            (fnmatchcase(src, b) and fnmatchcase(dst, a))


class Slow(_Fault):
    """A node computes `slowdown` times slower from `at` on, for a while or for good."""

    at: At
    """When it slows down."""
    slow: str
    """The node, or a pattern of nodes."""
    slowdown: float = Field(gt=1.0)
    """How many times slower: the simulator multiplies its modelled compute; `runtime up`
    pauses the process for 1 - 1/slowdown of every 20 ms."""
    duration: Duration | None = Field(None, alias="for")
    """How long (none: for good)."""



_NODE = re.compile(r"(pserver|trainer):\d+")
FAULT_KINDS = ("crash", "partition", "links", "slow")


def _shape_of(raw: Any) -> str | None:
    """The key that says which fault an entry is (None: no single one, an error)."""
    if isinstance(raw, _Fault):
        return fault_kind(raw)  # type: ignore[arg-type]
    if not isinstance(raw, dict):
        return None
    named = [key for key in FAULT_KINDS if key in raw]
    return named[0] if len(named) == 1 else None


Fault = Annotated[
    Union[Annotated[Crash, Tag("crash")], Annotated[Partition, Tag("partition")],
          Annotated[LinkFaults, Tag("links")], Annotated[Slow, Tag("slow")]],
    Discriminator(_shape_of, custom_error_type="fault_shape",
                  custom_error_message="a fault names exactly one of crash, partition, links, "
                                       "slow (see the faults section in README)"),
]
"""One entry of `faults:`: a crash, a partition, link faults or a slowdown, told apart by the
key that names it (``crash``, ``partition``, ``links``, ``slow``)."""


def fault_kind(fault: Crash | Partition | LinkFaults | Slow) -> str:
    return {Crash: "crash", Partition: "partition", LinkFaults: "links", Slow: "slow"}[type(fault)]


def _any(patterns: tuple[str, ...], node: str) -> bool:
    return any(fnmatchcase(node, p) for p in patterns)


def nodes_of(pservers: int, trainers: int) -> list[str]:
    return [f"pserver:{j}" for j in range(pservers)] + [f"trainer:{i}" for i in range(trainers)]


def check_against(faults: list[Crash | Partition | LinkFaults | Slow], pservers: int,
                  trainers: int, *, mode: str) -> None:
    """Raise ValueError naming the fault (``faults[i]``) whose nodes are not in the cluster, or
    that the mode cannot recover from."""
    nodes = nodes_of(pservers, trainers)
    for i, fault in enumerate(faults):
        where = f"faults[{i}]"
        patterns: list[str] = []
        if isinstance(fault, Crash):
            if fault.crash not in nodes:
                raise ValueError(f"{where}: crash {fault.crash!r}: no such node in a cluster of "
                                 f"{pservers} pserver(s) and {trainers} trainer(s)")
            if fault.crash.startswith("trainer:") and mode not in ("sync", "async", "half_async"):
                raise ValueError(f"{where}: a trainer crash is supported in sync, async and "
                                 f"half_async modes, not {mode}")
        elif isinstance(fault, Partition):
            patterns = [*fault.partition[0], *fault.partition[1]]
            for side, group in zip(("first", "second"), fault.partition):
                if not group:
                    raise ValueError(f"{where}: the {side} group of the partition is empty")
        elif isinstance(fault, LinkFaults):
            patterns = list(fault.links)
        elif isinstance(fault, Slow):
            patterns = [fault.slow]
        for pattern in patterns:
            if not any(fnmatchcase(n, pattern) for n in nodes):
                raise ValueError(f"{where}: {pattern!r} matches no node of a cluster of "
                                 f"{pservers} pserver(s) and {trainers} trainer(s)")


def describe(fault: Crash | Partition | LinkFaults | Slow) -> str:
    """One line saying what `fault` does."""
    if isinstance(fault, Crash):
        back = f", restarted {fault.restart_after:g}s later" if fault.restart_after else ""
        return f"crash {fault.crash}{back}"
    if isinstance(fault, Partition):
        left, right = (",".join(group) for group in fault.partition)
        heal = f" for {fault.heal_after:g}s" if fault.heal_after else ""
        return f"partition ({left}) from ({right}){heal}"
    if isinstance(fault, LinkFaults):
        rates = [f"{name} {getattr(fault, name):g}" for name in
                 ("drop", "duplicate", "reorder", "delay") if getattr(fault, name)]
        if fault.delay:
            rates[-1] += f" by {fault.delay_by * 1e3:g}ms"
        return f"links {fault.links[0]}<->{fault.links[1]}: {', '.join(rates) or 'none'}"
    lasting = f" for {fault.duration:g}s" if fault.duration else ""
    return f"slow {fault.slow} x{fault.slowdown:g}{lasting}"
