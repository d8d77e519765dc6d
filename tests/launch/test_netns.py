"""`runtime up --netns`: one network namespace per node, bridged in a namespace of the run's own,
with the scenario's network applied (bandwidth as tc tbf on each node's interface, latency by a
proxy in front of the pserver), and every namespace deleted afterwards, also when the job fails
or is interrupted. The proxies keep the job's CurveZMQ: each is made in its pserver's namespace,
and a job with latency and message faults ends as its ``--insecure`` run does. The tests that
make namespaces are skipped, with the reason, where they cannot be made (not root, no iproute2,
no permission, e.g. in an unprivileged container); the rest (notes, checks, the tbf command) run
anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import zmq

from runtime import cli
from runtime.config.metrics import JobMetrics, NetnsNodeMetrics, read_metrics
from runtime.config.netspec import NetworkSpec
from runtime.config.scenario import parse_scenario
from runtime.config.units import rate
from runtime.faults.curve_proxy import CurveFaultProxy
from runtime.launch import netns
from runtime.launch.launcher import ignored_by_runtime
from runtime.launch.shaping import BUCKET_FRAMES, bucket_bytes, tbf_command
from runtime.network.curve import write_keys
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import train_locally
from runtime.services.job import Job
from runtime.services.node import node_keys

from cluster_helpers import csv_with_a_bad_value
from curve_helpers import attack
from metrics_schema import assert_valid_metrics
from runtime_runs import up

T = TypeVar("T")

RATE = "20Mbit/s"
SCENARIO = f"""\
name: netns
seed: 5
model: {{name: mlp, sizes: [64, 256, 10], optimizer: {{type: momentum, learning_rate: 0.05}}}}
data: {{batch_size: 16}}
cluster: {{pservers: 1, trainers: 2}}
train: {{steps: 20, deadline: 60s, retry_after: 100ms, log_every: 1}}
network:
  default: {{latency: {{dist: uniform, low: 1ms, high: 3ms}}, bandwidth: {RATE}}}
expect: {{params_equal_to: local, no_lost_updates: true}}
"""
"""Each step the pserver sends each trainer ~77 KB of parameters, far more than the 25 KB
bucket of a 20 Mbit/s tbf: the shaping cannot help but make packets wait. ``retry_after:
100ms``: the pserver drains 0.3 s after the last trainer, not 3 s."""


def probe() -> str | None:
    """Why namespaces with a tbf cannot be made here (None: they can)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2's `ip` and `tc` are not installed"
    if os.geteuid() != 0:
        return "creating them needs root"
    name = f"pslab-probe-{os.getpid()}"
    try:
        netns.run_command(["ip", "netns", "add", name])
    except netns.NetnsError as exc:
        return f"they cannot be made here: {exc}"
    try:
        netns.run_command(["ip", "netns", "exec", name, *tbf_command("lo", 1e6)])
    except netns.NetnsError as exc:
        return f"tc tbf is not available here: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None


@pytest.fixture(scope="module")
def can_make_namespaces() -> None:
    reason = probe()
    if reason is not None:
        pytest.skip(f"network namespaces: {reason}")


def scenario_file(tmp_path: Path, text: str = SCENARIO) -> Path:
    path = tmp_path / "netns.yaml"
    path.write_text(text)
    return path


def assert_all_gone(names: list[str]) -> None:
    assert names, "the run recorded no namespace"
    assert set(names).isdisjoint(netns.namespaces())


def namespaces_of(metrics: JobMetrics) -> list[str]:
    assert metrics.netns is not None
    return [n.namespace for n in metrics.netns.nodes] + [metrics.netns.hub]


