"""The scenario's `faults:` section, one class per kind of fault: its schema, what it means, and
how it acts on a run; the single description of every fault.

Each entry of the list is one fault, of the kind its key names (`FAULT_TYPES`): ``crash``,
``partition``, ``links``, ``slow`` or ``pause``. A fault class holds, in one place:

- its fields (the schema, with units: ``1.5s``, ``300ms``) and their descriptions;
- what it means (the class docstring) and an example;
- how `sim run` and `runtime up` realise it (`in_simulator`, `in_runtime_up`), for the docs;
- how it acts on the run when it begins and ends (`begin`, `end`), through a `Firing`: the
  run's `FaultActions` (a `runtime.faults.schedule.FaultTarget`), the nodes it acts on and the
  faults in force; and how long it lasts (`lasting`). `runtime.faults.schedule.FaultSchedule`
  decides when: ``at`` is a time since the job started (``1.5s``) or ``"step N"``, the moment
  the first trainer has finished N steps.

Node names are ``pserver:<i>`` / ``trainer:<i>``; groups and links take shell patterns
(``trainer:*``), and each must name at least one node of the cluster. `check_against(faults,
pservers, trainers, ...)` checks the names and what recovery needs. `reference()` renders
docs/faults.md and `readme_table()` the README's table from these classes (``python -m
runtime.config.faults`` rewrites both; a test checks they are current).

A new kind of fault is one class here (added to `FAULT_TYPES`), the `FaultActions` methods it
calls, implemented by the simulator's target (`sim.faults.SimTarget`) and runtime up's
(`runtime.faults.inject.RuntimeTarget`), and a case in tests/support/fault_contract.py.

DESIGN: `FaultActions` and `Firing` are Protocols defined here, not the schedule's classes
imported, so that this description of the faults (read by the scenario) depends on no part of
`runtime` after `runtime.config`; `runtime.faults.schedule` implements them.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Protocol, TypeVar, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, PlainSerializer,
                      Tag, field_validator)

from runtime.config import units
from runtime.config.nodes import NODE_NAME, is_trainer, node_names
from transpiler.distribute.modes import MODES

_STEP = re.compile(r"\s*step\s+(\d+)\s*")

REORDER_WAIT = 0.005
"""Longest a message held back for reordering waits for the next one on its link (seconds),
in the simulator and in runtime up's fault proxy alike."""


class FaultActions(Protocol):
    """What a fault can do to a run. Node names are ``pserver:<i>`` / ``trainer:<i>``. A
    method that returns a note says what it did, for the event's detail (empty: nothing worth
    saying)."""

    def crash(self, node: str, returning: bool) -> str | None:
        """Kill `node` now; with `returning`, `restart` follows and the run waits for it.
        None: it was not running, nothing was done."""

    def restart(self, node: str) -> None:
        """Start the crashed `node` again."""

    def set_partitions(self, partitions: tuple[Partition, ...]) -> None:
        """The partitions in force from now on (none: every cut healed)."""

    def set_link_rules(self, rules: tuple[LinkFaults, ...]) -> None:
        """The link rules in force from now on, in the order they began."""

    def slow(self, node: str, factor: float) -> str:
        """Make `node` `factor` times slower, on top of any slowdown already in force."""

    def unslow(self, node: str, factor: float) -> str:
        """End one slowdown of `node` by `factor`."""

    def pause(self, node: str) -> str:
        """Stop `node` where it is: nothing of it runs, what is sent to it waits."""

    def resume(self, node: str) -> None:
        """Let the paused `node` go on."""


F = TypeVar("F", bound="_Fault")


class Firing(Protocol):
    """What a fault's `begin` and `end` act through: the run's actions, the nodes the fault
    acts on, the faults in force, and its event's detail."""

    nodes: list[str]

    @property
    def target(self) -> FaultActions: ...

    def in_force(self, kind: type[F]) -> tuple[F, ...]:
        """The faults of `kind` in force now, in the order they began."""

    def note(self, text: str) -> None:
        """Add `text` to the event's detail (once)."""

    def nothing(self, why: str) -> None:
        """The fault found nothing to act on: it ends as it begins, and says `why`."""


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


