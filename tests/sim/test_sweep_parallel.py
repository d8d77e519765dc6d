"""`sim sweep` as users run it: in parallel (``--jobs``, ``--ray``), resumed after an
interruption (``--resume``), and refusing what would lose results or waste a run.

Every way of running a sweep ends with the sweep.json bytes and the table of a sequential
sweep, whatever order its points finish in; an interrupted sweep resumed runs only the points it
lacks. The sweep is tiny (quickstart, 3 steps, 4 points) and the sequential baseline is run once
for the module."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sim import cli, sweep
from sim.sweep import SweepPoint, SweepSpec
from sim.sweep_journal import JOURNAL

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
SWEEP = [str(QUICKSTART), "--vary", "cluster.pservers=1,2", "--vary", "cluster.trainers=2,3",
         "--set", "train.steps=3", "--set", "expect.final_loss_below=null", "--no-plots"]
POINTS = 4
RUN_POINT = sweep.run_point
BOX = "│┃┏┡└"
"""The characters that start the table's lines."""


def sim(*argv: str) -> tuple[int, str]:
    """`sim ARGV` run in this process (a sweep with --jobs in a process of its own instead:
    multiprocessing's helpers, its resource tracker, would outlive it here and be taken for
    processes another test left behind)."""
    if "--jobs" in argv:
        done = subprocess.run([sys.executable, "-m", "sim.cli", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=100)
        return done.returncode, done.stdout
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


def table(output: str) -> list[str]:
    return [line for line in output.splitlines() if line[:1] in BOX]


pytestmark = pytest.mark.xdist_group("sweep_parallel")
"""The module on one worker (pyproject.toml's ``--dist loadgroup``): its module-scoped run
below runs once, not once on each worker."""


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[str]]:
    """The sequential sweep's sweep.json bytes and table."""
    out = tmp_path_factory.mktemp("sequential")
    code, output = sim("sweep", *SWEEP, "--out", str(out))
    assert code == 0, output
    assert [line.split("]")[0] for line in output.splitlines() if line.startswith("[")] == \
        [f"[{k}/{POINTS}" for k in range(1, POINTS + 1)]
    return (out / "sweep.json").read_bytes(), table(output)


class Counted:
    """`sim.sweep.run_point`, counting the points it simulates; raises `KeyboardInterrupt`
    (Ctrl-C) instead of simulating the point after the `stop_after`-th."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after, self.simulated = stop_after, 0

    def __call__(self, spec: SweepSpec, settings: dict[str, str]) -> SweepPoint:
        if self.simulated == self.stop_after:
            raise KeyboardInterrupt
        self.simulated += 1
        return RUN_POINT(spec, settings)


# -- parallel runs --------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_parallel_sweep_writes_the_bytes_of_a_sequential_one(
        tmp_path: Path, sequential: tuple[bytes, list[str]]) -> None:
    code, output = sim("sweep", *SWEEP, "--out", str(tmp_path), "--jobs", "2")
    assert code == 0, output
    assert (tmp_path / "sweep.json").read_bytes() == sequential[0]
    assert table(output) == sequential[1]
    done = [line for line in output.splitlines() if line.startswith("[")]
    assert sorted(line.split("]")[0] for line in done) == \
        sorted(f"[{k}/{POINTS} done" for k in range(1, POINTS + 1))
    assert "2 worker processes" in output.splitlines()[0]


@pytest.mark.timeout(180)
def test_a_sweep_on_ray_writes_the_bytes_of_a_sequential_one(
        tmp_path: Path, sequential: tuple[bytes, list[str]]) -> None:
    """``--ray local``: a Ray instance of this machine, started and shut down by the sweep, in a
    process of its own (Ray's process-wide state stays out of the test session's)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'pslab[ray]')")
    done = subprocess.run([sys.executable, "-m", "sim.cli", "sweep", *SWEEP, "--out",
                           str(tmp_path), "--ray", "local"], cwd=ROOT, capture_output=True,
                          text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "sweep.json").read_bytes() == sequential[0]
    assert table(done.stdout) == sequential[1]


