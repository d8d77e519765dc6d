"""The documentation holds: every file it names exists, docs/architecture.md links every document,
the scenario reference is what its generator writes, and its examples are valid scenarios."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from runtime.config.scenario import ModelSpec, parse_scenario
from sim import schemadoc
from transpiler.models import MODELS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE_DIRS = ("transpiler", "runtime", "sim", "benchmarks", "tests")
TOP_DIRS = ("transpiler", "runtime", "sim", "benchmarks", "tests", "docs", "scenarios", ".ci")

PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]*\w\.(?:py|md|yaml|yml|json|toml)|"
                  r"(?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/(?:[\w.-]+/)*)")
"""A path-like token: dirs/name.ext, or a top-level folder (and subfolders) ending in a slash."""

PLACEHOLDERS = frozenset({"OUT", "PWD", "NAME"})
"""Names that stand for a folder or file chosen at run time (``OUT/metrics.json``,
``$PWD/profile.json``, ``scenarios/faults/NAME.yaml``): a path with one is a template."""
IGNORED_PREFIXES = ("out/",)
"""Where runs write their outputs (``out/quickstart/metrics.json``): named, never committed."""


def checkable(path: str) -> bool:
    """Whether `path` names a file of the repository rather than an output or a template."""
    stems = {part.split(".")[0] for part in path.split("/")}
    return not path.startswith(IGNORED_PREFIXES) and not stems & PLACEHOLDERS


def named_paths(text: str) -> set[str]:
    return {match.group(1) for match in PATH.finditer(text)}


def exists(path: str) -> bool:
    """Whether `path` is in the repository: from its root, or (as docs/transpiler.md names
    ``distribute/config.py``) from a package's folder."""
    return any((base / path).exists() for base in (ROOT, *(ROOT / d for d in CODE_DIRS)))


def prose_of_code(source: str) -> str:
    """The comments and the string statements (docstrings) of a Python source."""
    parts = [string.value for string in _string_statements(ast.parse(source))]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            parts.append(token.string)
    return "\n".join(parts)


def _string_statements(tree: ast.AST) -> list[ast.Constant]:
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def sources() -> list[Path]:
    return sorted(path for d in CODE_DIRS for path in (ROOT / d).rglob("*.py"))


def test_the_path_finder_sees_paths_and_only_paths() -> None:
    text = ("see `runtime/network/wire.py`, docs/wire.md and scenarios/faults/; "
            "out/quickstart/metrics.json is an output; runtime.network.wire is a module; 1/2.5 is not")
    assert named_paths(text) == {"runtime/network/wire.py", "docs/wire.md", "scenarios/faults/",
                                 "out/quickstart/metrics.json"}
    assert not checkable("out/quickstart/metrics.json") and not checkable("OUT/trace.json")
    assert not checkable("scenarios/faults/NAME.yaml") and checkable("scenarios/faults/lossy.yaml")
    assert prose_of_code('"""Doc of runtime/a.py."""\nx = "runtime/b.py"  # runtime/c.py\n') \
        == "Doc of runtime/a.py.\n# runtime/c.py"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_document_names_exists(path: Path) -> None:
    missing = sorted(p for p in named_paths(path.read_text()) if checkable(p) and not exists(p))
    assert missing == [], f"{path.relative_to(ROOT)} names files that do not exist"


def test_every_path_the_code_names_in_comments_and_docstrings_exists() -> None:
    missing = []
    for path in sources():
        for named in sorted(named_paths(prose_of_code(path.read_text()))):
            if checkable(named) and not exists(named):
                missing.append(f"{path.relative_to(ROOT)}: {named}")
    assert missing == []


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_markdown_link_resolves(path: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    local = [t for t in targets if "://" not in t]
    assert [t for t in local if not (path.parent / t).exists()] == []


def test_architecture_links_every_document() -> None:
    text = (DOCS / "architecture.md").read_text()
    linked = {(DOCS / target).resolve() for target in re.findall(r"\]\(([^)#\s]+\.md)", text)}
    others = {path.resolve() for path in DOCS.glob("*.md")} - {(DOCS / "architecture.md").resolve()}
    assert sorted(p.name for p in others - linked) == []


def test_readme_links_every_document() -> None:
    text = (ROOT / "README.md").read_text()
    linked = {(ROOT / target).resolve() for target in re.findall(r"\]\(([^)#\s]+\.md)", text)}
    assert sorted(p.name for p in {p.resolve() for p in DOCS.glob("*.md")} - linked) == []


def test_scenario_reference_is_up_to_date() -> None:
    path = DOCS / "scenarios.md"
    text = path.read_text()
    assert schemadoc.updated(text, schemadoc.schema_markdown()) == text, \
        f"docs/scenarios.md is out of date with the models; run: {schemadoc.REGENERATE}"


def test_model_name_reference_lists_every_built_in_model() -> None:
    words = set(re.findall(r"\w+", schemadoc._field_docstrings(ModelSpec)["name"]))
    assert sorted(set(MODELS) - words) == []


def test_scenario_reference_examples_are_valid_scenarios() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "scenarios.md").read_text(), re.S)
    example, faults = blocks
    assert parse_scenario(example).name == "quickstart"
    assert len(parse_scenario(example + faults).faults) == 4


def test_schemadoc_check_fails_on_a_stale_document(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "scenarios.md"
    stale.write_text(f"intro\n{schemadoc.BEGIN}\nold\n{schemadoc.END}\nend\n")
    assert schemadoc.main([str(stale), "--check"]) == 1
    assert schemadoc.REGENERATE in capsys.readouterr().err
    assert schemadoc.main([str(stale)]) == 0
    assert schemadoc.main([str(stale), "--check"]) == 0
    text = stale.read_text()
    assert text.startswith(f"intro\n{schemadoc.BEGIN}\n") and text.endswith(f"{schemadoc.END}\nend\n")


def _layout_block() -> str:
    readme, heading = (ROOT / "README.md").read_text(), "## Layout\n\n```\n"
    start = readme.index(heading) + len(heading)
    return readme[start:readme.index("```\n", start)]


def _named_in(layout: str, module: Path) -> bool:
    """Whether the Layout block names `module`: by its file name, or by a pattern such as
    ``numpy_<family>.py`` followed by the families it lists."""
    if re.search(rf"(?<![\w<>]){re.escape(module.name)}", layout):
        return True
    prefix, _, rest = module.stem.partition("_")
    return bool(rest) and f"{prefix}_<" in layout and re.search(rf"\b{re.escape(rest)}\b",
                                                                layout) is not None


def test_readme_layout_names_every_module() -> None:
    layout = _layout_block()
    modules = [path for part in ("transpiler", "runtime", "sim")
               for path in sorted((ROOT / part).rglob("*.py")) if path.name != "__init__.py"]
    missing = [str(path.relative_to(ROOT)) for path in modules if not _named_in(layout, path)]
    assert not missing, f"README's Layout does not name: {missing}"


def test_the_layout_check_misses_a_module_it_does_not_name() -> None:
    assert not _named_in("kernels/  registry.py", Path("runtime/execution/kernels/shapes.py"))
    assert _named_in("numpy_<family>.py (families: conv, nn)", Path("kernels/numpy_conv.py"))
    assert not _named_in("numpy_<family>.py (families: conv, nn)", Path("kernels/numpy_math.py"))
