"""`runtime up SCENARIO --role R --index N`: one node of a job on this host, with the faults of
the scenario that concern it.

Across hosts no launcher sees the whole job: each host runs its own node. A node that none of
the scenario's faults concern runs in the foreground (`runtime.services.node.run_role`). One that
some concern runs under a supervisor of its own, `RoleLauncher`: `runtime up`'s `Launcher` cut
down to that one node, which starts it as a child process (``python -m runtime.services.node``,
told by `ALONE_VAR` that it is still on its own) and fires the scenario's faults through the one
schedule (`runtime.faults.schedule.FaultSchedule`) on a `runtime.faults.inject.RuntimeTarget`
whose `own` is the node. Every host runs the same schedule; each acts out what concerns its
node:

- crash: the node's process group is SIGKILLed (the node dies without warning) and, with
  ``restart_after``, started again by its supervisor that long after, as `runtime up` restarts
  it: a pserver with ``--recover``, a trainer with ``--incarnation N``;
- slow: its supervisor pauses it with SIGSTOP/SIGCONT, as `runtime up` does;
- partition, links: a pserver's host puts a `FaultProxy` at the pserver's endpoint and has the
  pserver serve behind it on a loopback port. Every trainer-pserver link passes exactly one such
  proxy, its pserver's, seeded as `runtime up` seeds it (the scenario's seed, the trainer, the
  pserver): each link gets the fates it gets under `runtime up`. A trainer's host does nothing
  for them.

Triggers: ``at: 1.5s`` counts from when this host started its node; ``at: "step N"`` fires when
this node reports N steps done on its progress channel: a trainer its steps, a pserver its
updates (`runtime.services.node` reports them when given a channel). In sync mode both count
the same steps; in the asynchronous modes a pserver's updates run ahead of any one trainer's
steps.

With ``--keys`` the proxy is a `runtime.faults.curve_proxy.CurveFaultProxy` with the pserver's
own keys (this host holds them): the job stays encrypted and authenticated, the trainers'
hosts unchanged. The supervisor's exit status is its node's: 0 when its last process finished,
or when a fault killed it for good (the other nodes and ``runtime collect`` judge the job);
else 1.

What it did it says on stderr as it goes and, with ``--out``, writes when its node is done
(failed or interrupted too) beside the node's record: ``nodes/<role>-<index>.faults.json``
(`FAULTS_SUFFIX`), a `runtime.config.metrics.NodeFaults` holding the events of the faults that
concern its node, as ``runtime up`` lists them (`runtime.faults.inject.metrics_events`), and its
fault proxy's counters per connection (`runtime.launch.launcher.proxy_metrics`). ``runtime
collect`` merges every host's into metrics.json's ``faults`` and ``proxies``
(`runtime.launch.collect.merge_faults`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from runtime.config.faults import AnyFault, LinkFaults, Partition
from runtime.config.metrics import NodeFaults, write_record
from runtime.config.nodes import (is_pserver, node_file_stem, node_names, pserver_name,
                                  trainer_name)
from runtime.config.outdir import claim_output
from runtime.config.scenario import Scenario
from runtime.faults.curve_proxy import CurveFaultProxy
from runtime.faults.inject import RuntimeTarget, metrics_events
from runtime.faults.proxy import FaultProxy
from runtime.launch.launcher import (Display, Launcher, NodeRun, free_endpoints, node_command,
                                     node_environment, proxy_metrics)
from runtime.services.node import (ALONE_VAR, NodeOptions, Role, RoleError, node_keys, run_async,
                                   run_role)

PROXY_HOST = "127.0.0.1"
"""Where a pserver behind its host's fault proxy serves: only the proxy reaches it."""
FAULTS_SUFFIX = ".faults.json"
"""``nodes/<role>-<index>.faults.json``: what a node's supervisor did of the faults."""


