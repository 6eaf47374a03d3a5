"""A run as a Chrome trace-event file (``{"traceEvents": [...]}``) that Perfetto and
chrome://tracing open.

One process per run directory (named by its label), with:

- thread ``planner loop`` (tid 1): one complete event (``"ph": "X"``) per cycle, from its
  scheduled start to the end of its publish, with its phases nested inside by time
  (:func:`robot_latency.report.phases.cycle_spans`: ``sample`` and ``grammar`` inside ``decode``,
  never after it). A skipped cycle is a zero-length slice.
- thread ``engine worker`` (tid 2): one slice per generation (tokenize to the last token), with
  the engine's phases nested (a generation the loop gave up on shows what it ran until then:
  the worker hands its partial trace over at the abort); ``generate (no trace)`` only where
  no trace came back at all (a hung or dead worker), from the cycle's start to the fallback; an
  instant where the engine reported an error.
- thread ``client`` (tid 3), when the run has a ``client.jsonl``: an instant per plan received
  at the subscriber.
- instant events (``"ph": "i"``, thread scope) on the loop's track: ``command`` at each new
  command's arrival, ``deadline`` at every cycle's deadline, ``miss`` at the deadline of each
  cycle that missed it, ``fallback`` where a fallback answered (with its reason).
- counters (``"ph": "C"``): ``rss_mb`` and ``host_steal_ms`` per cycle, at its publish.

Timestamps (``ts``, ``dur``) are microseconds from the run's first scheduled start (its
loop-clock value in ns is ``otherData.origin_ns``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from robot_latency.planner.mcap_log import MCAP_NAME
from robot_latency.records import CycleRecord, RecordError, read_records
from robot_latency.report.phases import ENGINE_PHASES, cycle_spans
from robot_latency.report.rundir import ReportError, load_run

log = logging.getLogger(__name__)

LOOP_TID, ENGINE_TID, CLIENT_TID = 1, 2, 3
TRACK_NAMES = {LOOP_TID: "planner loop", ENGINE_TID: "engine worker", CLIENT_TID: "client"}


class TraceError(ReportError):
    """A trace that cannot be built (a run directory without records); names the directory."""


def _us(ns: int, origin_ns: int) -> float:
    return (ns - origin_ns) / 1e3


def _label(run_dir: Path) -> str:
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    label = manifest.get("label") if isinstance(manifest, dict) else None
    return label if isinstance(label, str) and label else run_dir.resolve().name


def load_trace_records(run_dir: str | os.PathLike[str]) -> list[CycleRecord]:
    """Read a run directory's records for a trace.

    Raises:
        TraceError: the directory holds no ``cycles.jsonl`` (nor a ``run.mcap``), or no record
            in it.
    """
    d = Path(run_dir)
    path = d / "cycles.jsonl"
    if not path.is_file() and (d / MCAP_NAME).is_file():
        records = load_run(d).records  # the run's run.mcap
        if records:
            return list(records)
    if not path.is_file():
        raise TraceError(f"run directory {d} has no records (no cycles.jsonl): nothing to trace")
    try:
        records = read_records(path)
    except RecordError as err:
        raise TraceError(str(err)) from err
    if not records:
        raise TraceError(f"run directory {d} has no records ({path} is empty): nothing to trace")
    return records


def _cycle_end(rec: CycleRecord) -> int:
    end = rec.published_ns if rec.published_ns is not None else rec.scheduled_ns
    end += rec.phases_ns.get("publish", 0) if rec.published_ns is not None else 0
    return max(end, max((s.end_ns for s in cycle_spans(rec)), default=end))


def run_events(records: Sequence[CycleRecord], *, pid: int, label: str, origin_ns: int,
               client: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Return one run's trace events (see the module docstring)."""
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}}]
    for tid, name in TRACK_NAMES.items():
        if tid != CLIENT_TID or client:
            ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                       "args": {"name": name}})
            ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                       "args": {"sort_index": tid}})

    def x(tid: int, name: str, start: int, end: int, cat: str, **args: Any) -> None:
        ev.append({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat,
                   "ts": _us(start, origin_ns), "dur": max(0, end - start) / 1e3,
                   "args": args})

    def instant(tid: int, name: str, at: int, **args: Any) -> None:
        ev.append({"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": name, "cat": "event",
                   "ts": _us(at, origin_ns), "args": args})

    seen_commands: set[str] = set()
    for rec in records:
        spans = cycle_spans(rec)
        x(LOOP_TID, f"cycle {rec.cycle}", rec.scheduled_ns, _cycle_end(rec), "cycle",
          cycle=rec.cycle, command_id=rec.command_id, source=rec.plan_source,
          fallback_reason=rec.fallback_reason, deadline_met=rec.deadline_met,
          skipped=rec.skipped, tokens_out=rec.tokens_out)
        for s in spans:
            x(LOOP_TID, s.name, s.start_ns, s.end_ns, "phase", cycle=rec.cycle)
        engine = [s for s in spans if s.name in ENGINE_PHASES
                  or s.parent in ("decode", "sample")]
        if engine:
            top = [s for s in engine if s.depth == 0]
            x(ENGINE_TID, "generate", min(s.start_ns for s in top), max(s.end_ns for s in top),
              "engine", cycle=rec.cycle, tokens_in=rec.tokens_in, tokens_out=rec.tokens_out,
              stop_reason=rec.stop_reason, fallback_reason=rec.fallback_reason)
            for s in engine:
                x(ENGINE_TID, s.name, s.start_ns, s.end_ns, "engine", cycle=rec.cycle)
        elif rec.fallback_reason in ("deadline", "engine_error") and rec.started_ns is not None:
            # The loop gave up on the engine before it returned a trace: show the wait.
            fb = next((s for s in spans if s.name == "fallback"), None)
            end = fb.start_ns if fb is not None else (rec.published_ns or rec.deadline_ns)
            x(ENGINE_TID, "generate (no trace)", rec.started_ns, max(end, rec.started_ns),
              "engine", cycle=rec.cycle, outcome=rec.fallback_reason, error=rec.engine_error)
        if rec.engine_error:
            at = rec.published_ns if rec.published_ns is not None else rec.deadline_ns
            instant(ENGINE_TID, "engine error", at, cycle=rec.cycle, error=rec.engine_error)
        if (rec.command_id is not None and rec.command_arrival_ns is not None
                and rec.command_id not in seen_commands):
            seen_commands.add(rec.command_id)
            instant(LOOP_TID, "command", rec.command_arrival_ns, command_id=rec.command_id)
        instant(LOOP_TID, "deadline", rec.deadline_ns, cycle=rec.cycle)
        if not rec.deadline_met:
            instant(LOOP_TID, "miss", rec.deadline_ns, cycle=rec.cycle,
                    reason=rec.fallback_reason, overshoot_ms=(rec.overshoot_ns or 0) / 1e6)
        if rec.plan_source == "fallback":
            fb = next((s for s in spans if s.name == "fallback"), None)
            at = fb.start_ns if fb is not None else (rec.published_ns or rec.deadline_ns)
            instant(LOOP_TID, "fallback", at, cycle=rec.cycle, reason=rec.fallback_reason,
                    policy=rec.fallback_policy)
        at = rec.published_ns if rec.published_ns is not None else rec.scheduled_ns
        if rec.rss_bytes is not None:
            ev.append({"ph": "C", "pid": pid, "name": "rss_mb", "ts": _us(at, origin_ns),
                       "args": {"rss_mb": rec.rss_bytes / 2**20}})
        if rec.host_steal_ns is not None:
            ev.append({"ph": "C", "pid": pid, "name": "host_steal_ms", "ts": _us(at, origin_ns),
                       "args": {"host_steal_ms": rec.host_steal_ns / 1e6}})
    for row in client:
        received = row.get("received_ns")
        if isinstance(received, int):
            instant(CLIENT_TID, "plan received", received, command_id=row.get("command_id"),
                    source=row.get("plan_source"),
                    reaction_client_ms=row.get("reaction_client_ms"))
    return ev