# -- a job in namespaces ---------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_job_in_namespaces_is_shaped_and_delayed_and_equals_local_training(
        can_make_namespaces: None, tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path), tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out), "--netns")
    assert code == 0, "\n".join(lines)
    assert lines[-1] == "OK: netns"
    assert assert_valid_metrics(out / "metrics.json")["netns"] is not None
    metrics = read_metrics(out / "metrics.json")
    assert metrics.netns is not None
    nodes = {n.node: n for n in metrics.netns.nodes}
    assert list(nodes) == ["pserver:0", "trainer:0", "trainer:1"]
    assert_all_gone(namespaces_of(metrics))

    # Each node had its own address in the run's own /24; the trainers found the pserver there.
    subnet = ipaddress.ip_network(metrics.netns.subnet)
    assert subnet.prefixlen == 24 and subnet.subnet_of(ipaddress.ip_network("10.147.0.0/16"))
    addresses = [ipaddress.ip_address(n.address) for n in nodes.values()]
    assert all(a in subnet for a in addresses) and len(set(addresses)) == 3
    assert metrics.job.endpoints == [f"{nodes['pserver:0'].address}:{netns.PORT}"]

    # A tbf at the scenario's rate on every interface, both ways; every node sent messages
    # larger than its bucket, so each one's egress made packets wait.
    bandwidth = rate(RATE)
    for node in nodes.values():
        assert node.rate == bandwidth and node.egress["overlimits"] > 0
        for qdisc in (node.egress, node.ingress):
            assert (qdisc["kind"], qdisc["rate"], qdisc["drops"]) == ("tbf", bandwidth, 0)
    assert_shaped(nodes["pserver:0"], metrics, bandwidth)

    # Every message of both trainers' links, both ways, was held for its drawn latency.
    (proxy,) = metrics.proxies
    assert sorted(proxy.links) == ["trainer:0", "trainer:1"]
    for link in proxy.links.values():
        for direction in ("up", "down"):
            counters = link[direction]
            assert counters["messages"] > 20 and counters["delayed"] == counters["messages"]

    assert {(e.name, e.passed) for e in metrics.expectations} == \
        {("params_equal_to", True), ("no_lost_updates", True)}
    _, local = train_locally(Job.from_scenario(parse_scenario(scenario.read_text())))
    with np.load(out / "params.npz") as params:
        for name, value in local.items():
            np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def assert_shaped(pserver: NetnsNodeMetrics, metrics: JobMetrics, bandwidth: float) -> None:
    """Bounds that shaping makes hold however loaded the machine (load only adds time)."""
    sent = metrics.pservers[0].bytes_out
    assert pserver.egress["bytes"] >= sent  # all it sent left through its tbf, with headers
    burst = bucket_bytes(bandwidth)  # runtime.launch.shaping's bucket
    assert metrics.job.wall_seconds >= (pserver.egress["bytes"] - burst) / bandwidth
    # The trainers wait in their steps for replies that cannot leave faster than the rate.
    floor = sent / bandwidth
    assert floor > 1.0
    assert max(sum(t.step_times) for t in metrics.trainers) >= 0.9 * floor


@pytest.mark.timeout(90)
def test_a_failed_job_deletes_its_namespaces_too(can_make_namespaces: None,
                                                 tmp_path: Path) -> None:
    scenario, out = scenario_file(tmp_path), tmp_path / "out"
    data, error = csv_with_a_bad_value(tmp_path / "data.csv")
    code, lines = up(str(scenario), "--out", str(out), "--netns", "--set", data)
    assert code == 1
    assert lines[-1].startswith("FAILED: trainer:")
    assert error in lines[-1]
    assert_all_gone(namespaces_of(read_metrics(out / "metrics.json")))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_job_deletes_its_namespaces(can_make_namespaces: None, tmp_path: Path,
                                                   sig: signal.Signals) -> None:
    """The signal is sent once trainer 0 reported a step (read off the launcher's output, no
    sleeping); the launcher stops every node and deletes every namespace it named."""
    scenario = scenario_file(tmp_path, SCENARIO.replace("steps: 20", "steps: 100000"))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "up", str(scenario), "--out",
         str(tmp_path / "out"), "--netns"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:
            seen.append(line.rstrip("\n"))
            if line.startswith("trainer:0 ") and " step " in line:
                break
        launcher.send_signal(sig)
        rest, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    seen += rest.splitlines()
    assert launcher.returncode == 128 + sig, "\n".join(seen)
    assert seen[-1] == f"FAILED: interrupted by {sig.name}"
    named = [line.split(" in ")[1].split(",")[0] for line in seen if line.startswith("netns: ")]
    assert len(named) == 3
    hub = named[0].rsplit("-", 1)[0] + "-hub"
    assert_all_gone([*named, hub])


@pytest.mark.timeout(30)
def test_runs_claim_distinct_subnets(can_make_namespaces: None) -> None:
    first, lock = netns._claim()
    try:
        second, other = netns._claim()
        os.close(other)
    finally:
        os.close(lock)
    assert first != second


# -- encrypted in namespaces ------------------------------------------------------------------

CURVE_SCENARIO = """\
name: netns-curve
seed: 11
model: {name: mlp, sizes: [32, 16, 10], optimizer: {type: sgd, learning_rate: 0.1}}
data: {batch_size: 16}
cluster: {pservers: 2, trainers: 2}
train: {steps: 20, deadline: 60s, retry_after: 100ms, log_every: 10}
network: {default: {latency: {dist: uniform, low: 1ms, high: 3ms}}}
faults: [{links: ["trainer:*", "pserver:*"], drop: 0.05}]
expect: {params_equal_to: fault_free, no_lost_updates: true}
"""
"""Latency and a message loss on every link of two pservers: a proxy in each pserver's
namespace carries both."""


