"""The scenario's `network` section: one schema, applied both ways.

`sim run` carries every message across a simulated fabric with these parameters (`sim.network`);
`runtime up --netns` applies the same ones to real links (`runtime.launch.netns`: tc tbf for
bandwidth, a delaying relay or proxy for latency). So the section is part of the scenario schema
(`NetworkSection`, validated by `runtime.config.scenario` with the other sections: a typo is an
error naming the file, the line and the field), and it lives in the runtime layer, below the
simulator.

The section, in YAML::

    network:
      default: {latency: LATENCY, bandwidth: RATE}          # every link, unless a rule says
      links:                                                # later rules win, field by field
        - {between: [PATTERN, PATTERN], latency: LATENCY, bandwidth: RATE}
      nics:                                                 # caps on nodes' NIC rates
        - {nodes: PATTERN or [PATTERN, ...], bandwidth: RATE}
      burst: DURATION                                       # NICs' token bucket (default 0)
      framing: tcp | none                                   # what a rate counts (default tcp)

A LATENCY is a duration (``200us``, ``0.001``: a constant) or a distribution of one-way
latencies: ``{dist: constant, value: D}``, ``{dist: uniform, low: D, high: D}``, ``{dist:
normal, mean: D, std: D}`` (truncated at 0) or ``{dist: lognormal, median: D, sigma: X}``
(``sigma`` a plain number). A RATE is a number of bytes per second or a rate with a unit
(``10Gbps``, ``200Mbit/s``, ``1GiB/s``; `runtime.config.units`). Patterns are node names with shell
wildcards (``trainer:*``); a link rule covers both directions. ``burst`` gives every rate-limited
NIC a token bucket of that much time at its rate, as a token bucket filter or a cloud VM's
shaper has: an interface idle long enough sends that much at once, then at its rate (0, the
default: at the rate from the first byte, as a NIC's wire does). A rate counts what a NIC and
tc count, frames: ``framing: tcp`` (the default) adds to a message of S bytes the headers of
the TCP segments that carry it (`TCP_SEGMENT`, `SEGMENT_HEADERS`), about 4.6% of a large
message, so that a 200 Mbit/s link carries 23.9 MB of messages a second, not 25.0;
``framing: none`` counts the messages' bytes alone (hand computations of S / rate; `runtime up
--netns` shapes with tbf, which counts frames whatever the section says).

Three forms of the same network, each built from the one before:

- `NetworkSection`: the validated YAML (pydantic models, strict about unknown fields);
- `NetworkSpec`: its meaning, `NetworkSpec.from_section(section)`: a default `Latency` and
  bandwidth, `LinkRule`s and `NicRule`s, and `link(a, b)` / `nic_bandwidth(node)`, which
  resolve them for a pair of nodes the same way for the simulator and for a real run;
- `Latency` objects (`ConstantLatency`, ...), which draw one latency with a given
  `random.Random`: the simulator per message on a link, the proxy per message it forwards.

Latency distributions are tagged unions, and pydantic puts the tag (``lognormal``, ``scalar``)
in an error's location; `strip_tags` removes it, so errors read ``network.default.latency.sigma``.
"""

from __future__ import annotations

import abc
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal, NamedTuple, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, PlainValidator, Tag, ValidationError,
                      model_validator)

from runtime.config import units

TCP_SEGMENT = 1448
"""Bytes of a message one TCP segment carries on a 1500-byte MTU (IPv4, timestamps on)."""
SEGMENT_HEADERS = 66
"""What tc counts of a segment beyond its data: Ethernet 14, IPv4 20, TCP 20 + timestamps 12."""

__all__ = [
    "ConstantLatency", "Latency", "LinkParams", "LinkRule", "LogNormalLatency",
    "NetworkConfigError", "NetworkSection", "NetworkSpec", "NicRule", "NormalLatency",
    "UniformLatency", "fmt_rate", "fmt_seconds", "strip_tags",
]


