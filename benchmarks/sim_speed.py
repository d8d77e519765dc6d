"""How fast the simulator runs the whole runtime, against SimPy and against the scale goals.

1. The wall time of a parameter-server job run by the real runtime in the simulator, against
   the same job's protocol modelled directly in SimPy, both measured in the same run. The job is
   the `scale` scenario (timing mode: phantom tensors, a roofline compute model, lognormal
   latencies and 10 Gbps NICs) cut down to N trainers x M pservers x S steps, in sync mode by
   default (`--mode async` for the scenario's own): every message encoded, carried by
   `sim.network`, decoded and served by the real pserver. The SimPy model sends the same
   pattern: each step every trainer computes, sends a gradient block to every pserver and waits
   for the acknowledgements; in sync mode it then sends a send barrier to every pserver and
   waits for the acknowledgements, asks every pserver for its parameter block (answered once
   that pserver has every trainer's barrier and has run its update) and sends a fetch barrier to
   every pserver (the next step's requests wait until every trainer's is in); in async mode it
   asks for the parameter blocks at once, a pserver spending its update time on each gradient.
   With ``--protocol bundled`` (the simulator's too) each step is one message to every pserver
   carrying the gradient and asking for the parameter, answered with it: in async mode after
   the update of that gradient, in sync mode once every trainer's has come in and the round's
   update has run. A pserver serves one message at a time; messages cross the same network model (FIFO egress
   and ingress per NIC, a latency drawn per message from the scenario's distribution with one
   seeded generator per link, no overtaking on a link) with the same sizes. The compute times
   come from the simulator's run (its modelled seconds per trainer step and per pserver update),
   so both model the same job; the SimPy side just skips everything the runtime does per message
   (the wire format, the protocol, the executor, the trace). Printed: each side's wall time
   (setup included for the simulator: the job is what a user waits for) and the ratio SimPy wall
   / simulator wall (goal >= 0.25 for the sync 100 x 10 x 10 job), with each run's CPU seconds
   and their ratio beside, which other load on a shared machine disturbs far less.
2. The wall time and peak resident memory of the whole `scale` scenario (1,000 trainers x 100
   pservers, async, 10 steps, about 4.7 million messages) and of its sync variant, each in a
   process of its own, against the goals of 120 s and 1 GiB. ``--scale-trainers`` runs a
   smaller cluster for a quick look; ``--skip-scale`` skips both, ``--scale-modes async`` runs
   one. ``--scale-simpy`` also times the SimPy model of each of those jobs: what simulating
   the protocol alone costs at that size.

SimPy is needed for part 1 only (``pip install 'pslab[bench]'``); without it part 1 says so.

Run: python benchmarks/sim_speed.py [--trainers 100 --pservers 10 --steps 10 --mode sync]
         [--protocol compact|bundled]
         [--repeat 3] [--skip-scale] [--scale-simpy] [--scale-trainers N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.config.scenario import Scenario, load_scenario
from runtime.execution.tensor import Phantom
from runtime.network.wire import Kind, Message, charged_size, encode
from runtime.services.messages import (BARRIER_FIELD, BARRIER_FROM_FIELD, FETCH_BARRIER_FIELD,
                                       FETCH_FIELD, TRAINER_FIELD)
from sim.network import Latency, NetworkSpec
from sim.simulate import SimResult, simulate

SCALE = Path(__file__).resolve().parent.parent / "scenarios" / "scale.yaml"
SCALE_GOAL = 120.0
"""Seconds of wall time the whole scale scenario (and its sync variant) should take."""
MEMORY_GOAL = 1 << 30
"""Bytes of peak resident memory the same runs should stay under."""
BUNDLE = "bundle"
"""The SimPy model's request of the bundled protocol: a gradient that asks for the parameter
(and, in sync mode, carries both barriers)."""
RATIO_GOAL = 0.25
"""SimPy model's wall time / the simulator's, for the sync 100 x 10 x 10 job."""
FIRST_WEIGHT = 1600 * 512
"""Elements of the scale model's first weight, which its pservers share out in blocks (the
other params are small): the bytes of one pserver's gradient and parameter messages."""


@dataclass(frozen=True)
class Workload:
    trainers: int
    pservers: int
    steps: int
    mode: str = "sync"
    protocol: str = "compact"

    def overrides(self) -> list[str]:
        return [f"cluster.trainers={self.trainers}", f"cluster.pservers={self.pservers}",
                f"train.steps={self.steps}", f"transpiler.mode={self.mode}",
                f"train.protocol={self.protocol}"]


