"""Where a real job's time goes: each node's main thread on a core, waiting for one, or blocked,
and what it runs while on a core, sampled by py-spy.

`runtime up` of the scenario as written (``--set`` overrides it); each node process is found as
it starts (a child of `runtime up`, by its command line ``--role R --index I``) and watched:

- the Linux scheduler's own accounting of the node's threads (``/proc/PID/task/TID/
  schedstat``: nanoseconds on a core, nanoseconds runnable but waiting for one), read every
  `POLL` seconds, over the job's training (`training_window`: from ``job.train_seconds``
  before the last trainer ended to then). For the main thread: its share of that
  time on a core, waiting for one, and neither, which is the thread blocked (waiting for a
  message, a reply, a barrier, or a timer); for the node's other threads together (ZeroMQ's
  I/O thread, which moves every byte, and the output thread), their time on a core as a share
  of the same time, and waiting for one. These figures cost the job nothing; they are the
  split a machine of this many cores gives the job.
- the machine's cores (``/proc/stat``, read at the same times): the share of their time idle
  over the training. Set against the threads' waiting, it says whether the job is short of
  cores (little idle, much waiting) or the scheduler leaves a core idle while a thread waits
  for one (both large: on the 2-core development VM, the CNN 2 x 2 job's cores were idle
  12-15% of its training while each trainer's main thread waited 12-13% of it for a core, and
  its I/O thread 7-8%; docs/fidelity.md).
- py-spy (`[bench]` extra; without it the table has the scheduler's columns only), attached to
  each node at ``--rate`` samples a second, non-blocking: each sample's Python stack is given
  to the category of its innermost frame that has one (`CATEGORIES`, by file), and a stack
  in none is ``other``. Samples where the thread is idle are not taken (py-spy's default),
  those of the node's start-up (before ``run_async``) and of other threads are left out. A
  sample whose innermost Python frame is the event loop's own (uvloop's ``run``) is the loop
  itself: its C code polling and dispatching, libzmq's calls from it are in ``transport``.
  Shares are of the node's samples; a thread waiting for a core is sampled as running, where
  it was, so the shares split on-core and waiting time alike.

Run: python benchmarks/step_split.py [SCENARIO] [--set PATH=VALUE ...] [--steps N]
         [--rate 250] [--out DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL = 0.05
"""Seconds between readings of a node's schedstat and searches for new nodes."""

CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("kernels", ("runtime/execution/kernels/",)),
    ("executor", ("runtime/execution/",)),
    ("encode", ("runtime/network/wire/encoding.py", "runtime/network/wire/header.py",
                "runtime/network/wire/format.py", "runtime/network/wire/weighing.py",
                "runtime/network/compression.py", "msgpack/")),
    ("decode", ("runtime/network/wire/decoding.py",)),
    ("transport", ("runtime/network/zmq_transport.py", "runtime/network/rpc.py",
                   "runtime/network/curve.py", "zmq/")),
    ("reporting", ("runtime/services/output.py", "runtime/services/progress.py")),
    ("pserver", ("runtime/services/pserver",)),
    ("trainer", ("runtime/services/trainer", "runtime/services/collective")),
    ("event loop", ("uvloop/", "asyncio/")),
]
"""A frame's category by the first fragment of its file that matches, in this order (the
innermost frame with one decides)."""

COLUMNS = [name for name, _ in CATEGORIES] + ["other"]
LOOP_MARK = "run_async (runtime/services/node.py"
"""The frame under which a node's event loop runs: samples without it are its start-up."""


def category(stack: list[str]) -> str:
    """The category of a py-spy stack (outermost frame first, ``func (file:line)`` each)."""
    for frame in reversed(stack):
        where = frame[frame.rfind("(") + 1:]
        for name, fragments in CATEGORIES:
            if any(fragment in where for fragment in fragments):
                return name
    return "other"


