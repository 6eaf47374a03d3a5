"""The shipped table of published vision-encoder times on Jetson modules, and the fit on it.

``robot_latency/data/published_vision.yaml`` holds setups (one source's engine build on one
device in one power mode), each with rows of a tower (its shape, as the FLOPs count needs it), a
camera frame and the encode time the source prints. A row's uncalibrated prediction is its
encode FLOPs at its device's calibrated compute rate (the engine family's prefill compute
efficiency from the published tables times the device's peak,
:func:`robot_latency.floor.vision_tower.VisionTower.encode_flops`); the fit is one factor,
``measured = factor * uncalibrated``, on the family's rows on the device, else on all of the
family's rows. ``validate_vision`` predicts each row from a fit without it (leave-one-out), as
the decode and prefill tables are validated, once there are at least two rows.

No row is shipped yet: no public source read here gives a Jetson vision-encoder time with the
tower, the resolution and the engine build together (the leads are in the YAML's header). Every
family is then ``vision uncalibrated`` (:func:`robot_latency.floor.vision.predict_vision`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from robot_latency.floor.calibration import check_engine_family
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import FloorError, TableError
from robot_latency.floor.published_support import table_calibration
from robot_latency.floor.published_table import read_table_list, unique_rows
from robot_latency.floor.vision_tower import VisionTower

__all__ = ["VisionFit", "VisionRow", "load_vision_table", "validate_vision", "vision_fit"]

#: Fewer rows than this: no leave-one-out validation.
MIN_VALIDATION_ROWS = 2

_SETUP_FIELDS = ("setup", "source", "url", "device", "engine", "engine_family", "build", "date",
                 "power_mode", "notes", "rows")
_ROW_FIELDS = ("model_reported", "tower", "frame_px", "encode_ms")
_TOWER_FIELDS = ("projector", "image_size_px", "patch_px", "width", "ffn", "layers",
                 "projection_dim", "scale_factor", "class_token")


@dataclass(frozen=True)
class VisionRow:
    """One published encode time, with its setup's conditions."""

    id: str
    source: str
    url: str
    device: str
    engine: str
    engine_family: str
    build: str | None
    power_mode: str | None
    model_reported: str
    tower: VisionTower
    frame_px: tuple[int, int]
    encode_ms: float


@dataclass(frozen=True)
class VisionFit:
    """The encode's factor over its uncalibrated prediction, and the rows behind it."""

    engine_family: str
    device_id: str
    scope: str
    factor: float
    basis: tuple[str, ...]
    sources: tuple[str, ...]


def default_vision_path() -> Path:
    """Return the shipped vision table's path."""
    return Path(str(resources.files("robot_latency") / "data" / "published_vision.yaml"))


def _check(where: str, raw: Any, fields: Sequence[str]) -> None:
    if not isinstance(raw, dict):
        raise TableError(f"{where}: must be a mapping, got {type(raw).__name__}")
    missing = [k for k in fields if k not in raw]
    extra = [k for k in raw if k not in fields]
    if missing or extra:
        raise TableError(f"{where}: missing fields {missing}, unknown fields {extra}")


def _setup_rows(path: Path, raw: Any, i: int) -> list[VisionRow]:
    where = f"{path}: setup {i + 1}"
    _check(where, raw, _SETUP_FIELDS)
    if raw["device"] not in DEVICES:
        raise TableError(f"{where}: unknown device {raw['device']!r}")
    if not str(raw["url"]).startswith("https://"):
        raise TableError(f"{where}: url must be an https address, got {raw['url']!r}")
    try:
        check_engine_family(raw["engine_family"])
    except FloorError as err:
        raise TableError(f"{where}: {err}") from err
    out = []
    for j, row in enumerate(raw["rows"]):
        at = f"{where}, row {j + 1}"
        _check(at, row, _ROW_FIELDS)
        _check(f"{at}, tower", row["tower"], _TOWER_FIELDS)
        frame = row["frame_px"]
        if (not isinstance(frame, list) or len(frame) != 2
                or not all(isinstance(v, int) and v > 0 for v in frame)):
            raise TableError(f"{at}: frame_px must be [width, height], got {frame!r}")
        if not isinstance(row["encode_ms"], (int, float)) or not row["encode_ms"] > 0:
            raise TableError(f"{at}: encode_ms must be > 0, got {row['encode_ms']!r}")
        try:
            tower = VisionTower(name=row["model_reported"], **row["tower"])
        except (FloorError, TypeError) as err:
            raise TableError(f"{at}: {err}") from err
        out.append(VisionRow(
            id=f"{raw['setup']}-{row['model_reported']}-{tower.image_size_px}px",
            source=raw["source"], url=raw["url"], device=raw["device"], engine=raw["engine"],
            engine_family=raw["engine_family"], build=raw["build"],
            power_mode=raw["power_mode"], model_reported=row["model_reported"], tower=tower,
            frame_px=(frame[0], frame[1]), encode_ms=float(row["encode_ms"])))
    return out


