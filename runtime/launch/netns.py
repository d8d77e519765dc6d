"""`runtime up --netns`: every node in a network namespace of its own, the scenario's network
applied to the links between them.

The fabric. Each pserver and trainer process runs in its own namespace (``ip netns exec``),
with one interface ``eth0`` whose other end (a veth pair) is a port of a bridge in a hub
namespace of the run's own: nodes talk real TCP between distinct addresses, as across machines,
and nothing of it touches the host's network. A run owns the subnet ``10.147.X.0/24``: the
launcher claims X by an exclusive lock on ``/run/pslab-netns/X.lock`` (held for the whole run;
the kernel releases it if the launcher dies), so two runs never share a subnet or a namespace
name; the lock file records the launcher's pid, for a person to read. A run killed with
SIGKILL deletes nothing, so each run starts by deleting the namespaces of every run that is over
(`remove_dead_runs`): those of its own X, and those of any X whose lock it can take, the lock
held meanwhile. Namespaces are ``pslab-nX-hub``, ``pslab-nX-ps0``, ``pslab-nX-t3``...;
addresses are ``10.147.X.1`` up, pservers first; a pserver's endpoint is its address and
``cluster.base_port`` (else 6174), the same port in every namespace. The namespaces (and with them the veths and the
bridge) are always deleted at the end, on failure and interruption too (`Fabric.delete` runs in
``finally`` with SIGINT and SIGTERM held back until it is done).

Bandwidth: a token bucket filter (``tc qdisc ... tbf``, `runtime.launch.shaping`) on each node's
``eth0`` limits what it sends, and one on its bridge port (the hub side of its veth) what it
takes in, both at the node's rate: ``min(link bandwidth, its NIC cap)``, as the simulator's
``rate_out``/``rate_in`` of a link are (`sim.network`; with no bandwidth anywhere, no qdisc).
What a per-interface tbf can express: the default bandwidth, NIC caps, and link rules that give
all of a node's links one rate (``between: [pserver:*, trainer:*]``, or a rule naming one node
and every peer it has). What it cannot: a rule that gives one node different rates to different
peers (``between: [trainer:0, pserver:1]`` next to a default for the rest): one interface has one
rate for every destination. That would take a classful qdisc with a class per peer, filtered by
address, and the node's traffic would then no longer queue in one FIFO as its simulated NIC's
does. Such a node is shaped at the fastest of its links' rates (never slower than the scenario
says) and `network_notes` says which links are not applied. tbf counts frames with their
headers, the simulator payload bytes: real transfers take a few percent longer. Each tbf's
bucket holds ``network.burst`` at its rate, but at least a millisecond's worth
(`runtime.launch.shaping.BUCKET_SECONDS`: less falls behind the rate); a scenario whose burst is
smaller gets a note, as the simulator models the burst the scenario says.

Latency: this kernel has no netem, so a fault proxy listens at each pserver's endpoint, in the
pserver's namespace, and forwards to the pserver: a `runtime.faults.curve_proxy.CurveFaultProxy`
of the job's CurveZMQ, made while the launcher's thread is in the namespace (`entered`), or with
``--insecure`` a `runtime.faults.proxy.FaultProxy` whose sockets `Sockets` makes there. The
pserver serves on that namespace's loopback (``--bind 127.0.0.1:PORT+1``). Each message of a
trainer's connection is held for a latency drawn from the scenario's distribution for that
(trainer, pserver) link, each direction from its own generator seeded by the scenario's seed and
the two node names: deterministic, and never letting a message overtake an earlier one (as in
the simulator). The delay comes after the message has crossed the shaped link, so a lone message
takes latency + size / rate, the simulator's closed form. Trainers and pservers are the only
nodes that talk, so these are all the links a run has. Fault injection works as without
namespaces: the same proxies carry the scenario's message faults, their delays added to the
link's latency.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.config.metrics import NetnsMetrics, NetnsNodeMetrics
from runtime.config.netspec import (ConstantLatency, Latency, NetworkSection, NetworkSpec, fmt_rate,
                                    fmt_seconds)
from runtime.config.nodes import (PSERVER, is_pserver, node_names, parse_node, pserver_name,
                                  trainer_name)
from runtime.config.scenario import Scenario
from runtime.launch.shaping import BUCKET_SECONDS, ShapingError, shape

__all__ = ["Fabric", "NetnsError", "Sockets", "check_netns", "entered", "link_latencies",
           "network_notes", "node_rates", "remove_dead_runs", "tbf_rates"]

NETNS_DIR = Path("/run/netns")
LOCK_DIR = Path("/run/pslab-netns")
PREFIX = "pslab-n"
SUBNETS = 256
"""Subnets 10.147.0.0/24 to 10.147.255.0/24: at most this many runs at once."""
PORT = 6174
"""A pserver's port in its namespace, unless the scenario sets ``cluster.base_port``."""
MAX_NODES = 253
DEVICE = "eth0"
BRIDGE = "br0"
CLONE_NEWNET = 0x40000000
TIMEOUT = 30.0
"""Seconds one ip or tc command may take."""
NAMESPACE = re.compile(rf"{PREFIX}(\d+)-.+")
"""A namespace of a run, and its subnet index X."""


