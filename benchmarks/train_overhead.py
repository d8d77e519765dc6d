"""What distributing costs: samples/s of a 2-pserver x 2-trainer run (sync by default) against
single-process training of the same model on the same global batches, measured in the same run.

1. local: `train_locally` (one process, global batch = batch x trainers per step);
2. in-process: `run_job`, every node a task of one event loop, over loopback ZeroMQ;
3. processes: `runtime up` (`runtime.launch.launcher`), every node its own process, over loopback
ZeroMQ.

Samples/s counts the examples of all trainers per second of training steps: for the
distributed runs, the slowest trainer's time inside its steps (process start, transpiling and
the startup program excluded; the processes' "wall" column includes them). Each figure is the
best of a few repeats, the three kinds interleaved so that drift on a busy machine hits all.
The ratio is distributed / local; on one host the nodes share its cores, so this is the
protocol's overhead (round trips per step, serialization, barriers), not a speed-up estimate.

Run: python benchmarks/train_overhead.py [--steps 200] [--batch 32] [--sizes 64,128,10]
         [--protocol bundled|compact|per_op] [--mode sync|async]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.config.metrics import read_metrics
from runtime.config.scenario import Scenario, parse_scenario
from runtime.launch.launcher import free_endpoints, launch
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import run_job, train_locally
from runtime.services.job import Job
from runtime.services.node import run_async
from transpiler.distribute.rpc_plan import DEFAULT_PROTOCOL, PROTOCOLS

SCENARIO = """\
name: train-overhead
seed: 1
model: {{name: mlp, sizes: {sizes}, optimizer: {{type: sgd, learning_rate: 0.05}}}}
data: {{name: synthetic_classification, batch_size: {batch}}}
cluster: {{pservers: 2, trainers: 2}}
transpiler: {{mode: {mode}}}
train: {{steps: {steps}, deadline: 300s, log_every: {steps}, protocol: {protocol}}}
"""


@dataclass
class Rate:
    samples_per_second: float
    wall_seconds: float


def local_rate(scenario: Scenario) -> Rate:
    job = Job.from_scenario(scenario)
    job.dataset  # built once, outside the timing, as the distributed runs do before step 0
    start = time.perf_counter()
    train_locally(job)
    wall = time.perf_counter() - start
    samples = scenario.train.steps * scenario.data.batch_size * scenario.cluster.trainers
    return Rate(samples / wall, wall)


def in_process_rate(scenario: Scenario) -> Rate:
    job = Job.from_scenario(scenario, free_endpoints("127.0.0.1", scenario.cluster.pservers))
    job.dataset
    start = time.perf_counter()
    result = run_async(run_job(job, ZmqTransport))
    wall = time.perf_counter() - start
    busy = max(sum(r.step_times) for r in result.trainers)
    samples = sum(len(r.losses) for r in result.trainers) * scenario.data.batch_size
    return Rate(samples / busy, wall)


def processes_rate(scenario_path: Path, scenario: Scenario, out: Path) -> Rate:
    code = launch(scenario_path, [], scenario, out, io.StringIO())
    if code != 0:
        raise SystemExit(f"runtime up failed ({code}); see {out / 'metrics.json'}")
    job = read_metrics(out / "metrics.json").job
    assert job.samples_per_second is not None and job.wall_seconds is not None
    return Rate(job.samples_per_second, job.wall_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="examples per trainer per step")
    parser.add_argument("--sizes", default="64,128,10", help="mlp layer sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--protocol", default=DEFAULT_PROTOCOL, choices=PROTOCOLS,
                        help=f"train.protocol of the distributed runs (default: "
                             f"{DEFAULT_PROTOCOL}, the scenario default)")
    parser.add_argument("--mode", default="sync", choices=["sync", "async"],
                        help="transpiler.mode of the distributed runs (async: no barriers, "
                             "so its samples/s is not that of the same training)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    text = SCENARIO.format(sizes=sizes, batch=args.batch, steps=args.steps,
                           protocol=args.protocol, mode=args.mode)
    scenario = parse_scenario(text)
    best: dict[str, Rate] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(text)
        for _ in range(args.repeats):
            runs = {"local (1 process)": lambda: local_rate(scenario),
                    "in-process run_job": lambda: in_process_rate(scenario),
                    "processes (runtime up)": lambda: processes_rate(path, scenario,
                                                                     Path(tmp) / "out")}
            for name, measure in runs.items():
                rate = measure()
                if name not in best or rate.samples_per_second > best[name].samples_per_second:
                    best[name] = rate
    print(f"mlp {sizes}, {args.mode} SGD, 2 pservers x 2 trainers, global batch "
          f"{2 * args.batch}, {args.steps} steps, protocol {args.protocol}, best of "
          f"{args.repeats}")
    print(f"{'run':<24} {'samples/s':>10} {'ratio':>6} {'wall s':>7}")
    local = best["local (1 process)"].samples_per_second
    for name, rate in best.items():
        print(f"{name:<24} {rate.samples_per_second:>10.0f} "
              f"{rate.samples_per_second / local:>6.2f} {rate.wall_seconds:>7.2f}")


if __name__ == "__main__":
    main()