class NetworkConfigError(ValueError):
    """A `network` section that does not validate (given as a plain mapping, outside a
    scenario); `field` is the path of the culprit, e.g. ``network.default.latency.sigma``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# ------------------------------------------------------------------------ latency distributions


class Latency(abc.ABC):
    """A distribution of one-way link latencies, in seconds."""

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> float:
        """One latency drawn with `rng`."""


@dataclass(frozen=True)
class ConstantLatency(Latency):
    value: float

    def __post_init__(self) -> None:
        _at_least_zero("value", self.value)

    def sample(self, rng: random.Random) -> float:
        return self.value

    def __str__(self) -> str:
        return fmt_seconds(self.value)


@dataclass(frozen=True)
class UniformLatency(Latency):
    low: float
    high: float

    def __post_init__(self) -> None:
        _at_least_zero("low", self.low)
        if not self.high >= self.low:
            raise ValueError(f"high must be >= low ({self.low!r}), got {self.high!r}")

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)

    def __str__(self) -> str:
        return f"uniform({fmt_seconds(self.low)}..{fmt_seconds(self.high)})"


@dataclass(frozen=True)
class NormalLatency(Latency):
    """Normal, truncated at 0: negative draws are redrawn (mean >= 0 keeps that rare)."""

    mean: float
    std: float

    def __post_init__(self) -> None:
        _at_least_zero("mean", self.mean)
        _at_least_zero("std", self.std)

    def sample(self, rng: random.Random) -> float:
        while True:
            value = rng.normalvariate(self.mean, self.std)
            if value >= 0.0:
                return value

    def __str__(self) -> str:
        return f"normal(mean {fmt_seconds(self.mean)}, std {fmt_seconds(self.std)})"


@dataclass(frozen=True)
class LogNormalLatency(Latency):
    """`median * exp(sigma * Z)`, Z standard normal: heavy-tailed, median `median`."""

    median: float
    sigma: float

    def __post_init__(self) -> None:
        if not 0.0 < self.median < math.inf:
            raise ValueError(f"median must be > 0, got {self.median!r}")
        _at_least_zero("sigma", self.sigma)

    def sample(self, rng: random.Random) -> float:
        return self.median * math.exp(self.sigma * rng.normalvariate(0.0, 1.0))

    def __str__(self) -> str:
        return f"lognormal(median {fmt_seconds(self.median)}, sigma {self.sigma:g})"


def _at_least_zero(name: str, value: float) -> None:
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


# ------------------------------------------------------------------------------ field types


def _unit(parse: Any, example: str) -> Any:
    """A validator of a number or a string with a unit; booleans and other types refused."""
    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"must be {example}, got {value!r}")
        return float(parse(value))  # a UnitError is a ValueError: reported at the field
    return convert


_parse_seconds = _unit(units.duration, "a duration such as 200us")
_parse_rate = _unit(units.rate, "a rate such as 10Gbps")


def _seconds(value: Any) -> float:
    seconds = _parse_seconds(value)
    if not 0.0 <= seconds < math.inf:
        raise ValueError(f"must be finite and >= 0, got {value!r}")
    return seconds


def _rate(value: Any) -> float:
    rate = _parse_rate(value)
    if not rate > 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return rate


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {value!r}")
    if not 0.0 <= value < math.inf:
        raise ValueError(f"must be finite and >= 0, got {value!r}")
    return float(value)


def _patterns(value: Any) -> tuple[str, ...]:
    patterns = [value] if isinstance(value, str) else value
    valid = isinstance(patterns, (list, tuple)) and all(isinstance(p, str) and p for p in patterns)
    if not valid or not patterns:
        raise ValueError(f"must be a node pattern or a list of them, got {value!r}")
    return tuple(patterns)


def _pair(value: Any) -> tuple[str, str]:
    patterns = _patterns(value)
    if len(patterns) != 2:
        raise ValueError(f"needs two node patterns, got {value!r}")
    return patterns[0], patterns[1]


Seconds = Annotated[float, PlainValidator(_seconds)]
"""A duration: seconds, or a number with a unit (``200us``, ``2ms``); finite, >= 0."""
Rate = Annotated[float, PlainValidator(_rate)]
"""A rate: bytes per second, or a number with a unit (``10Gbps``, ``200Mbit/s``,
``1GiB/s``); > 0."""
Sigma = Annotated[float, PlainValidator(_number)]
"""A plain number (no unit), finite, >= 0."""
Patterns = Annotated[tuple[str, ...], PlainValidator(_patterns)]
"""A node name pattern (shell wildcards: ``trainer:*``) or a list of them."""
Pair = Annotated[tuple[str, str], PlainValidator(_pair)]
"""Two node name patterns: the link between nodes matching them, either way."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------- the section's schema


