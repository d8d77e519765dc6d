"""Packaging: the import graph points up the layers (docs/architecture.md), console scripts
resolve, and the README's two commands are the ones CI runs."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> top-level modules none of its modules may import
FORBIDDEN = {
    "transpiler": {"runtime", "sim", "numpy", "zmq", "torch"},
    "runtime": {"sim"},
}


def imported_modules(source: str, module: str) -> set[str]:
    """Top-level names of every module that `source` (the module `module`) imports, anywhere in
    the file; relative imports are resolved against `module`'s package."""
    found: set[str] = set()
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                parts = base + (node.module.split(".") if node.module else [])
                if parts:
                    found.add(parts[0])
                else:  # `from .. import x` at the top: x is itself a top-level module
                    found.update(alias.name for alias in node.names)
            elif node.module:
                found.add(node.module.split(".")[0])
    return found


def violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts)
        if path.name == "__init__.py":
            module += ".__init__"
        for name in sorted(imported_modules(path.read_text(), module) & FORBIDDEN[package]):
            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_graph_points_up_the_layers(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert violations(package) == []


def test_import_checker_sees_every_form() -> None:
    src = ("import numpy as np\nfrom zmq import asyncio\nfrom ..sim import loop\n"
           "def f():\n    import runtime.data\n")
    assert imported_modules(src, "transpiler.sub.mod") == {"numpy", "zmq", "transpiler", "runtime"}
    assert imported_modules("from .. import sim\n", "runtime.x") == {"sim"}
    assert imported_modules("from . import ir\n", "transpiler.models") == {"transpiler"}


def test_console_scripts_resolve() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"runtime", "sim"}
    for target in scripts.values():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func))


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```\w*\n(.*?)```", text, re.S)
    assert block, "README.md has no code block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_run_and_test_commands_that_ci_runs() -> None:
    run, test = readme_commands()
    assert "pip install -e '.[data,plot]'" in run and "sim run scenarios/quickstart.yaml" in run
    assert "pip install -e '.[dev,data,torch]'" in test and test.endswith("python -m pytest -q")
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci_lines, ".ci/run must run the README's test command verbatim"


def test_readme_python_example_trains(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S)
    assert example, "README.md has no python example"
    namespace: dict[str, object] = {}
    exec(compile(example.group(1), "README.md", "exec"), namespace)
    assert "mul" in capsys.readouterr().out  # it printed the program
    assert float(namespace["value"][0]) < 0.01  # type: ignore[index]
