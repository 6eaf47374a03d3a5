"""Reading finished run directories, and the manifest look-ups every report needs.

A run directory holds ``cycles.jsonl`` (one :class:`~robot_latency.records.CycleRecord` per
line), ``manifest.json`` (label, engine, model, device, floor, config, replay) and
``summary.json``. Reports recompute every statistic from ``cycles.jsonl``, so ``summary.json`` is
not required here; the other two are. A directory without ``cycles.jsonl`` that holds
``run.mcap``, or a ``.mcap`` file given itself, is read from that file instead: its
``/planner/cycle_record`` channel and its manifest metadata (:mod:`robot_latency.report.runmcap`).

Every manifest field may be missing or ``null``: the accessors below return ``None`` then, and
the renderers show ``-``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from robot_latency.errors import RobotLatencyError
from robot_latency.planner.mcap_log import MCAP_NAME
from robot_latency.records import CycleRecord, RecordError, read_records

log = logging.getLogger(__name__)

#: Files a run directory must hold for a report.
REQUIRED_FILES = ("cycles.jsonl", "manifest.json")


class ReportError(RobotLatencyError, ValueError):
    """Something a report cannot be built from; the message names the file or the choice."""


class RunDirError(ReportError):
    """A run directory that is missing a file or holds one that cannot be read."""


class RunData(NamedTuple):
    """One configuration's results: its label, its records and its manifest (may be empty).

    A plain ``(label, records, manifest)`` tuple works wherever a :class:`RunData` is expected.
    """

    label: str
    records: Sequence[CycleRecord]
    manifest: Mapping[str, Any] | None


def load_run(run_dir: str | os.PathLike[str]) -> RunData:
    """Read one run directory.

    Args:
        run_dir: a directory written by ``robot-latency run`` (or a node), or a run.mcap.

    Returns:
        The run's label (``manifest["label"]``, else the directory name), records and manifest.

    Raises:
        RunDirError: the directory or a required file is missing or unreadable; the message
            names the directory and the file.
    """
    d = Path(run_dir)
    if d.is_file() and d.suffix == ".mcap":
        return _load_mcap(d, d.parent)
    if not d.is_dir():
        raise RunDirError(f"run directory {d} does not exist or is not a directory")
    if not (d / "cycles.jsonl").exists() and (d / MCAP_NAME).is_file():
        return _load_mcap(d / MCAP_NAME, d)
    missing = [name for name in REQUIRED_FILES if not (d / name).is_file()]
    if missing:
        raise RunDirError(f"run directory {d} lacks {', '.join(missing)} "
                          f"(a finished run holds {', '.join(REQUIRED_FILES)})")
    manifest_path = d / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RunDirError(f"run directory {d}: cannot read manifest.json: {err}") from err
    if manifest is None:
        manifest = {}
    if not isinstance(manifest, dict):
        raise RunDirError(f"run directory {d}: manifest.json is not a JSON object")
    try:
        records = read_records(d / "cycles.jsonl")
    except RecordError as err:
        raise RunDirError(f"run directory {d}: {err}") from err
    label = manifest.get("label")
    if not isinstance(label, str) or not label:
        label = d.resolve().name
    return RunData(label, records, manifest)


def _load_mcap(path: Path, d: Path) -> RunData:
    """A run read from its run.mcap: the records and the manifest it closed with (else the
    directory's manifest.json, if any)."""
    from robot_latency.report.runmcap import McapReadError, read_run_mcap

    try:
        records, manifest = read_run_mcap(path)
    except McapReadError as err:
        raise RunDirError(str(err)) from err
    if not manifest and (d / "manifest.json").is_file():
        try:
            manifest = json.loads((d / "manifest.json").read_text(encoding="utf-8")) or {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise RunDirError(f"run directory {d}: cannot read manifest.json: {err}") from err
    label = manifest.get("label") if isinstance(manifest, dict) else None
    if not isinstance(label, str) or not label:
        label = d.resolve().name
    return RunData(label, records, manifest if isinstance(manifest, dict) else {})


def load_runs(run_dirs: Sequence[str | os.PathLike[str]]) -> list[RunData]:
    """Read several run directories; labels made unique by appending ``#2``, ``#3``...."""
    runs = [load_run(d) for d in run_dirs]
    seen: dict[str, int] = {}
    out = []
    for run in runs:
        count = seen.get(run.label, 0) + 1
        seen[run.label] = count
        out.append(run if count == 1 else run._replace(label=f"{run.label}#{count}"))
    return out


def _get(data: Any, *keys: str) -> Any:
    """Follow ``keys`` through nested dicts; None when any level is missing or not a dict."""
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _record_floor(records: Sequence[CycleRecord], *keys: str) -> Any:
    """The first non-None value at ``keys`` in the records' ``floor`` dicts."""
    for rec in records:
        value = _get(rec.floor, *keys)
        if value is not None:
            return value
    return None


def host_itl_floor_ms(run: RunData) -> float | None:
    """The predicted decode ITL floor on the host (ms), from the manifest, else the records."""
    value = _number(_get(run.manifest, "floor", "host", "itl_floor_ms"))
    if value is None:
        value = _number(_record_floor(run.records, "host", "itl_floor_ms"))
    return value


def target_itl_floor_ms(run: RunData) -> float | None:
    """The predicted decode ITL floor on the target device (ms), manifest first, then records."""
    value = _number(_get(run.manifest, "floor", "target", "itl_floor_ms"))
    if value is None:
        value = _number(_record_floor(run.records, "target", "itl_floor_ms"))
    return value


def target_prediction(run: RunData) -> dict[str, Any] | None:
    """The calibrated ITL prediction on the target: ``itl_pred_ms``, ``engine_family`` and
    ``itl_pred_interval_ms`` (manifest, weights only), else the first record's; None if absent."""
    pred = _get(run.manifest, "floor", "target_prediction")
    if isinstance(pred, dict) and _number(pred.get("itl_pred_ms")) is not None:
        return {"itl_pred_ms": _number(pred.get("itl_pred_ms")),
                "engine_family": pred.get("engine_family"),
                "itl_pred_interval_ms": pred.get("itl_pred_interval_ms")}
    value = _number(_record_floor(run.records, "target", "itl_pred_ms"))
    if value is None:
        return None
    return {"itl_pred_ms": value,
            "engine_family": _record_floor(run.records, "target", "engine_family"),
            "itl_pred_interval_ms": None}


def target_device_id(run: RunData) -> str | None:
    """The target device id (e.g. ``orin-nano-8gb``) from the floor or device entries."""
    for value in (_get(run.manifest, "floor", "target", "device_id"),
                  _get(run.manifest, "device", "target", "id"),
                  _record_floor(run.records, "target", "device_id")):
        if isinstance(value, str) and value:
            return value
    return None


def model_field(run: RunData, key: str) -> Any:
    """One entry of ``manifest["model"]`` (name, quant, weight_bytes_total, effective_bpw)."""
    return _get(run.manifest, "model", key)


def replay_mode(run: RunData) -> str | None:
    """``"recorded"`` or ``"asap"`` (as fast as possible), or None when not recorded."""
    value = _get(run.manifest, "replay", "mode")
    return value if isinstance(value, str) else None


def replay_speed(run: RunData) -> float | None:
    """The replay speed factor, or None."""
    return _number(_get(run.manifest, "replay", "speed"))


def deadline_ms(run: RunData) -> float | None:
    """The run's deadline (ms): the manifest config, else the median record budget."""
    value = _number(_get(run.manifest, "config", "deadline_ms"))
    if value is not None:
        return value
    budgets = sorted(r.deadline_budget_ns for r in run.records)
    return budgets[len(budgets) // 2] / 1e6 if budgets else None


def frame_scale(run: RunData) -> float | None:
    """The run's frame scale (the manifest config's ``frame_scale``), or None."""
    return _number(_get(run.manifest, "config", "frame_scale"))
