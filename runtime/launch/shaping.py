"""Bandwidth limits on real links with Linux traffic control, for tests and runs whose nodes sit
in network namespaces (`tests/launch/test_netns.py`): the scenario's ``network`` bandwidth, which the
simulator models, applied to a node's interface as a token bucket filter (``tc qdisc ... tbf``).

A tbf qdisc on a device shapes what leaves through it: ``rate`` in bytes per second (the
scenario's units, `runtime.config.units.rate`), a ``burst`` bucket of the scenario's
``network.burst`` at that rate but never less than a millisecond (`BUCKET_SECONDS`), and a queue
that holds ``latency`` worth of data before it drops (TCP then resends).
`tbf_command` builds the command line; `shape` runs it in a namespace and raises `ShapingError`
naming the device and tc's complaint where traffic control is not available.
"""

from __future__ import annotations

import subprocess

__all__ = ["BUCKET_FRAMES", "BUCKET_SECONDS", "ShapingError", "bucket_bytes", "shape",
           "tbf_command"]

BUCKET_SECONDS = 0.001
"""The least bucket tbf is given: 1 ms of data at the rate (and at least `BUCKET_FRAMES` full
frames). A smaller one falls behind the rate wherever the kernel's timers fire late: 4 frames
at 1 Gbit/s are 48 us of tokens, and a 2x2 job stepped in 19.5 ms instead of 10.8. Each idle
interface then sends its first millisecond's worth at the veth's own speed, which the simulator
models when the scenario says ``network.burst: 1ms`` (`sim.network`); `runtime.launch.netns`
notes a scenario whose burst is smaller."""
BUCKET_FRAMES = 4


def bucket_bytes(rate: float, burst: float = 0.0) -> int:
    """The tbf bucket for `rate` bytes per second and a scenario's `burst` seconds: that much
    data at the rate, at least `BUCKET_SECONDS` of it and `BUCKET_FRAMES` frames."""
    return max(int(rate * max(burst, BUCKET_SECONDS)), BUCKET_FRAMES * 1514)


class ShapingError(RuntimeError):
    """tc could not shape the device (not installed, no permission, no such device)."""


def tbf_command(device: str, rate: float, latency: float = 1.0,
                namespace: str | None = None, burst: float = 0.0) -> list[str]:
    """The tc command that limits `device`'s egress to `rate` bytes per second, with the bucket
    of `bucket_bytes` for `burst` seconds."""
    if rate <= 0 or latency <= 0:
        raise ValueError(f"tbf on {device}: rate and latency must be > 0, got {rate}, {latency}")
    bits = int(rate * 8)
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    return [*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{bits}bit",
            "burst", str(bucket_bytes(rate, burst)), "latency", f"{int(latency * 1000)}ms"]


def shape(device: str, rate: float, namespace: str | None = None, latency: float = 1.0,
          burst: float = 0.0) -> None:
    """Limit `device` (in `namespace`) to `rate` bytes per second of egress, with a bucket of
    `burst` seconds at that rate (at least `BUCKET_SECONDS`)."""
    command = tbf_command(device, rate, latency, namespace, burst)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShapingError(f"tbf on {device}: {exc}") from None
    if done.returncode != 0:
        where = f" in {namespace}" if namespace else ""
        raise ShapingError(f"tbf on {device}{where}: {done.stderr.strip() or done.stdout.strip()}")
