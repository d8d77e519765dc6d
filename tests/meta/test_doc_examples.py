"""The documentation's examples run as written and do what the text around them says.

Every fenced block of README.md and docs/*.md whose lines are commands (`sim`, `runtime`,
`transpiler`, `python`, `pip`) is extracted, and each command runs in a fresh folder that sees
the repository's ``scenarios/``, ``examples/``, ``benchmarks/`` and ``docs/``, so whatever it
writes (``out/...``, ``keys/``, ``profile.json``) lands there, ``$PWD`` being that folder:
``sim`` in this process (its BLAS on one thread, as `runtime up` gives each node its share of the
cores, and ``--no-plots``, which tests/sim/test_sim_run.py covers), ``runtime`` as the installed
command (but for those that start no process: `IN_PROCESS`), ``python`` as this one's. A run
must exit 0; a sweep whose table follows it in the README must give each point
the outcome the table states (and exit 1 where a point fails). `EXCLUDED` lists, with a reason
each, the commands that cannot run here; `SHORTENED` the ones run with fewer steps, where what
the text states of them does not depend on the steps. ``python`` blocks run too, but for the
fragments `PY_FRAGMENTS` names.

Every example scenario (docs/*.yaml, scenarios/**/*.yaml, examples/*.yaml) builds its job,
writes to a folder of its own, and is replayed against its `expect` block by the test
`REPLAYED_BY` names for it (docs/scenario-example.yaml here)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from runtime import cli as runtime_cli
from runtime.config.metrics import read_metrics
from runtime.config.scenario import load_scenario
from runtime.services.job import check_job
from sim import cli as sim_cli

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("sim", "runtime", "transpiler", "python", "python3", "pip")
LINKED = ("scenarios", "examples", "benchmarks", "docs")
"""What a command's folder sees of the repository (the paths the documented commands name)."""

EXCLUDED = {
    "python3 -m venv .venv": "installs from PyPI (the network), then runs the whole test suite; "
                             "its `sim run scenarios/quickstart.yaml` runs below (README's "
                             "Simulating block)",
    "runtime up scenarios/quickstart.yaml --netns":
        "network namespaces need root and iproute2; tests/launch/test_netns.py runs them where it "
        "can",
    "runtime up scenarios/quickstart.yaml --role":
        "one node per host, across hosts; tests/launch/test_collect.py runs the roles on one",
    "runtime collect out/pserver-0": "merges the records of the across-hosts run above",
    "runtime calibrate -o machine.json":
        "measures this machine for 40 s to 2 minutes; tests/launch/test_calibrate.py calibrates on "
        "a small grid",
    "sim run scenarios/async.yaml --set compute={model: calibrated": "needs the machine file of "
                                                                     "`runtime calibrate` above",
    "sim run scenarios/scale.yaml": "1,000 trainers x 100 pservers: 3 to 5 minutes and 1 GiB; "
                                    "tests/sim/test_timing_mode.py runs it reduced",
    "runtime up scenarios/faults/lossy.yaml":
        "the same run is tests/faults/test_runtime_faults.py's replay of every fault scenario as "
        "processes",
    "python -m pytest": "runs the test suite, or a part of it: this test is one of them",
}
"""Command prefix -> why the command does not run here."""

SHORTENED = {
    "sim sweep scenarios/quickstart.yaml --vary cluster.pservers=1,2,4":
        (["--set", "train.steps=20"], "the text states only that it tabulates the six points"),
    "runtime profile scenarios/quickstart.yaml -o compact.json --steps 100":
        (["--steps", "20"], "the profile's figures are per call and per message, not per run"),
    "python benchmarks/torch_backend.py":
        (["--rounds", "1", "--steps", "2"], "it prints timings, which no test asserts"),
}
"""Command prefix -> the arguments added to it, and why its stated outcome holds regardless."""

STEP_BOUND = frozenset({"final_loss_below", "loss_drop_factor"})
"""Expectations that a shortened run cannot meet: they need the scenario's steps."""

