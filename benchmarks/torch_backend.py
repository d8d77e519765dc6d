"""Step time of the torch backend against numpy's and against torch's own training of the same
layers, in one run: local training (`Executor.run`: feed a batch, run forward, backward and SGD,
fetch the loss) of the model ``mlp`` with sizes 64-1024-1024-10 on batches of 64 (or, with
``--model cnn``, pslab's ``cnn``: a 16x16 image, 3x3 convolutions of 8 and 16 channels with
batch_norm, relu and 2x2 max pools), pslab's numpy kernels, its torch-CPU kernels and "torch
itself" (the layers as torch.nn, `vs_ddp.torch_model`, with torch.optim.SGD: forward, loss,
backward, step, the loss read as a float) interleaved round by round so that drift on a busy
machine hits all three.

Each backend gets the same number of threads (``--threads``, 1 by default: what `runtime up`
gives a node on a host shared by as many nodes as cores). numpy's BLAS reads its thread count
when it loads, so this script sets ``OMP_NUM_THREADS`` and the like before importing numpy;
torch is told with `torch.set_num_threads` (what a node does, `runtime.services.node`).

Printed per backend: milliseconds per step, min / median / max over the rounds (each round's
figure is the mean of its steps), numpy / torch-cpu as ratios (above 1: pslab's torch kernels
are faster) and torch-itself / torch-cpu (above 1: pslab's torch kernels train faster than torch
does by itself). Where a
GPU is present, the same for torch on ``cuda`` and the bytes copied between host and device per
step (counted at `torch_common.from_host` and `to_host`, the only places they happen); without
one the GPU part is skipped with a message.

Run: python benchmarks/torch_backend.py [--model mlp|cnn] [--rounds 7] [--steps 20] [--threads 1]
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
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sizes", default="64,1024,1024,10", help="the mlp's layer sizes")
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
from vs_ddp import Row, torch_model  # noqa: E402

Batch = dict[str, np.ndarray]
LEARNING_RATE = 0.01
SGD = {"type": "sgd", "learning_rate": LEARNING_RATE}
ITSELF = "torch-itself"


def batches(row: Row, batch: int, count: int) -> list[Batch]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((batch, row.features)).astype(np.float32),
             "label": rng.integers(0, row.classes, (batch, 1)).astype(np.int64)}
            for _ in range(count)]


def pslab_model(row: Row) -> Any:
    if row.kind == "mlp":
        return build_model("mlp", sizes=list(row.sizes), optimizer=SGD)
    return build_model("cnn", image=row.image, channels=list(row.channels), classes=row.classes,
                       optimizer=SGD)


class Steps:
    """Something that trains a step on a batch; `round` times a run of them."""

    def step(self, batch: Batch) -> float:
        raise NotImplementedError

    def round(self, data: list[Batch]) -> float:
        """Mean seconds per step over `data`."""
        start = time.perf_counter()
        for batch in data:
            self.step(batch)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / len(data)


class TorchItself(Steps):
    """The row's layers as torch.nn with torch.optim.SGD, on the CPU."""

    def __init__(self, row: Row) -> None:
        self.model = torch_model(row)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)

    def step(self, batch: Batch) -> float:
        x, label = torch.from_numpy(batch["x"]), torch.from_numpy(batch["label"]).reshape(-1)
        loss = torch.nn.functional.cross_entropy(self.model(x), label)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()


class Trainer(Steps):
    """One backend's model, executor and scope, initialized once."""

    def __init__(self, backend: str, device: str, row: Row) -> None:
        self.model = pslab_model(row)
        self.exe = executor_module.Executor(backend, device)
        self.scope = Scope()
        self.exe.run(self.model.startup, scope=self.scope)

    def step(self, batch: Batch) -> float:
        feed = {name: batch[key] for name, key in zip(self.model.feeds, ("x", "label"))}
        (loss,) = self.exe.run(self.model.main, feed=feed, fetch_list=[self.model.loss],
                               scope=self.scope)
        return float(loss.reshape(-1)[0])


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


def measure(trainers: dict[str, Steps], data: list[Batch], rounds: int) -> dict[str, list[float]]:
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
        if name not in ("numpy", ITSELF):
            out(f"numpy / {name:12} {ratio(base, seconds)}   (min median max; >1: faster than numpy)")
    out(f"{ITSELF} / torch-cpu {ratio(times[ITSELF], times['torch-cpu'])}   "
        "(min median max; >1: pslab's torch kernels faster than torch by itself)")


def main() -> None:
    row = (Row("mlp", "mlp", 0, sizes=tuple(int(s) for s in ARGS.sizes.split(",")))
           if ARGS.model == "mlp" else Row("cnn", "cnn", 0))
    torch.set_num_threads(ARGS.threads)
    print(f"{row.label()}, batch {ARGS.batch}, {ARGS.steps} steps x {ARGS.rounds} rounds, "
          f"{ARGS.threads} thread(s), torch {torch.__version__}")
    data = batches(row, ARGS.batch, ARGS.steps)
    trainers: dict[str, Steps] = {"numpy": Trainer("numpy", "cpu", row),
                                  "torch-cpu": Trainer("torch", "cpu", row),
                                  ITSELF: TorchItself(row)}
    if torch.cuda.is_available():
        trainers["torch-cuda"] = Trainer("torch", "cuda", row)
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