@dataclass(frozen=True)
class Outcome:
    messages: int
    sim_time: float
    """Simulated seconds until the last trainer's last step ended."""
    wall: float
    cpu: float
    """CPU seconds of this process (less sensitive than `wall` to other load on the machine)."""

    @property
    def rate(self) -> float:
        return self.messages / self.wall


@dataclass(frozen=True)
class Sizes:
    """Bytes of the messages of one block's round: a gradient and its acknowledgement, a
    request for the parameter and its reply, a barrier, and the bundled protocol's gradient
    that asks for the parameter (with a sync round's barriers), as the simulator charges them."""

    send: int
    ack: int
    get: int
    reply: int
    barrier: int
    bundle: int

    @classmethod
    def of(cls, block: Phantom, sync: bool = True) -> Sizes:
        name, src = "fc_0.w_0.block0", "trainer:0"
        barriers = ({BARRIER_FIELD: 1, BARRIER_FROM_FIELD: 1, FETCH_BARRIER_FIELD: 1} if sync
                    else {})
        return cls(
            send=_size(Message(Kind.SEND, 1, src, 0, {f"{name}@GRAD": block}, {"trainer": 0})),
            ack=_size(Message(Kind.REPLY, 1, "pserver:0", 0, extra={"server_step": 0})),
            get=_size(Message(Kind.GET, 1, src, 0, extra={"trainer": 0, "names": [name]})),
            reply=_size(Message(Kind.REPLY, 1, "pserver:0", 0, {name: block},
                                {"server_step": 0, "in_fanin": True, "entry_step": 0})),
            barrier=_size(Message(Kind.SEND_BARRIER, 1, src, 0, extra={"trainer": 0})),
            bundle=_size(Message(Kind.SEND, 1, src, 0, {f"{name}@GRAD": block},
                                 {TRAINER_FIELD: 0, FETCH_FIELD: [name], **barriers})))

    def request(self, kind: Kind | str) -> int:
        return {Kind.SEND: self.send, Kind.GET: self.get, BUNDLE: self.bundle}.get(kind,
                                                                                  self.barrier)

    def answer(self, kind: Kind | str) -> int:
        return self.reply if kind in (Kind.GET, BUNDLE) else self.ack


def _size(msg: Message) -> int:
    return charged_size(encode(msg))


# ----------------------------------------------------------------------------------- the runtime

def run_runtime(scenario: Scenario) -> tuple[Outcome, SimResult]:
    started, cpu = time.perf_counter(), time.process_time()
    # as `sim run` does: no record per message where the scenario writes no trace (scale's)
    result = simulate(scenario, base_dir=SCALE.parent, trace_messages=scenario.outputs.trace,
                      trace_spans=scenario.outputs.trace)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    last_step = max((t.step_ends[-1] for t in result.trainers if t.step_ends), default=0.0)
    return Outcome(result.messages, last_step, wall, cpu), result


def compute_times(result: SimResult, work: Workload) -> tuple[float, float]:
    """Modelled seconds of one trainer step and of one pserver update (sync: a round's, async:
    a gradient's), averaged over the run."""
    trainers = [s for node, s in result.compute.items() if node.startswith("trainer:")]
    servers = [s for node, s in result.compute.items() if node.startswith("pserver:")]
    updates = work.pservers * work.steps * (1 if work.mode == "sync" else work.trainers)
    return sum(trainers) / max(len(trainers) * work.steps, 1), sum(servers) / max(updates, 1)


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


@dataclass
class SyncRound:
    """A SimPy pserver's sync round: the step, whether its update ran, the barriers in, and
    the requests that wait for the round to move on."""

    trainers: int
    step: int = 0
    optimized: bool = False
    sent: int = 0
    fetched: int = 0

    def verdict(self, kind: Kind, step: int) -> bool:
        """Whether a request of `kind` at `step` is answered now (else it waits)."""
        if step > self.step:
            return False
        if kind in (Kind.SEND, Kind.SEND_BARRIER):
            return True
        return self.optimized