class NetnsError(RuntimeError):
    """Namespaces cannot be used or made; the message names the command or the requirement."""


# -- what the scenario's network asks of the links ---------------------------------------------

def nodes_of(scenario: Scenario) -> list[str]:
    c = scenario.cluster
    return node_names(c.pservers, c.trainers)


def peers_of(node: str, scenario: Scenario) -> list[str]:
    """The nodes `node` talks to: trainers to every pserver, pservers to every trainer."""
    c = scenario.cluster
    if is_pserver(node):
        return [trainer_name(i) for i in range(c.trainers)]
    return [pserver_name(j) for j in range(c.pservers)]


def node_rates(spec: NetworkSpec, scenario: Scenario) -> dict[str, dict[str, float]]:
    """node -> peer -> the rate (bytes/s) its interface would carry that link's traffic at:
    min(link bandwidth, the node's NIC cap), the same both ways (`NetworkSpec.link` is
    symmetric)."""
    return {node: {peer: min(spec.link(node, peer).bandwidth, spec.nic_bandwidth(node))
                   for peer in peers_of(node, scenario)}
            for node in nodes_of(scenario)}


def tbf_rates(spec: NetworkSpec, scenario: Scenario) -> tuple[dict[str, float | None], list[str]]:
    """Each node's tbf rate (None: not shaped), and a note for each node whose links the
    scenario gives different rates, which one tbf per interface cannot do."""
    rates: dict[str, float | None] = {}
    notes: list[str] = []
    for node, by_peer in node_rates(spec, scenario).items():
        fastest = max(by_peer.values(), default=math.inf)
        rates[node] = None if fastest == math.inf else fastest
        if len(set(by_peer.values())) > 1:
            notes.append(_mixed_rates_note(node, by_peer, fastest))
    return rates, notes


def _mixed_rates_note(node: str, by_peer: dict[str, float], fastest: float) -> str:
    groups: dict[float, list[str]] = {}
    for peer, rate in by_peer.items():
        groups.setdefault(rate, []).append(peer)
    said = "; ".join(f"{fmt_rate(rate)} to {_some(peers)}" for rate, peers in sorted(groups.items()))
    return (f"network: {node}'s links have different rates ({said}): one tbf per interface has "
            f"one rate, so it is shaped at {fmt_rate(fastest)} to every peer and the slower "
            "links are not applied")


