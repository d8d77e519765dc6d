"""A pserver's peak memory under an insider's flood, next to its inbound budget.

The pserver (quickstart's model, one pserver for two trainers that never come) runs as
``runtime up --role pserver`` in a process of its own, with the job's keys or ``--insecure``.
This process opens `--connections` connections to it (with trainer 0's key where secure; as
``flood-K`` where not), and each sends one message of `--megabytes` MB of garbage, then a
heartbeat. A connection is done when the pserver dropped it or answered its heartbeat (which
it reads after the garbage); once all are, the pserver's peak resident memory (VmHWM in
/proc/PID/status) is read and the pserver stopped. Each configuration runs `--runs` times
and prints the peak's min/median/max, the resident memory before the flood, and the
pserver's budget (`runtime/services/inbound.py`).

Two floods (`--frames`): ``one``, the garbage in one frame, which libzmq refuses at its header
when it is over the pserver's frame limit; ``many``, the garbage in frames just under that
limit, which libzmq holds whole until the last frame arrives (it bounds frames, not messages:
see the DESIGN note of runtime/services/inbound.py), before the transport drops it.

`--source DIR` runs the pserver from another checkout, e.g. a worktree of the commit before
the limits (``git worktree add /tmp/before <commit>``), to measure what the flood cost then.

Run: python benchmarks/inbound_memory.py [--runs 3] [--connections 8] [--megabytes 500]
     [--frames one,many] [--source DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from runtime.config.nodes import node_file_stem
from runtime.config.scenario import parse_scenario
from runtime.network.curve import CurveKeys, make_client, write_keys
from runtime.network.wire import Kind, Message, decode, encode
from runtime.network.zmq_transport import own_routing_id
from runtime.services.inbound import pserver_inbound_limits
from runtime.services.job import Job
from runtime.services.node import node_keys

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
HEARTBEAT_ID = 1000
"""Connection k's heartbeat has id HEARTBEAT_ID + k, so its reply names it wherever it lands
(an authenticated pserver replies to the connection its sender last spoke from)."""
WAIT_S = 300.0


def scenario_text(endpoint: str) -> str:
    return f"""