PY_FRAGMENTS = {
    "def cnn(": "a builder's body from examples/my_torch_model.py, which "
                "tests/transpiler/test_from_torch.py runs under sim run",
}
"""First line of a ``python`` block -> why it does not run on its own."""

REPLAYED_BY = {
    "docs/scenario-example.yaml":
        "tests/meta/test_doc_examples.py::test_the_example_scenario_meets_its_expectations",
    "scenarios/faults/*.yaml": "tests/sim/test_sim_faults.py::test_each_fault_scenario_meets_its_"
                               "expectations_in_the_simulator",
    "scenarios/scale.yaml":
        "tests/sim/test_timing_mode.py::test_a_reduced_scale_run_completes_on_the_virtual_loop",
    "scenarios/*.yaml":
        "tests/sim/test_sim_run.py::test_shipped_scenario_meets_its_expectations_in_simulation",
    "examples/my_model.yaml":
        "tests/launch/test_user_model.py::test_the_example_trains_in_sim_run_from_another_folder",
    "examples/my_data.yaml":
        "tests/execution/test_datafiles.py::test_the_example_trains_in_sim_run_from_another_folder",
    "examples/my_torch_model.yaml": "tests/transpiler/test_from_torch.py::test_sim_run_of_a_"
                                    "captured_model_in_2x2_sync_equals_local_training",
}
"""Example scenario (a glob; the first that matches) -> the test that replays it with its
`expect` block."""


# -- the blocks ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """A documented command: its words as the shell passes them (``$PWD`` left to expand)."""

    words: tuple[str, ...]

    @property
    def text(self) -> str:
        """The words joined by spaces: what `EXCLUDED`, `SHORTENED` and `CHECKS` match."""
        return " ".join(self.words)


