"""Every benchmark still runs: each in a quick mode (tiny sizes, one repeat), so that none can
rot unnoticed when the code it drives changes. What a benchmark measures is not checked here
(its figures are for people, on a quiet machine); that it runs to the end and prints its
summary is."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"

QUICK: dict[str, tuple[list[str], str]] = {
    "fidelity.py": (["--transfer", "--machine", "{machine}", "--only", "t1x1-small-b16",
                     "--repeat", "1", "--steps", "5"], "summary: 1 configurations"),
    "inbound_memory.py": (["--runs", "1", "--connections", "2", "--megabytes", "4"],
                          "alive True"),
    "overlap.py": (["--quick"], "summary: share of gradient bytes"),
    "pserver_chain.py": (["--megabytes", "0.5", "--rounds", "2", "--warmup", "1",
                          "--chunks", "1,2"], "summary: the chain in"),
    "pserver_memory.py": (["--steps", "12", "--sizes", "64,32,10"],
                          "bit-identical parameters: True"),
    "refusal_flood.py": (["--messages", "200", "--repeat", "1"], "every one logged"),
    "sim_loop_speed.py": (["--trainers", "4", "--pservers", "2", "--steps", "2"], "ratio"),
    "sim_network_speed.py": (["--messages", "500", "--senders", "2"], "ratio (network / bare)"),
    "sim_speed.py": (["--trainers", "4", "--pservers", "2", "--steps", "2", "--repeat", "1",
                      "--skip-scale"], "simulator wall s"),
    "sparse_update.py": (["--smoke"], "bytes written"),
    "step_split.py": (["--quick"], "split of 4 node(s)"),
    "sweep_ranking.py": (["--machine", "{machine}", "--repeat", "1", "--steps", "5",
                          "--trainers", "1..2", "--pservers", "1"], "summary: 2 points"),
    "torch_backend.py": (["--rounds", "1", "--steps", "2", "--sizes", "64,32,10"],
                         "numpy / torch-cpu"),
    "train_overhead.py": (["--steps", "5", "--repeats", "1"], "processes (runtime up)"),
    "transpile_scale.py": (["--quick", "--repeat", "1"], "transpile:"),
    "vs_ddp.py": (["--quick"], "over DDP's median"),
    "wire.py": (["--smoke"], "ratio to raw"),
}
"""Each benchmark's quick arguments (``{machine}``: a quick calibration's file) and a line of
its summary."""

NEEDS_TORCH = {"torch_backend.py", "vs_ddp.py"}


def test_every_benchmark_has_a_quick_run() -> None:
    shipped = {path.name for path in BENCHMARKS.glob("*.py")}
    assert shipped == set(QUICK), (f"benchmarks without a quick run: {shipped - set(QUICK)}; "
                                   f"quick runs of no benchmark: {set(QUICK) - shipped}")


pytestmark = pytest.mark.xdist_group("benchmarks")
"""The module on one worker (pyproject.toml's ``--dist loadgroup``): its module-scoped run
below runs once, not once on each worker."""


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quick calibration of this machine's numpy kernels (no runtime jobs)."""
    from runtime.launch.calibrate import calibrate, write_machine

    path = tmp_path_factory.mktemp("machine") / "machine.json"
    write_machine(path, calibrate(io.StringIO(), ["numpy"], quick=True, budget=2.0,
                                  runtime=False))
    return path


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(QUICK))
def test_the_benchmark_runs_to_its_summary(name: str, machine: Path) -> None:
    if name in NEEDS_TORCH:
        pytest.importorskip("torch")
    arguments, summary = QUICK[name]
    command = [sys.executable, str(BENCHMARKS / name),
               *(a.format(machine=machine) for a in arguments)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=220, cwd=ROOT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{output[-3000:]}"
    assert summary in output, f"{name} did not print {summary!r}:\n{output[-3000:]}"
