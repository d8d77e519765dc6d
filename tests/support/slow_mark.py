"""Which test modules start processes: their tests are marked ``slow`` (tests/conftest.py), so
that ``pytest -m "not slow"`` is the quick inner loop.

DESIGN: the mark is derived from the module's source (`SPAWNS`), not written on each test, so a
new test that starts processes cannot be left out of it."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SPAWNS = re.compile(r"\b(subprocess|Popen|multiprocessing|ray\.init|os\.fork|netns)\b"
                    r"|sys\.executable|\blaunch\(|runtime\.cli|runtime\.launch\.(launcher|profile|calibrate|role)")
"""What in a test module's source starts processes (a node, the launcher, a sweep's workers)."""


SUPPORT = Path(__file__).resolve().parent
"""The shared helpers (tests/support), which test modules import by their names."""


@cache
def spawns(path: Path) -> bool:
    """Whether the test module at `path` starts processes (`SPAWNS`), itself or through a shared
    helper it imports (one of `SUPPORT` whose source does)."""
    source = path.read_text()
    return SPAWNS.search(source) is not None or any(
        spawns(helper) for helper in helpers_imported(source) if helper != path)


def helpers_imported(source: str) -> list[Path]:
    """The modules of `SUPPORT` that `source` imports at the start of a line (``import name``,
    ``from name import ...``)."""
    names = re.findall(r"^(?:from|import)\s+(\w+)", source, re.MULTILINE)
    return [SUPPORT / f"{name}.py" for name in names if (SUPPORT / f"{name}.py").is_file()]
