"""Pserver checkpoints: periodic ones (`train.checkpoint_every`) and a trainer's
`checkpoint_notify` make every pserver save its whole state (params, the distributed table's
shard, Adam's accumulators, LR counters, its round step); a server started from the checkpoint
holds that state bit for bit, and a job resumed from its checkpoints ends where an
uninterrupted run does. Writing is atomic and loading names every mismatch."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from runtime.config.nodes import pserver_name, trainer_name
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.checkpoint import MANIFEST, CheckpointError, Staging
from runtime.services.cluster import LocalCluster, make_trainer, run_job
from runtime.services.job import Job
from runtime.services.pserver import PserverService, ServeConfig
from runtime.services.trainer import StepMismatch, run_program
from transpiler.ir import Program

from checkpoint_helpers import CTR_MODEL, ctr_job, state_bytes
from cluster_helpers import FAST_DRAIN, make_job


def services(job: Job, load_from: Path | None = None,
             checkpoint_dir: Path | None = None) -> list[PserverService]:
    config = ServeConfig(checkpoint_dir=checkpoint_dir)
    return [PserverService(*job.pserver_programs(j), ZmqTransport(pserver_name(j)),
                           config=config, load_from=load_from) for j in range(len(job.endpoints))]


def notify_program(endpoints: list[str], directory: Path) -> Program:
    program = Program()
    program.global_block().append_op("checkpoint_notify", {}, {},
                                     {"epmap": endpoints, "dir": str(directory)})
    return program


def with_steps(job: Job, steps: int) -> Job:
    """`job` with `steps` training steps, the same endpoints and everything else."""
    train = job.scenario.train.model_copy(update={"steps": steps, "checkpoint_every": 10})
    return Job(job.scenario.model_copy(update={"train": train}), job.args)


# -- save, restore, train on -----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_job_resumed_from_its_checkpoints_ends_as_if_never_stopped(tmp_path: Path) -> None:
    """10 steps with a checkpoint every 10; then a new job of 20 steps from those checkpoints:
    its pservers hold the saved state bit for bit (table shard, Adam's moments, LR counter)
    and it ends with the parameters of 20 uninterrupted steps."""
    job = ctr_job()
    uninterrupted = asyncio.run(run_job(with_steps(job, 20), ZmqTransport)).params

    first = LocalCluster(with_steps(job, 10), ZmqTransport, checkpoint_dir=tmp_path)
    asyncio.run(first.run())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pserver:0", "pserver:1"]
    restored = services(job, load_from=tmp_path)
    for old, new in zip(first.servers.values(), restored):
        assert {"ctr.emb", "@LR_DECAY_COUNTER@"} <= set(new.state)
        assert any("moment" in name for name in new.state)
        assert state_bytes(new) == state_bytes(old)
        assert state_bytes(new) != state_bytes(services(job)[0 if old.name == "pserver:0" else 1])
        assert new.round.step == 10

    second = LocalCluster(with_steps(job, 20), ZmqTransport, checkpoint_dir=tmp_path, resume=True)
    resumed = asyncio.run(second.run())
    assert [t.first_step for t in resumed.trainers] == [10, 10]
    assert resumed.params.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)


@pytest.mark.timeout(60)
def test_a_job_resumed_from_checkpoints_of_different_steps_fails_naming_the_step_mismatch(
        tmp_path: Path) -> None:
    """pserver:0's checkpoint is of step 20, pserver:1's of step 10 (an older one, as when the
    newer is lost): resumed, the trainers join pserver:0 at step 20, and pserver:1, at step
    10, holds their fetch of the parameters for a step it can never reach. The trainer fails
    with `StepMismatch` naming both steps as soon as pserver:1 says it holds the request,
    long before its deadline (an hour, past this test's timeout)."""
    job = make_job("{name: mlp, sizes: [8, 4, 2]}", trainers=2, pservers=2,
                   retry_after=FAST_DRAIN)
    for steps in (10, 20):
        asyncio.run(LocalCluster(with_steps(job, steps), ZmqTransport,
                                 checkpoint_dir=tmp_path / str(steps)).run())
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copytree(tmp_path / "20" / pserver_name(0), mixed / pserver_name(0))
    shutil.copytree(tmp_path / "10" / pserver_name(1), mixed / pserver_name(1))
    resumed = with_steps(job, 30)
    train = resumed.scenario.train.model_copy(update={"deadline": 3600.0})
    resumed = Job(resumed.scenario.model_copy(update={"train": train}), resumed.args)
    cluster = LocalCluster(resumed, ZmqTransport, checkpoint_dir=mixed, resume=True)
    with pytest.raises(StepMismatch, match=r"at step 19: pserver:1 is at step 10 and holds the "
                       r"request; the pservers disagree on the step") as raised:
        asyncio.run(cluster.run())
    assert (raised.value.endpoint, raised.value.step, raised.value.server_step) == (
        pserver_name(1), 19, 10)
    assert [s.round.step for s in cluster.servers.values()] == [20, 10]


@pytest.mark.timeout(60)
def test_checkpoint_notify_saves_every_pservers_state(tmp_path: Path) -> None:
    """Into the directory the pservers were configured with, which the notification names
    (`test_atomic_writes` has one naming another refused)."""
    job = ctr_job()
    servers = services(job, checkpoint_dir=tmp_path)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        serving = [loop.create_task(s.serve(ep)) for s, ep in zip(servers, job.endpoints)]
        trainer = make_trainer(job, 0, ZmqTransport(trainer_name(0)))
        try:
            await trainer.client.connect(job.endpoints)
            await run_program(trainer.executor, notify_program(job.endpoints, tmp_path),
                              trainer.scope, trainer.rpc)
        finally:
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)
            await trainer.client.close()
            for s in servers:
                await s.transport.close()

    asyncio.run(main())
    for server in servers:
        assert state_bytes(services(job, load_from=tmp_path)[int(server.name[-1])]) == \
            state_bytes(server)


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


# -- loading checks
# ------------------------------------------------------------------------------------

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


# -- atomic writes
# ----------------------------------------------------------------------------------

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


# -- sparse checkpoints: the rows written since the previous one, over a linked base
# ------------------------------------------------------------------------------------------------

def table_entry(target: Path, name: str = "t") -> dict:
    manifest = json.loads((target / MANIFEST).read_text())
    return next(e for e in manifest["vars"] if e["name"] == name)


def save_sparse(target: Path, table: np.ndarray, rows: np.ndarray | None, since: str | None,
                step: int) -> tuple[str, bool]:
    """Checkpoint var "t" as a delta of `rows` where one is possible; the new id, and whether
    it was a delta."""
    with Staging(target) as stage:
        delta = stage.write_delta("t", table, rows, since)
        stage.commit({"t": table, "w": np.arange(3.0)}, step)
    return stage.id, delta


def declared(table: np.ndarray) -> dict:
    from transpiler.ir import Var
    return {"t": Var("t", shape=table.shape, dtype=table.dtype.name, persistable=True),
            "w": Var("w", shape=(3,), dtype="float64", persistable=True)}


def test_a_sparse_checkpoint_writes_the_rows_written_over_the_previous_base(tmp_path: Path) -> None:
    from runtime.services.checkpoint import load
    target, rng = tmp_path / "ps", np.random.default_rng(0)
    table = rng.standard_normal((10_000, 8)).astype(np.float32)
    since, delta = save_sparse(target, table, None, None, 0)
    assert not delta
    base = table_entry(target)["file"]
    inode = (target / base).stat().st_ino
    for step in range(1, 5):
        rows = np.unique(rng.integers(0, 10_000, 100))
        table[rows] += np.float32(step)
        since, delta = save_sparse(target, table, rows, since, step)
        entry = table_entry(target)
        assert delta and entry["file"] == base and len(entry["deltas"]) == step
        assert (target / base).stat().st_ino == inode  # linked, not rewritten
        newest = (target / entry["deltas"][-1]["file"]).stat().st_size
        assert newest < len(rows) * (8 * 4 + 8) + 1024 < table.nbytes // 50
        saved = load(target, declared(table))
        np.testing.assert_array_equal(saved.values["t"], table)
        assert saved.step == step and saved.id == since
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ps"]


def test_sparse_checkpoints_compact_into_a_new_base(tmp_path: Path) -> None:
    """Past half the rows in deltas, or rows counted from another checkpoint, or any row
    written: a full base, a new file."""
    target = tmp_path / "ps"
    table = np.zeros((100, 2), np.float64)
    since, _ = save_sparse(target, table, None, None, 0)
    first = (target / table_entry(target)["file"]).stat().st_ino
    rows = np.arange(20)
    since, delta = save_sparse(target, table, rows, since, 1)
    assert delta
    since, delta = save_sparse(target, table, rows + 20, since, 2)
    assert delta and [d["rows"] for d in table_entry(target)["deltas"]] == [20, 20]
    since, delta = save_sparse(target, table, rows + 40, since, 3)  # 60 > 50 rows
    entry = table_entry(target)
    assert not delta and "deltas" not in entry
    assert (target / entry["file"]).stat().st_ino != first
    assert sorted(p.name for p in target.iterdir()) == [MANIFEST, "t.npy", "w.npy"]
    assert not save_sparse(target, table, rows, "another", 4)[1]
    assert not save_sparse(target, table.astype(np.float32), rows, since, 5)[1]


def test_a_failed_sparse_checkpoint_leaves_the_previous_one_whole(tmp_path: Path) -> None:
    from runtime.services.checkpoint import load
    target = tmp_path / "ps"
    table = np.arange(200.0).reshape(100, 2)
    since, _ = save_sparse(target, table, None, None, 0)
    since, _ = save_sparse(target, table, np.arange(5), since, 1)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    changed = table.copy()
    changed[:10] = -1
    with pytest.raises(RuntimeError, match="crashed"):
        with Staging(target) as stage:
            assert stage.write_delta("t", changed, np.arange(10), since)
            raise RuntimeError("crashed before the commit")
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert all(p.stat().st_nlink == 1 for p in target.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ps"]
    np.testing.assert_array_equal(load(target, declared(table)).values["t"], table)
    assert save_sparse(target, changed, np.arange(10), since, 2)[1]  # still counted from it
    np.testing.assert_array_equal(load(target, declared(table)).values["t"], changed)


def test_a_version_1_checkpoint_still_loads(tmp_path: Path) -> None:
    from runtime.services.checkpoint import load
    target, table = tmp_path / "ps", np.ones((4, 2), np.float32)
    target.mkdir()
    np.save(target / "t.npy", table)
    np.save(target / "w.npy", np.arange(3.0))
    (target / MANIFEST).write_text(json.dumps({"format": "pslab-checkpoint", "version": 1,
                                               "step": 7, "vars": [
        {"name": "t", "file": "t.npy", "shape": [4, 2], "dtype": "float32"},
        {"name": "w", "file": "w.npy", "shape": [3], "dtype": "float64"}]}))
    saved = load(target, declared(table))
    assert saved.step == 7 and saved.id is None
    np.testing.assert_array_equal(saved.values["t"], table)
    assert not save_sparse(target, table, np.arange(2), None, 8)[1]  # no id: a full base


def test_loading_refuses_a_bad_or_missing_delta_naming_it(tmp_path: Path) -> None:
    from runtime.services.checkpoint import load
    target = tmp_path / "ps"
    table = np.zeros((100, 2), np.float32)
    since, _ = save_sparse(target, table, None, None, 0)
    save_sparse(target, table, np.array([3, 7]), since, 1)
    delta = target / table_entry(target)["deltas"][0]["file"]
    delta.unlink()
    with pytest.raises(CheckpointError, match=r"var 't': cannot read delta .*t\.0\.npz"):
        load(target, declared(table))
    np.savez(delta, rows=np.array([3, 700]), values=np.zeros((2, 2), np.float32))
    with pytest.raises(CheckpointError, match=r"t\.0\.npz holds rows outside the var's 100 rows"):
        load(target, declared(table))
    np.savez(delta, rows=np.array([3]), values=np.zeros((1, 2), np.float32))
    with pytest.raises(CheckpointError, match=r"the manifest says 2 rows of float32\[2\]"):
        load(target, declared(table))
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["vars"][0]["deltas"][0]["file"] = "../t.0.npz"
    (target / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="plain .npz name"):
        load(target, declared(table))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kernels", ["numpy", "torch"])
def test_a_pservers_table_checkpoints_are_deltas_and_restore_it_exactly(
        tmp_path: Path, kernels: str) -> None:
    """Sync SGD on a 10000-id table, a checkpoint every 3 steps: after the first, each writes
    the table as the rows the steps since wrote, and the last restores the live state."""
    if kernels == "torch":
        pytest.importorskip("torch")
    job = make_job(CTR_MODEL.format(hidden=8, opt="sgd").replace("vocab: 100", "vocab: 10000"),
                   trainers=2, pservers=2, batch=8, retry_after=FAST_DRAIN,
                   extra=f"backend: {{kernels: {kernels}}}")
    train = job.scenario.train.model_copy(update={"steps": 12, "checkpoint_every": 3})
    job = Job(job.scenario.model_copy(update={"train": train}), job.args)
    cluster = LocalCluster(job, ZmqTransport, checkpoint_dir=tmp_path)
    asyncio.run(cluster.run())
    restored = services(job, load_from=tmp_path)
    for old, new in zip(cluster.servers.values(), restored):
        assert old.stats.checkpoints == [3, 6, 9, 12]
        assert type(old.scope.raw("ctr.emb")).__module__.split(".")[0] == kernels
        entry = table_entry(tmp_path / old.name, "ctr.emb")
        assert entry["shape"] == [5000, 4] and len(entry["deltas"]) == 3
        assert 0 < sum(d["rows"] for d in entry["deltas"]) < 2500
        assert state_bytes(new) == state_bytes(old)
        assert new.round.step == 12


def test_a_sparse_checkpoint_falls_back_to_a_full_base_where_links_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another file system (EXDEV): the new checkpoint holds a full base, no half-linked files."""
    import errno
    import os
    from runtime.services.checkpoint import load
    target = tmp_path / "ps"
    table = np.arange(200.0).reshape(100, 2)
    since, _ = save_sparse(target, table, None, None, 0)
    since, _ = save_sparse(target, table, np.arange(5), since, 1)  # a base and one delta
    calls: list[str] = []

    def cross_device(src: Path, dst: Path) -> None:
        if calls:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        calls.append(str(src))
        os.link(src, dst)

    monkeypatch.setattr(os, "link", cross_device)
    table[7] = -1
    since, delta = save_sparse(target, table, np.array([7]), since, 2)
    assert not delta and len(calls) == 1  # the base linked, its delta refused: undone
    assert sorted(p.name for p in target.iterdir()) == [MANIFEST, "t.npy", "w.npy"]
    np.testing.assert_array_equal(load(target, declared(table)).values["t"], table)


def test_a_sparse_checkpoint_with_no_rows_written_adds_no_delta_and_deltas_are_bounded(
        tmp_path: Path) -> None:
    from runtime.services.checkpoint import MAX_DELTAS
    target = tmp_path / "ps"
    table = np.zeros((10_000, 2), np.float32)
    since, _ = save_sparse(target, table, None, None, 0)
    since, delta = save_sparse(target, table, np.zeros(0, np.int64), since, 1)
    assert delta and table_entry(target).get("deltas") == []
    for step in range(MAX_DELTAS):
        since, delta = save_sparse(target, table, np.array([step]), since, 2 + step)
        assert delta
    assert len(table_entry(target)["deltas"]) == MAX_DELTAS
    assert not save_sparse(target, table, np.array([0]), since, 99)[1]
