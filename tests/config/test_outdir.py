"""Output folders (`runtime.config.outdir`): checked before any work, one run at a time.

A path that cannot be a folder is refused at once, in one line naming it and why; a second run
into a folder another process holds is refused, naming the holder; a holder that died holds
nothing; the nodes of a job run on their own may share a folder, each claiming its own part.
`sim run` and `runtime up` refuse both with exit status 2 and one line, before doing anything."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime import cli as runtime_cli
from runtime.config.outdir import (OutputDirError, OutputLocked, check_output_dir,
                                   check_output_file, claim_output)
from sim import cli as sim_cli

from runtime_runs import scenario_file

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
HOLDER = """\
import sys
from pathlib import Path
from runtime.config.outdir import claim_output
with claim_output(Path(sys.argv[1]), "holder --of the folder", node=sys.argv[2] or None):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextmanager
def held(path: Path, node: str | None = None) -> Iterator[subprocess.Popen[str]]:
    """Another process holding `path` (or `node`'s part of it) until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), node or ""],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(OutputDirError) as caught:
        check_output_dir(afile / "sub" / "deeper")
    assert str(caught.value) == (f"output folder {afile}/sub/deeper: {afile} is a file, not a "
                                 "folder")
    with pytest.raises(OutputDirError, match=r": it is a file, not a folder$"):
        check_output_dir(afile)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in any folder")
def test_a_folder_this_process_cannot_write_in_is_named(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(OutputDirError, match=rf"^output folder {locked}: cannot write in "
                                                 r"it: permission denied$"):
            with claim_output(locked):
                pass
    finally:
        locked.chmod(0o700)


@pytest.mark.timeout(60)
def test_a_second_run_is_refused_naming_the_holder_and_a_dead_holder_holds_nothing(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    with held(out) as holder:
        with pytest.raises(OutputLocked) as caught:
            with claim_output(out):
                pass
        message = str(caught.value)
        assert message.startswith(f"output folder {out} is in use by another run, pid "
                                  f"{holder.pid} on ")
        assert message.endswith(": holder --of the folder; wait for it to end, or give another "
                                "output folder")
        holder.send_signal(signal.SIGKILL)  # no cleanup: the kernel drops its lock
        holder.wait(timeout=10)
        with claim_output(out) as claim:
            assert claim.path == out
    assert list(out.iterdir()) == []  # the last holder of the lock removed its file


@pytest.mark.timeout(60)
def test_nodes_on_their_own_share_a_folder_but_not_a_node(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with held(out, node="pserver-0"):
        with claim_output(out, node="trainer-0"):  # another node of the job: welcome
            pass
        with pytest.raises(OutputLocked, match=r"in use by another run of pserver-0, pid "):
            with claim_output(out, node="pserver-0"):
                pass
        with pytest.raises(OutputLocked, match=r"in use by nodes run on their own: pserver-0 "
                                               r"\(pid "):
            with claim_output(out):
                pass
    assert list(out.iterdir()) == []  # the last node out removed the shared lock file too


def test_a_claim_is_reentrant_within_a_process(tmp_path: Path) -> None:
    with claim_output(tmp_path) as outer:
        with claim_output(tmp_path) as inner:
            assert inner is outer and outer.depth == 2
        assert outer.depth == 1


# -- the commands ----------------------------------------------------------------------------------

def refused(main: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a command (`main`) refused `argv` with, exit status 2, having printed
    nothing else."""
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        main(argv, out=out)  # type: ignore[operator]
    assert caught.value.code == 2
    assert out.getvalue() == ""  # nothing started
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def test_sim_run_refuses_an_output_path_under_a_file_before_simulating(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    line = refused(sim_cli.main, ["run", str(QUICKSTART), "--out", str(afile / "sub")], capsys)
    assert line == f"sim run: error: output folder {afile}/sub: {afile} is a file, not a folder"


def test_runtime_up_refuses_an_output_path_under_a_file_before_starting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    line = refused(runtime_cli.main, ["up", str(scenario_file(tmp_path)), "--out",
                                      str(afile / "sub")], capsys)
    assert line == (f"runtime up: error: output folder {afile}/sub: {afile} is a file, not a "
                    "folder")


def test_an_output_file_that_is_a_folder_or_cannot_be_written_is_named(tmp_path: Path) -> None:
    with pytest.raises(OutputDirError) as caught:
        check_output_file(tmp_path, "m.json")
    assert str(caught.value) == (f"output file {tmp_path}: it is a folder; name a file in it, "
                                 f"such as {tmp_path}/m.json")
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(OutputDirError, match=r"is a file, not a folder$"):
        check_output_file(afile / "m.json", "m.json")
    check_output_file(tmp_path / "new" / "m.json", "m.json")  # made, writable: no error
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / "m.json").exists()
    assert list((tmp_path / "new").iterdir()) == []  # the probe leaves nothing behind


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_an_output_file_where_nothing_can_be_written_is_named_before_the_work() -> None:
    with pytest.raises(OutputDirError, match=r"^output file /proc/m.json: cannot write in /proc: "):
        check_output_file(Path("/proc/m.json"), "m.json")


@pytest.mark.parametrize("command", ["profile", "calibrate"])
def test_profile_and_calibrate_refuse_an_output_folder_before_measuring(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [command, str(scenario_file(tmp_path))] if command == "profile" else [command]
    line = refused(runtime_cli.main, [*args, "-o", str(tmp_path)], capsys)
    usual = "profile.json" if command == "profile" else "machine.json"
    assert line == (f"runtime {command}: error: -o {tmp_path}: output file {tmp_path}: it is a "
                    f"folder; name a file in it, such as {tmp_path}/{usual}")


@pytest.mark.timeout(60)
def test_sim_run_and_runtime_up_refuse_a_folder_another_run_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    scenario = scenario_file(tmp_path)
    with held(out) as holder:
        for main, argv, prog in ((sim_cli.main, ["run", str(QUICKSTART)], "sim run"),
                                 (runtime_cli.main, ["up", str(scenario)], "runtime up")):
            line = refused(main, [*argv, "--out", str(out)], capsys)
            assert line.startswith(f"{prog}: error: output folder {out} is in use by another "
                                   f"run, pid {holder.pid} on "), line
        line = refused(runtime_cli.main, ["up", str(scenario), "--out", str(out), "--role",
                                          "pserver", "--index", "0", "--insecure"], capsys)
        assert line.startswith(f"runtime up: error: output folder {out} is in use by another "
                               f"run, pid {holder.pid} on "), line
    assert list(out.iterdir()) == []  # nothing written, the holder's lock file removed
