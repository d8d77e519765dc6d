"""A pserver's memory over a long run: the bounded reply cache against keeping every reply.

A pserver remembers replies so that a retried request gets its first answer again. Kept without
bound (the last 4,096 replies per sender, a GET's with the arrays it served), the replies pin a
copy of the pserver's shard per step: memory grows with the run. The cache now holds what a
retry can still ask for (`runtime.services.protocol.Dedupe`): a small window per sender, and a
sender's GET replies of its latest step only.

The same job (one trainer, one pserver, sync, a wide MLP on the simulator's in-process cluster,
numpy kernels) runs twice, each in a process of its own: with the cache as it is ("bounded"),
and with a cache that keeps every reply as before ("unbounded"). Each prints the process's
resident memory (trainer and pserver together: the trainer's does not grow) after steps 10,
100 and 1,000.

Run: python benchmarks/pserver_memory.py [--steps 1000] [--sizes 64,1024,1024,10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CHECKPOINTS = (10, 100, 1000)


def rss_mib() -> float:
    """This process's resident memory, MiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def scenario_text(steps: int, sizes: str) -> str:
    return f"""
name: pserver_memory
model: {{name: mlp, sizes: [{sizes}], optimizer: {{type: sgd, learning_rate: 0.01}}}}
data: {{name: digits, batch_size: 32}}
cluster: {{pservers: 1, trainers: 1}}
transpiler: {{mode: sync}}
train: {{steps: {steps}}}
"""


def keep_every_reply() -> None:
    """Replace the pserver's reply cache by the earlier one: 4,096 replies per sender, GET
    replies with their arrays."""
    from runtime.services import pserver_core
    from runtime.services.protocol import Dedupe

    class KeepAll(Dedupe):
        def __init__(self) -> None:
            super().__init__(window=4096)

        def remember(self, src: str, msg_id: int, reply: Any, values_of: int | None = None,
                     step: int | None = None) -> None:
            super().remember(src, msg_id, reply)  # no values or step held: nothing let go

    pserver_core.Dedupe = KeepAll  # type: ignore[misc, assignment]


def run_variant(variant: str, steps: int, sizes: str) -> dict[str, Any]:
    from runtime.config.scenario import parse_scenario
    from sim.simulate import simulate

    if variant == "unbounded":
        keep_every_reply()
    marks = {m for m in CHECKPOINTS if m <= steps} | {steps}
    seen: dict[int, float] = {}

    def on_step(trainer: int, step: int, loss: float, seconds: float, *_: float) -> None:
        if step + 1 in marks:
            seen[step + 1] = rss_mib()

    result = simulate(parse_scenario(scenario_text(steps, sizes)), on_step=on_step,
                      trace_messages=False)
    digest = hashlib.sha256()
    for name in sorted(result.params):
        digest.update(name.encode() + result.params[name].tobytes())
    return {"variant": variant, "rss_mib": seen, "params": digest.hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--sizes", default="64,1024,1024,10")
    parser.add_argument("--variant", choices=["bounded", "unbounded"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.steps, args.sizes)))
        return
    rows = {}
    for variant in ("bounded", "unbounded"):
        out = subprocess.run([sys.executable, __file__, "--variant", variant, "--steps",
                              str(args.steps), "--sizes", args.sizes],
                             check=True, capture_output=True, text=True).stdout
        rows[variant] = json.loads(out.strip().splitlines()[-1])
    same = rows["bounded"]["params"] == rows["unbounded"]["params"]
    marks = sorted(int(m) for m in rows["bounded"]["rss_mib"])
    print(f"pserver + trainer RSS (MiB), MLP [{args.sizes}], 1 trainer x 1 pserver, sync")
    print(f"{'step':>6} {'bounded':>10} {'unbounded':>10}")
    for m in marks:
        print(f"{m:>6} {rows['bounded']['rss_mib'][str(m)]:>10.0f} "
              f"{rows['unbounded']['rss_mib'][str(m)]:>10.0f}")
    print(f"bit-identical parameters: {same}")


if __name__ == "__main__":
    main()
