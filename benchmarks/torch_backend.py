"""Step time of the torch backend against numpy's on a wide MLP, in one run: local training
(`Executor.run`: feed a batch, run forward, backward and SGD, fetch the loss) of the model
``mlp`` with sizes 64-1024-1024-10 on batches of 64, numpy and torch-CPU interleaved round by
round so that drift on a busy machine hits both.

Each backend gets the same number of threads (``--threads``, 1 by default: what `runtime up`
gives a node on a host shared by as many nodes as cores). numpy's BLAS reads its thread count
when it loads, so this script sets ``OMP_NUM_THREADS`` and the like before importing numpy;
torch is told with `torch.set_num_threads` (what a node does, `runtime.services.node`).

Printed per backend: milliseconds per step, min / median / max over the rounds (each round's
figure is the mean of its steps), and numpy / torch as ratios (above 1: torch is faster). Where a
GPU is present, the same for torch on ``cuda`` and the bytes copied between host and device per
step (counted at `torch_common.from_host` and `to_host`, the only places they happen); without
one the GPU part is skipped with a message.

Run: python benchmarks/torch_backend.py [--rounds 7] [--steps 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sizes", default="64,1024,1024,10")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


ARGS = parse_args(sys.argv[1:])
for _name in THREAD_VARS:  # before numpy loads its BLAS
    os.environ[_name] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from runtime.execution import executor as executor_module  # noqa: E402
from runtime.execution.kernels import torch_common  # noqa: E402
from runtime.execution.scope import Scope  # noqa: E402
from transpiler.models import build_model  # noqa: E402

Batch = dict[str, np.ndarray]


def batches(sizes: list[int], batch: int, count: int) -> list[Batch]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((batch, sizes[0])).astype(np.float32),
             "label": rng.integers(0, sizes[-1], (batch, 1)).astype(np.int64)}
            for _ in range(count)]


class Trainer:
    """One backend's model, executor and scope, initialized once."""

    def __init__(self, backend: str, device: str, sizes: list[int]) -> None:
        self.model = build_model("mlp", sizes=sizes, optimizer={"type": "sgd",
                                                                  "learning_rate": 0.01})
        self.exe = executor_module.Executor(backend, device)
        self.scope = Scope()
        self.exe.run(self.model.startup, scope=self.scope)

    def step(self, batch: Batch) -> float:
        feed = {name: batch[key] for name, key in zip(self.model.feeds, ("x", "label"))}
        (loss,) = self.exe.run(self.model.main, feed=feed, fetch_list=[self.model.loss],
                               scope=self.scope)
        return float(loss.reshape(-1)[0])

    def round(self, data: list[Batch]) -> float:
        """Mean seconds per step over `data`."""
        start = time.perf_counter()
        for batch in data:
            self.step(batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / len(data)


def summary(seconds: list[float]) -> str:
    ms = [s * 1e3 for s in seconds]
    return f"{min(ms):8.2f} {statistics.median(ms):8.2f} {max(ms):8.2f}"


def ratio(num: list[float], den: list[float]) -> str:
    pairs = sorted(a / b for a, b in zip(num, den))
    return f"{pairs[0]:6.2f} {statistics.median(pairs):6.2f} {pairs[-1]:6.2f}"


@contextmanager
def counting_copies() -> Iterator[list[int]]:
    """Bytes through `from_host` (to a device) and `to_host` (off it), as [up, down]."""
    counts = [0, 0]
    up, down = torch_common.from_host, torch_common.to_host

    def counted_up(a: np.ndarray, device: Any = None) -> torch.Tensor:
        if device is not None and device.type != "cpu":
            counts[0] += a.nbytes
        return up(a, device)

    def counted_down(t: torch.Tensor) -> np.ndarray:
        if t.device.type != "cpu":
            counts[1] += t.numel() * t.element_size()
        return down(t)

    torch_common.from_host, torch_common.to_host = counted_up, counted_down
    try:
        yield counts
    finally:
        torch_common.from_host, torch_common.to_host = up, down


def measure(trainers: dict[str, Trainer], data: list[Batch], rounds: int) -> dict[str, list[float]]:
    for trainer in trainers.values():  # warm up: plans, allocator, BLAS
        trainer.round(data[:3])
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(rounds):
        for name, trainer in trainers.items():
            times[name].append(trainer.round(data))
    return times


def report(times: dict[str, list[float]], out: Callable[[str], None]) -> None:
    out(f"{'backend':12} {'min':>8} {'median':>8} {'max':>8}   ms/step")
    for name, seconds in times.items():
        out(f"{name:12} {summary(seconds)}")
    base = times["numpy"]
    for name, seconds in times.items():
        if name != "numpy":
            out(f"numpy / {name:12} {ratio(base, seconds)}   (min median max; >1: faster than numpy)")


def main() -> None:
    sizes = [int(s) for s in ARGS.sizes.split(",")]
    torch.set_num_threads(ARGS.threads)
    print(f"mlp {sizes}, batch {ARGS.batch}, {ARGS.steps} steps x {ARGS.rounds} rounds, "
          f"{ARGS.threads} thread(s), torch {torch.__version__}")
    data = batches(sizes, ARGS.batch, ARGS.steps)
    trainers = {"numpy": Trainer("numpy", "cpu", sizes), "torch-cpu": Trainer("torch", "cpu", sizes)}
    if torch.cuda.is_available():
        trainers["torch-cuda"] = Trainer("torch", "cuda", sizes)
    report(measure(trainers, data, ARGS.rounds), print)
    if "torch-cuda" not in trainers:
        print("GPU: skipped (torch.cuda.is_available() is False: no GPU or a CPU-only torch build)")
        return
    with counting_copies() as counts:
        trainers["torch-cuda"].round(data)
    up, down = (c / len(data) for c in counts)
    print(f"GPU copies per step: {up / 1024:.1f} KiB to the device, {down / 1024:.1f} KiB off it "
          f"(a batch's feeds and the fetched loss; parameters stay on the device)")


if __name__ == "__main__":
    main()