name: inbound_memory
seed: 7
model: {{name: mlp, sizes: [64, 128, 10], optimizer: {{type: sgd, learning_rate: 0.1}}}}
data: {{name: digits, batch_size: 32}}
cluster: {{pservers: 1, trainers: 2, endpoints: {{pservers: ["{endpoint}"]}}}}
transpiler: {{mode: sync}}
train: {{steps: 10, startup_timeout: 900s, heartbeat_timeout: 900s, deadline: 1800s}}
"""


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def start_pserver(source: Path, scenario: Path, endpoint: str, keys: Path | None,
                  log: Path) -> subprocess.Popen[bytes]:
    security = ["--keys", str(keys)] if keys is not None else ["--insecure"]
    command = [sys.executable, "-m", "runtime.cli", "up", str(scenario), "--role", "pserver",
               "--index", "0", *security]
    env = {**os.environ, "PYTHONPATH": str(source)}
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=source, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the pserver did not listen at {endpoint}: see {log}")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def garbage_message(size: int, frames: str, frame_limit: int) -> list[memoryview]:
    buffer = memoryview(b"\xa5" * size)
    if frames == "one":
        return [buffer]
    step = frame_limit - 1024
    return [buffer[at:at + step] for at in range(0, size, step)]


def flood(endpoint: str, keys: CurveKeys | None, connections: int,
          message: list[memoryview]) -> dict[str, int]:
    """Send `message` then a heartbeat on each of `connections`; wait until the pserver
    dropped or answered each. How many it dropped and answered."""
    context: zmq.Context[Any] = zmq.Context()
    dealers, monitors = [], []
    for k in range(connections):
        name = "trainer:0" if keys is not None else f"flood-{k}"
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, 0)
        dealer.setsockopt(zmq.ROUTING_ID, own_routing_id(name, keys is not None))
        if keys is not None:
            make_client(dealer, keys, endpoint)
        monitors.append(dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED))
        dealer.connect(f"tcp://{endpoint}")
        dealer.send_multipart(message, copy=False)
        dealer.send_multipart(encode(Message(Kind.HEARTBEAT, HEARTBEAT_ID + k, name, 0,
                                             extra={"trainer": 0})))
        dealers.append(dealer)
    try:
        return _wait(dealers, monitors)
    finally:
        for dealer, monitor in zip(dealers, monitors):
            dealer.disable_monitor()
            monitor.close()
            dealer.close()
        context.term()


def _wait(dealers: list[zmq.Socket[Any]], monitors: list[zmq.Socket[Any]]) -> dict[str, int]:
    poller = zmq.Poller()
    for sock in dealers + monitors:
        poller.register(sock, zmq.POLLIN)
    dropped: set[int] = set()
    answered: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    while len(dropped | answered) < len(dealers) and time.monotonic() < deadline:
        for sock, _ in poller.poll(1000):
            if sock in monitors:
                if recv_monitor_message(sock)["event"] == zmq.EVENT_DISCONNECTED:
                    dropped.add(monitors.index(sock))
                continue
            reply = decode(sock.recv_multipart(copy=False))
            if reply.id >= HEARTBEAT_ID:
                answered.add(reply.id - HEARTBEAT_ID)
    if len(dropped | answered) < len(dealers):
        raise RuntimeError(f"after {WAIT_S:g}s, {len(dealers) - len(dropped | answered)} "
                           "connections neither dropped nor answered")
    return {"dropped": len(dropped), "answered": len(answered)}


def one_run(args: argparse.Namespace, secure: bool, frames: str, work: Path) -> dict[str, Any]:
    endpoint = free_endpoint()
    scenario = work / "scenario.yaml"
    scenario.write_text(scenario_text(endpoint))
    job = Job.from_scenario(parse_scenario(scenario.read_text()))
    keys_dir = work / "keys" if secure else None
    if keys_dir is not None:
        write_keys(keys_dir, [node_file_stem("pserver", 0), node_file_stem("trainer", 0),
                              node_file_stem("trainer", 1)], force=True)
    limits = pserver_inbound_limits(job, 0)
    message = garbage_message(args.megabytes * 1_000_000, frames, limits.largest_frame)
    process = start_pserver(args.source, scenario, endpoint, keys_dir, work / "pserver.log")
    try:
        before = status_mib(process.pid, "VmRSS")
        keys = (None if keys_dir is None
                else node_keys(keys_dir, "trainer", 0, job.trainers, job.endpoints))
        outcome = flood(endpoint, keys, args.connections, message)
        peak = status_mib(process.pid, "VmHWM")
        alive = process.poll() is None
    finally:
        stop(process)
    return {"before": before, "peak": peak, "alive": alive, "budget": limits.budget / MiB,
            **outcome}


def spread(values: list[float]) -> str:
    return (f"{min(values):8.1f} / {statistics.median(values):8.1f} / "
            f"{max(values):8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--megabytes", type=int, default=500)
    parser.add_argument("--frames", default="one,many")
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="the checkout the pserver runs from (default: this one)")
    args = parser.parse_args()
    print(f"pserver from {args.source}; {args.connections} connections x {args.megabytes} MB "
          f"of garbage each; {args.runs} runs; MiB, min / median / max; budget: this "
          "checkout's limits for the pserver")
    for secure in (True, False):
        for frames in args.frames.split(","):
            runs = []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory() as work:
                    runs.append(one_run(args, secure, frames, Path(work)))
            label = f"{'curve' if secure else 'insecure'} {frames}-frame"
            print(f"{label:18} peak RSS {spread([r['peak'] for r in runs])}   "
                  f"before flood {spread([r['before'] for r in runs])}   "
                  f"budget {runs[0]['budget']:.1f}   "
                  f"dropped/answered {runs[0]['dropped']}/{runs[0]['answered']}   "
                  f"alive {all(r['alive'] for r in runs)}", flush=True)


if __name__ == "__main__":
    main()
