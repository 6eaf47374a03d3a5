"""Calibrations fitted from the published table, their intervals and the nearest rows.

Where the data supports it, the per-step overhead differs by device and by engine build: rows
that share a *setup* (one source's engine build on one device in one power mode) are fitted
together (scope ``setup``); a device without such a setup borrows the rows of the family on that
device (scope ``device``), a device without rows the family's rows on the same module's other
power modes (scope ``module``: AGX Orin, Orin NX, Orin Nano, each row against its own mode's
floor), and a module without rows the family's rows on every device (scope ``family``). A model
the same source measured in other setups too moves its prediction by the share its step time sat
above or below those setups' fits (``model_adjustment``).
``family_interval`` states a prediction's 80% interval from the leave-one-out residuals of the
family's rows. The rows come from :mod:`robot_latency.floor.published_table`.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from robot_latency.floor.calibration import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_SPREAD_REL,
    Calibration,
    calibrate_points,
    check_engine_family,
)
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.fit import distinct_sizes
from robot_latency.floor.modelinfo import PRESETS
from robot_latency.floor.published_modes import (
    compute_ratio,
    mode_point,
    module_devices,
    module_note,
    module_rows,
    predict_row,
)
from robot_latency.floor.published_prefill import PrefillRow, prefill_fit, prefill_interval
from robot_latency.floor.published_sources import flagged_sources
from robot_latency.floor.published_table import (
    PublishedRow,
    load_table,
    not_predicted_reason,
    row_point,
)

__all__ = [
    "INTERVAL_COVERAGE",
    "ModelAdjustment",
    "family_interval",
    "fitted_calibration",
    "model_adjustment",
    "setup_fits",
]

logger = logging.getLogger(__name__)

#: The share of rows the stated interval is meant to hold (an 80% interval).
INTERVAL_COVERAGE = 0.8


@lru_cache(maxsize=8)
def _log_table_summary(table: tuple[PublishedRow, ...]) -> None:
    """Log one INFO line per table: its rows and the setup fits behind every calibration (the
    fits themselves log at DEBUG only: the intervals refit the table hundreds of times)."""
    fits = setup_fits(table)
    held = sum(1 for f in fits if f["overhead_held_at_zero"])
    logger.info("published table: %d rows from %d sources, %d setup fits (%d with a negative "
                "fitted overhead held at 0)", len(table), len({r.source for r in table}),
                len(fits), held)


def _sizes(rows: Sequence[PublishedRow]) -> int:
    return distinct_sizes([row_point(r).floor_ms for r in rows]) if rows else 0


def _setup_rank(rows: Sequence[PublishedRow]) -> tuple[bool, bool, str, int]:
    """Best-documented first: clocks locked, power mode stated, newest date, most rows."""
    r = rows[0]
    return (r.clocks_locked is True, r.power_mode is not None, r.date or "", len(rows))


def _pick_setup(groups: dict[str, list[PublishedRow]], setup: str | None) -> str | None:
    """The named setup, else the best-documented of ``groups`` (None where there is none)."""
    if setup is None and groups:
        setup = max(groups.values(), key=_setup_rank)[0].setup
    return setup


def _by_setup(rows: Sequence[PublishedRow]) -> dict[str, list[PublishedRow]]:
    groups: dict[str, list[PublishedRow]] = {}
    for r in rows:
        groups.setdefault(r.setup, []).append(r)
    return groups


def _setup_overheads(rows: Sequence[PublishedRow], family: str) -> list[float]:
    """Fitted overheads of the family's setups that cover two model sizes."""
    out = []
    for group in _by_setup(rows).values():
        if len(group) >= 2 and _sizes(group) >= 2:
            cal = calibrate_points([row_point(r) for r in group], engine_family=family,
                                   device_id=group[0].device, scope="setup", source="")
            out.append(cal.overhead_ms)
    return out


