"""How far the published tables' predictions can be trusted beyond the rows they were fitted on.

* ``validate_prefill``: every prefill row predicted from a fit without it (leave-one-out), with
  the 80% interval a prediction would state without it (its residuals from a table that never
  held the row), and again with every row of its model left out (leave-one-model-out) and with
  every row of its source left out (leave-one-source-out).
* ``leave_one_source_out``: every decode row predicted as its device's answer from a table
  without any row of its source: what a user whose build is a new setup gets, where
  leave-one-out mostly measures interpolation across power modes of one source.
* ``device_stability``: each device's answer for a few reference models with all sources and
  with each one dropped; the largest ratio says how much one source moves it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from robot_latency.floor.calibration import check_engine_family
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.modelinfo import facts_from_preset
from robot_latency.floor.predict import predict_floor
from robot_latency.floor.published_fit import _ladder
from robot_latency.floor.published_modes import predict_row
from robot_latency.floor.published_prefill import (
    PrefillRow,
    load_prefill_table,
    median_abs,
    prefill_fit,
    prefill_interval,
    prefill_not_predicted_reason,
    prefill_point,
    prefill_row_floor,
)
from robot_latency.floor.published_sources import flagged_sources, source_checks
from robot_latency.floor.published_table import (
    PublishedRow,
    load_table,
    not_predicted_reason,
)

__all__ = [
    "REFERENCE_MODELS",
    "device_stability",
    "leave_one_source_out",
    "validate_prefill",
]

#: The models a device's answer is checked on (preset, quant): the sizes a robot planner runs.
REFERENCE_MODELS: tuple[tuple[str, str], ...] = (
    ("qwen2.5-0.5b", "Q4_K_M"), ("llama-3.2-1b", "Q4_K_M"), ("llama-3.2-3b", "Q4_K_M"))


def _prefill_pred(row: PrefillRow, table: Sequence[PrefillRow], *, setup: str | None,
                  set_aside: Sequence[str] = ()) -> tuple[float, str] | None:
    fit = prefill_fit(row.engine_family, row.device, rows=table, setup=setup,
                      set_aside=set_aside)
    if fit is None:
        return None
    point = prefill_point(row)
    return max(fit.predict_ms(point.compute_floor_ms), prefill_row_floor(row).floor_ms), fit.scope


def validate_prefill(rows: Sequence[PrefillRow] | None = None) -> dict[str, Any]:
    """Predict every prefill row from fits without it; return rows and summaries per family.

    ``error_rel`` is ``predicted / measured - 1``. ``interval_ms`` is the 80% interval stated
    without the row (``prefill_interval`` with it excluded, every residual from a table that
    never held it). ``new_model_error_rel`` drops every row of the row's model and
    ``new_source_error_rel`` every row of its source (the device's answer then, flagged sources
    set aside as for any answer).
    """
    table = tuple(rows if rows is not None else load_prefill_table())
    flagged = tuple(flagged_sources(load_table(), "llamacpp-cuda"))
    out = []
    for row in table:
        base: dict[str, Any] = {
            "id": row.id, "engine_family": row.engine_family, "device": row.device,
            "model": row.model, "quant": row.quant, "prompt_tokens": row.prompt_tokens,
            "source": row.source, "power_mode": row.power_mode, "url": row.url,
            "measured_ms": row.measured_ms, "floor_ms": prefill_row_floor(row).floor_ms}
        why = prefill_not_predicted_reason(row)
        rest = tuple(r for r in table if r.id != row.id)
        pred = None if why else _prefill_pred(row, rest, setup=row.setup)
        if pred is None:
            out.append({**base, "predicted_ms": None, "error_rel": None,
                        "reason": why or "no other prefill row of its family"})
            continue
        lo, hi = prefill_interval(row.engine_family, rows=table, exclude=row.id)
        p_ms, scope = pred
        interval = (max(base["floor_ms"], p_ms * (1 + lo)), p_ms * (1 + hi))
        new_model = _prefill_pred(row, [r for r in table if r.model != row.model], setup=None,
                                  set_aside=flagged)
        new_source = _prefill_pred(row, [r for r in table if r.source != row.source],
                                   setup=None, set_aside=flagged)
        out.append({**base, "predicted_ms": p_ms, "error_rel": p_ms / row.measured_ms - 1,
                    "scope": scope, "reason": None, "interval_ms": list(interval),
                    "inside_interval": interval[0] <= row.measured_ms <= interval[1],
                    "new_model_error_rel": (None if new_model is None
                                            else new_model[0] / row.measured_ms - 1),
                    "new_source_error_rel": (None if new_source is None
                                             else new_source[0] / row.measured_ms - 1)})
    families = {}
    for family in sorted({r["engine_family"] for r in out}):
        done = [r for r in out if r["engine_family"] == family and r["error_rel"] is not None]
        errs = [r["error_rel"] for r in done]
        inside = sum(1 for r in done if r["inside_interval"])
        families[family] = {
            "rows": sum(1 for r in out if r["engine_family"] == family),
            "predicted": len(done), "median_abs_error": median_abs(errs),
            "max_abs_error": max((abs(e) for e in errs), default=None),
            "inside_80": inside, "coverage_80": inside / len(done) if done else None,
            "interval_rel": list(prefill_interval(family, rows=table)),
            "new_model_median_abs_error": median_abs(
                [r["new_model_error_rel"] for r in done if r["new_model_error_rel"] is not None]),
            "new_source_median_abs_error": median_abs(
                [r["new_source_error_rel"] for r in done
                 if r["new_source_error_rel"] is not None]),
        }
    return {"rows": out, "by_family": families, "total_rows": len(table),
            "sources": sorted({r.source for r in table}),
            "devices": sorted({r.device for r in table})}


#: A held-out row's stated interval: (row, predicted ms, the table without its source) to the
#: fields ``leave_one_source_out`` adds to the row.
IntervalOf = Callable[[PublishedRow, float, list[PublishedRow]], dict[str, Any]]


def _predict_row(row: PublishedRow, table: Sequence[PublishedRow]) -> tuple[float, Any] | None:
    """The row's step time as its device's answer from ``table`` (no setup named)."""
    try:
        cal = _ladder(row.engine_family, row.device, table, exclude=None, setup=None)
    except CalibrationError:
        return None
    return predict_row(row, cal), cal


def leave_one_source_out(rows: Sequence[PublishedRow] | None = None, *,
                         interval_of: IntervalOf | None = None) -> dict[str, Any]:
    """Predict every decode row as its device's answer from a table without its source.

    Returns the rows (``error_rel = predicted / measured - 1``, the scope and sources the
    answer rested on), and per family and per source the median and max absolute error, beside
    each source's agreement check (``published_sources.source_checks``). With ``interval_of``
    (``published_support.leave_one_source_out_coverage`` gives the stated one), each row also
    gets the 80% interval that answer states and whether its measurement falls inside, with and
    without the one-source widening; the summaries get the share inside (``coverage_80``,
    ``coverage_80_unwidened``).
    """
    coverage = interval_of is not None
    table = tuple(rows if rows is not None else load_table())
    out = []
    for row in table:
        if not_predicted_reason(row) is not None:
            continue
        rest = [r for r in table if r.source != row.source]
        got = _predict_row(row, rest)
        if got is None:
            out.append({"id": row.id, "engine_family": row.engine_family, "source": row.source,
                        "device": row.device, "error_rel": None,
                        "reason": "no fit of its family without its source"})
            continue
        pred, cal = got
        out.append({"id": row.id, "engine_family": row.engine_family, "source": row.source,
                    "device": row.device, "measured_ms": row.itl_ms, "predicted_ms": pred,
                    "error_rel": pred / row.itl_ms - 1, "scope": cal.scope,
                    "rests_on": list(cal.sources), "set_aside": list(cal.set_aside),
                    "reason": None, **(interval_of(row, pred, rest) if interval_of else {})})

    def summary(done: list[dict[str, Any]]) -> dict[str, Any]:
        errs = [r["error_rel"] for r in done if r["error_rel"] is not None]
        got = {"rows": len(done), "predicted": len(errs), "median_abs_error": median_abs(errs),
               "max_abs_error": max((abs(e) for e in errs), default=None)}
        if coverage:
            for key, name in (("inside_interval", "80"), ("inside_unwidened", "80_unwidened")):
                inside = sum(1 for r in done if r.get(key))
                got[f"inside_{name}"] = inside
                got[f"coverage_{name}"] = inside / len(errs) if errs else None
            got["widened"] = sum(1 for r in done if r.get("source_widening_rel"))
        return got

    families = sorted({r["engine_family"] for r in out})
    done = [r for r in out if r["error_rel"] is not None]
    return {
        "rows": out, "coverage": coverage, "all": summary(done),
        "by_family": {f: summary([r for r in out if r["engine_family"] == f]) for f in families},
        "by_source": {s: summary([r for r in out if r["source"] == s])
                      for s in sorted({r["source"] for r in out})},
        "source_checks": {f: [c.to_dict() for c in source_checks(table, f)] for f in families},
    }


def device_stability(engine_family: str = "llamacpp-cuda", *,
                     rows: Sequence[PublishedRow] | None = None,
                     models: Sequence[tuple[str, str]] = REFERENCE_MODELS,
                     context_tokens: int = 512) -> dict[str, Any]:
    """Each device's answer with all sources and with each one dropped, for reference models.

    For every device with a predictable row of the family: the predicted step time of each
    reference model from the full table and from the table without each source in turn;
    ``max_ratio`` is the largest ``max / min`` over a model's answers (1: no source moves it).
    """
    family = check_engine_family(engine_family)
    table = tuple(rows if rows is not None else load_table())
    mine = [r for r in table if r.engine_family == family and not_predicted_reason(r) is None]
    sources = sorted({r.source for r in mine})
    devices = {}
    for device_id in sorted({r.device for r in mine}):
        device = DEVICES[device_id]
        per_model = {}
        for preset, quant in models:
            fp = predict_floor(facts_from_preset(preset, quant=quant), device,
                               context_tokens=context_tokens)
            answers: dict[str, Any] = {}
            for dropped in [None, *sources]:
                subset = [r for r in table if r.source != dropped]
                try:
                    cal = _ladder(family, device_id, subset, exclude=None, setup=None)
                except CalibrationError:
                    answers[dropped or "(none)"] = None
                    continue
                answers[dropped or "(none)"] = (cal.decode_floor_ms(
                    fp.itl_floor_ms, fp.itl_compute_floor_ms) / cal.efficiency
                    + cal.overhead_ms)
            values = [v for v in answers.values() if v is not None]
            per_model[f"{preset} {quant}"] = {
                "itl_ms": answers,
                "max_ratio": max(values) / min(values) if values else None}
        ratios = [m["max_ratio"] for m in per_model.values() if m["max_ratio"] is not None]
        devices[device_id] = {"models": per_model, "max_ratio": max(ratios, default=None)}
    worst = [d["max_ratio"] for d in devices.values() if d["max_ratio"] is not None]
    return {"engine_family": family, "context_tokens": context_tokens, "sources": sources,
            "devices": devices, "max_ratio": max(worst, default=None),
            "geomean_ratio": (math.exp(statistics.fmean(math.log(w) for w in worst))
                              if worst else None)}