def _written(trigger: Trigger) -> str | float:
    """A trigger as a scenario writes it (``"step N"``, or seconds), so that a scenario dumped
    as JSON (a node's job file, `runtime collect`) reads back the same."""
    return f"step {trigger.step}" if trigger.step is not None else trigger.seconds or 0.0


At = Annotated[Trigger, BeforeValidator(_trigger), PlainSerializer(_written)]
"""When: a time since the job started (``1.5s``, or seconds) or ``"step N"`` (when the first
trainer has finished N steps)."""
Duration = Annotated[float, BeforeValidator(_duration)]
"""A duration > 0: seconds, or a number with a unit (``300ms``)."""
AT = "when it begins: a time since the job started (`1.5s`) or `\"step N\"`"


class _Fault(BaseModel):
    """What every kind of fault has: see the module doc."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    kind: ClassVar[str]
    """The key that names this kind of fault in a scenario."""
    example: ClassVar[str]
    in_simulator: ClassVar[str]
    """How `sim run` realises it."""
    in_runtime_up: ClassVar[str]
    """How `runtime up` realises it."""
    in_role_mode: ClassVar[str]
    """How ``runtime up --role`` (one node per host, `runtime.launch.role`) realises it."""
    reverted_at_close: ClassVar[bool] = True
    """Whether the end of the run ends it too (`end` is called), or it is left as it is."""

    at: At | None

    def patterns(self) -> list[str]:
        """The node names and patterns it names."""
        raise NotImplementedError

    def nodes(self, cluster: Sequence[str]) -> list[str]:
        """The nodes of `cluster` it acts on, in the cluster's order."""
        patterns = self.patterns()
        return [n for n in cluster if any(fnmatchcase(n, p) for p in patterns)]

    def lasting(self) -> float | None:
        """Seconds from its beginning to its end; None: to the end of the run."""
        raise NotImplementedError

    def begin(self, firing: Firing) -> bool:
        """Make it happen on `firing.target`; False: there was nothing to do it to."""
        raise NotImplementedError

    def end(self, firing: Firing) -> None:
        """Undo it on `firing.target`."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line saying what it does."""
        raise NotImplementedError


class Crash(_Fault):
    """The node dies without warning, messages in flight to it lost, and with `restart_after`
    comes back that long after: a pserver from its last checkpoint (`train.checkpoint_every`;
    without one, from its initial state), the trainers redoing the steps it lost; a trainer
    joining the fan-in afresh. A node that is not running (already crashed, or done) is left
    alone. A trainer due back after every pserver has finished the job is not started again:
    the run ends without it and the crash's event lasts to the end (`end` null; role mode's
    supervisor of that trainer, which cannot see the pservers, does restart it). Under
    `runtime up`, one restarted while the pservers were exiting, with no job left to join
    either, is stopped a second after they have: its exit is not the run's failure."""

    kind: ClassVar[str] = "crash"
    example: ClassVar[str] = '{at: "step 45", crash: "pserver:1", restart_after: 1s}'
    in_simulator: ClassVar[str] = (
        "the node's tasks are cancelled and its transport closed; rebuilt after "
        "`restart_after`")
    in_runtime_up: ClassVar[str] = (
        "SIGKILL to the node's process group; started again after `restart_after`: a pserver "
        "with `--recover`, a trainer with `--incarnation N`")
    in_role_mode: ClassVar[str] = (
        "the crashed node's own `runtime up --role` SIGKILLs its node's process group and, with "
        "`restart_after`, starts it again as `runtime up` does; the other hosts do nothing")
    reverted_at_close: ClassVar[bool] = False

    at: At = Field(description=AT)
    crash: str = Field(description="the node, `pserver:<i>` or `trainer:<i>` (no pattern)")
    restart_after: Duration | None = Field(
        None, description="how long after the crash it starts again; none: never")

    @field_validator("crash")
    @classmethod
    def _one_node(cls, v: str) -> str:
        if not NODE_NAME.fullmatch(v):
            raise ValueError(f"crash names one node, pserver:<i> or trainer:<i>, not {v!r}")
        return v

    def patterns(self) -> list[str]:
        return [self.crash]

    def lasting(self) -> float | None:
        return self.restart_after

    def begin(self, firing: Firing) -> bool:
        note = firing.target.crash(self.crash, returning=self.restart_after is not None)
        if note is None:
            firing.nothing("not running: nothing to crash")
            return False
        firing.note(note)
        return True

    def end(self, firing: Firing) -> None:
        firing.target.restart(self.crash)

    def describe(self) -> str:
        back = f", restarted {self.restart_after:g}s later" if self.restart_after else ""
        return f"crash {self.crash}{back}"


