"""An interrupted `runtime up` keeps what its pservers did, and its output folder is its own.

Ctrl-C: the launcher stops its nodes with SIGTERM, each pserver writes its record first, and
the summary and metrics.json carry the steps and messages the pservers served. A second `runtime
up` into the folder of a running one is refused at once, naming it, and changes nothing. SIGKILL
of the launcher: its nodes get SIGTERM from Linux (`runtime.services.lifeline`), the pservers
write their records, and the folder stays locked until the last node has ended (a node that a
fault may pause is SIGKILLed instead: only that ends a stopped process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.config.metrics import PserverMetrics, read_metrics, read_record
from runtime.config.outdir import OutputLocked, claim_output
from runtime.config.scenario import load_scenario
from runtime.launch.launcher import Launcher, prepare_out
from runtime.services.lifeline import launcher_gone, lifeline_environment, lifeline_signal

from runtime_runs import alive, children_of, scenario_file, wait_for

ROOT = Path(__file__).resolve().parents[2]


def start(scenario: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "runtime.cli", "up", str(scenario), "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def wait_for_steps(out: Path) -> None:
    """Until trainer 1 has logged a step: every node runs, the pservers have served."""
    log = out / "logs" / "trainer-1.log"
    wait_for(lambda: log.exists() and " loss " in log.read_text(), 45, "trainer 1's first step")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.timeout(120)
def test_ctrl_c_keeps_the_pservers_counters_and_a_second_run_into_the_folder_is_refused(
        tmp_path: Path) -> None:
    # CurveZMQ: the first run's keys, which the second must leave alone
    scenario = scenario_file(tmp_path, steps=100000, expect="{}",
                             cluster="{pservers: 2, trainers: 2, security: curve}")
    out = tmp_path / "out"
    first = start(scenario, out)
    try:
        wait_for_steps(out)
        keys = {p.name: p.read_bytes() for p in (out / "keys").iterdir()}
        second = subprocess.run([sys.executable, "-m", "runtime.cli", "up", str(scenario),
                                 "--out", str(out)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and second.stdout == "", second
        assert second.stderr.startswith(f"runtime up: error: output folder {out} is in use by "
                                        f"another run, pid {first.pid} on "), second.stderr
        assert "runtime.cli up" in second.stderr and second.stderr.count("\n") == 1
        assert {p.name: p.read_bytes() for p in (out / "keys").iterdir()} == keys
        first.send_signal(signal.SIGINT)
        output, _ = first.communicate(timeout=60)
    finally:
        stop(first)
    assert first.returncode == 128 + signal.SIGINT, output
    metrics = read_metrics(out / "metrics.json")
    assert metrics.job.reason == "interrupted by SIGINT"
    for p in metrics.pservers:
        assert p.steps > 0 and p.messages > 0 and p.exit_code == 128 + signal.SIGTERM, p
        summary = f"pserver:{p.index:<4} {p.steps} steps  {p.messages} messages  "
        assert any(line.startswith(summary) for line in output.splitlines()), output


@pytest.mark.timeout(120)
def test_the_pservers_of_a_sigkilled_launcher_write_their_records_before_they_end(
        tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path, steps=100000, expect="{}"), tmp_path / "out"
    launcher = start(scenario, out)
    kids: list[int] = []
    sockets: Path | None = None
    try:
        wait_for_steps(out)
        kids = children_of(launcher.pid)
        assert len(kids) == 4
        sockets = _socket_dir(kids[0])
        assert sockets is not None and sockets.is_dir()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        wait_for(lambda: not any(alive(pid) for pid in kids), 20,
                 "the nodes to end with their launcher")
    finally:
        stop(launcher)
        for pid in kids:  # a failed assertion must not leave them running
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
    for j in range(2):
        record = read_record(out / "nodes" / f"pserver-{j}.json", PserverMetrics)
        assert record.steps > 0 and record.messages > 0, record
    # the last node has ended: the folder is freed (at once, or as soon as whatever a node
    # started and the scheduler has not yet ended on a loaded machine lets go of it)
    wait_for(lambda: _free(out), 20, "the output folder to be freed")
    # the nodes' local sockets go with them (the last removes them as it ends, perhaps after
    # letting go of the folder): the launcher, killed, could not
    assert sockets is not None
    wait_for(lambda: not sockets.exists(), 20, f"the nodes to remove {sockets}")


def _socket_dir(pid: int) -> Path | None:
    """The ``--ipc DIR`` a node process was started with."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(os.fsdecode(args[args.index(b"--ipc") + 1])) if b"--ipc" in args else None


def _free(out: Path) -> bool:
    try:
        with claim_output(out):
            return True
    except OutputLocked:
        return False


def test_only_a_node_a_fault_may_pause_is_sigkilled_when_its_launcher_dies(
        tmp_path: Path) -> None:
    """SIGTERM lets a pserver write its record; a node stopped by SIGSTOP would never see it,
    so one that a ``pause`` or ``slow`` fault names asks for SIGKILL."""
    assert lifeline_signal(lifeline_environment(pausable=False)) == signal.SIGTERM
    assert lifeline_signal(lifeline_environment(pausable=True)) == signal.SIGKILL
    assert lifeline_signal({}) == signal.SIGKILL  # a launcher that did not say
    scenario = load_scenario(ROOT / "scenarios" / "faults" / "pause.yaml")
    prepare_out(tmp_path, scenario)
    launcher = Launcher(Path("pause.yaml"), [], scenario, ["127.0.0.1:1", "127.0.0.1:2"],
                        tmp_path)
    try:
        paused = [n.name for n in launcher.nodes if launcher._pausable(n)]
    finally:
        for node in launcher.nodes:
            node.log.close()
    assert paused == ["pserver:1"]


def test_a_node_whose_parent_is_its_launcher_and_running_sees_it_alive() -> None:
    assert not launcher_gone(os.getppid())  # this test's own parent is alive and not a zombie
    assert launcher_gone(os.getpid())  # not this process's parent
