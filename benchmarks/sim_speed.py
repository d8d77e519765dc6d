"""How fast the simulator runs the whole runtime, against SimPy and against the scale goal.

1. Simulated messages per wall second of a parameter-server job run by the real runtime in the
   simulator: the `scale` scenario (asynchronous SGD, timing mode: phantom tensors, a roofline
   compute model, lognormal latencies and 10 Gbps NICs) cut down to N trainers x M pservers x S
   steps, every message encoded, carried by `sim.network`, decoded and served by the real
   pserver. The baseline, measured in the same run, is the same message pattern modelled
   directly in SimPy: each step every trainer computes, sends a gradient block to every pserver
   and waits for the acknowledgements, then asks every pserver for its parameter block and
   waits for the replies; a pserver serves one message at a time and spends the modelled update
   time on each gradient; messages cross the same network model (FIFO egress and ingress per NIC,
   a latency drawn per message from the scenario's distribution with one seeded generator per
   link, no overtaking on a link) with the same sizes. The compute times come from the
   simulator's run (its modelled seconds per trainer step and per pserver update), so both
   model the same job; the SimPy side just skips everything the runtime does per message (the
   wire format, the protocol, the executor, the trace). Printed: messages per wall second of
   each, and their ratio (goal >= 1.0).
2. The wall time of the whole `scale` scenario (1,000 trainers x 100 pservers, 10 steps, about
   4.7 million messages), against its goal of 60 seconds (printed as goal / wall; >= 1.0 meets
   it). ``--scale-trainers`` runs a smaller cluster for a quick look; ``--skip-scale`` skips it.

SimPy is needed for part 1 only (``pip install 'pslab[bench]'``); without it part 1 says so.

Run: python benchmarks/sim_speed.py [--trainers 100 --pservers 10 --steps 10] [--skip-scale]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.config.scenario import Scenario, load_scenario
from runtime.execution.tensor import Phantom
from runtime.network.wire import Kind, Message, charged_size, encode
from sim.network import Latency, NetworkSpec
from sim.simulate import SimResult, simulate

SCALE = Path(__file__).resolve().parent.parent / "scenarios" / "scale.yaml"
SCALE_GOAL = 60.0
"""Seconds of wall time the whole scale scenario should take."""
FIRST_WEIGHT = 1600 * 512
"""Elements of the scale model's first weight, which its pservers share out in blocks (the
other params are small): the bytes of one pserver's gradient and parameter messages."""


@dataclass(frozen=True)
class Workload:
    trainers: int
    pservers: int
    steps: int

    def overrides(self) -> list[str]:
        return [f"cluster.trainers={self.trainers}", f"cluster.pservers={self.pservers}",
                f"train.steps={self.steps}"]


@dataclass(frozen=True)
class Outcome:
    messages: int
    sim_time: float
    """Simulated seconds until the last trainer's last step ended."""
    wall: float

    @property
    def rate(self) -> float:
        return self.messages / self.wall


@dataclass(frozen=True)
class Sizes:
    """Bytes of the four messages of one block's round: a gradient and its acknowledgement, a
    request for the parameter and its reply (as the simulator charges them)."""

    send: int
    ack: int
    get: int
    reply: int

    @classmethod
    def of(cls, block: Phantom) -> Sizes:
        name, src = "fc_0.w_0.block0", "trainer:0"
        return cls(
            send=_size(Message(Kind.SEND, 1, src, 0, {f"{name}@GRAD": block}, {"trainer": 0})),
            ack=_size(Message(Kind.REPLY, 1, "pserver:0", 0, extra={"server_step": 0})),
            get=_size(Message(Kind.GET, 1, src, 0, extra={"trainer": 0, "names": [name]})),
            reply=_size(Message(Kind.REPLY, 1, "pserver:0", 0, {name: block},
                                {"server_step": 0, "in_fanin": True, "entry_step": 0})))


def _size(msg: Message) -> int:
    return charged_size(encode(msg))


# ----------------------------------------------------------------------------------- the runtime

def run_runtime(scenario: Scenario) -> tuple[Outcome, SimResult]:
    started = time.perf_counter()
    result = simulate(scenario, base_dir=SCALE.parent)
    wall = time.perf_counter() - started
    last_step = max((t.step_ends[-1] for t in result.trainers if t.step_ends), default=0.0)
    return Outcome(result.messages, last_step, wall), result


def compute_times(result: SimResult, work: Workload) -> tuple[float, float]:
    """Modelled seconds of one trainer step and of one pserver update, averaged over the run."""
    trainers = [s for node, s in result.compute.items() if node.startswith("trainer:")]
    servers = [s for node, s in result.compute.items() if node.startswith("pserver:")]
    sends = work.trainers * work.pservers * work.steps
    return sum(trainers) / max(len(trainers) * work.steps, 1), sum(servers) / max(sends, 1)


# ------------------------------------------------------------------------------------ SimPy model

