"""A whole job in one process over loopback ZeroMQ, secured as a job of separate processes is.

`runtime up` checks ``expect.params_equal_to: fault_free`` against the same job without its
faults, run here as tasks of one event loop (`runtime.services.cluster.run_job`) whose nodes
talk ZeroMQ over loopback. Its pservers listen on real TCP ports of the host like a job's, so
they speak CurveZMQ as a job's do: every node gets a keypair made afresh for this run, in
memory (`fresh_keys`), never written to disk, and a pserver admits only this run's trainers'
keys, each under its own trainer's name. Nobody but this process holds a key, so no other user
of the host can send the reference run a message (a GET as ``trainer:0``, say) or read one.
Its pservers also take their inbound limits (`runtime.services.inbound`), as a job's do.

DESIGN: ZeroMQ over loopback rather than an in-memory transport (the simulator's): the
reference is the same code path as a job of separate processes, which in sync mode computes
the same parameters bit for bit, and keys that live only in this process leave nothing to
guard on disk.
"""

from __future__ import annotations

from collections.abc import Mapping

import zmq

from runtime.config.nodes import parse_node, pserver_name, trainer_name
from runtime.network.curve import CurveKeys
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import TransportFactory
from runtime.services.inbound import pserver_inbound_limits
from runtime.services.job import Job


def fresh_keys(job: Job) -> dict[str, CurveKeys]:
    """A fresh CURVE keypair for every node of `job`, by node name, with the keys each admits
    and trusts: a pserver admits every trainer's key under its name, a trainer knows each
    pserver's key by endpoint; in the nccl2 and collective modes each trainer serves the other
    trainers and connects to them, at their `Job.peers` endpoints."""
    trainers = {trainer_name(i): zmq.curve_keypair() for i in range(job.trainers)}
    if job.collective:
        return {name: _peer_keys(name, trainers, job.peers) for name in trainers}
    pservers = {pserver_name(j): zmq.curve_keypair() for j in range(len(job.endpoints))}
    clients = {public: name for name, (public, _) in trainers.items()}
    servers = {endpoint: pservers[pserver_name(j)][0] for j, endpoint in enumerate(job.endpoints)}
    keys = {name: CurveKeys(public, secret, clients=clients)
            for name, (public, secret) in pservers.items()}
    keys.update({name: CurveKeys(public, secret, servers=servers)
                 for name, (public, secret) in trainers.items()})
    return keys


def _peer_keys(name: str, pairs: Mapping[str, tuple[bytes, bytes]],
               endpoints: list[str]) -> CurveKeys:
    """Trainer `name`'s keys in a ring mode: every other trainer is its client and server."""
    others = [(i, other) for i, other in enumerate(pairs) if other != name]
    public, secret = pairs[name]
    return CurveKeys(public, secret, clients={pairs[other][0]: other for _, other in others},
                     servers={endpoints[i]: pairs[other][0] for i, other in others})


def zmq_transports(job: Job, keys: Mapping[str, CurveKeys] | None) -> TransportFactory:
    """A `run_job` transport factory: each node's `ZmqTransport` with its `keys` (None: plain),
    a pserver's with its inbound limits."""

    def transport_for(name: str) -> ZmqTransport:
        role, index = parse_node(name)
        limits = (pserver_inbound_limits(job, index).zmq_limits()
                  if role == "pserver" else None)
        return ZmqTransport(name, limits, curve=None if keys is None else keys[name])

    return transport_for
