"""``run``: replay a command stream through the planner into a run directory (``--find-rate``:
the highest replay speed held instead, :mod:`robot_latency.cli.find_rate`). The flags of a run,
shared with ``sweep``, are :mod:`robot_latency.cli.run_args`'."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from robot_latency.cli.common import echo, emit_json, render_table
from robot_latency.cli.find_rate import add_find_rate_args
from robot_latency.cli.run_args import (
    add_host_load,
    add_run_args,
    check_server_at_start,
    first_missing,
    read_labels_arg,
    read_stream_arg,
    remove_failed_start,
    run_config_from_args,
    write_target_answer,
)
from robot_latency.hostcheck.load import LoadWatch
from robot_latency.report.table import fmt


def _print_summary(args: argparse.Namespace, out: Path, summary: dict[str, Any]) -> None:
    ci = summary["deadline_miss_rate_ci95"]
    echo(f"run {out}: {summary['cycles']} cycles"
         + (" (as fast as possible: no arrival process, no queueing measured)"
            if args.asap else f" (recorded pace x{args.speed:g})"))
    if summary["cycles"]:
        echo(f"deadline misses {summary['deadline_misses']} "
             f"({100 * summary['deadline_miss_rate']:.2f}%, 95% CI "
             f"{100 * ci[0]:.2f}-{100 * ci[1]:.2f}%), fallbacks {summary['fallbacks']}")
        sources = summary.get("plan_sources") or {}
        echo(f"plans: {sources.get('model', 0)} from the model, "
             f"{sources.get('fallback', 0)} from a fallback"
             + (f", {sources['none']} none (skipped)" if sources.get("none") else "")
             + f", of {summary['cycles']} cycles")
    rows = [[m, str(summary[m]["n"])] + [fmt(summary[m].get(k))
                                         for k in ("p50", "p90", "p99", "p99_9", "max")]
            for m in ("ttft_ms", "itl_ms", "e2e_ms", "cycle_ms", "overshoot_ms")]
    echo(render_table(["metric", "n", "p50", "p90", "p99", "p99.9", "max"], rows))
    thin = [w.split(":")[0] for w in summary["warnings"] if "p99 from only" in w]
    if thin:
        echo(f"note: p99 rests on fewer than 1000 samples for {', '.join(thin)}")
    warning = (summary.get("host_load") or {}).get("warning")
    if warning:
        echo(f"WARNING: {warning}")


def cmd_run(args: argparse.Namespace) -> int:
    from robot_latency.planner.replay import run_replay
    from robot_latency.report.correctness import correctness_markdown, correctness_rows

    if args.find_rate:
        from robot_latency.cli.find_rate import cmd_find_rate

        return cmd_find_rate(args)
    stream = read_stream_arg(args)
    out = Path(args.out)
    created = first_missing(out)
    try:
        check_server_at_start(args.engine, args.server_url)
        config = run_config_from_args(args, out, stream, engine=args.engine, quant=args.quant,
                                      device=args.device, deadline_ms=args.deadline_ms,
                                      period_ms=args.period_ms, label=args.label)
        labels = read_labels_arg(args, config.planning.contract)
        # A bar of cycles and misses while it runs, drawn only on a terminal; the host's load
        # over the run is measured beside it (host_load.json, a warning when overloaded).
        watch = LoadWatch().start()
        summary = run_replay(config, stream, speed=args.speed, asap=args.asap,
                             handle_signals=True, progress=True, labels=labels)
        add_host_load(summary, watch.stop(), out)
    except BaseException:
        # A failed start (a file that is no GGUF, an engine that cannot load) leaves no empty
        # run directory behind; a run that recorded a cycle keeps everything it wrote.
        remove_failed_start(created, out)
        raise
    # target.json first: the correctness section's recommendation rests on it where it is there
    margin = args.target_transport_margin_ms
    lines = write_target_answer(config.settings, stream, out, speed=args.speed,
                                transport_margin_ms=margin) \
        if args.target_answer and not summary.get("interrupted") else []
    if args.json:
        emit_json(summary)
    else:
        _print_summary(args, out, summary)
        # the target's goodput judges by the labels, with the target's margins
        rows = correctness_rows([out], labels=labels, transport_margin_ms=margin)
        if rows[0].correct_n:
            echo("\n" + correctness_markdown(rows))
        if lines:
            echo(f"\nOn {args.device}, the loop simulated (target.json; robot-latency report "
                 f"{out} puts it first):\n\n" + "\n".join(lines))
    if summary.get("interrupted"):
        # Like a shell's 128 + SIGINT: the run stopped early, though its files are complete.
        sys.stderr.write(f"robot-latency run: interrupted after {summary['cycles']} cycles; "
                         f"{out} is complete up to there\n")
        return 130
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser(
        "run", help="replay a command stream through the planner; write a run directory",
        description="Replays a rosbag2 bag, a bare .mcap or a JSONL stream through the "
                    "deadline-enforced planner at the recorded pace (or --asap) and writes "
                    "OUT/cycles.jsonl, OUT/summary.json and OUT/manifest.json.")
    add_run_args(p)
    p.add_argument("--label", default=None, help="name of this configuration in comparisons")
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--json", action="store_true",
                   help="print summary.json (--find-rate: find_rate.json)")
    add_find_rate_args(p)
    p.set_defaults(func=cmd_run)
