"""Porting a Paddle script: the transpiler rewrites the default (or given) programs in place as
the original did, and `examples/paddle_ps_script.py`, a classic parameter-server script with
only its imports changed, runs as 2 pservers x 2 trainers over loopback and trains exactly as
one process does."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import transpiler as T
from transpiler.ir import Program

from runtime.execution.executor import Executor as KernelExecutor
from runtime.execution.scope import Scope
from runtime.launch.launcher import free_endpoints
from runtime.network.ports import PortsNotReady
from runtime.paddle import batch, dataset, fluid
from runtime.services import paddle_compat
from runtime.services.paddle_compat import (INSECURE_VAR, SecurityRefused, is_step,
                                            key_directory, rpc_deadline, rpc_ops)
from runtime.services.pserver import ServeConfig
from runtime.services.trainer import Trainer

from script_runs import run_together

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "paddle_ps_script.py"
PSERVERS = "127.0.0.1:6174,127.0.0.1:6175"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paddle_ps_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(script: ModuleType) -> tuple[Program, Program, Any]:
    """The script's network in programs of its own, named as in a fresh process."""
    main, startup = Program(), Program()
    with T.program_guard(main, startup), T.unique_name.guard():
        _, _, avg_cost = script.network()
    return main, startup, avg_cost


# -- transpiling in place ----------------------------------------------------------------------

def test_transpile_rewrites_the_default_programs_in_place() -> None:
    main, startup, _ = build(load_script())
    with T.program_guard(main, startup):
        t = T.DistributeTranspiler()
        t.transpile(0, pservers=PSERVERS, trainers=2)
        assert T.default_main_program() is main and T.default_startup_program() is startup
    assert t.get_trainer_program() is main and t.get_trainer_startup_program() is startup
    assert "send_barrier" in [op.type for op in main.global_block().ops]
    assert "sgd" not in [op.type for op in main.global_block().ops]
    assert [op.type for op in rpc_ops(startup)] == ["recv"] * 4 + ["fetch_barrier"]
    assert is_step(rpc_ops(main)) and not is_step(rpc_ops(startup))
    assert all(block.program is main for block in main.blocks)


def test_a_passed_program_is_rewritten_too_unless_in_place_is_false() -> None:
    script = load_script()
    kept_main, kept_startup, _ = build(script)
    before = (kept_main.to_dict(), kept_startup.to_dict())
    kept = T.DistributeTranspiler()
    kept.transpile(1, program=kept_main, startup_program=kept_startup, pservers=PSERVERS,
                   trainers=2, in_place=False)
    assert (kept_main.to_dict(), kept_startup.to_dict()) == before
    assert kept.get_trainer_program() is not kept.get_trainer_program()  # fresh copies

    main, startup, _ = build(script)
    t = T.DistributeTranspiler()
    t.transpile(1, program=main, startup_program=startup, pservers=PSERVERS, trainers=2)
    assert t.get_trainer_program() is main and main == kept.get_trainer_program()
    assert startup == kept.get_trainer_startup_program()
    for ep in PSERVERS.split(","):
        assert t.get_pserver_programs(ep) == kept.get_pserver_programs(ep)


# -- the executor's choices --------------------------------------------------------------------

