"""Key files under a kill or a full disk: a ``runtime keys`` killed while it writes a secret
leaves it only in a file named ``*.key_secret`` (what ``.dockerignore`` keeps out of an image),
the next ``runtime keys`` or ``--export`` in that directory removes such leftovers and no export
takes one for a key; a full disk is one line naming the file, not a traceback."""

from __future__ import annotations

import errno
import os
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from runtime import cli
from runtime.config import atomic
from runtime.network.curve import load_keys, write_keys

from checkpoint_helpers import full_disk

ROOT = Path(__file__).resolve().parents[2]
STEMS = ["pserver-0", "trainer-0", "trainer-1"]


def ignored_by_the_image(name: str) -> bool:
    """Whether ``.dockerignore`` keeps a file `name` under ``deploy/keys/x/`` out of the image
    by its name (not by its directory)."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#") and "*" in line]
    return any(fnmatch(f"deploy/keys/x/{name}", pattern) for pattern in patterns)


def holding_a_secret(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if b"secret-key" in p.read_bytes())


def killed_in_the_write_of(file: int, monkeypatch: pytest.MonkeyPatch,
                           kill: type[BaseException]) -> None:
    """From now on the process dies (`kill`, and no cleanup reaches the disk) at the fsync of
    the `file`-th file it creates (from 1), its content written."""
    real_fsync, real_open = os.fsync, os.open
    created: list[int] = []

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, *args, **kwargs)
        if flags & os.O_CREAT:
            created.append(fd)
        return fd

    def fsync(fd: int) -> None:
        if len(created) >= file and fd == created[file - 1]:
            raise kill("killed")
        real_fsync(fd)

    def dead(*args: Any, **kwargs: Any) -> None:
        raise kill("killed")

    monkeypatch.setattr(atomic.os, "open", open_)
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", dead)  # the cleanup that SIGKILL never runs


@pytest.mark.parametrize("kill", [KeyboardInterrupt, SystemExit])
def test_a_killed_runtime_keys_leaves_its_secret_only_in_a_key_secret_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill: type[BaseException]) -> None:
    directory = tmp_path / "keys"
    write_keys(directory, STEMS)
    killed_in_the_write_of(6, monkeypatch, kill)  # trainer-1.key_secret
    with pytest.raises(kill):
        write_keys(directory, STEMS, force=True)
    monkeypatch.undo()
    left = [p.name for p in directory.iterdir() if p.name.startswith(".")]
    assert len(left) == 1 and left[0].endswith(".tmp.key_secret")
    assert all(name.endswith(".key_secret") and ignored_by_the_image(name)
               for name in holding_a_secret(directory))

    export = tmp_path / "export"  # an export killed the same way, into its own directory
    killed_in_the_write_of(4, monkeypatch, kill)  # after the 3 public keys, the secret
    command = ["keys", str(directory), "--export", "pserver-0", str(export)]
    if kill is KeyboardInterrupt:  # Ctrl-C: the command says it was interrupted, status 130
        assert cli.main(command) == 130
    else:
        with pytest.raises(kill):
            cli.main(command)
    monkeypatch.undo()
    assert [name for name in holding_a_secret(export) if not name.endswith(".key_secret")] == []
    (stale,) = [p.name for p in export.iterdir() if p.name.startswith(".")]

    # the next export into that directory is not refused for another node's secret, and cleans
    assert cli.main(["keys", str(directory), "--export", "trainer-0", str(export)]) == 0
    assert sorted(p.name for p in export.iterdir()) == \
        ["pserver-0.key", "trainer-0.key", "trainer-0.key_secret", "trainer-1.key"]
    load_keys(export, "trainer-0")

    assert cli.main(["keys", str(directory), "--pservers", "1", "--trainers", "2",
                     "--force"]) == 0
    assert sorted(p.name for p in directory.iterdir()) == \
        sorted(f"{stem}{suffix}" for stem in STEMS for suffix in (".key", ".key_secret"))
    assert stale.startswith(".pserver-0.")


def test_a_full_disk_is_one_line_naming_the_key_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "keys"
    full_disk(monkeypatch)
    assert cli.main(["keys", str(directory), "--pservers", "1", "--trainers", "1"]) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err == (f"runtime keys: {directory}/pserver-0.key: cannot write: "
                   f"{os.strerror(errno.ENOSPC)}\n")
    assert list(directory.iterdir()) == []

    write_keys(directory, ["pserver-0"])
    full_disk(monkeypatch)
    assert cli.main(["keys", str(directory), "--export", "pserver-0",
                     str(tmp_path / "out")]) == 1
    monkeypatch.undo()
    assert capsys.readouterr().err == (f"runtime keys: {tmp_path}/out/pserver-0.key: cannot "
                                       f"write: {os.strerror(errno.ENOSPC)}\n")


def test_a_key_directory_that_cannot_be_made_is_one_line_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert cli.main(["keys", str(tmp_path / "k"), "--pservers", "1", "--trainers", "1"]) == 1
    assert capsys.readouterr().err == (f"runtime keys: {tmp_path}/k: cannot write keys there: "
                                       f"{os.strerror(errno.ENOSPC)}\n")