class Partition(_Fault):
    """Every message between a node of the first group and one of the second (either way) is
    lost, as over a cut cable under live connections, until it heals. A message already on its
    way when the cut begins still arrives. A trainer cut off from the pservers for longer than
    `train.heartbeat_timeout` is dropped from the fan-in; heard from again, it joins again (in
    sync mode its next request is answered with a notice to), and if every pserver has
    finished the job meanwhile the run ends without it (`runtime up` stops it a second after
    they have; its exit is not the run's failure)."""

    kind: ClassVar[str] = "partition"
    example: ClassVar[str] = \
        '{at: "step 20", partition: [["trainer:0"], ["pserver:*"]], heal_after: 1s}'
    in_simulator: ClassVar[str] = \
        "messages sent between the two groups are lost until it heals"
    in_runtime_up: ClassVar[str] = (
        "the fault proxy in front of each pserver drops the messages of the cut trainers' "
        "connections (TCP stays up); only trainer-pserver links exist to cut")
    in_role_mode: ClassVar[str] = (
        "each pserver's own `runtime up --role` puts the fault proxy in front of its pserver "
        "and cuts that pserver's links as `runtime up` does; the trainers' hosts do nothing")

    at: At = Field(description=AT)
    partition: tuple[tuple[str, ...], tuple[str, ...]] = Field(
        description="the two groups of nodes (patterns), each a list")
    heal_after: Duration | None = Field(None, description="how long it lasts; none: for good")

    def cuts(self, a: str, b: str) -> bool:
        """Whether the link between nodes `a` and `b` (either way) crosses the partition."""
        left, right = self.partition
        return (_any(left, a) and _any(right, b)) or (_any(left, b) and _any(right, a))

    def patterns(self) -> list[str]:
        return [*self.partition[0], *self.partition[1]]

    def lasting(self) -> float | None:
        return self.heal_after

    def begin(self, firing: Firing) -> bool:
        firing.target.set_partitions(firing.in_force(Partition))
        return True

    def end(self, firing: Firing) -> None:
        firing.target.set_partitions(firing.in_force(Partition))

    def describe(self) -> str:
        left, right = (",".join(group) for group in self.partition)
        heal = f" for {self.heal_after:g}s" if self.heal_after else ""
        return f"partition ({left}) from ({right}){heal}"


Probability = Annotated[float, Field(ge=0.0, lt=1.0)]
"""A probability in [0, 1)."""