def split_samples(raw: str) -> Counter[str]:
    """py-spy's raw output (``frame;frame;... COUNT`` lines; with ``--threads`` the first frame
    names the thread) as samples per category, the main thread's in its event loop only."""
    counts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack_text, _, number = line.rpartition(" ")
        if not stack_text or not number.isdigit():
            continue
        stack = stack_text.split(";")
        if not any(LOOP_MARK in frame for frame in stack):
            continue  # start-up, or another thread (the output pump)
        counts[category(stack)] += int(number)
    return counts


@dataclass
class Watched:
    """One node process: its label, its schedstat readings (t, the main thread's on-core ns
    and waiting ns, the other threads' on-core ns)."""

    pid: int
    label: str
    readings: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    """(t, main thread's on-core ns, its waiting ns, the other threads' on-core ns, their
    waiting ns)."""
    threads: dict[int, tuple[int, int]] = field(default_factory=dict)
    """The other threads' (on-core ns, waiting ns), by thread id, as last read."""
    spy: subprocess.Popen[bytes] | None = None
    spy_file: Path | None = None

    def read(self) -> None:
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
            stats = {int(t): Path(f"/proc/{self.pid}/task/{t}/schedstat").read_text().split()
                     for t in tasks}
        except OSError:
            return
        main = stats.pop(self.pid, None)
        if main is None:
            return
        for tid, stat in stats.items():  # a thread that ended keeps its last figure
            self.threads[tid] = (int(stat[0]), int(stat[1]))
        self.readings.append((time.monotonic(), int(main[0]), int(main[1]),
                              sum(on for on, _ in self.threads.values()),
                              sum(wait for _, wait in self.threads.values())))


def read_cores() -> tuple[float, int, int]:
    """(monotonic seconds, the cores' idle ticks, all their ticks) from ``/proc/stat``: idle
    counts iowait too."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return time.monotonic(), ticks[3] + ticks[4], sum(ticks)


def idle_share(readings: list[tuple[float, int, int]], window: tuple[float, float]) -> float:
    """The cores' idle share over `window`, from the first to the last reading inside it."""
    kept = [r for r in readings if window[0] <= r[0] <= window[1]]
    if len(kept) < 2 or kept[-1][2] == kept[0][2]:
        return math.nan
    return (kept[-1][1] - kept[0][1]) / (kept[-1][2] - kept[0][2])


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
            found.append(int(entry))
    return found