class _LatencySpec(_Spec):
    """A latency distribution as written; `build` makes the `Latency` that samples it."""

    def build(self) -> Latency:
        raise NotImplementedError

    @model_validator(mode="after")
    def _buildable(self) -> "_LatencySpec":
        """The distribution's parameters are valid (a uniform's `high` >= `low`, a
        lognormal's `median` > 0)."""
        self.build()  # the distribution's own checks (median > 0, high >= low)
        return self


class ConstantSpec(_LatencySpec):
    """Every message takes the same latency (``latency: 200us`` is short for this)."""

    dist: Literal["constant"] = "constant"
    """Which distribution (may be left out for a constant)."""
    value: Seconds
    """The one-way latency."""

    def build(self) -> Latency:
        return ConstantLatency(self.value)


class UniformSpec(_LatencySpec):
    """Latencies drawn uniformly from [low, high]."""

    dist: Literal["uniform"]
    """Which distribution."""
    low: Seconds
    """The shortest latency."""
    high: Seconds
    """At least `low`."""

    def build(self) -> Latency:
        return UniformLatency(self.low, self.high)


class NormalSpec(_LatencySpec):
    """Latencies drawn from a normal distribution, negative draws redrawn."""

    dist: Literal["normal"]
    """Which distribution."""
    mean: Seconds
    """The mean before truncation."""
    std: Seconds
    """The standard deviation before truncation."""

    def build(self) -> Latency:
        return NormalLatency(self.mean, self.std)


class LogNormalSpec(_LatencySpec):
    """Heavy-tailed latencies: ``median * exp(sigma * Z)``, Z standard normal."""

    dist: Literal["lognormal"]
    """Which distribution."""
    median: Seconds
    """The median latency (> 0)."""
    sigma: Sigma
    """The spread of log(latency): 0 is constant, 1 a long tail."""

    def build(self) -> Latency:
        return LogNormalLatency(self.median, self.sigma)


class _UnknownDist(_LatencySpec):
    """Where a latency mapping without a known `dist` goes, to fail at its `dist` field (it
    never validates: a known `dist` is tagged with its own model)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    dist: Literal["constant", "uniform", "normal", "lognormal"]

    def build(self) -> Latency:
        raise ValueError(f"unknown latency distribution {self.dist!r}")


_DISTRIBUTIONS = {"constant": ConstantSpec, "uniform": UniformSpec, "normal": NormalSpec,
                  "lognormal": LogNormalSpec}
LATENCY_TAGS = frozenset({*_DISTRIBUTIONS, "scalar", "unknown"})
"""The tags pydantic puts after ``latency`` in an error's location (see `strip_tags`)."""


def _latency_tag(value: Any) -> str:
    if isinstance(value, _LatencySpec):
        return str(getattr(value, "dist"))  # a model already (model_copy, defaults)
    if isinstance(value, Mapping):
        dist = value.get("dist")
        return dist if isinstance(dist, str) and dist in _DISTRIBUTIONS else "unknown"
    return "scalar"


