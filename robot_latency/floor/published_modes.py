"""Power modes in the published table: the decode compute ratio, and predicting an unseen mode.

A power mode that gates TPCs and caps the GPU clock can make a decode step slower than its bytes
at the bandwidth allow: the Orin Nano's 7W mode reads at the same EMC clock as its 15W mode, yet
llama.cpp decodes 2.5x slower there (the smolhub sweep). The step is then predicted as::

    max(bytes / bandwidth, ratio * 2 * params / peak FLOP/s) / efficiency + overhead

with ``ratio`` (how far below the mode's FP16 peak a batch-1 step's arithmetic runs, relative to
how far below the bandwidth its reads run) fitted per engine family and module family (AGX
Orin, Orin NX, Orin Nano: one GPU architecture, so one ratio carries across a module's modes).
It is fitted on the sources that measured the same models in three or more power modes: each mode's
rows predicted from the source's other modes (leave-one-mode-out), the ratio on a grid that
includes 0 (bandwidth only) chosen for the smallest squared log error. A module family without
such a source borrows the engine family's ratio from another module family (the same
architecture); an engine family without any gets 0.

The ratio moves predictions that cross modes: a calibration fitted on rows of the module's
other modes or of other modules (scopes ``module`` and ``family``, robot_latency.floor.
published_fit) scales each row's and the target's floor so. A setup's own rows (one mode, one
build) calibrate it whatever bounds that mode, so within a setup the bytes floor stays.

``validate_modes`` repeats the leave-one-mode-out with the ratio fitted *without* the held-out
mode, beside the bandwidth-only answer: how well a mode nobody measured is predicted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from robot_latency.floor.calibration import Calibration, DecodePoint
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.fit import distinct_sizes, fit_two_term
from robot_latency.floor.published_table import (
    PublishedRow,
    load_table,
    not_predicted_reason,
    row_point,
)

__all__ = [
    "MIN_MODES",
    "RATIO_GRID",
    "RatioFit",
    "compute_ratio",
    "fit_compute_ratio",
    "mode_point",
    "module_devices",
    "module_note",
    "module_rows",
    "predict_row",
    "validate_modes",
]

#: Modes a source must have measured for its rows to fit a ratio: with two, the ratio would be
#: fitted on exactly the pair it is judged on; with three, each mode is predicted by a ratio
#: that the other two alone can fit (``validate_modes``).
MIN_MODES = 3

#: Ratios tried: 0 (bandwidth only), then 1 to 1024 in steps of 2^(1/4).
RATIO_GRID: tuple[float, ...] = (0.0, *(2.0 ** (k / 4) for k in range(41)))


@dataclass(frozen=True)
class RatioFit:
    """The fitted ratio of one engine family on one module family, and what it rests on."""

    engine_family: str
    device_family: str
    ratio: float
    setups: tuple[str, ...]  # the setups predicted from their source's other modes
    borrowed_from: str | None = None  # the module family whose fit it is, where not its own

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"engine_family": self.engine_family, "device_family": self.device_family,
                "ratio": self.ratio, "setups": list(self.setups),
                "borrowed_from": self.borrowed_from}


def _floor(row: PublishedRow, ratio: float) -> float:
    p = row_point(row)
    return max(p.floor_ms, ratio * p.compute_ms)


def _multi_mode(rows: Sequence[PublishedRow], family: str,
                device_family: str) -> dict[str, dict[str, list[PublishedRow]]]:
    """source -> setup -> rows, for the sources with rows in two or more setups of the family."""
    by_source: dict[str, dict[str, list[PublishedRow]]] = {}
    for r in rows:
        if (r.engine_family == family and not_predicted_reason(r) is None
                and DEVICES[r.device].family == device_family):
            by_source.setdefault(r.source, {}).setdefault(r.setup, []).append(r)
    return {s: g for s, g in by_source.items() if len(g) >= MIN_MODES}


def _cross_mode(groups: dict[str, list[PublishedRow]], held: str,
                ratio: float) -> list[tuple[PublishedRow, float]] | None:
    """The held-out setup's rows predicted from the source's other setups at ``ratio``."""
    train = [r for s, g in groups.items() if s != held for r in g]
    floors = [_floor(r, ratio) for r in train]
    if len(train) < 2 or distinct_sizes(floors) < 2:
        return None
    try:
        fit = fit_two_term(floors, [r.itl_ms for r in train])
    except CalibrationError:
        return None
    return [(r, fit.predict_ms(_floor(r, ratio))) for r in groups[held]]


def _sq_log_error(sources: dict[str, dict[str, list[PublishedRow]]], ratio: float,
                  skip: str | None = None) -> tuple[float, tuple[str, ...]]:
    """Squared log errors of each mode predicted from the source's other modes."""
    total, used = 0.0, []
    for groups in sources.values():
        kept = {s: g for s, g in groups.items() if s != skip}
        for held in kept:
            preds = _cross_mode(kept, held, ratio)
            if preds is None:
                continue
            used.append(held)
            total += sum(math.log(r.itl_ms / p) ** 2 for r, p in preds)
    return total, tuple(sorted(used))


