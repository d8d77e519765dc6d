"""How the distribute transpiler's time grows with the number of parameters and pservers.

The model has N parameters: N/2 small fc layers (weight [8, 4] and bias [4]) reading one input,
their outputs summed into a mean loss, trained by SGD; sync mode, 4 trainers, RoundRobin. For
N in 10, 100, 1,000 and 5,000 and 2, 16 and 128 pservers it times

- ``transpile``: planning and the trainer's main and startup programs;
- ``pservers``: every pserver's main and startup program (`get_pserver_programs` per endpoint);

the best of ``--repeat`` rounds over the whole grid (rounds, not back-to-back runs, so that a
burst of load from another process spoils one sample of many cells rather than every sample of
one), with the cyclic garbage collector frozen and disabled while timing
(`Program.clone` makes many small objects, and a collection landing in one run but not another
would blur the figures). The growth columns give time(N) / time(N / 10) per 10x parameters
(for 5,000 the 1,000 -> 5,000 ratio raised to 1/log10(5)): about 10 means linear growth.
A pserver's startup scans the whole startup program, so building all P pservers' programs in
one process costs O(N * P), while each pserver process pays O(N).

Run: python benchmarks/transpile_scale.py [--quick] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import transpiler as T
from transpiler.ir import Program

PARAMS = (10, 100, 1000, 5000)
PSERVERS = (2, 16, 128)
QUICK_PARAMS = (10, 100, 1000)
QUICK_PSERVERS = (2, 16)
TRAINERS = 4


def build(params: int) -> tuple[Program, Program]:
    """A program with `params` parameters (an even number): params/2 fc layers of 8 -> 4."""
    main, startup = Program(), Program()
    with T.program_guard(main, startup), T.unique_name.guard():
        x = T.layers.data("x", shape=[8])
        outs = [T.layers.fc(x, size=4, param_attr=T.ParamAttr(name=f"fc{i}.w"),
                            bias_attr=T.ParamAttr(name=f"fc{i}.b")) for i in range(params // 2)]
        loss = T.layers.mean(T.layers.sums(outs) if len(outs) > 1 else outs[0])
        T.optimizer.SGD(0.1).minimize(loss)
    return main, startup


def endpoints(count: int) -> list[str]:
    return [f"127.0.0.1:{6170 + i}" for i in range(count)]


def timed(fn: Callable[[], object]) -> float:
    """Seconds one run of `fn` takes, the garbage collector frozen and off."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()
        gc.unfreeze()


@dataclass(frozen=True)
class Row:
    params: int
    pservers: int
    transpile: float
    pserver_programs: float

    @property
    def total(self) -> float:
        return self.transpile + self.pserver_programs


def measure(programs: tuple[Program, Program], params: int, pservers: int) -> Row:
    """One timing of `transpile` and of building every pserver's programs."""
    eps = endpoints(pservers)
    t = T.DistributeTranspiler()

    def transpile() -> None:
        t.transpile(0, program=programs[0], pservers=",".join(eps), trainers=TRAINERS,
                    startup_program=programs[1], in_place=False)

    return Row(params, pservers, timed(transpile),
               timed(lambda: [t.get_pserver_programs(ep) for ep in eps]))


def best(rows: Sequence[Row]) -> Row:
    return Row(rows[0].params, rows[0].pservers, min(r.transpile for r in rows),
               min(r.pserver_programs for r in rows))


def growth(rows: Sequence[Row], row: Row, value: Callable[[Row], float]) -> str:
    """value(row) / value(the row with the next smaller N, same pservers), per 10x params."""
    smaller = [r for r in rows if r.pservers == row.pservers and r.params < row.params]
    if not smaller:
        return "-"
    prev = max(smaller, key=lambda r: r.params)
    ratio = value(row) / value(prev)
    return f"{ratio ** (1 / math.log10(row.params / prev.params)):.1f}x"


def report(rows: Sequence[Row]) -> list[str]:
    lines = [f"{'params':>7} {'pservers':>8} {'transpile':>10} {'pservers':>10} {'per ps':>8} "
             f"{'total':>10} {'us/param':>9}   growth/10x: {'transpile':>9} {'pservers':>8}"]
    for r in rows:
        lines.append(f"{r.params:>7} {r.pservers:>8} {r.transpile * 1e3:>8.1f}ms "
                     f"{r.pserver_programs * 1e3:>8.1f}ms "
                     f"{r.pserver_programs / r.pservers * 1e3:>6.2f}ms {r.total * 1e3:>8.1f}ms "
                     f"{r.total / r.params * 1e6:>9.0f}   {'':>11} "
                     f"{growth(rows, r, lambda x: x.transpile):>9} "
                     f"{growth(rows, r, lambda x: x.pserver_programs):>8}")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"only {QUICK_PARAMS} params on {QUICK_PSERVERS} pservers")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds over the whole grid; each figure is its best round (5)")
    args = parser.parse_args(argv)
    params, pservers = (QUICK_PARAMS, QUICK_PSERVERS) if args.quick else (PARAMS, PSERVERS)
    print(f"transpile time: sync, {TRAINERS} trainers, RoundRobin, SGD, fc params of [8, 4] and "
          f"[4]; best of {args.repeat} rounds; gc frozen and disabled while timing")
    models = {n: build(n) for n in params}
    cells = [(n, p) for p in pservers for n in params]
    rounds = [[measure(models[n], n, p) for n, p in cells] for _ in range(args.repeat)]
    print("\n".join(report([best(runs) for runs in zip(*rounds)])))
    print("transpile: plan + trainer main and startup; pservers: every pserver's main and "
          "startup (per ps: one pserver's share); growth/10x: time ratio per 10x params "
          "(10 = linear)")


if __name__ == "__main__":
    main()