@dataclass(frozen=True)
class Block:
    """A fenced block: where it starts, its language, its text, and the text of a block that
    follows it at once (a command's output, e.g. a sweep's table)."""

    where: str
    lang: str
    text: str
    output: str = ""

    def commands(self) -> list[Command]:
        """Its commands (continuation lines joined, comments dropped); none unless each of its
        lines is a command or a comment, from the first column."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        lines = [line for line in joined.splitlines() if line.strip() and line[0] != "#"]
        words = [_words(line) for line in lines]
        if not words or not all(w and w[0] in PROGRAMS for w in words):
            return []
        return [Command(tuple(w)) for w in words]


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # not shell: an unbalanced quote
        return []


def fenced_blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    start, lang, body, closed_at = -1, "", [], -10
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("```"):
            body.append(line)
        elif start < 0:
            start, lang, body = number, line[3:].strip(), []
        else:
            block = Block(f"{path.relative_to(ROOT)}:{start}", lang, "\n".join(body))
            if blocks and closed_at == start - 1:
                blocks[-1] = Block(blocks[-1].where, blocks[-1].lang, blocks[-1].text, block.text)
            blocks.append(block)
            start, closed_at = -1, number
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in DOCUMENTS for block in fenced_blocks(path)]


def command_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang in ("", "sh", "bash") and b.commands()]


def runnable(block: Block) -> list[Command]:
    return [c for c in block.commands() if _entry(c, EXCLUDED) is None]


def _entry(command: Command, table: dict[str, Any]) -> str | None:
    """The key of `table` that `command` starts with (at most one may)."""
    hits = [key for key in table if command.text.startswith(key)]
    assert len(hits) <= 1, f"{command.text!r} matches several entries: {hits}"
    return hits[0] if hits else None


RUN_BLOCKS = [b for b in command_blocks() if runnable(b)]


# -- running a command --------------------------------------------------------------------------
@dataclass
class Ran:
    """A command run: the words it ran with, its exit status, its output, its folder."""

    command: Command
    argv: list[str]
    code: int
    output: str
    folder: Path


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # without it, numpy's BLAS uses its default threads
        yield
        return
    with threadpool_limits(1):
        yield


IN_PROCESS = frozenset({"keys", "train", "--version"})
"""`runtime` commands that start no process: run in this one, through its `main`."""


def run(command: Command, folder: Path) -> Ran:
    """Run `command` in `folder` (``$PWD``), with the `SHORTENED` arguments added."""
    argv = [word.replace("$PWD", str(folder)) for word in command.words]
    shortened = _entry(command, SHORTENED)
    argv += SHORTENED[shortened][0] if shortened else []
    if argv[0] == "sim":
        return _in_process(command, argv, folder, sim_cli.main, ["--no-plots"])
    if argv[0] == "runtime" and argv[1] in IN_PROCESS:
        return _in_process(command, argv, folder, runtime_cli.main, [])
    assert argv[0] in ("runtime", "python"), f"no way to run {command.text!r} here: exclude it"
    program = ["-m", "runtime.cli"] if argv[0] == "runtime" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *program, *argv[1:]], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=240)
    return Ran(command, argv, done.returncode, done.stdout + done.stderr, folder)


def _in_process(command: Command, argv: list[str], folder: Path,
                main: Callable[..., int], extra: list[str]) -> Ran:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), one_blas_thread(), contextlib.chdir(folder):
        try:
            code = main(argv[1:] + extra, out=out)
        except SystemExit as exit:  # --version
            code = int(exit.code or 0)
    return Ran(command, argv, code, out.getvalue(), folder)


def command_folder(tmp_path: Path) -> Path:
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


# -- what the text states -----------------------------------------------------------------------
def table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table, a row's wrapped lines joined cell by cell."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if rows and not cells[0]:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    return rows


def sweep_points(ran: Ran) -> list[dict[str, Any]]:
    """The points of the sweep.json a `sim sweep` wrote (into its folder's ``out/``)."""
    found = sorted(ran.folder.glob("out/*/sweep/sweep.json"))
    assert len(found) == 1, f"{ran.command.text}: sweep.json {found}"
    points: list[dict[str, Any]] = json.loads(found[0].read_text())["points"]
    return points


def outcome(point: dict[str, Any]) -> str:
    if point["error"]:
        return f"ERROR: {point['error']}"
    return "PASS" if point["passed"] else "FAIL: " + ", ".join(point["failed"])


def check_sweep_table(ran: Ran, table: str) -> None:
    """Each point's settings and outcome are the README table's row's, in order."""
    rows, points = table_rows(table), sweep_points(ran)
    assert len(rows) == len(points), f"{ran.command.text}: {len(points)} points, {len(rows)} rows"
    for row, point in zip(rows, points):
        settings = list(point["settings"].values())
        assert row[:len(settings)] == settings, (ran.command.text, row)
        assert row[-1] == outcome(point), (ran.command.text, settings, ran.output[-3000:])


def is_sweep(command: Command) -> bool:
    return command.words[:2] == ("sim", "sweep")


def exit_statuses(block: Block, command: Command) -> tuple[int, ...]:
    """1 where the table that follows a sweep states a failed point, else 0; either for a
    shortened sweep, whose points may miss `STEP_BOUND` expectations (its check says which)."""
    if is_sweep(command) and _entry(command, SHORTENED):
        return (0, 1)
    return (1,) if is_sweep(command) and "FAIL" in block.output else (0,)


Check = Callable[[Ran], None]


def _metrics_where_the_readme_says(ran: Ran) -> None:
    named = re.search(r"writes\s+`(out/quickstart/\S*metrics\.json)`",
                      (ROOT / "README.md").read_text())
    assert named, "the README no longer names where the quickstart's metrics.json goes"
    assert (ran.folder / named.group(1)).is_file(), \
        f"sim run wrote {sorted(ran.folder.rglob('metrics.json'))}, not {named.group(1)}"


def _staleness_is_the_bound(ran: Ran) -> None:
    """README: "The bound holds exactly: the largest staleness observed is the bound itself"."""
    for point in sweep_points(ran):
        bound = point["settings"]["transpiler.staleness"]
        if bound != "inf":
            assert point["read_staleness_max"] == int(bound), point


def _bytes_fall_by_the_codecs_factors(ran: Ran) -> None:
    """README: "The bytes fall by the codecs' factors: 2.00x for fp16, 3.98x for int8, 46x for
    top-k at 1%"."""
    taken = {p["settings"]["transpiler.compression.method"]: p["pserver_bytes_in"]
             for p in sweep_points(ran)}
    for method, factor in {"fp16": 2.00, "int8": 3.98, "topk": 46}.items():
        assert taken["none"] / taken[method] == pytest.approx(factor, rel=0.01), method


def _shortened_sweep_ran_every_point(ran: Ran) -> None:
    points = sweep_points(ran)
    assert len(points) == 6 and not any(p["error"] for p in points), ran.output[-3000:]
    assert all(set(p["failed"]) <= STEP_BOUND for p in points), [p["failed"] for p in points]


def _keys_written(ran: Ran) -> None:
    keys = ran.folder / "keys"
    assert {p.name for p in keys.iterdir() if p.name.endswith(".key_secret")} >= \
        {"pserver-0.key_secret", "pserver-1.key_secret", "trainer-0.key_secret",
         "trainer-1.key_secret"}


def _only_trainer_1s_secret(ran: Ran) -> None:
    """README: "all trainer 1's host needs: no other secret"."""
    exported = ran.folder / "t1-keys"
    assert [p.name for p in exported.glob("*secret*")] == ["trainer-1.key_secret"]


def _eight_trainers(ran: Ran) -> None:
    assert read_metrics(ran.folder / "out" / "async8" / "metrics.json").job.trainers == 8


def _a_version(ran: Ran) -> None:
    assert ran.output.startswith("runtime (pslab) "), ran.output


def _both_backends_timed(ran: Ran) -> None:
    """README: "numpy vs torch step time"."""
    assert re.search(r"^numpy / torch-cpu\s+[0-9.]+", ran.output, re.M), ran.output


CHECKS: dict[str, Check] = {
    "sim run scenarios/quickstart.yaml": _metrics_where_the_readme_says,
    "sim sweep scenarios/ssp.yaml": _staleness_is_the_bound,
    "sim sweep scenarios/compression.yaml --vary transpiler.compression.method":
        _bytes_fall_by_the_codecs_factors,
    "sim sweep scenarios/quickstart.yaml": _shortened_sweep_ran_every_point,
    "runtime keys keys/ --pservers": _keys_written,
    "runtime keys keys/ --export trainer-1": _only_trainer_1s_secret,
    "runtime up scenarios/async.yaml --set cluster.trainers=8": _eight_trainers,
    "runtime --version": _a_version,
    "python benchmarks/torch_backend.py": _both_backends_timed,
}
"""Command prefix (the longest that matches) -> a check of what the text states about it."""


def check_command(block: Block, ran: Ran) -> None:
    """The exit status the text implies, a sweep's table, then what else the text states."""
    assert ran.code in exit_statuses(block, ran.command), \
        f"{block.where}: {ran.command.text}\n{ran.output[-4000:]}"
    if is_sweep(ran.command) and block.output:
        check_sweep_table(ran, block.output)
    keys = sorted((k for k in CHECKS if ran.command.text.startswith(k)), key=len)
    if keys:
        CHECKS[keys[-1]](ran)


# -- the tests ----------------------------------------------------------------------------------
def test_every_documented_command_runs_here_or_is_excluded_with_a_reason() -> None:
    commands = [c for b in command_blocks() for c in b.commands()]
    assert len(commands) > 20, "the extraction found too few commands"
    for table in (EXCLUDED, SHORTENED, CHECKS):
        stale = [key for key in table if not any(c.text.startswith(key) for c in commands)]
        assert stale == [], f"entries that no documented command starts with: {stale}"
    for command in commands:
        assert command.words[0] in ("sim", "runtime", "python") or _entry(command, EXCLUDED), \
            f"{command.text!r}: no way to run it here; add it to EXCLUDED with the reason"
    assert len(EXCLUDED) <= 10, "keep the excluded commands few"


def test_the_block_reader_joins_continuations_and_drops_comments() -> None:
    block = Block("x:1", "", "# a comment\nsim run a.yaml --set \"b={c: 1}\" \\\n    --seed 3  "
                  "# note\nruntime --version\n", "")
    assert [c.text for c in block.commands()] == ["sim run a.yaml --set b={c: 1} --seed 3",
                                                  "runtime --version"]
    assert block.commands()[0].words[4] == "b={c: 1}"
    assert Block("x:1", "", "transpiler/  ir.py\n  runtime up), ...\n").commands() == []
    table = "┃ a ┃ b ┃\n│ 1 │ FAIL:  │\n│   │ x      │\n│ 2 │ PASS │\n"
    assert table_rows(table) == [["1", "FAIL: x"], ["2", "PASS"]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.where for b in RUN_BLOCKS])
