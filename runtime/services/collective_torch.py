"""The collective ops of nccl2 and collective modes over torch.distributed (`collective.backend:
torch`): NCCL where the trainers compute on GPUs, gloo on CPUs.

The same ops as `runtime.services.collective` (the ring over the runtime's transport), with
torch.distributed's process groups in place of rings:

- ``c_gen_nccl_id`` / ``gen_nccl_id`` (startup): the rendezvous. Ring 0 is the default process
  group, `dist.init_process_group` with ``init_method tcp://<rank 0's endpoint>`` (rank 0 serves
  the TCPStore there), world size the ring's ranks (the trainers), rank the trainer's id; each
  further ring (``nccl_comm_num``, ``ring_id`` > 0) is a `dist.new_group` of every rank, a
  communicator of its own. Out (each NCCLID var) holds the ring's id.
- ``c_comm_init``: open the ring the rendezvous made (checked as the ring backend checks it).
- ``c_comm_init_all``: ring ``ring_id`` of one rank, this process (the base class's); its
  all-reduce and broadcast hand X back without a process group.
- ``c_allreduce_sum``: `dist.all_reduce` (SUM) into a tensor of the op's own, started when the op
  runs with X as it is then; the sum lands in Out in the background, and an op that reads Out
  waits for it (as for the ring). A SelectedRows X is all-gathered, every rank's rows and values
  in rank order, as the ring does (the row counts first, then the rows padded to the most).
- ``c_broadcast``: `dist.broadcast` from ``root``.
- ``c_sync_calc_stream``, ``c_sync_comm_stream``: no-ops.

Values cross at the edge: a numpy X becomes a tensor with `torch.from_numpy` (a view, then the
one copy the op writes into; on a GPU one upload), and a numpy X gets a numpy Out (a view of the
result on the CPU); a torch X (the scope of torch kernels, on the CPU or a GPU) is reduced as a
tensor on its device and Out is one. The scope's values are never written in place (`Scope`'s
rule): X may share memory with other vars.

The backend (`process_group_backend`): ``auto`` is NCCL when the trainers' device
(`backend.device`) is cuda, a GPU is there and torch has NCCL, else gloo; ``nccl`` without a GPU
(or without NCCL in torch) fails naming what is missing. Every torch.distributed call fails
after the job's `train.request_timeout` (the process group's timeout); a failure is a
`CollectiveError` naming this rank, the ring's ranks and endpoints and, for the rendezvous,
whom it waited for (rank 0's TCPStore, or the ranks that did not join). With NCCL an op only
enqueues on NCCL's stream (the default stream waits for it), and a collective that never
completes is ended by NCCL's watchdog after the same timeout, which ends the process.

Security: torch.distributed's store and gloo's (NCCL's) connections are neither authenticated
nor encrypted; the job's CurveZMQ keys do not cover them (the rendezvous logs a warning).

DESIGN: one thread for torch.distributed. Its calls block (gloo's until the op is done), and
every rank must make them in the same order. The ops are queued, in program order, to one
daemon thread that makes them one after the other; the event loop goes on with the compute
meanwhile (gloo and NCCL release the GIL), as the ring's background all-reduce lets it. Issuing
from the loop and waiting in threads would lose the order as soon as one op needs two calls (the
SelectedRows gather: the counts, then the rows). The thread is a daemon so that a trainer failing
while a call waits for a dead peer exits at once, not at the timeout; at a clean end `finish`
holds a barrier (no rank tears down sockets a peer still reads) and destroys the process group.

DESIGN: summation order is torch's (gloo's ring or NCCL's algorithms), not the ring backend's
documented one: with 2 trainers both add the same two numbers, so they agree bit for bit; with
more they agree to float rounding.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import queue
import threading
from typing import Any, Callable, TypeVar

import numpy as np

try:
    import torch
    import torch.distributed as dist
except ModuleNotFoundError as exc:  # pragma: no cover - exercised with torch hidden
    if exc.name != "torch":
        raise
    raise ImportError("collective.backend torch needs PyTorch, which is not installed: "
                      "pip install 'pslab[torch]'") from exc

from transpiler.ir import Op

from runtime.execution.kernels.torch_common import from_host, resolve_device, to_host
from runtime.execution.scope import Scope
from runtime.execution.tensor import Phantom, SelectedRows, to_dense
from runtime.services.collective import Collective, CollectiveError, Ring

log = logging.getLogger(__name__)

T = TypeVar("T")

TORCH_BACKENDS = ("auto", "nccl", "gloo")
"""What `collective.torch_backend` may ask for."""


def process_group_backend(requested: str, device: torch.device, cuda_available: bool,
                          nccl_available: bool, gloo_available: bool = True) -> str:
    """torch.distributed's backend for a trainer computing on `device`: ``requested`` as it is,
    or for ``auto`` NCCL where `device` is a GPU that is there and torch has NCCL, else gloo.
    A backend that cannot run here is a `CollectiveError` saying what is missing."""
    if requested not in TORCH_BACKENDS:
        raise CollectiveError(f"collective.torch_backend {requested!r}: use one of "
                              f"{', '.join(TORCH_BACKENDS)}")
    gpu = device.type == "cuda" and cuda_available
    if requested == "auto":
        requested = "nccl" if gpu and nccl_available else "gloo"
    if requested == "nccl":
        if not cuda_available:
            raise CollectiveError(
                "collective.torch_backend nccl needs a GPU, but torch.cuda.is_available() is "
                f"False (torch {torch.__version__}): run on a machine with an NVIDIA GPU, "
                "driver and a CUDA build of torch, or use torch_backend gloo (or auto)")
        if device.type != "cuda":
            raise CollectiveError(f"collective.torch_backend nccl reduces GPU tensors, but the "
                                  f"trainers compute on {device}: set backend.device cuda "
                                  "(backend.kernels torch), or use torch_backend gloo")
        if not nccl_available:
            raise CollectiveError("collective.torch_backend nccl: this build of torch has no "
                                  "NCCL (torch.distributed.is_nccl_available() is False); use "
                                  "torch_backend gloo")
    elif not gloo_available:
        raise CollectiveError("collective.torch_backend gloo: this build of torch has no gloo "
                              "(torch.distributed.is_gloo_available() is False)")
    return requested


def backend_for(requested: str, device: torch.device) -> str:
    """`process_group_backend` for this machine and build of torch."""
    if not dist.is_available():
        raise CollectiveError(f"collective.backend torch: this build of torch "
                              f"({torch.__version__}) has no torch.distributed")
    return process_group_backend(requested, device, torch.cuda.is_available(),
                                 dist.is_nccl_available(), dist.is_gloo_available())


class OrderedCalls:
    """One daemon thread making blocking calls in the order they were queued; each call's
    result (or error) comes back to the event loop as a future."""

    def __init__(self, name: str, setup: Callable[[], None] | None = None) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = \
            queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, args=(setup,), name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """Queue `call` now (after every call queued before); its future, on the running loop."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._jobs.put((call, future))
        return future

    def stop(self) -> None:
        """No more calls: the thread ends after those queued."""
        self._jobs.put(None)

    def _work(self, setup: Callable[[], None] | None) -> None:
        broken: BaseException | None = None  # a failed setup fails every call
        try:
            if setup is not None:
                setup()
        except BaseException as exc:
            broken = exc
        while (job := self._jobs.get()) is not None:
            call, future = job
            loop = future.get_loop()
            result: Any = None
            error = broken
            try:
                if broken is None:
                    result = call()
            except BaseException as exc:  # handed to the awaiting op
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # its op was abandoned
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class TorchCollectiveOps(Collective):
    """The collective ops of one trainer (named `name`) over torch.distributed, computing on
    `device` (the trainer's `backend.device`, ``cuda:local`` resolved with `local_index`)."""

    def __init__(self, name: str, timeout: float, device: str = "cpu", local_index: int = 0,
                 requested: str = "auto") -> None:
        super().__init__(name)
        self.timeout = timeout
        self.device = resolve_device(device, local_index)
        self.backend = backend_for(requested, self.device)
        self.groups: dict[int, Any] = {}
        """ring id -> its process group (None: the default one)."""
        self._endpoints: tuple[str, ...] = ()
        self._rank = -1  # of the process group, once the first ring has joined it
        self._failed = False
        setup = None
        if self.device.type == "cuda":
            def setup() -> None:
                torch.cuda.set_device(self.device)
        self._calls = OrderedCalls(f"{name} torch.distributed", setup)

    async def _settled(self, future: asyncio.Future[T], what: Callable[[], str]) -> T:
        """`future`'s result; its failure a `CollectiveError` saying `what` it was."""
        try:
            return await future
        except Exception as exc:
            self._failed = True
            raise CollectiveError(f"{self.name}: {what()}: {type(exc).__name__}: "
                                  f"{_first_line(exc)}") from exc

    async def _call(self, call: Callable[[], T], what: Callable[[], str]) -> T:
        """`call` on the torch.distributed thread, after every call queued before it."""
        return await self._settled(self._calls.submit(call), what)

    # -- setup ------------------------------------------------------------------------------------
    async def _rendezvous(self, ring_id: int, rank: int, endpoints: tuple[str, ...]) -> Ring:
        """Ring `ring_id` and its process group: the default one for the first ring (the
        TCPStore at rank 0's endpoint), a new group of every rank for each further one."""
        if not 0 <= rank < len(endpoints) or len(set(endpoints)) != len(endpoints):
            raise CollectiveError(f"{self.name}: ring {ring_id}: rank {rank} of endpoints "
                                  f"{list(endpoints)} (distinct, one per rank)")
        if ring_id in self.groups:
            raise CollectiveError(f"{self.name}: ring {ring_id}: a second rendezvous")
        url = f"tcp://{endpoints[0]}"
        ring = Ring(ring_id, rank, endpoints, f"torch.distributed:{self.backend}:{url}:{ring_id}")
        timeout = datetime.timedelta(seconds=self.timeout)
        first = not self.groups
        if first:
            self._endpoints = endpoints
            log.warning("%s: the trainers' all-reduce runs over torch.distributed (%s, %s): its "
                        "traffic is neither authenticated nor encrypted (CurveZMQ keys do not "
                        "cover it); run it on a trusted network only", self.name, self.backend,
                        url)
        elif (endpoints, rank) != (self._endpoints, self._rank):
            raise CollectiveError(f"{self.name}: ring {ring_id} puts rank {rank} among "
                                  f"{list(endpoints)}, but the process group has rank "
                                  f"{self._rank} among {list(self._endpoints)}")
        self._rank = rank

        def join() -> Any:
            if not first:
                return dist.new_group(list(range(len(endpoints))), timeout=timeout,
                                      backend=self.backend)
            dist.init_process_group(self.backend, init_method=url, timeout=timeout,
                                    world_size=len(endpoints), rank=rank,
                                    device_id=self.device if self.backend == "nccl" else None)
            return None

        def what() -> str:
            waits = (f"the other {len(endpoints) - 1} rank(s) ({', '.join(endpoints[1:])}) to "
                     "join" if rank == 0 else f"rank 0's TCPStore at {endpoints[0]}")
            return (f"torch.distributed ({self.backend}) rendezvous of ring {ring_id} at {url} as "
                    f"rank {rank} of {len(endpoints)}, waiting up to {self.timeout:g}s for "
                    f"{waits}")

        self.groups[ring_id] = await self._call(join, what)
        return ring

    def _what(self, op: Op, ring: Ring) -> Callable[[], str]:
        return lambda: (f"{op.type} of {op.input('X')[0]} (step {self.step}) on "
                        f"{ring.describe()} over torch.distributed ({self.backend}, timeout "
                        f"{self.timeout:g}s)")

    # -- the ops ----------------------------------------------------------------------------------
    async def broadcast(self, op: Op, scope: Scope) -> None:
        """c_broadcast: every rank's Out becomes rank ``root``'s X."""
        ring = self.ring(op)
        root, value = int(op.attr("root", 0)), scope.raw(op.input("X")[0])
        if ring.local:  # c_comm_init_all's ring of one rank: X is root's
            scope.put(op.output("Out")[0], value)
            return
        tensor = _as_tensor(_dense(op, value), self.device)
        if ring.rank != root:
            tensor = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        group = self.groups[ring.ring_id]
        await self._call(lambda: dist.broadcast(tensor, root, group=group), self._what(op, ring))
        scope.put(op.output("Out")[0], value if ring.rank == root else _like(tensor, value))

    def allreduce(self, op: Op, scope: Scope) -> asyncio.Task[None]:
        """c_allreduce_sum, started now on the op's ring with X as it is now; the task puts the
        sum in Out."""
        ring = self.ring(op)
        value, out = scope.raw(op.input("X")[0]), op.output("Out")[0]
        if ring.local:  # c_comm_init_all's ring of one rank: the sum is X
            return asyncio.get_running_loop().create_task(_put(scope, out, value))
        group = self.groups[ring.ring_id]
        work: Callable[[], torch.Tensor | SelectedRows]
        if isinstance(value, SelectedRows):
            work = self._gather_rows(value, ring.nranks, group)
        else:
            work = functools.partial(_all_reduce, _own_tensor(_dense(op, value), self.device),
                                     group)
        future: asyncio.Future[torch.Tensor | SelectedRows] = self._calls.submit(work)
        # queued now: in program order
        what = self._what(op, ring)

        async def reduce() -> None:
            result = await self._settled(future, what)
            scope.put(out, result if isinstance(result, SelectedRows) else _like(result, value))

        return asyncio.get_running_loop().create_task(reduce())

    def _gather_rows(self, value: SelectedRows, n: int, group: Any) -> Callable[[], SelectedRows]:
        """A SelectedRows X: every rank's rows and values, concatenated in rank order (the row
        counts gathered first, then the rows padded to the most)."""
        rows = torch.from_numpy(np.ascontiguousarray(value.rows, dtype=np.int64)).to(self.device)
        values = _as_tensor(value.values, self.device)

        def gather() -> SelectedRows:
            count = torch.tensor([rows.shape[0]], dtype=torch.int64, device=self.device)
            counts = [torch.empty_like(count) for _ in range(n)]
            dist.all_gather(counts, count, group=group)
            sizes = [int(c.item()) for c in counts]
            parts = zip(_gather_padded(rows, max(sizes), n, group),
                        _gather_padded(values, max(sizes), n, group), sizes)
            kept = [(r[:k], v[:k]) for r, v, k in parts]
            return SelectedRows(to_host(torch.cat([r for r, _ in kept])),
                                _like(torch.cat([v for _, v in kept]), value.values),
                                value.height)
        return gather

    async def finish(self) -> None:
        """The job's steps are done: after every op queued, a barrier (no rank tears its
        sockets down while a peer still reads them), then the process group destroyed. After a
        failure it is left to the process's exit."""
        if self.groups and not self._failed:
            await self._call(_leave, lambda: "the closing barrier of " + ", ".join(
                r.describe() for r in self.rings.values()))
            self.groups.clear()

    def close(self) -> None:
        """No more calls: the thread ends after those queued (a daemon: a call still waiting
        for a peer that is gone does not hold the process's exit)."""
        self._calls.stop()