def test_without_keys_only_loopback_or_an_explicit_flag_runs_insecure(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert key_directory("trainer:0", ["127.0.0.1:1", "localhost:2"], {}) is None
    assert "no PSLAB_KEYS: no CurveZMQ" in capsys.readouterr().err
    with pytest.raises(SecurityRefused, match=f"PSLAB_KEYS=DIR.*{INSECURE_VAR}=1"):
        key_directory("trainer:0", ["127.0.0.1:1", "10.0.0.2:1"], {})
    assert key_directory("trainer:0", ["10.0.0.2:1"], {INSECURE_VAR: "1"}) is None
    assert key_directory("t", ["10.0.0.2:1"], {"PSLAB_KEYS": str(tmp_path)}) == tmp_path


def test_a_pserver_program_needs_its_startup_run_first() -> None:
    main, startup, _ = build(load_script())
    t = T.DistributeTranspiler()
    t.transpile(0, program=main, startup_program=startup, pservers=PSERVERS, trainers=2)
    exe = fluid.Executor(fluid.CPUPlace())
    with pytest.raises(RuntimeError, match="127.0.0.1:6174: run its startup program first"):
        exe.run(t.get_pserver_program("127.0.0.1:6174"), scope=Scope())
    exe.close()


def test_a_scripts_pserver_waits_for_a_silent_trainer_as_long_as_paddles_rpc_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trainer sends no heartbeat while a kernel runs: a script's pserver drops one only
    after Paddle's ``FLAGS_rpc_deadline`` (milliseconds, 180 s by default; Paddle's test
    harness sets 30 s), not `runtime up`'s 10 s."""
    assert rpc_deadline({}) == 180.0
    assert rpc_deadline({"FLAGS_rpc_deadline": " 30000 "}) == 30.0
    for bad in ("0", "-5", "soon"):
        with pytest.raises(ValueError, match=f"FLAGS_rpc_deadline='{bad}': expected a positive "
                                             "number of milliseconds"):
            rpc_deadline({"FLAGS_rpc_deadline": bad})
    main, startup, _ = build(load_script())
    t = T.DistributeTranspiler()
    t.transpile(0, program=main, startup_program=startup, pservers=PSERVERS, trainers=2)
    pserver = t.get_pserver_program("127.0.0.1:6174")
    configs: list[ServeConfig] = []

    async def serve(*args: Any) -> None:
        configs.append(next(a for a in args if isinstance(a, ServeConfig)))

    monkeypatch.setattr(paddle_compat, "_serve", serve)
    monkeypatch.setenv("FLAGS_rpc_deadline", "1234")
    exe, scope = fluid.Executor(fluid.CPUPlace()), Scope()
    exe.run(t.get_startup_program("127.0.0.1:6174", pserver), scope=scope)
    assert exe.run(pserver, scope=scope) == []
    exe.close()
    assert [c.heartbeat_timeout for c in configs] == [1.234]
    assert configs[0].give_up_without_trainers


class Started(Exception):
    """The trainer reached `Trainer.start`: it did not wait for its pservers' ports."""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("wait_port", [True, False])
def test_the_executor_waits_for_the_pservers_as_get_trainer_program_asked(
        wait_port: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing listening at the pservers' ports, a trainer whose script asked
    ``get_trainer_program()`` (wait_port True, the default) gives up on its first RPC program,
    the startup, after the executor's ``startup_timeout``, naming the endpoints; with
    ``wait_port=False`` it does not wait and goes straight on to start (stopped here)."""
    endpoints = free_endpoints("127.0.0.1", 2)
    main, startup, _ = build(load_script())
    t = T.DistributeTranspiler()
    t.transpile(0, program=main, startup_program=startup, pservers=",".join(endpoints),
                trainers=2)
    assert t.get_trainer_program(wait_port=wait_port).attrs["_wait_port"] is wait_port
    assert startup.attrs["_wait_port"] is wait_port  # the program the script runs first

    async def start(self: Trainer) -> int:
        raise Started

    async def finish(self: Trainer) -> None:  # no pserver to tell
        pass

    monkeypatch.setattr(Trainer, "start", start)
    monkeypatch.setattr(Trainer, "finish", finish)
    exe = fluid.Executor(fluid.CPUPlace(), startup_timeout=0.3)
    try:
        if wait_port:
            with pytest.raises(PortsNotReady, match=f"trainer:0: no pserver listening at "
                                                    f"{', '.join(endpoints)} after 0.3s"):
                exe.run(startup, scope=Scope())
        else:
            with pytest.raises(Started):
                exe.run(startup, scope=Scope())
    finally:
        exe.close()


@pytest.mark.timeout(30)
def test_a_trainer_runs_its_startup_as_written_for_the_main_program_that_comes_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A script runs the trainer's startup before its main program: every initializer stays,
    the zeroed counts of ``auc`` among them, which only the main program reads (fluid's
    ``dist_ctr.py``); a trainer that pruned them by the startup alone failed its first step."""
    main, startup = Program(), Program()
    with T.program_guard(main, startup), T.unique_name.guard():
        x = fluid.layers.data("x", shape=[4])
        y = fluid.layers.data("y", shape=[1], dtype="int64")
        predict = fluid.layers.fc(x, size=2, act="softmax")
        _, _, counts = fluid.layers.auc(predict, y)
        fluid.optimizer.SGD(0.1).minimize(fluid.layers.mean(
            fluid.layers.cross_entropy(predict, y)))
    t = T.DistributeTranspiler()
    t.transpile(0, program=main, startup_program=startup,
                pservers=",".join(free_endpoints("127.0.0.1", 2)), trainers=2)
    t.get_trainer_program(wait_port=False)
    ran: list[Program] = []

    async def start(self: Trainer) -> int:
        ran.append(self.startup)
        raise Started

    async def finish(self: Trainer) -> None:  # no pserver to tell
        pass

    monkeypatch.setattr(Trainer, "start", start)
    monkeypatch.setattr(Trainer, "finish", finish)
    exe = fluid.Executor(fluid.CPUPlace())
    try:
        with pytest.raises(Started):
            exe.run(startup, scope=Scope())
    finally:
        exe.close()
    assert ran == [startup]
    initialized = {name for op in startup.global_block().ops if op.type == "fill_constant"
                   for name in op.output_arg_names}
    assert {c.name for c in counts} <= initialized


# -- the script, as processes ------------------------------------------------------------------

def local_reference(script: ModuleType, trainers: int) -> tuple[list[float], dict[str, Any]]:
    """One process training the script's network on the job's global batches."""
    main, startup, avg_cost = build(script)
    exe, scope = KernelExecutor(), Scope()
    exe.run(startup, scope=scope)
    feeder = fluid.DataFeeder(feed_list=["x", "label"], program=main)
    reader = batch(dataset.digits.train(), batch_size=script.BATCH_SIZE * trainers)
    losses = []
    for _, data in zip(range(script.STEPS), reader()):
        (loss,) = exe.run(main, feed=feeder.feed(data), fetch_list=[avg_cost], scope=scope)
        losses.append(float(loss.reshape(-1)[0]))
    return losses, {p.name: np.array(scope.get(p.name)) for p in main.all_parameters()}


def start(role: dict[str, str], common: dict[str, str], args: list[str],
          log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **common, **role}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, str(SCRIPT), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=ROOT)


