"""The ``shmload`` command: its parser, and how it reports errors.

The sub-commands are ``profile`` (profile_cmd.py), ``demo`` (demo.py) and ``pack``
(pack_cmd.py); each module has an ``add_parser`` that adds its sub-command.

NOTE [ Command errors ]. A new user's mistakes must read as sentences, not tracebacks:

* A mistake the user can fix (an argument, a path, a ``MODULE:FACTORY`` that does not
  import or has no such name) and an exception raised by the user's own code (the
  factory, the dataset's ``__getitem__``, their collate) are a :class:`CommandError`:
  one line on stderr naming what failed and what to do, exit status 2 (argparse's
  status for usage errors, which are reported the same way).
* shmload's own errors (a :class:`~shmload.ShmloadError`, e.g. /dev/shm too small):
  the first line of the message, which says what to do, exit status 1.
* Anything else is a bug in shmload: Python's traceback, exit status 1.

``shmload --debug COMMAND ...`` or ``SHMLOAD_DEBUG=1`` prints the traceback (with the
user's original exception) before the line. :func:`main` returns the exit status, for
the console script and for tests calling ``main([...])``.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import traceback

from ..errors import CommandError, ShmloadError

# contention_warning and describe_exception are the profile command's; importable from here too
from .profile_cmd import add_parser as add_profile_parser
from .profile_cmd import contention_warning, describe_exception

__all__ = ["Parser", "build_parser", "contention_warning", "describe_exception", "main"]

DEBUG_HELP = ("On an error the command prints one line saying what failed and what to do, and exits with status 2 "
              "(your command or your code) or 1 (the machine, e.g. /dev/shm too small). For the full Python "
              "traceback, run 'shmload --debug {command} ...' or set SHMLOAD_DEBUG=1.")


# ---------------------------------------------------------------- parsing
class Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error on one line (argparse prints the usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}; see '{self.prog} --help'\n")


def build_parser() -> Parser:
    from .demo import add_parser as add_demo
    from .pack_cmd import add_parser as add_pack

    parser = Parser(prog="shmload", description="shmload's command-line tools: try the loader on built-in images "
                    "(demo), find how many workers your dataset needs (profile), pack an image folder into a few "
                    "large files (pack). 'shmload COMMAND --help' describes a command's options.",
                    epilog=DEBUG_HELP.format(command="COMMAND"))
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the full Python traceback before the one-line message (the same as "
                             "setting SHMLOAD_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, name in ((add_demo, "demo"), (add_profile_parser, "profile"), (add_pack, "pack")):
        p = add(sub)
        p.epilog = textwrap.fill(DEBUG_HELP.format(command=name), 80)
        p.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


# ---------------------------------------------------------------- errors
def report(command: str, exc: BaseException, status: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    lines = ["interrupted"] if isinstance(exc, KeyboardInterrupt) else str(exc).splitlines() or [type(exc).__name__]
    # a cause is the exception the user's code raised; more lines are a traceback in the message
    more = "; run with --debug for the traceback" if (exc.__cause__ or len(lines) > 1) and not debug else ""
    print(f"shmload {command}: {lines[0]}{more}", file=sys.stderr)
    return status


def debug_requested(args: argparse.Namespace) -> bool:
    return bool(args.debug) or os.environ.get("SHMLOAD_DEBUG", "").strip().lower() not in ("", "0", "false", "no",
                                                                                        "off")


# ---------------------------------------------------------------- the command
def main(argv: list[str] | None = None) -> int:
    """``shmload ...`` (the console script, and ``python -m shmload``): the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error already printed on one line (2)
        return e.code if isinstance(e.code, int) else 0
    try:
        return args.run(args)
    except KeyboardInterrupt as e:
        return report(args.command, e, 130, debug_requested(args))
    except CommandError as e:
        return report(args.command, e, 2, debug_requested(args))
    except ShmloadError as e:
        return report(args.command, e, 1, debug_requested(args))


if __name__ == "__main__":
    sys.exit(main())
