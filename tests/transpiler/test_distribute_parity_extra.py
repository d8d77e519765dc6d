"""Parity with the original transpiler, continued (docs/transpiler.md): the pservers' RPC thread
counts (`ServerRuntimeConfig`) and `lookup_table_v2` (Paddle's ``fluid.embedding``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from distribute_helpers import PS1, PS2, basic, build, listen, pserver, trainer, transpile, types
from gradcheck import check_grad, run_in_scope, run_op

import transpiler as T
from runtime import LoDTensor, SelectedRows
from runtime.execution.kernels import KernelContext, get_kernel
from runtime.execution.scope import Scope
from runtime.execution.tensor import Phantom, lod_of
from runtime.services.cluster import train_locally
from transpiler.distribute import ServerRuntimeConfig

from cluster_helpers import FAST_DRAIN, make_job, simulate

# -- 1. ServerRuntimeConfig ---------------------------------------------------------------------

RPC_ATTRS = ("rpc_get_thread_num", "rpc_send_thread_num", "rpc_prefetch_thread_num")


def rpc_threads(t: T.DistributeTranspiler, endpoint: str) -> tuple[int, ...]:
    op = listen(pserver(t, endpoint)[0])
    return tuple(op.attr(name) for name in RPC_ATTRS)


def test_server_runtime_config_reads_the_flags_with_the_originals_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for flag in ("send", "get", "prefetch"):
        monkeypatch.delenv(f"FLAGS_rpc_{flag}_thread_num", raising=False)
    c = ServerRuntimeConfig()
    assert (c._rpc_send_thread_num, c._rpc_get_thread_num, c._rpc_prefetch_thread_num) == (12, 12, 12)
    monkeypatch.setenv("FLAGS_rpc_send_thread_num", "3")
    monkeypatch.setenv("FLAGS_rpc_prefetch_thread_num", "5")
    c = ServerRuntimeConfig()
    assert (c._rpc_send_thread_num, c._rpc_get_thread_num, c._rpc_prefetch_thread_num) == (3, 12, 5)
    # the default transpiler reads them too, and writes them where the original did
    assert rpc_threads(transpile(basic()), PS1) == (12, 3, 5)


@pytest.mark.parametrize("geo", [False, True])
def test_server_config_goes_on_every_pservers_listen_and_serv(geo: bool) -> None:
    server = ServerRuntimeConfig()
    server._rpc_send_thread_num, server._rpc_get_thread_num = 4, 6
    server._rpc_prefetch_thread_num = 2
    main, startup = basic()
    t = T.DistributeTranspiler(T.DistributeTranspilerConfig(geo_sgd_mode=geo),
                               server_config=server)
    t.transpile(0, program=main, pservers=f"{PS1},{PS2}", trainers=2, startup_program=startup,
                sync_mode=not geo, in_place=False)
    assert rpc_threads(t, PS1) == rpc_threads(t, PS2) == (6, 4, 2)
    # the original's setter (fleet's way in) replaces it for the next transpile
    other = ServerRuntimeConfig()
    other._rpc_get_thread_num = 1
    t._set_server_config(other)
    t.transpile(0, program=main, pservers=f"{PS1},{PS2}", trainers=2, startup_program=startup,
                sync_mode=not geo, in_place=False)
    assert rpc_threads(t, PS2)[0] == 1


def test_server_config_refuses_what_the_original_refused() -> None:
    with pytest.raises(TypeError, match="server_config: must be a ServerRuntimeConfig"):
        T.DistributeTranspiler(server_config={"_rpc_send_thread_num": 2})  # type: ignore[arg-type]
    bad = ServerRuntimeConfig()
    bad._rpc_prefetch_thread_num = 0
    with pytest.raises(ValueError, match="_rpc_prefetch_thread_num: must be an int >= 1, got 0"):
        T.DistributeTranspiler(server_config=bad)


def test_fluid_exposes_server_runtime_config() -> None:
    import runtime.paddle.fluid as fluid
    assert fluid.transpiler.ServerRuntimeConfig is ServerRuntimeConfig


# -- 2. lookup_table_v2 --------------------------------------------------------------------------

W = np.arange(15.0).reshape(5, 3)


@pytest.mark.parametrize("ids, shape", [
    (np.array([4, 0, 4]), (3, 3)),                  # [N] -> [N, D]
    (np.array([[1, 2], [4, 0]]), (2, 2, 3)),        # [N, L] -> [N, L, D]
    (np.array([[1], [2]]), (2, 1, 3)),              # the trailing 1 stays (lookup_table drops it)
])
def test_lookup_table_v2_keeps_every_dim_of_the_ids(ids: np.ndarray,
                                                    shape: tuple[int, ...]) -> None:
    """The torch kernel is checked against this one in test_torch_kernels."""
    out = run_op("lookup_table_v2", {"W": W, "Ids": ids}, attrs={"padding_idx": 0})["Out"]
    assert out.shape == shape
    expected = W[ids.reshape(-1)] * (ids.reshape(-1) != 0)[:, None]
    np.testing.assert_array_equal(out.reshape(-1, 3), expected)
    v1 = run_op("lookup_table", {"W": W, "Ids": ids})["Out"]
    assert v1.shape == ((2, 3) if ids.shape == (2, 1) else shape)
    scope = Scope()
    scope.set("w", Phantom((5, 3), np.dtype("float64")))
    scope.set("ids", Phantom(ids.shape, np.dtype("int64")))
    op = T.Op("lookup_table_v2", {"W": ["w"], "Ids": ["ids"]}, {"Out": ["emb"]})
    get_kernel("lookup_table_v2", "phantom")(KernelContext(op, scope, ""))
    assert scope.get("emb").shape == shape


def test_lookup_table_v2_keeps_the_ids_lod_and_refuses_foreign_ids() -> None:
    scope = Scope()
    scope.set("w", W)
    scope.set("ids", LoDTensor(np.array([1, 2, 3]), [[0, 2, 3]]))
    run_in_scope(T.Op("lookup_table_v2", {"W": ["w"], "Ids": ["ids"]}, {"Out": ["emb"]}), scope)
    assert lod_of(scope.get_tensor("emb")) == [[0, 2, 3]]
    assert np.asarray(scope.get("emb")).shape == (3, 3)
    with pytest.raises(IndexError, match="outside"):
        run_op("lookup_table_v2", {"W": W, "Ids": np.array([5])})


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("ids", [np.array([1, 3, 1, 0, 3, 1]), np.array([[1, 3, 1], [0, 3, 1]])])
def test_lookup_table_v2_gradient_matches_finite_differences(sparse: bool,
                                                             ids: np.ndarray) -> None:
    check_grad("lookup_table_v2", {"W": np.random.default_rng(0).standard_normal((5, 3)),
                                   "Ids": ids}, ["W"], {"is_sparse": sparse, "padding_idx": 0})


def test_lookup_table_v2_sparse_gradient_is_selected_rows_of_the_flat_ids() -> None:
    ids, g = np.array([[1, 3], [1, 0]]), np.arange(8.0).reshape(2, 2, 2)
    grad = run_op("lookup_table_v2_grad", {"W": np.zeros((5, 2)), "Ids": ids, "Out": g,
                                           "Out@GRAD": g}, ["W@GRAD"],
                  {"is_sparse": True, "padding_idx": 0})["W@GRAD"]
    assert isinstance(grad, SelectedRows) and grad.height == 5
    assert grad.rows.tolist() == [1, 3, 1] and grad.values.tolist() == [[0, 1], [2, 3], [4, 5]]


def v2_model(is_distributed: bool = False, remote_prefetch: bool = False) -> Any:
    """`fluid.embedding` of [-1, 2] ids ([-1, 2, 64] rows) -> fc(2) -> softmax cross-entropy."""
    def body() -> None:
        ids = T.layers.data("ids", shape=[2], dtype="int64")
        emb = T.layers.embedding_v2(ids, size=[1000, 64], is_sparse=True,
                                    is_distributed=is_distributed,
                                    remote_prefetch=remote_prefetch,
                                    param_attr=T.ParamAttr(name="emb"))
        label = T.layers.data("label", shape=[1], dtype="int64")
        pred = T.layers.fc(emb, size=2, act="softmax", param_attr=T.ParamAttr(name="fc_w"),
                           bias_attr=T.ParamAttr(name="fc_b"))
        T.optimizer.SGD(0.1).minimize(T.layers.mean(T.layers.cross_entropy(pred, label)))
    return build(body)


def test_front_end_emits_lookup_table_v2() -> None:
    import runtime.paddle.fluid as fluid
    assert fluid.embedding is T.layers.embedding_v2
    main, _ = v2_model()
    block = main.global_block()
    (op,) = [op for op in block.ops if op.type == "lookup_table_v2"]
    assert block.var(op.output("Out")[0]).shape == (-1, 2, 64)
    assert block.var("emb@GRAD").type == T.VarType.SELECTED_ROWS
    assert "lookup_table_v2_grad" in types(block)


def test_distributed_lookup_table_v2_is_prefetched_like_lookup_table() -> None:
    t = transpile(v2_model(is_distributed=True))
    main, startup = trainer(t)
    block = main.global_block()
    assert types(block)[:3] == ["split_ids", "prefetch", "merge_ids"]
    assert "lookup_table_v2" not in types(block)
    assert block.ops[2].attr("lookup_table_version") == "lookup_table_v2"
    assert block.var(block.ops[2].output("Out")[0]).shape == (-1, 2, 64)
    assert main.attrs["_distributed_lookup_table"] == "emb"
    assert "fake_init" in types(startup.global_block())
    ps, _ = pserver(t, PS1)
    assert "lookup_sparse_table" in [op.type for b in ps.blocks for op in b.ops]
    assert ps.global_block().var("emb").shape == (500, 64)


def test_remote_prefetch_lookup_table_v2_becomes_distributed_lookup_table() -> None:
    main, _ = trainer(transpile(v2_model(remote_prefetch=True)))
    (op,) = [op for op in main.global_block().ops if op.type == "distributed_lookup_table"]
    assert op.attr("lookup_table_version") == "lookup_table_v2"
    assert op.attr("table_names") == ["emb.block0", "emb.block1"]
    assert op.attr("height_sections") == [500, 500]


CTR_V2 = ("{{name: ctr_dnn, vocab: 100, embed_dim: 4, hidden: [8], {table}, embedding_v2: true, "
          "optimizer: {{type: sgd, learning_rate: 0.1}}}}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trainers, pservers", [(1, 2), (2, 3)])
def test_distributed_lookup_table_v2_job_equals_local_training(trainers: int,
                                                               pservers: int) -> None:
    job = make_job(CTR_V2.format(table="is_distributed: true"), trainers, pservers, steps=5,
                   batch=8, retry_after=FAST_DRAIN)
    assert "lookup_table_v2" in types(job.model.main.global_block())
    params = simulate(job)
    local_job = make_job(CTR_V2.format(table="shared_table: true"), trainers, pservers, steps=5,
                         batch=8)
    _, local = train_locally(local_job)
    # v2 computes what lookup_table does here: the same model with it trains the same
    _, v1 = train_locally(make_job(CTR_V2.format(table="shared_table: true")
                                   .replace(", embedding_v2: true", ""), trainers, pservers,
                                   steps=5, batch=8))
    assert params.keys() == local.keys() == v1.keys()
    for name, value in local.items():
        np.testing.assert_array_equal(value, v1[name], err_msg=name)
        np.testing.assert_allclose(params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