def _some(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def link_latencies(spec: NetworkSpec, scenario: Scenario) -> dict[tuple[str, str], Latency]:
    """(trainer, pserver) -> the latency distribution of that link, for links with one that is
    not a constant zero (those need no proxy)."""
    out: dict[tuple[str, str], Latency] = {}
    for pserver in nodes_of(scenario):
        if not is_pserver(pserver):
            continue
        for trainer in peers_of(pserver, scenario):
            latency = spec.link(trainer, pserver).latency
            if latency != ConstantLatency(0.0):
                out[trainer, pserver] = latency
    return out


def network_notes(scenario: Scenario, netns: bool) -> list[str]:
    """What of the scenario's `network` a run does not apply: without namespaces, every setting
    it has; with them, what one tbf per interface cannot express."""
    section = scenario.network
    if section is None:
        return []
    if not netns:
        return [f"{path} {value}: not applied (needs --netns)" for path, value in settings(section)]
    spec = NetworkSpec.from_section(section)
    rates, notes = tbf_rates(spec, scenario)
    if spec.burst < BUCKET_SECONDS and any(rate is not None for rate in rates.values()):
        notes.append(f"network.burst {fmt_seconds(spec.burst)}: each tbf's bucket holds "
                     f"{fmt_seconds(BUCKET_SECONDS)} at its rate (less falls behind the rate), "
                     "so an idle interface sends that much at once; the simulator models the "
                     f"scenario's burst: set network.burst: {fmt_seconds(BUCKET_SECONDS)} for "
                     "it to model these links")
    return notes


def settings(section: NetworkSection) -> list[tuple[str, str]]:
    """(field path, value as said) of every setting of a `network` section."""
    out: list[tuple[str, str]] = []
    default = section.default
    if default.latency is not None:
        out.append(("network.default.latency", str(default.latency.build())))
    if default.bandwidth is not None:
        out.append(("network.default.bandwidth", fmt_rate(default.bandwidth)))
    for i, link in enumerate(section.links):
        between = f"between {link.between[0]} and {link.between[1]}"
        if link.latency is not None:
            out.append((f"network.links.{i}.latency", f"{link.latency.build()} {between}"))
        if link.bandwidth is not None:
            out.append((f"network.links.{i}.bandwidth", f"{fmt_rate(link.bandwidth)} {between}"))
    for i, nic in enumerate(section.nics):
        out.append((f"network.nics.{i}.bandwidth",
                    f"{fmt_rate(nic.bandwidth)} for {', '.join(nic.nodes)}"))
    if section.burst:
        out.append(("network.burst", fmt_seconds(section.burst)))
    return out


def check_netns(scenario: Scenario) -> None:
    """Raise `NetnsError` saying why `runtime up --netns` cannot run `scenario` here."""
    if os.geteuid() != 0:
        raise NetnsError("needs root: it creates network namespaces, veth pairs, a bridge and "
                         "tc qdiscs; run it as root, or without --netns")
    if shutil.which("ip") is None:
        raise NetnsError("needs iproute2's `ip` command, which is not installed")
    count = len(nodes_of(scenario))
    if count > MAX_NODES:
        raise NetnsError(f"gives each node an address in one /24: at most {MAX_NODES} nodes, "
                         f"and the scenario has {count}")
    rates, _ = tbf_rates(NetworkSpec.from_section(scenario.network), scenario)
    if any(rate is not None for rate in rates.values()) and shutil.which("tc") is None:
        raise NetnsError("the scenario's network sets a bandwidth, which needs iproute2's `tc` "
                         "command, and it is not installed")
    if (scenario.cluster.endpoints or {}).get("pservers"):
        raise NetnsError("gives each pserver the address of its namespace, but the scenario "
                         "lists cluster.endpoints.pservers; drop them (--set "
                         "cluster.endpoints=null)")


# -- commands ------------------------------------------------------------------------------------

def run_command(command: Sequence[str], stdin: str | None = None) -> str:
    """`command`'s output; `NetnsError` naming it and its complaint if it fails."""
    try:
        done = subprocess.run(list(command), input=stdin, capture_output=True, text=True,
                              timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(command)}: {exc}") from None
    if done.returncode != 0:
        problem = (done.stderr or done.stdout).strip()
        raise NetnsError(f"{' '.join(command)}: {problem}")
    return done.stdout


def ip_batch(lines: Sequence[str], namespace: str | None = None) -> None:
    """Run ``ip`` commands (without the leading ``ip``), in `namespace` if given."""
    where = ["-n", namespace] if namespace else []
    run_command(["ip", *where, "-batch", "-"], "\n".join(lines) + "\n")


def namespaces() -> list[str]:
    """The names of the named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in run_command(["ip", "netns", "list"]).splitlines()
            if line.strip()]


def _claim() -> tuple[int, int]:
    """A free subnet index X and the open file whose lock holds it for this run (the file then
    records this process's pid)."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    start = os.getpid() % SUBNETS
    for k in range(SUBNETS):
        index = (start + k) % SUBNETS
        fd = _lock_file(index)
        if not _try_lock(fd):
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return index, fd
    raise NetnsError(f"all {SUBNETS} subnets 10.147.X.0/24 are held by running "
                     "`runtime up --netns` launchers")


def _lock_file(index: int) -> int:
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    return os.open(LOCK_DIR / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o644)


def _try_lock(fd: int) -> bool:
    """Whether this process now holds the lock of `fd` (False: another open file holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def remove_dead_runs(own: int | None = None) -> list[str]:
    """Delete the namespaces of the runs that are over, and say which: those of subnet `own`
    (this run's, claimed: an earlier run left them) and those of every other subnet that no
    launcher holds. DESIGN: a run is alive while its lock is held, not while a recorded pid
    exists: the kernel releases a flock however its holder dies, and a pid may be reused. The
    lock of a dead run's subnet is held while its namespaces go, so no run claims the subnet
    and makes namespaces there meanwhile; a live run's namespaces are never touched."""
    runs: dict[int, list[str]] = {}
    for name in namespaces():
        match = NAMESPACE.fullmatch(name)
        if match:
            runs.setdefault(int(match.group(1)), []).append(name)
    removed: list[str] = []
    for index, names in sorted(runs.items()):
        with _held_if_free(index, own) as dead:
            if dead:
                for name in names:
                    run_command(["ip", "netns", "del", name])
                removed += names
    return removed


@contextlib.contextmanager
def _held_if_free(index: int, own: int | None) -> Iterator[bool]:
    """Whether subnet `index` belongs to no live run: it is `own`, or its lock was free (and is
    then held for the block)."""
    if index == own:
        yield True
        return
    fd = _lock_file(index)
    try:
        yield _try_lock(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (then they act as they would have)."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While in the block, SIGTERM raises KeyboardInterrupt as SIGINT does, so that cleanup in
    ``finally`` runs rather than the process ending on the spot."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- sockets in a namespace -------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """The calling thread in network namespace `namespace` for the block, then back in its
    own. What the thread makes meanwhile stays in the namespace: a socket (bound to it when
    made), a thread (it starts in its maker's namespace; libzmq's I/O threads, started with a
    context's first socket, then open its connections there). DESIGN: the loop's own thread
    enters, for a block that never yields to the loop, rather than a helper thread: the sockets
    made are the loop's to drive, and no other task runs on the thread meanwhile."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / namespace, os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(target)
    finally:
        os.close(own)


@dataclass(frozen=True)
class Sockets:
    """Makes TCP sockets in network namespace `namespace`, for this process (the launcher's
    proxies): the calling thread enters the namespace for the one ``socket()`` call and returns
    to its own; a socket stays in the namespace it was made in."""

    namespace: str

    def __call__(self, family: int) -> socket.socket:
        with entered(self.namespace):
            return socket.socket(family, socket.SOCK_STREAM)


# -- the fabric -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    """Where one node runs: its namespace, its address, and its bridge port (in the hub)."""

    node: str
    namespace: str
    address: str
    port: str
    """Its veth's other end, a port of the hub's bridge."""
    rate: float | None
    """Bytes per second of its tbf, each way; None: not shaped."""


@dataclass
class Fabric:
    """One run's namespaces, bridge and shaping; `create` builds it, `delete` removes it all."""

    index: int
    hosts: dict[str, Host]
    lock: int | None
    """The open lock file that holds subnet `index` (None once released)."""
    removed_stale: list[str] = field(default_factory=list)
    """Namespaces of earlier runs that ended without deleting them (`remove_dead_runs`)."""
    burst: float = 0.0
    """The scenario's ``network.burst`` (seconds), each tbf's bucket."""

    @property
    def hub(self) -> str:
        return f"{PREFIX}{self.index}-hub"

    @property
    def subnet(self) -> str:
        return f"10.147.{self.index}.0/24"

    @staticmethod
    def create(scenario: Scenario) -> "Fabric":
        """Claim a subnet, make a namespace per node bridged in a hub namespace, and shape each
        node's interface; on any failure delete what was made and raise `NetnsError`."""
        rates, _ = tbf_rates(NetworkSpec.from_section(scenario.network), scenario)
        index, lock = _claim()
        fabric = Fabric(index, {}, lock, burst=NetworkSpec.from_section(scenario.network).burst)
        for k, node in enumerate(nodes_of(scenario)):
            role, i = parse_node(node)
            short = f"{'ps' if role == PSERVER else 't'}{i}"
            fabric.hosts[node] = Host(node, f"{PREFIX}{index}-{short}", f"10.147.{index}.{k + 1}",
                                      f"v-{short}", rates[node])
        try:
            with signals_held():
                fabric.removed_stale = remove_dead_runs(index)
            fabric._build()
            fabric._shape()
        except BaseException:
            fabric.delete()
            raise
        return fabric

    def _names(self) -> list[str]:
        return [host.namespace for host in self.hosts.values()] + [self.hub]

    def _build(self) -> None:
        ip_batch([f"netns add {ns}" for ns in self._names()])
        ip_batch([f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up"], self.hub)
        for host in self.hosts.values():
            ip_batch([f"link add {DEVICE} type veth peer name {host.port} netns {self.hub}",
                      f"addr add {host.address}/24 dev {DEVICE}", f"link set {DEVICE} up",
                      "link set lo up"], host.namespace)
        ip_batch([f"link set {host.port} master {BRIDGE} up" for host in self.hosts.values()],
                 self.hub)

    def _shape(self) -> None:
        for host in self.hosts.values():
            if host.rate is None:
                continue
            queue = min(1.0, 1e9 / host.rate)  # at most ~1 GB queued at high rates
            try:
                shape(DEVICE, host.rate, host.namespace, latency=queue, burst=self.burst)
                shape(host.port, host.rate, self.hub, latency=queue, burst=self.burst)
            except ShapingError as exc:
                raise NetnsError(f"{host.node}: {exc}") from None

    def address(self, node: str) -> str:
        return self.hosts[node].address

    def namespace(self, node: str) -> str:
        return self.hosts[node].namespace

    def sockets(self, node: str) -> Callable[[int], socket.socket]:
        """Makes sockets in `node`'s namespace (for a proxy in front of it)."""
        return Sockets(self.namespace(node))

    def metrics(self) -> NetnsMetrics:
        """Where each node ran and what its qdiscs counted (read while the namespaces exist)."""
        hub = _qdiscs(self.hub)
        nodes = []
        for host in self.hosts.values():
            egress = _qdiscs(host.namespace, DEVICE).get(DEVICE, {})
            nodes.append(NetnsNodeMetrics(host.node, host.namespace, host.address, host.rate,
                                          egress, hub.get(host.port, {})))
        return NetnsMetrics(self.subnet, self.hub, nodes)

    def delete(self) -> list[str]:
        """Delete every namespace of the run (their veths and the bridge with them) and release
        the subnet, with SIGINT and SIGTERM held back meanwhile; the problems, if any."""
        problems: list[str] = []
        with signals_held():
            try:
                existing = set(namespaces())
            except NetnsError as exc:
                existing, problems = set(self._names()), [str(exc)]
            for ns in self._names():
                if ns in existing:
                    try:
                        run_command(["ip", "netns", "del", ns])
                    except NetnsError as exc:
                        problems.append(str(exc))
            if self.lock is not None:
                os.close(self.lock)
                self.lock = None
        return problems


def _qdiscs(namespace: str, device: str | None = None) -> dict[str, dict[str, Any]]:
    """device -> its root qdisc's kind, counters (bytes, packets, drops, overlimits) and, for a
    tbf, its rate (bytes per second)."""
    which = ["dev", device] if device else []
    try:
        text = run_command(["ip", "netns", "exec", namespace, "tc", "-s", "-j", "qdisc", "show",
                            *which])
        entries = json.loads(text or "[]")
    except (NetnsError, ValueError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry.get("root"):
            name = entry.get("dev", device or "")
            out[name] = {key: entry.get(key) for key in ("kind", "bytes", "packets", "drops",
                                                         "overlimits")}
            out[name]["rate"] = (entry.get("options") or {}).get("rate")
    return out