def _scalar_latency(value: Any) -> ConstantSpec:
    """``latency: 200us`` (or a number of seconds): a constant latency."""
    if isinstance(value, ConstantSpec):
        return value
    if isinstance(value, (list, tuple, set)):
        raise ValueError(f"must be a duration such as 200us or {{dist: ..., ...}}, got {value!r}")
    return ConstantSpec(value=_seconds(value))


LatencySpec = Annotated[
    Union[
        Annotated[ConstantSpec, Tag("constant")],
        Annotated[UniformSpec, Tag("uniform")],
        Annotated[NormalSpec, Tag("normal")],
        Annotated[LogNormalSpec, Tag("lognormal")],
        Annotated[ConstantSpec, PlainValidator(_scalar_latency), Tag("scalar")],
        Annotated[_UnknownDist, Tag("unknown")],
    ],
    Discriminator(_latency_tag),
]
"""A one-way latency: a duration (a constant), or ``{dist: constant | uniform | normal |
lognormal, ...}`` (the four `*Spec` models above)."""


class LinkDefaults(_Spec):
    """What every link has unless a rule of `links` says otherwise."""

    latency: LatencySpec | None = None
    """One-way latency (none: 0)."""
    bandwidth: Rate | None = None
    """Bytes per second each way (none: unlimited)."""


class LinkSpec(_Spec):
    """Latency and/or bandwidth for the links between nodes matching the two patterns."""

    between: Pair
    """The two ends' patterns."""
    latency: LatencySpec | None = None
    """Overrides the latency of these links (none: as before this rule)."""
    bandwidth: Rate | None = None
    """Overrides their bandwidth (none: as before this rule)."""

    @model_validator(mode="after")
    def _sets_something(self) -> "LinkSpec":
        """A link rule sets latency, bandwidth or both."""
        if self.latency is None and self.bandwidth is None:
            raise ValueError("sets neither latency nor bandwidth")
        return self


class NicSpec(_Spec):
    """A cap on the rate of the NICs of the nodes matching any of the patterns."""

    nodes: Patterns
    """The nodes whose NICs are capped."""
    bandwidth: Rate
    """The most these nodes' NICs send and take in, bytes per second each way."""


class NetworkSection(_Spec):
    """The scenario's `network` section, as written (see the module doc)."""

    default: LinkDefaults = LinkDefaults()
    """Every link's latency and bandwidth."""
    links: list[LinkSpec] = []
    """Rules for some links; later rules win, field by field."""
    nics: list[NicSpec] = []
    """Caps on some nodes' NIC rates; the last matching rule wins."""
    burst: Seconds = 0.0
    """Each rate-limited NIC's token bucket, in seconds of data at its rate, each way (0: none)."""
    framing: Literal["tcp", "none"] = "tcp"
    """What a rate counts: the frames of the TCP segments carrying a message (tcp), or its bytes
    alone (none)."""


def strip_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """`loc` (a pydantic error location) without the tags of latency distributions."""
    kept: list[Any] = []
    for part in loc:
        if kept and kept[-1] == "latency" and part in LATENCY_TAGS:
            continue
        kept.append(part)
    return tuple(kept)


def _built(spec: _LatencySpec | None) -> Latency | None:
    return None if spec is None else spec.build()


# ------------------------------------------------------------------------------- its meaning


class LinkParams(NamedTuple):
    latency: Latency
    bandwidth: float
    """Bytes per second; `math.inf` for no serialization delay."""


@dataclass(frozen=True)
class LinkRule:
    """Latency and/or bandwidth for links between nodes matching the two patterns."""

    between: tuple[str, str]
    latency: Latency | None = None
    bandwidth: float | None = None

    def matches(self, a: str, b: str) -> bool:
        """Whether the link a <-> b (either direction) falls under this rule."""
        p, q = self.between
        return (fnmatchcase(a, p) and fnmatchcase(b, q)) or (
            fnmatchcase(a, q) and fnmatchcase(b, p)
        )


