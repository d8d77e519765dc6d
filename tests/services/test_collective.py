"""The nccl2 and collective modes run, and Geo-SGD on a sparse table trains.

- The ring all-reduce, broadcast and rendezvous (`runtime.services.collective`) on the simulated
  transport: exact sums, in the documented order (chunk c summed in ring order from rank c),
  the same bits on every rank.
- grad_allreduce (and nccl2) with 2 and 3 trainers equals local training on the same global
  batches, in one loop over the simulated network and over loopback ZeroMQ, within sync mode's
  tolerance (rtol 1e-5, atol 1e-5: each trainer sums its own shard, local training the whole
  batch in one kernel; measured largest difference 6e-8). With 2 trainers it equals sync PS
  mode bit for bit (the ring sums two grads as a pserver does, and scaling by 1/2 is exact).
- local_sgd averages every k steps: after a multiple of k every trainer holds the same
  parameters, bit for bit; one step later they differ.
- single_process_multi_thread: c_comm_init_all opens a ring of one rank, this process, whose
  all-reduce is X itself; with one trainer the job equals local training bit for bit (the loss
  grad scaled by 1.0, the sums of one rank), simulated and over ZeroMQ; a job of several
  trainer processes is refused naming the mode (by the schema, and by the op).
- Geo-SGD with a sparse (SelectedRows) embedding table trains, and with one trainer equals local
  training (the deltas pushed, only the rows that moved, and pulled back lose no update).
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest

from runtime.config.scenario import ScenarioError, parse_scenario
from runtime import Executor
from runtime.execution.costs import Meter
from runtime.execution.scope import Scope
from runtime.execution.tensor import Phantom, SelectedRows
from runtime.network.rpc import RpcClient
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.cluster import LocalCluster, run_job, train_locally
from runtime.services.collective import CollectiveError, CollectiveOps
from runtime.services.job import Job
from sim.loop import run as run_sim
from sim.network import Network
from sim.simulate import simulate
from transpiler.ir import Op

from cluster_helpers import FAST_DRAIN, assert_params_equal, free_endpoints, make_job, run
from collective_helpers import SPMT, check_comm_init_all

MLP = "{name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}"
CTR = ("{name: ctr_dnn, vocab: 2000, embed_dim: 8, hidden: [16], "
       "optimizer: {type: sgd, learning_rate: 0.5}}")


# -- the ops, on the simulated transport -----------------------------------------------------------

def ring_endpoints(n: int) -> list[str]:
    return [f"10.0.0.{i + 1}:7000" for i in range(n)]


async def open_ring(network: Network, n: int) -> list[CollectiveOps]:
    """`n` trainers' collective ops, their ring 0 open (c_gen_nccl_id, c_comm_init)."""
    eps = ring_endpoints(n)
    ops = []
    for r in range(n):
        client = RpcClient(network.transport(f"trainer:{r}"))
        await client.connect([])
        ops.append(CollectiveOps(client, timeout=5.0))

    async def join(r: int) -> None:
        scope = Scope()
        others = eps[:r] + eps[r + 1:]
        await ops[r].gen_comm_id(Op("c_gen_nccl_id", {}, {"Out": ["id"]},
                                    {"rank": r, "endpoint": eps[r], "other_endpoints": others,
                                     "ring_id": 0}), scope)
        await ops[r].comm_init(Op("c_comm_init", {"X": ["id"]}, {},
                                  {"nranks": n, "rank": r, "ring_id": 0}), scope)

    await asyncio.gather(*(join(r) for r in range(n)))
    return ops


def allreduce_on_ring(values: list) -> list:
    """Every rank's Out after one c_allreduce_sum of its value."""

    async def main() -> list:
        ops = await open_ring(Network(), len(values))
        scopes = [Scope() for _ in values]
        op = Op("c_allreduce_sum", {"X": ["g"]}, {"Out": ["g"]},
                {"ring_id": 0, "nranks": len(values)})
        for scope, value in zip(scopes, values):
            scope.put("g", value)
        await asyncio.gather(*(o.allreduce(op, s) for o, s in zip(ops, scopes)))
        for o in ops:
            await o.client.close()
        return [s.get("g") for s in scopes]

    return run_sim(main())


