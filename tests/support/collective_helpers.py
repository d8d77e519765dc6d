"""The collective ops' checks that both backends (pslab's own rings and torch.distributed's)
pass alike."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.execution.scope import Scope
from runtime.execution.tensor import SelectedRows
from runtime.services.collective import Collective, CollectiveError
from transpiler.ir import Op


SPMT = "single_process_multi_thread"


async def check_comm_init_all(ops: Collective) -> None:
    """c_comm_init_all on `ops` (either backend): a ring of one rank whose all-reduce hands X
    back; refused where the job has several trainer processes, naming the mode."""
    scope = Scope()
    scope.put("g", np.array([1.5, -2.0], np.float32))
    scope.put("rows", SelectedRows(np.array([3, 1]), np.ones((2, 2), np.float32), 5))
    init = Op("c_comm_init_all", {}, {}, {"ring_id": 0})
    ops.trainer_endpoints = ("10.0.0.1:7000", "10.0.0.2:7000")
    with pytest.raises(CollectiveError, match=f"{ops.name}: c_comm_init_all of ring 0: "
                       f"collective_mode {SPMT} opens a ring over one process's own devices "
                       "and never connects processes, but this job has 2 trainer processes "
                       r"\(10.0.0.1:7000, 10.0.0.2:7000\): run it with 1 trainer"):
        await ops.comm_init_all(init, scope)
    ops.trainer_endpoints = ("10.0.0.1:7000",)
    await ops.handlers()["c_comm_init_all"](init, scope)
    assert (ops.rings[0].nranks, ops.rings[0].rank, ops.rings[0].local) == (1, 0, True)
    for name in ("g", "rows"):
        await ops.allreduce(Op("c_allreduce_sum", {"X": [name]}, {"Out": [name]},
                               {"ring_id": 0, "nranks": 1}), scope)
    assert scope.get("g").tolist() == [1.5, -2.0]
    assert scope.get("rows").rows.tolist() == [3, 1]
    with pytest.raises(CollectiveError, match="nranks 2, but ring 0 has 1 ranks .c_comm_init_all "
                                              f"opened it over this process only: collective_mode "
                                              f"{SPMT} never connects trainer processes"):
        ops.allreduce(Op("c_allreduce_sum", {"X": ["g"]}, {"Out": ["g"]},
                         {"ring_id": 0, "nranks": 2}), scope)
