"""Bad input ends `sim` and `runtime` with one line naming where the problem is, no traceback.

What a user gives wrong (a scenario's YAML, a key given twice, a typo, a rule over several
fields, a ``--set`` or ``--vary`` value, a flag) is one line ``PROG: error: <where>: <what>`` on
stderr and exit status 2, before any work (`runtime.config.commandline`); ``--debug`` adds the
traceback. An unexpected exception says it is an internal error (exit status 70). A sweep
checks every point before it runs any, and leaves an earlier sweep's files alone when one is bad.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import cli as runtime_cli
from runtime.config.commandline import DEBUG_VAR, EXIT_INTERNAL
from runtime.config.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
from runtime.config.scenario_errors import known_fields
from sim import cli, sweep
from sim.sweep import SweepPoint, SweepSpec
from sim.sweep_journal import JOURNAL

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
QUICK = str(QUICKSTART.relative_to(ROOT))


def refused(capsys: pytest.CaptureFixture[str], main: object, *argv: str) -> str:
    """The one line on stderr of `main(ARGV)` refusing its input with exit status 2."""
    with pytest.raises(SystemExit) as info:
        main(list(argv), out=io.StringIO())  # type: ignore[operator]
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def error_of(text: str, *overrides: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.yaml", list(overrides))
    return str(info.value)


BASE = "name: x\nmodel: {name: mlp}\n"


# -- YAML -----------------------------------------------------------------------------------------

def test_yaml_that_does_not_parse_is_one_line_with_its_line() -> None:
    assert error_of(BASE + "train: {steps: 3\n") == \
        "s.yaml:4: not valid YAML: expected ',' or '}', but got '<stream end>' (column 1; " \
        "while parsing a flow mapping from line 3, column 8)"
    assert error_of(BASE + "backend: {kernels: torch, device: cuda:}\n") == \
        "s.yaml:3: not valid YAML: expected ',' or '}', but got ':' (column 39 of 'backend: " \
        "{kernels: torch, device: cuda:}'; while parsing a flow mapping from line 3, column 10)"


def test_a_set_value_that_is_not_yaml_names_the_set(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, cli.main, "run", str(QUICKSTART), "--set", "cluster.trainers=[3") == \
        "sim run: error: --set cluster.trainers=[3: not valid YAML: expected ',' or ']', but " \
        "got '<stream end>' (column 3; while parsing a flow sequence from column 1)"


@pytest.mark.parametrize("text, problem", [
    (BASE + "train: {steps: 150}\ntrain: {steps: 3}\n",
     "s.yaml:4: train: duplicate key 'train' (first at line 3)"),
    (BASE + "train:\n  steps: 150\n  deadline: 1s\n  steps: 3\n",
     "s.yaml:6: train.steps: duplicate key 'steps' (first at line 4)"),
    (BASE + "train: {steps: 150, steps: 3}\n",
     "s.yaml:3: train.steps: duplicate key 'steps' (given before on this line)"),
    (BASE + "cluster: {pservers: 2}\nfaults:\n  - at: 1s\n    crash: pserver:0\n    at: 2s\n",
     "s.yaml:7: faults.0.at: duplicate key 'at' (first at line 5)"),
    (BASE + "network:\n  default:\n    latency: {dist: constant, value: 1ms, value: 2ms}\n",
     "s.yaml:5: network.default.latency.value: duplicate key 'value' (given before on this "
     "line)"),
])
def test_a_key_given_twice_is_refused_at_any_depth(text: str, problem: str) -> None:
    error = error_of(text)
    assert error.startswith(problem + "; ") and "\n" not in error


def test_a_key_given_twice_in_a_set_value_is_refused() -> None:
    assert error_of(BASE, "cluster={trainers: 2, trainers: 3}") == \
        "--set cluster={trainers: 2, trainers: 3}: cluster.trainers: duplicate key " \
        "'trainers'; a mapping takes each key once"


def test_yaml_merge_keys_and_anchors_are_not_duplicates() -> None:
    text = BASE + "x: &t {steps: 3}\ntrain: {<<: *t, deadline: 5s}\n"
    assert "x: Extra inputs" in error_of(text)  # read through, only the unknown section refused
    parsed = parse_scenario(BASE + "train: &t {steps: 3}\n", "s.yaml")
    assert parsed.train.steps == 3


# -- what a --set gave is blamed on it ------------------------------------------------------------

def test_a_typo_in_a_set_names_the_set_and_the_field_it_meant(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, cli.main, "run", QUICK, "--set", "cluster.trainerz=3") == \
        "sim run: error: --set cluster.trainerz=3: cluster.trainerz: Extra inputs are not " \
        "permitted (did you mean 'trainers'?)"


def test_a_typo_in_the_file_names_its_line_and_the_field_it_meant() -> None:
    assert error_of(BASE + "cluster:\n  pservers: 1\n  trainerz: 2\n") == \
        "s.yaml:5: cluster.trainerz: Extra inputs are not permitted (did you mean 'trainers'?)"
    assert error_of(BASE + "cluster: {pservers: 1}\nfaults:\n  - {at: 1s, crash: pserver:0, "
                    "restrt_after: 1s}\n").endswith("(did you mean 'restart_after'?)")
    far = error_of(BASE + "sectionless: 1\n")
    assert far.startswith("s.yaml:3: sectionless: Extra inputs are not permitted (known here: "
                          "name, description, seed, model,")


def test_a_bad_value_from_a_set_is_blamed_on_the_set_the_file_on_its_line() -> None:
    text = BASE + "cluster: {pservers: 1, trainers: 2}\n"
    assert error_of(text, "cluster.trainers=0") == \
        "--set cluster.trainers=0: cluster.trainers: Input should be greater than or equal to 1"
    assert error_of(text, "cluster={trainers: 0}") == \
        "--set cluster={trainers: 0}: cluster.trainers: Input should be greater than or equal to 1"
    assert error_of(text, "cluster.trainers=0", "cluster.trainers=-1").startswith(
        "--set cluster.trainers=-1: ")  # the later one wins, and is blamed
    assert error_of(text, "train.steps=5", "cluster.pservers=-1").startswith(
        "--set cluster.pservers=-1: cluster.pservers: ")
    assert error_of(BASE + "cluster: {trainers: 0}\n", "train.steps=5") == \
        "s.yaml:3: cluster.trainers: Input should be greater than or equal to 1"


def test_a_set_that_is_not_path_equals_value_is_one_line() -> None:
    assert error_of(BASE, "=3") == "--set =3: expected path=value, e.g. cluster.trainers=4"
    assert error_of(BASE, "train..steps=3").startswith("--set train..steps=3: expected path=value")


# -- rules over several fields --------------------------------------------------------------------

CROSS = BASE + "transpiler: {mode: async}\ncluster: {pservers: 1}\nexpect:\n  params_equal_to: local\n"


def test_a_rule_over_fields_names_them_and_the_line_of_one() -> None:
    assert error_of(CROSS) == \
        "s.yaml:6: expect.params_equal_to, transpiler.mode: expect.params_equal_to needs " \
        "transpiler.mode sync, nccl2 or collective (grad_allreduce, " \
        "single_process_multi_thread), not async"


def test_a_rule_broken_by_a_set_names_the_set() -> None:
    text = BASE + "expect: {params_equal_to: local}\n"
    assert error_of(text, "transpiler.mode=async").startswith(
        "--set transpiler.mode=async: expect.params_equal_to, transpiler.mode: ")
    assert error_of(BASE, "cluster.pservers=0").startswith(
        "--set cluster.pservers=0: cluster.pservers, transpiler.mode: cluster.pservers: 0 only")


def test_a_rule_of_a_section_points_at_the_field_it_is_about() -> None:
    assert error_of(BASE + "data:\n  batch_size: 8\n  name: csv\n") == \
        "s.yaml:5: data: name csv: reading a file needs its path"
    assert error_of(BASE + "transpiler:\n  mode: sync\n  dc_asgd: true\n") == \
        "s.yaml:5: transpiler: dc_asgd needs mode async, not sync"
    assert error_of(BASE + "transpiler:\n  dc_asgd: true\n", "transpiler.mode=geo") == \
        "--set transpiler.mode=geo: transpiler: dc_asgd needs mode async, not geo"


def test_a_fault_off_the_cluster_points_at_the_fault_or_the_set() -> None:
    text = BASE + "cluster: {pservers: 2}\nfaults:\n  - {at: 1s, crash: 'pserver:1'}\n"
    assert parse_scenario(text, "s.yaml").faults
    assert error_of(text.replace("pserver:1", "pserver:5")).startswith(
        "s.yaml:5: faults.0, cluster, transpiler.mode: faults[0]: crash 'pserver:5': no such node")
    assert error_of(text, "cluster.pservers=1").startswith(
        "--set cluster.pservers=1: faults.0, cluster, transpiler.mode: faults[0]: ")


def test_the_fields_of_unions_are_known_for_suggestions() -> None:
    assert "restart_after" in known_fields(Scenario, ("faults", 0, "crash"))
    assert known_fields(Scenario, ("network",))[:3] == ["default", "links", "nics"]
    assert known_fields(Scenario, ("name",)) == []


# -- the commands ---------------------------------------------------------------------------------

def test_a_missing_file_and_a_bad_flag_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, cli.main, "run", "nowhere.yaml") == \
        "sim run: error: nowhere.yaml: cannot read scenario: No such file or directory"
    assert refused(capsys, cli.main, "run", QUICK, "--seed", "x") == \
        "sim run: error: argument --seed: invalid int value: 'x' (see sim run --help)"
    assert refused(capsys, cli.main, "run") == \
        "sim run: error: the following arguments are required: scenario (see sim run --help)"


def test_runtime_up_refuses_a_bad_set_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(capsys, runtime_cli.main, "up", QUICK, "--set", "train.stepz=3") == \
        "runtime up: error: --set train.stepz=3: train.stepz: Extra inputs are not permitted " \
        "(did you mean 'steps'?)"


@pytest.mark.parametrize("debug", [["--debug", "run"], ["run", "--debug"]])
def test_debug_adds_the_traceback_before_or_after_the_command(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        debug: list[str]) -> None:
    monkeypatch.delenv(DEBUG_VAR, raising=False)  # --debug sets it: gone after the test
    with pytest.raises(SystemExit) as info:
        cli.main([*debug, QUICK, "--set", "cluster.trainerz=3"], out=io.StringIO())
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1].startswith("sim run: error: --set cluster.trainerz=3: ")
    assert os.environ[DEBUG_VAR] == "1"  # for the processes it would start


def test_an_internal_error_says_so_in_one_line(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_run", lambda args, stream: 1 / 0)
    monkeypatch.delenv(DEBUG_VAR, raising=False)
    code = cli.main(["run", QUICK], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == EXIT_INTERNAL and "Traceback" not in err
    assert err == "sim run: internal error: ZeroDivisionError: division by zero (a bug of " \
                  "pslab: rerun with --debug for the traceback, and report it)\n"
    code = cli.main(["run", QUICK, "--debug"], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == EXIT_INTERNAL and err.startswith("Traceback (most recent call last):")


@pytest.mark.timeout(60)
def test_the_installed_commands_print_no_traceback_for_bad_input(tmp_path: Path) -> None:
    (tmp_path / "dup.yaml").write_text(BASE + "train: {steps: 150}\ntrain: {steps: 3}\n")
    for module, argv in (("sim.cli", ["run", "dup.yaml", "--out", "o"]),
                         ("runtime.cli", ["up", "dup.yaml", "--out", "o"])):
        done = subprocess.run([sys.executable, "-m", module, *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=50)
        prog = f"{module.split('.')[0]} {argv[0]}"
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == f"{prog}: error: dup.yaml:4: train: duplicate key 'train' (first " \
                              "at line 3); a mapping takes each key once, YAML would keep only " \
                              "the last\n"
    assert not (tmp_path / "o").exists()


# -- sweeps ---------------------------------------------------------------------------------------

class Counted:
    """`sim.sweep.run_point`, counting the points it simulates."""

    def __init__(self) -> None:
        self.simulated = 0

    def __call__(self, spec: SweepSpec, settings: dict[str, str]) -> SweepPoint:
        self.simulated += 1
        return SweepPoint(settings, passed=True)


@pytest.mark.parametrize("vary, problem", [
    ("cluster.trainers=2,0", "--vary cluster.trainers=0: cluster.trainers: Input should be "
                             "greater than or equal to 1"),
    ("cluster.trainerz=2,3", "--vary cluster.trainerz=2: cluster.trainerz: Extra inputs are not "
                             "permitted (did you mean 'trainers'?) (and 1 more point(s))"),
    ("transpiler.mode=sync,async", "--vary transpiler.mode=async: expect.params_equal_to, "
                                   "transpiler.mode: expect.params_equal_to needs"),
])
def test_a_sweep_with_a_bad_point_runs_none_and_keeps_the_earlier_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        vary: str, problem: str) -> None:
    counted = Counted()
    monkeypatch.setattr(sweep, "run_point", counted)
    earlier = {name: f"earlier {name}\n" for name in ("sweep.json", JOURNAL, "sweep.png")}
    for name, text in earlier.items():
        (tmp_path / name).write_text(text)
    line = refused(capsys, cli.main, "sweep", QUICK, "--vary", vary, "--out", str(tmp_path),
                   "--force")
    assert line.startswith(f"sim sweep: error: {problem}")
    assert counted.simulated == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == earlier


def test_resuming_where_no_journal_is_refuses_to_overwrite_the_sweep_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "run_point", Counted())
    (tmp_path / "sweep.json").write_text("{}\n")
    assert refused(capsys, cli.main, "sweep", QUICK, "--vary", "seed=1,2", "--out",
                   str(tmp_path), "--resume") == \
        f"sim sweep: error: {tmp_path / 'sweep.json'} exists but {JOURNAL}, which --resume " \
        "continues, does not; pass --force to overwrite it, or --out another folder"
    assert (tmp_path / "sweep.json").read_text() == "{}\n"


def test_a_sweep_whose_points_miss_their_expectations_ends_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "run_point",
                        lambda spec, settings: SweepPoint(settings, failed=["final_loss_below"]))
    out = io.StringIO()
    code = cli.main(["sweep", QUICK, "--vary", "seed=1,2", "--out", str(tmp_path), "--no-plots"],
                    out=out)
    last = out.getvalue().splitlines()[-2:]
    assert code == 1
    assert last == ["0 of 2 point(s) met every expectation",
                    "FAILED: 2 of 2 point(s) missed their expectations (the table says which)"]
    assert "OK" not in out.getvalue()


def test_a_loaded_scenario_is_unchanged_by_the_stricter_loader() -> None:
    assert load_scenario(QUICKSTART).cluster.trainers == 2


def test_an_os_error_is_one_line_naming_the_file(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(args: object, stream: object) -> int:
        raise PermissionError(13, "Permission denied", "out/x/metrics.json")

    monkeypatch.setattr(cli, "_run", denied)
    assert cli.main(["run", QUICK], out=io.StringIO()) == 1
    assert capsys.readouterr().err == "sim run: error: out/x/metrics.json: Permission denied\n"


# -- a node's failure -----------------------------------------------------------------------------

ALONE = BASE + "cluster: {pservers: 1, trainers: 1, base_port: %d}\n" \
    "train: {steps: 3, deadline: 5s, startup_timeout: 1s}\n"


@pytest.mark.timeout(90)
def test_a_node_on_its_own_fails_on_a_condition_of_the_job_without_traceback(
        tmp_path: Path) -> None:
    """A trainer run with ``--role`` whose pserver never comes: one line saying so (a traceback
    only with ``--debug``)."""
    from cluster_helpers import free_endpoints

    port = int(free_endpoints(1)[0].rpartition(":")[2])
    (tmp_path / "alone.yaml").write_text(ALONE % port)
    command = [sys.executable, "-m", "runtime.cli", "up", "alone.yaml", "--role", "trainer",
               "--index", "0", "--insecure"]
    env = {k: v for k, v in os.environ.items() if k != DEBUG_VAR}
    for debug in ([], ["--debug"]):
        done = subprocess.run(command + debug, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1].startswith(
            "trainer:0 failed: PortsNotReady: trainer:0: no pserver listening at")
        assert ("Traceback" in done.stderr) == bool(debug), done.stderr


def test_a_failure_the_scenario_expects_is_logged_without_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.services.failures import traceback_wanted

    monkeypatch.delenv(DEBUG_VAR, raising=False)
    expecting = parse_scenario(BASE + "expect: {error: 'no reply from pserver:1'}\n")
    plain = parse_scenario(BASE)
    lost = RuntimeError("no reply from pserver:1")
    assert not traceback_wanted(expecting, lost)
    assert traceback_wanted(plain, lost) and traceback_wanted(expecting, KeyError("x"))
    assert not traceback_wanted(plain, TimeoutError("deadline"))
    monkeypatch.setenv(DEBUG_VAR, "1")
    assert traceback_wanted(expecting, lost)