def fitted_calibration(engine_family: str, device_id: str, *,
                        rows: Sequence[PublishedRow] | None = None,
                        exclude: str | None = None, setup: str | None = None,
                        prefill_rows: Sequence[PrefillRow] | None = None) -> Calibration:
    """Fit the calibration of ``engine_family`` on ``device_id`` from the table's rows.

    The ladder, most specific first: the rows of ``setup`` (or, when none is named, of the
    best-documented setup on the device: clocks locked, power mode stated, newest build) when
    they cover two model sizes (scope ``setup``); one size of that setup with the overhead held
    at the median of the family's other setups (scope ``setup``, noted); every row of the family
    on the device (``device``); where the device has none, the family's rows on the same
    module's other power modes (``module``; one size there with the overhead held as for a
    setup); every row of the family (``family``). Rows the floor cannot
    predict (``not_predicted_reason``) are never used. The interval is the family's
    (``family_interval``). With no ``setup`` named, a flagged source cannot alone set the
    answer (``published_sources``: its rows are set aside while other sources' remain; named in
    ``set_aside`` and the notes). The answer as stated, its interval widened where it rests on
    one source, is ``published_support.table_calibration``'s. The prefill terms come
    from the prefill table (``prefill_rows``, the shipped one by default; ``prefill_fit``), the
    same sources set aside; a family without prefill rows is ``prefill uncalibrated``.

    Raises:
        CalibrationError: the family has too few rows in the table to fit (naming the family and
            the families that do have rows).
    """
    family = check_engine_family(engine_family)
    table = list(rows if rows is not None else load_table())
    _log_table_summary(tuple(table))
    cal = _ladder(family, device_id, table, exclude=exclude, setup=setup)
    cal = replace(cal, interval_rel=family_interval(family, rows=table, exclude=exclude))
    return _with_prefill(cal, table, prefill_rows)


def _answer_pool(family: str, table: Sequence[PublishedRow],
                 mine: list[PublishedRow]) -> tuple[list[PublishedRow], set[str]]:
    """The rows a device's answer may rest on: a flagged source cannot alone set it, so its rows
    are set aside while any other source's rows of the family remain (``published_sources``)."""
    flagged = set(flagged_sources(table, family))
    kept = [r for r in mine if r.source not in flagged]
    return (mine, set()) if not kept else (kept, flagged & {r.source for r in mine})


def _ladder(family: str, device_id: str, rows: Sequence[PublishedRow], *, exclude: str | None,
            setup: str | None) -> Calibration:
    """The fit of ``table_calibration``, without its interval.

    With no ``setup`` named (a device's answer), flagged sources are set aside first
    (``_answer_pool``; ``set_aside`` names those that had rows on the device, or any row where
    the answer falls back to the family's rows); a named setup is fitted on its own rows.
    """
    table = [r for r in rows if r.id != exclude]
    mine = [r for r in table if r.engine_family == family and not_predicted_reason(r) is None]
    flagged: set[str] = set()
    if setup is None:
        mine, flagged = _answer_pool(family, table, mine)
    here = {r.source for r in table if r.device == device_id and r.engine_family == family}
    checks = flagged_sources(table, family)
    aside = [s for s in sorted(flagged) if s in here]
    cal = _ladder_fit(family, device_id, table, mine, setup,
                      tuple(f"set aside {s}: {checks[s].reason}" for s in aside))
    if cal.scope in ("module", "family") and flagged:
        pool = flagged if cal.scope == "family" else flagged & {
            r.source for r in table if r.device in module_devices(device_id)}
        aside = sorted(pool | set(aside))
        cal = replace(cal, notes=(*cal.notes, *(f"set aside {s}: {checks[s].reason}"
                                                for s in aside if s not in here)))
    used = {r.id: r.source for r in mine}
    return replace(cal, sources=tuple(sorted({used[b] for b in cal.basis if b in used})),
                   set_aside=tuple(aside))


def _ladder_fit(family: str, device_id: str, table: Sequence[PublishedRow],
                mine: list[PublishedRow], setup: str | None, aside: tuple[str, ...]
                ) -> Calibration:
    here = [r for r in mine if r.device == device_id]
    source = "published table"
    groups = _by_setup(here)
    setup = _pick_setup(groups, setup)
    same = groups.get(setup or "", [])
    if len(same) >= 2 and _sizes(same) >= 2:
        return calibrate_points([row_point(r) for r in same], engine_family=family,
                                device_id=device_id, scope="setup", source=source,
                                notes=(f"setup: {setup}", *aside))
    others = [r for r in mine if r.setup != setup]
    overheads = _setup_overheads(others, family)
    if same and overheads:
        return calibrate_points([row_point(r) for r in same], engine_family=family,
                                device_id=device_id, scope="setup", source=source,
                                fixed_overhead_ms=statistics.median(overheads), quiet=True,
                                notes=(f"setup: {setup}", "overhead held at the median of the "
                                       f"family's {len(overheads)} other setups", *aside))
    if len(here) >= 2 and _sizes(here) >= 2:
        return calibrate_points([row_point(r) for r in here], engine_family=family,
                                device_id=device_id, scope="device", source=source, notes=aside)
    return _across_modes(family, device_id, table, mine, here, overheads, aside)


