"""The shipped table of published prefill figures, and the prefill terms fitted from it.

``robot_latency/data/published_prefill.yaml`` holds setups (one source's engine build on one
device in one power mode), each with rows of a model, a quant, a prompt length and the figure the
source prints (TTFT, prefill time or prompt tokens per second). Each row becomes a
:class:`~robot_latency.floor.calibration.PrefillPoint`: its prefill time next to its compute
floor ``2 * params * prompt_tokens / peak FLOP/s``. The prefill terms are fitted on those points
as the decode terms are on the decode table (docs/REFERENCE.md, "Prefill, calibrated"):

    ttft_pred = compute_floor / compute_efficiency + prefill_overhead      (never below the floor)

most specific first: the setup's rows (the best-documented setup on the device that no flagged
source alone sets), every row of the family on the device, every row of the family. The 80%
interval comes from the leave-one-out residuals of the family's rows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from robot_latency.floor.calibration import (
    DEFAULT_SPREAD_REL,
    PrefillPoint,
    check_engine_family,
)
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError, FloorError, TableError
from robot_latency.floor.fit import distinct_sizes, fit_two_term
from robot_latency.floor.modelinfo import PRESETS, ModelFacts, facts_from_preset, quant_bpw
from robot_latency.floor.predict import TTFTFloor, ttft_floor
from robot_latency.floor.published_table import read_table_list, scale_to_file, unique_rows
from robot_latency.floor.shapes import refusal_reason

__all__ = [
    "PREFILL_METRICS",
    "PrefillFit",
    "PrefillRow",
    "default_prefill_path",
    "load_prefill_table",
    "prefill_fit",
    "prefill_interval",
    "prefill_not_predicted_reason",
    "prefill_point",
    "prefill_row_floor",
]

#: What a setup's values are.
PREFILL_METRICS: dict[str, str] = {
    "ttft_ms": "time to first token at the client (ms)",
    "prefill_ms": "the engine's prompt-processing time (ms)",
    "pp_tok_s": "prompt tokens per second (llama-bench ppN)",
}

_SETUP_FIELDS: dict[str, tuple[type, ...]] = {
    "setup": (str,), "source": (str,), "url": (str,), "module": (str,),
    "power_mode": (str, type(None)), "device": (str,), "engine": (str,),
    "engine_family": (str,), "build": (str, type(None)), "date": (str, type(None)),
    "clocks_locked": (bool, type(None)), "metric": (str,), "notes": (str,), "rows": (list,),
}
_ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (str,), "model_reported": (str,), "quant": (str,),
    "file_bytes": (int, type(None)), "prompt_tokens": (int,), "value": (int, float),
}
_INTERVAL_COVERAGE = 0.8


@dataclass(frozen=True)
class PrefillRow:
    """One published prefill figure, with its setup's conditions."""

    id: str
    setup_id: str
    source: str
    url: str
    module: str
    power_mode: str | None
    device: str
    engine: str
    engine_family: str
    build: str | None
    date: str | None
    clocks_locked: bool | None
    metric: str
    model: str
    model_reported: str
    quant: str
    file_bytes: int | None
    prompt_tokens: int
    value: float

    @property
    def measured_ms(self) -> float:
        """The published figure as a prefill time (ms)."""
        if self.metric == "pp_tok_s":
            return self.prompt_tokens / self.value * 1e3
        return self.value

    @property
    def setup(self) -> str:
        """The decode table's setup string: the same source, device and mode are one setup."""
        return f"{self.source} | {self.device} | {self.power_mode or 'mode not stated'}"


def default_prefill_path() -> Path:
    """Return the shipped prefill table's path."""
    return Path(str(resources.files("robot_latency") / "data" / "published_prefill.yaml"))


def _check(where: str, raw: Any, fields: dict[str, tuple[type, ...]]) -> None:
    if not isinstance(raw, dict):
        raise TableError(f"{where}: must be a mapping, got {type(raw).__name__}")
    missing = [k for k in fields if k not in raw]
    extra = [k for k in raw if k not in fields]
    if missing or extra:
        raise TableError(f"{where}: missing fields {missing}, unknown fields {extra}")
    for key, kinds in fields.items():
        value = raw[key]
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            raise TableError(f"{where}: field {key!r} has type {type(value).__name__}")


