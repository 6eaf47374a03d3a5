"""``fleet``: N robots' command streams replayed at once against one OpenAI-compatible server,
for each fleet size; one run directory per robot, a summary per size and the fleet plot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from robot_latency.cli.common import UsageError, echo, emit_json, render_table, split_list
from robot_latency.cli.run import CLI_PUBLISH_MARGIN_MS
from robot_latency.engines.openai_config import SERVER_APIS
from robot_latency.planner.config import MODES, RunSettings
from robot_latency.report.table import fmt, pct


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(split_list(text, int))
    except ValueError as err:
        raise UsageError(f"--robots {text!r}: expected comma-separated counts, e.g. 1,2,4,8") \
            from err
    if not sizes or any(n < 1 for n in sizes):
        raise UsageError(f"--robots {text!r}: every fleet size must be >= 1")
    return sizes


#: The fleet table's columns: the model's plans and the fallbacks beside the deadline misses
#: (the fallback keeps those near 0; the model's share is what degrades with N).
FLEET_HEADER = ["robots", "cycles", "model plans", "fallbacks", "deadline miss", "95% CI",
                "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "queue p50", "queue p99"]


def _ci(ci: list[float] | None) -> str:
    return "-" if ci is None else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}%"


def fleet_rows(sizes: list[dict[str, Any]]) -> list[list[str]]:
    """Return the fleet table's rows (:data:`FLEET_HEADER`) from fleet.json's ``sizes``."""
    rows = []
    for s in sizes:
        rows.append([str(s["robots"]), str(s["cycles"]),
                     f"{s['model_plans']} ({pct(s['model_plan_rate'])})",
                     f"{s['fallback_plans']} ({pct(s['fallback_rate'])})",
                     pct(s["miss_rate"]), _ci(s["miss_rate_ci95"])]
                    + [fmt(s[k][q], ".1f")
                       for k in ("ttft_ms", "itl_ms", "queue_ms") for q in ("p50", "p99")])
    return rows


def cmd_fleet(args: argparse.Namespace) -> int:
    from robot_latency.cli.run import check_server_at_start
    from robot_latency.cli.settings import settings_from_flags
    from robot_latency.planner.fleet import FleetSpec, run_fleet
    from robot_latency.streams import read_stream

    sizes = _sizes(args.robots)
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
    doc = run_fleet(spec, stream)
    from robot_latency.report.fleet_plot import plot_fleet

    doc["plot"] = str(plot_fleet(doc["sizes"], out / "fleet.png",
                                 deadline_ms=settings.deadline_ms))
    if args.json:
        emit_json(doc)
        return 0
    echo(render_table(FLEET_HEADER, fleet_rows(doc["sizes"])))
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
    p.add_argument("--robots", default="1,2,4,8", help="fleet sizes, comma-separated")
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
    p.set_defaults(func=cmd_fleet)
