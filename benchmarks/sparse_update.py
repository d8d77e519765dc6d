"""What a sparse update of an embedding table costs as the table grows, measured in one run.

A pserver applies a trainer's gradient piece of its table shard (a `SelectedRows` of 100 rows)
as it does in a run: the piece's global ids made rows of the shard and averaged
(`runtime.execution.table.TableShard`), then the table's optimize block run by the `Executor`
(`sgd`, `adagrad`, and `adam` with `lazy_mode`), with the table and its accumulators updated in
the scope. Each figure is the median time of one such update over many, for tables of 10k to
10M rows of 8 float32; the ratio is each size's time over the 10k table's (1.0: flat, the
cost of the rows touched only). Each optimizer is measured with the numpy kernels and, when
torch is installed, with the torch kernels on the CPU (torch's intra-op threads capped at 1, a
pserver's share of a small host). For scale, the last row is what copying the table once
costs, which is what every update cost before.

The checkpoint rows are what a pserver's checkpoint of the table costs after an update of 100
rows (`runtime.services.checkpoint`, the table alone): the median time of writing it as a delta
over the previous checkpoint's linked base, and the bytes written (delta and manifest), against
the bytes of the full base every checkpoint wrote before.

Run: python benchmarks/sparse_update.py [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from runtime import Executor, Scope, SelectedRows
from runtime.execution.table import TableShard
from runtime.services.checkpoint import Staging
from transpiler.ir import Program

WIDTH, TOUCHED = 8, 100
SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
STATES = {"sgd": {}, "adagrad": {"Moment": "MomentOut"},
          "adam": {"Moment1": "Moment1Out", "Moment2": "Moment2Out"}}


def _program(op_type: str, rows: int) -> Program:
    program = Program()
    block = program.global_block()
    for name in ["table", *STATES[op_type]]:
        block.create_var(name, shape=[rows, WIDTH], dtype="float32", persistable=True)
    block.create_var("piece", shape=[rows, WIDTH], dtype="float32")
    scalars = ["lr"] + (["Beta1Pow", "Beta2Pow"] if op_type == "adam" else [])
    for name in scalars:
        block.create_var(name, shape=[1], dtype="float32", persistable=True)
    inputs = {"Param": ["table"], "Grad": ["piece"], "LearningRate": ["lr"]}
    inputs |= {slot: [slot] for slot in [*STATES[op_type], *scalars[1:]]}
    outputs = {"ParamOut": ["table"]} | {o: [s] for s, o in STATES[op_type].items()}
    block.append_op(op_type, inputs, outputs, {"lazy_mode": True} if op_type == "adam" else {})
    return program


def backends() -> list[str]:
    """numpy, and torch where it is installed."""
    return ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


def update_seconds(op_type: str, rows: int, repeats: int, backend: str = "numpy") -> float:
    """The median time of one sparse update of a `rows`-row table shard."""
    program, scope, exe = _program(op_type, rows), Scope(), Executor(backend)
    rng = np.random.default_rng(0)
    for name in ["table", *STATES[op_type]]:
        scope.put(name, rng.uniform(0.1, 1.0, (rows, WIDTH)).astype("float32"))
    for name, value in {"lr": 0.1, "Beta1Pow": 0.9, "Beta2Pow": 0.999}.items():
        scope.put(name, np.array([value], "float32"))
    shard = TableShard("table", rows, rows, rows, (WIDTH,), np.dtype("float32"),
                       {"piece": 0}, {}, -1)
    times = []
    for _ in range(repeats):
        ids = rng.integers(rows, 2 * rows, TOUCHED)  # global ids of the second pserver's shard
        piece = SelectedRows(ids, rng.standard_normal((TOUCHED, WIDTH)).astype("float32"),
                             2 * rows)
        start = time.perf_counter()
        scope.put("piece", shard.local_rows("piece", piece))
        shard.average_pieces(scope, {0})
        exe.run_block(program, 0, scope)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_seconds(rows: int) -> float:
    table = np.ones((rows, WIDTH), "float32")
    start = time.perf_counter()
    table.copy()
    return time.perf_counter() - start


def checkpoint_cost(rows: int, repeats: int) -> tuple[float, int, int]:
    """Median seconds and bytes of a table checkpoint after 100 rows were written; full bytes."""
    rng = np.random.default_rng(0)
    table = np.ones((rows, WIDTH), "float32")
    times, written = [], []
    with tempfile.TemporaryDirectory(prefix="pslab-bench-ckpt-") as tmp:
        target = Path(tmp) / "pserver:0"
        with Staging(target) as stage:
            stage.commit({"table": table}, 0)
        since, full = stage.id, (target / "table.npy").stat().st_size
        for step in range(1, repeats + 1):
            touched = np.unique(rng.integers(0, rows, TOUCHED))
            table[touched] += 1
            before = {p.name for p in target.iterdir()}
            start = time.perf_counter()
            with Staging(target) as stage:
                assert stage.write_delta("table", table, touched, since)
                stage.commit({"table": table}, step)
            times.append(time.perf_counter() - start)
            since = stage.id
            written.append(sum(p.stat().st_size for p in target.iterdir()
                               if p.name not in before or p.name == "manifest.json"))
    return statistics.median(times), int(statistics.median(written)), full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--smoke", action="store_true",
                        help="the two smallest tables, a few repeats (the test suite's run)")
    args = parser.parse_args()
    repeats = 5 if args.smoke else 50 if args.quick else 300
    sizes = SIZES[:2] if args.smoke else SIZES
    print(f"one update of {TOUCHED} rows of a table of N rows x {WIDTH} float32 "
          "(median; ratio to N = 10k)")
    names = backends()
    if "torch" in names:
        from runtime.execution.kernels.torch_common import set_threads
        set_threads(1)
    print(f"{'optimizer':<22}" + "".join(f"{n:>22,}" for n in sizes))
    for backend in names:
        for op_type in STATES:
            figures = [update_seconds(op_type, n, repeats, backend) for n in sizes]
            cells = [f"{t * 1e3:9.3f} ms ({t / figures[0]:5.2f}x)" for t in figures]
            label = f"{op_type}{' (lazy)' if op_type == 'adam' else ''}, {backend}"
            print(f"{label:<22}" + "".join(f"{c:>22}" for c in cells))
    copies = [copy_seconds(n) for n in sizes]
    print(f"{'table copy':<22}" + "".join(f"{t * 1e3:19.3f} ms" for t in copies))
    costs = [checkpoint_cost(n, 2 if args.smoke else 5 if args.quick else 20) for n in sizes]
    print(f"{'checkpoint (delta)':<22}" + "".join(f"{t * 1e3:19.3f} ms" for t, _, _ in costs))
    print(f"{'  bytes written':<22}" + "".join(f"{b:>22,}" for _, b, _ in costs))
    print(f"{'  full base, bytes':<22}" + "".join(f"{f:>22,}" for _, _, f in costs))


if __name__ == "__main__":
    main()
