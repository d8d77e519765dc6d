"""`runtime up`: a scenario's pservers and trainers as processes on this host, over loopback
ZeroMQ; one role in the foreground from flags or Paddle's environment variables; metrics.json,
expectations, failures that name the node, and no process left behind (also on Ctrl-C)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from runtime import cli
from runtime.config.metrics import TrainerMetrics, read_metrics, read_record
from runtime.config.scenario import parse_scenario
from runtime.launch.launcher import (THREAD_VARS, ignored_by_runtime, kernel_threads,
                                     node_environment)
from runtime.services.cluster import train_locally
from runtime.services.job import Job
from runtime.services.node import (NodeOptions, Role, RoleError, node_options, resolve_role,
                                   scenario_for)
from runtime.services.progress import PROGRESS_FD_VAR, Channel, Progress, Reporter, read_progress

from cluster_helpers import assert_params_equal, csv_with_a_bad_value, free_endpoints
from metrics_schema import assert_valid_metrics
from runtime_runs import children_of, load_params, scenario_file, up, wait_for


def local_params(scenario: Path, overrides: Sequence[str] = ()) -> dict[str, np.ndarray]:
    job = Job.from_scenario(parse_scenario(scenario.read_text(), overrides=list(overrides)))
    return train_locally(job)[1]


# -- the whole job as processes ------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_quickstart_like_scenario_runs_and_writes_metrics(tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path), tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out))
    assert code == 0, "\n".join(lines)
    assert lines[-1] == "OK: up-test"
    progress = [line.split() for line in lines if line.startswith("trainer:0 ")]
    assert [words[2] for words in progress if words[1] == "step"] == \
        ["5/20", "10/20", "15/20", "20/20"]

    raw = assert_valid_metrics(out / "metrics.json")
    assert raw["links"] is raw["nics"] is None  # sim run's only
    metrics = read_metrics(out / "metrics.json")
    job = metrics.job
    assert (job.command, job.scenario, job.mode, job.pservers, job.trainers, job.steps) == \
        ("runtime up", "up-test", "sync", 2, 2, 20)
    assert job.simulated_seconds is None and job.step_time_all is not None
    assert job.success and job.reason is None and job.failed_node is None
    assert job.samples == 20 * 16 * 2 and (job.samples_per_second or 0) > 0
    assert 0 < (job.train_seconds or 0) < job.wall_seconds
    assert len(job.endpoints) == 2 and all(ep.startswith("127.0.0.1:") for ep in job.endpoints)
    for t in metrics.trainers:
        assert len(t.losses) == len(t.step_times) == 20 and t.exit_code == 0
        assert t.final_loss == t.losses[-1] < t.losses[0] / 4
        assert t.step_time is not None and t.step_time.max == max(t.step_times[1:])
        assert t.startup_wait_seconds == t.step_times[0]  # start-up, not a step
        log = (out / t.log).read_text() if t.log is not None else ""
        assert "step 1/20 loss" in log and "step 20/20 loss" in log  # and one a second between
    for p in metrics.pservers:
        assert (p.steps, p.errors, p.dropped, p.exit_code) == (20, 0, [], 0)
        # at least a SEND per trainer-step (one carrying its GET in protocol bundled), startup
        # GETs, COMPLETEs
        assert p.messages >= 20 * 2 + 2 + 2 and p.bytes_in > 0 and p.bytes_out > 0
        assert p.optimize_seconds > 0 and p.log is not None and (out / p.log).exists()
    assert {(e.name, e.passed) for e in metrics.expectations} == \
        {("params_equal_to", True), ("no_lost_updates", True)}
    assert_params_equal(load_params(out / "params.npz"), local_params(scenario), atol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("optimizer,lr", [
    ("{type: momentum, learning_rate: 0.05}", ""),
    ("{type: adam, learning_rate: 0.01}",
     ", lr: {type: exponential_decay, decay_steps: 5, decay_rate: 0.5, staircase: true}"),
], ids=["momentum", "adam-exp-decay"])
def test_sync_processes_equal_local_training(tmp_path: Path, optimizer: str, lr: str) -> None:
    """2 trainers x 2 pservers, each its own process, over real ZeroMQ: after 20 steps trainer
    0's parameters equal single-process training on the same global batches."""
    scenario, out = scenario_file(tmp_path, optimizer, lr, expect="{}"), tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out))
    assert code == 0, "\n".join(lines)
    assert_params_equal(load_params(out / "params.npz"), local_params(scenario), atol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["collective", "nccl2"])
