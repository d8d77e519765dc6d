"""What a message costs ZeroMQ's I/O thread by its size, measured between two processes.

`measure_io_curves` starts a server process (``python -m runtime.launch.io_curve ADDRESS``, a
ROUTER bound to a local socket in a private directory, as `runtime up` puts a job's nodes on
one host) and sends it requests of each size in `SIZES` from a DEALER in this process; the
server answers each with `REPLY_BYTES`. Each process reads the CPU time of its threads but
the main one (ZeroMQ's I/O thread: `time.process_time` less `time.thread_time`) around each
batch, the server on a marker message between batches. A round trip of a request of S bytes
costs the client's I/O thread a send of S and a receive of a small reply, and the server's a
receive of S and a small send; the same round trips with the smallest requests, taken from
both, leave what S bytes add to a send and to a receive. The curve (`SizeCurve`) is their
mean, each point the least of `REPEATS` batches: the simulator charges a message's I/O cost
to its sender's and its receiver's I/O threads alike. The same round trips over loopback TCP
give a second curve, taken beyond the same smallest local-socket round trip: TCP costs each
side more from the smallest message on (19-22 us a round trip against 14-16 here, and 1.8
times as much at 2 MiB), and a job over TCP (CurveZMQ, ``--insecure``, nodes on several
hosts) is priced by it (`RuntimeCosts.over_tcp`).

DESIGN: two processes, as a job has, rather than one ZeroMQ context, where both sockets share
one I/O thread, which handles a round trip's four passes in fewer wake-ups. A message as such
costs what the smallest round trip says (`IoCurves.per_message`), not what a job's I/O time
beyond the curve says: a job's I/O threads spend 16-40 us a message, against 7-8 here, and
charged on each message's way that excess slowed the predictions of small jobs by up to 12
points (`runtime.execution.costs.RuntimeCosts.io_by_size`'s DESIGN).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.execution.costs import SizeCurve

SIZES = (64, 4096, 32768, 131072, 524288, 2097152, 8388608)
"""Request sizes, bytes: from a header alone to beyond the caches' (the wide reference
models' messages are 2-4 MB)."""
REPLY_BYTES = 16
REPEATS = 5
BATCH_BYTES = 32 * 2**20
"""Bytes a batch sends (at least `MIN_ROUNDS` and at most `MAX_ROUNDS` round trips)."""
MIN_ROUNDS, MAX_ROUNDS = 40, 1000
MARK = b"mark"
STOP = b"stop"


def io_seconds() -> float:
    """CPU seconds of this process's threads but the calling one: ZeroMQ's I/O thread's."""
    return time.process_time() - time.thread_time()


