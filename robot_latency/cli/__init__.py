"""The ``robot-latency`` command: one module per command group, each a thin layer over the library.

Every subcommand that prints figures has a ``--json`` form with stable keys for scripts. Bad input
(a file, a value, an id) ends in one line naming it and exit status 2, never a traceback: every
error the project raises on purpose derives from :class:`~robot_latency.errors.RobotLatencyError`,
caught here once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from robot_latency import __version__
from robot_latency.cli import (
    demo,
    doctor,
    envelope,
    fleet,
    floor,
    launch,
    models,
    predict,
    profiles,
    report,
    run,
    streams,
    sweep,
)
from robot_latency.cli.common import Parser, check_quant_flags
from robot_latency.engines.llamalog import route_llama_log
from robot_latency.errors import RobotLatencyError

#: Command modules, in the order their commands appear in ``--help``.
GROUPS = (floor, predict, envelope, run, sweep, report, profiles, models, streams, demo,
          doctor, fleet, launch)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``robot-latency`` command."""
    parser = Parser(
        prog="robot-latency",
        description="Latency testbed for language-model planners on edge robots.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, llama.cpp's own log included")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return parser


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace
                    ) -> argparse.ArgumentParser:
    """Return the parser of the (innermost) subcommand ``args`` ran, e.g. ``floor model``'s."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return current
        chosen = getattr(args, subs[0].dest, None)
        if chosen not in subs[0].choices:
            return current
        current = subs[0].choices[chosen]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse reports a subcommand's unknown flag with the top-level usage; a misspelled
        # ``run`` flag deserves ``run``'s usage (exit status 2, as argparse's own errors). One
        # before the command's name is the top level's own.
        before = argv[:argv.index(args.command)] if args.command in argv else []
        where = parser if any(u in before for u in unknown) else _command_parser(parser, args)
        where.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # llama.cpp's own log lines go to the robot_latency.llama_cpp logger at debug level:
    # shown with --verbose, silent otherwise (the engine worker routes its own the same way).
    route_llama_log()
    try:
        check_quant_flags(args)
        return int(args.func(args))
    except RobotLatencyError as err:
        sys.stderr.write(f"robot-latency {args.command}: error: {err}\n")
        return 2
