"""``report`` and ``summarize``: compare run directories (plots, report.md, a trace), and
summarise one cycle log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robot_latency.cli.common import UsageError, echo, emit_json
from robot_latency.records import read_records
from robot_latency.stats import summarize, write_summary


def cmd_summarize(args: argparse.Namespace) -> int:
    path = Path(args.cycles)
    summary = summarize(read_records(path))
    if args.out:
        write_summary(summary, args.out)
    if args.json or not args.out:
        emit_json(summary)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from robot_latency.report.compare import compare_runs, to_markdown
    from robot_latency.report.markdown import host_load_warning, write_report

    out = Path(args.out) if args.out else Path(args.runs[0]).parent / "report"
    # "report runs/ladder/*/ --out runs/ladder/report" run a second time: the glob now holds
    # the report directory itself, which is no run.
    runs = [r for r in args.runs if Path(r).resolve() != out.resolve()]
    if len(runs) < len(args.runs):
        sys.stderr.write(f"note: {out} is the report's own directory, not a run; left out\n")
    if not runs:
        raise UsageError("no run directories left besides the report's own --out")
    args.runs = runs
    margin = args.target_transport_margin_ms
    report = write_report(args.runs, out, reference=args.reference, transport_margin_ms=margin)
    echo(to_markdown(compare_runs(args.runs, reference=args.reference,
                                  transport_margin_ms=margin)))
    for run in args.runs:
        warning = host_load_warning(run)
        if warning:
            echo(f"\nWARNING: {run}: {warning}")
    echo(f"\nreport: {report}")
    if args.trace:
        from robot_latency.report.trace import write_trace

        echo(f"trace (Perfetto, chrome://tracing): {write_trace(args.runs, args.trace)}")
    return 0

def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``report`` and ``summarize`` commands to the ``robot-latency`` parser."""
    p = sub.add_parser("report", help="compare run directories; write plots and report.md")
    p.add_argument("runs", nargs="+", help="run directories (from robot-latency run)")
    p.add_argument("--out", default=None, help="report directory (default: RUN0/../report)")
    p.add_argument("--reference", default=None,
                   help="label of the run plans are compared against (default: the highest "
                        "precision: bits per weight, then F16 > Q8_0 > ...)")
    p.add_argument("--target-transport-margin-ms", type=float, default=None,
                   help="the target's transport margin, measured on the robot (the node logs "
                        "it); default: a stated one (docs/REFERENCE.md, Transport margin), "
                        "never the margin the runs kept on this host")
    p.add_argument("--trace", default=None, metavar="FILE.json",
                   help="also write the runs as a Chrome trace-event file (opens in Perfetto)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("summarize", help="summarise a cycles.jsonl into summary.json")
    p.add_argument("cycles", help="path to a cycles.jsonl")
    p.add_argument("--out", default=None, help="write summary.json here")
    p.add_argument("--json", action="store_true", help="also print it")
    p.set_defaults(func=cmd_summarize)
