"""The torch.distributed backend of the collective modes (`collective.backend: torch`,
`runtime.services.collective_torch`), on the CPU with gloo over loopback:

- the backend selection (NCCL where the trainers compute on a GPU that is there, else gloo)
  and its errors, and the schema's rules;
- c_comm_init_all (single_process_multi_thread): a ring of this process alone, no process
  group;
- the ops, by two processes: broadcast, all-reduce of numpy and torch values (exact sums, X
  never written into), the SelectedRows gather (uneven row counts, rank order), two rings;
- a rendezvous that cannot complete fails after `train.request_timeout`, naming rank 0's
  endpoint (or the ranks that never came);
- `runtime up` of a collective scenario with 2 trainers on torch.distributed equals local
  training (rtol, atol 1e-5) and the ring backend (atol 1e-6; with 2 trainers both add the same
  two numbers, measured equal bit for bit).

NCCL itself is not exercised here (no GPU): only its selection and its refusals.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from runtime.config.scenario import ScenarioError, parse_scenario  # noqa: E402
from runtime.execution.scope import Scope  # noqa: E402
from runtime.execution.tensor import Phantom  # noqa: E402
from runtime.network.zmq_transport import ZmqTransport  # noqa: E402
from runtime.services.cluster import (collective_ops, make_trainer, run_job,  # noqa: E402
                                      train_locally)
from runtime.services.collective import CollectiveError, CollectiveOps, Ring  # noqa: E402
from runtime.services.collective_torch import (TorchCollectiveOps,  # noqa: E402
                                               process_group_backend)
from runtime.services.job import Job  # noqa: E402
from transpiler.ir import Op  # noqa: E402

from cluster_helpers import csv_with_a_bad_value, free_endpoints  # noqa: E402
from collective_helpers import check_comm_init_all  # noqa: E402
from runtime_runs import children_of, load_params, up  # noqa: E402
from torch_ranks import rows_of, x_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)

SCENARIO = """\
name: torch-allreduce
seed: 3
model: {{name: mlp, sizes: [64, 32, 10], optimizer: {{type: sgd, learning_rate: 0.1}}}}
data: {{batch_size: 16}}
cluster: {{pservers: {pservers}, trainers: 2}}
transpiler: {{mode: {mode}}}
collective: {{backend: {backend}}}
train: {{steps: 20, deadline: 60s, request_timeout: 30s, log_every: 5}}
"""


# -- choosing torch.distributed's backend ----------------------------------------------------------

@pytest.mark.parametrize("device, cuda, nccl, chosen", [
    (CPU, False, False, "gloo"),
    (CPU, True, True, "gloo"),     # a GPU is there, but the trainers compute on the CPU
    (GPU, True, True, "nccl"),
    (GPU, True, False, "gloo"),    # a build of torch without NCCL
    (GPU, False, True, "gloo"),    # (the executor refuses the device first)
])
def test_auto_is_nccl_on_a_gpu_that_is_there_else_gloo(device: torch.device, cuda: bool,
                                                        nccl: bool, chosen: str) -> None:
    assert process_group_backend("auto", device, cuda, nccl) == chosen


def test_a_backend_asked_for_by_name_is_used() -> None:
    assert process_group_backend("gloo", GPU, True, True) == "gloo"
    assert process_group_backend("nccl", GPU, True, True) == "nccl"


@pytest.mark.parametrize("device, cuda, nccl, gloo, message", [
    (GPU, False, True, True, "collective.torch_backend nccl needs a GPU, but "
                             "torch.cuda.is_available() is False"),
    (CPU, True, True, True, "collective.torch_backend nccl reduces GPU tensors, but the "
                            "trainers compute on cpu"),
    (GPU, True, False, True, "this build of torch has no NCCL"),
])
def test_nccl_that_cannot_run_here_says_what_is_missing(device: torch.device, cuda: bool,
                                                         nccl: bool, gloo: bool,
                                                         message: str) -> None:
    with pytest.raises(CollectiveError, match=message.replace("(", r"\(").replace(")", r"\)")):
        process_group_backend("nccl", device, cuda, nccl, gloo)


def test_gloo_missing_and_unknown_backends_are_refused() -> None:
    with pytest.raises(CollectiveError, match="this build of torch has no gloo"):
        process_group_backend("auto", CPU, False, False, gloo_available=False)
    with pytest.raises(CollectiveError, match="torch_backend 'mpi': use one of auto, nccl, gloo"):
        process_group_backend("mpi", CPU, False, False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine "
                    "without a GPU")
def test_asking_for_nccl_without_a_gpu_fails_before_any_rendezvous() -> None:
    with pytest.raises(CollectiveError, match="needs a GPU"):
        TorchCollectiveOps("trainer:0", 1.0, "cpu", requested="nccl")


# -- the scenario --------------------------------------------------------------------------------

def scenario_text(mode: str = "collective", backend: str = "torch") -> str:
    return SCENARIO.format(mode=mode, backend=backend,
                           pservers=0 if mode in ("collective", "nccl2") else 1)


def test_the_ring_is_the_default_backend() -> None:
    text = scenario_text().replace("collective: {backend: torch}\n", "")
    assert parse_scenario(text).collective.backend == "ring"
    assert parse_scenario(scenario_text()).collective.backend == "torch"


@pytest.mark.parametrize("backend, message", [
    ("ring, torch_backend: gloo", "collective: torch_backend gloo needs backend: torch, not ring"),
    ("torch, torch_backend: nccl", "collective.torch_backend nccl needs the trainers on a GPU "
                                   "(backend.kernels torch, backend.device cuda...), not device "
                                   "cpu"),
    ("mpi", "Input should be 'ring' or 'torch'"),
])
def test_torch_backend_settings_are_checked(backend: str, message: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(scenario_text(backend=backend))
    assert message in str(error.value)


def test_only_a_trainer_of_a_collective_mode_in_a_process_of_its_own_gets_torch() -> None:
    """`make_trainer` runs the ring unless asked for the scenario's backend (`runtime up` and
    role mode ask); a pserver mode has no collective ops to give it."""
    job = Job.from_scenario(parse_scenario(scenario_text()), free_endpoints(2))
    sync = Job.from_scenario(parse_scenario(scenario_text("sync")), free_endpoints(1))
    assert collective_ops(job, 0, "ring") is None and collective_ops(sync, 0, "torch") is None
    with pytest.raises(ValueError, match="collective backend 'mpi': use one of"):
        collective_ops(job, 0, "mpi")
    ops = collective_ops(job, 1, "torch")
    assert isinstance(ops, TorchCollectiveOps)
    ops.close()
    assert (ops.name, ops.backend, ops.device, ops.timeout) == ("trainer:1", "gloo", CPU, 30.0)
    trainer = make_trainer(job, 0, ZmqTransport("trainer:0"))
    assert isinstance(trainer.rpc.collective, CollectiveOps)
    asyncio.run(trainer.client.close())


def test_an_op_before_its_ring_is_open_or_on_a_phantom_is_refused() -> None:
    async def check() -> None:
        ops = TorchCollectiveOps("trainer:0", 1.0)
        try:
            scope = Scope()
            scope.put("g", np.ones(3))
            op = Op("c_allreduce_sum", {"X": ["g"]}, {"Out": ["g"]}, {"ring_id": 0})
            with pytest.raises(CollectiveError, match="trainer:0: c_allreduce_sum: ring 0 is "
                                                      "not open"):
                ops.allreduce(op, scope)
            with pytest.raises(CollectiveError, match=r"ring 0: rank 2 of endpoints"):
                await ops.gen_comm_id(Op("c_gen_nccl_id", {}, {"Out": ["id"]}, {
                    "rank": 2, "endpoint": "127.0.0.1:1", "other_endpoints": ["127.0.0.1:2"],
                    "ring_id": 0}), scope)
            ops.rings[0], ops.groups[0] = Ring(0, 0, ("127.0.0.1:1", "127.0.0.1:2"), "id"), None
            scope.put("g", Phantom((3,), np.dtype(np.float32)))
            with pytest.raises(CollectiveError, match="a phantom .timing mode. has no values"):
                ops.allreduce(op, scope)
        finally:
            ops.close()
    asyncio.run(check())


def test_c_comm_init_all_opens_a_ring_of_this_process_without_a_process_group() -> None:
    """single_process_multi_thread on torch: the ring of one rank sums without torch.distributed
    (no process group is made), and a job of several processes is refused naming the mode."""
    async def check() -> None:
        ops = TorchCollectiveOps("trainer:0", 1.0)
        try:
            await check_comm_init_all(ops)
            assert ops.groups == {} and not dist.is_initialized()
            await ops.finish()
        finally:
            ops.close()
    asyncio.run(check())


# -- the ops, two ranks as processes ---------------------------------------------------------------

def run_ranks(argv: list[list[str]], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """`python tests/support/torch_ranks.py ...` once per rank, at once; every process ended
    after."""
    script = ROOT / "tests" / "support" / "torch_ranks.py"
    procs = [subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT) for args in argv]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        return [subprocess.CompletedProcess(p.args, p.returncode, out) for p, out in
                zip(procs, outputs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.timeout(90)
def test_two_ranks_broadcast_sum_and_gather_exactly(tmp_path: Path) -> None:
    endpoints = ",".join(free_endpoints(2))
    outs = [tmp_path / f"rank{r}.npz" for r in range(2)]
    done = run_ranks([[str(r), endpoints, str(outs[r])] for r in range(2)], 75)
    assert [d.returncode for d in done] == [0, 0], "\n".join(d.stdout for d in done)
    results = [dict(np.load(out)) for out in outs]
    total = x_of(0) + x_of(1)
    gathered = [rows_of(0), rows_of(1)]
    for rank, got in enumerate(results):
        np.testing.assert_array_equal(got["param"], np.full(4, 5.0))   # rank 0's
        np.testing.assert_array_equal(got["grad"], total)
        np.testing.assert_array_equal(got["x"], x_of(rank))              # X not written into
        np.testing.assert_array_equal(got["t_sum"], np.full(5, 3.0, dtype=np.float32))
        np.testing.assert_array_equal(got["t"], np.full(5, rank + 1.0, dtype=np.float32))
        np.testing.assert_array_equal(got["rows"], np.concatenate([g.rows for g in gathered]))
        np.testing.assert_array_equal(got["values"],
                                      np.concatenate([g.values for g in gathered]))
        assert got["values"].dtype == np.float32 and int(got["height"]) == 40
        assert list(got["kinds"]) == ["ndarray", "Tensor"]
        first = endpoints.split(",")[0]
        assert list(got["ids"]) == [f"torch.distributed:gloo:tcp://{first}:{ring}"
                                    for ring in (0, 1)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank, waits_for", [
    (1, "waiting up to 1s for rank 0's TCPStore at {0}"),
    (0, "waiting up to 1s for the other 1 rank(s) ({1}) to join"),
])
def test_a_rendezvous_that_cannot_complete_fails_naming_whom_it_waited_for(
        rank: int, waits_for: str) -> None:
    """Alone, each rank gives up after the timeout (rank 1 finds no TCPStore at rank 0's
    endpoint; rank 0's store sees no other rank join)."""
    endpoints = free_endpoints(2)

    async def join() -> None:
        ops = TorchCollectiveOps(f"trainer:{rank}", timeout=1.0)
        try:
            await ops.gen_comm_id(Op("c_gen_nccl_id", {}, {"Out": ["id"]}, {
                "rank": rank, "endpoint": endpoints[rank],
                "other_endpoints": [endpoints[1 - rank]], "ring_id": 0}), Scope())
        finally:
            ops.close()

    with pytest.raises(CollectiveError) as error:
        asyncio.run(join())
    message = str(error.value)
    assert message.startswith(f"trainer:{rank}: torch.distributed (gloo) rendezvous of ring 0 "
                              f"at tcp://{endpoints[0]} as rank {rank} of 2, "
                              + waits_for.format(*endpoints) + ": ")
    assert "frame #" not in message  # torch's C++ stack left out
    assert not torch.distributed.is_initialized()


@pytest.mark.timeout(90)
def test_a_peer_that_left_fails_the_all_reduce_naming_the_ring() -> None:
    """Rank 0 exits after the rendezvous and a broadcast: rank 1's all-reduce fails as soon as
    gloo sees the connection close (not at the 30 s timeout), naming the ring's ranks and endpoints."""
    eps = free_endpoints(2)
    done = run_ranks([[str(r), ",".join(eps), "--leave"] for r in range(2)], 75)
    assert [d.returncode for d in done] == [0, 3], "\n".join(d.stdout for d in done)
    error = done[1].stdout.strip().splitlines()[-1]
    assert error.startswith(f"CollectiveError: trainer:1: c_allreduce_sum of grad (step 0) on "
                            f"ring 0 (rank 1 of 2: rank 0 at {eps[0]}, rank 1 at {eps[1]}) over "
                            f"torch.distributed (gloo, timeout 30s): "), error
    assert "frame #" not in error


# -- a whole job ---------------------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["collective", "nccl2"])
def test_runtime_up_on_torch_distributed_equals_local_training_and_the_ring(
        tmp_path: Path, mode: str) -> None:
    """2 trainers as processes, all-reducing over gloo on loopback (collective mode meets with
    c_gen_nccl_id and c_comm_init, nccl2 with gen_nccl_id): trainer 0's parameters equal local
    training's within sync mode's tolerance, and the ring backend's (the same job in one
    process over ZeroMQ) within 1e-6."""
    path, out = tmp_path / "scenario.yaml", tmp_path / "out"
    path.write_text(scenario_text(mode))
    code, lines = up(str(path), "--out", str(out))
    assert code == 0, "\n".join(lines)
    assert children_of(os.getpid()) == []
    assert "torch.distributed: the trainers' all-reduce is neither authenticated" in lines[2]
    assert "torch.distributed (gloo, tcp://" in (out / "logs" / "trainer-1.log").read_text()
    params = load_params(out / "params.npz")
    job = Job.from_scenario(parse_scenario(scenario_text(mode)), free_endpoints(2))
    _, local = train_locally(job)
    ring = asyncio.run(run_job(job, ZmqTransport)).params
    assert params.keys() == local.keys() == ring.keys()
    for name in local:
        np.testing.assert_allclose(params[name], local[name], rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(params[name], ring[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.timeout(120)
def test_runtime_up_with_a_failing_trainer_fails_naming_it_and_leaves_no_process(
        tmp_path: Path) -> None:
    """Trainer 0 fails on a bad record; its peer, in an all-reduce with it, fails too (gloo
    sees the connection close) or is stopped by the launcher: no process is left behind. The
    failure named is trainer 0's, or its peer's, whose error carries trainer 0's (which of the
    two exits first is the scheduler's choice)."""
    path, out = tmp_path / "scenario.yaml", tmp_path / "out"
    path.write_text(scenario_text())
    data, error = csv_with_a_bad_value(tmp_path / "data.csv")
    code, lines = up(str(path), "--out", str(out), "--set", data)
    assert code == 1
    assert lines[-1].startswith(f"FAILED: trainer:0 exited with status 1: {error}") or (
        lines[-1].startswith("FAILED: trainer:1 exited with status 1: CollectiveError: ")
        and error.removeprefix("DataError: ") in lines[-1]), lines[-1]
    assert children_of(os.getpid()) == []