def ring_order_sum(values: list[np.ndarray]) -> np.ndarray:
    """The documented order: chunk c (of n near-equal chunks of the flattened value) summed
    from rank c on round the ring."""
    n, flat = len(values), [v.reshape(-1) for v in values]
    base, extra = divmod(flat[0].size, n)
    bounds = [i * base + min(i, extra) for i in range(n + 1)]
    chunks = []
    for c in range(n):
        a, b = bounds[c], bounds[c + 1]
        order = [(c + k) % n for k in range(n)]
        chunks.append(functools.reduce(lambda acc, r: acc + flat[r][a:b], order[1:],
                                       flat[order[0]][a:b]))
    return np.concatenate(chunks).reshape(values[0].shape)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_allreduce_gives_every_rank_the_same_exact_sum(n: int) -> None:
    rng = np.random.default_rng(n)
    values = [rng.standard_normal((7, 5)).astype(np.float32) * 10 ** r for r in range(n)]
    outs = allreduce_on_ring(values)
    expected = ring_order_sum(values)
    for out in outs:
        assert out.dtype == np.float32 and out.shape == (7, 5)
        assert out.tobytes() == expected.tobytes()  # bit for bit, on every rank
    np.testing.assert_allclose(expected, functools.reduce(np.add, values), rtol=1e-5)


def test_a_measured_ring_times_each_message_it_sends_as_it_times_those_it_receives() -> None:
    """A profile prices the ring's sends from their own samples (``send collective``), not the
    average request's: every rank sends 2(n-1) parts of one all-reduce, each received once."""
    n = 3

    async def main() -> list[Meter]:
        ops = await open_ring(Network(), n)
        meters = [Meter(f"trainer:{r}") for r in range(n)]
        for o, meter in zip(ops, meters):
            o.client.meter = meter
        op = Op("c_allreduce_sum", {"X": ["g"]}, {"Out": ["g"]}, {"ring_id": 0, "nranks": n})
        scopes = [Scope() for _ in range(n)]
        for r, scope in enumerate(scopes):
            scope.put("g", np.full((6, 4), r, np.float32))
        await asyncio.gather(*(o.allreduce(op, s) for o, s in zip(ops, scopes)))
        for o in ops:
            await o.client.close()
        return meters

    meters = run_sim(main())
    for r, meter in enumerate(meters):
        sent = meter.samples["send", "collective"]
        received = meters[(r + 1) % n].samples["receive", "collective"]
        assert len(sent) == len(received) == 2 * (n - 1)
        assert [b for b, _ in sent] == [b for b, _ in received]
        assert all(seconds >= 0 for _, seconds in sent)


def test_ring_allreduce_of_integers_is_the_plain_sum() -> None:
    values = [np.arange(10, dtype=np.int64) * (r + 1) for r in range(3)]
    for out in allreduce_on_ring(values):
        np.testing.assert_array_equal(out, np.arange(10) * 6)


def test_ring_allreduce_of_fewer_elements_than_ranks() -> None:
    values = [np.array([float(r + 1)]) for r in range(3)]
    assert [float(out[0]) for out in allreduce_on_ring(values)] == [6.0, 6.0, 6.0]


