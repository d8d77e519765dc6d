"""What the wire protocol and `ZmqTransport` cost over raw pyzmq, measured in the same run.

1. Push+pull throughput: a client pushes one float32 tensor (1, 4, 16, 64 MiB) in a SEND message
   and an echo server in another process pulls it back as the REPLY, a few messages in flight.
   Through the runtime that is encode + `ZmqTransport.send` + recv + decode on both sides; the
   baseline is blocking pyzmq DEALER/ROUTER moving the very same frames zero-copy with no
   encoding at all. Throughput counts both directions; the ratio is runtime / raw (goal >= 0.9
   from 4 MiB up). Beside it, the client process's CPU per message (all its threads, libzmq's
   I/O thread included; the least of the repeats), which a busy machine disturbs far less
   than the throughput, and the part of it spent in the client's own thread (encode, decode,
   the event loop and pyzmq's calls; the rest is libzmq's I/O thread moving the bytes through
   the kernel, the same work for both).
2. Small-message round trips per second: one header-only HEARTBEAT at a time, the same way, plus
   a pyzmq asyncio client against the raw server, which shows what the event loop alone costs.

The servers live for the whole run; each figure is the best of a few repeats, runtime and raw
interleaved so that drift on a busy machine hits both.

Run: python benchmarks/wire.py [--quick | --smoke] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, TypeVar

import numpy as np
import zmq
import zmq.asyncio

from runtime.network.transport import Frame
from runtime.network.wire import Kind, Message, decode, encode
from runtime.network.zmq_transport import ZmqTransport

MIB = 1 << 20
WARMUP = 10
T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    sizes_mib: tuple[int, ...] = (1, 4, 16, 64)
    bytes_per_run: int = 1024 * MIB
    window: int = 4
    round_trips: int = 5000
    repeats: int = 5


QUICK = Plan(bytes_per_run=256 * MIB, round_trips=1000, repeats=2)
SMOKE = Plan(sizes_mib=(1,), bytes_per_run=8 * MIB, round_trips=100, repeats=1)
"""Every code path once, on tiny figures: that the benchmark still runs, not what it measures."""


def run(coroutine: Coroutine[Any, Any, T], use_uvloop: bool) -> T:
    if use_uvloop:
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def request(tensor: np.ndarray | None, msg_id: int) -> Message:
    """A SEND carrying `tensor`, or a header-only HEARTBEAT when there is none."""
    if tensor is None:
        return Message(Kind.HEARTBEAT, msg_id, "bench-client")
    return Message(Kind.SEND, msg_id, "bench-client", 0, {"w": tensor})


# ------------------------------------------------------------------------------------ servers


def serve_runtime(reply_to: Connection, use_uvloop: bool) -> None:
    """Echo every message back as a REPLY with the same vars, until terminated."""

    async def serve() -> None:
        async with ZmqTransport("bench-server") as server:
            reply_to.send(await server.bind("tcp://127.0.0.1:*"))
            while True:
                peer, frames = await server.recv()
                msg = decode(frames)
                reply = Message(Kind.REPLY, msg.id, server.name, msg.step, msg.vars)
                await server.send(peer, encode(reply))

    run(serve(), use_uvloop)


def serve_raw(reply_to: Connection) -> None:
    """Echo every message's frames back zero-copy, until terminated."""
    router = zmq.Context().socket(zmq.ROUTER)
    reply_to.send(router.bind("tcp://127.0.0.1:*").addr)
    while True:
        router.send_multipart(router.recv_multipart(copy=False), copy=False)


def start(target: Callable[..., None], *args: object) -> tuple[mp.process.BaseProcess, str]:
    spawn = mp.get_context("spawn")
    parent, child = spawn.Pipe()
    process = spawn.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    return process, parent.recv()


# ------------------------------------------------------------------------------------ clients


class Timing(NamedTuple):
    """What a client's exchanges took: wall-clock seconds, CPU seconds of its process and of
    the thread that ran them."""

    seconds: float
    cpu: float
    main: float


async def runtime_client(
    endpoint: str, tensor: np.ndarray | None, count: int, window: int
) -> Timing:
    """Time for `count` requests through the runtime and their replies, `window` in flight."""
    async with ZmqTransport("bench-client") as client:
        await client.connect(endpoint)
        await runtime_exchange(client, endpoint, tensor, WARMUP, 1)
        began = clocks()
        await runtime_exchange(client, endpoint, tensor, count, window)
        return since(began)


async def runtime_exchange(
    client: ZmqTransport, endpoint: str, tensor: np.ndarray | None, count: int, window: int
) -> None:
    sent = received = 0
    while received < count:
        while sent < count and sent - received < window:
            await client.send(endpoint, encode(request(tensor, sent)))
            sent += 1
        reply = decode((await client.recv())[1])
        assert reply.id == received and (tensor is None or reply.vars["w"].shape == tensor.shape)
        # let it go before waiting for the next, as the raw client does: a large reply still held
        # when the next arrives makes glibc trim its heap on free and libzmq fault the pages in
        # again (16 MiB: hundreds of page faults a message), a cost of the lifetime, not the wire
        del reply
        received += 1


def clocks() -> Timing:
    """The clocks a `Timing` reads, now."""
    return Timing(time.perf_counter(), time.process_time(), time.thread_time())


def since(began: Timing) -> Timing:
    """What the clocks advanced since `began`."""
    now = clocks()
    return Timing(now.seconds - began.seconds, now.cpu - began.cpu, now.main - began.main)