class LinkFaults(_Fault):
    """Each message on a matching link, either direction, is dropped, duplicated (delivered
    twice, the copy right behind it), reordered or delayed, each with its probability, drawn
    per directed link from a generator seeded by the run's seed and the link. Reordered: held
    back until the next message on its link has gone, then sent right behind it; if none comes
    within `REORDER_WAIT` (5 ms) of its sending it goes alone; holding it adds nothing to its
    own latency and delay, which count from its sending. Delayed: it arrives ``delay_by``
    late, and later messages on its link queue behind it (order per link is kept). Several
    rules on one link each draw for themselves: a message is dropped, duplicated (still two
    copies, never more) or reordered if any rule says so, and the delays add up. A dropped
    message is not duplicated. Without ``at`` it holds from before the first message."""

    kind: ClassVar[str] = "links"
    example: ClassVar[str] = ('{links: ["trainer:*", "pserver:*"], drop: 0.05, duplicate: '
                              '0.05, reorder: 0.05, delay: 0.1, delay_by: 20ms}')
    in_simulator: ClassVar[str] = \
        "each message's fate is drawn per link from the seed as it leaves its sender's NIC"
    in_runtime_up: ClassVar[str] = (
        "the same fates, drawn per (trainer, pserver) connection by the fault proxy in front of "
        "each pserver (`runtime/faults/proxy.py`), seeded by the scenario's seed; only "
        "trainer-pserver links exist")
    in_role_mode: ClassVar[str] = (
        "each pserver's own `runtime up --role` puts the fault proxy in front of its pserver, "
        "which draws the fates of that pserver's links from the same seeds as `runtime up`'s; "
        "the trainers' hosts do nothing")

    links: tuple[str, str] = Field(description="the two ends of the links (patterns)")
    drop: Probability = Field(0.0, description="chance a message is lost")
    duplicate: Probability = Field(0.0, description="chance it is delivered twice")
    reorder: Probability = Field(0.0, description="chance the next message overtakes it")
    delay: Probability = Field(0.0, description="chance it is delayed by `delay_by`")
    delay_by: Duration = Field(0.01, description="how much a delayed message is late")
    at: At | None = Field(None, description=AT + "; none: from the start")
    duration: Duration | None = Field(None, alias="for",
                                      description="how long it lasts; none: to the end")

    def matches(self, src: str, dst: str) -> bool:
        a, b = self.links
        return (fnmatchcase(src, a) and fnmatchcase(dst, b)) or \
            (fnmatchcase(src, b) and fnmatchcase(dst, a))

    def patterns(self) -> list[str]:
        return list(self.links)

    def lasting(self) -> float | None:
        return self.duration

    def begin(self, firing: Firing) -> bool:
        firing.target.set_link_rules(firing.in_force(LinkFaults))
        return True

    def end(self, firing: Firing) -> None:
        firing.target.set_link_rules(firing.in_force(LinkFaults))

    def describe(self) -> str:
        rates = [f"{name} {getattr(self, name):g}" for name in
                 ("drop", "duplicate", "reorder", "delay") if getattr(self, name)]
        if self.delay:
            rates[-1] += f" by {self.delay_by * 1e3:g}ms"
        return f"links {self.links[0]}<->{self.links[1]}: {', '.join(rates) or 'none'}"


class Slow(_Fault):
    """The node (every node the pattern matches) runs `slowdown` times slower for a while, for
    good without ``for``. Slowdowns of one node in force together multiply."""

    kind: ClassVar[str] = "slow"
    example: ClassVar[str] = '{at: "step 20", slow: "trainer:1", slowdown: 4, for: 2s}'
    in_simulator: ClassVar[str] = "its modelled compute costs `slowdown` times as much"
    in_runtime_up: ClassVar[str] = (
        "the process is paused (SIGSTOP) `1 - 1/slowdown` of every 20 ms and resumed "
        "(SIGCONT) for the rest: the whole node, its replies as much as its compute")
    in_role_mode: ClassVar[str] = (
        "the slowed node's own `runtime up --role` pauses it as `runtime up` does")

    at: At = Field(description=AT)
    slow: str = Field(description="the node (a pattern)")
    slowdown: float = Field(gt=1.0, description="how many times slower, > 1")
    duration: Duration | None = Field(None, alias="for",
                                      description="how long it lasts; none: to the end")

    def patterns(self) -> list[str]:
        return [self.slow]

    def lasting(self) -> float | None:
        return self.duration

    def begin(self, firing: Firing) -> bool:
        for node in firing.nodes:
            firing.note(firing.target.slow(node, self.slowdown))
        return True

    def end(self, firing: Firing) -> None:
        for node in firing.nodes:
            firing.note(firing.target.unslow(node, self.slowdown))

    def describe(self) -> str:
        lasting = f" for {self.duration:g}s" if self.duration else ""
        return f"slow {self.slow} x{self.slowdown:g}{lasting}"