def test_collective_processes_start_only_trainers_and_equal_local_training(
        tmp_path: Path, mode: str) -> None:
    """3 trainers as processes, no pserver: they meet in a ring over CurveZMQ (keys made in
    OUT/keys) and all-reduce their gradients; trainer 0 ends with local training's parameters."""
    scenario = scenario_file(tmp_path, cluster="{pservers: 0, trainers: 3}")
    scenario.write_text(scenario.read_text().replace("mode: sync", f"mode: {mode}")
                        .replace(", no_lost_updates: true", ""))
    out = tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out))
    assert code == 0, "\n".join(lines)
    assert "no pservers, trainers at" in lines[0]
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "trainer-0.log", "trainer-1.log", "trainer-2.log"]
    assert_params_equal(load_params(out / "params.npz"), local_params(scenario), atol=1e-5)


GEO_SPARSE = """\
name: geo-sparse
seed: 3
model: {name: ctr_dnn, vocab: 2000, embed_dim: 8, hidden: [16],
        optimizer: {type: sgd, learning_rate: 0.5}}
data: {name: ctr, batch_size: 32}
cluster: {pservers: 2, trainers: 1}
transpiler: {mode: geo, geo_push_every: 4}
train: {steps: 40, deadline: 60s, heartbeat_timeout: 10s, retry_after: 100ms}
"""


@pytest.mark.timeout(90)
def test_geo_sgd_on_a_sparse_table_as_processes_equals_local_training(tmp_path: Path) -> None:
    """Geo-SGD with a sparse embedding table (pushing the deltas of the rows that moved every 4
    steps), one trainer and two pservers as processes: the loss falls, no pserver counts an
    error, and the trainer ends with local training's parameters."""
    scenario, out = tmp_path / "geo.yaml", tmp_path / "out"
    scenario.write_text(GEO_SPARSE)
    code, lines = up(str(scenario), "--out", str(out))
    assert code == 0, "\n".join(lines)
    metrics = read_metrics(out / "metrics.json")
    assert metrics.job.mode == "geo" and metrics.job.success
    (trainer,) = metrics.trainers
    assert len(trainer.losses) == 40
    assert np.mean(trainer.losses[-10:]) < 0.9 * np.mean(trainer.losses[:10])
    assert [(p.errors, p.exit_code) for p in metrics.pservers] == [(0, 0), (0, 0)]
    assert_params_equal(load_params(out / "params.npz"), local_params(scenario), atol=1e-5)


CNN = """\
name: cnn-up
seed: 5
model: {{name: cnn, image: 8, channels: [4, 8], batch_norm: {batch_norm}}}
data: {{batch_size: 8}}
cluster: {{pservers: 2, trainers: {trainers}}}
transpiler: {{mode: sync}}
train: {{steps: 10, deadline: 60s, heartbeat_timeout: 10s, retry_after: 100ms}}
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch_norm,trainers", [("false", 2), ("true", 1)],
                         ids=["2x2", "batch_norm-1x2"])
def test_cnn_sync_processes_equal_local_training(tmp_path: Path, batch_norm: str,
                                                 trainers: int) -> None:
    """The `cnn` model (conv2d, pool2d, fc, softmax_with_cross_entropy) trained sync by pservers
    and trainers as processes ends with local training's parameters. Without batch_norm every op
    is per example, so two trainers' mean gradient is local training's; batch_norm normalizes by
    the trainer's own batch, so it equals local training with one trainer (the whole batch)."""
    scenario, out = tmp_path / "cnn.yaml", tmp_path / "out"
    scenario.write_text(CNN.format(batch_norm=batch_norm, trainers=trainers))
    code, lines = up(str(scenario), "--out", str(out))
    assert code == 0, "\n".join(lines)
    metrics = read_metrics(out / "metrics.json")
    assert [len(t.losses) for t in metrics.trainers] == [10] * trainers
    assert_params_equal(load_params(out / "params.npz"), local_params(scenario))


@pytest.mark.timeout(60)
def test_an_expectation_that_cannot_hold_fails_the_run_naming_it(tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path, steps=5), tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out), "--set", "expect.final_loss_below=1e-9")
    assert code == 1
    assert lines[-1].startswith("FAILED: expectation not met: final_loss_below (trainer 0's mean "
                                "loss over its last 5 steps")
    metrics = read_metrics(out / "metrics.json")
    assert not metrics.job.success and metrics.job.failed_node is None
    failed = {e.name: e for e in metrics.expectations if not e.passed}
    assert list(failed) == ["final_loss_below"]
    assert failed["final_loss_below"].actual == pytest.approx(np.mean(metrics.trainers[0].losses))


