"""The ``slow`` mark (tests/conftest.py, tests/support/slow_mark.py): derived from what a test
module's source does."""

from __future__ import annotations

from pathlib import Path

from slow_mark import spawns


def test_a_module_that_starts_processes_is_slow_and_one_that_does_not_is_not(
        tmp_path: Path) -> None:
    for i, source in enumerate(["import subprocess\n", "proc = sys.executable\n",
                                "launch(path, [], scenario)\n", "cmd = 'runtime.cli'\n",
                                "with netns.Namespaces():\n",
                                "from runtime.launch.calibrate import calibrate\n"]):
        path = tmp_path / f"test_spawn{i}.py"
        path.write_text(source)
        assert spawns(path), source
    quiet = tmp_path / "test_quiet.py"
    quiet.write_text("from runtime.network.wire import encode\nrelaunched = 1\n")
    assert not spawns(quiet)


def test_this_suite_has_both_kinds() -> None:
    tests = Path(__file__).resolve().parents[1]
    assert spawns(tests / "launch" / "test_runtime_up.py")
    assert not spawns(tests / "network" / "test_wire.py")


def test_a_module_is_slow_when_a_shared_helper_it_imports_starts_processes(
        tmp_path: Path) -> None:
    """tests/support/example_runs.py runs `runtime up` as processes; gradcheck.py runs kernels."""
    through = tmp_path / "test_through_a_helper.py"
    through.write_text("import numpy as np\n\nimport example_runs\n")
    assert spawns(through)
    plain = tmp_path / "test_kernels_only.py"
    plain.write_text("from gradcheck import check_grad\n")
    assert not spawns(plain)