def losses_of(log: Path) -> list[float]:
    return [float(line.split()[3]) for line in log.read_text().splitlines()
            if line.startswith("step ")]


@pytest.mark.timeout(150)
def test_the_script_trains_two_pservers_by_two_trainers_as_one_process_does(
        tmp_path: Path) -> None:
    pytest.importorskip("sklearn")  # the digits data set
    script, trainers = load_script(), 2
    endpoints = free_endpoints("127.0.0.1", 2)
    common = {"PADDLE_PSERVER_ENDPOINTS": ",".join(endpoints),
              "PADDLE_TRAINERS_NUM": str(trainers), "PSLAB_KEYS": "", INSECURE_VAR: ""}
    roles = [({"PADDLE_TRAINING_ROLE": "PSERVER", "PADDLE_CURRENT_ENDPOINT": ep}, [],
              f"pserver-{j}") for j, ep in enumerate(endpoints)]
    roles += [({"PADDLE_TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(i)},
               [str(tmp_path / "params")] if i == 0 else [], f"trainer-{i}")
              for i in range(trainers)]
    logs = run_together({name: partial(start, role, common, args)
                         for role, args, name in roles}, tmp_path, timeout=120)
    assert "no PSLAB_KEYS: no CurveZMQ" in logs["pserver-0"]

    want_losses, want_params = local_reference(script, trainers)
    per_trainer = [losses_of(tmp_path / f"trainer-{i}.log") for i in range(trainers)]
    assert [len(losses) for losses in per_trainer] == [script.STEPS] * trainers
    job_losses = np.mean(per_trainer, axis=0)  # equal shards: the mean is the global batch's
    np.testing.assert_allclose(job_losses, want_losses, rtol=0, atol=1e-5)
    saved = {path.stem: np.load(path) for path in (tmp_path / "params").glob("*.npy")}
    assert sorted(saved) == sorted(want_params)
    for name, value in want_params.items():
        np.testing.assert_allclose(saved[name], value, rtol=0, atol=1e-5, err_msg=name)
    assert want_losses[-1] < want_losses[0]
