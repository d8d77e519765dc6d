"""Waiting for pservers to listen before a trainer's first step (``wait_port``).

The original's `get_trainer_program(wait_port=True)` blocked until every pserver endpoint
accepted a TCP connection, so a trainer started before its pservers would not time out on its
first requests. A trainer program records that wish as its ``_wait_port`` attribute; a real
trainer node (`runtime.services.node`) and a Paddle script's executor
(`runtime.services.paddle_compat`, which reads it from the trainer's startup program, the first
it runs) honour it with `wait_for_ports`. Only plain
``host:port`` (TCP) endpoints can be probed; others are taken as ready. The simulator needs no
wait: its network queues a message until the server binds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


class PortsNotReady(TimeoutError):
    """Some pserver endpoints did not accept a connection within the time allowed."""

    def __init__(self, who: str, endpoints: Sequence[str], seconds: float) -> None:
        super().__init__(f"{who}: no pserver listening at {', '.join(endpoints)} after "
                         f"{seconds:g}s (wait_port)")
        self.endpoints = list(endpoints)


def _host_port(endpoint: str) -> tuple[str, int] | None:
    address = endpoint.removeprefix("tcp://")
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


async def _accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return True


async def wait_for_ports(who: str, endpoints: Sequence[str], timeout: float,
                         interval: float = 0.05) -> None:
    """Return once every TCP endpoint accepts a connection; raise `PortsNotReady` naming those
    that do not after `timeout` seconds. Probes back off from `interval` to 1 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    waiting = {ep: address for ep in endpoints if (address := _host_port(ep)) is not None}
    while waiting:
        up = await asyncio.gather(*(_accepts(*address) for address in waiting.values()))
        waiting = {ep: address for (ep, address), ok in zip(waiting.items(), up) if not ok}
        if not waiting:
            return
        if loop.time() >= deadline:
            raise PortsNotReady(who, list(waiting), timeout)
        await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
        interval = min(1.0, interval * 2)
