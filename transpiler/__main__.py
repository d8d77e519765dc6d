"""``python -m transpiler``: commands over programs without running them (``show``, see `show`)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence, TextIO

from . import show


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m transpiler", description="Inspect what the distribute transpiler makes.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    show.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args, out or sys.stdout))


if __name__ == "__main__":
    sys.exit(main())
