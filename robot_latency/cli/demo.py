"""``demo``: the main job (see :mod:`robot_latency.demo_job`).

A previous run in ``--out`` is never deleted: it is moved aside first, to ``OUT.<its time>``
(``runs/demo.20261201T2133``: when it was last written, local time), so ``make demo`` twice
keeps both.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from robot_latency.cli.common import UsageError, echo, nonneg_int, quant_list_arg, split_list
from robot_latency.demo_job import PLANNERS, MainJob, main_job
from robot_latency.hostcheck.load import HostLoad, LoadWatch
from robot_latency.planner.config import ON_NEW_COMMAND

_D = MainJob()  # the defaults, written once


def move_aside(out: Path) -> Path | None:
    """Move a previous run out of the way; return where it went (None: nothing to move).

    The new name is ``<out>.<YYYYmmddTHHMM>``, the time the directory was last written (local
    time), with ``-1``, ``-2``... when two runs fall in the same minute. An empty directory is
    left where it is.

    Raises:
        UsageError: ``out`` is not a directory, or cannot be renamed (names both paths).
    """
    if not out.exists():
        return None
    if not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    if not any(out.iterdir()):
        return None
    stamp = time.strftime("%Y%m%dT%H%M", time.localtime(out.stat().st_mtime))
    target = out.with_name(f"{out.name}.{stamp}")
    n = 0
    while target.exists():
        n += 1
        target = out.with_name(f"{out.name}.{stamp}-{n}")
    try:
        out.rename(target)
    except OSError as err:
        raise UsageError(f"--out {out}: cannot move the previous run to {target}: "
                         f"{err.strerror or err}") from err
    return target


def note_host_load(load: HostLoad, out: Path, report: Path) -> None:
    """Keep the host's load over the demo in ``OUT/host_load.json``; when the host was
    overloaded, say so and write the report again, opening with the warning."""
    load.write(out)
    if not load.warning:
        return
    echo(f"\nWARNING: {load.warning}")
    from robot_latency.report.markdown import write_report

    runs = json.loads((out / "demo.json").read_text())["runs"]
    write_report(runs, report.parent)


def cmd_demo(args: argparse.Namespace) -> int:
    quants = tuple(split_list(args.quants))
    if not quants:
        raise UsageError("--quants needs at least one level")
    if not 0 <= args.max_pause_s < float("inf"):
        raise UsageError(f"--max-pause-s: must be >= 0, got {args.max_pause_s:g}")
    out = Path(args.out)
    kept = move_aside(out)
    if kept is not None:
        echo(f"the previous run in {out} is kept as {kept}")
    watch = LoadWatch().start()
    report = main_job(MainJob(out_dir=out, quants=quants, inflate=args.inflate,
                              planner=args.planner, compact_quant=args.compact_quant,
                              stream=Path(args.stream) if args.stream else None,
                              commands=args.commands, max_pause_s=args.max_pause_s,
                              speed=args.speed, mode=args.mode, deadline_ms=args.deadline_ms,
                              period_ms=args.period_ms, device=args.device,
                              n_threads=args.n_threads, context_tokens=args.context,
                              profile=args.profile or "",
                              on_new_command=args.on_new_command,
                              send_via=args.send_via), echo)
    note_host_load(watch.stop(), out, report)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser(
        "demo", help="the main job: quant levels of the inflated planner through ROS 2",
        description="Builds the inflated JSON planner's quant levels and the compact action "
                    "language at one level (nothing downloaded), prints "
                    "their bandwidth floors on this host and the Orin modules, replays a "
                    "bundled command stream through the planner_node and bag_replayer "
                    "processes over ROS 2 for each level, then prints the comparison and "
                    "writes the report with plots.")
    p.add_argument("--out", default=str(_D.out_dir),
                   help="run directory (default %(default)s); a previous run there is moved "
                        "aside to OUT.<its time>, never deleted")
    quant_list_arg(p, "--quants", default=",".join(_D.quants))
    p.add_argument("--planner", default=_D.planner, choices=tuple(PLANNERS),
                   help="the levels' planner: json (Qwen2 tokenizer, chat prompt, JSON plan under "
                        "the schema's grammar) or compact (the action language); default "
                        "%(default)s")
    p.add_argument("--compact-quant", default=_D.compact_quant,
                   help="with --planner json, also time the compact action language at this "
                        "level, for the output format's price ('' skips it; default "
                        "%(default)s)")
    p.add_argument("--inflate", default=_D.inflate, help="preset shape to inflate into")
    p.add_argument("--stream", default=None, help="default: the shipped steady_operator stream")
    p.add_argument("--commands", type=nonneg_int, default=_D.commands,
                   help="replay the stream's first N commands (0: all; default %(default)s)")
    p.add_argument("--max-pause-s", type=float, default=_D.max_pause_s,
                   help="shorten a pause between two commands longer than this to it (s; the "
                        "planner is idle through it; 0: the stream's own pauses; default "
                        "%(default)s)")
    p.add_argument("--speed", type=float, default=_D.speed)
    p.add_argument("--mode", default=_D.mode, choices=("periodic", "event"))
    p.add_argument("--deadline-ms", type=float, default=_D.deadline_ms)
    p.add_argument("--period-ms", type=float, default=_D.period_ms)
    p.add_argument("--device", default=_D.device, help="target device for predictions")
    p.add_argument("--n-threads", type=int, default=0,
                   help="engine decode threads (0: the default, one per engine core)")
    p.add_argument("--profile", default=None,
                   help="the levels' planner profile (default: bundled-json for --planner json, "
                        "bundled-actions for compact)")
    p.add_argument("--context", type=nonneg_int, default=_D.context_tokens,
                   help="context tokens for the floor table")
    p.add_argument("--on-new-command", default=_D.on_new_command, choices=ON_NEW_COMMAND,
                   help="a command arriving while the model works on an older one waits "
                        "(queue) or aborts it, the older recorded as superseded (preempt); "
                        "default %(default)s")
    p.add_argument("--send-via", default=_D.send_via, choices=("topic", "action", "typed"),
                   help="how the replayer sends each command: tagged on planner/command (topic), "
                        "as a planner/plan_command goal (action) or as a typed "
                        "robot_latency_interfaces/Command on planner/command_typed (typed); the "
                        "report says which")
    p.set_defaults(func=cmd_demo)