class Pause(_Fault):
    """The node (every node the pattern matches) stops for `for`, as a process stopped (Ctrl-Z,
    SIGSTOP) or a machine suspended or stalled, then goes on where it was: nothing of it runs
    meanwhile, neither its compute nor its replies nor its heartbeats, and what is sent to it
    waits unread (nothing is lost). A paused pserver holds up the job without dropping a
    trainer (its watchdog counts only the time it was running); a paused trainer is dropped
    from the fan-in once silent for `train.heartbeat_timeout`, and joins again when it
    resumes."""

    kind: ClassVar[str] = "pause"
    example: ClassVar[str] = '{at: "step 20", pause: "pserver:1", for: 1s}'
    in_simulator: ClassVar[str] = (
        "what the node would run meanwhile (its sleeps, compute, retries, watchdog) and the "
        "messages reaching it wait until it resumes, then run late, in order")
    in_runtime_up: ClassVar[str] = (
        "SIGSTOP to the node's process group, SIGCONT after `for`")
    in_role_mode: ClassVar[str] = (
        "the paused node's own `runtime up --role` pauses it as `runtime up` does")

    at: At = Field(description=AT)
    pause: str = Field(description="the node (a pattern)")
    duration: Duration = Field(alias="for", gt=0, description="how long it stays stopped")

    def patterns(self) -> list[str]:
        return [self.pause]

    def lasting(self) -> float | None:
        return self.duration

    def begin(self, firing: Firing) -> bool:
        for node in firing.nodes:
            firing.note(firing.target.pause(node))
        return True

    def end(self, firing: Firing) -> None:
        for node in firing.nodes:
            firing.target.resume(node)

    def describe(self) -> str:
        return f"pause {self.pause} for {self.duration:g}s"


FAULT_TYPES: tuple[type[_Fault], ...] = (Crash, Partition, LinkFaults, Slow, Pause)
"""Every kind of fault, in the order the docs list them."""
FAULT_KINDS = tuple(t.kind for t in FAULT_TYPES)
AnyFault = Crash | Partition | LinkFaults | Slow | Pause


def _shape_of(raw: Any) -> str | None:
    """The key that says which fault an entry is (None: no single one, an error)."""
    if isinstance(raw, _Fault):
        return raw.kind
    if not isinstance(raw, dict):
        return None
    named = [key for key in FAULT_KINDS if key in raw]
    return named[0] if len(named) == 1 else None


if TYPE_CHECKING:
    Fault = AnyFault
else:
    Fault = Annotated[
        Union[tuple(Annotated[t, Tag(t.kind)] for t in FAULT_TYPES)],
        Discriminator(_shape_of, custom_error_type="fault_shape",
                      custom_error_message="a fault names exactly one of "
                                           f"{', '.join(FAULT_KINDS)} (see docs/faults.md)"),
    ]
"""One entry of the `faults:` list, parsed into the class its key names."""


def _any(patterns: tuple[str, ...], node: str) -> bool:
    return any(fnmatchcase(node, p) for p in patterns)



def check_against(faults: Sequence[AnyFault], pservers: int, trainers: int, *,
                  mode: str) -> None:
    """Raise ValueError naming the fault (``faults[i]``) whose nodes are not in the cluster, or
    that the mode cannot recover from."""
    nodes = node_names(pservers, trainers)
    for i, fault in enumerate(faults):
        where = f"faults[{i}]"
        if isinstance(fault, Crash):
            if fault.crash not in nodes:
                raise ValueError(f"{where}: crash {fault.crash!r}: no such node in a cluster of "
                                 f"{pservers} pserver(s) and {trainers} trainer(s)")
            if is_trainer(fault.crash) and mode in MODES and not MODES[mode].trainer_crash:
                crashable = [m.name for m in MODES.values() if m.trainer_crash]
                raise ValueError(f"{where}: a trainer crash is supported in "
                                 f"{', '.join(crashable)} modes, not {mode}")
            continue
        if isinstance(fault, Partition):
            for side, group in zip(("first", "second"), fault.partition):
                if not group:
                    raise ValueError(f"{where}: the {side} group of the partition is empty")
        for pattern in fault.patterns():
            if not any(fnmatchcase(n, pattern) for n in nodes):
                raise ValueError(f"{where}: {pattern!r} matches no node of a cluster of "
                                 f"{pservers} pserver(s) and {trainers} trainer(s)")