def build_trace(run_dirs: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """Return the trace of one or more run directories (one process each).

    Raises:
        TraceError: a directory holds no records.
    """
    from robot_latency.report.client import read_client_rows

    loaded = [(Path(d), load_trace_records(d)) for d in run_dirs]
    origin = min(r.scheduled_ns for _, recs in loaded for r in recs)
    events: list[dict[str, Any]] = []
    for pid, (d, recs) in enumerate(loaded, start=1):
        client = read_client_rows(d) if (d / "client.jsonl").is_file() else []
        events += run_events(recs, pid=pid, label=_label(d), origin_ns=origin, client=client)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"origin_ns": origin, "clock": "the planner's monotonic clock",
                          "runs": [str(d) for d, _ in loaded]}}


def write_trace(run_dirs: Sequence[str | os.PathLike[str]],
                path: str | os.PathLike[str]) -> Path:
    """Write the trace of ``run_dirs`` to ``path`` (JSON); return the path.

    Raises:
        TraceError: a directory holds no records, or the file cannot be written.
    """
    trace = build_trace(run_dirs)
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(trace, separators=(",", ":"), allow_nan=False) + "\n",
                     encoding="utf-8")
    except OSError as err:
        raise TraceError(f"cannot write the trace {p}: {err.strerror or err}") from err
    log.info("trace written to %s (%d events)", p, len(trace["traceEvents"]))
    return p
