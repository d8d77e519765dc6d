"""Waiting for pservers to listen before a trainer's first step (``wait_port``).

The original's `get_trainer_program(wait_port=True)` blocked until every pserver endpoint
accepted a TCP connection, so a trainer started before its pservers would not time out on its
first requests. A trainer program records that wish as its ``_wait_port`` attribute; a real
trainer node (`runtime.services.node`) and a Paddle script's executor
(`runtime.services.paddle_compat`, which reads it from the trainer's startup program, the first
it runs) honour it with `wait_for_ports`. Plain ``host:port`` (TCP) endpoints are probed, or
their sockets in the job's directory when it talks over local sockets
(`runtime.network.local_sockets`); other addresses are taken as ready. The simulator needs no
wait: its network queues a message until the server binds.

Each probe (`probe`) resolves the host, connects, and reads the first bytes the peer sends: a
ZeroMQ socket greets every connection at once with the ZMTP signature (``0xFF``, 8 bytes,
``0x7F``), so an endpoint is ready only when that comes, and the probe closes the connection
(the pserver sees a peer that left during its handshake, as from any client that gave up).
Everything a probe waits for, the name lookup and the connect included, ends at the wait's
deadline: a host whose packets are dropped costs the timeout, not the kernel's minutes of SYN
retries. When the deadline passes, `PortsNotReady` names each endpoint not ready and why, as
the last probe found it:

- the name does not resolve (the resolver's own words), or the lookup did not answer in time;
- the connection was refused: nothing listens there;
- silent: no answer to the connect before the deadline (packets dropped by a firewall or a
  partition, a host that is down);
- not a pserver: a listener that accepted the connection but sent no ZeroMQ greeting within
  `GREETING_SECONDS`. One that answers with other bytes (an HTTP server) is a different
  service for sure: the wait ends at once, naming what it said.

A listener that accepts and closes without a word is waited for too: a TCP proxy in front of a
pserver that is not up yet does that.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.network.local_sockets import socket_path

GREETING_SECONDS = 1.0
"""How long a listener has to send its ZeroMQ greeting before it is taken for not a pserver."""
PROBE_FLOOR = 0.1
"""The least time a probe is given, the last one before the deadline too: enough for a lookup
and a connect that answer, so that the last probe says what the earlier ones found."""
SIGNATURE_BYTES = 10
"""The ZMTP signature: 0xFF, 8 bytes (padding, or the ZMTP 1.0 identity length), 0x7F."""


@dataclass(frozen=True)
class Probe:
    """What one look at an endpoint found."""

    ready: bool
    cause: str = ""
    """Why it is not ready, in words."""
    refused: bool = False
    """Nothing listens there (connection refused)."""
    other_service: bool = False
    """Something else answers there: waiting longer will not help."""


READY = Probe(True)


class PortsNotReady(TimeoutError):
    """Some pserver endpoints were not ready within the time allowed; the message names each
    and why (`causes`)."""

    def __init__(self, who: str, causes: Mapping[str, Probe], seconds: float) -> None:
        endpoints = ", ".join(causes)
        if all(p.refused for p in causes.values()):
            head = f"no pserver listening at {endpoints} after {seconds:g}s"
        elif any(p.other_service for p in causes.values()):
            head = f"not a pserver at {endpoints}"
        else:
            head = f"no pserver ready at {endpoints} after {seconds:g}s"
        why = "; ".join(f"{ep}: {p.cause}" for ep, p in causes.items())
        super().__init__(f"{who}: {head} (wait_port): {why}")
        self.endpoints = list(causes)
        self.causes = dict(causes)


async def probe_socket(path: str, seconds: float) -> Probe:
    """One look at the Unix socket `path` (a node's local socket,
    `runtime.network.local_sockets`) that ends within `seconds`: ready when it greets as
    ZeroMQ does."""
    seconds = max(seconds, PROBE_FLOOR)
    deadline = asyncio.get_running_loop().time() + seconds
    connected = await _connect(socket.AF_UNIX, path, seconds)
    if isinstance(connected, Probe):
        if not connected.refused and not os.path.exists(path):
            return Probe(False, f"no socket at {path} yet: nothing listens there", refused=True)
        return connected
    return await _greeted(connected, deadline)


def _look(address: tuple[str, int] | str, seconds: float) -> Awaitable[Probe]:
    """A probe of a TCP address or (a str) of a Unix socket's path."""
    if isinstance(address, str):
        return probe_socket(address, seconds)
    return probe(*address, seconds)


def _address(endpoint: str, ipc_dir: Path | None) -> tuple[str, int] | str | None:
    """What a probe looks at for `endpoint`: a TCP (host, port), or the path of its socket in
    `ipc_dir` (local sockets), or None (an address of another transport: taken as ready)."""
    address = _host_port(endpoint)
    if address is not None and ipc_dir is not None:
        return str(socket_path(ipc_dir, endpoint))
    return address


def _host_port(endpoint: str) -> tuple[str, int] | None:
    address = endpoint.removeprefix("tcp://")
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _is_greeting(data: bytes) -> bool:
    return len(data) >= SIGNATURE_BYTES and data[0] == 0xFF and data[9] == 0x7F