@pytest.mark.timeout(60)
def test_a_failing_trainer_fails_the_run_naming_the_node(tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path), tmp_path / "out"
    data, error = csv_with_a_bad_value(tmp_path / "data.csv")
    code, lines = up(str(scenario), "--out", str(out), "--set", data)
    assert code == 1
    assert lines[-1].startswith("FAILED: trainer:")
    assert f"exited with status 1: {error}" in lines[-1]
    metrics = read_metrics(out / "metrics.json")
    assert metrics.job.failed_node in {"trainer:0", "trainer:1"}
    assert metrics.expectations == []
    failed = next(t for t in metrics.trainers if f"trainer:{t.index}" == metrics.job.failed_node)
    assert failed.exit_code == 1 and failed.log is not None
    assert "DataError" in (out / failed.log).read_text()
    assert all(p.exit_code != 0 for p in metrics.pservers)  # stopped by the launcher


@pytest.mark.timeout(60)
def test_the_deadline_stops_every_node(tmp_path: Path) -> None:
    # 8 s: time enough for every trainer to start and take a step on a loaded 2-core machine
    # (2 s was not: processes that start slowly had taken none); stopped well before the
    # scenario's default deadline of 600 s
    scenario, out = scenario_file(tmp_path, steps=100000, expect="{}"), tmp_path / "out"
    start = time.monotonic()
    code, lines = up(str(scenario), "--out", str(out), "--set", "train.deadline=8s")
    assert code == 1 and time.monotonic() - start < 40
    assert lines[-1] == ("FAILED: train.deadline (8s) passed; still running: pserver:0, "
                         "pserver:1, trainer:0, trainer:1")
    metrics = read_metrics(out / "metrics.json")
    assert all(t.losses and t.exit_code == -signal.SIGTERM for t in metrics.trainers)
    assert metrics.job.samples == sum(len(t.losses) for t in metrics.trainers) * 16


@pytest.mark.timeout(60)
def test_ctrl_c_stops_every_node_and_leaves_no_process(tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path, steps=100000, expect="{}"), tmp_path / "out"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "up", str(scenario), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kids: list[int] = []
    try:
        log = out / "logs" / "trainer-1.log"
        wait_for(lambda: log.exists() and " loss " in log.read_text(), 30, "trainer 1's first step")
        kids = children_of(launcher.pid)
        assert len(kids) == 4
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + signal.SIGINT, output
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert output.splitlines()[-1] == "FAILED: interrupted by SIGINT"
    assert [pid for pid in kids if Path(f"/proc/{pid}").exists()] == []
    metrics = read_metrics(out / "metrics.json")
    assert metrics.job.reason == "interrupted by SIGINT" and not metrics.job.success
    assert "[runtime up] stopping trainer:1: interrupted by SIGINT" in log.read_text()


# -- one role in the foreground ------------------------------------------------------------------

def paddle_env(role: str, endpoint: str, trainers: int, **extra: str) -> dict[str, str]:
    return {**os.environ, "TRAINING_ROLE": role, "PADDLE_PSERVERS_IP_PORT_LIST": endpoint,
            "PADDLE_TRAINERS_NUM": str(trainers), **extra}