def _setup_rows(path: Path, raw: Any, i: int) -> list[PrefillRow]:
    where = f"{path}: setup {i + 1}"
    if isinstance(raw, dict) and isinstance(raw.get("setup"), str):
        where = f"{path}: setup {raw['setup']!r}"
    _check(where, raw, _SETUP_FIELDS)
    if raw["metric"] not in PREFILL_METRICS:
        raise TableError(f"{where}: unknown metric {raw['metric']!r}; known: "
                         f"{', '.join(PREFILL_METRICS)}")
    if not raw["url"].startswith("https://"):
        raise TableError(f"{where}: url must be an https address, got {raw['url']!r}")
    if raw["device"] not in DEVICES:
        raise TableError(f"{where}: unknown device {raw['device']!r}")
    try:
        check_engine_family(raw["engine_family"])
    except FloorError as err:
        raise TableError(f"{where}: {err}") from err
    out = []
    for j, row in enumerate(raw["rows"]):
        at = f"{where}, row {j + 1}"
        _check(at, row, _ROW_FIELDS)
        if row["model"] not in PRESETS:
            raise TableError(f"{at}: unknown model preset {row['model']!r}")
        try:
            quant_bpw(row["quant"])
        except FloorError as err:
            raise TableError(f"{at}: {err}") from err
        for key in ("prompt_tokens", "value", "file_bytes"):
            if row[key] is not None and not row[key] > 0:
                raise TableError(f"{at}: {key} must be > 0, got {row[key]!r}")
        out.append(PrefillRow(
            id=f"{raw['setup']}-{row['model']}-{row['quant'].lower()}-p{row['prompt_tokens']}",
            setup_id=raw["setup"], source=raw["source"], url=raw["url"], module=raw["module"],
            power_mode=raw["power_mode"], device=raw["device"], engine=raw["engine"],
            engine_family=raw["engine_family"], build=raw["build"], date=raw["date"],
            clocks_locked=raw["clocks_locked"], metric=raw["metric"], model=row["model"],
            model_reported=row["model_reported"], quant=row["quant"],
            file_bytes=row["file_bytes"], prompt_tokens=row["prompt_tokens"],
            value=float(row["value"])))
    return out


def load_prefill_table(path: str | Path | None = None) -> list[PrefillRow]:
    """Read and check the prefill table (the shipped one by default).

    Raises:
        TableError: naming the file, the setup, the row and the field that is wrong.
    """
    return list(_load_cached(str(Path(path) if path is not None else default_prefill_path())))


@lru_cache(maxsize=4)
def _load_cached(path: str) -> tuple[PrefillRow, ...]:
    p = Path(path)
    return unique_rows(p, [r for i, raw in enumerate(read_table_list(p, "setups"))
                           for r in _setup_rows(p, raw, i)])


def _row_facts(row: PrefillRow) -> ModelFacts:
    model = facts_from_preset(row.model, quant=row.quant)
    return model if row.file_bytes is None else scale_to_file(model, row.file_bytes)


def prefill_not_predicted_reason(row: PrefillRow) -> str | None:
    """Return why ``row`` has no compute floor (a refused model, a device without a peak
    FLOP/s figure), or None when it is predicted."""
    refused = refusal_reason(row.model)
    if refused is not None:
        return f"the floor cannot count {refused}"
    device = DEVICES[row.device]
    if not (device.peak_flops and device.flops_is_peak):
        return f"device {row.device!r} has no peak FLOP/s figure: no compute floor"
    return None


def prefill_row_floor(row: PrefillRow) -> TTFTFloor:
    """Return the row's prefill floor (weights read once, prompt compute)."""
    return ttft_floor(_row_facts(row), DEVICES[row.device], row.prompt_tokens)


@lru_cache(maxsize=1024)
def prefill_point(row: PrefillRow) -> PrefillPoint:
    """Return the row as a prefill point: its prefill time next to its compute floor.

    Raises:
        CalibrationError: the row has no compute floor (``prefill_not_predicted_reason``).
    """
    why = prefill_not_predicted_reason(row)
    floor = prefill_row_floor(row)
    if why is not None or floor.compute_ms is None:
        raise CalibrationError(f"prefill row {row.id}: {why}")
    return PrefillPoint(label=row.id, compute_floor_ms=floor.compute_ms,
                        measured_ms=row.measured_ms)


@dataclass(frozen=True)
class PrefillFit:
    """The prefill terms of one engine family on one device, and the rows behind them."""

    engine_family: str
    device_id: str
    scope: str
    compute_efficiency: float
    overhead_ms: float
    basis: tuple[str, ...]
    sources: tuple[str, ...]
    notes: tuple[str, ...]

    def predict_ms(self, compute_floor_ms: float) -> float:
        """The predicted prefill time (before the floor) for a compute floor."""
        return compute_floor_ms / self.compute_efficiency + self.overhead_ms


def _fit(rows: Sequence[PrefillRow], family: str, device_id: str, scope: str,
         notes: Sequence[str]) -> PrefillFit:
    pts = [prefill_point(r) for r in rows]
    xs, ys = [p.compute_floor_ms for p in pts], [p.measured_ms for p in pts]
    extra: list[str] = []
    if distinct_sizes(xs) >= 2:
        fit = fit_two_term(xs, ys)
    else:
        fit = fit_two_term(xs, ys, fixed_overhead_ms=0.0)
        extra.append("prefill from one prompt size: its overhead held at 0 ms")
    return PrefillFit(family, device_id, scope, fit.efficiency, fit.overhead_ms,
                      tuple(r.id for r in rows), tuple(sorted({r.source for r in rows})),
                      (*notes, *extra))


