"""CurveZMQ: a job's keys, and pservers that answer only the job's trainers, each as itself."""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from runtime import cli
from runtime.config import atomic
from runtime.config.nodes import node_file_stem, pserver_name, trainer_name
from runtime.execution.costs import CurveCosts, Linear, RuntimeCosts, fit_costs
from runtime.network.curve import KeyFileError, load_keys, secret_path, write_keys
from runtime.network.wire import Kind, Message, charged_size, decode, encode
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import batches_for, make_pserver, make_trainer, run_job
from runtime.services.job import Job
from runtime.services.node import node_keys
from runtime.config.scenario import load_scenario
from sim.cost import runtime_costs
from sim.cpu import Cpus
from sim.loop import run as sim_run
from sim.network import Network
from sim.simulate import simulate

from cluster_helpers import FAST_DRAIN, make_job
from curve_helpers import (SCENARIO, STEPS, attack, hostile_messages, job_keys,
                           outsider_attacks, up_encrypted)


def secure_transports(directory: Path, job: Job) -> Any:
    """A `run_job` transport factory: each node's transport with its keys."""
    def transport_for(name: str) -> ZmqTransport:
        role, index = name.split(":")
        return ZmqTransport(name, curve=node_keys(directory, role, int(index), job.trainers,
                                                  job.endpoints))
    return transport_for


def small_job() -> Job:
    return make_job("{name: mlp}", trainers=2, pservers=2, steps=STEPS, retry_after=FAST_DRAIN)


# -- keys --------------------------------------------------------------------------------------

def test_runtime_keys_writes_a_keypair_per_node_with_safe_modes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "keys"
    assert cli.main(["keys", str(directory), "--pservers", "2", "--trainers", "3"]) == 0
    stems = ["pserver-0", "pserver-1", "trainer-0", "trainer-1", "trainer-2"]
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [f"{s}.key" for s in stems] + [f"{s}.key_secret" for s in stems])
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for s in stems:
        assert stat.S_IMODE((directory / f"{s}.key_secret").stat().st_mode) == 0o600
        assert stat.S_IMODE((directory / f"{s}.key").stat().st_mode) == 0o644
    keys = load_keys(directory, "trainer-2", servers={"pserver-0": "h:1", "pserver-1": "h:2"})
    public, secret = zmq.auth.load_certificate(directory / "trainer-2.key_secret")
    assert (keys.public, keys.secret) == (public, secret)
    assert list(keys.servers) == ["h:1", "h:2"]
    # a second run keeps the keys unless told to replace them
    assert cli.main(["keys", str(directory), "--pservers", "1", "--trainers", "1"]) == 1
    assert "pserver-0.key: already exists" in capsys.readouterr().err
    assert zmq.auth.load_certificate(directory / "trainer-2.key_secret")[1] == secret


