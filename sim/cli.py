"""The `sim` command: runs scenarios in virtual time (see DESIGN.md, sim/).

The simulator is not built yet. Its subcommands exist so that the command line is stable, but
each one says so and exits with status 2 instead of printing anything that looks like a result.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence, TextIO

NOT_AVAILABLE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sim", description="Simulate pslab scenarios "
                                     "(not available yet).")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = subparsers.add_parser("run", help="run a scenario in the simulator (not available yet)")
    run.add_argument("scenario", help="scenario YAML file")
    return parser


def main(argv: Sequence[str] | None = None, err: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(f"sim {args.command}: not available yet: the simulator has not been built; "
          f"train locally with `runtime train` meanwhile", file=err or sys.stderr)
    return NOT_AVAILABLE


if __name__ == "__main__":
    sys.exit(main())