def _best_setup(rows: Sequence[PrefillRow]) -> str | None:
    """Best-documented first: clocks locked, power mode stated, newest date, most rows."""
    groups: dict[str, list[PrefillRow]] = {}
    for r in rows:
        groups.setdefault(r.setup, []).append(r)
    if not groups:
        return None
    best = max(groups.values(), key=lambda g: (g[0].clocks_locked is True,
                                              g[0].power_mode is not None, g[0].date or "",
                                              len(g)))
    return best[0].setup


def prefill_fit(engine_family: str, device_id: str, *, rows: Sequence[PrefillRow] | None = None,
                exclude: str | None = None, setup: str | None = None,
                set_aside: Sequence[str] = ()) -> PrefillFit | None:
    """Fit the prefill terms of ``engine_family`` on ``device_id``; None without any row.

    The ladder: the rows of ``setup`` (by default the best-documented setup on the device whose
    source is not in ``set_aside``); every row of the family on the device; every row of the
    family on every device (each against its own device's compute floor; noted). Sources in
    ``set_aside`` (flagged) are left out of a device's answer while other rows remain; a named
    ``setup`` is always fitted on its own rows (a flagged source still predicts its own setup).
    """
    family = check_engine_family(engine_family)
    table = rows if rows is not None else load_prefill_table()
    mine = [r for r in table if r.engine_family == family and r.id != exclude
            and prefill_not_predicted_reason(r) is None]
    notes: list[str] = []
    if setup is None:
        kept = [r for r in mine if r.source not in set_aside]
        if kept:
            dropped = sorted({r.source for r in mine if r.source in set_aside and (
                r.device == device_id or not any(k.device == device_id for k in kept))})
            mine = kept
            notes.extend(f"prefill: set aside {s} (flagged source)" for s in dropped)
        setup = _best_setup([r for r in mine if r.device == device_id])
    same = [r for r in mine if r.setup == setup and r.device == device_id]
    if same:
        return _fit(same, family, device_id, "setup", (*notes, f"prefill setup: {setup}"))
    here = [r for r in mine if r.device == device_id]
    if here:
        return _fit(here, family, device_id, "device", notes)
    if mine:
        devices = sorted({r.device for r in mine})
        return _fit(mine, family, device_id, "family", (
            *notes, f"no prefill row of {family} on {device_id}: fitted on {', '.join(devices)}"))
    return None


def _loo_residuals(table: tuple[PrefillRow, ...], family: str) -> list[float]:
    """``measured / predicted - 1`` of each of the family's rows predicted without itself."""
    out = []
    for row in table:
        if row.engine_family != family or prefill_not_predicted_reason(row) is not None:
            continue
        fit = prefill_fit(family, row.device, rows=table, exclude=row.id, setup=row.setup)
        if fit is None:
            continue
        pred = max(fit.predict_ms(prefill_point(row).compute_floor_ms),
                   prefill_row_floor(row).floor_ms)
        out.append(row.measured_ms / pred - 1.0)
    return out


@lru_cache(maxsize=256)
def _interval_cached(table: tuple[PrefillRow, ...], family: str) -> tuple[float, float]:
    res = sorted(_loo_residuals(table, family))
    if len(res) < 3:
        return (-DEFAULT_SPREAD_REL, DEFAULT_SPREAD_REL)
    n, tail = len(res), (1.0 - _INTERVAL_COVERAGE) / 2
    k_lo = max(1, math.floor(tail * (n + 1)))
    k_hi = min(n, math.ceil((1.0 - tail) * (n + 1)))
    return (min(0.0, res[k_lo - 1]), max(0.0, res[k_hi - 1]))


def prefill_interval(engine_family: str, *, rows: Sequence[PrefillRow] | None = None,
                     exclude: str | None = None) -> tuple[float, float]:
    """Return the family's 80% TTFT interval as (lo, hi) relative bounds on a prediction.

    Order statistics of the leave-one-out residuals of the family's rows (each predicted from
    its setup without it), ``exclude`` left out of the table (the split-conformal interval of
    the decode table; the default spread with fewer than three residuals).
    """
    family = check_engine_family(engine_family)
    table = tuple(r for r in (rows if rows is not None else load_prefill_table())
                  if r.id != exclude)
    return _interval_cached(table, family)


def median_abs(values: Sequence[float]) -> float | None:
    """The median of the absolute values, None for none."""
    return statistics.median(abs(v) for v in values) if values else None
