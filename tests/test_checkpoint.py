"""Pserver checkpoints: a trainer's `checkpoint_notify` makes every pserver save its whole state
(params, the distributed table's shard, Adam's accumulators, LR counters, its round step); a
server started from the checkpoint holds that state bit for bit, and training on from it ends
where an uninterrupted run does. Writing is atomic and loading names every mismatch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from runtime.checkpoint import MANIFEST, CheckpointError, Staging
from runtime.cluster import make_trainer, pserver_name, run_job, trainer_name
from runtime.job import Job
from runtime.protocol import INITIAL_STEP
from runtime.pserver import PserverService
from runtime.trainer import Trainer, run_program
from runtime.wire import Kind
from runtime.zmq_transport import ZmqTransport
from transpiler.ir import Program

from cluster_helpers import make_job

MODEL = ("{{name: ctr_dnn, vocab: 100, embed_dim: 4, hidden: [{hidden}], is_distributed: true, "
         "optimizer: {{type: {opt}, learning_rate: 0.05}}, "
         "lr: {{type: exponential_decay, decay_steps: 4, decay_rate: 0.7}}}}")


def ctr_job(hidden: int = 8, opt: str = "adam") -> Job:
    return make_job(MODEL.format(hidden=hidden, opt=opt), trainers=2, pservers=2, batch=8)


def services(job: Job, load_from: Path | None = None) -> list[PserverService]:
    return [PserverService(*job.pserver_programs(j), ZmqTransport(pserver_name(j)),
                           load_from=load_from) for j in range(len(job.endpoints))]


def notify_program(endpoints: list[str], directory: Path) -> Program:
    program = Program()
    program.global_block().append_op("checkpoint_notify", {}, {},
                                     {"epmap": endpoints, "dir": str(directory)})
    return program


async def train(job: Job, servers: list[PserverService], steps: range,
                checkpoint: Path | None = None) -> dict[str, np.ndarray]:
    """Serve `servers` and run the trainers through `steps`; trainer 0 then notifies a
    checkpoint to `checkpoint`, if given. Returns trainer 0's final parameters."""
    loop = asyncio.get_running_loop()
    serving = [loop.create_task(s.serve(ep)) for s, ep in zip(servers, job.endpoints)]
    trainers = [make_trainer(job, i, ZmqTransport(trainer_name(i))) for i in range(job.trainers)]
    try:
        await asyncio.gather(*(run_trainer(job, t, steps, checkpoint) for t in trainers))
        await asyncio.gather(*serving)
    finally:
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        for t in trainers:
            await t.client.close()
        for s in servers:
            await s.transport.close()
    return {p: np.array(trainers[0].scope.get(p)) for p in job.model.params}


async def run_trainer(job: Job, trainer: Trainer, steps: range, checkpoint: Path | None) -> None:
    """`Trainer.run` from step `steps.start`, with a checkpoint before trainer 0 completes."""
    rpc, exe, scope = trainer.rpc, trainer.executor, trainer.scope
    await trainer.client.connect(job.endpoints)
    rpc.step = INITIAL_STEP
    await run_program(exe, trainer.startup, scope, rpc)
    shard = job.dataset.shard(trainer.trainer_id, job.trainers)
    for step in steps:
        rpc.step = step
        await run_program(exe, trainer.main, scope, rpc,
                          shard.batch(step, job.scenario.data.batch_size, job.model.feeds))
    if trainer.trainer_id == 0:
        if checkpoint is not None:
            await run_program(exe, notify_program(job.endpoints, checkpoint), scope, rpc)
        await rpc.pull_tables(trainer.main, scope)
    await asyncio.gather(*(rpc.call(ep, Kind.COMPLETE) for ep in job.endpoints))


def state_bytes(service: PserverService) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {n: (str(v.dtype), v.shape, v.tobytes())
            for n in service.state for v in [np.asarray(service.scope.get(n))]}


