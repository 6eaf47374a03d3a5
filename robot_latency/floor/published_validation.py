"""Validation of the published table: every row predicted from fits without it.

``validate_table`` predicts every row from a fit without it (leave-one-out) and states each
row's 80% interval from the leave-one-out residuals of the *other* rows of its family
(:func:`~robot_latency.floor.published_fit.family_interval`). Rows whose model the source
measured elsewhere and rows whose model it did not get separate intervals: a model the table
has never seen is predicted, and its interval built, from fits without any row of that model
(leave-one-model-out). Rows the floor cannot predict are listed with the reason.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.modelinfo import PRESETS
from robot_latency.floor.published_fit import (
    _loo_calibration,
    _loo_predictions,
    _new_model_predictions,
    family_interval,
    setup_fits,
)
from robot_latency.floor.published_table import (
    PublishedRow,
    load_table,
    not_predicted_reason,
    row_point,
)

__all__ = [
    "OUTLIER_REL",
    "ValidationResult",
    "recent_llamacpp_summary",
    "validate_table",
]

#: A leave-one-out error past this is reported with the row's notes (which must explain it).
OUTLIER_REL = 0.35


@dataclass(frozen=True)
class ValidationResult:
    """One row predicted from a fit without it."""

    id: str
    engine_family: str
    device: str
    model: str
    quant: str
    published_tok_s: float
    floor_ms: float | None
    measured_ms: float
    predicted_ms: float | None
    error_rel: float | None
    scope: str | None
    reason: str | None
    setup: str | None = None
    power_mode: str | None = None
    clocks_locked: bool | None = None
    build: str | None = None
    date: str | None = None
    source: str | None = None
    url: str | None = None
    interval_ms: tuple[float, float] | None = None
    inside_interval: bool | None = None
    fit_notes: str | None = None
    notes: str | None = None
    model_factor: float | None = None
    model_basis: tuple[str, ...] = ()
    new_model_predicted_ms: float | None = None
    new_model_error_rel: float | None = None
    new_model_interval_ms: tuple[float, float] | None = None
    new_model_inside_interval: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def validate_table(rows: Sequence[PublishedRow] | None = None) -> dict[str, Any]:
    """Predict every row from a calibration fitted without it; return rows and error summary.

    ``error_rel`` is ``predicted / measured - 1`` (on the step time). Each predicted row also
    gets the 80% interval a prediction would state without it (``family_interval``) and whether
    its published figure falls inside. The ``new_model_*`` fields and summaries repeat this with
    every row of the row's model left out (leave-one-model-out): the error a model the table
    has never measured gets. Rows the floor cannot predict, and rows whose family has
    no fit left without them, are listed with a reason and left out of the summary.
    """
    table = tuple(rows if rows is not None else load_table())
    preds = _loo_predictions(table)
    new_preds = _new_model_predictions(table)
    results: list[ValidationResult] = []
    for row in table:
        why = not_predicted_reason(row)
        point = None if why is not None else row_point(row)
        floor_ms = point.floor_ms if point is not None else None
        meta = dict(setup=row.setup, power_mode=row.power_mode, clocks_locked=row.clocks_locked,
                    build=row.build or row.engine_version, date=row.date, source=row.source,
                    url=row.url)
        if why is None and row.id not in preds:
            try:
                _loo_calibration(row, table)
            except CalibrationError as err:
                why = str(err)
        if why is not None:
            results.append(ValidationResult(
                row.id, row.engine_family, row.device, row.model, row.quant, row.tok_s,
                floor_ms, row.itl_ms, None, None, None, why, **meta))
            continue
        assert point is not None
        pred, scope, note, adj = preds[row.id]
        lo, hi = _interval_ms(row, table, pred, point.floor_ms, model_seen=adj.seen)
        err = pred / point.measured_ms - 1.0
        new = new_preds.get(row.id)
        new_lo_hi = (None if new is None else
                     _interval_ms(row, table, new, point.floor_ms, model_seen=False))
        results.append(ValidationResult(
            row.id, row.engine_family, row.device, row.model, row.quant, row.tok_s,
            point.floor_ms, point.measured_ms, pred, err, scope, None, **meta,
            interval_ms=(lo, hi), inside_interval=lo <= point.measured_ms <= hi,
            fit_notes=note or None,
            notes=row.notes if abs(err) > OUTLIER_REL else None,
            model_factor=adj.factor, model_basis=adj.basis,
            new_model_predicted_ms=new,
            new_model_error_rel=None if new is None else new / point.measured_ms - 1.0,
            new_model_interval_ms=new_lo_hi,
            new_model_inside_interval=(None if new_lo_hi is None else
                                       new_lo_hi[0] <= point.measured_ms <= new_lo_hi[1])))
    errors = [abs(r.error_rel) for r in results if r.error_rel is not None]
    by_family: dict[str, dict[str, Any]] = {}
    for family in sorted({r.engine_family for r in results}):
        done = [r for r in results if r.engine_family == family and r.error_rel is not None]
        errs = [abs(r.error_rel) for r in done]
        inside = sum(1 for r in done if r.inside_interval)
        by_family[family] = {
            "predicted": len(errs),
            "not_predicted": sum(1 for r in results
                                 if r.engine_family == family and r.error_rel is None),
            "median_abs_error": statistics.median(errs) if errs else None,
            "max_abs_error": max(errs) if errs else None,
            "inside_80": inside,
            "coverage_80": inside / len(done) if done else None,
            "interval_rel": list(family_interval(family, rows=table)),
            "scopes": {s: sum(1 for r in done if r.scope == s)
                       for s in sorted({r.scope for r in done if r.scope})},
            "model_adjusted": sum(1 for r in done if r.model_basis),
            "interval_rel_model_seen": list(family_interval(family, rows=table,
                                                            model_seen=True)),
            **_new_model_summary(done),
        }
    return {
        "rows": [r.to_dict() for r in results],
        "by_family": by_family,
        "predicted": len(errors),
        "not_predicted": len(results) - len(errors),
        "sources": len({r.source for r in table}),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
        "past_35_percent": [r.id for r in results
                            if r.error_rel is not None and abs(r.error_rel) > OUTLIER_REL],
        "recent_llamacpp": recent_llamacpp_summary(table),
        **_new_model_summary([r for r in results if r.error_rel is not None]),
        "new_model_past_35_percent": [
            r.id for r in results
            if r.new_model_error_rel is not None and abs(r.new_model_error_rel) > OUTLIER_REL],
        "setups": [{k: v for k, v in f.items() if k != "residuals"} for f in setup_fits(table)],
    }


def _interval_ms(row: PublishedRow, table: tuple[PublishedRow, ...], pred_ms: float,
                 floor_ms: float, *, model_seen: bool) -> tuple[float, float]:
    """The 80% interval a prediction of ``row`` states without it (never below the floor)."""
    lo_rel, hi_rel = family_interval(row.engine_family, rows=table, exclude=row.id,
                                     model_seen=model_seen)
    return max(floor_ms, pred_ms * (1.0 + lo_rel)), pred_ms * (1.0 + hi_rel)


def _new_model_summary(done: Sequence[ValidationResult]) -> dict[str, Any]:
    """Error and coverage of the predictions made as if each row's model were new."""
    new = [r for r in done if r.new_model_error_rel is not None]
    errs = [abs(r.new_model_error_rel) for r in new if r.new_model_error_rel is not None]
    inside = sum(1 for r in new if r.new_model_inside_interval)
    return {
        "new_model_predicted": len(errs),
        "new_model_median_abs_error": statistics.median(errs) if errs else None,
        "new_model_max_abs_error": max(errs) if errs else None,
        "new_model_inside_80": inside,
        "new_model_coverage_80": inside / len(new) if new else None,
    }


def recent_llamacpp_summary(rows: Sequence[PublishedRow], *, since: str = "2025",
                            small_params: int = 1_500_000_000) -> dict[str, Any]:
    """Count the llama.cpp-CUDA rows measured with builds from ``since`` on (by the row's date):
    rows, sources, devices and rows on models of ``small_params`` or fewer, predicted or not."""
    recent = [r for r in rows if r.engine_family == "llamacpp-cuda" and (r.date or "") >= since]
    predictable = [r for r in recent if not_predicted_reason(r) is None]
    small = [r for r in predictable if PRESETS[r.model].param_count() <= small_params]
    return {
        "rows": len(recent),
        "predicted": len(predictable),
        "sources": sorted({r.source for r in recent}),
        "devices": sorted({r.device for r in recent}),
        "modules": len({DEVICES[r.device].family for r in recent}),
        "small_model_rows": len(small),
    }