async def _resolve(host: str, port: int,
                   seconds: float) -> list[tuple[int, tuple[Any, ...]]] | Probe:
    """The addresses `host` has for TCP, or the `Probe` that says why there are none."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # no lookup to wait for
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return [(family, (host, port) if ip.version == 4 else (host, port, 0, 0))]
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), max(seconds, 0.0))
    except socket.gaierror as err:
        return Probe(False, f"{host} does not resolve ({err.strerror or err})")
    except TimeoutError:
        return Probe(False, f"looking up {host} did not answer in time")
    return [(family, address) for family, _, _, _, address in infos]


async def _connect(family: int, address: tuple[Any, ...] | str,
                   seconds: float) -> socket.socket | Probe:
    """A socket connected to `address` within `seconds`, or the `Probe` that says why not."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), max(seconds, 0.0))
        return sock
    except ConnectionRefusedError:
        failure = Probe(False, "connection refused: nothing listens there", refused=True)
    except TimeoutError:
        failure = Probe(False, "silent: no answer to connect before the deadline (packets "
                               "dropped by a firewall or a partition, or the host is down)")
    except OSError as err:
        failure = Probe(False, f"cannot connect: {(err.strerror or str(err)).lower()}")
    except BaseException:
        sock.close()
        raise
    sock.close()
    return failure


async def _greeting(sock: socket.socket, seconds: float) -> Probe:
    """Whether the peer on `sock` greets as ZeroMQ does within `seconds`."""
    loop = asyncio.get_running_loop()
    data, closed = b"", False
    try:
        async with asyncio.timeout(seconds):
            while len(data) < SIGNATURE_BYTES and not closed:
                chunk = await loop.sock_recv(sock, SIGNATURE_BYTES - len(data))
                data, closed = data + chunk, not chunk
    except TimeoutError:
        pass
    except OSError as err:
        return Probe(False, f"the connection failed: {(err.strerror or str(err)).lower()}")
    if _is_greeting(data):
        return READY
    if data and data[0] != 0xFF:
        return Probe(False, f"not a pserver: it answered {data!r}, not a ZeroMQ greeting",
                     other_service=True)
    if closed:
        return Probe(False, "it accepted the connection and closed it without a ZeroMQ "
                            "greeting (a proxy whose pserver is not up yet?)")
    within = f"within {seconds:g}s" if seconds >= GREETING_SECONDS else "before the deadline"
    return Probe(False, f"not a pserver: it accepted the connection but sent no ZeroMQ "
                        f"greeting {within}")


async def probe(host: str, port: int, seconds: float) -> Probe:
    """One look at `host`:`port` that ends within `seconds` (at least `PROBE_FLOOR`): ready when
    it greets as ZeroMQ does."""
    loop = asyncio.get_running_loop()
    seconds = max(seconds, PROBE_FLOOR)
    deadline = loop.time() + seconds
    addresses = await _resolve(host, port, seconds)
    if isinstance(addresses, Probe):
        return addresses
    found = Probe(False, f"{host} has no address for TCP")
    for family, address in addresses:
        connected = await _connect(family, address, deadline - loop.time())
        if isinstance(connected, Probe):
            found = connected
            continue
        return await _greeted(connected, deadline)
    return found


async def _greeted(connected: socket.socket, deadline: float) -> Probe:
    """Whether the peer on `connected` greets as ZeroMQ does by the loop time `deadline` (given
    at least `PROBE_FLOOR`, at most `GREETING_SECONDS`); the socket is closed after."""
    try:
        left = max(deadline - asyncio.get_running_loop().time(), PROBE_FLOOR)
        return await _greeting(connected, min(GREETING_SECONDS, left))
    finally:
        connected.close()


async def wait_for_ports(who: str, endpoints: Sequence[str], timeout: float,
                         interval: float = 0.05, ipc_dir: Path | None = None) -> None:
    """Return once every TCP endpoint (its socket in `ipc_dir` where given: local sockets)
    greets as a ZeroMQ socket does; raise `PortsNotReady`
    naming those that do not after `timeout` seconds, and why (at once for an endpoint where
    another service answers). Probes back off from `interval` to 1 s; each ends at the
    deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    waiting = {ep: address for ep in endpoints
               if (address := _address(ep, ipc_dir)) is not None}
    while waiting:
        left = deadline - loop.time()
        found = await asyncio.gather(*(_look(address, left) for address in waiting.values()))
        causes = {ep: p for ep, p in zip(waiting, found) if not p.ready}
        waiting = {ep: waiting[ep] for ep in causes}
        if not waiting:
            return
        if any(p.other_service for p in causes.values()):
            raise PortsNotReady(who, {ep: p for ep, p in causes.items() if p.other_service},
                                timeout)
        if loop.time() >= deadline:
            raise PortsNotReady(who, causes, timeout)
        await asyncio.sleep(min(interval, max(0.0, deadline - loop.time())))
        interval = min(1.0, interval * 2)
