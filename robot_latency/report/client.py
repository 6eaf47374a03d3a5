"""Reaction latency at the client edge: what the subscriber of the plans sees.

The bag replayer (:mod:`robot_latency.ros.client_edge`) writes one row per command it sent to
``client.jsonl`` beside the planner's run, and ``client_summary.json``:

    {"command_id": "c12@0", "stream_command_id": "c12", "play": 0,
     "sent_ns": ..., "received_ns": ... or null, "status": "answered"|"superseded"|"unanswered",
     "plan_source": "model"|"fallback"|null, "plan_cycle": ..., "plans_received": ...,
     "reaction_client_ms": ... or null, "deadline_met": true|false}

``sent_ns`` is read just before the command is published, ``received_ns`` when the first plan
for it reaches the subscriber's callback; both on the host's monotonic clock (Linux
``CLOCK_MONOTONIC``, which ``time.perf_counter_ns`` reads, and so does the planner's loop). On
one machine the two processes' times are comparable, so per command:

    reaction_client = received - sent                    (what the robot feels)
    reaction_planner = published - arrival               (the planner's record)
    transport = reaction_client - reaction_planner       (DDS both ways, serialisation and both
                                                          executors)

Across machines the clocks differ by an unknown offset and ``transport`` includes it.

With camera frames (the replayer sends a bag's frames, each stamped at its send), a plan whose
``header.stamp`` is a frame's stamp came from that frame: the row has ``frame_stamp_ns`` and
``frame_age_ms``, received minus the frame's send (on the same monotonic clock): how old the
picture the robot acts on is when the plan arrives. With a limit (``max_frame_age_ms``, > 0) a
plan from an older frame is ``stale``, counted beside late in the summary.

A command is ``superseded`` when it never got a plan of its own but a later one did (the planner
moved on to a newer command), ``unanswered`` when no later command was answered either. Both
are misses as the receiver sees them, as is a plan that arrived after ``sent + deadline``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robot_latency.records import CycleRecord
from robot_latency.report.figsave import save_png
from robot_latency.report.rundir import ReportError
from robot_latency.report.table import fmt, markdown_lines, pct, rate_ci
from robot_latency.stats import distribution, wilson_interval, write_summary

log = logging.getLogger(__name__)

CLIENT_LOG = "client.jsonl"
CLIENT_SUMMARY = "client_summary.json"
STATUSES = ("answered", "superseded", "unanswered")

#: What the summary says about the two clocks (also in the report).
SAME_HOST_CLOCK_NOTE = ("sent/received and the planner's arrival/published times are the same "
                        "host's monotonic clock (CLOCK_MONOTONIC); across machines the "
                        "client-planner difference includes the clocks' offset")


class ClientLogError(ReportError):
    """A client.jsonl that cannot be read; the message names the file and line."""


@dataclass
class ClientRecord:
    """One sent command as the client saw it (see the module docstring)."""

    command_id: str
    sent_ns: int
    stream_command_id: str | None = None
    play: int = 0
    received_ns: int | None = None
    status: str = "unanswered"
    plan_source: str | None = None
    plan_cycle: int | None = None
    plans_received: int = 0
    deadline_ms: float | None = None
    frame_stamp_ns: int | None = None
    frame_age_ms: float | None = None
    max_frame_age_ms: float | None = None

    @property
    def stale(self) -> bool:
        """Its plan came from a frame older than ``max_frame_age_ms`` (when that is > 0)."""
        return (self.frame_age_ms is not None and bool(self.max_frame_age_ms)
                and self.frame_age_ms > float(self.max_frame_age_ms))

    @property
    def reaction_client_ns(self) -> int | None:
        """Sent to the first plan received; None without one."""
        return None if self.received_ns is None else self.received_ns - self.sent_ns

    @property
    def deadline_met(self) -> bool:
        """A plan of its own arrived within the deadline from the send."""
        r = self.reaction_client_ns
        return r is not None and self.deadline_ms is not None and r <= self.deadline_ms * 1e6

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON row (stored fields, then the derived ones)."""
        r = self.reaction_client_ns
        return {**asdict(self), "reaction_client_ms": None if r is None else r / 1e6,
                "deadline_met": self.deadline_met, "stale": self.stale}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClientRecord:
        """Rebuild a row from its JSON form (derived values recomputed)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def client_summary(records: Sequence[ClientRecord], *, unmatched_plans: int = 0,
                   plans_without_command: int = 0, plan_gaps_ms: Iterable[float] = (),
                   via: str = "topic") -> dict[str, Any]:
    """Summarise a client log: reaction percentiles, receiver-side misses with a Wilson interval.

    A miss is a command without a plan of its own within the deadline (late, superseded or
    never answered). ``worst_plan_gap_ms`` is the longest time between two plans received.
    ``via``: how the client sent its commands and got their plans back, ``topic`` (tagged
    commands on planner/command, plans on planner/plan) or ``action`` (PlanCommand goals,
    plans as their results). ``frame_age_ms``: the camera frame's age at the receiver, over
    the plans that came from a frame; ``answered_stale``: those older than
    ``max_frame_age_ms``.
    """
    n = len(records)
    aged = [r for r in records if r.frame_age_ms is not None]
    limits = sorted({r.max_frame_age_ms for r in records if r.max_frame_age_ms})
    answered = [r for r in records if r.status == "answered"]
    misses = sum(1 for r in records if not r.deadline_met)
    late = sum(1 for r in answered if not r.deadline_met)
    ci = wilson_interval(misses, n)
    gaps = list(plan_gaps_ms)
    deadlines = sorted({r.deadline_ms for r in records if r.deadline_ms is not None})
    return {
        "via": via,
        "commands": n,
        "answered": len(answered),
        "answered_late": late,
        "superseded": sum(1 for r in records if r.status == "superseded"),
        "unanswered": sum(1 for r in records if r.status == "unanswered"),
        "deadline_ms": deadlines[0] if len(deadlines) == 1 else (deadlines or None),
        "receiver_misses": misses,
        "receiver_miss_rate": misses / n if n else None,
        "receiver_miss_rate_ci95": list(ci) if ci is not None else None,
        "late_or_never_rate": (late + n - len(answered)) / n if n else None,
        "reaction_client_ms": distribution(
            r.reaction_client_ns / 1e6 for r in answered
            if r.reaction_client_ns is not None).to_dict(),
        "worst_plan_gap_ms": max(gaps) if gaps else None,
        "plans_unmatched": unmatched_plans,
        "plans_without_command": plans_without_command,
        "frame_age_ms": distribution(r.frame_age_ms for r in aged
                                     if r.frame_age_ms is not None).to_dict(),
        "max_frame_age_ms": limits[0] if len(limits) == 1 else (limits or None),
        "answered_stale": sum(1 for r in aged if r.stale),
        "stale_rate": sum(1 for r in aged if r.stale) / len(aged) if aged and limits else None,
        "clock": SAME_HOST_CLOCK_NOTE,
    }


def write_client_log(records: Sequence[ClientRecord], summary: dict[str, Any],
                     out_dir: str | os.PathLike[str]) -> Path:
    """Write ``client.jsonl`` and ``client_summary.json`` into ``out_dir``; return the log."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / CLIENT_LOG
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r.to_dict(), separators=(",", ":")) + "\n")
    os.replace(tmp, path)
    write_summary(summary, d / CLIENT_SUMMARY)
    return path


