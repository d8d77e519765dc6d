"""What a pserver's share of a sync step would gain from being pipelined: the chain of a wide
layer's gradient to the pserver, its update, and the parameters back, whole against in chunks.

In a sync step of a wide model the trainers wait on a chain: the gradient's bytes travel to the
pserver, the pserver sums the trainers' copies, scales and applies SGD, and the parameters
travel back. Today each link waits for the one before it to end: a pserver's SEND is one
message, its update runs when every trainer's SEND is in, and its reply is one message. Cut
into chunks, the update of one chunk could run while the next travels in, and its parameters
travel back while the next is updated. This measures that chain on this machine, between two
processes over a local (``ipc://``) ZeroMQ socket, as a node's main thread and its I/O thread
share the cores, one kernel thread a process:

- the trainer sends ``--megabytes`` of float32 gradient as ``k`` messages of equal size and then
  waits for ``k`` replies;
- the pserver, on each chunk as it arrives, does a sync round's update of it in place (the sum
  of two trainers' copies, the other copy held in memory; the scale by 1/2; ``param -= lr *
  grad``) and replies with the chunk of parameters, sent without a copy;
- ``--echo``: the pserver replies with the gradient itself, no update: the transport alone.

Each ``k`` of ``--chunks`` is timed over ``--rounds`` round trips after ``--warmup``, the counts
interleaved so that drift on a busy machine hits all; the summary gives each ``k``'s median round
trip over the median of whole messages (``k = 1``, today's chain). It is a model of the chain
with plain pyzmq and numpy, not the runtime's own transport or pserver: it says how much
pipelining could take off, not what an implementation would get.

Run: python benchmarks/pserver_chain.py [--megabytes 8.5] [--chunks 1,2,4,8] [--rounds 20]
         [--echo]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

LEARNING_RATE = 0.01
TRAINERS = 2
"""Copies the update sums, as a 2 x 2 job's pserver does."""


def _one_thread() -> None:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, "1")


def bounds(elements: int, chunks: int) -> list[tuple[int, int]]:
    """The [start, end) of each of `chunks` near-equal pieces of `elements`."""
    edges = np.linspace(0, elements, chunks + 1).astype(int)
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def update(grad: np.ndarray, other: np.ndarray, param: np.ndarray) -> None:
    """A sync round's update of one chunk, in place: the copies' sum, its scale, SGD."""
    total = other  # the other trainer's copy, summed into as a pserver's in-place sum does
    np.add(total, grad, out=total)
    np.multiply(total, 1.0 / TRAINERS, out=total)
    np.multiply(total, LEARNING_RATE, out=total)
    np.subtract(param, total, out=param)


def serve(address: str, elements: int, plan: list[int], echo: bool) -> None:
    """The pserver: for each round of `plan` (its chunk count), take the chunks, update each as
    it arrives, reply with it."""
    _one_thread()
    context = zmq.Context()
    socket = context.socket(zmq.PAIR)
    socket.bind(address)
    param = np.ones(elements, np.float32)
    other = np.ones(elements, np.float32)
    for chunks in plan:
        for start, end in bounds(elements, chunks):
            frame = socket.recv(copy=False)
            if echo:
                socket.send(frame, copy=False)
                continue
            grad = np.frombuffer(frame.buffer, np.float32)
            update(grad, other[start:end], param[start:end])
            socket.send(zmq.Frame(param[start:end], copy=False), copy=False)
    socket.close(linger=10_000)  # the last replies still go out
    context.term()


def round_trip(socket: zmq.Socket[Any], grad: np.ndarray, chunks: int) -> float:
    """Seconds from the first chunk sent to the last reply taken."""
    start = time.perf_counter()
    pieces = bounds(grad.size, chunks)
    for lo, hi in pieces:
        socket.send(zmq.Frame(grad[lo:hi], copy=False), copy=False)
    for _ in pieces:
        socket.recv(copy=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=float, default=8.5,
                        help="one pserver's share of the gradient (8.5: half of mlp "
                             "[64,2048,2048,10]'s)")
    parser.add_argument("--chunks", default="1,2,4,8", help="chunk counts; 1 is the baseline")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--echo", action="store_true", help="no update: the transport alone")
    args = parser.parse_args()
    counts = sorted({int(c) for c in args.chunks.split(",")} | {1})
    if counts[0] < 1:
        parser.error("--chunks: counts must be 1 or more")
    _one_thread()
    elements = int(args.megabytes * 1e6) // 4
    plan = [k for _ in range(args.warmup + args.rounds) for k in counts]
    with tempfile.TemporaryDirectory() as folder:
        address = f"ipc://{Path(folder) / 'chain.sock'}"
        server = mp.get_context("spawn").Process(target=serve,
                                                 args=(address, elements, plan, args.echo))
        server.start()
        context = zmq.Context()
        socket = context.socket(zmq.PAIR)
        socket.connect(address)
        grad = np.full(elements, 0.5, np.float32)
        times: dict[int, list[float]] = {k: [] for k in counts}
        try:
            for i, chunks in enumerate(plan):
                seconds = round_trip(socket, grad, chunks)
                if i >= args.warmup * len(counts):
                    times[chunks].append(seconds)
        finally:
            socket.close(linger=0)
            context.term()
            server.join(timeout=30)
            if server.is_alive():
                server.kill()
    what = "echo, no update" if args.echo else "update of each chunk as it arrives"
    print(f"{args.megabytes:g} MB of float32 gradient and parameters, {what}; "
          f"{args.rounds} round trips each, one kernel thread a process")
    print(f"{'chunks':>6} {'min ms':>8} {'median ms':>10} {'max ms':>8} {'median / whole':>15}")
    whole = statistics.median(times[1])
    for chunks in counts:
        row = times[chunks]
        median = statistics.median(row)
        print(f"{chunks:>6} {min(row) * 1e3:>8.2f} {median * 1e3:>10.2f} "
              f"{max(row) * 1e3:>8.2f} {median / whole:>15.2f}")
    best = min(counts, key=lambda k: statistics.median(times[k]))
    print(f"summary: the chain in {best} chunks takes "
          f"{statistics.median(times[best]) / whole:.2f} of it whole")


if __name__ == "__main__":
    main()