def _across_modes(family: str, device_id: str, table: Sequence[PublishedRow],
                  mine: list[PublishedRow], here: list[PublishedRow], overheads: list[float],
                  aside: tuple[str, ...]) -> Calibration:
    """The ladder's scopes ``module`` and ``family``: rows of other modes or modules, each
    against its own mode's floor with the compute ratio applied (``_mode_point``), and the
    calibration carrying the ratio for the target's mode."""
    source, ratio = "published table", compute_ratio(family, DEVICES[device_id].family)
    module = module_rows(mine, device_id) if not here else []
    if len(module) >= 2 and _sizes(module) >= 2:
        cal = calibrate_points([mode_point(r) for r in module], engine_family=family,
                               device_id=device_id, scope="module", source=source,
                               notes=(module_note(module, device_id), *aside))
    elif module and overheads:
        cal = calibrate_points([mode_point(r) for r in module], engine_family=family,
                               device_id=device_id, scope="module", source=source,
                               fixed_overhead_ms=statistics.median(overheads), quiet=True,
                               notes=(module_note(module, device_id), "overhead held at the "
                                      f"median of the family's {len(overheads)} other setups",
                                      *aside))
    elif len(mine) >= 2 and _sizes(mine) >= 2:
        devices = sorted({r.device for r in mine})
        cal = calibrate_points(
            [mode_point(r) for r in mine], engine_family=family, device_id=device_id,
            scope="family", source=source,
            notes=(f"no two model sizes of {family} on {device_id} in the table: fitted on "
                   f"{', '.join(devices)} (overhead assumed to carry over)", *aside))
    else:
        have = sorted({r.engine_family for r in table})
        raise CalibrationError(
            f"the published table has too few {family} rows to fit a calibration (families "
            f"with rows: {', '.join(have)}); calibrate from runs (robot-latency calibrate) "
            "and pass --calibration")
    if not ratio:
        return cal
    return replace(cal, compute_ratio=ratio, notes=(
        *cal.notes, f"decode compute ratio {ratio:.3g}: each floor is the slower of the bytes "
        "at the bandwidth and the ratio x the FLOPs at its mode's peak"))


def _with_prefill(cal: Calibration, table: Sequence[PublishedRow] | None,
                  prefill_rows: Sequence[PrefillRow] | None) -> Calibration:
    """Attach the prefill terms of the same family and device (the same sources set aside), or
    mark the calibration ``prefill uncalibrated`` where the family has no prefill row."""
    flagged = tuple(flagged_sources(load_table() if table is None else table, cal.engine_family))
    fit = prefill_fit(cal.engine_family, cal.device_id, rows=prefill_rows, set_aside=flagged)
    if fit is None:
        return replace(cal, compute_efficiency=DEFAULT_COMPUTE_EFFICIENCY,
                       prefill_overhead_ms=0.0, prefill_calibrated=False)
    return replace(cal, compute_efficiency=fit.compute_efficiency,
                   prefill_overhead_ms=fit.overhead_ms, prefill_calibrated=True,
                   prefill_scope=fit.scope, prefill_basis=fit.basis, prefill_notes=fit.notes,
                   prefill_interval_rel=prefill_interval(cal.engine_family, rows=prefill_rows))


