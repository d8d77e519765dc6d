"""One rank of `tests/services/test_collective_torch.py`'s two-process checks of the
torch.distributed collective ops: ``python tests/support/torch_ranks.py RANK EP0,EP1 OUT.npz``, or
``... RANK EP0,EP1 --leave`` (rank 0 exits right after the rendezvous and a broadcast, rank 1 goes
on to an all-reduce and prints the error it ends in, exit status 3).

The rank opens rings 0 and 1 with ``gen_nccl_id`` (nccl_comm_num 2, gloo), then runs, in this
order: c_broadcast of a numpy parameter from rank 0; c_allreduce_sum of a float64 numpy X (X is
Out, as the transpiler writes it), of a float32 torch tensor on ring 1 (X is not Out), and of
a SelectedRows with 2 rows on rank 0 and 3 on rank 1; the stream syncs; then the closing
barrier. It saves every Out, the X it reduced (to show X was not written into) and the types
of the Outs."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import torch

from runtime.execution.scope import Scope
from runtime.execution.tensor import SelectedRows
from runtime.services.collective_torch import TorchCollectiveOps
from runtime.services.node import exit_process
from transpiler.ir import Op


def x_of(rank: int) -> np.ndarray:
    """Rank `rank`'s dense X: exact in float64, so its sums are too."""
    return np.arange(7, dtype=np.float64).reshape(7, 1) * (rank + 1) + 0.25


def rows_of(rank: int) -> SelectedRows:
    """Rank `rank`'s SelectedRows: 2 rows on rank 0, 3 on rank 1."""
    count = 2 + rank
    rows = np.arange(count, dtype=np.int64) + 10 * rank
    return SelectedRows(rows, np.full((count, 3), rank + 1.0, dtype=np.float32), 40)


async def run(rank: int, endpoints: list[str]) -> dict[str, np.ndarray]:
    ops = TorchCollectiveOps(f"trainer:{rank}", timeout=30.0)
    handlers, scope = ops.handlers(), Scope()
    try:
        await handlers["gen_nccl_id"](Op("gen_nccl_id", {}, {"NCCLID": ["id0", "id1"]}, {
            "trainers": endpoints, "trainer_id": rank, "nccl_comm_num": 2}), scope)
        scope.put("param", np.full(4, 5.0) if rank == 0 else np.zeros(4))
        await handlers["c_broadcast"](Op("c_broadcast", {"X": ["param"]}, {"Out": ["param"]},
                                         {"ring_id": 0, "root": 0}), scope)
        x = x_of(rank)
        scope.put("grad", x)
        scope.put("t", torch.full((5,), float(rank + 1), dtype=torch.float32))
        scope.put("rows", rows_of(rank))
        tasks = [ops.allreduce(Op("c_allreduce_sum", {"X": [x]}, {"Out": [o]},
                                  {"ring_id": ring, "nranks": 2}), scope)
                 for x, o, ring in (("grad", "grad", 0), ("t", "t_sum", 1), ("rows", "rows", 0))]
        await handlers["c_sync_comm_stream"](Op("c_sync_comm_stream", {}, {}, {}), scope)
        await asyncio.gather(*tasks)
        await ops.finish()
    finally:
        ops.close()
    rows = scope.raw("rows")
    return {"param": scope.raw("param"), "grad": scope.raw("grad"), "x": x,
            "t_sum": scope.raw("t_sum").numpy(), "t": scope.raw("t").numpy(),
            "rows": rows.rows, "values": rows.values, "height": np.array(rows.height),
            "ids": np.array([str(scope.get("id0")), str(scope.get("id1"))]),
            "kinds": np.array([type(scope.raw("grad")).__name__,
                               type(scope.raw("t_sum")).__name__])}


async def leave(rank: int, endpoints: list[str]) -> None:
    """Rank 0 leaves after the rendezvous and a broadcast; rank 1's all-reduce with it
    fails."""
    ops = TorchCollectiveOps(f"trainer:{rank}", timeout=30.0)
    scope = Scope()
    try:
        await ops.handlers()["gen_nccl_id"](Op("gen_nccl_id", {}, {"NCCLID": ["id"]}, {
            "trainers": endpoints, "trainer_id": rank, "nccl_comm_num": 1}), scope)
        scope.put("param", np.zeros(2))  # a collective both take part in: both are past the
        await ops.handlers()["c_broadcast"](Op(  # rendezvous (its store) when rank 0 leaves
            "c_broadcast", {"X": ["param"]}, {"Out": ["param"]}, {"ring_id": 0}), scope)
        if rank == 1:
            scope.put("grad", x_of(rank))
            await ops.allreduce(Op("c_allreduce_sum", {"X": ["grad"]}, {"Out": ["grad"]},
                                   {"ring_id": 0}), scope)
    finally:
        ops.close()


if __name__ == "__main__":
    rank, endpoints, out = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
    if out != "--leave":
        np.savez(out, **asyncio.run(run(rank, endpoints)))
        sys.exit(0)
    try:
        asyncio.run(leave(rank, endpoints))
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        exit_process(3)
    exit_process(0)  # rank 0 leaves with its process group open, as a failed trainer does