def test_ray_missing_is_one_line_saying_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(SystemExit) as info:
        sim("sweep", *SWEEP, "--out", str(tmp_path), "--ray", "auto")
    assert info.value.code == 2
    assert capsys.readouterr().err == \
        "sim sweep: error: --ray needs Ray, which is not installed: pip install 'pslab[ray]'\n"


def test_no_ray_cluster_running_says_how_to_start_one() -> None:
    """Ray's own words name an ``--address`` flag this command does not have."""
    from sim.sweep_runners import RunnerError, _connect

    class NoCluster:
        def init(self, **_: object) -> None:
            raise ConnectionError("Could not find any running Ray instance. Please specify the "
                                  "one to connect to by setting `--address` flag or "
                                  "`RAY_ADDRESS` environment variable.")

    with pytest.raises(RunnerError) as info:
        _connect(NoCluster(), "auto")
    assert str(info.value) == ("--ray auto: no Ray cluster is running here; `ray start --head` "
                               "starts one, or --ray local starts one for this sweep alone")
    with pytest.raises(RunnerError, match=r"^--ray 10.0.0.1:6379: Could not find any"):
        _connect(NoCluster(), "10.0.0.1:6379")


# -- resuming -------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_an_interrupted_sweep_resumed_runs_only_the_missing_points(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        sequential: tuple[bytes, list[str]]) -> None:
    interrupted = Counted(stop_after=1)
    monkeypatch.setattr(sweep, "run_point", interrupted)
    code, output = sim("sweep", *SWEEP, "--out", str(tmp_path))
    assert code == 130, output
    assert output.splitlines()[-1].startswith(f"interrupted: 1 of {POINTS} point(s) saved in")
    assert not (tmp_path / "sweep.json").exists()
    resumed = Counted()
    monkeypatch.setattr(sweep, "run_point", resumed)
    code, output = sim("sweep", *SWEEP, "--out", str(tmp_path), "--resume")
    assert code == 0, output
    assert resumed.simulated == POINTS - 1
    assert f"{POINTS} point(s) (1 done, saved in" in output.splitlines()[0]
    assert (tmp_path / "sweep.json").read_bytes() == sequential[0]
    assert table(output) == sequential[1]
    again = Counted()  # a finished sweep resumed: nothing to run, the same file
    monkeypatch.setattr(sweep, "run_point", again)
    assert sim("sweep", *SWEEP, "--out", str(tmp_path), "--resume")[0] == 0
    assert again.simulated == 0 and (tmp_path / "sweep.json").read_bytes() == sequential[0]


@pytest.mark.timeout(120)
def test_a_parallel_sweep_killed_leaves_no_worker_and_resumes(
        tmp_path: Path, sequential: tuple[bytes, list[str]]) -> None:
    """SIGKILL, no cleanup in the sweep's process: its workers end by themselves (the pipe of
    its stdout, which they inherit, closes), a torn last journal line is skipped, and
    ``--resume`` runs only the points not saved."""
    sweep_command = [sys.executable, "-m", "sim.cli", "sweep", *SWEEP, "--out", str(tmp_path),
                     "--jobs", "2"]
    with subprocess.Popen(sweep_command, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("[1/"):
                os.kill(proc.pid, signal.SIGKILL)
                break
        rest = proc.stdout.read()  # EOF: every process holding the pipe has ended
    assert proc.returncode == -signal.SIGKILL, rest
    saved = len((tmp_path / JOURNAL).read_text().splitlines())
    assert 1 <= saved <= POINTS
    code, output = sim("sweep", *SWEEP, "--out", str(tmp_path), "--jobs", "2", "--resume")
    assert code == 0, output
    ran = [line for line in output.splitlines() if line.startswith("[")]
    assert len(ran) == POINTS - saved
    assert (tmp_path / "sweep.json").read_bytes() == sequential[0]


# -- refusals -------------------------------------------------------------------------------------

def test_a_sweep_does_not_overwrite_an_earlier_one_unless_told(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        sequential: tuple[bytes, list[str]]) -> None:
    (tmp_path / "sweep.json").write_bytes(b"{}\n")
    with pytest.raises(SystemExit) as info:
        sim("sweep", *SWEEP, "--out", str(tmp_path))
    assert info.value.code == 2
    assert capsys.readouterr().err == \
        f"sim sweep: error: {tmp_path / 'sweep.json'} exists, from an earlier sweep; pass " \
        "--resume to run only the points it lacks, or --force to overwrite it\n"
    assert (tmp_path / "sweep.json").read_bytes() == b"{}\n"
    monkeypatch.setattr(sweep, "run_point", Counted(stop_after=0))  # Ctrl-C at once
    assert sim("sweep", *SWEEP, "--out", str(tmp_path), "--force")[0] == 130
    assert not (tmp_path / "sweep.json").exists()


@pytest.mark.timeout(60)
def test_resuming_the_points_of_another_sweep_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "run_point", Counted(stop_after=1))
    assert sim("sweep", *SWEEP, "--out", str(tmp_path))[0] == 130
    journal = (tmp_path / JOURNAL).read_bytes()
    with pytest.raises(SystemExit) as info:
        sim("sweep", *SWEEP, "--set", "data.batch_size=16", "--out", str(tmp_path), "--resume")
    assert info.value.code == 2
    assert capsys.readouterr().err == \
        f"sim sweep: error: {tmp_path / JOURNAL} holds the points of another sweep (another " \
        "scenario text, --set, --seed or --loss-target); pass --force to start this one " \
        "afresh, or --out another folder\n"
    assert (tmp_path / JOURNAL).read_bytes() == journal