def test_allreduce_of_selected_rows_gathers_every_ranks_rows_in_rank_order() -> None:
    values = [SelectedRows([r, 5], np.full((2, 3), r + 1.0), height=8) for r in range(3)]
    for out in allreduce_on_ring(values):
        assert isinstance(out, SelectedRows) and out.height == 8
        assert out.rows.tolist() == [0, 5, 1, 5, 2, 5]
        assert out.values[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


def test_allreduce_of_phantoms_keeps_the_shape() -> None:
    values = [Phantom((6, 4), np.float32)] * 3
    assert allreduce_on_ring(values) == values


def test_broadcast_gives_every_rank_the_roots_value() -> None:
    async def main() -> list:
        ops = await open_ring(Network(), 3)
        scopes = [Scope() for _ in ops]
        for r, scope in enumerate(scopes):
            scope.put("w", np.full(4, float(r)))
        op = Op("c_broadcast", {"X": ["w"]}, {"Out": ["w"]}, {"ring_id": 0, "root": 1})
        await asyncio.gather(*(o.broadcast(op, s) for o, s in zip(ops, scopes)))
        return [s.get("w").tolist() for s in scopes]

    assert run_sim(main()) == [[1.0] * 4] * 3


def test_a_missing_rank_times_out_naming_the_neighbour() -> None:
    async def main() -> None:
        network = Network()
        client = RpcClient(network.transport("trainer:1"))
        await client.connect([])
        ops = CollectiveOps(client, timeout=2.0)
        eps = ring_endpoints(2)
        await ops.gen_comm_id(Op("c_gen_nccl_id", {}, {"Out": ["id"]},
                                 {"rank": 1, "endpoint": eps[1], "other_endpoints": [eps[0]],
                                  "ring_id": 0}), Scope())

    with pytest.raises(CollectiveError, match=r"trainer:1: ring 0 rank 1: the ring's id .* "
                                              r"from rank 0 \(10.0.0.1:7000\): nothing came in 2s"):
        run_sim(main())


def test_c_comm_init_all_opens_a_ring_of_this_process_only() -> None:
    async def main() -> None:
        client = RpcClient(Network().transport("trainer:0"))
        await client.connect([])
        await check_comm_init_all(CollectiveOps(client, timeout=2.0))

    run_sim(main())


# -- whole jobs ------------------------------------------------------------------------------------

def collective_text(trainers: int, mode: str = "collective", extra: str = "",
                    model: str = MLP, steps: int = 10, endpoints: list[str] | None = None) -> str:
    eps = f", endpoints: {{trainers: {endpoints}}}" if endpoints else ""
    return f"""
name: coll
seed: 3
model: {model}
data: {{batch_size: 16}}
cluster: {{pservers: 0, trainers: {trainers}{eps}}}
transpiler: {{mode: {mode}{", " + extra if extra else ""}}}
train: {{steps: {steps}, deadline: 60s}}
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["collective", "nccl2"])
@pytest.mark.parametrize("trainers", [2, 3])
def test_grad_allreduce_equals_local_training_simulated(trainers: int, mode: str) -> None:
    scenario = parse_scenario(collective_text(trainers, mode))
    result = simulate(scenario)
    assert [len(t.losses) for t in result.trainers] == [10] * trainers
    assert result.pservers == [] and result.endpoints == []
    _, local = train_locally(Job.from_scenario(scenario))
    assert_params_equal(result.params, local, atol=1e-5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("trainers", [2, 3])
def test_grad_allreduce_equals_local_training_over_zeromq(trainers: int) -> None:
    text = collective_text(trainers, endpoints=free_endpoints(trainers))
    job = Job.from_scenario(parse_scenario(text))
    result = asyncio.run(run_job(job, ZmqTransport))
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)


@pytest.mark.timeout(60)
def test_two_trainer_grad_allreduce_equals_sync_pserver_training_bit_for_bit() -> None:
    collective = simulate(parse_scenario(collective_text(2)))
    sync = run(make_job(MLP, trainers=2, pservers=2, steps=10, retry_after=FAST_DRAIN))
    for name, value in sync.params.items():
        assert collective.params[name].tobytes() == value.tobytes(), name


@pytest.mark.timeout(60)
def test_single_process_multi_thread_with_one_trainer_equals_local_training_exactly() -> None:
    scenario = parse_scenario(collective_text(1, extra=f"collective_mode: {SPMT}",
                                              endpoints=free_endpoints(1)))
    job = Job.from_scenario(scenario)
    _, startup = job.trainer_programs(0)
    assert startup.global_block().ops[-1].type == "c_comm_init_all"
    losses, local = train_locally(job)
    simulated = simulate(scenario)
    zeromq = asyncio.run(run_job(job, ZmqTransport))
    assert simulated.trainers[0].losses == zeromq.trainers[0].losses == losses
    assert losses[-1] < losses[0]
    for result in (simulated, zeromq):
        assert result.params.keys() == local.keys()
        for name, value in local.items():
            assert result.params[name].tobytes() == value.tobytes(), name


def trainer_params(scenario_text: str) -> list[dict[str, np.ndarray]]:
    """Every trainer's parameters at the end of the simulated job."""
    job = Job.from_scenario(parse_scenario(scenario_text))

    async def main() -> LocalCluster:
        cluster = LocalCluster(job, Network().transport)
        await cluster.run()
        return cluster

    cluster = run_sim(main())
    return [{p: np.array(t.scope.get(p)) for p in job.model.params}
            for _, t in sorted(cluster.trainers.items())]


@pytest.mark.timeout(60)
def test_local_sgd_averages_the_parameters_every_k_steps() -> None:
    extra = "collective_mode: local_sgd, local_sgd_k_steps: 3"
    at_average = trainer_params(collective_text(3, extra=extra, steps=6))
    for params in at_average[1:]:
        for name, value in at_average[0].items():
            assert params[name].tobytes() == value.tobytes(), name
    after = trainer_params(collective_text(3, extra=extra, steps=7))
    assert any(not np.array_equal(after[1][n], v) for n, v in after[0].items())


@pytest.mark.timeout(60)
def test_local_sgd_trains() -> None:
    extra = "collective_mode: local_sgd, local_sgd_k_steps: 4"
    result = simulate(parse_scenario(collective_text(2, extra=extra, steps=40)))
    for t in result.trainers:
        assert np.mean(t.losses[-5:]) < np.mean(t.losses[:5]) / 3


def test_collective_modes_take_no_pservers() -> None:
    scenario = parse_scenario(collective_text(2).replace("pservers: 0", "pservers: 4"))
    assert scenario.cluster.pservers == 0
    with pytest.raises(ScenarioError, match="cluster.pservers: 0 only with transpiler.mode"):
        parse_scenario(collective_text(2, mode="sync"))
    with pytest.raises(ScenarioError, match="collective needs cluster.trainers >= 2"):
        parse_scenario(collective_text(1))
    with pytest.raises(ScenarioError, match="params_equal_to needs"):
        parse_scenario(collective_text(2, extra="collective_mode: local_sgd")
                       + "expect: {params_equal_to: local}\n")
    one = parse_scenario(collective_text(1, extra=f"collective_mode: {SPMT}")
                         + "expect: {params_equal_to: local}\n")
    assert (one.cluster.trainers, one.transpiler.collective_mode) == (1, SPMT)
    with pytest.raises(ScenarioError, match=f"collective_mode {SPMT} never connects trainer "
                                            "processes: it needs cluster.trainers 1, not 2"):
        parse_scenario(collective_text(2, extra=f"collective_mode: {SPMT}"))


# -- Geo-SGD on a sparse table ---------------------------------------------------------------------

def geo_job(trainers: int, pservers: int, steps: int, kernels: str = "numpy") -> Job:
    return make_job(CTR, trainers, pservers, steps=steps, batch=32, mode="geo", data="ctr",
                    transpiler="geo_push_every: 4", retry_after=FAST_DRAIN,
                    extra=f"backend: {{kernels: {kernels}}}")


def test_geo_sparse_pushes_only_the_rows_that_moved() -> None:
    job = geo_job(2, 2, 4)
    main, _ = job.trainer_programs(0)
    assert "sparse_delta" in [op.type for block in main.blocks for op in block.ops]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kernels", ["numpy", "torch"])
def test_geo_sparse_table_trains(kernels: str) -> None:
    pytest.importorskip(kernels)
    result = run(geo_job(2, 2, 80, kernels))
    for report in result.trainers:
        assert len(report.losses) == 80
        assert np.mean(report.losses[-10:]) < 0.9 * np.mean(report.losses[:10])
    assert all(s.errors == 0 for s in result.pservers)


@pytest.mark.timeout(60)
def test_geo_sparse_with_one_trainer_equals_local_training() -> None:
    job = geo_job(1, 2, 16)
    result = run(job)
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)


@pytest.mark.timeout(60)
def test_geo_sparse_table_trains_simulated() -> None:
    """The same job on the simulator (`sim run`'s `simulate`): both trainers' losses fall, the
    pservers count no error, and the table moved."""
    job = geo_job(2, 2, 80)
    result = simulate(job.scenario)
    for report in result.trainers:
        assert len(report.losses) == 80
        assert np.mean(report.losses[-10:]) < 0.9 * np.mean(report.losses[:10])
    assert all(s.errors == 0 for s in result.pservers)
    start = Scope()
    Executor("numpy").run(job.model.startup, scope=start)
    table = "ctr.emb.title_ids"
    assert result.params[table].shape == (2000, 8)
    assert not np.array_equal(result.params[table], start.get(table))


@pytest.mark.timeout(60)
def test_geo_sparse_with_one_trainer_equals_local_training_simulated() -> None:
    job = geo_job(1, 2, 16)
    result = simulate(job.scenario)
    assert all(s.errors == 0 for s in result.pservers)
    _, local = train_locally(job)
    assert_params_equal(result.params, local, atol=1e-5)
