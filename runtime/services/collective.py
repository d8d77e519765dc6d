"""The collective ops of nccl2 and collective modes, run by a trainer over its own transport.

There are no pservers: trainers form rings and pass each other the pieces of each op, as
`Kind.COLLECTIVE` messages (`runtime.network.wire`) that answer no request. In a ring of
``nranks`` trainers, rank r sends only to rank r+1 (its *next*, whose endpoint it connects to)
and hears only from rank r-1, so the same code runs over ZeroMQ and the simulated network. (A real run may carry the same ops
over torch.distributed instead: `runtime.services.collective_torch`, `collective.backend:
torch`; both are a `Collective`.)

- ``c_gen_nccl_id`` / ``gen_nccl_id`` (startup): the rendezvous. Every rank binds its endpoint
  and connects to its next; rank 0 makes the ring's id and passes it round the ring, which it
  comes back to rank 0 through rank n-1, so every rank has seen its predecessors join.
  ``gen_nccl_id`` (nccl2) does this for each of ``nccl_comm_num`` rings and opens them;
  hierarchical all-reduce runs as one flat ring.
- ``c_comm_init``: open the ring (`Ring`) whose id the rendezvous wrote.
- ``c_comm_init_all`` (``collective_mode: single_process_multi_thread``): open ring
  ``ring_id`` over the devices of this process, without a rendezvous. A trainer process
  computes on one device, so the ring has one rank, this trainer, and its all-reduce hands X
  back as it is. The mode never connects processes: in a job of several trainer processes
  (`Collective.trainer_endpoints`) it fails naming the mode rather than let each trainer train
  alone on a loss scaled for all of them.
- ``c_allreduce_sum``: the ring all-reduce. X is cut into ``nranks`` chunks; reduce-scatter
  (n-1 steps: send chunk (r-s) mod n, add what comes from the previous rank to chunk
  (r-s-1) mod n), then all-gather (n-1 steps passing the reduced chunks on). Each link carries
  2(n-1)/n of X. A `SelectedRows` X is all-gathered instead: the rows of every rank, in rank
  order. The op runs in the background: an op that reads Out waits for it (like `recv`'s).
- ``c_broadcast``: root's value passed round the ring.
- ``c_sync_calc_stream``, ``c_sync_comm_stream``: no-ops (no streams here: an op that reads a
  value waits for the collective that writes it).

Messages are matched by tag ``(ring, seq, part)``: every rank runs the same ops in the same order,
so the ``seq``-th collective op of a ring is the same op on every rank; they may arrive before
their receiver waits for them. A receive that waits longer than ``timeout`` (the job's
`train.request_timeout`) fails naming the ring, the rank and the neighbour it waited for.

DESIGN: summation order. Chunk c is summed in ring order starting at rank c,
``((x_c + x_{c+1}) + ...) + x_{c-1}``, and the all-gather hands every rank that one sum: the
result is the same on every rank and from run to run, bit for bit. It is not trainer order for
c > 0 (float addition is not associative), so with 3 or more trainers it can differ from a
pserver's ``sum`` of the same grads in the last bits; neither equals local training bit for bit
anyway, where one kernel sums the whole batch (docs/architecture.md, "Collective modes").
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np

from transpiler.distribute.config import SINGLE_PROCESS_MULTI_THREAD as SINGLE_PROCESS
from transpiler.ir import Op

from runtime.execution.scope import Scope
from runtime.execution.tensor import Phantom, SelectedRows, Value, shape_of, to_dense
from runtime.network.rpc import RpcClient
from runtime.execution.costs import SENDS
from runtime.network.wire import Kind, Message, charged_size, encode

log = logging.getLogger(__name__)

Tag = tuple[int, int, int]
"""(ring, seq, part) of a collective message."""

RENDEZVOUS = -1
"""The seq of a ring's id exchange (its ops count from 0)."""


class CollectiveError(RuntimeError):
    """A collective op that cannot go on: a timeout, or ranks that disagree."""


