"""pslab's own modules and the imports among them, read from their source (nothing imported)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


PACKAGES = ("transpiler", "runtime", "sim")


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of `PACKAGES` (a package is its `__init__.py`)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_among(nodes: Iterable[ast.AST], module: str, is_package: bool,
                  known: set[str]) -> set[str]:
    """The modules among `known` that the import statements among `nodes` (of the module
    `module`) import, as tests/meta/test_packaging.py's `module_level_imports` counts them."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` where only a.b is ours
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found
