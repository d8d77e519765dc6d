"""No orphans: the nodes of `runtime up` die with it even when it is SIGKILLed or hung up on,
and a pserver on its own (role mode) whose trainers are gone stops, naming why, instead of
serving until its deadline."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.network.wire import Kind
from runtime.services.lifeline import LAUNCHER_VAR, launcher_pid
from runtime.services.node import EXIT_TRAINERS_GONE

from cluster_helpers import free_endpoints
from pserver_shell import Shell
from runtime_runs import alive, children_of, scenario_file, wait_for


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP], ids=["SIGKILL", "SIGHUP"])
def test_the_launcher_killed_or_hung_up_on_takes_every_node_with_it(
        tmp_path: Path, sig: signal.Signals) -> None:
    """SIGKILL: the nodes see their launcher gone (`runtime.services.lifeline`); SIGHUP (its
    terminal closed): the launcher stops them as for SIGTERM and exits 128 + SIGHUP."""
    scenario, out = scenario_file(tmp_path, steps=100000, expect="{}"), tmp_path / "out"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "up", str(scenario), "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: list[int] = []
    try:
        log = out / "logs" / "trainer-1.log"
        wait_for(lambda: log.exists() and " loss " in log.read_text(), 45, "trainer 1's first step")
        kids = children_of(launcher.pid)
        assert len(kids) == 4
        launcher.send_signal(sig)
        code = launcher.wait(timeout=30)
        assert code == (-sig if sig == signal.SIGKILL else 128 + sig)
        wait_for(lambda: not any(alive(pid) for pid in kids), 10,
                 "the nodes to die with their launcher")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for pid in kids:  # a failed assertion must not leave them running
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)


def test_a_node_whose_launcher_is_gone_before_it_started_does_not_start() -> None:
    assert launcher_pid({LAUNCHER_VAR: str(os.getppid())}) == os.getppid()
    assert launcher_pid({}) is None
    script = ("import os, sys; from runtime.services.lifeline import die_with_launcher; "
              "print(die_with_launcher(int(sys.argv[1])), die_with_launcher(os.getppid()))")
    done = subprocess.run([sys.executable, "-c", script, "1"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.stdout.split() == ["False", "True"], done.stderr


def read_until(proc: subprocess.Popen[str], text: str, seconds: float) -> str:
    """`proc`'s output up to the first line containing `text` (within `seconds`)."""
    assert proc.stdout is not None
    seen = ""
    deadline = os.times().elapsed + seconds
    while text not in seen:
        left = deadline - os.times().elapsed
        ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
        if not ready:
            raise AssertionError(f"no {text!r} within {seconds}s; got {seen!r}")
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"output ended before {text!r}: {seen!r}")
        seen += line
    return seen


@pytest.mark.timeout(90)
def test_a_pserver_on_its_own_stops_when_its_trainers_are_gone(tmp_path: Path) -> None:
    """`runtime up --role pserver` with one trainer that is SIGKILLed after its first step:
    the pserver exits with status 3 and says why, after the heartbeat timeout (2 s), not at
    its deadline (60 s)."""
    scenario = scenario_file(tmp_path, steps=100000, expect="{}")
    (endpoint,) = free_endpoints(1)
    common = [str(scenario), "--endpoints", endpoint, "--set", "cluster.trainers=1",
              "--set", "train.heartbeat_timeout=2s", "--insecure"]
    env = {k: v for k, v in os.environ.items() if k != LAUNCHER_VAR}
    pserver = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "up", "--role", "pserver", "--index", "0", *common],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "runtime.services.node", "--role", "trainer", "--index", "0",
         *common], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        read_until(trainer, "step 1/100000", 45)
        trainer.kill()
        trainer.wait(timeout=10)
        output, _ = pserver.communicate(timeout=30)
    finally:
        for proc in (trainer, pserver):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    assert pserver.returncode == EXIT_TRAINERS_GONE, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("pserver:0 failed: pserver:0 gave up: its trainers are gone: every "
                           "trainer silent for more than 2s (the last heard from, trainer 0, "), \
        last


def test_the_core_says_when_its_trainers_are_gone() -> None:
    """None while any trainer was heard from within the heartbeat timeout (10 s) or, before
    any was, within the start-up grace (60 s); then why."""
    shell = Shell("sync")
    shell.now = 59.0
    assert shell.core.trainers_gone() is None
    shell.now = 61.0
    assert shell.core.trainers_gone() == "no trainer heard from within 60s of the start"
    shell.send(shell.message(Kind.HEARTBEAT, 0, 0))
    shell.now = 65.0
    shell.send(shell.message(Kind.HEARTBEAT, 1, 0))
    shell.now = 75.0
    assert shell.core.trainers_gone() is None
    shell.now = 75.5
    assert shell.core.trainers_gone() == ("every trainer silent for more than 10s (the last "
                                          "heard from, trainer 1, 10.5s ago), none completed, "
                                          "at step 0")
    for trainer in (0, 1):
        shell.send(shell.message(Kind.COMPLETE, trainer, 0))
    shell.now = 100.0
    assert shell.core.round.finished and shell.core.trainers_gone() is None