def rounds_for(size: int) -> int:
    return max(MIN_ROUNDS, min(MAX_ROUNDS, BATCH_BYTES // max(size, 1)))


def serve(address: str) -> None:
    """The server: bind `address` (``tcp://HOST`` alone: a free port of HOST) and print the
    endpoint bound, then answer each request with `REPLY_BYTES`, and each `MARK` with the I/O
    CPU seconds it has used so far, until `STOP`."""
    import zmq

    context = zmq.Context(io_threads=1)
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    if address.startswith("tcp://") and address.count(":") == 1:
        address = f"{address}:{router.bind_to_random_port(address)}"
    else:
        router.bind(address)
    print(address, flush=True)
    reply = b"r" * REPLY_BYTES
    try:
        while True:
            peer, body = router.recv_multipart(copy=False)
            if body.bytes == MARK:
                router.send_multipart([peer, repr(io_seconds()).encode()])
            elif body.bytes == STOP:
                router.send_multipart([peer, b""])
                return
            else:
                router.send_multipart([peer, reply])
    finally:
        router.close()
        context.term()


def _batch(dealer: Any, payload: bytes, rounds: int) -> tuple[float, float]:
    """(client, server) I/O CPU seconds per round trip of `rounds` requests of `payload`
    (`zmq.Again` where the server stops answering for the dealer's ``RCVTIMEO``)."""
    send, recv = dealer.send, dealer.recv
    send(MARK)
    server_before = float(recv())
    mine = io_seconds()
    for _ in range(rounds):
        send(payload, copy=False)
        recv()
    mine = io_seconds() - mine
    send(MARK)
    server = float(recv()) - server_before
    return mine / rounds, server / rounds


def _least(address: str, sizes: tuple[int, ...], repeats: int
           ) -> tuple[dict[int, float], dict[int, float]]:
    """The client's and the server's I/O CPU seconds per round trip at each size (the least
    of `repeats` batches), a server process bound at `address`. DESIGN: the least, not the
    median: in a slow spell on the development machine the median of three batches put 8 MiB
    at 7.4 ms in one calibration where others, minutes apart, read 1.5-2.9; the least of five
    read 1.3-1.6 ms in three measurements of the same spell."""
    import zmq

    server = subprocess.Popen([sys.executable, "-m", "runtime.launch.io_curve", address],
                              stdout=subprocess.PIPE, text=True)
    context = zmq.Context(io_threads=1)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVTIMEO, 30_000)
    try:
        assert server.stdout is not None
        bound = server.stdout.readline().strip()  # it is listening
        if not bound:
            raise RuntimeError(f"measuring the I/O thread: the server for {address} ended "
                               f"(status {server.wait()}) before it listened")
        dealer.connect(bound)
        payloads = {size: os.urandom(size) for size in sizes}
        _batch(dealer, payloads[sizes[0]], MIN_ROUNDS)  # connect and warm up
        taken: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}
        for _ in range(repeats):  # interleaved: drift hits every size alike
            for size in sizes:
                taken[size].append(_batch(dealer, payloads[size], rounds_for(size)))
        dealer.send(STOP)
        dealer.recv()
    finally:
        dealer.close()
        context.term()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return ({size: min(c for c, _ in runs) for size, runs in taken.items()},
            {size: min(s for _, s in runs) for size, runs in taken.items()})


def _curve(sizes: tuple[int, ...], client: dict[int, float], server: dict[int, float],
           base: tuple[float, float]) -> SizeCurve:
    """The mean of what each size costs the client (a send) and the server (a receive) beyond
    `base` (each side's cost of the smallest request over local sockets), never falling."""
    extra = [max((client[size] - base[0] + server[size] - base[1]) / 2, 0.0) for size in sizes]
    for i in range(1, len(extra)):  # noise on a flat stretch: a larger message never costs less
        extra[i] = max(extra[i], extra[i - 1])
    return SizeCurve(tuple(sizes), tuple(extra))


@dataclass(frozen=True)
class IoCurves:
    """What messages cost an I/O thread, measured between two processes."""

    per_message: float
    """A message of the smallest size over local sockets, on either side (a send or a
    receive: a quarter of a round trip's cost to both sides)."""
    local: SizeCurve
    """What a message's size adds over local sockets."""
    tcp: SizeCurve
    """The same over loopback TCP, beyond the same smallest local message."""


def measure_io_curves(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> IoCurves:
    """What a message of each of `sizes` costs an I/O thread beyond one of `sizes[0]` bytes
    over local sockets, mean of a send and a receive (the module doc): over local sockets,
    and over loopback TCP (which costs more from the smallest message on)."""
    with tempfile.TemporaryDirectory(prefix="pslab-io-") as tmp:
        os.chmod(tmp, 0o700)
        local = _least(f"ipc://{Path(tmp) / 'io'}", sizes, repeats)
    tcp = _least("tcp://127.0.0.1", sizes, repeats)
    base = (local[0][sizes[0]], local[1][sizes[0]])
    return IoCurves(sum(base) / 4, _curve(sizes, *local, base), _curve(sizes, *tcp, base))


if __name__ == "__main__":
    serve(sys.argv[1])