def load_vision_table(path: str | Path | None = None) -> list[VisionRow]:
    """Read and check the vision table (the shipped one by default).

    Raises:
        TableError: naming the file, the setup, the row and the field that is wrong.
    """
    return list(_load_cached(str(Path(path) if path is not None else default_vision_path())))


@lru_cache(maxsize=4)
def _load_cached(path: str) -> tuple[VisionRow, ...]:
    p = Path(path)
    return unique_rows(p, [r for i, raw in enumerate(read_table_list(p, "setups"))
                           for r in _setup_rows(p, raw, i)])


def uncalibrated_encode_ms(row: VisionRow) -> float | None:
    """The row's encode at its device's calibrated compute rate (None: no calibration of its
    engine family there, or no FLOP/s figure)."""
    device = DEVICES[row.device]
    if not device.peak_flops:
        return None
    try:
        cal = table_calibration(row.engine_family, row.device)
    except FloorError:
        return None
    return row.tower.encode_flops(row.frame_px) / (device.peak_flops
                                                   * cal.compute_efficiency) * 1e3


def vision_fit(engine_family: str, device_id: str, *, rows: Sequence[VisionRow] | None = None,
               exclude: str | None = None) -> VisionFit | None:
    """Fit the encode factor of ``engine_family`` on ``device_id``; None without a usable row.

    The family's rows on the device, else all of the family's rows (each against its own
    device's rate). ``exclude``: a row id left out (leave-one-out).
    """
    family = check_engine_family(engine_family)
    table = rows if rows is not None else load_vision_table()
    mine = [(r, p) for r in table if r.engine_family == family and r.id != exclude
            for p in (uncalibrated_encode_ms(r),) if p is not None]
    here = [(r, p) for r, p in mine if r.device == device_id]
    use, scope = (here, "device") if here else (mine, "family")
    if not use:
        return None
    factor = statistics.median(r.encode_ms / p for r, p in use)
    return VisionFit(family, device_id, scope, factor, tuple(r.id for r, _ in use),
                     tuple(sorted({r.source for r, _ in use})))


def validate_vision(rows: Sequence[VisionRow] | None = None) -> dict[str, Any]:
    """Predict each row from a fit without it; median and max |error| per family.

    Fewer than :data:`MIN_VALIDATION_ROWS` rows: nothing is validated, and the answer says so.
    """
    table = list(rows if rows is not None else load_vision_table())
    out: dict[str, Any] = {"total_rows": len(table), "rows": [], "by_family": {}}
    if len(table) < MIN_VALIDATION_ROWS:
        out["validated"] = False
        out["reason"] = (f"{len(table)} published vision rows: leave-one-out needs at least "
                         f"{MIN_VALIDATION_ROWS}; every engine family is vision uncalibrated"
                         if not table else f"{len(table)} published vision row: leave-one-out "
                         f"needs at least {MIN_VALIDATION_ROWS}")
        return out
    out["validated"] = True
    errors: dict[str, list[float]] = {}
    for row in table:
        base = uncalibrated_encode_ms(row)
        fit = vision_fit(row.engine_family, row.device, rows=table, exclude=row.id)
        if base is None or fit is None:
            out["rows"].append({"id": row.id, "measured_ms": row.encode_ms,
                                "predicted_ms": None, "error_rel": None})
            continue
        pred = base * fit.factor
        err = pred / row.encode_ms - 1.0
        errors.setdefault(row.engine_family, []).append(err)
        out["rows"].append({"id": row.id, "measured_ms": row.encode_ms, "predicted_ms": pred,
                            "error_rel": err, "scope": fit.scope})
    for family, errs in errors.items():
        out["by_family"][family] = {"predicted": len(errs),
                                    "median_abs_error": statistics.median(abs(e) for e in errs),
                                    "max_abs_error": max(abs(e) for e in errs)}
    return out
