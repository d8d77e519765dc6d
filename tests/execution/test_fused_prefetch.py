"""The distributed table's fused prefetch chain (the 1.8 programs: one `split_ids` and one
`merge_ids` for every lookup of the table) runs on the backends' one-ids kernels and gives
each lookup the rows a lookup of its own would."""

from __future__ import annotations

import numpy as np

from runtime.execution.executor import build_plan, fused_ids_kernel
from runtime.execution.kernels import KernelContext
from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor
from transpiler.ir import Op, Program

TABLE = np.arange(20, dtype=np.float32).reshape(10, 2)


def run(op: Op, scope: Scope) -> None:
    kernel = fused_ids_kernel(op, "numpy", lambda k: k)
    assert kernel is not None
    kernel(KernelContext(op, scope))


def test_a_fused_chain_cuts_all_ids_once_and_merges_each_lookup() -> None:
    scope = Scope()
    scope.set("a", LoDTensor(np.array([[3], [7], [3]], np.int64), [[0, 2, 3]]))
    scope.set("b", np.array([[1], [7]], np.int64))
    run(Op("split_ids", {"Ids": ["a", "b"]}, {"Out": ["p0", "p1"]}, {"height_sections": [5, 5]}),
        scope)
    np.testing.assert_array_equal(scope.get("p0").reshape(-1), [1, 3])
    np.testing.assert_array_equal(scope.get("p1").reshape(-1), [7])
    for k in (0, 1):  # what each pserver's prefetch block answers
        scope.set(f"r{k}", TABLE[scope.get(f"p{k}").reshape(-1)])
    run(Op("merge_ids", {"Ids": ["a", "b"], "Rows": ["p0", "p1"], "X": ["r0", "r1"]},
           {"Out": ["oa", "ob"]}), scope)
    np.testing.assert_array_equal(scope.get("oa"), TABLE[[3, 7, 3]])
    np.testing.assert_array_equal(scope.get("ob"), TABLE[[1, 7]])
    assert [list(level) for level in scope.raw("oa").lod] == [[0, 2, 3]]


def test_one_lookup_s_chain_keeps_the_backend_kernel() -> None:
    op = Op("split_ids", {"Ids": ["a"]}, {"Out": ["p0"]}, {"height_sections": [10]})
    assert fused_ids_kernel(op, "numpy", lambda k: k) is None
    program = Program()
    program.global_block().ops.append(op)
    assert build_plan(program.global_block(), "numpy").steps[0].kernel is not None