def test_a_documented_command_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    folder = command_folder(tmp_path)
    for command in runnable(block):
        check_command(block, run(command, folder))


PY_BLOCKS = [b for b in all_blocks() if b.lang == "python"]


def test_every_python_block_runs_or_is_named_a_fragment() -> None:
    firsts = {b.text.splitlines()[0] for b in PY_BLOCKS}
    assert [f for f in PY_FRAGMENTS if not any(line.startswith(f) for line in firsts)] == []


@pytest.mark.parametrize("block", [b for b in PY_BLOCKS
                                   if not any(b.text.startswith(f) for f in PY_FRAGMENTS)],
                         ids=lambda b: b.where)
def test_a_documented_python_block_runs_and_prints_what_it_says(block: Block, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), one_blas_thread():
        exec(compile(block.text, block.where, "exec"), {"__name__": "__doc_example__"})
    text = printed.getvalue()
    for comment in re.findall(r"#\s*the ops: (.*)", block.text):  # "mul, ..., sgd": in order
        named = [op for op in re.split(r",\s*", comment) if op != "..."]
        at = [text.find(f" = {op}(") for op in named]
        assert -1 not in at and at == sorted(at), (named, text)
    if "print(\"loss\"" in block.text:
        assert re.search(r"^loss \[?[0-9.e-]+\]?$", text, re.M), text


