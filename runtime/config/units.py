"""Units in scenario files: durations ("200us", "2s"), sizes ("4MB", "1GiB") and rates
("10Gbps", "50GB/s"), or plain SI numbers (seconds, bytes, bytes per second).

Rates are returned in bytes per second: "10Gbps" is 10e9 bits/s = 1.25e9 B/s, "50GB/s" is
50e9 B/s. Decimal prefixes are powers of 1000, binary ones (KiB, MiB, GiB) powers of 1024.
"""

from __future__ import annotations

import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
# seconds = number * multiplier / divisor: sub-second units divide, so "200us" is exactly 200e-6
_TIME = {"ns": (1.0, 1e9), "us": (1.0, 1e6), "µs": (1.0, 1e6), "ms": (1.0, 1e3), "s": (1.0, 1.0),
         "min": (60.0, 1.0), "h": (3600.0, 1.0)}
_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 1024.0, "Mi": 1024.0**2, "Gi": 1024.0**3, "Ti": 1024.0**4}


class UnitError(ValueError):
    """A value whose unit is unknown or whose number does not parse."""


def _split(text: str, what: str) -> tuple[float, str]:
    m = re.fullmatch(_NUMBER + r"\s*([A-Za-zµ/]*)", text.strip())
    if not m:
        raise UnitError(f"{what} {text!r} is not a number with a unit")
    return float(m.group(1)), m.group(2)


def duration(value: float | int | str) -> float:
    """Seconds from 1.5, "1.5s", "200us", "3ms", "2min"."""
    if isinstance(value, (int, float)):
        return float(value)
    number, unit = _split(value, "duration")
    if unit == "":
        return number
    if unit not in _TIME:
        raise UnitError(f"duration {value!r}: unknown unit {unit!r} (one of {', '.join(_TIME)})")
    multiplier, divisor = _TIME[unit]
    return number * multiplier / divisor


def size(value: float | int | str) -> float:
    """Bytes from 4096, "4KB", "4KiB", "1.5GB"."""
    if isinstance(value, (int, float)):
        return float(value)
    number, unit = _split(value, "size")
    if unit == "":
        return number
    if not unit.endswith("B") or unit[:-1] not in _PREFIX:
        raise UnitError(f"size {value!r}: unknown unit {unit!r} (B, KB, MB, GB, KiB, MiB, GiB...)")
    return number * _PREFIX[unit[:-1]]


def rate(value: float | int | str) -> float:
    """Bytes per second from "10Gbps", "100Mbit/s", "50GB/s", "1GiB/s" or a number (B/s)."""
    if isinstance(value, (int, float)):
        return float(value)
    number, unit = _split(value, "rate")
    if unit == "":
        return number
    for suffix, bytes_per_unit in (("bps", 0.125), ("bit/s", 0.125), ("B/s", 1.0), ("Bps", 1.0)):
        if unit.endswith(suffix) and unit[: -len(suffix)] in _PREFIX:
            return number * _PREFIX[unit[: -len(suffix)]] * bytes_per_unit
    raise UnitError(f"rate {value!r}: unknown unit {unit!r} (Gbps, Mbit/s, GB/s, MiB/s...)")


def flops(value: float | int | str) -> float:
    """FLOP/s from 2.0e12, "2TFLOPS", "900GFLOP/s"."""
    if isinstance(value, (int, float)):
        return float(value)
    number, unit = _split(value, "compute rate")
    for suffix in ("FLOPS", "FLOP/s", "flops"):
        if unit.endswith(suffix) and unit[: -len(suffix)] in _PREFIX:
            return number * _PREFIX[unit[: -len(suffix)]]
    if unit == "":
        return number
    raise UnitError(f"compute rate {value!r}: unknown unit {unit!r} (FLOPS, GFLOPS, TFLOPS)")