def test_missing_or_unsafe_key_files_are_named(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    write_keys(directory, ["pserver-0", "trainer-0"])
    with pytest.raises(KeyFileError, match=f"{directory}/trainer-1.key: no such key file"):
        node_keys(directory, "pserver", 0, trainers=2, endpoints=["h:1"])
    with pytest.raises(KeyFileError, match=f"{directory}/trainer-5.key_secret: no such key"):
        node_keys(directory, "trainer", 5, trainers=6, endpoints=["h:1"])
    os.chmod(secret_path(directory, "trainer-0"), 0o644)
    with pytest.raises(KeyFileError, match="trainer-0.key_secret: secret key readable by others"):
        node_keys(directory, "trainer", 0, trainers=1, endpoints=["h:1"])


def test_a_node_loads_its_keys_from_a_directory_with_no_other_secret(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What `runtime keys DIR --export NODE OUT` gives a host is all its node loads: the public
    keys and its own secret; another node's keys cannot be loaded from it."""
    directory = tmp_path / "keys"
    assert cli.main(["keys", str(directory), "--pservers", "2", "--trainers", "2"]) == 0
    publics = ["pserver-0.key", "pserver-1.key", "trainer-0.key", "trainer-1.key"]
    for role, index in [("pserver", 1), ("trainer", 0)]:
        stem = node_file_stem(role, index)
        bundle = tmp_path / stem
        assert cli.main(["keys", str(directory), "--export", stem, str(bundle)]) == 0
        assert sorted(p.name for p in bundle.iterdir()) == sorted([*publics, f"{stem}.key_secret"])
        assert stat.S_IMODE(bundle.stat().st_mode) == 0o700
        assert stat.S_IMODE(secret_path(bundle, stem).stat().st_mode) == 0o600
        for relay in [False, True] if role == "pserver" else [False]:
            assert node_keys(bundle, role, index, 2, ["h:1", "h:2"], relay=relay) == \
                node_keys(directory, role, index, 2, ["h:1", "h:2"], relay=relay)
        other = "trainer" if role == "pserver" else "pserver"
        with pytest.raises(KeyFileError, match=f"{bundle}/{other}-0.key_secret: no such key"):
            node_keys(bundle, other, 0, 2, ["h:1", "h:2"])
    # an export names what it misses, and adds no node's keys to another's
    assert cli.main(["keys", str(directory), "--export", "trainer-7", str(tmp_path / "t7")]) == 1
    assert f"{directory}/trainer-7.key_secret: no such key file" in capsys.readouterr().err
    assert cli.main(["keys", str(directory), "--export", "trainer-1",
                     str(tmp_path / "trainer-0")]) == 1
    assert "holds another node's secret key (trainer-0.key_secret)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["keys", str(directory), "--export", "trainer-1", "x", "--trainers", "1"])


def test_key_files_are_replaced_whole_and_a_secret_is_never_readable_by_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--force writes each key file beside its old one and renames it over; a secret file is
    created mode 0600, whatever the umask, and holds no byte before it is."""
    directory = tmp_path / "keys"
    write_keys(directory, ["trainer-0"])
    old = (directory / "trainer-0.key_secret").stat().st_ino
    created: list[tuple[str, int]] = []
    real_open = os.open

    def watched(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = real_open(path, flags, mode, **kw)
        if flags & os.O_CREAT:
            created.append((Path(path).name, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(atomic.os, "open", watched)
    umask = os.umask(0)
    try:
        write_keys(directory, ["trainer-0"], force=True)
    finally:
        os.umask(umask)
    assert [(name.split(".")[1], mode) for name, mode in created] == \
        [("trainer-0", 0o644), ("trainer-0", 0o600)]
    (public_tmp, _), (secret_tmp, _) = created
    assert public_tmp.startswith(".") and public_tmp.endswith(".tmp")
    assert secret_tmp.startswith(".") and secret_tmp.endswith(".tmp.key_secret")  # *.key_secret
    secret = directory / "trainer-0.key_secret"
    assert secret.stat().st_ino != old and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(p.name for p in directory.iterdir()) == ["trainer-0.key", "trainer-0.key_secret"]
    load_keys(directory, "trainer-0")


def test_a_node_without_keys_refuses_to_start_unless_insecure(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nmodel: {name: mlp}\ncluster: {pservers: 1, trainers: 1}\n"
                        "train: {steps: 1, deadline: 5s}\n")
    env = {k: v for k, v in os.environ.items() if k != "PSLAB_KEYS"}
    base = [sys.executable, "-m", "runtime.services.node", str(scenario), "--role", "trainer",
            "--index", "0", "--endpoints", "127.0.0.1:9"]
    refused = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "trainer:0: no keys: give --keys DIR" in refused.stderr
    missing = subprocess.run([*base, "--keys", str(tmp_path)], env=env, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1
    assert f"KeyFileError: {tmp_path}/trainer-0.key_secret: no such key file" in missing.stderr
    insecure = subprocess.run([*base, "--insecure", "--set", "train.deadline=0.5s"], env=env,
                              capture_output=True, text=True, timeout=60)
    assert ("warning: trainer:0: --insecure: no CurveZMQ: whoever reaches 127.0.0.1:9 can read "
            "and change the parameters and end the job; see SECURITY.md") in insecure.stderr
    assert insecure.returncode == 1  # nobody serves there: its deadline passes


# -- jobs --------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_an_authenticated_job_trains_exactly_as_an_insecure_one(tmp_path: Path) -> None:
    job = small_job()
    plain = asyncio.run(run_job(job, ZmqTransport))
    secure = asyncio.run(run_job(job, secure_transports(job_keys(tmp_path, job), job)))
    assert plain.params.keys() == secure.params.keys()
    for name, value in plain.params.items():
        assert np.array_equal(value, secure.params[name]), name
    assert [s.refused for s in secure.pservers] == [0, 0]


@pytest.mark.timeout(120)
def test_outsiders_and_impostors_get_nothing_and_change_nothing(tmp_path: Path) -> None:
    """No key, a wrong key and a trainer's key under another trainer's routing id: nothing
    comes back; a trainer's key under its own routing id claiming the other trainer in the
    header: an error reply. The parameters stay bit-identical, and the job then trains as an
    insecure one does."""
    job = make_job("{name: mlp}", trainers=2, pservers=1, steps=STEPS, retry_after=FAST_DRAIN)
    reference = asyncio.run(run_job(job, ZmqTransport)).params
    directory = job_keys(tmp_path, job)
    transport_for = secure_transports(directory, job)
    (endpoint,) = job.endpoints
    server_key = load_keys(directory, "trainer-0", servers={"pserver-0": endpoint}).servers[
        endpoint]
    trainer1 = zmq.auth.load_certificate(directory / "trainer-1.key_secret")

    async def scenario() -> dict[str, Any]:
        transport = transport_for(pserver_name(0))
        server = make_pserver(job, 0, transport)
        serving = asyncio.create_task(server.serve(endpoint))
        before = {n: np.array(server.scope.get(n), copy=True) for n in server.state}
        as_trainer0 = hostile_messages(server, trainer_name(0), 0)
        got = {
            **await outsider_attacks(endpoint, as_trainer0, trainer1, server_key),
            "header": await asyncio.to_thread(
                attack, endpoint, b"trainer:1", as_trainer0
                + hostile_messages(server, trainer_name(1), 0), trainer1, server_key)}
        after = {n: np.array(server.scope.get(n), copy=True) for n in server.state}
        trainers = [make_trainer(job, i, transport_for(trainer_name(i)))
                    for i in range(job.trainers)]
        loss = job.model.loss.name
        await asyncio.gather(*(t.run(batches_for(job, i), STEPS, loss)
                               for i, t in enumerate(trainers)))
        stats = await serving
        for t in trainers:
            await t.client.close()
        counts = {"impostors": transport.impostors, "unauthenticated": transport.unauthenticated}
        await transport.close()
        return {"got": got, "before": before, "after": after, "stats": stats, "counts": counts,
                "params": {p: np.asarray(trainers[0].scope.get(p)) for p in job.model.params}}

    result = asyncio.run(scenario())
    got = result["got"]
    assert got["no key"] == [] and got["wrong key"] == [] and got["routing id"] == []
    refusals = [decode(reply) for reply in got["header"]]
    assert [m.kind for m in refusals] == [Kind.ERROR] * 6
    assert result["counts"] == {"impostors": 3, "unauthenticated": 1}
    assert result["stats"].refused == 6
    for name, value in result["before"].items():
        assert np.array_equal(value, result["after"][name]), name
    for name, value in reference.items():
        assert np.array_equal(value, result["params"][name]), name


@pytest.mark.timeout(60)
def test_a_key_holder_claiming_a_trainers_routing_id_does_not_get_its_replies(
        tmp_path: Path) -> None:
    """trainer:1's key connects under routing id ``trainer:0`` while trainer:0 is connected:
    its message is dropped, and what the pserver sends trainer:0 still reaches trainer:0,
    nothing the impostor."""
    job = make_job("{name: mlp}", trainers=2, pservers=1, steps=STEPS, retry_after=FAST_DRAIN)
    directory = job_keys(tmp_path, job)
    (endpoint,) = job.endpoints
    trainer1 = zmq.auth.load_certificate(directory / "trainer-1.key_secret")

    async def scenario() -> dict[str, Any]:
        server = secure_transports(directory, job)(pserver_name(0))
        await server.bind(endpoint)
        trainer0 = secure_transports(directory, job)(trainer_name(0))
        await trainer0.connect(endpoint)
        await trainer0.send(endpoint, [b"hello"])
        assert await server.recv() == (trainer_name(0), [b"hello"])
        context = zmq.Context()
        impostor = context.socket(zmq.DEALER)
        impostor.setsockopt(zmq.LINGER, 0)
        impostor.setsockopt(zmq.ROUTING_ID, b"trainer:0")
        impostor.setsockopt(zmq.CURVE_SERVERKEY, trainer0.curve.servers[endpoint])
        impostor.setsockopt(zmq.CURVE_PUBLICKEY, trainer1[0])
        impostor.setsockopt(zmq.CURVE_SECRETKEY, trainer1[1])
        impostor.connect(f"tcp://{endpoint}")
        impostor.send(b"it is me")
        while server.impostors == 0:  # its handshake done and its message read and dropped
            await asyncio.sleep(0.01)
        await server.send(trainer_name(0), [b"reply"])
        got = await asyncio.wait_for(trainer0.recv(), 5)
        stolen = await asyncio.to_thread(impostor.poll, 300)
        impostor.close()
        context.term()
        counts = (server.impostors, server.unauthenticated)
        await trainer0.close()
        await server.close()
        return {"got": got, "stolen": stolen, "counts": counts}

    result = asyncio.run(scenario())
    assert result["got"] == (endpoint, [b"reply"])
    assert result["stolen"] == 0
    assert result["counts"] == (1, 0)


# -- runtime up --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_runtime_up_makes_the_jobs_keys_talks_local_sockets_or_warns_when_insecure(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    scenario, out, printed = up_encrypted(tmp_path, SCENARIO, capfd)
    assert "--insecure" not in printed.err
    assert sorted(p.name for p in (out / "keys").iterdir()) == [
        "pserver-0.key", "pserver-0.key_secret", "trainer-0.key", "trainer-0.key_secret",
        "trainer-1.key", "trainer-1.key_secret"]
    assert cli.main(["up", str(scenario), "--out", str(out), "--insecure"]) == 0
    printed = capfd.readouterr()
    assert "warning: runtime up curve-up: --insecure: no CurveZMQ: whoever reaches" in printed.err
    assert "CurveZMQ: every connection" not in printed.out
    local = tmp_path / "local"
    assert cli.main(["up", str(scenario), "--out", str(local)]) == 0  # one host: local sockets
    printed = capfd.readouterr()
    said = re.search(r"local sockets: every node talks over ipc sockets in (\S+) \(mode 0700",
                     printed.out)
    assert said is not None and "CurveZMQ: every connection" not in printed.out, printed.out
    assert "warning" not in printed.err and not (local / "keys").exists()
    assert not Path(said.group(1)).exists()  # removed with the job
    foreign = tmp_path / "foreign"
    write_keys(foreign, ["pserver-0", "trainer-0"])
    assert cli.main(["up", str(scenario), "--out", str(out), "--keys", str(foreign)]) == 1
    assert f"FAILED: --keys: {foreign}/trainer-1.key: no such key file" in capfd.readouterr().out


# -- the simulator -----------------------------------------------------------------------------

U = 2.0**-10  # powers of two: every sum below is exact
SCENARIO_FILE = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


def test_the_simulator_charges_a_handshake_per_connection_and_encryption_per_byte(
        tmp_path: Path) -> None:
    """Each side's I/O thread: U + S/2^22 for ZeroMQ, S/2^24 for CURVE, and 16U of handshake
    on the first message between two nodes only."""
    curve = CurveCosts(handshake=16 * U, per_byte=2.0**-24)
    costs = RuntimeCosts(io=Linear(U, 2.0**-22), curve=curve)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"ops": {"relu": 1e-6}, "runtime": costs.document()}))
    assert runtime_costs({"model": "profile", "path": "profile.json"}, tmp_path) == costs
    network = Network.from_spec(None, seed=0)
    network.cpus, network.costs = Cpus([], ["trainer:0", "pserver:0"], io=True), costs
    frames = encode(Message(Kind.SEND, 1, "trainer:0", 0, {"g": np.ones(4096, np.float32)}))
    size = charged_size(frames)
    one_side = U + size * 2.0**-22 + size * 2.0**-24

    async def main() -> list[float]:
        server, client = network.transport("pserver:0"), network.transport("trainer:0")
        await server.bind("ps")
        await client.connect("ps")
        arrivals = []
        for _ in range(2):
            assert client.send_nowait("ps", frames)
            await server.recv()
            arrivals.append(asyncio.get_running_loop().time())
        return arrivals

    first, second = sim_run(main())
    assert first == pytest.approx(2 * one_side + 2 * 16 * U, rel=1e-15)
    assert second - first == pytest.approx(2 * one_side, rel=1e-15)


def test_the_simulator_charges_encryption_only_to_a_job_that_talks_curvezmq(
        tmp_path: Path) -> None:
    """One profile with CURVE's figures: a job of nodes on one host talks local sockets unless
    its scenario says ``security: curve``; one whose nodes have hosts of their own talks
    CurveZMQ (``auto``); ``none`` is plain TCP."""
    costs = RuntimeCosts(io=Linear(U, 2.0**-22), curve=CurveCosts(handshake=0.0,
                                                                  per_byte=2.0**-26))
    (tmp_path / "profile.json").write_text(json.dumps({"ops": {}, "runtime": costs.document()}))
    base = ["train.steps=5", "compute={model: profile, path: profile.json}",
            "backend.kernels=phantom", "expect={}"]
    one_host = "cluster.hosts=[{nodes: '*', cores: 2}]"

    def step(*extra: str) -> float:
        scenario = load_scenario(SCENARIO_FILE, [*base, *extra])
        result = simulate(scenario, base_dir=tmp_path, trace_messages=False)
        return statistics.median(t for r in result.trainers for t in r.step_times)

    local, curve = step(one_host), step(one_host, "cluster.security=curve")
    assert local == step(one_host, "cluster.security=none") == step(one_host,
                                                                      "cluster.security=local")
    assert curve > local
    assert step() == step("cluster.security=curve") > step("cluster.security=none")


def test_a_profile_of_an_encrypted_run_takes_curves_cost_out_of_the_io_thread() -> None:
    """Each node: 4 ms on other threads over 2 messages of 1000 bytes, one peer; CURVE costs
    1 ms per handshake and 1 us per byte: 4 - 1 - 2 = 1 ms of plain ZeroMQ, 0.5 ms a message
    (unencrypted: all 4 ms are ZeroMQ's). Either profile carries CURVE's figures."""
    curve = CurveCosts(handshake=1e-3, per_byte=1e-6)

    def node(role: str, side: str, encrypted: bool) -> dict[str, Any]:
        return {"role": role, "cpu_seconds": 0.014, "main_seconds": 0.010, "kernel_seconds": 0.0,
                "kernel_calls": 0, "ops": 0, "op_seconds": 0.0, "steps": 0,
                "step_seconds": 0.0, "rounds": 0, "round_seconds": 0.0, "encrypted": encrypted,
                "messages": [{"side": side, "kind": "send", "bytes": [1000, 1000],
                              "seconds": [0.005, 0.005], "again": 0.0}]}

    for encrypted, io in ((True, 0.0005), (False, 0.002)):
        records = {"trainer:0": node("trainer", "send", encrypted),
                   "pserver:0": node("pserver", "receive", encrypted)}
        costs, _ = fit_costs(records, io_per_message=None, curve=curve)
        assert costs.curve == curve  # what encryption costs, charged to a CurveZMQ job
        assert costs.io == Linear(pytest.approx(io), 0.0)
        assert RuntimeCosts.from_document(costs.document()) == costs
