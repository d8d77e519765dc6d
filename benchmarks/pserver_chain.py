"""What a pserver's share of a sync step would gain from being pipelined: the chain of a wide
layer's gradient to the pserver, its update, and the parameters back, whole against in chunks.

In a sync step of a wide model the trainers wait on a chain: the gradient's bytes travel to the
pserver, the pserver sums the trainers' copies, scales and applies SGD, and the parameters
travel back. Today each link waits for the one before it to end: a pserver's SEND is one
message, its update runs when every trainer's SEND is in, and its reply is one message. Cut
into chunks, the update of one chunk could run while the next travels in, and its parameters
travel back while the next is updated. This measures that chain on this machine, over local
(``ipc://``) ZeroMQ sockets, each process's main thread and ZeroMQ's I/O thread sharing the
cores, one kernel thread a process:

- each of ``--trainers`` trainers (2, as a 2 x 2 job's pserver has; each its own process) sends
  ``--megabytes`` of float32 gradient as ``k`` messages of equal size and then waits for ``k``
  replies;
- the pserver takes each chunk from every trainer, does a sync round's update of it (the
  copies' sum, the scale by 1/trainers, ``param -= lr * grad``, in place, a pass each as the
  pserver's ops make them) and sends the chunk of parameters back to every trainer, without a
  copy;
- ``--echo``: the pserver sends each trainer's gradient back, no update: the transport alone.

Each ``k`` of ``--chunks`` is timed by trainer 0 over ``--rounds`` round trips after
``--warmup``, the counts interleaved so that drift on a busy machine hits all; the summary gives
each ``k``'s median round trip over the median of whole messages (``k = 1``, today's chain). It is a model of the chain
with plain pyzmq and numpy, not the runtime's own transport or pserver: it says how much
pipelining could take off, not what an implementation would get.

Run: python benchmarks/pserver_chain.py [--megabytes 8.5] [--chunks 1,2,4,8] [--rounds 20]
         [--trainers 2] [--echo]
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

from runtime.launch.launcher import THREAD_VARS

LEARNING_RATE = 0.01
TRAINERS = 2
"""Trainers by default: a 2 x 2 job's pserver sums two copies."""


def bounds(elements: int, chunks: int) -> list[tuple[int, int]]:
    """The [start, end) of each of `chunks` near-equal pieces of `elements`."""
    edges = np.linspace(0, elements, chunks + 1).astype(int)
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def update(grads: list[np.ndarray], total: np.ndarray, param: np.ndarray) -> None:
    """A sync round's update of one chunk: the trainers' copies summed into `total`, scaled by
    1/trainers, SGD into `param` in place (a pserver's sum, scale and sgd ops, pass for pass)."""
    if len(grads) > 1:
        np.add(grads[0], grads[1], out=total)
    else:
        np.copyto(total, grads[0])
    for grad in grads[2:]:
        np.add(total, grad, out=total)
    np.multiply(total, 1.0 / len(grads), out=total)
    np.multiply(total, LEARNING_RATE, out=total)
    np.subtract(param, total, out=param)


def serve(addresses: list[str], elements: int, plan: list[int], echo: bool) -> None:
    """The pserver, one socket a trainer: for each round of `plan` (its chunk count), take each
    chunk from every trainer, update it, send it back to every trainer."""
    context = zmq.Context()
    sockets = [context.socket(zmq.PAIR) for _ in addresses]
    for socket, address in zip(sockets, addresses):
        socket.bind(address)
    param = np.ones(elements, np.float32)
    total = np.zeros(elements, np.float32)
    for chunks in plan:
        for start, end in bounds(elements, chunks):
            frames = [socket.recv(copy=False) for socket in sockets]
            if echo:
                for socket, frame in zip(sockets, frames):
                    socket.send(frame, copy=False)
                continue
            grads = [np.frombuffer(frame.buffer, np.float32) for frame in frames]
            update(grads, total[start:end], param[start:end])
            for socket in sockets:
                socket.send(zmq.Frame(param[start:end], copy=False), copy=False)
    for socket in sockets:
        socket.close(linger=10_000)  # the last replies still go out
    context.term()


def train(address: str, elements: int, plan: list[int]) -> list[float]:
    """A trainer: each round of `plan` sent and taken back; its round trips, in seconds."""
    context = zmq.Context()
    socket = context.socket(zmq.PAIR)
    socket.connect(address)
    grad = np.full(elements, 0.5, np.float32)
    try:
        return [round_trip(socket, grad, chunks) for chunks in plan]
    finally:
        socket.close(linger=0)
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
    parser.add_argument("--trainers", type=int, default=TRAINERS,
                        help=f"trainers sending to the pserver, each its own process "
                             f"(default {TRAINERS}, as in a 2 x 2 job)")
    parser.add_argument("--echo", action="store_true", help="no update: the transport alone")
    args = parser.parse_args()
    counts = sorted({int(c) for c in args.chunks.split(",")} | {1})
    if counts[0] < 1:
        parser.error("--chunks: counts must be 1 or more")
    if args.trainers < 1:
        parser.error("--trainers: 1 or more")
    for name in THREAD_VARS:  # read by each spawned process's numpy as it loads its BLAS
        os.environ.setdefault(name, "1")
    elements = int(args.megabytes * 1e6) // 4
    plan = [k for _ in range(args.warmup + args.rounds) for k in counts]
    spawn = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        addresses = [f"ipc://{Path(folder) / f'trainer-{t}.sock'}" for t in range(args.trainers)]
        others = [spawn.Process(target=train, args=(address, elements, plan))
                  for address in addresses[1:]]
        server = spawn.Process(target=serve, args=(addresses, elements, plan, args.echo))
        for process in [server, *others]:
            process.start()
        try:
            measured = train(addresses[0], elements, plan)
        finally:
            for process in [*others, server]:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
    times: dict[int, list[float]] = {k: [] for k in counts}
    for i, (chunks, seconds) in enumerate(zip(plan, measured)):
        if i >= args.warmup * len(counts):
            times[chunks].append(seconds)
    what = "echo, no update" if args.echo else "update of each chunk as it arrives"
    print(f"{args.megabytes:g} MB of float32 gradient and parameters from each of "
          f"{args.trainers} trainer(s), {what}; trainer 0's round trips, {args.rounds} each, "
          "one kernel thread a process")
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
