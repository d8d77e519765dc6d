"""Bandwidth limits on real links with Linux traffic control, for tests and runs whose nodes sit
in network namespaces (`tests/test_netns.py`): the scenario's ``network`` bandwidth, which the
simulator models, applied to a node's interface as a token bucket filter (``tc qdisc ... tbf``).

A tbf qdisc on a device shapes what leaves through it: ``rate`` in bytes per second (the
scenario's units, `runtime.config.units.rate`), a ``burst`` bucket of a millisecond at that rate
(`BUCKET_SECONDS`), and a queue that holds ``latency`` worth of data before it drops (TCP then
resends).
`tbf_command` builds the command line; `shape` runs it in a namespace and raises `ShapingError`
naming the device and tc's complaint where traffic control is not available.
"""

from __future__ import annotations

import subprocess

__all__ = ["BUCKET_FRAMES", "BUCKET_SECONDS", "ShapingError", "shape", "tbf_command"]

BUCKET_SECONDS = 0.001
"""The bucket holds 1 ms of data at the rate (and at least `BUCKET_FRAMES` full frames). The
simulator's NICs have no bucket: they send at the rate from the first byte. A deeper bucket
(10 ms is 250 KB at 200 Mbit/s) lets a step's messages leave at the interface's own speed, and
a real run beat the rate its scenario states."""
BUCKET_FRAMES = 4


class ShapingError(RuntimeError):
    """tc could not shape the device (not installed, no permission, no such device)."""


def tbf_command(device: str, rate: float, latency: float = 1.0,
                namespace: str | None = None) -> list[str]:
    """The tc command that limits `device`'s egress to `rate` bytes per second."""
    if rate <= 0 or latency <= 0:
        raise ValueError(f"tbf on {device}: rate and latency must be > 0, got {rate}, {latency}")
    bits = int(rate * 8)
    burst = max(int(rate * BUCKET_SECONDS), BUCKET_FRAMES * 1514)
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    return [*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{bits}bit",
            "burst", str(burst), "latency", f"{int(latency * 1000)}ms"]


def shape(device: str, rate: float, namespace: str | None = None, latency: float = 1.0) -> None:
    """Limit `device` (in `namespace`) to `rate` bytes per second of egress."""
    command = tbf_command(device, rate, latency, namespace)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShapingError(f"tbf on {device}: {exc}") from None
    if done.returncode != 0:
        where = f" in {namespace}" if namespace else ""
        raise ShapingError(f"tbf on {device}{where}: {done.stderr.strip() or done.stdout.strip()}")
