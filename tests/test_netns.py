"""One role per "host": a pserver and two trainers, each in its own network namespace with its own
10.x address, joined by veth pairs to a bridge in a fourth namespace, so the nodes talk real TCP
between distinct addresses as they would across machines. The test builds the namespaces itself
and always deletes them (which deletes their links); it is skipped with the reason where they
cannot be made (not root, no iproute2, or no permission, e.g. in an unprivileged container).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from runtime.cluster import train_locally
from runtime.job import Job
from runtime.metrics import PserverMetrics, TrainerMetrics, read_record
from runtime.scenario import parse_scenario
from runtime.shaping import ShapingError, shape, tbf_command
from runtime.units import rate

SUBNET = "10.147.0"
PORT = 6174
NODES = {"ps": f"{SUBNET}.1", "t0": f"{SUBNET}.2", "t1": f"{SUBNET}.3"}
SCENARIO = """\
name: netns
seed: 5
model: {name: mlp, sizes: [64, 32, 10], optimizer: {type: momentum, learning_rate: 0.05}}
data: {batch_size: 16}
cluster: {pservers: 1, trainers: 2}
train: {steps: 20, deadline: 60s}
"""


def ip(*args: str, ns: str | None = None) -> str:
    prefix = ["ip", "netns", "exec", ns] if ns else []
    done = subprocess.run([*prefix, "ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}{f' (in {ns})' if ns else ''}: "
                           f"{done.stderr.strip()}")
    return done.stdout


def build_network(prefix: str, created: list[str]) -> dict[str, str]:
    """The namespaces (node -> namespace name), each node's veth bridged in the hub namespace."""
    hub = f"{prefix}-hub"
    created.append(hub)  # before adding: a failed add may leave the name behind
    ip("netns", "add", hub)
    ip("link", "add", "br0", "type", "bridge", ns=hub)
    ip("link", "set", "br0", "up", ns=hub)
    names = {}
    for node, address in NODES.items():
        ns = names[node] = f"{prefix}-{node}"
        created.append(ns)
        ip("netns", "add", ns)
        ip("link", "add", "eth0", "type", "veth", "peer", "name", f"v-{node}", "netns", hub, ns=ns)
        ip("link", "set", f"v-{node}", "master", "br0", "up", ns=hub)
        ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
        ip("link", "set", "eth0", "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)
    return names


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    if shutil.which("ip") is None:
        pytest.skip("network namespaces: iproute2's `ip` is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces: creating them needs root")
    created: list[str] = []
    try:
        try:
            names = build_network(f"pslab{os.getpid()}", created)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"network namespaces cannot be made here: {exc}")
        yield names
    finally:
        for ns in reversed(created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def node_command(ns: str, scenario: Path, out: Path, *role: str) -> list[str]:
    return ["ip", "netns", "exec", ns, sys.executable, "-m", "runtime.node", str(scenario),
            "--out", str(out), *role]


def run_three_hosts(namespaces: dict[str, str], tmp_path: Path,
                    text: str = SCENARIO) -> Path:
    """The scenario's pserver and two trainers, one per namespace; their output folder."""
    scenario = tmp_path / "netns.yaml"
    scenario.write_text(text)
    out = tmp_path / "out"
    endpoint = f"{NODES['ps']}:{PORT}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "TRAINING_ROLE"))}
    paddle = {**env, "TRAINING_ROLE": "TRAINER", "PADDLE_PSERVERS_IP_PORT_LIST": endpoint,
              "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "1"}
    launches = [
        (node_command(namespaces["ps"], scenario, out, "--role", "pserver", "--index", "0",
                      "--endpoints", endpoint), env),
        (node_command(namespaces["t0"], scenario, out, "--role", "trainer", "--index", "0",
                      "--endpoints", endpoint), env),
        (node_command(namespaces["t1"], scenario, out), paddle),  # Paddle's variables
    ]
    procs = [subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for cmd, e in launches]
    try:
        outputs = [p.communicate(timeout=75)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], "\n----\n".join(outputs)
    return out


@pytest.mark.timeout(90)
def test_pserver_and_two_trainers_in_three_namespaces(namespaces: dict[str, str],
                                                      tmp_path: Path) -> None:
    text = SCENARIO.replace("deadline: 60s", "deadline: 60s, retry_after: 100ms")  # drain 0.3 s
    out = run_three_hosts(namespaces, tmp_path, text)
    endpoint = f"{NODES['ps']}:{PORT}"
    pserver = read_record(out / "nodes" / "pserver-0.json", PserverMetrics)
    assert (pserver.endpoint, pserver.steps, pserver.errors, pserver.dropped) == \
        (endpoint, 20, 0, [])
    trainers = [read_record(out / "nodes" / f"trainer-{i}.json", TrainerMetrics) for i in (0, 1)]
    assert all(len(t.losses) == 20 for t in trainers)
    # Everything the pserver received came in through its veth, from the other namespaces.
    (link,) = json.loads(ip("-s", "-j", "link", "show", "eth0", ns=namespaces["ps"]))
    received = link["stats64"]["rx"]["bytes"]
    assert received > pserver.bytes_in

    _, local = train_locally(Job.from_scenario(parse_scenario(text)))
    with np.load(out / "params.npz") as params:
        for name, value in local.items():
            np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_tbf_command_limits_egress_to_the_rate() -> None:
    assert tbf_command("eth0", rate("2Mbps"), namespace="ns1") == [
        "ip", "netns", "exec", "ns1", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
        "rate", "2000000bit", "burst", "24224", "latency", "1000ms"]


@pytest.mark.timeout(90)
def test_a_scenario_bandwidth_shaped_with_tbf_slows_the_job_not_its_numbers(
        namespaces: dict[str, str], tmp_path: Path) -> None:
    """The pserver's egress limited to the scenario's 2 Mbps by tc tbf: the trainers wait at
    least the time its replies take at that rate, and train exactly as unshaped."""
    text = SCENARIO + "network: {default: {bandwidth: 2Mbps}}\n"
    bandwidth = rate("2Mbps")
    try:
        shape("eth0", bandwidth, namespaces["ps"])
    except ShapingError as exc:
        pytest.skip(f"tc tbf is not available here: {exc}")
    out = run_three_hosts(namespaces, tmp_path, text)
    pserver = read_record(out / "nodes" / "pserver-0.json", PserverMetrics)
    trainers = [read_record(out / "nodes" / f"trainer-{i}.json", TrainerMetrics) for i in (0, 1)]
    floor = pserver.bytes_out / bandwidth  # its replies cannot leave faster than the rate
    assert floor > 0.5
    assert max(sum(t.step_times) for t in trainers) >= 0.9 * floor
    _, local = train_locally(Job.from_scenario(parse_scenario(text)))
    with np.load(out / "params.npz") as params:
        for name, value in local.items():
            np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-5, err_msg=name)
