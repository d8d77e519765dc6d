"""`wait_for_ports`: a trainer with ``wait_port`` waits until its pservers listen (loopback);
a trainer node (`run_trainer`) waits before its first step, and names the endpoints nobody
serves after ``train.startup_timeout``. The wait ends at its deadline whatever the endpoint does
and names the real cause: a name that does not resolve, nothing listening, a silent endpoint, or
a listener that is not a pserver. Everything here stays on loopback."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
import zmq

from runtime.config.scenario import parse_scenario
from runtime.network.ports import PortsNotReady, wait_for_ports
from runtime.services.job import Job
from runtime.services.node import run_trainer, serve_pserver

pytestmark = pytest.mark.timeout(30)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def router() -> Iterator[zmq.Socket[bytes]]:
    """A ZeroMQ ROUTER socket, not yet bound: what a pserver listens with."""
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        context.term()


async def test_listening_endpoints_are_ready_at_once(router: zmq.Socket[bytes]) -> None:
    port = router.bind_to_random_port("tcp://127.0.0.1")
    await asyncio.wait_for(wait_for_ports("trainer:0", [f"127.0.0.1:{port}",
                                                        f"tcp://127.0.0.1:{port}"], 5.0), 5.0)


async def test_the_wait_ends_when_the_server_starts_listening(
        router: zmq.Socket[bytes]) -> None:
    port = closed_port()
    waiting = asyncio.ensure_future(wait_for_ports("trainer:0", [f"127.0.0.1:{port}"], 20.0))
    await asyncio.sleep(0)  # the first probe is refused
    assert not waiting.done()
    router.bind(f"tcp://127.0.0.1:{port}")
    await asyncio.wait_for(waiting, 10.0)


async def test_an_endpoint_nobody_serves_is_named_after_the_timeout() -> None:
    port = closed_port()
    with pytest.raises(PortsNotReady, match=rf"trainer:1: no pserver listening at "
                                            rf"127\.0\.0\.1:{port} after 0\.2s \(wait_port\)"):
        await wait_for_ports("trainer:1", [f"127.0.0.1:{port}"], 0.2)


async def test_endpoints_that_are_not_tcp_are_not_probed() -> None:
    await asyncio.wait_for(wait_for_ports("trainer:0", ["ipc:///tmp/nowhere"], 0.1), 5.0)


# -- the cause, named ------------------------------------------------------------------------------

async def not_ready(endpoint: str, timeout: float) -> PortsNotReady:
    with pytest.raises(PortsNotReady) as caught:
        await wait_for_ports("trainer:0", [endpoint], timeout)
    assert caught.value.endpoints == [endpoint]
    return caught.value


@pytest.fixture
def backlog_full() -> Iterator[int]:
    """A loopback port whose listener's accept queue is full, so that a new connect gets no
    answer (Linux drops the SYN): a silent endpoint that never leaves the host."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(4):  # fill the queue: until one connect is not answered
            filler = socket.socket()
            fillers.append(filler)
            filler.settimeout(0.2)
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        else:
            pytest.skip("this kernel answers a connect to a full accept queue")
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def serve(answer: bytes) -> asyncio.Server:
    """A loopback TCP server that sends `answer` (if any) on each connection and keeps it."""
    held: list[asyncio.StreamWriter] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if answer:
            writer.write(answer)
            await writer.drain()

    return await asyncio.start_server(on_connect, "127.0.0.1", 0)


async def test_a_name_that_does_not_resolve_is_named_with_the_resolvers_words() -> None:
    err = await not_ready("pslab-test-host.invalid:6170", 0.5)
    assert str(err).startswith("trainer:0: no pserver ready at pslab-test-host.invalid:6170 "
                               "after 0.5s (wait_port): pslab-test-host.invalid:6170: ")
    assert ": pslab-test-host.invalid does not resolve (" in str(err) or \
        "looking up pslab-test-host.invalid did not answer in time" in str(err), str(err)


async def test_a_refused_port_says_nothing_listens() -> None:
    endpoint = f"127.0.0.1:{closed_port()}"
    err = await not_ready(endpoint, 0.3)
    assert str(err) == (f"trainer:0: no pserver listening at {endpoint} after 0.3s "
                        f"(wait_port): {endpoint}: connection refused: nothing listens there")