@dataclass
class Ring:
    """One communicator: this trainer's rank among `endpoints` (every rank's, in rank order)."""

    ring_id: int
    rank: int
    endpoints: tuple[str, ...]
    comm_id: str
    seq: itertools.count = field(default_factory=itertools.count)
    """Numbers this ring's ops in program order, the same on every rank."""
    local: bool = False
    """Opened by c_comm_init_all: this process's devices only (one rank), no peers."""

    @property
    def nranks(self) -> int:
        return len(self.endpoints)

    @property
    def next(self) -> str:
        return self.endpoints[(self.rank + 1) % self.nranks]

    def describe(self) -> str:
        """``ring <id> (rank r of n: rank 0 at <endpoint>, ...)``, for errors."""
        ranks = ", ".join(f"rank {i} at {ep}" for i, ep in enumerate(self.endpoints))
        return f"ring {self.ring_id} (rank {self.rank} of {self.nranks}: {ranks})"

    def neighbour(self, offset: int) -> str:
        """``rank <r> (<endpoint>)`` of the rank `offset` from this one, for errors."""
        r = (self.rank + offset) % self.nranks
        return f"rank {r} ({self.endpoints[r]})"


class Collective(ABC):
    """The collective ops of one trainer named `name`, as its `RpcOps` runs them: the rings it
    is in, the setup ops every backend shares around its own `_rendezvous`, and the ops each
    backend carries its way. Backends: the ring over the trainer's transport (`CollectiveOps`)
    and torch.distributed (`runtime.services.collective_torch.TorchCollectiveOps`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rings: dict[int, Ring] = {}
        self._joined: dict[int, Ring] = {}  # rendezvous done, c_comm_init not yet
        self.step = 0
        """The trainer's step, for messages and errors."""
        self.trainer_endpoints: tuple[str, ...] = ()
        """Every trainer process's endpoint, where the job's programs say (their
        ``_trainers_endpoints``; `Trainer` sets it): c_comm_init_all refuses a job of several."""

    def handlers(self) -> dict[str, Callable[[Op, Scope], Awaitable[Any]]]:
        """The ops that run whole before the next op (see `allreduce` for the one that does
        not)."""
        return {"c_gen_nccl_id": self.gen_comm_id, "c_comm_init": self.comm_init,
                "c_comm_init_all": self.comm_init_all,
                "gen_nccl_id": self.gen_nccl_id, "c_broadcast": self.broadcast,
                "c_sync_calc_stream": no_op, "c_sync_comm_stream": no_op}

    @abstractmethod
    async def _rendezvous(self, ring_id: int, rank: int, endpoints: tuple[str, ...]) -> Ring:
        """Meet the other ranks of ring `ring_id` (this one `rank` among `endpoints`)."""

    @abstractmethod
    async def broadcast(self, op: Op, scope: Scope) -> None:
        """c_broadcast: every rank's Out becomes rank ``root``'s X."""

    @abstractmethod
    def allreduce(self, op: Op, scope: Scope) -> asyncio.Task[None]:
        """c_allreduce_sum, started now with X as it is now; the task puts the sum in Out."""

    @abstractmethod
    async def finish(self) -> None:
        """The job's steps are done on this trainer: take leave of the other ranks."""

    @abstractmethod
    def close(self) -> None:
        """Release what is held (after `finish`, or on a failure)."""

    async def gen_comm_id(self, op: Op, scope: Scope) -> None:
        """c_gen_nccl_id: the rendezvous of ring ``ring_id``; Out holds its id."""
        rank, others = int(op.attr("rank")), list(op.attr("other_endpoints"))
        endpoints = tuple(others[:rank] + [op.attr("endpoint")] + others[rank:])
        ring = await self._rendezvous(int(op.attr("ring_id")), rank, endpoints)
        self._joined[ring.ring_id] = ring
        scope.put(op.output("Out")[0], np.array(ring.comm_id))

    async def comm_init(self, op: Op, scope: Scope) -> None:
        """c_comm_init: open the ring whose id X holds, as ``nranks`` and ``rank`` say."""
        ring_id = int(op.attr("ring_id"))
        ring = self._joined.pop(ring_id, None)
        comm_id = str(scope.get(op.input("X")[0]))
        if ring is None or ring.comm_id != comm_id:
            raise CollectiveError(f"{self.name}: c_comm_init of ring {ring_id}: no "
                                  f"c_gen_nccl_id made id {comm_id!r} before it")
        if (int(op.attr("nranks")), int(op.attr("rank"))) != (ring.nranks, ring.rank):
            raise CollectiveError(f"{self.name}: c_comm_init of ring {ring_id}: nranks "
                                  f"{op.attr('nranks')}, rank {op.attr('rank')}, but the ring "
                                  f"has {ring.nranks} ranks and this is rank {ring.rank}")
        self.rings[ring_id] = ring

    async def comm_init_all(self, op: Op, scope: Scope) -> None:
        """c_comm_init_all: open ring ``ring_id`` over this process's devices, one rank."""
        ring_id = int(op.attr("ring_id", 0))
        if len(self.trainer_endpoints) > 1:
            raise CollectiveError(
                f"{self.name}: c_comm_init_all of ring {ring_id}: collective_mode "
                f"{SINGLE_PROCESS} opens a ring over one process's own devices and never "
                f"connects processes, but this job has {len(self.trainer_endpoints)} trainer "
                f"processes ({', '.join(self.trainer_endpoints)}): run it with 1 trainer, or use "
                "collective_mode grad_allreduce")
        if ring_id in self.rings:
            raise CollectiveError(f"{self.name}: c_comm_init_all: ring {ring_id} is open already")
        self.rings[ring_id] = Ring(ring_id, 0, (self.name,), f"ring{ring_id}:{self.name}:local",
                                   local=True)

    async def gen_nccl_id(self, op: Op, scope: Scope) -> None:
        """gen_nccl_id (nccl2): the rendezvous of each of ``nccl_comm_num`` rings, opened at
        once; each NCCLID var holds its ring's id (the hierarchical ones ring 0's: pslab runs
        hierarchical all-reduce as one flat ring)."""
        endpoints, rank = tuple(op.attr("trainers")), int(op.attr("trainer_id"))
        for ring_id in range(int(op.attr("nccl_comm_num"))):
            self.rings[ring_id] = await self._rendezvous(ring_id, rank, endpoints)
        for slot in ("NCCLID", "InterNCCLID", "ExterNCCLID"):
            for i, name in enumerate(op.output(slot)):
                ring = self.rings[i if slot == "NCCLID" else 0]
                scope.put(name, np.array(ring.comm_id))

    def ring(self, op: Op) -> Ring:
        """The open ring of `op` (its ``ring_id``), checked against its ``nranks``."""
        ring_id = int(op.attr("ring_id", 0))
        ring = self.rings.get(ring_id)
        if ring is None:
            raise CollectiveError(f"{self.name}: {op.type}: ring {ring_id} is not open "
                                  "(its c_comm_init or gen_nccl_id has not run)")
        nranks = op.attr("nranks", None)
        if nranks is not None and int(nranks) != ring.nranks:
            local = (f" (c_comm_init_all opened it over this process only: collective_mode "
                     f"{SINGLE_PROCESS} never connects trainer processes)" if ring.local else "")
            raise CollectiveError(f"{self.name}: {op.type}: nranks {nranks}, but ring "
                                  f"{ring_id} has {ring.nranks} ranks{local}")
        return ring