def _label(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return None
    if "runtime.services.node" not in argv or "--role" not in argv:
        return None
    role = argv[argv.index("--role") + 1]
    index = argv[argv.index("--index") + 1] if "--index" in argv else "0"
    return f"{role}:{index}"


def watch(command: list[str], spy: str | None, rate: int, work: Path,
          cores: list[tuple[float, int, int]]) -> list[Watched]:
    """Run `command` (`runtime up`), watching every node it starts until it exits, and the
    machine's cores (`read_cores`, appended to `cores`)."""
    with open(work / "up.log", "wb") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return _watch_nodes(job, spy, rate, work, cores)


def _watch_nodes(job: subprocess.Popen[bytes], spy: str | None, rate: int,
                 work: Path, cores: list[tuple[float, int, int]]) -> list[Watched]:
    nodes: dict[int, Watched] = {}
    while job.poll() is None:
        cores.append(read_cores())
        for pid in _children(job.pid):
            if pid in nodes:
                continue
            label = _label(pid)
            if label is None:
                continue
            node = nodes[pid] = Watched(pid, label)
            if spy:
                node.spy_file = work / f"{label.replace(':', '-')}.txt"
                node.spy = subprocess.Popen(
                    [spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                     "--format", "raw", "-o", str(node.spy_file)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node in nodes.values():
            node.read()
        time.sleep(POLL)
    for node in nodes.values():
        if node.spy is not None:
            node.spy.wait(timeout=60)
    if job.returncode != 0:  # 1: an expectation of the scenario's not met (steps changed)
        print(f"note: runtime up exited {job.returncode} (its output: {work / 'up.log'})")
    if not nodes:
        raise SystemExit(f"runtime up started no node: see {work / 'up.log'}")
    return sorted(nodes.values(), key=lambda n: n.label)


def scheduler_split(node: Watched, window: tuple[float, float]
                    ) -> tuple[float, float, float, float, float, float]:
    """(seconds watched, on-core share, waiting share, blocked share) of the node's main thread
    over `window` (monotonic seconds: the job's training), and its other threads' time on a core
    and waiting for one, as shares of the same seconds (ZeroMQ's I/O thread, moving the bytes;
    the output thread)."""
    kept = [r for r in node.readings if window[0] <= r[0] <= window[1]]
    if len(kept) < 2:
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    (t0, on0, wait0, io0, iow0), (t1, on1, wait1, io1, iow1) = kept[0], kept[-1]
    wall = t1 - t0
    on, waiting = (on1 - on0) / 1e9 / wall, (wait1 - wait0) / 1e9 / wall
    return (wall, on, waiting, max(1.0 - on - waiting, 0.0), max(io1 - io0, 0) / 1e9 / wall,
            max(iow1 - iow0, 0) / 1e9 / wall)


def training_window(nodes: list[Watched], metrics: Path) -> tuple[float, float]:
    """The job's training on the readings' clock: it ends when the last trainer ended (its
    last reading), and began ``job.train_seconds`` (metrics.json) before that."""
    ends = [n.readings[-1][0] for n in nodes if n.label.startswith("trainer") and n.readings]
    end = max(ends, default=time.monotonic())
    try:
        seconds = float(json.loads(metrics.read_text())["job"]["train_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        seconds = math.inf  # no record: every reading
    return end - seconds, end


def report(nodes: list[Watched], spy: bool, window: tuple[float, float], out: list[str]) -> None:
    header = (f"{'node':<12}{'watched s':>10}{'on core':>9}{'waiting':>9}{'blocked':>9}"
              f"{'I/O thr.':>9}{'I/O wait':>9}")
    if spy:
        header += "  " + " ".join(f"{c:>10}" for c in COLUMNS) + f"{'samples':>9}"
    out.append(header)
    for node in nodes:
        wall, on, waiting, blocked, io, io_wait = scheduler_split(node, window)
        line = (f"{node.label:<12}{wall:>10.2f}{on:>9.0%}{waiting:>9.0%}{blocked:>9.0%}"
                f"{io:>9.0%}{io_wait:>9.0%}")
        if spy and node.spy_file is not None and node.spy_file.exists():
            counts = split_samples(node.spy_file.read_text())
            total = sum(counts.values()) or 1
            line += "  " + " ".join(f"{counts[c] / total:>10.0%}" for c in COLUMNS)
            line += f"{sum(counts.values()):>9}"
        out.append(line)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", default=str(ROOT / "scenarios/quickstart.yaml"))
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--steps", type=int, help="train.steps (default: the scenario's)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument("--out", type=Path, help="keep the run and py-spy's files here")
    parser.add_argument("--quick", action="store_true", help="a few steps, for the tests")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    work = args.out or Path(tempfile.mkdtemp(prefix="pslab-split-"))
    work.mkdir(parents=True, exist_ok=True)
    steps = 5 if args.quick else args.steps
    command = [sys.executable, "-m", "runtime.cli", "up", args.scenario, "--out",
               str(work / "run")] + [f"--set={s}" for s in args.set]
    if steps:
        command.append(f"--set=train.steps={steps}")
    print(f"where the time goes: {' '.join(command[2:])}")
    if not spy:
        print("py-spy is not installed (pip install -e .[bench]): the scheduler's split only")
    elif args.quick:
        spy = None  # a few steps give py-spy nothing to sample; the tests need no ptrace
    cores: list[tuple[float, int, int]] = []
    nodes = watch(command, spy, args.rate, work, cores)
    lines: list[str] = []
    window = training_window(nodes, work / "run" / "metrics.json")
    report(nodes, spy is not None, window, lines)
    print("\n".join(lines))
    print(f"split of {len(nodes)} node(s); main thread: on a core, waiting for a core, blocked;"
          " its other threads (ZeroMQ's I/O thread): on a core, waiting for one"
          + ("; py-spy: shares of its samples in the event loop" if spy else ""))
    print(f"the machine's {os.cpu_count()} cores: idle {idle_share(cores, window):.0%} of the "
          "training")
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
