"""How the `runtime` and `sim` commands end when something is wrong: one line, no traceback.

- A problem with what was given (a flag, a scenario file, a ``--set``, a ``--vary``, a file
  named) is one line on stderr, ``PROG: error: <where>: <what>`` (several problems: a line
  each), and exit status 2, before any work starts. ``<where>`` is ``FILE:LINE`` and the field,
  or the ``--set`` that gave the value (`runtime.config.scenario_errors`). A mistake in the
  command line's own syntax (an unknown flag, a missing argument) ends ``(see PROG --help)``
  instead of printing the usage.
- An error of the operating system (a file that cannot be written, a port in use) is one line
  too, ``PROG: error: <file>: <reason>``, and exit status 1.
- Anything else escaping a command is a bug of pslab: one line, ``PROG: internal error: <type>:
  <message> (a bug of pslab: rerun with --debug for the traceback, and report it)``, and exit
  status 70 (EX_SOFTWARE).
- Ctrl-C that no command handled itself: ``PROG: interrupted``, exit status 130.

``--debug``, before or after the subcommand (``sim --debug run X``, ``sim run X --debug``), adds
the traceback of the exception behind each of these lines, above it; the line and the exit
status stay the same. It also sets ``PSLAB_DEBUG=1`` (`DEBUG_VAR`) for the processes the command
starts (`debugging`): a node of ``runtime up`` then logs the traceback of any failure, where it
otherwise logs one only for a failure that is neither what the scenario expects nor a condition
of the job its message says all of (`runtime.services.node`).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

__all__ = ["DEBUG_VAR", "EXIT_INTERNAL", "CommandParser", "add_debug", "debugging",
           "run_command"]

DEBUG_VAR = "PSLAB_DEBUG"
"""Set to 1 by ``--debug``, for the processes a command starts."""

EXIT_INTERNAL = 70
"""The exit status of an internal error (sysexits' EX_SOFTWARE)."""
INTERNAL_HINT = "a bug of pslab: rerun with --debug for the traceback, and report it"


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line each (`error`), with the traceback of the
    exception being handled when `debug` is set (by `run_command`, from ``--debug``)."""

    debug = False
    _parsing = False

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> Any:
        return self._parse(super().parse_known_args, args, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> Any:
        return self._parse(super().parse_args, args, namespace)

    def _parse(self, parse: Callable[..., Any], *given: Any) -> Any:
        """`parse` the command line, its errors marked as the syntax's (`error`)."""
        was, self._parsing = self._parsing, True
        try:
            return parse(*given)
        finally:
            self._parsing = was

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after ``PROG: error: LINE`` for each line of `message` (the
        command line's syntax: with a pointer to ``--help``)."""
        if self.debug and sys.exc_info()[1] is not None:
            traceback.print_exc()
        lines = message.splitlines() or [""]
        if self._parsing:
            lines[-1] += f" (see {self.prog} --help)"
        self.exit(2, "".join(f"{self.prog}: error: {line}\n" for line in lines))


def add_debug(parser: argparse.ArgumentParser,
              subparsers: argparse._SubParsersAction) -> None:
    """``--debug`` on `parser` and on each of its subcommands."""
    help_text = "on an error, show its traceback too"
    parser.add_argument("--debug", action="store_true", help=help_text)
    for sub in subparsers.choices.values():
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help=help_text)


def run_command(args: argparse.Namespace, command: Callable[[], int],
                user_errors: tuple[type[BaseException], ...]) -> int:
    """Run `command` (the subcommand `args` chose; ``args.parser`` is its parser) and end as
    the module doc says; its exit status."""
    parser: CommandParser = args.parser
    parser.debug = bool(getattr(args, "debug", False))
    if parser.debug:
        os.environ[DEBUG_VAR] = "1"
    try:
        return command()
    except user_errors as err:
        parser.error(str(err))
    except KeyboardInterrupt:
        return _said(parser, "interrupted", 130)
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        return _said(parser, f"error: {where}{err.strerror or err}", 1)
    except Exception as err:
        what = str(err).splitlines()[0] if str(err) else ""
        return _said(parser, f"internal error: {type(err).__name__}: {what} ({INTERNAL_HINT})",
                     EXIT_INTERNAL)


def debugging() -> bool:
    """Whether ``--debug`` was given, to this process or to the command that started it."""
    return os.environ.get(DEBUG_VAR) == "1"


def _said(parser: CommandParser, line: str, status: int) -> int:
    """Print `line` (after the traceback, with ``--debug``) on stderr; `status`."""
    if parser.debug:
        traceback.print_exc()
    print(f"{parser.prog}: {line}", file=sys.stderr, flush=True)
    return status