class Mailbox:
    """Collective messages by tag, and the receivers waiting for them."""

    def __init__(self) -> None:
        self._arrived: dict[Tag, Message] = {}
        self._waiting: dict[Tag, asyncio.Future[Message]] = {}

    def deliver(self, tag: Tag, msg: Message) -> None:
        waiter = self._waiting.pop(tag, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)
        elif tag in self._arrived:
            log.warning("dropping a second collective message tagged %s from %s", tag, msg.src)
        else:
            self._arrived[tag] = msg

    async def take(self, tag: Tag, timeout: float, what: Callable[[], str]) -> Message:
        msg = self._arrived.pop(tag, None)
        if msg is not None:
            return msg
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[tag] = waiter
        try:
            return await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise CollectiveError(f"{what()}: nothing came in {timeout:g}s") from None
        finally:
            self._waiting.pop(tag, None)


class CollectiveOps(Collective):
    """The collective ops of one trainer, over its RPC client's transport."""

    def __init__(self, client: RpcClient, timeout: float) -> None:
        super().__init__(client.name)
        self.client = client
        self.timeout = timeout
        self._bound: str | None = None
        self._mail = Mailbox()
        self._ids = itertools.count(1)
        client.peer_messages = self._on_message

    # -- messages ---------------------------------------------------------------------------------
    def _on_message(self, peer: str, msg: Message) -> None:
        tag = msg.extra.get("coll")
        if not (isinstance(tag, list) and len(tag) == 3
                and all(type(t) is int for t in tag)):
            log.warning("%s: dropping a collective message from %s without a [ring, seq, part] "
                        "tag: %r", self.client.name, peer, tag)
            return
        self._mail.deliver((tag[0], tag[1], tag[2]), msg)

    async def _send(self, endpoint: str, tag: Tag, value: Value | None,
                    extra: dict[str, Any] | None = None) -> None:
        meter = self.client.meter
        started = 0.0 if meter is None else meter.start()
        msg = Message(Kind.COLLECTIVE, next(self._ids), self.client.name, self.step,
                      {} if value is None else {"x": value}, {"coll": list(tag), **(extra or {})})
        frames = encode(msg)
        transport = self.client.transport
        sent = transport.send_nowait(endpoint, frames)
        if meter is not None:  # the message's own cost, as a request's (`RpcClient.start`)
            meter.stop_message(started, SENDS, Kind.COLLECTIVE.value, charged_size(frames))
        if not sent:
            await transport.send(endpoint, frames)

    async def _take(self, ring: Ring, tag: Tag, what: str) -> Message:
        return await self._mail.take(tag, self.timeout, lambda: (
            f"{self.client.name}: ring {ring.ring_id} rank {ring.rank}: {what} (seq {tag[1]}, "
            f"part {tag[2]}) from {ring.neighbour(-1)}"))

    # -- setup ------------------------------------------------------------------------------------
    async def _rendezvous(self, ring_id: int, rank: int, endpoints: tuple[str, ...]) -> Ring:
        """Bind this rank's endpoint, connect to the next, pass the ring's id round."""
        if not 0 <= rank < len(endpoints) or len(set(endpoints)) != len(endpoints):
            raise CollectiveError(f"{self.client.name}: ring {ring_id}: rank {rank} of "
                                  f"endpoints {list(endpoints)} (distinct, one per rank)")
        own = endpoints[rank]
        if self._bound is None:
            await self.client.transport.bind(own)
            self._bound = own
        elif self._bound != own:
            raise CollectiveError(f"{self.client.name}: ring {ring_id} puts rank {rank} at "
                                  f"{own}, but it serves {self._bound}")
        ring = Ring(ring_id, rank, endpoints, "")
        if ring.nranks == 1:
            ring.comm_id = f"ring{ring_id}:{own}"
            return ring
        await self.client.connect([ring.next])
        tag = (ring_id, RENDEZVOUS, 0)
        if rank == 0:
            ring.comm_id = f"ring{ring_id}:{','.join(endpoints)}"
            await self._send(ring.next, tag, None, {"comm_id": ring.comm_id,
                                                    "endpoints": list(endpoints)})
        msg = await self._take(ring, tag, "the ring's id")
        if msg.extra.get("endpoints") != list(endpoints):
            raise CollectiveError(f"{self.client.name}: ring {ring_id}: {ring.neighbour(-1)} "
                                  f"has endpoints {msg.extra.get('endpoints')}, this rank "
                                  f"{list(endpoints)}")
        ring.comm_id = str(msg.extra.get("comm_id"))
        if rank != 0:
            await self._send(ring.next, tag, None, dict(msg.extra))
        return ring

    async def finish(self) -> None:
        """The job's steps are done (nothing to tear down: the transport is the trainer's)."""

    def close(self) -> None:
        """Nothing to release."""

    # -- the ops ----------------------------------------------------------------------------------
    async def broadcast(self, op: Op, scope: Scope) -> None:
        """c_broadcast: every rank's Out becomes rank ``root``'s X."""
        ring = self.ring(op)
        root, value = int(op.attr("root", 0)), scope.get(op.input("X")[0])
        tag = (ring.ring_id, next(ring.seq), 0)
        if ring.rank != root:
            value = _owned(_only(await self._take(ring, tag, f"c_broadcast from root {root}")))
        if ring.nranks > 1 and (ring.rank + 1) % ring.nranks != root:
            await self._send(ring.next, tag, value)
        scope.put(op.output("Out")[0], value)

    def allreduce(self, op: Op, scope: Scope) -> asyncio.Task[None]:
        """c_allreduce_sum, started now on the op's ring with X as it is now; the task puts the
        sum in Out."""
        ring = self.ring(op)
        seq = next(ring.seq)
        value, out = scope.get(op.input("X")[0]), op.output("Out")[0]
        if isinstance(value, SelectedRows) or (isinstance(value, Phantom)
                                               and value.height is not None):
            work = self._allgather_rows(ring, seq, value)
        else:
            work = self._ring_allreduce(ring, seq, value)

        async def reduce() -> None:
            scope.put(out, await work)

        return asyncio.get_running_loop().create_task(reduce())

    async def _ring_allreduce(self, ring: Ring, seq: int, value: Value) -> Value:
        n, r = ring.nranks, ring.rank
        if n == 1:
            return value
        shape = shape_of(value)
        spans = list(itertools.pairwise(_bounds(int(np.prod(shape)), n)))
        phantom = isinstance(value, Phantom)
        chunks: list[Any]
        if isinstance(value, Phantom):
            chunks = [Phantom((b - a,), value.dtype) for a, b in spans]
        else:
            flat = to_dense(value).reshape(-1)
            chunks = [flat[a:b] for a, b in spans]
        for s in range(n - 1):  # reduce-scatter: chunk c is summed from rank c on
            await self._send(ring.next, (ring.ring_id, seq, s), chunks[(r - s) % n])
            got = _only(await self._take(ring, (ring.ring_id, seq, s), "c_allreduce_sum"))
            c = (r - s - 1) % n
            chunks[c] = chunks[c] if phantom else to_dense(got) + chunks[c]
        for s in range(n - 1):  # all-gather: each rank's reduced chunk, passed on
            part = (ring.ring_id, seq, n - 1 + s)
            await self._send(ring.next, part, chunks[(r + 1 - s) % n])
            got = _only(await self._take(ring, part, "c_allreduce_sum"))
            chunks[(r - s) % n] = got if phantom else to_dense(got)
        if phantom:
            return value
        return np.concatenate(chunks).reshape(shape)

    async def _allgather_rows(self, ring: Ring, seq: int, value: Value) -> Value:
        """A SelectedRows X: every rank's rows and values, concatenated in rank order."""
        n, r = ring.nranks, ring.rank
        pieces: dict[int, Any] = {r: value}
        for s in range(n - 1):
            tag = (ring.ring_id, seq, s)
            await self._send(ring.next, tag, pieces[(r - s) % n])
            pieces[(r - s - 1) % n] = _only(await self._take(ring, tag, "c_allreduce_sum"))
        ordered = [pieces[i] for i in range(n)]
        if isinstance(value, Phantom):
            rows = sum(p.shape[0] for p in ordered)
            return Phantom((rows,) + value.shape[1:], value.dtype, value.height)
        assert isinstance(value, SelectedRows)
        return SelectedRows(np.concatenate([np.asarray(p.rows) for p in ordered]),
                            np.concatenate([np.asarray(p.values) for p in ordered]),
                            value.height)


async def no_op(op: Op, scope: Scope) -> None:
    """c_sync_calc_stream, c_sync_comm_stream: an op that reads a value waits for the
    collective that writes it, so there are no streams to synchronize."""
    return None


def _bounds(size: int, parts: int) -> list[int]:
    """Where `parts` near-equal chunks of `size` elements start, and the end."""
    base, extra = divmod(size, parts)
    return [i * base + min(i, extra) for i in range(parts + 1)]


def _only(msg: Message) -> Value:
    return msg.vars["x"]


def _owned(value: Value) -> Value:
    """A received value as one of its own (decoded arrays view the frames)."""
    if isinstance(value, Phantom):
        return value
    if isinstance(value, SelectedRows):
        return SelectedRows(np.array(value.rows), np.array(value.values), value.height)
    return np.array(to_dense(value))