def raw_client(endpoint: str, frames: list[Frame], count: int, window: int) -> Timing:
    """Time to send `frames` `count` times over blocking pyzmq and receive each echo."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    raw_exchange(dealer, frames, WARMUP, 1)
    began = clocks()
    raw_exchange(dealer, frames, count, window)
    elapsed = since(began)
    dealer.close(linger=0)
    context.term()
    return elapsed


def raw_exchange(dealer: zmq.Socket[bytes], frames: list[Frame], count: int, window: int) -> None:
    sent = received = 0
    while received < count:
        while sent < count and sent - received < window:
            dealer.send_multipart(frames, copy=False)
            sent += 1
        dealer.recv_multipart(copy=False)
        received += 1


async def asyncio_raw_client(endpoint: str, frames: list[Frame], count: int) -> float:
    """Seconds for `count` one-at-a-time round trips of `frames` over pyzmq asyncio."""
    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    for i in range(WARMUP + count):
        if i == WARMUP:
            began = time.perf_counter()
        await dealer.send_multipart(frames, copy=False)
        await dealer.recv_multipart(copy=False)
    elapsed = time.perf_counter() - began
    dealer.close(linger=0)
    context.term()
    return elapsed


# --------------------------------------------------------------------------------- measurement


@dataclass(frozen=True)
class Servers:
    """The endpoints of the two echo servers."""

    runtime: str
    raw: str

    def throughput(
        self, plan: Plan, tensor: np.ndarray, count: int, use_uvloop: bool
    ) -> tuple[Timing, Timing]:
        """Best seconds (and least client CPU) for `count` exchanges of `tensor` through the
        runtime and raw pyzmq."""
        frames = encode(request(tensor, 0))  # the same bytes, encoded once
        times = [
            (
                run(runtime_client(self.runtime, tensor, count, plan.window), use_uvloop),
                raw_client(self.raw, frames, count, plan.window),
            )
            for _ in range(plan.repeats)
        ]
        return best(t for t, _ in times), best(r for _, r in times)

    def round_trips(self, plan: Plan, use_uvloop: bool) -> tuple[float, float, float]:
        """Best seconds for the round trips through the runtime, raw pyzmq and pyzmq asyncio."""
        frames = encode(request(None, 0))
        times = [
            (
                run(runtime_client(self.runtime, None, plan.round_trips, 1), use_uvloop).seconds,
                raw_client(self.raw, frames, plan.round_trips, 1).seconds,
                run(asyncio_raw_client(self.raw, frames, plan.round_trips), use_uvloop),
            )
            for _ in range(plan.repeats)
        ]
        return min(t[0] for t in times), min(t[1] for t in times), min(t[2] for t in times)


def best(timings: Iterable[Timing]) -> Timing:
    """The shortest time and the least CPU of some repeats (not necessarily the same one)."""
    listed = list(timings)
    return Timing(*(min(column) for column in zip(*listed)))


def throughput_table(servers: Servers, plan: Plan, use_uvloop: bool) -> None:
    print(f"push+pull throughput, float32 tensors, {plan.window} in flight, best of {plan.repeats}")
    print(f"{'size':>8} {'messages':>9} {'raw pyzmq GB/s':>15} {'ZmqTransport GB/s':>18}", end="")
    print(f" {'ratio':>6} {'client CPU us/msg: raw':>23} {'ZmqTransport':>13}", end="")
    print(f" {'its thread: raw':>16} {'ZmqTransport':>13}")
    for mib in plan.sizes_mib:
        tensor = np.random.default_rng(0).standard_normal(mib * MIB // 4).astype(np.float32)
        count = max(8, plan.bytes_per_run // (mib * MIB))
        runtime, raw = servers.throughput(plan, tensor, count, use_uvloop)
        moved = 2 * count * tensor.nbytes / 1e9
        print(f"{mib:>5}MiB {count:>9} {moved / raw.seconds:>15.2f}", end="")
        print(f" {moved / runtime.seconds:>18.2f} {raw.seconds / runtime.seconds:>6.2f}", end="")
        print(f" {raw.cpu / count * 1e6:>23.0f} {runtime.cpu / count * 1e6:>13.0f}", end="")
        print(f" {raw.main / count * 1e6:>16.0f} {runtime.main / count * 1e6:>13.0f}")


def round_trip_table(servers: Servers, plan: Plan, use_uvloop: bool) -> None:
    print("\nsmall-message round trips (header-only HEARTBEAT, one at a time),", end="")
    print(f" best of {plan.repeats}")
    runtime, raw, asyncio_raw = servers.round_trips(plan, use_uvloop)
    print(f"{'raw pyzmq /s':>14} {'pyzmq asyncio /s':>17} {'ZmqTransport /s':>16}", end="")
    print(f" {'ratio to raw':>13}")
    n = plan.round_trips
    print(f"{n / raw:>14.0f} {n / asyncio_raw:>17.0f} {n / runtime:>16.0f} {raw / runtime:>13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer bytes and repeats")
    parser.add_argument("--smoke", action="store_true",
                        help="every path once, tiny figures (the test suite's run)")
    parser.add_argument("--uvloop", action="store_true", help="run the asyncio sides on uvloop")
    args = parser.parse_args()
    plan = SMOKE if args.smoke else QUICK if args.quick else Plan()
    runtime_server, runtime_endpoint = start(serve_runtime, args.uvloop)
    raw_server, raw_endpoint = start(serve_raw)
    try:
        servers = Servers(runtime_endpoint, raw_endpoint)
        throughput_table(servers, plan, args.uvloop)
        round_trip_table(servers, plan, args.uvloop)
    finally:
        runtime_server.terminate()
        raw_server.terminate()


if __name__ == "__main__":
    main()