def fit_compute_ratio(rows: Sequence[PublishedRow], engine_family: str, device_family: str, *,
                      skip_setup: str | None = None) -> RatioFit | None:
    """Fit the ratio on the family's multi-mode sources (``skip_setup`` left out everywhere).

    Returns None where no source has two modes to predict one from the other.
    """
    sources = _multi_mode(rows, engine_family, device_family)
    scored = [(*_sq_log_error(sources, ratio, skip_setup), ratio) for ratio in RATIO_GRID]
    scored = [s for s in scored if s[1]]
    if not scored:
        return None
    best = min(scored, key=lambda s: (round(s[0], 12), s[2]))  # ties: the smaller ratio
    return RatioFit(engine_family, device_family, best[2], best[1])


def _fit_or_borrow(rows: tuple[PublishedRow, ...], engine_family: str,
                   device_family: str) -> RatioFit:
    own = fit_compute_ratio(rows, engine_family, device_family)
    if own is not None:
        return own
    others = sorted({DEVICES[r.device].family for r in rows} - {device_family})
    for other in others:
        fit = fit_compute_ratio(rows, engine_family, other)
        if fit is not None:
            return RatioFit(engine_family, device_family, fit.ratio, fit.setups, other)
    return RatioFit(engine_family, device_family, 0.0, ())


@lru_cache(maxsize=64)
def ratio_fit(engine_family: str, device_family: str) -> RatioFit:
    """Return the shipped table's ratio fit for an engine family on a module family."""
    return _fit_or_borrow(tuple(load_table()), engine_family, device_family)


def compute_ratio(engine_family: str, device_family: str) -> float:
    """Return the shipped table's compute ratio (0 where nothing fits or borrows one)."""
    if not device_family.startswith("orin"):
        return 0.0
    return ratio_fit(engine_family, device_family).ratio


def validate_modes(rows: Sequence[PublishedRow] | None = None) -> dict[str, Any]:
    """Predict each multi-mode setup's rows from its source's other modes alone.

    Each setup is predicted twice: with the ratio fitted without it (``error_rel``) and with
    the bandwidth alone (``bandwidth_only_error_rel``, ratio 0). ``error_rel`` is
    ``predicted / measured - 1`` on the step time.
    """
    table = tuple(rows if rows is not None else load_table())
    out_rows: list[dict[str, Any]] = []
    fits = []
    for (family, dev_family) in sorted({(r.engine_family, DEVICES[r.device].family)
                                        for r in table}):
        sources = _multi_mode(table, family, dev_family)
        if not sources:
            continue
        fits.append(fit_compute_ratio(table, family, dev_family))
        for groups in sources.values():
            for held in groups:
                fit = fit_compute_ratio(table, family, dev_family, skip_setup=held)
                ratio = fit.ratio if fit is not None else 0.0
                preds = _cross_mode(groups, held, ratio)
                base = _cross_mode(groups, held, 0.0)
                if preds is None or base is None:
                    continue
                for (r, p), (_, b) in zip(preds, base, strict=True):
                    out_rows.append({
                        "id": r.id, "engine_family": family, "device": r.device,
                        "power_mode": r.power_mode, "setup": held, "ratio": ratio,
                        "measured_ms": r.itl_ms, "predicted_ms": p,
                        "error_rel": p / r.itl_ms - 1.0, "bandwidth_only_ms": b,
                        "bandwidth_only_error_rel": b / r.itl_ms - 1.0})
    errs = [abs(r["error_rel"]) for r in out_rows]
    base_errs = [abs(r["bandwidth_only_error_rel"]) for r in out_rows]
    return {
        "rows": out_rows,
        "ratio_fits": [f.to_dict() for f in fits if f is not None],
        "predicted": len(out_rows),
        "median_abs_error": statistics.median(errs) if errs else None,
        "bandwidth_only_median_abs_error": statistics.median(base_errs) if base_errs else None,
        "max_abs_error": max(errs, default=None),
        "bandwidth_only_max_abs_error": max(base_errs, default=None),
    }


def module_devices(device_id: str) -> set[str]:
    """The other power modes and memory sizes of ``device_id``'s module (its datasheet
    family: AGX Orin, Orin NX, Orin Nano), without ``device_id`` itself."""
    sheet = DEVICES.get(device_id)
    if sheet is None or not sheet.family:
        return set()
    return {d for d, s in DEVICES.items() if s.family == sheet.family and d != device_id}


def module_rows(rows: Sequence[PublishedRow], device_id: str) -> list[PublishedRow]:
    """The rows measured on the same module as ``device_id`` in its other power modes, each
    against its own mode's floor."""
    others = module_devices(device_id)
    return [r for r in rows if r.device in others]


def module_note(rows: Sequence[PublishedRow], device_id: str) -> str:
    """The note of a calibration fitted on the module's other modes."""
    devices = sorted({r.device for r in rows})
    return (f"no row of the family on {device_id}: fitted on the same module's other modes "
            f"({', '.join(devices)}; each row against its own mode's floor)")


def mode_point(row: PublishedRow) -> DecodePoint:
    """The row against the floor a fit across modes scales: its bytes floor or, where its mode's
    compute caps it harder, the family's compute ratio times its FLOPs at the mode's peak."""
    p = row_point(row)
    ratio = compute_ratio(row.engine_family, DEVICES[row.device].family)
    return replace(p, floor_ms=max(p.floor_ms, ratio * p.compute_ms))


def predict_row(row: PublishedRow, cal: Calibration) -> float:
    """The row's step time under ``cal`` (the compute ratio applied where ``cal`` carries one)."""
    p = row_point(row)
    return cal.decode_floor_ms(p.floor_ms, p.compute_ms) / cal.efficiency + cal.overhead_ms