def concerns(fault: AnyFault, node: str, scenario: Scenario) -> bool:
    """Whether `fault` has anything for `node`'s host to do: a crash or slowdown of it, or, for
    a pserver, a partition or link rule that acts on one of its links."""
    cluster = scenario.cluster
    if isinstance(fault, (Partition, LinkFaults)):
        if not is_pserver(node):
            return False
        trainers = [trainer_name(i) for i in range(cluster.trainers)]
        if isinstance(fault, Partition):
            return any(fault.cuts(t, node) for t in trainers)
        return any(fault.matches(t, node) for t in trainers)
    return node in fault.nodes(node_names(cluster.pservers, cluster.trainers))


def message_faults(scenario: Scenario) -> list[int]:
    """The indexes of the scenario's faults that act on trainer-pserver messages."""
    pservers = [pserver_name(j) for j in range(scenario.cluster.pservers)]
    return [i for i, f in enumerate(scenario.faults)
            if isinstance(f, (Partition, LinkFaults))
            and any(concerns(f, p, scenario) for p in pservers)]


class RoleDisplay:
    """What the supervisor says, on stderr: the faults as they fire and end, the restarts (the
    node's own output, progress lines included, goes to stdout as it comes)."""

    def __init__(self, node: str) -> None:
        self.node = node

    def message(self, text: str) -> None:
        print(f"[runtime up --role {self.node}] {text}", file=sys.stderr, flush=True)

    def progress(self, node: NodeRun) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class RoleLauncher(Launcher):
    """`runtime up`'s launcher of one node, `role`, acting out the faults that concern it
    (see the module doc). `out` is unused: the node writes under `node_out`, if any."""

    role: Role | None = None
    node_out: Path | None = None
    proxy: FaultProxy | None = None
    """The fault proxy at this pserver's endpoint, for the scenario's message faults."""
    keys: Path | None = None
    ipc: Path | None = None

    def __post_init__(self) -> None:
        assert self.role is not None
        self.binds = self.binds or list(self.endpoints)
        self.proxies = [self.proxy] if self.proxy is not None else []
        self.security = (["--keys", str(self.keys)] if self.keys is not None
                         else ["--ipc", str(self.ipc)] if self.ipc is not None else ["--insecure"])
        stdout = open(sys.stdout.fileno(), "w", buffering=1, closefd=False)
        self.nodes = [NodeRun(self.role.role, self.role.index, stdout)]
        self._display: Display | None = None

    def _fault_target(self, display: Display) -> RuntimeTarget:
        assert self.role is not None
        return RuntimeTarget(self, self._proxies(), self.scenario.cluster.trainers,
                             display.message, own=self.role.name)

    def _command(self, node: NodeRun, life: int) -> list[str]:
        return node_command(self.scenario_path, self.overrides, node.role, node.index,
                            self.endpoints, self.node_out, self._flags(node, life))

    def _environment(self) -> dict[str, str]:
        return node_environment() | {ALONE_VAR: "1"}

    def _reports(self, node: NodeRun) -> bool:
        return True  # a pserver too: its updates trigger the faults at a step on its host

    def _proxies(self) -> dict[int, FaultProxy]:
        assert self.role is not None
        return {self.role.index: self.proxy} if self.proxy is not None else {}

    def node_faults(self) -> NodeFaults:
        """What this host did of the faults: the events of those that concern its node (the
        schedule lists every fault it fired, others' included) and its proxy's counters."""
        assert self.role is not None
        own = self.role.name
        events = self.injector.events if self.injector is not None else []
        mine = [e for e in events if concerns(self.scenario.faults[e.fault], own, self.scenario)]
        proxies = proxy_metrics(self._proxies())
        return NodeFaults(own, metrics_events(mine), proxies[0] if proxies else None)

    def write_faults(self) -> Path | None:
        """Write `node_faults` beside the node's record (with ``--out``); where."""
        if self.node_out is None or self.role is None:
            return None
        stem = node_file_stem(self.role.role, self.role.index)
        path = self.node_out / "nodes" / f"{stem}{FAULTS_SUFFIX}"
        write_record(path, self.node_faults())
        return path


