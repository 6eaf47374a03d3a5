"""The shipped table of published batch-1 decode rates, and the calibrations fitted from it.

``robot_latency/data/published_decode.yaml`` holds one row per published figure (module, power
mode, model, quant, engine and version, tok/s, lengths, source address). Each row becomes a
:class:`~robot_latency.floor.calibration.DecodePoint`: its measured step time (1000 / tok/s) next
to the bandwidth floor of that model on that device. A calibration for (engine family, device) is
fitted from the rows of that family on that device when they cover two model sizes, else from the
family's rows on every device (scope ``family``); ``validate`` predicts every row from a fit
without it (leave-one-out).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from robot_latency.floor.calibration import (
    Calibration,
    DecodePoint,
    calibrate_points,
    check_engine_family,
)
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError, FloorError, TableError
from robot_latency.floor.fit import distinct_sizes
from robot_latency.floor.modelinfo import PRESETS, profile_from_preset, quant_bpw
from robot_latency.floor.predict import predict_floor

__all__ = [
    "ROW_FIELDS",
    "PublishedRow",
    "ValidationResult",
    "default_table_path",
    "load_table",
    "row_point",
    "table_calibration",
    "validate_table",
]

#: Every row's fields and the types they may take (None: the source does not say).
ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,), "source": (str,), "url": (str,), "module": (str,),
    "power_mode": (str, type(None)), "device": (str,), "model": (str,),
    "model_reported": (str,), "quant_reported": (str,), "quant": (str,), "engine": (str,),
    "engine_family": (str,), "engine_version": (str, type(None)), "tok_s": (int, float),
    "prompt_tokens": (int, type(None)), "gen_tokens": (int, type(None)), "notes": (str,),
}


@dataclass(frozen=True)
class PublishedRow:
    """One published decode figure (see the table's header for the fields)."""

    id: str
    source: str
    url: str
    module: str
    power_mode: str | None
    device: str
    model: str
    model_reported: str
    quant_reported: str
    quant: str
    engine: str
    engine_family: str
    engine_version: str | None
    tok_s: float
    prompt_tokens: int | None
    gen_tokens: int | None
    notes: str

    @property
    def itl_ms(self) -> float:
        """The published rate as a step time (ms per token)."""
        return 1e3 / self.tok_s

    @property
    def context_tokens(self) -> int:
        """Mean tokens in the KV cache over the generation (prompt + half the output)."""
        return (self.prompt_tokens or 0) + (self.gen_tokens or 0) // 2


def default_table_path() -> Path:
    """Return the shipped table's path."""
    return Path(str(resources.files("robot_latency") / "data" / "published_decode.yaml"))


def _check_row(path: Path, i: int, raw: Any) -> PublishedRow:
    where = f"{path}: row {i + 1}"
    if not isinstance(raw, dict):
        raise TableError(f"{where}: must be a mapping, got {type(raw).__name__}")
    if isinstance(raw.get("id"), str):
        where = f"{path}: row {raw['id']!r}"
    missing = [k for k in ROW_FIELDS if k not in raw]
    extra = [k for k in raw if k not in ROW_FIELDS]
    if missing or extra:
        raise TableError(f"{where}: missing fields {missing}, unknown fields {extra}")
    for key, kinds in ROW_FIELDS.items():
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise TableError(f"{where}: field {key!r} has type {type(value).__name__}")
    if not raw["tok_s"] > 0:
        raise TableError(f"{where}: tok_s must be > 0, got {raw['tok_s']!r}")
    if not raw["url"].startswith("https://"):
        raise TableError(f"{where}: url must be an https address, got {raw['url']!r}")
    if raw["device"] not in DEVICES:
        raise TableError(f"{where}: unknown device {raw['device']!r}")
    if raw["model"] not in PRESETS:
        raise TableError(f"{where}: unknown model preset {raw['model']!r}")
    try:
        check_engine_family(raw["engine_family"])
        quant_bpw(raw["quant"])
    except FloorError as err:
        raise TableError(f"{where}: {err}") from err
    return PublishedRow(**{**raw, "tok_s": float(raw["tok_s"])})


def load_table(path: str | Path | None = None) -> list[PublishedRow]:
    """Read and check the table (the shipped one by default).

    Raises:
        TableError: naming the file, the row and the field that is wrong.
    """
    p = Path(path) if path is not None else default_table_path()
    return list(_load_cached(str(p)))


@lru_cache(maxsize=4)
def _load_cached(path: str) -> tuple[PublishedRow, ...]:
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise TableError(f"{p}: cannot read ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise TableError(f"{p}: not valid YAML ({err})") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise TableError(f"{p}: expected a mapping with a 'rows' list")
    rows = [_check_row(p, i, raw) for i, raw in enumerate(doc["rows"])]
    ids = [r.id for r in rows]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise TableError(f"{p}: duplicate row ids {dupes}")
    return tuple(rows)


def row_point(row: PublishedRow) -> DecodePoint:
    """Return the row as a decode point: its step time next to its bandwidth floor."""
    model = profile_from_preset(row.model, quant=row.quant)
    floor = predict_floor(model, DEVICES[row.device], context_tokens=row.context_tokens)
    return DecodePoint(label=row.id, device_id=row.device, model=row.model,
                       floor_ms=floor.itl_floor_ms, measured_ms=row.itl_ms)


def table_calibration(engine_family: str, device_id: str, *,
                      rows: Sequence[PublishedRow] | None = None,
                      exclude: str | None = None) -> Calibration:
    """Fit the calibration of ``engine_family`` on ``device_id`` from the table's rows.

    The rows of that family on that device are used when they cover two model sizes; otherwise
    all the family's rows (scope ``family``).

    Raises:
        CalibrationError: the family has too few rows in the table to fit (naming the family and
            the families that do have rows).
    """
    family = check_engine_family(engine_family)
    table = [r for r in (rows if rows is not None else load_table()) if r.id != exclude]
    mine = [row_point(r) for r in table if r.engine_family == family]
    here = [p for p in mine if p.device_id == device_id]
    source = "published table"
    if len(here) >= 2 and distinct_sizes([p.floor_ms for p in here]) >= 2:
        return calibrate_points(here, engine_family=family, device_id=device_id,
                                scope="device", source=source)
    if len(mine) >= 2 and distinct_sizes([p.floor_ms for p in mine]) >= 2:
        devices = sorted({p.device_id for p in mine})
        return calibrate_points(
            mine, engine_family=family, device_id=device_id, scope="family", source=source,
            notes=(f"no two model sizes of {family} on {device_id} in the table: fitted on "
                   f"{', '.join(devices)} (overhead assumed to carry over)",))
    have = sorted({r.engine_family for r in table})
    raise CalibrationError(
        f"the published table has too few {family} rows to fit a calibration (families with "
        f"rows: {', '.join(have)}); calibrate from runs (robot-latency calibrate) and pass "
        "--calibration")


@dataclass(frozen=True)
class ValidationResult:
    """One row predicted from a fit without it."""

    id: str
    engine_family: str
    device: str
    model: str
    quant: str
    published_tok_s: float
    floor_ms: float
    measured_ms: float
    predicted_ms: float | None
    error_rel: float | None
    scope: str | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return asdict(self)


def validate_table(rows: Sequence[PublishedRow] | None = None) -> dict[str, Any]:
    """Predict every row from a calibration fitted without it; return rows and error summary.

    ``error_rel`` is ``predicted / measured - 1`` (on the step time). Rows whose family has no
    fit left without them are listed with a reason and left out of the summary.
    """
    table = list(rows) if rows is not None else load_table()
    results: list[ValidationResult] = []
    for row in table:
        point = row_point(row)
        try:
            cal = table_calibration(row.engine_family, row.device, rows=table, exclude=row.id)
        except CalibrationError as err:
            results.append(ValidationResult(
                row.id, row.engine_family, row.device, row.model, row.quant, row.tok_s,
                point.floor_ms, point.measured_ms, None, None, None, str(err)))
            continue
        pred = point.floor_ms / cal.efficiency + cal.overhead_ms
        results.append(ValidationResult(
            row.id, row.engine_family, row.device, row.model, row.quant, row.tok_s,
            point.floor_ms, point.measured_ms, pred, pred / point.measured_ms - 1.0, cal.scope,
            None))
    errors = [abs(r.error_rel) for r in results if r.error_rel is not None]
    by_family: dict[str, dict[str, Any]] = {}
    for family in sorted({r.engine_family for r in results}):
        errs = [abs(r.error_rel) for r in results
                if r.engine_family == family and r.error_rel is not None]
        by_family[family] = {"predicted": len(errs),
                             "median_abs_error": statistics.median(errs) if errs else None,
                             "max_abs_error": max(errs) if errs else None}
    return {
        "rows": [r.to_dict() for r in results],
        "by_family": by_family,
        "predicted": len(errors),
        "not_predicted": len(results) - len(errors),
        "sources": len({r.source for r in table}),
        "median_abs_error": statistics.median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
    }