async def test_a_silent_endpoint_costs_the_timeout_and_is_called_silent(
        backlog_full: int) -> None:
    endpoint = f"127.0.0.1:{backlog_full}"
    err = await not_ready(endpoint, 0.5)
    assert f"{endpoint}: silent: no answer to connect before the deadline" in str(err)


async def test_a_listener_that_says_nothing_is_not_a_pserver() -> None:
    server = await serve(b"")
    try:
        endpoint = "127.0.0.1:{}".format(server.sockets[0].getsockname()[1])
        err = await not_ready(endpoint, 0.5)
    finally:
        server.close()
    assert str(err).endswith(f"{endpoint}: not a pserver: it accepted the connection but sent "
                             "no ZeroMQ greeting before the deadline")


async def test_another_service_ends_the_wait_at_once_naming_what_it_said() -> None:
    """An HTTP server is not a pserver and will not become one: no waiting for the timeout
    (60 s here, past the test's own timeout)."""
    server = await serve(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    try:
        endpoint = "127.0.0.1:{}".format(server.sockets[0].getsockname()[1])
        err = await not_ready(endpoint, 60)
    finally:
        server.close()
    assert str(err) == (f"trainer:0: not a pserver at {endpoint} (wait_port): {endpoint}: not "
                        "a pserver: it answered b'HTTP/1.0 4', not a ZeroMQ greeting")


async def test_each_endpoint_not_ready_is_named_with_its_own_cause(
        router: zmq.Socket[bytes]) -> None:
    ready = "127.0.0.1:{}".format(router.bind_to_random_port("tcp://127.0.0.1"))
    refused = f"127.0.0.1:{closed_port()}"
    server = await serve(b"")
    try:
        quiet = "127.0.0.1:{}".format(server.sockets[0].getsockname()[1])
        with pytest.raises(PortsNotReady) as caught:
            await wait_for_ports("trainer:0", [ready, refused, quiet], 0.5)
    finally:
        server.close()
    assert caught.value.endpoints == [refused, quiet]
    assert str(caught.value) == (
        f"trainer:0: no pserver ready at {refused}, {quiet} after 0.5s (wait_port): {refused}: "
        f"connection refused: nothing listens there; {quiet}: not a pserver: it accepted the "
        "connection but sent no ZeroMQ greeting before the deadline")


# -- a trainer node (`runtime.services.node.run_trainer`) ------------------------------------------

def job_at(endpoint: str, startup_timeout: str = "60s", steps: int = 3) -> Job:
    """A 1 x 1 sync job whose pserver is at `endpoint`; `startup_timeout` bounds the trainer's
    wait for its port, `train.deadline` (10 s) the whole run."""
    return Job.from_scenario(parse_scenario(f"""
name: ports
seed: 3
model: {{name: mlp, sizes: [16, 8, 2]}}
data: {{batch_size: 4}}
cluster: {{pservers: 1, trainers: 1, endpoints: {{pservers: ['{endpoint}']}}}}
transpiler: {{mode: sync}}
train: {{steps: {steps}, deadline: 10s, startup_timeout: {startup_timeout}, retry_after: 100ms}}
"""))


async def test_a_trainer_node_with_no_pserver_listening_fails_naming_the_endpoint() -> None:
    """The trainer program asks to wait (`get_trainer_program()`'s default ``wait_port``): with
    nothing at the pserver's port the node gives up after ``train.startup_timeout``, naming the
    endpoint, well before ``train.deadline`` (which a trainer that did not wait would reach,
    its requests unanswered)."""
    endpoint = f"127.0.0.1:{closed_port()}"
    job = job_at(endpoint, startup_timeout="300ms")
    assert job.trainer_programs(0)[0].attrs["_wait_port"] is True
    with pytest.raises(PortsNotReady, match=rf"trainer:0: no pserver listening at "
                                            rf"{endpoint} after 0\.3s \(wait_port\)"):
        await run_trainer(job, 0, None)


async def test_a_trainer_node_started_before_its_pserver_waits_and_trains() -> None:
    job = job_at(f"127.0.0.1:{closed_port()}", steps=3)
    trainer = asyncio.ensure_future(run_trainer(job, 0, None))
    stats = await serve_pserver(job, 0, None)
    record = await asyncio.wait_for(trainer, 10.0)
    assert len(record.losses) == 3 and stats.steps == 3 and stats.errors == 0
