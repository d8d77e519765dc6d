"""What a flood of refused messages writes to a pserver's log: throttled against every one logged.

One peer sends a live pserver (loopback ZeroMQ, a job of one trainer) N messages it must refuse,
half malformed headers (as any process that reaches the port can send, each answered with an
error reply), half BYEs from the job's trainer that change nothing (as an insider can; they
want no reply). The pserver's log is captured twice in the same run: with the refusal log as it
is (`runtime.network.refusals.RefusalLog`: a peer's first refusal in a 10 s window in full, the
rest summed up), and with a window of 0 s, in which every refusal is logged in full, as before
it existed. It prints the lines and bytes of each and their ratio, min/median/max over
`--repeat` runs.

Run: python benchmarks/refusal_flood.py [--messages 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import statistics

import msgpack
import zmq
import zmq.asyncio

from runtime.config.scenario import parse_scenario
from runtime.launch.launcher import free_endpoints
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import make_pserver
from runtime.services.job import Job

MALFORMED = [b"\xc1 not msgpack"]
"""A header frame no decoder takes: an error reply."""
BYE = [msgpack.packb({"v": 1, "kind": "bye", "id": 1, "src": "trainer:0", "step": 0,
                      "vars": [], "trainer": 0})]
"""A BYE from a trainer that has not completed: ignored, counted, no reply."""


def job() -> Job:
    endpoint = free_endpoints("127.0.0.1", 1)
    return Job.from_scenario(parse_scenario(
        "name: flood\nmodel: {name: mlp, sizes: [8, 4, 2]}\ndata: {batch_size: 4}\n"
        f"cluster: {{pservers: 1, trainers: 1, endpoints: {{pservers: {endpoint}}}}}\n"
        "train: {steps: 2, heartbeat_timeout: 600s, startup_timeout: 600s}\n"))


async def flood(messages: int, window: float) -> tuple[int, int]:
    """Lines and bytes the pserver logs for `messages` refused messages, its refusal log's
    window `window` seconds."""
    the_job = job()
    service = make_pserver(the_job, 0, ZmqTransport("pserver:0"))
    service.refusals.interval = window
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("runtime")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    serving = asyncio.get_running_loop().create_task(service.serve(the_job.endpoints[0]))
    context = zmq.asyncio.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"trainer:0")
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://{the_job.endpoints[0]}")
    try:
        for k in range(messages):
            if k % 2:
                await dealer.send_multipart(BYE)
            else:
                await dealer.send_multipart(MALFORMED)
                await dealer.recv_multipart()  # the error reply: the server kept up
        while service.stats.messages < messages:
            await asyncio.sleep(0.01)
    finally:
        dealer.close()
        context.term()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await service.transport.close()
        logger.removeHandler(handler)
    text = out.getvalue()
    return text.count("\n"), len(text.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[int, int]]] = {"throttled": [], "every one": []}
    for _ in range(args.repeat):  # in turn, so that both see the machine as it is
        runs["throttled"].append(asyncio.run(flood(args.messages, 10.0)))
        runs["every one"].append(asyncio.run(flood(args.messages, 0.0)))
    print(f"{args.messages:,} refused messages from one peer, {args.repeat} runs each")
    for name, results in runs.items():
        lines = sorted(r[0] for r in results)
        sizes = sorted(r[1] for r in results)
        print(f"{name:<10} log lines {lines[0]:,} / {statistics.median(lines):,.0f} / "
              f"{lines[-1]:,}   bytes {sizes[0]:,} / {statistics.median(sizes):,.0f} / "
              f"{sizes[-1]:,}  (min / median / max)")
    ratio = statistics.median(r[1] for r in runs["throttled"]) / \
        statistics.median(r[1] for r in runs["every one"])
    print(f"throttled / every one logged: {ratio:.4f} of the bytes")


if __name__ == "__main__":
    main()