# -- the docs, from the classes --------------------------------------------------------------------

def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def readme_table() -> str:
    """The README's table of the faults: shape, example, and how each side realises it."""
    rows = ["| shape | example | `sim run` | `runtime up` |", "|---|---|---|---|"]
    rows += [f"| {t.kind} | `{t.example}` | {_cell(t.in_simulator)} | {_cell(t.in_runtime_up)} |"
             for t in FAULT_TYPES]
    return "\n".join(rows) + "\n"


def reference() -> str:
    """docs/faults.md: each fault's meaning, fields and realisations, from its class."""
    out = ["# Faults", "",
           "<!-- generated from runtime/config/faults.py by `python -m runtime.config.faults`; edit there -->",
           "", "A scenario's `faults:` list says what goes wrong, where and when. Both `sim run` "
           "and `runtime up` read it, and one schedule (`runtime/faults/schedule.py`) fires each "
           "fault at its `at` and ends it when it lasts no longer, on the simulator's target "
           "(`sim/faults.py`) or on runtime up's (`runtime/faults/inject.py`).", "",
           "With one node per host (`runtime up SCENARIO --role R --index N`, "
           "`runtime/launch/role.py`) every host runs the same schedule and acts out what "
           "concerns its own node, under a supervisor of that one node: `at: 1.5s` counts from "
           "when the host started its node, `at: \"step N\"` fires when its node reports N steps "
           "done (a trainer its steps, a pserver its updates). The supervisor writes what it did "
           "beside its node's record (`nodes/<role>-<index>.faults.json`: the events of its "
           "node's faults, its proxy's counters), and `runtime collect` merges every host's into "
           "`metrics.json`'s `faults` and `proxies` as `runtime up` lists them "
           "(`runtime/launch/collect.py`).", "",
           "A job's fault proxies take part in its CurveZMQ (`runtime/faults/curve_proxy.py`): "
           "each is a CURVE server to the trainers with its pserver's keys and a CURVE client "
           "of its pserver, so a job with message faults stays encrypted and authenticated "
           "(SECURITY.md), `runtime up --netns`'s too (each made in its pserver's network "
           "namespace).", ""]
    for t in FAULT_TYPES:
        out += [f"## {t.kind}", "", f"`{t.example}`", "", _cell(t.__doc__ or ""), "",
                "| field | meaning |", "|---|---|"]
        for name, info in t.model_fields.items():
            key = info.alias or name
            default = "" if info.is_required() else f" (default {info.default!r})"
            out.append(f"| `{key}` | {_cell(info.description or '')}{default} |")
        out += ["", f"- `sim run`: {_cell(t.in_simulator)}",
                f"- `runtime up`: {_cell(t.in_runtime_up)}",
                f"- `runtime up --role`: {_cell(t.in_role_mode)}", ""]
    return "\n".join(out)


README_TABLE_START = "<!-- fault table: generated from runtime/config/faults.py -->\n"


def write_docs(root: Path) -> None:
    """Rewrite docs/faults.md and the README's fault table under `root` from the classes."""
    (root / "docs" / "faults.md").write_text(reference())
    readme = root / "README.md"
    text = readme.read_text()
    start = text.index(README_TABLE_START) + len(README_TABLE_START)
    end = text.index("\n\n", start) + 1
    readme.write_text(text[:start] + readme_table() + text[end:])


if __name__ == "__main__":
    write_docs(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())