def run_simpy(work: Workload, spec: NetworkSpec, seed: int, sizes: Sizes, step_compute: float,
              update: float) -> Outcome:
    """The job's protocol in SimPy (see the module doc)."""
    import simpy

    env = simpy.Environment()
    net = SimpyNetwork(env, spec.latency, spec.bandwidth, seed)
    inboxes = [simpy.Store(env) for _ in range(work.pservers)]
    sync = work.mode == "sync"

    def pserver(index: int) -> Generator[Any, Any, None]:
        name, state, waiting = f"pserver:{index}", SyncRound(work.trainers), []

        def answer(request: tuple[Any, ...]) -> None:
            trainer, replies, kind, _ = request
            net.send(name, trainer, sizes.answer(kind), replies, kind)

        while True:
            request = yield inboxes[index].get()
            kind, step = request[2], request[3]
            if kind == BUNDLE and sync:  # the round moves on with its last trainer's bundle
                waiting.append(request)
                if len(waiting) == work.trainers:
                    yield env.timeout(update)
                    ready, waiting = waiting, []
                    for r in ready:
                        answer(r)
                continue
            if kind == BUNDLE or not sync:
                if kind in (Kind.SEND, BUNDLE):
                    yield env.timeout(update)
                answer(request)
                continue
            if not state.verdict(kind, step):
                waiting.append(request)
                continue
            answer(request)
            if kind is Kind.SEND_BARRIER:
                state.sent += 1
                if state.sent == work.trainers:
                    yield env.timeout(update)
                    state.optimized = True
                    ready, waiting = waiting, []
                    for r in ready:  # the GETs of this step (nothing else waits yet)
                        answer(r)
            elif kind is Kind.FETCH_BARRIER:
                state.fetched += 1
                if state.fetched == work.trainers:
                    state.step, state.optimized, state.sent, state.fetched = state.step + 1, \
                        False, 0, 0
                    ready, waiting = waiting, []
                    for r in ready:  # the next step's sends and barriers
                        if r[2] is Kind.SEND_BARRIER:
                            state.sent += 1
                        answer(r)

    def trainer(index: int) -> Generator[Any, Any, None]:
        name, replies = f"trainer:{index}", simpy.Store(env)
        kinds: tuple[Kind | str, ...] = (
            (BUNDLE,) if work.protocol == "bundled"
            else (Kind.SEND, Kind.SEND_BARRIER, Kind.GET, Kind.FETCH_BARRIER) if sync
            else (Kind.SEND, Kind.GET))
        for step in range(work.steps):
            yield env.timeout(step_compute)
            for kind in kinds:
                for j, inbox in enumerate(inboxes):
                    net.send(name, f"pserver:{j}", sizes.request(kind), inbox,
                             (name, replies, kind, step))
                for _ in inboxes:
                    yield replies.get()

    for j in range(work.pservers):
        env.process(pserver(j))
    started, cpu = time.perf_counter(), time.process_time()
    env.run(until=simpy.AllOf(env, [env.process(trainer(i)) for i in range(work.trainers)]))
    return Outcome(net.messages, env.now, time.perf_counter() - started,
                   time.process_time() - cpu)


# ----------------------------------------------------------------------------------------- report

def _spread(values: list[float]) -> str:
    return (f"min {min(values):.2f} / median {statistics.median(values):.2f} / "
            f"max {max(values):.2f}")