# -- the example scenarios ----------------------------------------------------------------------
SCENARIOS = sorted([*ROOT.glob("docs/*.yaml"), *ROOT.glob("scenarios/**/*.yaml"),
                    *ROOT.glob("examples/*.yaml")])


def replayed_by(path: Path) -> str:
    relative = path.relative_to(ROOT)
    return next(test for pattern, test in REPLAYED_BY.items() if relative.match(pattern)
                and len(relative.parts) == len(Path(pattern).parts))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_example_scenario_builds_and_is_replayed_by_a_test(path: Path) -> None:
    if "torch" in path.read_text():
        pytest.importorskip("torch")
    scenario = load_scenario(path)
    check_job(scenario)
    module, name = replayed_by(path).split("::")
    assert re.search(rf"^def {name}\(", (ROOT / module).read_text(), re.M), replayed_by(path)


def test_example_scenarios_write_to_folders_of_their_own() -> None:
    folders: dict[str, str] = {}
    for path in SCENARIOS:
        scenario = load_scenario(path)
        folder = scenario.outputs.dir or f"out/{scenario.name}"
        assert folder not in folders, f"{path.name} and {folders[folder]} both write to {folder}"
        folders[folder] = path.name


def test_the_example_scenario_meets_its_expectations(tmp_path: Path) -> None:
    ran = run(Command(("sim", "run", "docs/scenario-example.yaml")), command_folder(tmp_path))
    assert ran.code == 0 and ran.output.rstrip().endswith("OK: example"), ran.output[-4000:]
    metrics = read_metrics(tmp_path / "out" / "example" / "sim" / "metrics.json")
    names = [e.name for e in metrics.expectations if e.passed]
    assert names == ["final_loss_below", "max_steps_redone", "max_step_time"]
    assert sorted(f.kind for f in metrics.faults) == ["crash", "links", "partition"]


def test_runtime_up_takes_no_runs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """`--runs` measures several runs of `runtime profile`; `runtime up` ran one whatever it
    said, so it refuses the flag rather than ignore it."""
    with pytest.raises(SystemExit) as refused:
        runtime_cli.build_parser().parse_args(["up", "scenarios/quickstart.yaml", "--runs", "3"])
    assert refused.value.code == 2 and "--runs" in capsys.readouterr().err
