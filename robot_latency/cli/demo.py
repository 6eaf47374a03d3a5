"""``demo``: the main job (see :mod:`robot_latency.demo_job`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from robot_latency.cli.common import UsageError, echo, nonneg_int, split_list
from robot_latency.demo_job import MainJob, main_job
from robot_latency.planner.config import ON_NEW_COMMAND

_D = MainJob()  # the defaults, written once


def cmd_demo(args: argparse.Namespace) -> int:
    quants = tuple(split_list(args.quants))
    if not quants:
        raise UsageError("--quants needs at least one level")
    main_job(MainJob(out_dir=Path(args.out), quants=quants, inflate=args.inflate,
                     stream=Path(args.stream) if args.stream else None, speed=args.speed,
                     mode=args.mode, deadline_ms=args.deadline_ms, period_ms=args.period_ms,
                     device=args.device, n_threads=args.n_threads,
                     context_tokens=args.context, profile=args.profile or "",
                     on_new_command=args.on_new_command, send_via=args.send_via), echo)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser(
        "demo", help="the main job: quant levels of the inflated planner through ROS 2",
        description="Builds the inflated planner's quant levels (nothing downloaded), prints "
                    "their bandwidth floors on this host and the Orin modules, replays a "
                    "bundled command stream through the planner_node and bag_replayer "
                    "processes over ROS 2 for each level, then prints the comparison and "
                    "writes the report with plots.")
    p.add_argument("--out", default=str(_D.out_dir))
    p.add_argument("--quants", default=",".join(_D.quants))
    p.add_argument("--inflate", default=_D.inflate, help="preset shape to inflate into")
    p.add_argument("--stream", default=None, help="default: the shipped steady_operator stream")
    p.add_argument("--speed", type=float, default=_D.speed)
    p.add_argument("--mode", default=_D.mode, choices=("periodic", "event"))
    p.add_argument("--deadline-ms", type=float, default=_D.deadline_ms)
    p.add_argument("--period-ms", type=float, default=_D.period_ms)
    p.add_argument("--device", default=_D.device, help="target device for predictions")
    p.add_argument("--n-threads", type=int, default=0,
                   help="engine decode threads (0: the default, one per engine core)")
    p.add_argument("--profile", default=None, help="planner profile (default: bundled-actions)")
    p.add_argument("--context", type=nonneg_int, default=_D.context_tokens,
                   help="context tokens for the floor table")
    p.add_argument("--on-new-command", default=_D.on_new_command, choices=ON_NEW_COMMAND,
                   help="a command arriving while the model works on an older one waits "
                        "(queue) or aborts it, the older recorded as superseded (preempt); "
                        "default %(default)s")
    p.add_argument("--send-via", default=_D.send_via, choices=("topic", "action"),
                   help="how the replayer sends each command: on planner/command (topic) or "
                        "as a planner/plan_command goal (action); the report says which")
    p.set_defaults(func=cmd_demo)
