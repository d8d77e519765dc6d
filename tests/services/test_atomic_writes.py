"""Every file pslab writes is written whole or not at all (`runtime.config.atomic`), a full disk
skips a periodic checkpoint and keeps the previous one, and a checkpoint goes only where the job
says: a CHECKPOINT_NOTIFY naming another directory is refused."""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest

from runtime.config.atomic import atomic_open, write_atomic
from runtime.config.nodes import pserver_name
from runtime.network.wire import Kind
from runtime.network.zmq_transport import ZmqTransport
from runtime.services import checkpoint
from runtime.services.pserver import PserverService, ServeConfig
from runtime.services.pserver_actions import Reject, SaveCheckpoint

from checkpoint_helpers import ctr_job, full_disk, state_bytes
from pserver_shell import Shell

ROOT = Path(__file__).resolve().parents[2]


def leftovers(directory: Path) -> list[str]:
    """Hidden temporary files or staging directories left in `directory`."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# -- the helper ----------------------------------------------------------------------------------

def test_a_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "metrics.json"
    write_atomic(path, "old\n")
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n" and leftovers(path.parent) == []
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "params.npz"
    write_atomic(path, b"old")
    with pytest.raises(RuntimeError, match="half way"):
        with atomic_open(path, binary=True) as f:
            f.write(b"half of the new")
            raise RuntimeError("half way")
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_a_full_disk_raises_enospc_and_keeps_the_old_file(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.json"
    write_atomic(path, "{}")
    full_disk(monkeypatch)
    with pytest.raises(OSError) as error:
        write_atomic(path, "{" + " " * 100 + "}")
    assert error.value.errno == errno.ENOSPC
    assert path.read_text() == "{}" and leftovers(tmp_path) == []


# Writes that are not of an output file: generated documentation, the logs `runtime up`
# streams as its nodes run, the lock files of network namespaces (never written to), and a
# sweep's journal of finished points, appended a line at a time (`--resume` skips a torn last
# line; the sweep's results are written whole).
NOT_OUTPUTS = {
    ("runtime/launch/netns.py", '.lock", os.O_RDWR | os.O_CREAT, 0o644)'),
    ("runtime/config/outdir.py", "os.open(path / name, os.O_RDWR | os.O_CREAT, 0o644)"),  # a lock
    ("runtime/config/metrics.py", "SCHEMA_FILE.write_text("),
    ("runtime/config/faults.py", '(root / "docs" / "faults.md").write_text('),
    ("runtime/config/faults.py", "readme.write_text("),
    ("sim/schemadoc.py", "args.path.write_text("),
    ("runtime/launch/launcher.py", '.log").open("w")'),
    ("runtime/services/progress.py", 'open(fd, "w", encoding="utf-8", closefd=False)'),  # a pipe
    ("sim/sweep_journal.py", 'path.open("a")'),
}
WRITES = re.compile(r"\.write_text\(|\.write_bytes\(|\bopen\([^)]*[\"'][wax]b?[\"']|"
                    r"np\.savez?(_compressed)?\(|\.savefig\(|json\.dump\(|"
                    r"\bos\.O_(CREAT|TRUNC)\b")
"""A line that writes a file: a write of pathlib, `open` or a library, or flags that make
`os.open` create or truncate one (on the line of the call, or of a variable it takes)."""


def test_every_output_file_is_written_through_the_helper() -> None:
    """No module of runtime/ or sim/ writes a file itself, not even with `os.open` (key files
    too are written whole); saving through a library (numpy, matplotlib) goes to a file that
    `atomic_open` opened on the line before."""
    found = []
    for path in sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "sim").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "runtime/config/atomic.py":
            continue
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if not WRITES.search(line) or any(rel == f and text in line for f, text in NOT_OUTPUTS):
                continue
            if number and "atomic_open(" in lines[number - 1]:
                continue
            found.append(f"{rel}:{number + 1}: {line.strip()}")
    assert found == []


# -- checkpoints ----------------------------------------------------------------------------------

def configured_server(directory: Path) -> PserverService:
    job = ctr_job()
    return PserverService(*job.pserver_programs(0), ZmqTransport(pserver_name(0)),
                          config=ServeConfig(checkpoint_every=1, checkpoint_dir=directory))


def test_a_full_disk_skips_the_checkpoint_and_keeps_the_previous_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The table's file (written by the program's save op, a kernel) fails first: the error
    reaches the server wrapped in the kernel's, and is recognised all the same."""
    server = configured_server(tmp_path)
    assert server._periodic_checkpoint(1) == tmp_path / "pserver:0"
    saved = state_bytes(server)
    server.scope.put("ctr.emb", np.asarray(server.scope.get("ctr.emb")) + 1)
    full_disk(monkeypatch)
    with caplog.at_level(logging.WARNING, "runtime.services.pserver"):
        assert server._periodic_checkpoint(2) is None
    monkeypatch.undo()
    assert server.stats.checkpoints == [1]
    assert [r.getMessage() for r in caplog.records] == [
        "pserver:0: checkpoint before step 2 skipped, the previous one kept: "
        f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"]
    kept = checkpoint.load(tmp_path / "pserver:0", server.state)
    assert kept.step == 1
    assert {n: (str(v.dtype), v.shape, v.tobytes()) for n, v in kept.values.items()} == saved
    assert leftovers(tmp_path) == [] and leftovers(tmp_path / "pserver:0") == []


def test_a_checkpoint_notify_saves_only_to_the_configured_directory(tmp_path: Path) -> None:
    shell = Shell("sync")
    notify = shell.message(Kind.CHECKPOINT_NOTIFY, 0, 0, dir=str(tmp_path / "elsewhere"))
    (refused,) = [a for a in shell.send(notify) if isinstance(a, Reject)]
    assert str(refused.error) == (f"CHECKPOINT_NOTIFY to '{tmp_path / 'elsewhere'}' refused: "
                                  "pserver:0 has no checkpoint directory (train.checkpoint_dir, "
                                  "or the node's --out) and saves nowhere a message names")
    shell.core.checkpoint_dir = tmp_path / "checkpoints"
    (refused,) = [a for a in shell.send(shell.message(Kind.CHECKPOINT_NOTIFY, 0, 0, dir="/etc"))
                  if isinstance(a, Reject)]
    assert str(refused.error) == ("CHECKPOINT_NOTIFY to '/etc' refused: pserver:0 saves its "
                                  "checkpoints only to its configured directory "
                                  f"'{tmp_path / 'checkpoints'}'")
    same = str(tmp_path / "x" / ".." / "checkpoints")
    actions = shell.send(shell.message(Kind.CHECKPOINT_NOTIFY, 0, 0, dir=same))
    assert [a.directory for a in actions if isinstance(a, SaveCheckpoint)] == \
        [tmp_path / "checkpoints"]
    assert not any(isinstance(a, Reject) for a in actions)
