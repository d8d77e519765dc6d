"""`wait_for_ports`: a trainer with ``wait_port`` waits until its pservers listen (loopback)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from runtime.network.ports import PortsNotReady, wait_for_ports

pytestmark = pytest.mark.timeout(30)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_listening_endpoints_are_ready_at_once() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await asyncio.wait_for(wait_for_ports("trainer:0", [f"127.0.0.1:{port}",
                                                            f"tcp://127.0.0.1:{port}"], 5.0), 5.0)
    finally:
        server.close()
        await server.wait_closed()


async def test_the_wait_ends_when_the_server_starts_listening() -> None:
    port = closed_port()
    waiting = asyncio.ensure_future(wait_for_ports("trainer:0", [f"127.0.0.1:{port}"], 20.0))
    await asyncio.sleep(0)  # the first probe is refused
    assert not waiting.done()
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
    try:
        await asyncio.wait_for(waiting, 10.0)
    finally:
        server.close()
        await server.wait_closed()


async def test_an_endpoint_nobody_serves_is_named_after_the_timeout() -> None:
    port = closed_port()
    with pytest.raises(PortsNotReady, match=rf"trainer:1: no pserver listening at "
                                            rf"127\.0\.0\.1:{port} after 0\.2s \(wait_port\)"):
        await wait_for_ports("trainer:1", [f"127.0.0.1:{port}"], 0.2)


async def test_endpoints_that_are_not_tcp_are_not_probed() -> None:
    await asyncio.wait_for(wait_for_ports("trainer:0", ["ipc:///tmp/nowhere"], 0.1), 5.0)
