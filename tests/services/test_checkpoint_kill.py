"""A pserver killed at any moment of writing a checkpoint leaves the last committed one
recoverable, whole: the test kills the write at its k-th file-system step (a rename, a link, an
unlink, an fsync...), for every k until the write completes, and then reads the directory as a
restarted pserver does. What it finds is the checkpoint before the write or the one written,
never nothing and never a mix, and what the killed write left is gone after the next start or
the next write. A kill is a `Killed` raised at that step and at every step after it: nothing the
process would have done afterwards (its cleanup in ``except`` and ``finally``) reaches the disk.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.config.nodes import pserver_name
from runtime.network.zmq_transport import ZmqTransport
from runtime.services import checkpoint
from runtime.services.checkpoint import MANIFEST, Staging, load, previous_of, recover
from runtime.services.cluster import make_pserver
from transpiler.ir import Var

from checkpoint_helpers import ctr_job

STEPS = [(os, "rename"), (os, "replace"), (os, "link"), (os, "unlink"), (os, "rmdir"),
         (os, "mkdir"), (os, "fsync"), (shutil, "rmtree")]
"""The file-system steps a kill may fall between (``shutil.rmtree``'s own unlinks and rmdirs
count one by one besides)."""
ROWS = 20
Saved = tuple[int, list[list[float]], list[float]]


class Killed(BaseException):
    """The process killed on the spot (a BaseException: no ``except Exception`` catches it)."""


class Killer:
    """Counts the file-system steps; the `at`-th and every later one raise `Killed`."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def wrap(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def killable(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls >= self.at:
                raise Killed(f"killed at step {self.at}")
            return step(*args, **kwargs)
        return killable


def killed_at(at: int, action: Callable[[], object]) -> bool:
    """Run `action` with its `at`-th file-system step killed; whether the kill came (False: it
    completed first)."""
    killer = Killer(at)
    with pytest.MonkeyPatch.context() as patch:
        for module, name in STEPS:
            patch.setattr(module, name, killer.wrap(getattr(module, name)))
        try:
            action()
        except Killed:
            return True
    return False


def table(step: int) -> np.ndarray:
    """Var "t" at `step`: its first rows written at each step, the others never."""
    t = np.ones((ROWS, 2))
    t[:ROWS // 4] = step
    return t


DECLARED = {"t": Var("t", shape=(ROWS, 2), dtype="float64", persistable=True),
            "w": Var("w", shape=(3,), dtype="float64", persistable=True)}


def save(target: Path, step: int, since: str | None = None) -> str:
    """Checkpoint `step`, var "t" as a delta of its first rows over checkpoint `since` (linked)
    where that is the one at `target`, else whole; its id."""
    with Staging(target) as stage:
        stage.write_delta("t", table(step), np.arange(ROWS // 4), since)
        stage.commit({"t": table(step), "w": np.arange(3.0) + step}, step)
    return stage.id


def saved(target: Path) -> Saved:
    found = load(target, DECLARED)
    return found.step, found.values["t"].tolist(), found.values["w"].tolist()


def expected(step: int) -> Saved:
    return step, table(step).tolist(), (np.arange(3.0) + step).tolist()


def killed_write(directory: Path, at: int) -> tuple[Path, bool]:
    """Checkpoint 1 in `directory`, then checkpoint 2 (a linked delta) killed at step `at`."""
    target = directory / "pserver:0"
    since = save(target, 1)
    return target, killed_at(at, lambda: save(target, 2, since))


def assert_old_or_new(target: Path, killed: bool) -> bool:
    """The checkpoint at `target` is checkpoint 1 or 2, whole (2 if the write completed);
    whether it is 2."""
    found = saved(target)
    assert found in (expected(1), expected(2))
    assert killed or found == expected(2)
    return found[0] == 2


def only_the_target(target: Path) -> None:
    assert [p.name for p in target.parent.iterdir()] == [target.name]


@pytest.mark.timeout(60)
def test_a_write_killed_at_any_step_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    """And once the new one is there, a later kill never brings the old one back."""
    committed = False
    for at in itertools.count(1):
        target, killed = killed_write(tmp_path / f"read-{at}", at)
        new = assert_old_or_new(target, killed)  # `load`, as a restarted pserver's
        assert new or not committed
        committed = new
        if not killed:
            break
    assert at > 10 and committed
    (entry,) = [e for e in json.loads((target / MANIFEST).read_text())["vars"] if e["name"] == "t"]
    assert entry["deltas"]  # the write killed was a delta over the old checkpoint's linked base


@pytest.mark.timeout(60)
def test_what_a_killed_write_leaves_goes_at_the_next_start_or_write(tmp_path: Path) -> None:
    for at in itertools.count(1):
        target, killed = killed_write(tmp_path / f"start-{at}", at)
        assert recover(target)  # a pserver's start
        only_the_target(target)
        assert_old_or_new(target, killed)
        target, _ = killed_write(tmp_path / f"write-{at}", at)
        save(target, 3)  # the next write, with no start between
        only_the_target(target)
        assert saved(target) == expected(3)
        if not killed:
            break


@pytest.mark.timeout(60)
def test_a_recovery_killed_at_any_step_is_taken_up_by_the_next(tmp_path: Path) -> None:
    """The write killed between its two renames (the old checkpoint moved out, the new one not
    in): a recovery killed anywhere leaves what the next one finishes."""
    between = next(at for at in itertools.count(1)
                   if not killed_write(tmp_path / "probe", at)[0].exists())
    for at in itertools.count(1):
        target, _ = killed_write(tmp_path / f"recover-{at}", between)
        assert not target.exists() and previous_of(target).exists()
        killed = killed_at(at, lambda: recover(target))
        assert recover(target)
        only_the_target(target)
        assert saved(target) == expected(1)
        if not killed:
            break


@pytest.mark.timeout(60)
def test_a_pserver_restarted_after_a_kill_between_the_renames_resumes_from_the_old_one(
        tmp_path: Path) -> None:
    """Not from its startup state, as if it had never saved one."""
    job = ctr_job()
    transports = [ZmqTransport(pserver_name(0)) for _ in range(2)]
    try:
        server = make_pserver(job, 0, transports[0], checkpoint_dir=tmp_path)
        target = server.save_checkpoint(tmp_path, step=7)
        os.rename(target, previous_of(target))  # killed after moving it out
        (tmp_path / f".{target.name}.0123abcd").mkdir()  # and a staging directory of another
        restarted = make_pserver(job, 0, transports[1], checkpoint_dir=tmp_path,
                                 recovering=True)
    finally:
        for transport in transports:
            asyncio.run(transport.close())
    assert restarted.stats.restored_step == 7
    only_the_target(target)


def test_a_checkpoint_moved_out_under_the_earlier_name_is_found_too(tmp_path: Path) -> None:
    """Before ``.<name>.old``, the swap moved the old checkpoint to ``<staging dir>.old``."""
    target = tmp_path / "pserver:0"
    save(target, 1)
    os.rename(target, tmp_path / ".pserver:0.x1y2z3_w.old")
    (tmp_path / ".pserver:0.abcdefgh").mkdir()
    assert saved(target) == expected(1)
    assert recover(target)
    only_the_target(target)
    assert checkpoint.leftovers(target) == []