def setup_fits(rows: Sequence[PublishedRow] | None = None) -> list[dict[str, Any]]:
    """Return the two-term fit of every setup that covers two model sizes, with its conditions.

    One entry per setup: family, device, power mode, GPU clock and date as the rows state them,
    the fitted efficiency and per-step overhead, and each row's layer count and fit residual
    (``measured / fitted - 1``), for asking what the overhead follows.
    """
    out = []
    table = [r for r in (rows if rows is not None else load_table())
             if not_predicted_reason(r) is None]
    for setup, group in sorted(_by_setup(table).items()):
        if len(group) < 2 or _sizes(group) < 2:
            continue
        r0 = group[0]
        cal = calibrate_points([row_point(r) for r in group], engine_family=r0.engine_family,
                               device_id=r0.device, scope="setup", source="published table")
        out.append({
            "setup": setup, "engine_family": r0.engine_family, "device": r0.device,
            "power_mode": r0.power_mode, "gpu_mhz": r0.gpu_mhz, "date": r0.date,
            "build": r0.build or r0.engine_version, "clocks_locked": r0.clocks_locked,
            "rows": len(group), "efficiency": cal.efficiency, "overhead_ms": cal.overhead_ms,
            "overhead_held_at_zero": cal.overhead_fixed,
            "residuals": {r.id: {"n_layers": PRESETS[r.model].n_layers, "residual_rel": res}
                          for r, res in zip(group, cal.residuals_rel, strict=True)},
        })
    return out


@dataclass(frozen=True)
class ModelAdjustment:
    """How a model's own rows in the source's other setups move its prediction in this one.

    A source that measured the same model (same build, same harness) in several setups (power
    modes of one module) shows how far that model sits from each setup's fit: its step time is
    ``measured / fitted`` of the line through the setup's *other* models, and that share (the
    model's kernel mix: layer count, attention heads, KV cache, output head; none of which the
    bytes-per-step floor sees) carries to the next setup. ``factor`` is the geometric mean of
    those shares over ``basis`` (1 where there are none).
    """

    model: str
    factor: float
    basis: tuple[str, ...]
    source: str | None

    @property
    def seen(self) -> bool:
        """True where rows of this model in other setups of the source moved the prediction."""
        return bool(self.basis)

    def note(self) -> str | None:
        """A line naming the rows behind the factor, or None where there are none."""
        if not self.basis:
            return None
        return (f"model: x{self.factor:.3f}, the geometric mean of measured / fitted of "
                f"{self.model} in {len(self.basis)} other setups of this source "
                f"({', '.join(self.basis)})")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"model": self.model, "factor": self.factor, "basis": list(self.basis),
                "source": self.source, "seen": self.seen}


def model_adjustment(engine_family: str, device_id: str, model_id: str, *,
                     rows: Sequence[PublishedRow] | None = None, setup: str | None = None,
                     exclude: str | None = None) -> ModelAdjustment:
    """Return the factor by which ``model_id``'s rows in other setups move its prediction.

    The setup is ``setup`` or the one ``table_calibration`` picks on ``device_id``; its source's
    rows of the same shape preset in *other* setups are each predicted from their own setup's
    fit without them (and without ``exclude``), and ``factor`` is the geometric mean of
    ``measured / predicted`` over them. A model with no such row (a file, a config.json, a
    preset the source did not measure, a device without a setup) gets 1.
    """
    family = check_engine_family(engine_family)
    key = model_id.strip().lower()
    table = [r for r in (rows if rows is not None else load_table()) if r.id != exclude]
    mine = [r for r in table if r.engine_family == family and not_predicted_reason(r) is None]
    # the setup table_calibration picks: flagged sources set aside as for the device's answer
    pool = _answer_pool(family, table, mine)[0] if setup is None else mine
    setup = _pick_setup(_by_setup([r for r in pool if r.device == device_id]), setup)
    source = next((r.source for r in mine if r.setup == setup), None)
    logs: list[float] = []
    basis: list[str] = []
    for q in mine:
        if q.model != key or q.source != source or q.setup == setup:
            continue
        try:
            cal = _ladder(family, q.device, table, exclude=q.id, setup=q.setup)
        except CalibrationError:
            continue
        logs.append(math.log(q.itl_ms / predict_row(q, cal)))
        basis.append(q.id)
    factor = math.exp(statistics.fmean(logs)) if logs else 1.0
    return ModelAdjustment(key, factor, tuple(basis), source)


