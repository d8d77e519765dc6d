"""A trainer's `distributed_lookup_table` (remote sparse update): one op serves every lookup of
its table, asking each of the table's blocks once for the rows of all its lookups' ids (each
row once), and puts each lookup's rows in its own output, shaped and ordered as that lookup's."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor
from runtime.network.wire import Kind, Message
from runtime.services.trainer import RpcOps
from transpiler.ir import Op

from trainer_helpers import FutureClient

pytestmark = pytest.mark.timeout(30)

TABLE = np.arange(20 * 3, dtype=np.float32).reshape(20, 3)
"""The table: 20 rows of 3, row i holding 3i, 3i+1, 3i+2; two blocks of 10 rows."""
BLOCKS = {"w.block0": (0, "ep0"), "w.block1": (10, "ep1")}


class TableClient(FutureClient):
    """Answers each PREFETCH at once with the rows of its block, and keeps what it was asked."""

    labels = {"ep0": "pserver:0", "ep1": "pserver:1"}

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str, list[int]]] = []

    def start(self, endpoint: str, kind: Kind, step: int, vars: Any, extra: Any,
              deadline: Any, check: Any) -> asyncio.Future[Message]:
        assert kind is Kind.PREFETCH
        table = extra["table"]
        ids = np.asarray(vars["Ids"]).reshape(-1)
        self.asked.append((endpoint, table, ids.tolist()))
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        offset = BLOCKS[table][0]
        future.set_result(Message(Kind.REPLY, 1, endpoint, step, {table: TABLE[ids + offset]},
                                  {"server_step": 0}))
        return future


def lookup_op(ids: list[str], outs: list[str], padding_idx: int = -1,
              version: str = "lookup_table") -> Op:
    return Op("distributed_lookup_table", {"Ids": ids, "W": ["w"]}, {"Outputs": outs},
              {"table_names": list(BLOCKS), "height_sections": [10, 10],
               "endpoints": [ep for _, ep in BLOCKS.values()], "padding_idx": padding_idx,
               "trainer_id": 0, "lookup_table_version": version})


def run_lookup(op: Op, scope: Scope) -> TableClient:
    async def go() -> TableClient:
        client = TableClient()
        ops = RpcOps(client, 0)  # type: ignore[arg-type]
        await ops.distributed_lookup_table(op, scope)
        await ops.wait_for(op.output("Outputs"))
        return client
    return asyncio.run(go())


def test_one_op_asks_each_block_once_for_the_rows_of_all_its_lookups() -> None:
    scope = Scope()
    scope.put("title", LoDTensor(np.array([[3], [12], [3]], dtype=np.int64), [[0, 2, 3]]))
    scope.put("brand", np.array([12, 7], dtype=np.int64))
    client = run_lookup(lookup_op(["title", "brand"], ["title_emb", "brand_emb"]), scope)
    assert sorted(client.asked) == [("ep0", "w.block0", [3, 7]), ("ep1", "w.block1", [2])]
    title = scope.get_tensor("title_emb")
    assert isinstance(title, LoDTensor) and title.lod == [[0, 2, 3]]
    assert np.array_equal(title.data, TABLE[[3, 12, 3]])
    assert np.array_equal(scope.get("brand_emb"), TABLE[[12, 7]])


def test_each_output_keeps_its_lookups_shape_and_padding() -> None:
    """lookup_table_v2 keeps the ids' dims ([2, 2] -> [2, 2, 3]); the padding id reads zeros
    in every output."""
    scope = Scope()
    scope.put("a", np.array([[1, 5], [5, 19]], dtype=np.int64))
    scope.put("b", np.array([5, 2], dtype=np.int64))
    run_lookup(lookup_op(["a", "b"], ["a_emb", "b_emb"], padding_idx=5,
                         version="lookup_table_v2"), scope)
    expected = TABLE[[[1, 5], [5, 19]]]
    expected[[0, 1], [1, 0]] = 0
    assert np.array_equal(scope.get("a_emb"), expected)
    assert np.array_equal(scope.get("b_emb"), np.stack([np.zeros(3, np.float32), TABLE[2]]))


def test_ids_and_outputs_that_do_not_line_up_are_refused() -> None:
    scope = Scope()
    scope.put("a", np.array([1], dtype=np.int64))
    with pytest.raises(ValueError, match="1 Ids and 2 Outputs"):
        run_lookup(lookup_op(["a"], ["x", "y"]), scope)
