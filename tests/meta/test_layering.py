"""Layering: every import among pslab's modules points up the layers, and none closes a cycle.

Every import counts, wherever it stands: at module level, inside a function, or under
``if TYPE_CHECKING:``, since each ties the importing module to the imported one all the same
(tests/meta/test_packaging.py checks what runs at import time, and third-party imports). The rules,
as README.md ("What this is", "Layout") and docs/architecture.md ("Layers") state them:

- `transpiler` imports nothing of `runtime` or `sim`; `runtime` nothing of `sim` (`LAYERS`, in
  this order);
- within `runtime`, a part imports only itself and the parts before it in `RUNTIME_PARTS`
  (config, execution, network, services, faults, launch); the facades on top (`runtime`'s
  ``__init__``, `runtime.cli`, `runtime.paddle`) may import every part, and no part imports
  them;
- no module imports itself through others: the graph of pslab's modules has no cycle.

Importing ``a.b.c`` also runs the packages ``a`` and ``a.b``; those implicit edges are not
counted (a package's ``__init__`` that imports its own modules would close a cycle with each).
"""

from __future__ import annotations

import ast

from project_imports import PACKAGES as LAYERS  # the top-level packages, in layer order
from project_imports import imports_among, project_modules

RUNTIME_PARTS = ("config", "execution", "network", "services", "faults", "launch")
"""The parts of `runtime`, each importing only itself and those before it."""
RUNTIME_FACADES = ("cli", "paddle")
"""`runtime.cli`, `runtime.paddle` and `runtime` itself: on top of every part."""


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules among `known` that `source` (the module `module`) imports anywhere in its
    text (`project_imports.imports_among`), the module itself left out."""
    return imports_among(ast.walk(ast.parse(source)), module, is_package, known) - {module}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(path.read_text(), name, path.name == "__init__.py", known)
            for name, path in modules.items()}


def rank(module: str) -> tuple[int, int]:
    """Where `module` stands: its layer, then (in `runtime`) its part; an import must not go
    to a higher rank (within `transpiler` and `sim`, every module ranks alike)."""
    layer, _, rest = module.partition(".")
    if layer != "runtime":
        return LAYERS.index(layer), 0
    part = rest.partition(".")[0]
    if not part or part in RUNTIME_FACADES:
        return LAYERS.index(layer), len(RUNTIME_PARTS)
    assert part in RUNTIME_PARTS, f"runtime/{part} is in no part of RUNTIME_PARTS: place it"
    return LAYERS.index(layer), RUNTIME_PARTS.index(part)


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """The imports that go down the layers, as ``importer -> imported``."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  for target in targets if rank(target) > rank(module))


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen: set[str] = set()
    stack = list(graph.get(start, ()))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The edges of each knot of modules that import one another, one list per knot (its
    strongly connected component), as ``importer -> imported``."""
    reach = {node: reachable(graph, node) for node in graph}
    knots: list[list[str]] = []
    done: set[str] = set()
    for node in sorted(graph):
        if node in done or node not in reach[node]:
            continue
        knot = {other for other in reach[node] if node in reach[other]} | {node}
        done |= knot
        knots.append(sorted(f"{a} -> {b}" for a in knot for b in graph[a] if b in knot))
    return knots


def test_every_import_points_up_the_layers() -> None:
    graph = import_graph()
    assert {"transpiler.ir", "runtime.config.nodes", "runtime.services.pserver_core",
            "sim.loop"} <= set(graph)
    assert "runtime.config.nodes" in graph["runtime.services.cluster"]
    wrong = wrong_way(graph)
    assert not wrong, "imports from a lower layer into a higher one:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    knots = cycles(import_graph())
    assert not knots, "modules that import one another (each knot's edges):\n" + "\n\n".join(
        "\n".join(edges) for edges in knots)


def test_the_checker_sees_every_import_and_ranks_the_parts() -> None:
    known = {"pkg", "pkg.a", "pkg.b", "pkg.f", "pkg.t", "pkg.sub", "pkg.sub.c"}
    src = ("from . import a\nimport pkg.sub.c.x as c\nimport numpy\n"
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import t\n"
           "try:\n    pass\nexcept ImportError:\n    from .b import y\n"
           "def f():\n    from . import f\n")
    assert imports_of(src, "pkg.m", False, known) == {"pkg.a", "pkg.b", "pkg.f", "pkg.t",
                                                      "pkg.sub.c"}
    assert imports_of("from .. import a\n", "pkg.sub", True, known) == {"pkg.a"}
    assert imports_of("from . import c\n", "pkg.sub.c", False, known) == set()
    assert wrong_way({"runtime.config.x": {"runtime.services.y", "transpiler.ir"},
                      "runtime.cli": {"runtime.launch.z"}, "sim.a": {"runtime.cli"},
                      "transpiler.ir": {"sim.a"}}) == [
        "runtime.config.x -> runtime.services.y", "transpiler.ir -> sim.a"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [
        ["a -> b", "b -> c", "c -> a"]]