def read_client_rows(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Return the rows of a run directory's ``client.jsonl`` as dicts.

    Raises:
        ClientLogError: the file cannot be read or a line is not a JSON object.
    """
    path = Path(run_dir) / CLIENT_LOG
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ClientLogError(f"cannot read {path}: {err}") from err
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ClientLogError(f"{path}, line {i}: not JSON: {err}") from err
        if not isinstance(row, dict) or "command_id" not in row or "sent_ns" not in row:
            raise ClientLogError(f"{path}, line {i}: not a client record "
                                 "(needs command_id and sent_ns)")
        rows.append(row)
    return rows


def read_client_log(run_dir: str | os.PathLike[str]) -> list[ClientRecord] | None:
    """Return a run directory's client records, or None when it has no ``client.jsonl``."""
    if not (Path(run_dir) / CLIENT_LOG).is_file():
        return None
    try:
        return [ClientRecord.from_dict(r) for r in read_client_rows(run_dir)]
    except TypeError as err:
        raise ClientLogError(f"{Path(run_dir) / CLIENT_LOG}: a field of the wrong type: "
                             f"{err}") from err


@dataclass(frozen=True)
class EdgeComparison:
    """One run's planner-side against client-side reaction times (ms), joined by command."""

    label: str
    planner_ms: list[float]
    client_ms: list[float]
    transport_ms: list[float]
    command_leg_ms: list[float]
    plan_leg_ms: list[float]
    summary: dict[str, Any]


#: A receiver miss rate more than this above the planner's flags the run (2 points: the target
#: of the transport margin, docs/ROS.md, "The deadline kept at the receiver").
RECEIVER_EXCESS_FLAG = 0.02


def receiver_vs_planner(records: Sequence[CycleRecord],
                        client: dict[str, Any]) -> dict[str, Any]:
    """Return the planner's deadline-miss rate beside the receiver's, and whether it is above.

    The planner's rate is over the cycles that planned a command (skipped and superseded ones
    included: they are misses too); ``receiver_excess_pts`` is the difference in percentage
    points. ``receiver_misses_exceed_planner`` is True when the receiver missed more than the
    planner: plans that were on time where they were published and late where they arrived
    (the transport margin too small for the transport's tail).
    """
    planned = [r for r in records if r.command_id is not None]
    misses = sum(1 for r in planned if not r.deadline_met)
    planner_rate = misses / len(planned) if planned else None
    receiver_rate = client.get("receiver_miss_rate")
    excess = (None if planner_rate is None or receiver_rate is None
              else receiver_rate - planner_rate)
    return {"planner_cycles": len(planned), "planner_deadline_misses": misses,
            "planner_miss_rate": planner_rate,
            "receiver_excess_pts": None if excess is None else 100 * excess,
            "receiver_misses_exceed_planner": excess is not None and excess > 0,
            "receiver_excess_flagged": excess is not None and excess > RECEIVER_EXCESS_FLAG}


def compare_edges(label: str, records: Sequence[CycleRecord],
                  client: Sequence[ClientRecord]) -> EdgeComparison:
    """Join a run's records and its client log by ``command_id``.

    For each command answered at the client, the planner's first published cycle for the same
    command gives its planner-side reaction; ``transport = client - planner`` splits into the
    command's leg (``arrival - sent``) and the plan's (``received - published``).
    """
    first: dict[str, CycleRecord] = {}
    for rec in records:
        if (rec.command_id is not None and rec.published_ns is not None
                and rec.command_id not in first):
            first[rec.command_id] = rec
    planner = [r.reaction_ns / 1e6 for r in records if r.reaction_ns is not None
               and first.get(r.command_id or "") is r]
    client_ms, transport, cmd_leg, plan_leg = [], [], [], []
    for row in client:
        rc = row.reaction_client_ns
        if rc is None:
            continue
        client_ms.append(rc / 1e6)
        rec = first.get(row.command_id)
        if rec is None or rec.reaction_ns is None or rec.command_arrival_ns is None:
            continue
        assert rec.published_ns is not None and row.received_ns is not None
        transport.append((rc - rec.reaction_ns) / 1e6)
        cmd_leg.append((rec.command_arrival_ns - row.sent_ns) / 1e6)
        plan_leg.append((row.received_ns - rec.published_ns) / 1e6)
    summary = client_summary(client)
    summary.update(receiver_vs_planner(records, summary))
    summary["reaction_planner_ms"] = distribution(planner).to_dict()
    summary["transport_ms"] = distribution(transport).to_dict()
    summary["command_leg_ms"] = distribution(cmd_leg).to_dict()
    summary["plan_leg_ms"] = distribution(plan_leg).to_dict()
    return EdgeComparison(label, planner, client_ms, transport, cmd_leg, plan_leg, summary)


def edge_section(edges: Sequence[EdgeComparison]) -> list[str]:
    """The report's Markdown section: planner side, client side and their difference."""
    if not edges:
        return []
    header = ["configuration", "sent via", "planner p50/p99 ms (n)",
              "client p50/p90/p99/max ms (n)",
              "transport+executor p50/p99/max ms (n)", "receiver miss rate [95% CI]",
              "superseded / never", "unmatched plans", "planner miss rate"]
    lines = ["## Reaction time at the client edge", "",
             "Command sent (bag_replayer) to its plan received by the replayer's subscriber, "
             "against the planner's own arrival-to-publish time; the difference is DDS both "
             "ways, serialisation and both executors. " + SAME_HOST_CLOCK_NOTE[0].upper()
             + SAME_HOST_CLOCK_NOTE[1:] + ". A receiver miss is a command without its own plan "
             "within the deadline; the planner miss rate is the planner's own deadline misses "
             "over its cycles for a command. A receiver rate above the planner's means plans on "
             "time where they were published arrived late: flagged below. Sent via: topic "
             "(tagged commands on planner/command, plans from planner/plan) or action "
             "(PlanCommand goals, plans as their results).", ""]
    rows = []
    for e in edges:
        s = e.summary
        p, c, t = s["reaction_planner_ms"], s["reaction_client_ms"], s["transport_ms"]
        ci = s["receiver_miss_rate_ci95"]
        rate = s["receiver_miss_rate"]
        miss = "-" if rate is None else rate_ci(rate, ci[0], ci[1])
        rows.append([
            e.label, str(s.get("via", "topic")),
            f"{fmt(p['p50'], '.1f')} / {fmt(p['p99'], '.1f')} ({p['n']})",
            f"{fmt(c['p50'], '.1f')} / {fmt(c['p90'], '.1f')} / {fmt(c['p99'], '.1f')} / "
            f"{fmt(c['max'], '.1f')} ({c['n']})",
            f"{fmt(t['p50'])} / {fmt(t['p99'])} / {fmt(t['max'])} ({t['n']})",
            miss, f"{s['superseded']} / {s['unanswered']}", str(s["plans_unmatched"]),
            _planner_rate(s)])
    if any(e.summary.get("frame_age_ms", {}).get("n") for e in edges):
        header, rows = _frame_columns(header, rows, edges)
    lines += markdown_lines(header, rows, aligned=False)
    flagged = [e for e in edges if e.summary.get("receiver_misses_exceed_planner")]
    lines.append("")
    for e in flagged:
        s = e.summary
        mark = "**WARNING**" if s.get("receiver_excess_flagged") else "note"
        lines.append(
            f"- {mark}: {e.label}: the receiver missed more than the planner "
            f"({100 * s['receiver_miss_rate']:.1f}% against {100 * s['planner_miss_rate']:.1f}%, "
            f"+{s['receiver_excess_pts']:.1f} points): plans on time where they were published "
            "arrived late; the transport margin did not cover the transport's tail.")
    return [*lines, ""] if flagged else lines


def _frame_columns(header: list[str], rows: list[list[str]], edges: Sequence[EdgeComparison]
                   ) -> tuple[list[str], list[list[str]]]:
    """Add the camera frame's age at the receiver and the stale plans beside the late ones."""
    out = []
    for row, e in zip(rows, edges, strict=True):
        s, a = e.summary, e.summary.get("frame_age_ms") or {}
        limit = s.get("max_frame_age_ms")
        stale = "-" if not limit else f"{s['answered_stale']} (> {limit:g} ms)"
        out.append([*row, f"{fmt(a.get('p50'), '.1f')} / {fmt(a.get('p99'), '.1f')} "
                          f"({a.get('n', 0)})", f"{s['answered_late']} / {stale}"])
    return [*header, "frame age p50/p99 ms (n)", "late / stale"], out


def _planner_rate(s: dict[str, Any]) -> str:
    rate = s.get("planner_miss_rate")
    if rate is None:
        return "-"
    flag = " ⚠" if s.get("receiver_excess_flagged") else ""
    return pct(rate) + flag


def plot_reaction_cdf(edges: Sequence[EdgeComparison],
                      path: str | os.PathLike[str]) -> Path | None:
    """Plot the planner-side and client-side reaction CDFs, and the difference's, per run."""
    import numpy as np
    from matplotlib.figure import Figure

    data = [e for e in edges if e.client_ms]
    if not data:
        log.info("reaction CDF not plotted: no client log with answered commands")
        return None
    fig = Figure(figsize=(12, 5))
    left, right = fig.subplots(1, 2)

    def cdf(ax: Any, values: Sequence[float], **kw: Any) -> Any:
        xs = np.sort(np.asarray(values, dtype=np.float64))
        ys = np.arange(1, xs.size + 1) / xs.size
        return ax.step(xs, ys, where="post", **kw)[0]

    for e in data:
        line = cdf(left, e.client_ms, label=f"{e.label}: client (n={len(e.client_ms)})")
        if e.planner_ms:
            cdf(left, e.planner_ms, color=line.get_color(), linestyle="--",
                label=f"{e.label}: planner (n={len(e.planner_ms)})")
        if e.transport_ms:
            cdf(right, e.transport_ms, color=line.get_color(),
                label=f"{e.label} (n={len(e.transport_ms)})")
    left.set_xlabel("reaction time: command sent/arrived to plan received/published (ms)")
    left.set_ylabel("fraction of commands ≤ x")
    left.set_title("Reaction time: client edge (solid) and planner (dashed)")
    right.set_xlabel("client - planner reaction time (ms): transport + executors")
    right.set_title("The difference per command")
    for ax in (left, right):
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return save_png(fig, path)


def load_edges(runs: Sequence[Any], run_dirs: Sequence[str | os.PathLike[str]]
               ) -> list[EdgeComparison]:
    """Client-edge comparisons for the runs (``RunData``) whose directory has a client log.

    Counts only the replayer knew (plans matching no sent command, the worst gap between
    plans) come from its ``client_summary.json``.
    """
    out = []
    for run, d in zip(runs, run_dirs, strict=True):
        client = read_client_log(d)
        if client is None:
            continue
        edge = compare_edges(run.label, run.records, client)
        try:
            saved = json.loads((Path(d) / CLIENT_SUMMARY).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        if isinstance(saved, dict):
            for key in ("plans_unmatched", "plans_without_command", "worst_plan_gap_ms",
                        "plans_received", "via"):
                if key in saved:
                    edge.summary[key] = saved[key]
        out.append(edge)
    return out


def edge_markdown(run_dirs: Sequence[str | os.PathLike[str]]) -> str:
    """The client-edge section for finished run directories ("" when none has a client log)."""
    from robot_latency.report.rundir import load_runs

    return "\n".join(edge_section(load_edges(load_runs(run_dirs), run_dirs)))