@pytest.mark.timeout(180)
def test_a_job_in_namespaces_with_latency_and_faults_stays_encrypted(
        can_make_namespaces: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Each proxy is a `CurveFaultProxy` made in its pserver's namespace: the job keeps
    CurveZMQ (no insecure fallback, the encrypted banner) and ends with the parameters, bit for
    bit, of the same job run ``--insecure`` behind frame-reading proxies."""
    scenario = scenario_file(tmp_path, CURVE_SCENARIO)
    runs = {}
    for name, flags in (("curve", []), ("insecure", ["--insecure"])):
        out = tmp_path / name
        code, lines = up(str(scenario), "--out", str(out), "--netns", *flags)
        runs[name] = (code, lines, capfd.readouterr().err, out)
    code, lines, err, out = runs["curve"]
    assert code == 0 and lines[-1] == "OK: netns-curve", "\n".join(lines) + err
    assert f"CurveZMQ: every connection authenticated and encrypted, keys in {out / 'keys'}" \
        in lines
    assert "unencrypted" not in err and "--insecure" not in err and "warning" not in err
    metrics = read_metrics(out / "metrics.json")
    assert_valid_metrics(out / "metrics.json")
    assert_all_gone(namespaces_of(metrics))
    assert [(e.name, e.passed) for e in metrics.expectations] == [
        ("params_equal_to", True), ("no_lost_updates", True)]
    assert metrics.proxies is not None and len(metrics.proxies) == 2
    for proxy in metrics.proxies:  # in the pserver's namespace, at its address there
        assert proxy.address == f"{nodes_of(metrics)[f'pserver:{proxy.pserver}']}:{netns.PORT}"
        assert sorted(proxy.links) == ["trainer:0", "trainer:1"]
        for link in proxy.links.values():
            for direction in ("up", "down"):
                counters = link[direction]
                assert counters["delayed"] + counters["dropped"] == counters["messages"] > 20
    assert sum(link[d]["dropped"] for p in metrics.proxies for link in p.links.values()
               for d in ("up", "down")) > 0

    code, lines, err, insecure = runs["insecure"]
    assert code == 0 and lines[-1] == "OK: netns-curve", "\n".join(lines) + err
    assert "--insecure: no CurveZMQ" in err and not any(ln.startswith("CurveZMQ") for ln in lines)
    assert_all_gone(namespaces_of(read_metrics(insecure / "metrics.json")))
    with np.load(out / "params.npz") as encrypted, np.load(insecure / "params.npz") as plain:
        assert sorted(encrypted) == sorted(plain)
        for name in encrypted:
            assert np.array_equal(encrypted[name], plain[name]), name


RELAY_SCENARIO = """\
name: netns-relay
seed: 13
model: {name: mlp, sizes: [32, 16, 10], optimizer: {type: sgd, learning_rate: 0.1}}
data: {batch_size: 16}
cluster: {pservers: 2, trainers: 2}
train: {steps: 10, deadline: 60s, retry_after: 100ms, log_every: 5}
network:
  default: {latency: 1ms}
  links: [{between: ["trainer:0", "pserver:*"], latency: 15ms}]
expect: {params_equal_to: local, no_lost_updates: true}
"""
"""Constant latencies, one trainer's longer, and no message faults: byte relays, not proxies."""


@pytest.mark.timeout(120)
def test_constant_latencies_go_through_delay_relays_and_keep_curvezmq(
        can_make_namespaces: None, tmp_path: Path) -> None:
    """A relay in front of each pserver holds every byte for its link's latency without
    reading it: the job keeps CurveZMQ end to end, takes no proxy, ends as local training,
    and no sync step is shorter than the slow trainer's round trip."""
    scenario, out = scenario_file(tmp_path, RELAY_SCENARIO), tmp_path / "out"
    code, lines = up(str(scenario), "--out", str(out), "--netns")
    assert code == 0 and lines[-1] == "OK: netns-relay", "\n".join(lines)
    assert any("(behind delay relays, serving at 127.0.0.1:6175 in their namespaces)" in line
               for line in lines), lines
    assert f"CurveZMQ: every connection authenticated and encrypted, keys in {out / 'keys'}" \
        in lines
    metrics = read_metrics(out / "metrics.json")
    assert not metrics.proxies
    assert_all_gone(namespaces_of(metrics))
    assert {(e.name, e.passed) for e in metrics.expectations} == \
        {("params_equal_to", True), ("no_lost_updates", True)}
    for trainer in metrics.trainers:  # a sync step waits for trainer 0's send and its reply
        assert min(trainer.step_times[1:]) >= 0.030


def nodes_of(metrics: JobMetrics) -> dict[str, str]:
    assert metrics.netns is not None
    return {n.node: n.address for n in metrics.netns.nodes}


@contextlib.contextmanager
def a_namespace() -> Iterator[str]:
    """A network namespace of this test's own, its loopback up; deleted afterwards."""
    name = f"pslab-test-{os.getpid()}"
    netns.run_command(["ip", "netns", "add", name])
    try:
        netns.run_command(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"])
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def in_namespace(namespace: str, call: Callable[[], T]) -> T:
    with netns.entered(namespace):
        return call()


@pytest.mark.timeout(60)
def test_a_curve_proxy_made_in_a_namespace_listens_and_forwards_there(
        can_make_namespaces: None, tmp_path: Path) -> None:
    """Everything on the namespace's loopback, none of it reachable from this one's: a trainer
    there reaches a pserver there through the proxy and back, under CurveZMQ (the pserver
    admitting the proxy as its relay); a client without a key gets nothing; the thread that made
    the proxy is back in its own namespace."""
    keys = tmp_path / "keys"
    write_keys(keys, ["pserver-0", "trainer-0"])
    endpoint, bind = "127.0.0.1:6174", "127.0.0.1:6175"
    own = os.readlink("/proc/thread-self/ns/net")

    async def scenario(namespace: str) -> dict[str, Any]:
        server_keys = node_keys(keys, "pserver", 0, 1, [endpoint], relay=True)
        with netns.entered(namespace):  # a pserver's transport, serving on that loopback
            server = ZmqTransport("pserver:0", curve=server_keys)
            server.bind_nowait(bind)
            trainer_context: zmq.Context[Any] = zmq.Context()
            trainer_context.socket(zmq.PAIR).close()  # its I/O thread starts in the namespace
        proxy = CurveFaultProxy(keys=server_keys, listen=endpoint, upstream=bind,
                                upstream_name="pserver:0",
                                made_in=partial(netns.entered, namespace))
        trainer = ZmqTransport("trainer:0", context=trainer_context,
                               curve=node_keys(keys, "trainer", 0, 1, [endpoint]))
        try:
            address = await proxy.start()
            home = os.readlink("/proc/thread-self/ns/net")
            await trainer.connect(endpoint)
            await trainer.send(endpoint, [b"hello"])
            up = await server.recv()
            await server.send(up[0], [b"hello back"])
            down = await trainer.recv()
            outsider = await asyncio.to_thread(in_namespace, namespace, lambda: attack(
                endpoint, b"trainer:0", [[b"hello"]], None, None))
            return {"address": address, "home": home, "up": up, "down": down,
                    "outsider": outsider, "unauthenticated": server.unauthenticated}
        finally:
            await trainer.close()
            await proxy.close()
            await server.close()
            trainer_context.term()

    with a_namespace() as namespace:
        got = asyncio.run(asyncio.wait_for(scenario(namespace), 30))
    assert got["address"] == endpoint and got["home"] == own
    assert got["up"] == ("trainer:0", [b"hello"])
    assert got["down"] == (endpoint, [b"hello back"])
    assert got["outsider"] == [] and got["unauthenticated"] == 0


# -- what is and is not applied ----------------------------------------------------------------

NETWORK = """\
name: n
model: {name: mlp}
cluster: {pservers: 2, trainers: 2}
network:
  default: {latency: {dist: lognormal, median: 50us, sigma: 0.2}, bandwidth: 200Mbit/s}
  links:
    - {between: [trainer:0, pserver:1], bandwidth: 1Gbps}
    - {between: ["pserver:*", "trainer:*"], latency: 2ms}
  nics: [{nodes: "pserver:*", bandwidth: 10Gbps}]
"""


def test_without_netns_every_network_setting_is_noted_as_not_applied() -> None:
    assert ignored_by_runtime(parse_scenario(NETWORK)) == [
        "network.default.latency lognormal(median 50us, sigma 0.2): not applied (needs --netns)",
        "network.default.bandwidth 200Mbit/s: not applied (needs --netns)",
        "network.links.0.bandwidth 1Gbit/s between trainer:0 and pserver:1: not applied "
        "(needs --netns)",
        "network.links.1.latency 2ms between pserver:* and trainer:*: not applied "
        "(needs --netns)",
        "network.nics.0.bandwidth 10Gbit/s for pserver:*: not applied (needs --netns)"]
    assert ignored_by_runtime(parse_scenario("name: n\nmodel: {name: mlp}\n")) == []


def test_with_netns_only_rates_one_tbf_per_interface_cannot_give_are_noted() -> None:
    scenario = parse_scenario(NETWORK)
    spec = NetworkSpec.from_section(scenario.network)
    rates, notes = netns.tbf_rates(spec, scenario)
    mbit200, gbit = rate("200Mbit/s"), rate("1Gbps")
    assert rates == {"pserver:0": mbit200, "pserver:1": gbit, "trainer:0": gbit,
                     "trainer:1": mbit200}
    assert notes == [
        "network: pserver:1's links have different rates (200Mbit/s to trainer:1; 1Gbit/s to "
        "trainer:0): one tbf per interface has one rate, so it is shaped at 1Gbit/s to every "
        "peer and the slower links are not applied",
        "network: trainer:0's links have different rates (200Mbit/s to pserver:0; 1Gbit/s to "
        "pserver:1): one tbf per interface has one rate, so it is shaped at 1Gbit/s to every "
        "peer and the slower links are not applied"]
    assert ignored_by_runtime(scenario, netns=True) == notes + [BUCKET_NOTE]
    latencies = netns.link_latencies(spec, scenario)
    assert sorted(latencies) == [(f"trainer:{i}", f"pserver:{j}") for i in (0, 1) for j in (0, 1)]
    assert {str(latency) for latency in latencies.values()} == {"2ms"}


BUCKET_NOTE = ("network.burst 0s: each tbf's bucket holds 1ms at its rate (less falls behind the "
               "rate), so an idle interface sends that much at once; the simulator models the "
               "scenario's burst: set network.burst: 1ms for it to model these links")


def test_a_burst_of_a_millisecond_or_more_is_what_tbf_gets_and_is_not_noted() -> None:
    """The scenario's burst becomes each tbf's bucket; below tbf's floor of 1 ms, the floor is
    applied and noted (the simulator would model less than the links have)."""
    scenario = parse_scenario(NETWORK.replace("  nics:", "  burst: 4ms\n  nics:"))
    assert BUCKET_NOTE not in ignored_by_runtime(scenario, netns=True)
    assert "network.burst 4ms: not applied (needs --netns)" in ignored_by_runtime(scenario)
    assert bucket_bytes(rate("1Gbps")) == 125_000 == bucket_bytes(rate("1Gbps"), 0.0005)
    assert bucket_bytes(rate("1Gbps"), 0.004) == 500_000
    assert bucket_bytes(rate("2Mbps"), 0.004) == BUCKET_FRAMES * 1514  # 4 frames at least
    assert tbf_command("eth0", rate("1Gbps"), burst=0.004)[-4:-2] == ["burst", "500000"]


def test_a_zero_latency_needs_no_proxy_and_no_bandwidth_no_tbf() -> None:
    scenario = parse_scenario("name: n\nmodel: {name: mlp}\nnetwork: {default: {latency: 0}}\n")
    spec = NetworkSpec.from_section(scenario.network)
    assert netns.link_latencies(spec, scenario) == {}
    assert netns.tbf_rates(spec, scenario) == ({"pserver:0": None, "trainer:0": None}, [])


def test_netns_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsError, match="^needs root: it creates network namespaces"):
        netns.check_netns(parse_scenario(NETWORK))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "tc" else f"/bin/{name}")
    with pytest.raises(netns.NetnsError, match="sets a bandwidth, which needs iproute2's `tc`"):
        netns.check_netns(parse_scenario(NETWORK))
    listed = parse_scenario("name: n\nmodel: {name: mlp}\n"
                            "cluster: {endpoints: {pservers: ['10.0.0.1:6174']}}\n")
    with pytest.raises(netns.NetnsError, match="lists cluster.endpoints.pservers"):
        netns.check_netns(listed)
    big = parse_scenario("name: n\nmodel: {name: mlp}\ncluster: {pservers: 4, trainers: 250}\n")
    with pytest.raises(netns.NetnsError, match="at most 253 nodes, and the scenario has 254"):
        netns.check_netns(big)


def test_netns_does_not_combine_with_one_role(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["up", str(scenario_file(tmp_path)), "--netns", "--role", "trainer",
                  "--index", "0"])
    assert exit_.value.code == 2
    assert "--netns runs every node of the job itself" in capsys.readouterr().err


def test_the_tbf_command_limits_egress_to_the_rate() -> None:
    assert tbf_command("eth0", rate("2Mbps"), namespace="ns1") == [
        "ip", "netns", "exec", "ns1", "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
        "rate", "2000000bit", "burst", "6056", "latency", "1000ms"]
