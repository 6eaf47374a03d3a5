"""Compare finished runs side by side: one :class:`ComparisonRow` per configuration.

Column names (:data:`COLUMNS`, stable: the CSV header and the JSON keys; ``None`` where a value is
unknown or undefined, an empty cell in CSV, ``-`` in Markdown):

==========================  =====================================================================
``label``                   the configuration (``manifest["label"]``, else the directory name)
``run_dir``                 the run directory
``engine``                  ``manifest["engine"]``
``model_name``, ``quant``   ``manifest["model"]["name"]``, ``["quant"]``
``model_bytes``             weight bytes (``manifest["model"]["weight_bytes_total"]``)
``model_size``              the same, human readable (``"4.1 GiB"``)
``effective_bpw``           effective bits per weight
``floor_itl_host_ms``       predicted decode ITL floor on this host (ms/token)
``floor_itl_target_ms``     predicted decode ITL floor on the target device (ms/token)
``target_device``           the target device id
``pred_itl_target_ms``      calibrated ITL prediction on the target (floor / efficiency +
                            overhead; :mod:`robot_latency.floor.target`), ms/token
``pred_engine_family``      the engine family that prediction is calibrated for
``cycles``                  cycles in the run (skipped ones included)
``ttft_p50_ms``, ``ttft_p99_ms``, ``ttft_n``   time to first token and its sample count
``itl_p50_ms``, ``itl_p99_ms``, ``itl_n``      inter-token gaps (every gap pooled) and count
``deadline_misses``, ``deadline_miss_rate``, ``deadline_miss_ci95_lo``, ``deadline_miss_ci95_hi``
                            plan not published by the deadline (late or skipped), Wilson 95%
``model_misses``, ``model_miss_rate``, ``model_miss_ci95_lo``, ``model_miss_ci95_hi``
                            the model did not deliver and a fallback answered, for any
                            reason (see :mod:`robot_latency.report.diagnose`), Wilson 95%
``fallbacks``, ``fallback_rate``   cycles answered by a fallback, for any reason (the same
                            count as ``model_misses``: every fallback is a model miss)
``reference``               the label of the reference configuration
``agreement``               fraction of commands whose outcome equals the reference's: the same
                            model plan, or both fell back (a fallback is its own outcome)
``agreement_n``             commands compared (every command both runs planned)
``floor_efficiency``        ``floor_itl_host_ms / itl_p50_ms`` (1.0 = at the bandwidth floor)
``tpot_p50_ms``             median time per output token after the first
``tpot_speedup``            the reference's ``tpot_p50_ms`` over this run's (2.0: decodes twice
                            as fast); with the same target without a draft as the reference, the
                            measured speculative speed-up
``spec_alpha``, ``spec_cost_ratio``, ``spec_predicted_speedup``
                            speculative decoding: acceptance rate, draft cost ratio c, and the
                            formula's speed-up from them (v = 0); None without a draft
``replay_mode``, ``replay_speed``   ``"recorded"`` or ``"asap"`` (as fast as possible), factor
``reference_reason``        why the reference is the reference (``--reference``, or the highest
                            precision among the runs: bits per weight, then the ladder's order)
``plan_made``               where the plans were made: ``onboard`` (an engine on the robot, or
                            the simulated target), ``offboard`` (engine ``openai``: a server) or
                            ``hybrid`` (both asked each cycle)
``server_plans``            hybrid: model plans published from the server (the rest onboard)
``target_pred_miss_rate``, ``target_pred_miss_interval`` ``[lo, hi]``
                            the loop simulated on ``target_device`` from the run directory's
                            untimed pass (``target.json``, :mod:`robot_latency.planner.target_sim`):
                            predicted receiver miss rate (fraction of commands) and its interval
``target_pred_e2e_p50_ms``, ``target_pred_model_in_time_rate``   e2e p50 there (ms); commands
                            whose model plan is valid and in time there (fraction)
``target_min_deadline_ms``  the smallest deadline held there at a 5% receiver miss rate, ms
==========================  =====================================================================

Plan agreement pairs cycles by ``command_id``: for each command, its first cycle in each run.
Its outcome is the model's plan, or "fallback" when the fallback answered: a level that falls
back on the hard commands does not look better for it (the pair is counted, not dropped). The
reference row's own agreement is None (nothing to compare).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from robot_latency.records import CycleRecord
from robot_latency.report.diagnose import is_deadline_miss, is_model_miss
from robot_latency.report.rundir import (
    ReportError,
    RunData,
    host_itl_floor_ms,
    load_runs,
    model_field,
    replay_mode,
    replay_speed,
    target_device_id,
    target_itl_floor_ms,
    target_prediction,
)
from robot_latency.report.table import fmt, human_bytes, markdown_table, rate_ci
from robot_latency.report.target import simulated_answers, with_target_fields
from robot_latency.stats import distribution, speculative_summary, wilson_interval

log = logging.getLogger(__name__)

#: Version of the comparison JSON layout; bump when a column changes meaning.
COMPARISON_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ComparisonRow:
    """One configuration's line in the comparison (columns documented in the module)."""

    label: str
    run_dir: str | None
    engine: str | None
    model_name: str | None
    quant: str | None
    model_bytes: int | None
    model_size: str | None
    effective_bpw: float | None
    floor_itl_host_ms: float | None
    floor_itl_target_ms: float | None
    target_device: str | None
    pred_itl_target_ms: float | None
    pred_engine_family: str | None
    cycles: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    ttft_n: int
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    itl_n: int
    deadline_misses: int
    deadline_miss_rate: float | None
    deadline_miss_ci95_lo: float | None
    deadline_miss_ci95_hi: float | None
    model_misses: int
    model_miss_rate: float | None
    model_miss_ci95_lo: float | None
    model_miss_ci95_hi: float | None
    fallbacks: int
    fallback_rate: float | None
    reference: str | None
    agreement: float | None
    agreement_n: int
    floor_efficiency: float | None
    tpot_p50_ms: float | None
    tpot_speedup: float | None
    spec_alpha: float | None
    spec_cost_ratio: float | None
    spec_predicted_speedup: float | None
    replay_mode: str | None
    replay_speed: float | None
    reference_reason: str | None = None
    plan_made: str | None = None
    server_plans: int | None = None
    target_pred_miss_rate: float | None = None
    target_pred_miss_interval: list[float] | None = None
    target_pred_e2e_p50_ms: float | None = None
    target_pred_model_in_time_rate: float | None = None
    target_min_deadline_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the row as a dict keyed by :data:`COLUMNS`."""
        return asdict(self)


#: The stable column names, in order.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ComparisonRow))


def _first_outcomes(records: Sequence[CycleRecord]) -> dict[str, Any]:
    """Return {command_id: the model's plan, or "fallback"} at each command's first plan."""
    out: dict[str, Any] = {}
    for rec in records:
        if rec.command_id is None or rec.command_id in out or rec.plan_source == "none":
            continue
        out[rec.command_id] = rec.plan if rec.plan_source == "model" else "fallback"
    return out


def plan_agreement(records: Sequence[CycleRecord],
                   reference: Sequence[CycleRecord]) -> tuple[float | None, int]:
    """Return (fraction of shared commands with equal outcomes, commands compared).

    An outcome is the model's plan, or the fallback (its own outcome, counted). The fraction is
    None when no command was planned in both runs.
    """
    mine, ref = _first_outcomes(records), _first_outcomes(reference)
    shared = [cid for cid in mine if cid in ref]
    if not shared:
        return None, 0
    equal = sum(1 for cid in shared if mine[cid] == ref[cid])
    return equal / len(shared), len(shared)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _quant_rank(run: RunData) -> int:
    """The run's place in the ladder (0 = F32, highest): its model's quant, else its label."""
    from robot_latency.models.ladder import VALID_QUANTS

    rank = {q: i for i, q in enumerate(VALID_QUANTS)}
    for name in (model_field(run, "quant"), run.label):
        if isinstance(name, str) and name.upper() in rank:
            return rank[name.upper()]
    return len(VALID_QUANTS)


def choose_reference(runs: Sequence[RunData], reference: str | None = None
                     ) -> tuple[RunData | None, str | None]:
    """Return the run plans are compared against, and why it was chosen.

    ``reference`` (a label) wins; otherwise the highest precision among the runs: the highest
    effective bits per weight (when every run records it), then the ladder's order (F32 > F16 >
    Q8_0 > ... > Q2_K; the model's quant, else the run's label), then the first given. The order
    of the arguments decides nothing else.

    Raises:
        ReportError: ``reference`` names no run.
    """
    if not runs:
        return None, None
    if reference is not None:
        matches = [r for r in runs if r.label == reference]
        if not matches:
            raise ReportError(f"reference configuration {reference!r} is not among the runs "
                              f"({', '.join(r.label for r in runs)})")
        return matches[0], "chosen with --reference"
    if len(runs) == 1:
        return runs[0], "the only run"
    bpws = [_float(model_field(r, "effective_bpw")) for r in runs]
    ranks = [_quant_rank(r) for r in runs]
    by_bpw = all(b is not None for b in bpws)
    keys = [((b or 0.0) if by_bpw else 0.0, -rank) for b, rank in zip(bpws, ranks, strict=True)]
    best = max(range(len(runs)), key=lambda i: (keys[i], -i))
    run, bpw, rank = runs[best], bpws[best], ranks[best]
    if not by_bpw and rank == _quant_rank_unknown():
        return run, "no precision recorded for every run: the first run"
    level = model_field(run, "quant") or run.label
    if len(set(keys)) == 1:
        return run, "every run at the same precision: the first run"
    if by_bpw and sum(1 for b in bpws if b == bpw) == 1:
        return run, f"highest precision among the runs: {bpw:.2f} bits per weight ({level})"
    return run, (f"highest precision among the runs: {level}, first in the ladder's order "
                 "F32 > F16 > Q8_0 > ... > Q2_K")


def _quant_rank_unknown() -> int:
    from robot_latency.models.ladder import VALID_QUANTS

    return len(VALID_QUANTS)


def _row(run: RunData, reference: RunData | None, run_dir: str | None,
         reference_reason: str | None = None) -> ComparisonRow:
    recs = run.records
    n = len(recs)
    ttft = distribution(r.ttft_ns / 1e6 for r in recs if r.ttft_ns is not None)
    itl = distribution(g / 1e6 for r in recs for g in r.itl_ns)
    dm = sum(1 for r in recs if is_deadline_miss(r))
    mm = sum(1 for r in recs if is_model_miss(r))
    fb = sum(1 for r in recs if r.plan_source == "fallback")
    dci, mci = wilson_interval(dm, n), wilson_interval(mm, n)
    tpot = _tpot_p50_ms(recs)
    if reference is None or reference is run:
        agreement, agreement_n = None, 0
        ref_tpot = tpot if reference is run else None
    else:
        agreement, agreement_n = plan_agreement(recs, reference.records)
        ref_tpot = _tpot_p50_ms(reference.records)
    spec = speculative_summary(recs) or {}
    floor_host = host_itl_floor_ms(run)
    pred = target_prediction(run)
    model_bytes = _int(model_field(run, "weight_bytes_total"))
    return ComparisonRow(
        label=run.label,
        run_dir=run_dir,
        engine=_str((run.manifest or {}).get("engine")),
        model_name=_str(model_field(run, "name")),
        quant=_str(model_field(run, "quant")),
        model_bytes=model_bytes,
        model_size=human_bytes(model_bytes),
        effective_bpw=_float(model_field(run, "effective_bpw")),
        floor_itl_host_ms=floor_host,
        floor_itl_target_ms=target_itl_floor_ms(run),
        target_device=target_device_id(run),
        pred_itl_target_ms=(pred or {}).get("itl_pred_ms"),
        pred_engine_family=_str((pred or {}).get("engine_family")),
        cycles=n,
        ttft_p50_ms=ttft.p50, ttft_p99_ms=ttft.p99, ttft_n=ttft.n,
        itl_p50_ms=itl.p50, itl_p99_ms=itl.p99, itl_n=itl.n,
        deadline_misses=dm,
        deadline_miss_rate=dm / n if n else None,
        deadline_miss_ci95_lo=dci[0] if dci else None,
        deadline_miss_ci95_hi=dci[1] if dci else None,
        model_misses=mm,
        model_miss_rate=mm / n if n else None,
        model_miss_ci95_lo=mci[0] if mci else None,
        model_miss_ci95_hi=mci[1] if mci else None,
        fallbacks=fb,
        fallback_rate=fb / n if n else None,
        reference=reference.label if reference is not None else None,
        agreement=agreement,
        agreement_n=agreement_n,
        floor_efficiency=(floor_host / itl.p50 if floor_host is not None and itl.p50
                          else None),
        tpot_p50_ms=tpot,
        tpot_speedup=ref_tpot / tpot if ref_tpot is not None and tpot else None,
        spec_alpha=spec.get("alpha"),
        spec_cost_ratio=spec.get("cost_ratio"),
        spec_predicted_speedup=spec.get("predicted_speedup"),
        replay_mode=replay_mode(run),
        replay_speed=replay_speed(run),
        reference_reason=reference_reason,
        plan_made=plan_made(run),
        server_plans=_server_plans(run.records) if plan_made(run) == "hybrid" else None,
    )


def plan_made(run: RunData) -> str | None:
    """Return where a run's plans were made: onboard, offboard (a server) or hybrid."""
    engine = (run.manifest or {}).get("engine")
    if engine is None:
        return None
    return {"openai": "offboard", "hybrid": "hybrid"}.get(str(engine), "onboard")