def role_launcher(scenario_path: Path, overrides: list[str], scenario: Scenario, role: Role,
                  out: Path | None, options: NodeOptions) -> RoleLauncher | None:
    """The supervisor of `role`'s node, or None when no fault concerns it (then it runs in the
    foreground as it always did). `RoleError` when a pserver's proxy has no endpoint."""
    own = role.name
    messages = message_faults(scenario)
    if not any(concerns(f, own, scenario) for f in scenario.faults):
        return None
    cluster = scenario.cluster
    listed = (cluster.endpoints or {}).get("pservers") or []
    endpoints = list(role.endpoints or listed)
    proxy = None
    binds: list[str] = []
    if role.role == "pserver" and any(i in messages and concerns(scenario.faults[i], own, scenario)
                                      for i in range(len(scenario.faults))):
        if not endpoints:
            raise RoleError(f"{own}: message faults need the pserver endpoints (--endpoints)")
        if options.ipc is not None:
            raise RoleError(f"{own}: message faults put a TCP proxy in front of the pserver; "
                            "they do not combine with --ipc (give --keys)")
        (bind,) = free_endpoints(PROXY_HOST, 1)
        binds = list(endpoints)
        binds[role.index] = bind
        proxy = FaultProxy(listen=endpoints[role.index], upstream=bind, seed=scenario.seed,
                           upstream_name=own)
        if options.keys is not None:
            proxy = CurveFaultProxy.like(proxy, node_keys(
                options.keys, "pserver", role.index, cluster.trainers, endpoints, relay=True))
    # the child reads the scenario again: give it the cluster size the role implied
    sized = [*overrides, f"cluster.trainers={cluster.trainers}"]
    return RoleLauncher(scenario_path, sized, scenario, endpoints, Path("."), binds=binds,
                        role=role, node_out=out, proxy=proxy, keys=options.keys, ipc=options.ipc)


def run_node(scenario_path: Path, overrides: list[str], scenario: Scenario, role: Role,
             out: Path | None, options: NodeOptions) -> int:
    """``runtime up --role``: run `role`'s node, under a `RoleLauncher` when faults concern it;
    its exit status. Its output folder `out`, if any, is claimed for the run
    (`runtime.config.outdir`), its node's part of it: the nodes of a job may share one.
    `OutputDirError` when it cannot be used, or another run holds it or this node's part."""
    if out is None:
        return _run_node(scenario_path, overrides, scenario, role, None, options, ())
    with claim_output(out, node=node_file_stem(role.role, role.index)) as claim:
        return _run_node(scenario_path, overrides, scenario, role, out, options, claim.fds)


def _run_node(scenario_path: Path, overrides: list[str], scenario: Scenario, role: Role,
              out: Path | None, options: NodeOptions, inherit: tuple[int, ...]) -> int:
    """`run_node`; `inherit`: descriptors its node's process holds (the folder's lock)."""
    manual = options.bind is not None or options.recover or options.incarnation
    launcher = None if manual else role_launcher(scenario_path, overrides, scenario, role, out,
                                                  options)
    if launcher is None:
        return run_role(scenario, role, out, options)
    launcher.inherit = inherit
    display = RoleDisplay(role.name)
    for i, fault in enumerate(scenario.faults):
        if concerns(fault, role.name, scenario):
            display.message(f"faults[{i}] acted out on this host: {fault.describe()}")
    _, failure = run_async(launcher.run(display))
    node = launcher.nodes[0]
    if launcher.proxy is not None:
        for direction, counters in launcher.proxy.counters.items():
            display.message(f"fault proxy {direction.name.lower()}: {counters}")
    written = launcher.write_faults()
    if written is not None:
        display.message(f"faults acted out: {written}")
    if failure is not None:
        display.message(f"failed: {failure.reason}")
        return 128 + failure.signal if failure.signal is not None else 1
    if node.killed:
        display.message(f"{role.name} was killed for good by a fault")
        return 0
    return node.exit_code or 0