def test_a_bad_point_is_refused_before_any_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted()
    monkeypatch.setattr(sweep, "run_point", counted)
    with pytest.raises(SystemExit) as info:  # in this process: refused before any pool starts
        cli.main(["sweep", str(QUICKSTART), "--vary", "cluster.trainers=2,0", "--vary",
                  "transpiler.mode=sync,bogus", "--out", str(tmp_path), "--jobs", "2"],
                 out=io.StringIO())
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("sim sweep: error: --vary transpiler.mode=bogus: ")
    assert "transpiler.mode: Input should be 'sync'" in err
    assert err.endswith("(and 2 more point(s))\n")  # trainers=0 twice
    assert counted.simulated == 0 and not tmp_path.joinpath(JOURNAL).exists()


def test_jobs_takes_a_count_or_auto(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["sweep", "s.yaml", "--vary", "seed=1", "-j", "auto"]).jobs == 0
    assert parser.parse_args(["sweep", "s.yaml", "--vary", "seed=1", "-j", "3"]).jobs == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["sweep", "s.yaml", "--vary", "seed=1", "--jobs", "-1"])
    assert "expected a number of processes or auto, got '-1'" in capsys.readouterr().err


def test_the_journal_skips_a_torn_last_line(tmp_path: Path) -> None:
    from sim.sweep_journal import Journal, load_points

    path = tmp_path / JOURNAL
    with Journal(path, "k") as journal:
        journal.add(SweepPoint({"seed": "1"}, final_loss=0.5))
        journal.add(SweepPoint({"seed": "2"}, final_loss=float("nan")))
    whole = path.read_text()
    path.write_text(whole + whole.splitlines()[0][:30])  # killed in the middle of a line
    points = load_points(path, "k")
    assert [p.settings for p in points] == [{"seed": "1"}, {"seed": "2"}]
    with Journal(path, "k", points):
        pass
    assert path.read_text() == whole
    assert json.loads(whole.splitlines()[0])["sweep"] == "k"


FORKSERVER_LEFT = """
import os, sys
from sim import cli
code = cli.main(sys.argv[1:])
children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
print("LEFT", [open(f"/proc/{c}/cmdline").read().replace(chr(0), " ") for c in children])
sys.exit(code)
"""


@pytest.mark.timeout(120)
def test_a_parallel_sweep_run_as_a_library_call_stops_its_forkserver(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", FORKSERVER_LEFT, "sweep", *SWEEP, "--out",
                           str(tmp_path), "--jobs", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    left = [line for line in done.stdout.splitlines() if line.startswith("LEFT")]
    assert left and "forkserver" not in left[0], left