def _server_plans(records: Sequence[CycleRecord]) -> int:
    return sum(1 for r in records if r.plan_source == "model" and r.offboard
               and (r.offboard.get("hybrid") or {}).get("published") == "server")


def _tpot_p50_ms(records: Sequence[CycleRecord]) -> float | None:
    return distribution(t / 1e6 for r in records if (t := r.tpot_ns) is not None).p50


def compare_loaded(runs: Sequence[RunData], *, reference: str | None = None,
                   run_dirs: Sequence[str | os.PathLike[str]] | None = None,
                   transport_margin_ms: float | None = None) -> list[ComparisonRow]:
    """Compare runs already in memory (see :func:`compare_runs`)."""
    if not runs:
        return []
    ref, why = choose_reference(runs, reference)
    dirs = [str(d) for d in run_dirs] if run_dirs is not None else [None] * len(runs)
    rows = [_row(run, ref, d, why) for run, d in zip(runs, dirs, strict=True)]
    answers = simulated_answers(runs, run_dirs, transport_margin_ms=transport_margin_ms) \
        if run_dirs is not None else [None] * len(rows)
    return [with_target_fields(row, a) for row, a in zip(rows, answers, strict=True)]



def compare_runs(run_dirs: Sequence[str | os.PathLike[str]], *,
                 reference: str | None = None,
                 transport_margin_ms: float | None = None) -> list[ComparisonRow]:
    """Read run directories and compare them, one row per configuration, in the given order.

    Args:
        run_dirs: directories written by ``robot-latency run``.
        reference: the label of the configuration that plan agreement is measured against;
            default: the highest precision (:func:`choose_reference`).
        transport_margin_ms: the target's transport margin measured on the robot, for the
            simulated answer (None: the stated default).

    Raises:
        RunDirError: a directory lacks ``cycles.jsonl`` or ``manifest.json`` or cannot be read
            (the message names the directory and the file).
        ReportError: ``reference`` names no run.
    """
    return compare_loaded(load_runs(run_dirs), reference=reference, run_dirs=run_dirs,
                          transport_margin_ms=transport_margin_ms)


