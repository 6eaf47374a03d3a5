"""``fleet``: N robots' command streams replayed at once against one OpenAI-compatible server,
for each fleet size; one run directory per robot, a summary per size and the fleet plot.
``fleet --find-robots`` searches the largest size that holds a model miss target instead
(:func:`robot_latency.planner.fleet.find_robots`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from robot_latency.cli.common import (
    UsageError,
    echo,
    emit_json,
    render_table,
    search_answer_lines,
    split_list,
)
from robot_latency.cli.run_args import CLI_PUBLISH_MARGIN_MS
from robot_latency.engines.openai_config import SERVER_APIS
from robot_latency.planner.config import MODES, RunSettings
from robot_latency.report.table import fmt, pct

#: The fleet sizes run without --robots.
DEFAULT_SIZES = "1,2,4,8"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(split_list(text, int, flag="--robots"))
    except UsageError as err:
        raise UsageError(f"--robots {text!r}: expected comma-separated counts, e.g. 1,2,4,8") \
            from err
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(f"--robots {text!r}: every fleet size must be >= 1")
    return sizes


#: The fleet table's columns: the model's plans and the fallbacks beside the deadline misses
#: (the fallback keeps those near 0; the model's share is what degrades with N), and the model
#: miss rate that joins them (``--find-robots``' criterion).
FLEET_HEADER = ["robots", "cycles", "model plans", "fallbacks", "deadline miss", "95% CI",
                "model miss", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "queue p50",
                "queue p99"]


def _ci(ci: list[float] | None) -> str:
    return "-" if ci is None else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}%"


def fleet_rows(sizes: list[dict[str, Any]]) -> list[list[str]]:
    """Return the fleet table's rows (:data:`FLEET_HEADER`) from fleet.json's ``sizes``."""
    rows = []
    for s in sizes:
        rows.append([str(s["robots"]), str(s["cycles"]),
                     f"{s['model_plans']} ({pct(s['model_plan_rate'])})",
                     f"{s['fallback_plans']} ({pct(s['fallback_rate'])})",
                     pct(s["miss_rate"]), _ci(s["miss_rate_ci95"]),
                     pct(s.get("model_miss_rate"))]
                    + [fmt(s[k][q], ".1f")
                       for k in ("ttft_ms", "itl_ms", "queue_ms") for q in ("p50", "p99")])
    return rows


def answer_lines(found: dict[str, Any]) -> list[str]:
    """``find_robots`` in words: the size held, the first that failed, their model miss rates."""
    held, failed = found["robots_held"], found["robots_failed"]
    return search_answer_lines(
        f"Largest fleet this server holds at a model miss rate <= "
        f"{100 * found['miss_target']:g}% ({found['tried']} fleet sizes run):",
        held=None if held is None else f"{held} robots",
        failed=None if failed is None else f"{failed} robot{'s' if failed != 1 else ''}",
        miss_held=found["miss_held"], miss_failed=found["miss_failed"],
        rate_name="model miss rate", what="size", more_flag="--find-robots-trials")


def _check_find_robots(args: argparse.Namespace) -> None:
    from robot_latency.cli.find_rate import check_search_args

    if args.robots is not None:
        raise UsageError(f"--robots {args.robots!r}: --find-robots chooses the fleet sizes; "
                         f"drop --robots")
    check_search_args(args.miss_target, args.find_robots_trials, "--find-robots-trials")


def cmd_fleet(args: argparse.Namespace) -> int:
    from robot_latency.cli.run_args import check_server_at_start
    from robot_latency.cli.settings import settings_from_flags
    from robot_latency.planner.fleet import FleetSpec, find_robots, run_fleet
    from robot_latency.streams import read_stream

    if args.find_robots:
        _check_find_robots(args)
    sizes = () if args.find_robots else _sizes(args.robots or DEFAULT_SIZES)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} exists and is not empty; choose a new directory")
    check_server_at_start("openai", args.server_url)
    stream = read_stream(args.stream, topic=args.topic)
    if args.max_commands:
        from dataclasses import replace

        stream = replace(stream, commands=stream.commands[: args.max_commands])
    settings = settings_from_flags(
        period_ms=args.period_ms, deadline_ms=args.deadline_ms, mode=args.mode,
        publish_margin_ms=args.publish_margin_ms, server_url=args.server_url,
        server_model=args.server_model, server_api=args.server_api, profile=args.profile)
    spec = FleetSpec(sizes=sizes, out=out, settings=settings, arrivals=args.arrivals,
                     rate_hz=args.rate_hz, seed=args.seed, speed=args.speed)
    doc = find_robots(spec, stream, miss_target=args.miss_target,
                      trials=args.find_robots_trials) if args.find_robots \
        else run_fleet(spec, stream)
    from robot_latency.report.fleet_plot import plot_fleet

    doc["plot"] = str(plot_fleet(doc["sizes"], out / "fleet.png",
                                 deadline_ms=settings.deadline_ms))
    if args.json:
        emit_json(doc)
        return 0
    echo(render_table(FLEET_HEADER, fleet_rows(doc["sizes"])))
    if "find_robots" in doc:
        echo("\n" + "\n".join(answer_lines(doc["find_robots"])))
    echo(f"\nfleet.json, fleet.png and one run directory per robot in {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``fleet`` command to the ``robot-latency`` parser."""
    defaults = RunSettings()
    p = sub.add_parser(
        "fleet", help="N robots' streams at once against one server; misses and tails vs N",
        description="Replays the stream for N robots at once (each with its own arrival offset "
                    "or Poisson seed) against one OpenAI-compatible server, for each N in "
                    "--robots; writes OUT/N<n>/robot<i>/ run directories, OUT/N<n>/"
                    "fleet_summary.json, OUT/fleet.json and OUT/fleet.png.")
    p.add_argument("--server-url", required=True, help="the shared server (http://HOST:PORT/v1)")
    p.add_argument("--robots", default=None,
                   help=f"fleet sizes, comma-separated (default {DEFAULT_SIZES})")
    p.add_argument("--stream", required=True, help="bag directory, .mcap or .jsonl")
    p.add_argument("--topic", default=None, help="command topic (default: the one String topic)")
    p.add_argument("--out", required=True, help="fleet directory to create")
    p.add_argument("--server-model", default="", help="model name (default: the first listed)")
    p.add_argument("--server-api", default=defaults.server_api, choices=SERVER_APIS)
    p.add_argument("--profile", default=None, help="planner profile (default bundled-actions)")
    p.add_argument("--arrivals", default="offset", choices=("offset", "poisson"),
                   help="offset: the recorded times, robot i shifted by i*period/N; poisson: "
                        "each robot's commands re-timed by a Poisson process seeded seed+i")
    p.add_argument("--rate-hz", type=float, default=0.0,
                   help="poisson: commands per second per robot (0: the stream's own rate)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speed", type=float, default=1.0, help="replay speed factor")
    p.add_argument("--max-commands", type=int, default=0,
                   help="replay only the first commands of the stream (0: all)")
    p.add_argument("--deadline-ms", type=float, default=defaults.deadline_ms)
    p.add_argument("--period-ms", type=float, default=defaults.period_ms)
    p.add_argument("--publish-margin-ms", type=float, default=CLI_PUBLISH_MARGIN_MS,
                   help="ms kept before the deadline for the fallback and the publish; "
                        "< 0 (default): learned per robot from its loop's own lateness, as "
                        "run and sweep learn it")
    p.add_argument("--mode", default=defaults.mode, choices=MODES)
    p.add_argument("--json", action="store_true", help="print fleet.json")
    p.add_argument("--find-robots", action="store_true",
                   help="instead of --robots, search the largest fleet this server holds: "
                        "sizes 1, 2, 4, ... until one fails, then bisection between the "
                        "largest held and the first failed, each a normal fleet run "
                        "(OUT/N<n>/). A size holds when its model miss rate is <= "
                        "--miss-target: of the cycles with a command for the model, the "
                        "share whose published plan was not the model's (a fallback) or came "
                        "after the deadline (the fallback keeps deadline misses near 0, so "
                        "they alone would hold at any size); fleet.json's find_robots key")
    p.add_argument("--miss-target", type=float, default=0.05,
                   help="--find-robots: the highest model miss rate that holds (fraction)")
    p.add_argument("--find-robots-trials", type=int, default=6,
                   help="--find-robots: the most fleet sizes run")
    p.set_defaults(func=cmd_fleet)