@dataclass(frozen=True)
class NicRule:
    """A cap on the rate of the NICs of nodes matching any of the patterns."""

    nodes: tuple[str, ...]
    bandwidth: float

    def matches(self, node: str) -> bool:
        return any(fnmatchcase(node, pattern) for pattern in self.nodes)


@dataclass(frozen=True)
class NetworkSpec:
    """The `network` section's meaning: defaults, then link and NIC rules (later ones win)."""

    latency: Latency = ConstantLatency(0.0)
    bandwidth: float = math.inf
    links: tuple[LinkRule, ...] = ()
    nics: tuple[NicRule, ...] = ()
    burst: float = 0.0
    """Seconds of data at a NIC's rate its token bucket holds (0: none)."""
    framing: str = "tcp"

    def wire_bytes(self, nbytes: int) -> int:
        """What a message of `nbytes` weighs against a rate: with TCP framing, each segment's
        Ethernet, IPv4 and TCP headers (with timestamps) added, as tc counts a frame."""
        if self.framing == "none":
            return nbytes
        return nbytes + max(1, -(-nbytes // TCP_SEGMENT)) * SEGMENT_HEADERS

    @classmethod
    def from_section(cls, section: NetworkSection | None) -> NetworkSpec:
        """The meaning of a validated section (None: an ideal network)."""
        if section is None:
            return cls()
        default = section.default
        return cls(
            latency=cls.latency if default.latency is None else default.latency.build(),
            bandwidth=cls.bandwidth if default.bandwidth is None else default.bandwidth,
            links=tuple(LinkRule(rule.between, _built(rule.latency), rule.bandwidth)
                        for rule in section.links),
            nics=tuple(NicRule(rule.nodes, rule.bandwidth) for rule in section.nics),
            burst=section.burst,
            framing=section.framing,
        )

    @classmethod
    def parse(cls, spec: NetworkSection | Mapping[str, Any] | None) -> NetworkSpec:
        """A section validated already, or a plain mapping validated here (`NetworkConfigError`
        naming the first culprit), or None (an ideal network)."""
        if spec is None or isinstance(spec, NetworkSection):
            return cls.from_section(spec)
        try:
            section = NetworkSection.model_validate(spec)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in ("network", *strip_tags(tuple(first["loc"]))))
            raise NetworkConfigError(field, first["msg"].removeprefix("Value error, ")) from None
        return cls.from_section(section)

    def link(self, src: str, dst: str) -> LinkParams:
        """The parameters of the link between nodes `src` and `dst`."""
        latency, bandwidth = self.latency, self.bandwidth
        for rule in self.links:
            if rule.matches(src, dst):
                latency = latency if rule.latency is None else rule.latency
                bandwidth = bandwidth if rule.bandwidth is None else rule.bandwidth
        return LinkParams(latency, bandwidth)

    def nic_bandwidth(self, node: str) -> float:
        """The cap on `node`'s NIC rate (bytes per second; `math.inf` if no rule names it)."""
        cap = math.inf
        for rule in self.nics:
            if rule.matches(node):
                cap = rule.bandwidth
        return cap


# ------------------------------------------------------------------------------- formatting


def fmt_rate(rate: float) -> str:
    """Bytes per second as bits per second with an SI prefix: 25e6 -> ``200Mbit/s``."""
    if rate == math.inf:
        return "unlimited"
    bits = rate * 8
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g}{prefix}bit/s"
    return f"{bits:g}bit/s"


def fmt_seconds(seconds: float) -> str:
    """Seconds with the largest unit that keeps the number >= 1: 5e-5 -> ``50us``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{round(seconds / scale, 9):g}{unit}"
    return "0s" if seconds == 0 else f"{round(seconds * 1e9, 6):g}ns"