async def _put(scope: Scope, name: str, value: Any) -> None:
    scope.put(name, value)


def _first_line(exc: BaseException) -> str:
    """An exception's message without the C++ stack torch appends."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _dense(op: Op, value: Any) -> Any:
    """A dense value's data (a numpy array or a tensor; a LoDTensor's), as the ring reduces it;
    a phantom (timing mode) has none."""
    if isinstance(value, Phantom):
        raise CollectiveError(f"{op.type} of {op.input('X')[0]}: a phantom (timing mode) has no "
                              "values for torch.distributed; the simulator runs the ring")
    return value if isinstance(value, torch.Tensor) else to_dense(value)


def _as_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """`value` (a numpy array or a tensor) as a contiguous tensor on `device`, a view where it
    can be one (on the CPU): for reading only."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device).contiguous()
    return from_host(np.asarray(value), device).contiguous()


def _own_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """`value` as a tensor of the op's own on `device`, for torch.distributed to write into (a
    copy where `_as_tensor` gives a view)."""
    tensor = _as_tensor(value, device)
    if isinstance(value, torch.Tensor):
        shares = tensor.data_ptr() == value.data_ptr()
    else:
        shares = tensor.device.type == "cpu" and np.shares_memory(tensor.numpy(), value)
    return tensor.clone() if shares else tensor


def _like(result: torch.Tensor, value: Any) -> Any:
    """The op's result in `value`'s form: a numpy array for a numpy X (on the CPU a view of
    the result), else the tensor."""
    return result if isinstance(value, torch.Tensor) else to_host(result)


def _leave() -> None:
    dist.barrier()
    dist.destroy_process_group()


def _all_reduce(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    dist.all_reduce(tensor, dist.ReduceOp.SUM, group=group)
    return tensor


def _gather_padded(tensor: torch.Tensor, rows: int, n: int, group: Any) -> list[torch.Tensor]:
    """Every rank's `tensor`, each padded with zero rows to `rows` rows for the gather."""
    padded = torch.zeros((rows,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                         device=tensor.device)
    padded[:tensor.shape[0]] = tensor
    out = [torch.empty_like(padded) for _ in range(n)]
    dist.all_gather(out, padded, group=group)
    return out