@pytest.mark.timeout(60)
def test_paddle_environment_variables_run_one_node_per_process(tmp_path: Path) -> None:
    """A pserver (`runtime up`) and a trainer (`python -m runtime.services.node`) started the way
    Paddle's launchers start them; the variables' 1 x 1 cluster replaces the scenario's 2 x 2."""
    scenario, out = scenario_file(tmp_path, expect="{}"), tmp_path / "out"
    (endpoint,) = free_endpoints(1)
    host, port = endpoint.split(":")
    keys = tmp_path / "keys"  # the job's keys, found through PSLAB_KEYS
    assert cli.main(["keys", str(keys), "--pservers", "1", "--trainers", "1"]) == 0
    pserver_env = paddle_env("PSERVER", endpoint, 1, POD_IP=host, PADDLE_PORT=port,
                             PSLAB_KEYS=str(keys))
    trainer_env = paddle_env("TRAINER", endpoint, 1, PADDLE_TRAINER_ID="0", PSLAB_KEYS=str(keys))
    commands = [([sys.executable, "-m", "runtime.cli", "up"], pserver_env),
                ([sys.executable, "-m", "runtime.services.node"], trainer_env)]
    procs = [subprocess.Popen([*cmd, str(scenario), "--out", str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd, env in commands]
    try:
        outputs = [p.communicate(timeout=45)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    steps = [line.split()[1] for line in outputs[1].splitlines() if line.startswith("step ")]
    # for people (no launcher reads them): the first and last steps, and one a second between
    assert steps[0] == "1/20" and steps[-1] == "20/20"
    assert steps == sorted(set(steps), key=lambda step: int(step.split("/")[0]))
    assert "pserver:0: done after 20 steps" in outputs[0]
    record = read_record(out / "nodes" / "trainer-0.json", TrainerMetrics)
    assert len(record.losses) == 20
    one_by_one = ["cluster.pservers=1", "cluster.trainers=1"]
    assert_params_equal(load_params(out / "params.npz"), local_params(scenario, one_by_one), atol=1e-5)


SMALL = parse_scenario("name: s\nmodel: {name: mlp}\ncluster: {pservers: 2, trainers: 2}\n")
LISTED = parse_scenario("name: s\nmodel: {name: mlp}\ncluster: {pservers: 1, trainers: 2, "
                        "endpoints: {pservers: ['10.0.0.1:6174']}}\n")
EP = "127.0.0.1:7001,127.0.0.1:7002"


@pytest.mark.parametrize("flags,env,culprit", [
    ((None, 1, None), {}, "--index needs --role"),
    (("trainer", None, None), {}, "--role trainer needs --index N"),
    (("trainer", -1, None), {}, "--index -1: must be >= 0"),
    ((None, None, EP), {}, "--endpoints needs --role"),
    (("pserver", 0, "127.0.0.1"), {}, "--endpoints: '127.0.0.1' is not host:port"),
    (("pserver", 0, "a:1,a:1"), {}, "--endpoints: endpoints listed twice"),
    (("pserver", 0, None), {"TRAINING_ROLE": "TRAINER"},
     "--role pserver contradicts TRAINING_ROLE=TRAINER"),
    ((None, None, None), {"TRAINING_ROLE": "WORKER"}, "TRAINING_ROLE='WORKER': expected PSERVER"),
    ((None, None, None), {"TRAINING_ROLE": "TRAINER"},
     "PADDLE_PSERVERS_IP_PORT_LIST is not set; TRAINING_ROLE=TRAINER needs it"),
    ((None, None, None), {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": EP},
     "PADDLE_TRAINERS_NUM is not set"),
    ((None, None, None), {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
                          "PADDLE_TRAINERS_NUM": "two"}, "PADDLE_TRAINERS_NUM='two' is not an int"),
    ((None, None, None), {"TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
                          "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "2"},
     "PADDLE_TRAINER_ID=2 is not below PADDLE_TRAINERS_NUM=2"),
    ((None, None, None), {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
                          "PADDLE_TRAINERS_NUM": "2", "POD_IP": "127.0.0.1"},
     "PADDLE_PORT is not set; TRAINING_ROLE=PSERVER needs it"),
    ((None, None, None), {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
                          "PADDLE_TRAINERS_NUM": "2", "POD_IP": "127.0.0.1", "PADDLE_PORT": "7003"},
     "POD_IP:PADDLE_PORT 127.0.0.1:7003 is not in PADDLE_PSERVERS_IP_PORT_LIST " + EP),
    ((None, None, EP), {"TRAINING_ROLE": "TRAINER"}, "--endpoints needs --role"),
])
def test_bad_role_combinations_name_the_flag_or_variable(
        flags: tuple[str | None, int | None, str | None], env: dict[str, str],
        culprit: str) -> None:
    role, index, endpoints = flags
    with pytest.raises(RoleError) as err:
        resolve_role(role, index, endpoints, env)
    assert culprit in str(err.value)


def test_environment_roles_and_the_cluster_they_imply() -> None:
    env = {"TRAINING_ROLE": "PSERVER", "PADDLE_PSERVERS_IP_PORT_LIST": EP,
           "PADDLE_TRAINERS_NUM": "3", "POD_IP": "127.0.0.1", "PADDLE_PORT": "7002"}
    role = resolve_role(None, None, None, env)
    assert role == Role("pserver", 1, "POD_IP:PADDLE_PORT", tuple(EP.split(",")),
                        "PADDLE_PSERVERS_IP_PORT_LIST", 3)
    cluster = scenario_for(SMALL, role).cluster
    assert (cluster.pservers, cluster.trainers) == (2, 3)
    trainer = resolve_role(None, None, None, {**env, "TRAINING_ROLE": "trainer",
                                              "PADDLE_TRAINER_ID": "2"})
    assert trainer is not None
    assert (trainer.role, trainer.index, trainer.trainers) == ("trainer", 2, 3)
    assert resolve_role(None, None, None, {}) is None


@pytest.mark.parametrize("role,culprit", [
    (Role("trainer", 2, "--index"), "--index 2: the job has 2 trainer(s) (cluster.trainers)"),
    (Role("pserver", 1, "--index", ("127.0.0.1:7001",)),
     "--index 1: the job has 1 pserver(s) (--endpoints)"),
])
def test_an_index_outside_the_job_names_its_source(role: Role, culprit: str) -> None:
    with pytest.raises(RoleError, match=culprit.replace("(", r"\(").replace(")", r"\)")):
        scenario_for(SMALL, role)


def test_endpoints_that_contradict_the_scenario_name_both() -> None:
    role = Role("pserver", 0, "POD_IP:PADDLE_PORT", ("10.0.0.2:6174",),
                "PADDLE_PSERVERS_IP_PORT_LIST", 2)
    with pytest.raises(RoleError) as err:
        scenario_for(LISTED, role)
    assert str(err.value) == ("PADDLE_PSERVERS_IP_PORT_LIST 10.0.0.2:6174 differs from the "
                              "scenario's cluster.endpoints.pservers 10.0.0.1:6174")


def test_cli_reports_role_errors_as_usage_errors(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["up", str(scenario_file(tmp_path)), "--index", "0"])
    assert exit_.value.code == 2
    assert "runtime up: error: --index needs --role pserver|trainer" in capsys.readouterr().err


@pytest.mark.parametrize("flags,role,culprit", [
    (("127.0.0.1:7", False, None), None, "--bind needs --role"),
    ((None, True, None), Role("trainer", 0, "--index"), "--recover does not apply to trainer:0"),
    ((None, False, 2), Role("pserver", 1, "--index"), "--incarnation does not apply to pserver:1"),
    (("nowhere", False, None), Role("pserver", 0, "--index"), "--bind: 'nowhere' is not host"),
    ((None, False, -1), Role("trainer", 0, "--index"), "--incarnation -1: must be >= 0"),
])
def test_restart_flags_are_checked_against_the_role(
        flags: tuple[str | None, bool, int | None], role: Role | None, culprit: str) -> None:
    with pytest.raises(RoleError, match=culprit):
        node_options(role, *flags)


def test_restart_flags_describe_the_nodes_process() -> None:
    pserver, trainer = Role("pserver", 1, "--index"), Role("trainer", 0, "--index")
    assert node_options(pserver, "127.0.0.1:7001", True, None) == \
        NodeOptions("127.0.0.1:7001", recover=True)
    assert node_options(trainer, None, False, 3) == NodeOptions(incarnation=3)
    assert node_options(None, None, False, None) == NodeOptions()


# -- the progress channel ------------------------------------------------------------------------

async def test_progress_crosses_the_pipe_and_ends_when_the_trainer_closes_it() -> None:
    channel = Channel()
    reporter = Reporter(os.dup(channel.write_fd))  # the child's copy
    channel.started()
    sent = [Progress(1, 3, 2.5, 0.125, first_step=0), Progress(2, 3, float("nan"), 0.25, 0, 1)]
    reporter.report(sent[0])
    assert reporter._out is not None
    reporter._out.drain()  # reports are written by a thread of their own: this line after
    os.write(reporter.fd or -1, b"step 2/3 loss 1\n")
    reporter.report(sent[1])
    reporter.close()
    got = [p async for p in read_progress(channel.read_fd, 1 << 16)]
    assert got[0] == sent[0] and isinstance(got[1], ValueError) and "not JSON" in str(got[1])
    assert isinstance(got[2], Progress) and np.isnan(got[2].loss)
    assert (got[2].step, got[2].steps, got[2].step_time, got[2].redone) == (2, 3, 0.25, 1)
    assert len(got) == 3


@pytest.mark.timeout(30)
async def test_a_trainer_never_waits_for_a_launcher_that_is_not_reading() -> None:
    """20,000 reports (2 MiB, the pipe holds 64 KiB) to a launcher stopped with Ctrl-Z: none
    blocks the trainer; once the launcher reads, it gets them in order, up to the 1 MiB held."""
    channel = Channel()
    reporter = Reporter(os.dup(channel.write_fd))
    channel.started()
    for step in range(1, 20_001):  # a blocking write would hang the test until its timeout
        reporter.report(Progress(step, 20_000, 0.5, 0.001))
    closing = asyncio.get_running_loop().run_in_executor(None, reporter.close)
    got = [p async for p in read_progress(channel.read_fd, 1 << 16)]
    await closing
    steps = [p.step for p in got if isinstance(p, Progress)]
    assert len(steps) == len(got) > 5_000 and steps == sorted(set(steps)) and steps[0] == 1


def test_a_trainer_whose_launcher_is_gone_stops_reporting_and_says_so_once(
        caplog: pytest.LogCaptureFixture) -> None:
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the launcher is gone
    reporter = Reporter(write_fd)
    with caplog.at_level(logging.WARNING, logger="runtime.services.progress"):
        for step in range(1, 4):
            reporter.report(Progress(step, 3, 0.5, 0.001))
        reporter.close()
    assert [r.getMessage().split(": no more")[0] for r in caplog.records] == [
        f"the progress channel (fd {write_fd}) is closed"]


def test_a_progress_channel_that_is_not_an_open_fd_is_named() -> None:
    assert Reporter.from_environment({}) is None
    with pytest.raises(ValueError, match=f"{PROGRESS_FD_VAR}='x': not an open file descriptor"):
        Reporter.from_environment({PROGRESS_FD_VAR: "x"})


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_live_table_on_a_terminal_and_plain_lines_elsewhere(tmp_path: Path) -> None:
    from runtime.launch.launcher import LiveDisplay, NodeRun, PlainDisplay, make_display

    node = NodeRun("trainer", 1, (tmp_path / "t.log").open("w"),
                   seen=[Progress(4, 20, 0.5, 0.012)])
    plain = io.StringIO()
    display = make_display(plain, [node], every=2)
    assert isinstance(display, PlainDisplay)
    display.progress(node)
    assert plain.getvalue() == "trainer:1    step 4/20  loss 0.5000  step time 12.0ms\n"

    terminal = Terminal()
    live = make_display(terminal, [node], every=2)
    assert isinstance(live, LiveDisplay)
    live.message("pserver:0 exited with status 0")
    live.close()
    screen = terminal.getvalue()
    assert "pserver:0 exited with status 0" in screen
    assert all(cell in screen for cell in ("trainer:1", "4/20", "0.5000", "12.0ms"))
    node.log.close()


# -- the scenario's network ---------------------------------------------------------------------

def test_a_typo_in_network_is_a_usage_error_naming_file_line_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario_file(tmp_path)
    path.write_text(path.read_text() + "network:\n  default: {bandwith: 200Mbit/s}\n")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["up", str(path)])
    assert exit_.value.code == 2
    assert f"{path}:10: network.default.bandwith: Extra inputs are not permitted" in \
        capsys.readouterr().err


@pytest.mark.timeout(60)
def test_without_netns_the_network_is_noted_as_not_applied(tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path, steps=2, cluster="{pservers: 1, trainers: 1}",
                                  expect="{}"), tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out), "--set",
                     "network={default: {latency: 2ms, bandwidth: 200Mbit/s}}")
    assert code == 0, "\n".join(lines)
    notes = ["network.default.latency 2ms: not applied (needs --netns)",
             "network.default.bandwidth 200Mbit/s: not applied (needs --netns)"]
    assert [line for line in lines if line.startswith("note: ")] == \
        [f"note: {note}" for note in notes]
    metrics = read_metrics(out / "metrics.json")
    assert metrics.notes == notes and metrics.netns is None and metrics.proxies == []


def test_hosts_are_noted_as_the_simulators_and_each_node_gets_its_share_of_the_cores() -> None:
    scenario = parse_scenario("name: h\nmodel: {name: mlp, sizes: [4, 2]}\n"
                              "cluster: {pservers: 1, trainers: 3, hosts: [{nodes: '*', cores: 8}]}")
    cores = len(os.sched_getaffinity(0))
    assert f"cluster.hosts: simulator only: every node runs on this machine, sharing its " \
           f"{cores} cores" in ignored_by_runtime(scenario)
    assert kernel_threads(1) == cores and kernel_threads(10 * cores) == 1
    env = node_environment(1)
    assert all(env[name] == os.environ.get(name, "1") for name in THREAD_VARS)