@lru_cache(maxsize=256)
def _loo_predictions(
        table: tuple[PublishedRow, ...]) -> dict[str, tuple[float, str, str, ModelAdjustment]]:
    """Each predictable row's step time predicted without it: id -> (ms, scope, note, model).

    The row's setup fit without it, moved by its model's rows in the source's other setups
    (``model_adjustment``, also without it). Rows whose family has no fit left without them are
    absent (``validate_table`` gives the reason).
    """
    out: dict[str, tuple[float, str, str, ModelAdjustment]] = {}
    for row in table:
        if not_predicted_reason(row) is not None:
            continue
        try:
            cal = _loo_calibration(row, table)
        except CalibrationError:
            continue
        adj = model_adjustment(row.engine_family, row.device, row.model, rows=table,
                               setup=row.setup, exclude=row.id)
        pred = predict_row(row, cal) * adj.factor
        notes = (*cal.notes, adj.note()) if adj.seen else cal.notes
        out[row.id] = (pred, cal.scope, "; ".join(n for n in notes if n), adj)
    return out


@lru_cache(maxsize=256)
def _new_model_predictions(table: tuple[PublishedRow, ...]) -> dict[str, float]:
    """Each predictable row's step time predicted as if its model were new: id -> ms.

    Every row of the row's shape preset is left out of the fit (leave-one-model-out), so no
    measurement of that model moves the prediction: what a model the table has never seen gets.
    """
    out: dict[str, float] = {}
    for row in table:
        if not_predicted_reason(row) is not None:
            continue
        rest = [r for r in table if r.model != row.model]
        try:
            cal = _ladder(row.engine_family, row.device, rest, exclude=None, setup=row.setup)
        except CalibrationError:
            continue
        out[row.id] = predict_row(row, cal)
    return out


def _loo_calibration(row: PublishedRow, table: Sequence[PublishedRow]) -> Calibration:
    # without the interval, which is built from these very predictions
    return _ladder(row.engine_family, row.device, table, exclude=row.id, setup=row.setup)


def family_interval(engine_family: str, *, rows: Sequence[PublishedRow] | None = None,
                    exclude: str | None = None,
                    model_seen: bool = False) -> tuple[float, float]:
    """Return the family's 80% interval as (lo, hi) relative bounds on a prediction.

    The bounds are order statistics of ``measured / predicted - 1`` over the family's rows,
    ``exclude`` left out of the residuals and of every fit behind them: the
    ``ceil(0.9 (n + 1))``-th largest and ``floor(0.1 (n + 1))``-th smallest (a split-conformal
    interval; the extreme residual where n is too small). For a
    model the table has not measured (``model_seen`` False, the default) each row of the family
    is predicted without any row of its model (leave-one-model-out); for a model moved by its
    own rows in other setups (``model_adjustment``), the residuals are those of every row
    predicted the same way, each without itself (leave-one-out), pooled over the engine
    families where there are three or more: what they measure is how a model's departure from
    its setup's fit carries from one power mode of a module to another under one harness, not
    the engine's own fit, and one family's few sources (MLC: one source, two modes) give too
    few of them for an 80% order statistic. Fewer than three residuals give the default
    spread.
    """
    family = check_engine_family(engine_family)
    # without ``exclude`` everywhere: the other rows' residuals are predicted from a table
    # that never held it (nested leave-one-out), so it moves nothing its own interval uses
    table = tuple(r for r in (rows if rows is not None else load_table()) if r.id != exclude)
    mine = [row for row in table if row.engine_family == family]
    preds = _loo_predictions(table)
    res = sorted(row.itl_ms / preds[row.id][0] - 1.0 for row in table
                 if row.id in preds and preds[row.id][3].seen)
    if not model_seen or len(res) < 3:
        new = _new_model_predictions(table)
        res = sorted(row.itl_ms / new[row.id] - 1.0 for row in mine if row.id in new)
    if len(res) < 3:
        return (-DEFAULT_SPREAD_REL, DEFAULT_SPREAD_REL)
    n, tail = len(res), (1.0 - INTERVAL_COVERAGE) / 2
    k_lo = max(1, math.floor(tail * (n + 1)))
    k_hi = min(n, math.ceil((1.0 - tail) * (n + 1)))
    return (min(0.0, res[k_lo - 1]), max(0.0, res[k_hi - 1]))