def compare_with_simpy(work: Workload, repeat: int) -> None:
    """Run the job in the simulator and in SimPy `repeat` times, alternating, and print each
    side's wall times and the ratios of the pairs."""
    scenario = load_scenario(SCALE, work.overrides())
    print(f"{work.mode} parameter-server job, {work.trainers} trainers x {work.pservers} "
          f"pservers x {work.steps} steps (scale scenario, timing mode), {repeat} runs:")
    has_simpy = importlib.util.find_spec("simpy") is not None  # the baseline's only dependency
    spec = NetworkSpec.parse(scenario.network)
    block = Phantom((FIRST_WEIGHT // work.pservers,), np.dtype("float32"))
    ours_walls, their_walls, ratios, cpu_ratios = [], [], [], []
    for _ in range(repeat):
        ours, result = run_runtime(scenario)
        ours_walls.append(ours.wall)
        print(f"  runtime in sim: {ours.messages:,} messages, sim time {ours.sim_time:.4f} s, "
              f"wall {ours.wall:.2f} s (CPU {ours.cpu:.2f} s), {ours.rate:,.0f} messages/s")
        if not has_simpy:
            continue
        step_compute, update = compute_times(result, work)
        theirs = run_simpy(work, spec, scenario.seed, Sizes.of(block, work.mode == "sync"),
                           step_compute, update)
        their_walls.append(theirs.wall)
        ratios.append(theirs.wall / ours.wall)
        cpu_ratios.append(theirs.cpu / ours.cpu)
        print(f"  SimPy model:    {theirs.messages:,} messages, sim time {theirs.sim_time:.4f} s,"
              f" wall {theirs.wall:.2f} s (CPU {theirs.cpu:.2f} s); ratio SimPy / simulator: "
              f"wall {ratios[-1]:.3f}, CPU {cpu_ratios[-1]:.3f}")
    print(f"  simulator wall s: {_spread(ours_walls)}")
    if not has_simpy:
        print("  SimPy not installed: no baseline (pip install 'pslab[bench]')")
        return
    print(f"  SimPy wall s:     {_spread(their_walls)}")
    print(f"  ratio SimPy / simulator, wall: {_spread(ratios)} (goal >= {RATIO_GOAL})")
    print(f"  ratio SimPy / simulator, CPU:  {_spread(cpu_ratios)}")


def scale_run(trainers: int, mode: str, protocol: str) -> None:
    """One scale run in this process (the child of `scale_wall`): a JSON line of what it took."""
    scenario = scale_scenario(trainers, mode, protocol)
    ours, result = run_runtime(scenario)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    step_compute, update = compute_times(result, _scale_workload(scenario))
    print(json.dumps({"messages": ours.messages, "wall": ours.wall, "cpu": ours.cpu,
                      "rss": rss, "step_compute": step_compute, "update": update}))


def scale_scenario(trainers: int, mode: str, protocol: str) -> Scenario:
    """The scale scenario with `trainers` trainers, in `mode` and `protocol`."""
    return load_scenario(SCALE, [f"cluster.trainers={trainers}", f"transpiler.mode={mode}",
                                 f"train.protocol={protocol}"])


def _scale_workload(scenario: Scenario) -> Workload:
    return Workload(scenario.cluster.trainers, scenario.cluster.pservers, scenario.train.steps,
                    scenario.transpiler.mode, scenario.train.protocol)


def scale_simpy(scenario: Scenario, step_compute: float, update: float) -> None:
    """The SimPy model of a scale run's job, with that run's compute times: how long the
    protocol alone takes to simulate at that size, with none of the runtime's work."""
    work = _scale_workload(scenario)
    block = Phantom((FIRST_WEIGHT // work.pservers,), np.dtype("float32"))
    theirs = run_simpy(work, NetworkSpec.parse(scenario.network), scenario.seed,
                       Sizes.of(block, work.mode == "sync"), step_compute, update)
    print(f"  SimPy model of the same job: {theirs.messages:,} messages, wall {theirs.wall:.1f} s "
          f"(CPU {theirs.cpu:.1f} s)")


def scale_wall(trainers: int, mode: str, protocol: str, simpy: bool = False) -> None:
    """The scale scenario in `mode`, in a process of its own (so its peak memory is its own)."""
    child = subprocess.run([sys.executable, __file__, "--scale-child", mode,
                            "--scale-trainers", str(trainers), "--protocol", protocol],
                           check=True, capture_output=True, text=True)
    run = json.loads(child.stdout.splitlines()[-1])
    scenario = scale_scenario(trainers, mode, protocol)
    c, steps = scenario.cluster, scenario.train.steps
    print(f"scale scenario, {mode}, {protocol}, {c.trainers} trainers x {c.pservers} pservers x {steps} steps: "
          f"{run['messages']:,} messages, wall {run['wall']:.1f} s (CPU {run['cpu']:.1f} s), "
          f"{run['messages'] / run['wall']:,.0f} messages/s, peak RSS {run['rss'] / 2**20:,.0f} MiB")
    if trainers == 1000:
        print(f"  goals {SCALE_GOAL:.0f} s and {MEMORY_GOAL / 2**30:.0f} GiB: ratios (goal / "
              f"measured) wall {SCALE_GOAL / run['wall']:.2f}, memory "
              f"{MEMORY_GOAL / run['rss']:.2f} (>= 1.0 meets it)")
    else:
        print("  goals at 1,000 trainers: run with --scale-trainers 1000 to measure them")
    if simpy:
        scale_simpy(scenario, run["step_compute"], run["update"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trainers", type=int, default=100)
    parser.add_argument("--pservers", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--protocol", choices=("compact", "bundled"), default="compact",
                        help="train.protocol of every run, the SimPy model's too")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the SimPy comparison")
    parser.add_argument("--scale-trainers", type=int, default=1000,
                        help="trainers of the scale runs (default: the scenario's 1,000)")
    parser.add_argument("--scale-modes", default="async,sync",
                        help="modes of the scale runs, comma-separated")
    parser.add_argument("--skip-scale", action="store_true", help="skip the scale runs")
    parser.add_argument("--scale-simpy", action="store_true",
                        help="after each scale run, the SimPy model of the same job (minutes)")
    parser.add_argument("--scale-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scale_child:
        scale_run(args.scale_trainers, args.scale_child, args.protocol)
        return
    compare_with_simpy(Workload(args.trainers, args.pservers, args.steps, args.mode,
                                args.protocol), args.repeat)
    if not args.skip_scale:
        for mode in args.scale_modes.split(","):
            scale_wall(args.scale_trainers, mode, args.protocol, args.scale_simpy)


if __name__ == "__main__":
    main()
