"""The version of pslab that runs: the installed distribution's (``pyproject.toml``), which the
`runtime` and `sim` commands print with ``--version``."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "pslab"


def version() -> str:
    """The installed pslab's version; ``unknown`` where it runs from a tree never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
