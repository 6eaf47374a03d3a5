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
    fleet,
    floor,
    models,
    predict,
    profiles,
    report,
    run,
    streams,
    sweep,
)
from robot_latency.engines.llamalog import route_llama_log
from robot_latency.errors import RobotLatencyError

#: Command modules, in the order their commands appear in ``--help``.
GROUPS = (floor, predict, run, sweep, report, profiles, models, streams, demo, doctor, fleet)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``robot-latency`` command."""
    parser = argparse.ArgumentParser(
        prog="robot-latency",
        description="Latency testbed for language-model planners on edge robots.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, llama.cpp's own log included")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # llama.cpp's own log lines go to the robot_latency.llama_cpp logger at debug level:
    # shown with --verbose, silent otherwise (the engine worker routes its own the same way).
    route_llama_log()
    try:
        return int(args.func(args))
    except RobotLatencyError as err:
        sys.stderr.write(f"robot-latency {args.command}: error: {err}\n")
        return 2
