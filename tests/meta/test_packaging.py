"""Packaging: the import graph points up the layers (docs/architecture.md) and has no cycle,
console scripts resolve, and the README's two commands are the ones CI runs."""

from __future__ import annotations

import ast
import graphlib
import importlib
import re
import tomllib
from pathlib import Path

import pytest

from sim.loop import TESTED_PYTHONS

from project_imports import imports_among, project_modules

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level modules none of its modules may import
FORBIDDEN = {
    "transpiler": {"runtime", "sim", "numpy", "zmq", "torch"},
    "runtime": {"sim"},
}
# module -> what it alone may import of its package's forbidden ones (inside functions only)
ALLOWED = {"transpiler.capture": {"torch"}}  # from_torch: a torch module in, a Program out


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
        forbidden = FORBIDDEN[package] - ALLOWED.get(module, set())
        for name in sorted(imported_modules(path.read_text(), module) & forbidden):
            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_graph_points_up_the_layers(package: str) -> None:
    assert (ROOT / package).is_dir()
    assert violations(package) == []


def test_a_module_allowed_an_import_makes_it_inside_functions_only() -> None:
    """pslab imports without the optional extra: no module-level import of an allowed one."""
    for module, names in ALLOWED.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        top = [node for node in ast.parse(path.read_text()).body
               if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert not set().union(*(imported_modules(ast.unparse(n), module) for n in top)) & names


def test_import_checker_sees_every_form() -> None:
    src = ("import numpy as np\nfrom zmq import asyncio\nfrom ..sim import loop\n"
           "def f():\n    import runtime.execution.data\n")
    assert imported_modules(src, "transpiler.sub.mod") == {"numpy", "zmq", "transpiler", "runtime"}
    assert imported_modules("from .. import sim\n", "runtime.x") == {"sim"}
    assert imported_modules("from . import ir\n", "transpiler.models") == {"transpiler"}


# -- the module-level import graph ---------------------------------------------------------------


def _run_at_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of `body` that run when the module is imported: all but function bodies
    and `if TYPE_CHECKING:` blocks, the insides of classes and other compound statements too."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            found += _run_at_import(node.orelse)
            continue
        found.append(node)
        for block in _blocks(node):
            found += _run_at_import(block)
    return found


def _blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists a compound statement holds."""
    blocks = [getattr(node, name) for name in ("body", "orelse", "finalbody")
              if isinstance(getattr(node, name, None), list)]
    blocks += [handler.body for handler in getattr(node, "handlers", ())]
    return blocks + [case.body for case in getattr(node, "cases", ())]


def module_level_imports(source: str, module: str, is_package: bool,
                         known: set[str]) -> set[str]:
    """The modules among `known` that `source` (the module `module`) imports when it is imported:
    `from pkg import name` counts as `pkg.name` where that is a module, else as `pkg`."""
    return imports_among(_run_at_import(ast.parse(source).body), module, is_package, known)


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: module_level_imports(path.read_text(), name, path.name == "__init__.py", known)
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """One cycle through each knot of `graph` that cannot be ordered, as `a -> b -> a`."""
    graph = {node: set(targets) for node, targets in graph.items()}
    found = []
    while True:
        try:
            graphlib.TopologicalSorter(graph).prepare()
            return found
        except graphlib.CycleError as err:
            cycle = list(reversed(err.args[1]))  # graphlib walks from imported to importer
            found.append(" -> ".join(cycle))
            graph[cycle[0]].discard(cycle[1])  # break it here, look for the next


def test_module_level_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert {"transpiler.ir", "runtime.services.pserver", "sim.loop"} <= set(graph)
    assert "transpiler.ir" in graph["transpiler.framework"]
    assert cycles(graph) == []


def test_module_level_import_graph_points_up_the_layers() -> None:
    below = {"transpiler": ("runtime", "sim"), "runtime": ("sim",), "sim": ()}
    wrong = sorted(f"{module} imports {target}" for module, targets in import_graph().items()
                   for target in targets if target.split(".")[0] in below[module.split(".")[0]])
    assert wrong == []


def test_import_graph_checker_sees_cycles_and_only_module_level_imports() -> None:
    known = {"pkg", "pkg.a", "pkg.b", "pkg.f", "pkg.t", "pkg.sub", "pkg.sub.c"}
    src = ("from . import a\nimport pkg.sub.c.x as c\nfrom .sub import nothing\n"
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import t\n"
           "try:\n    pass\nexcept ImportError:\n    from .b import y\n"
           "class K:\n    import pkg.sub\n"
           "def f():\n    from . import f\n")
    assert module_level_imports(src, "pkg.m", False, known) == {"pkg.a", "pkg.b", "pkg.sub",
                                                                "pkg.sub.c"}
    assert module_level_imports("from . import a\n", "pkg.sub.c", False, known) == {"pkg.sub"}
    assert module_level_imports("from .. import a\n", "pkg.sub", True, known) == {"pkg.a"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}) in (
        ["a -> b -> c -> a", "d -> d"], ["b -> c -> a -> b", "d -> d"],
        ["c -> a -> b -> c", "d -> d"], ["d -> d", "a -> b -> c -> a"],
        ["d -> d", "b -> c -> a -> b"], ["d -> d", "c -> a -> b -> c"])


def test_requires_python_is_the_range_the_virtual_loop_is_tested_on() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    bounds = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", requires)
    assert bounds, f"requires-python {requires!r} must be bounded above (sim/loop.py says why)"
    low, high = int(bounds.group(1)), int(bounds.group(2))
    assert TESTED_PYTHONS == f"3.{low} to 3.{high - 1}"


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
