"""``launch``: start what a launch file starts, without ROS 2's ``launch`` (a pip venv)."""

from __future__ import annotations

import argparse

from robot_latency.cli.common import echo
from robot_latency.errors import RobotLatencyError


def launch_arguments(args: argparse.Namespace) -> dict[str, str]:
    """Return the launch arguments (``name:=value``) as a mapping; ``--params-file F`` is
    ``params_file:=F``. Options may also follow the launch's name, as in ``ros2 launch``."""
    out: dict[str, str] = {}
    items = list(args.arguments)
    while items:
        item = items.pop(0)
        if item in ("-h", "--help"):
            args.launch_parser.print_help()
            raise SystemExit(0)
        if item in ("--params-file", "--dry-run") or item.startswith("--params-file="):
            if item == "--dry-run":
                args.dry_run = True
            elif "=" in item:
                args.params_file = item.split("=", 1)[1]
            elif items:
                args.params_file = items.pop(0)
            else:
                raise RobotLatencyError("--params-file: expects a file")
            continue
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise RobotLatencyError(f"{item!r}: a launch argument is name:=value")
        out[name] = value
    if args.params_file is not None:
        out["params_file"] = args.params_file
    return out


def cmd_launch(args: argparse.Namespace) -> int:
    from robot_latency.launcher import plan_launch, run_launch

    processes = plan_launch(args.name, launch_arguments(args))
    if args.dry_run:
        for process in processes:
            echo(" ".join(process.argv))
        return 0
    return run_launch(processes, stop_timeout_s=args.stop_timeout_s)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``launch`` command to the ``robot-latency`` parser."""
    p = sub.add_parser(
        "launch", help="start what launch/NAME.launch.py starts, without ros2 launch",
        description="Start the nodes a launch file in launch/ starts (planner: the planner "
                    "node; replay: the planner node and the bag replayer), as their console "
                    "scripts with the same parameters, where ROS 2's launch is not installed "
                    "(the venv make builds). Ctrl-C or SIGTERM stops them cleanly.")
    p.add_argument("name", help="planner or replay (planner.launch.py, replay.launch.py)")
    p.add_argument("arguments", nargs=argparse.REMAINDER, metavar="name:=value",
                   help="launch arguments, as for ros2 launch (empty: the params file's value)")
    p.add_argument("--params-file", default=None,
                   help="the planner node's params file (the launch argument params_file)")
    p.add_argument("--stop-timeout-s", type=float, default=30.0,
                   help="after Ctrl-C, kill a node that has not stopped within this long")
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands instead of running them")
    p.set_defaults(func=cmd_launch, launch_parser=p)