# --- renderers ---------------------------------------------------------------------------------

#: Markdown table header (human names; the data columns are :data:`COLUMNS`).
MARKDOWN_HEADER = ("config", "size", "bpw", "floor ITL host ms", "floor ITL target ms",
                   "pred. ITL target ms", "TTFT p50/p99 ms", "ITL p50/p99 ms",
                   "deadline miss [95% CI]", "model miss [95% CI]", "fallback", "agreement",
                   "floor eff.", "TPOT p50 ms (x ref)", "draft alpha (pred. x)", "cycles", "ITL n",
                   "plan made")


def markdown_cells(row: ComparisonRow) -> list[str]:
    """Return one row's Markdown cells, in :data:`MARKDOWN_HEADER` order."""
    target = fmt(row.floor_itl_target_ms)
    if row.floor_itl_target_ms is not None and row.target_device:
        target = f"{target} ({row.target_device})"
    label = row.label + (" (asap)" if row.replay_mode == "asap" else "")
    if row.reference == row.label:
        agreement = "ref"
    elif row.agreement is None:
        agreement = "-"
    else:
        agreement = f"{100 * row.agreement:.0f}% (n={row.agreement_n})"
    return [
        label.replace("|", "\\|"),
        row.model_size or "-",
        fmt(row.effective_bpw),
        fmt(row.floor_itl_host_ms),
        target,
        f"{fmt(row.pred_itl_target_ms)} ({row.pred_engine_family})"
        if row.pred_itl_target_ms is not None else "-",
        f"{fmt(row.ttft_p50_ms, '.1f')} / {fmt(row.ttft_p99_ms, '.1f')}",
        f"{fmt(row.itl_p50_ms)} / {fmt(row.itl_p99_ms)}",
        rate_ci(row.deadline_miss_rate, row.deadline_miss_ci95_lo, row.deadline_miss_ci95_hi),
        rate_ci(row.model_miss_rate, row.model_miss_ci95_lo, row.model_miss_ci95_hi),
        rate_ci(row.fallback_rate, None, None),
        agreement,
        fmt(row.floor_efficiency),
        f"{fmt(row.tpot_p50_ms)} ({fmt(row.tpot_speedup)}x)" if row.tpot_speedup is not None
        else fmt(row.tpot_p50_ms),
        f"{fmt(row.spec_alpha)} ({fmt(row.spec_predicted_speedup)}x)"
        if row.spec_alpha is not None else "-",
        str(row.cycles),
        str(row.itl_n),
        (row.plan_made or "-") + (f" (server {row.server_plans})"
                                  if row.server_plans is not None else ""),
    ]


def to_markdown(rows: Sequence[ComparisonRow]) -> str:
    """Return the comparison as a Markdown table (no trailing newline); ``-`` marks unknowns."""
    return markdown_table(MARKDOWN_HEADER, [markdown_cells(r) for r in rows], aligned=False)


def to_csv(rows: Sequence[ComparisonRow], path: str | os.PathLike[str]) -> Path:
    """Write the rows as CSV with the :data:`COLUMNS` header; None is an empty cell."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.to_dict().items()})
    return p


def to_json(rows: Sequence[ComparisonRow], path: str | os.PathLike[str]) -> Path:
    """Write ``{"schema_version", "columns", "rows": [{column: value}]}`` as JSON."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema_version": COMPARISON_SCHEMA_VERSION, "columns": list(COLUMNS),
           "rows": [r.to_dict() for r in rows]}
    p.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return p