# -- save, restore, train on -----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_restored_server_holds_the_state_and_trains_on_as_if_never_stopped(tmp_path: Path) -> None:
    job = ctr_job()
    uninterrupted = asyncio.run(run_job(job, ZmqTransport)).params

    first = services(job)
    asyncio.run(train(job, first, range(10), checkpoint=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pserver:0", "pserver:1"]
    restored = services(job, load_from=tmp_path)
    for old, new in zip(first, restored):
        assert {"ctr.emb", "@LR_DECAY_COUNTER@"} <= set(new.state)
        assert any("moment" in name for name in new.state)
        assert state_bytes(new) == state_bytes(old)
        assert state_bytes(new) != state_bytes(services(job)[0 if old.name == "pserver:0" else 1])
        assert new.round.step == 10

    resumed = asyncio.run(train(job, restored, range(10, 20)))
    assert resumed.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def test_the_checkpoint_directory_holds_a_manifest_and_npy_files(tmp_path: Path) -> None:
    (server, _) = services(ctr_job())
    target = server.save_checkpoint(tmp_path)
    assert target == tmp_path / "pserver:0"
    manifest = json.loads((target / MANIFEST).read_text())
    assert manifest["step"] == 0 and manifest["format"] == "pslab-checkpoint"
    entries = {e["name"]: e for e in manifest["vars"]}
    assert set(entries) == set(server.state)
    assert {p.name for p in target.iterdir()} == {MANIFEST} | {e["file"] for e in entries.values()}
    for name, entry in entries.items():
        value = np.load(target / entry["file"], allow_pickle=False)
        assert (list(value.shape), str(value.dtype)) == (entry["shape"], entry["dtype"]), name
    assert entries["ctr.emb"]["shape"] == [50, 4]


# -- loading checks ------------------------------------------------------------------------------------

def test_loading_names_every_var_that_does_not_fit(tmp_path: Path) -> None:
    services(ctr_job(hidden=8, opt="sgd"))[0].save_checkpoint(tmp_path)
    with pytest.raises(CheckpointError) as error:
        services(ctr_job(hidden=16, opt="adam"), load_from=tmp_path)
    message = str(error.value)
    assert str(tmp_path / "pserver:0") in message
    assert "'ctr.fc0.b' is float32[8] in the checkpoint but float32[16] in the program" in message
    assert "moment" in message and "is missing" in message


def test_loading_refuses_a_tampered_checkpoint(tmp_path: Path) -> None:
    job = ctr_job()
    target = services(job)[0].save_checkpoint(tmp_path)
    manifest = json.loads((target / MANIFEST).read_text())
    table = next(e for e in manifest["vars"] if e["name"] == "ctr.emb")
    np.save(target / table["file"], np.zeros((49, 4), np.float32))
    with pytest.raises(CheckpointError, match=r"var 'ctr.emb': .* holds float32\[49, 4\]"):
        services(job, load_from=tmp_path)
    table["file"] = "../elsewhere.npy"
    (target / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="plain .npy name"):
        services(job, load_from=tmp_path)
    (target / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="no readable checkpoint manifest"):
        services(job, load_from=tmp_path)


# -- atomic writes ----------------------------------------------------------------------------------

def test_a_checkpoint_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "ps"
    value = np.arange(4, dtype=np.int64)
    with Staging(target) as stage:
        stage.commit({"w": value}, step=3)
    with pytest.raises(RuntimeError, match="crashed"):
        with Staging(target) as stage:
            np.save(stage.file_of("w"), value + 1)
            raise RuntimeError("crashed while writing")
    with pytest.raises(CheckpointError, match="var 'w': .* holds int64\\[5\\], the scope"):
        with Staging(target) as stage:
            np.save(stage.file_of("w"), np.zeros(5, np.int64))
            stage.commit({"w": value}, step=4)
    assert [p.name for p in tmp_path.iterdir()] == ["ps"]
    assert json.loads((target / MANIFEST).read_text())["step"] == 3
    with Staging(target) as stage:
        stage.commit({"w": value + 1}, step=5)
    assert [p.name for p in tmp_path.iterdir()] == ["ps"]
    assert json.loads((target / MANIFEST).read_text())["step"] == 5
    assert np.load(target / "w.npy", allow_pickle=False).tolist() == [1, 2, 3, 4]