class SimpyNetwork:
    """`sim.network`'s queueing model in SimPy: FIFO egress and ingress per NIC, a latency per
    message from one seeded generator per link, no overtaking on a link."""

    def __init__(self, env: Any, latency: Latency, bandwidth: float, seed: int) -> None:
        self.env = env
        self.latency = latency
        self.bandwidth = bandwidth
        self.seed = seed
        self.egress_free: dict[str, float] = {}
        self.ingress_free: dict[str, float] = {}
        self.links: dict[tuple[str, str], list[Any]] = {}  # [rng, last bit]
        self.messages = 0

    def send(self, src: str, dst: str, nbytes: int, inbox: Any, item: Any) -> None:
        env, now = self.env, self.env.now
        link = self.links.get((src, dst))
        if link is None:
            link = self.links[src, dst] = [random.Random(f"{self.seed}:{src}->{dst}"), 0.0]
        start = max(now, self.egress_free.get(src, 0.0))
        wire = nbytes / self.bandwidth
        self.egress_free[src] = start + wire
        arrival = max(start + self.latency.sample(link[0]), link[1])
        link[1] = arrival + wire
        self.messages += 1

        def arrive(_: Any) -> None:
            begin = max(env.now, self.ingress_free.get(dst, 0.0))
            self.ingress_free[dst] = begin + wire
            done = max(begin + wire, env.now + wire)
            env.timeout(done - env.now).callbacks.append(lambda _: inbox.put(item))

        env.timeout(arrival - now).callbacks.append(arrive)


def run_simpy(work: Workload, spec: NetworkSpec, seed: int, sizes: Sizes, step_compute: float,
              update: float) -> Outcome:
    """The job's message pattern in SimPy (see the module doc)."""
    import simpy

    env = simpy.Environment()
    net = SimpyNetwork(env, spec.latency, spec.bandwidth, seed)
    inboxes = [simpy.Store(env) for _ in range(work.pservers)]

    def pserver(index: int) -> Generator[Any, Any, None]:
        name = f"pserver:{index}"
        while True:
            trainer, replies, kind = yield inboxes[index].get()
            if kind is Kind.SEND:
                yield env.timeout(update)
            size = sizes.ack if kind is Kind.SEND else sizes.reply
            net.send(name, trainer, size, replies, kind)

    def trainer(index: int) -> Generator[Any, Any, None]:
        name, replies = f"trainer:{index}", simpy.Store(env)
        for _ in range(work.steps):
            yield env.timeout(step_compute)
            for kind, size in ((Kind.SEND, sizes.send), (Kind.GET, sizes.get)):
                for j, inbox in enumerate(inboxes):
                    net.send(name, f"pserver:{j}", size, inbox, (name, replies, kind))
                for _ in inboxes:
                    yield replies.get()

    for j in range(work.pservers):
        env.process(pserver(j))
    started = time.perf_counter()
    env.run(until=simpy.AllOf(env, [env.process(trainer(i)) for i in range(work.trainers)]))
    return Outcome(net.messages, env.now, time.perf_counter() - started)


# ----------------------------------------------------------------------------------------- report

def compare_with_simpy(work: Workload) -> None:
    scenario = load_scenario(SCALE, work.overrides())
    ours, result = run_runtime(scenario)
    print(f"parameter-server job in the simulator, {work.trainers} trainers x {work.pservers} "
          f"pservers x {work.steps} steps (scale scenario, timing mode):")
    print(f"  runtime in sim: {ours.messages:,} messages, sim time {ours.sim_time:.4f} s, "
          f"wall {ours.wall:.2f} s, {ours.rate:,.0f} messages/s")
    try:
        import simpy  # noqa: F401  (the baseline's only dependency)
    except ImportError:
        print("  SimPy not installed: no baseline (pip install 'pslab[bench]')")
        return
    spec = NetworkSpec.parse(scenario.network)
    block = Phantom((FIRST_WEIGHT // work.pservers,), np.dtype("float32"))
    step_compute, update = compute_times(result, work)
    theirs = run_simpy(work, spec, scenario.seed, Sizes.of(block), step_compute, update)
    print(f"  SimPy model:    {theirs.messages:,} messages, sim time {theirs.sim_time:.4f} s, "
          f"wall {theirs.wall:.2f} s, {theirs.rate:,.0f} messages/s")
    print(f"  ratio (runtime in sim / SimPy model, messages per second): "
          f"{ours.rate / theirs.rate:.2f} (goal >= 1.0)")


def scale_wall(trainers: int) -> None:
    scenario = load_scenario(SCALE, [f"cluster.trainers={trainers}"])
    ours, _ = run_runtime(scenario)
    c = scenario.cluster
    print(f"scale scenario, {c.trainers} trainers x {c.pservers} pservers x "
          f"{scenario.train.steps} steps: {ours.messages:,} messages, wall {ours.wall:.1f} s, "
          f"{ours.rate:,.0f} messages/s")
    goal = f"goal {SCALE_GOAL:.0f} s at 1,000 trainers"
    if trainers == 1000:
        print(f"  {goal}: ratio (goal / wall) {SCALE_GOAL / ours.wall:.2f} (>= 1.0 meets it)")
    else:
        print(f"  {goal}: run with --scale-trainers 1000 to measure it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trainers", type=int, default=100)
    parser.add_argument("--pservers", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--scale-trainers", type=int, default=1000,
                        help="trainers of the scale run (default: the scenario's 1,000)")
    parser.add_argument("--skip-scale", action="store_true", help="skip the scale run")
    args = parser.parse_args()
    compare_with_simpy(Workload(args.trainers, args.pservers, args.steps))
    if not args.skip_scale:
        scale_wall(args.scale_trainers)


if __name__ == "__main__":
    main()
