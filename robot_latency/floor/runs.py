"""Calibrating from real runs: run directories in, a calibration file out.

Each run directory (``manifest.json`` + ``cycles.jsonl``, as ``robot-latency run`` writes them)
gives one decode point: the median inter-token gap of its model cycles against the bandwidth
floor of its model on the machine that ran it, at the median context length. Where its cycles
carry prefill times, it gives a prefill point too. The runs must cover at least two model sizes
(bytes per step); with one, the overhead must be held at a given value (``fixed_overhead_ms``)
and a warning says so.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.floor.calibration import (
    Calibration,
    DecodePoint,
    PrefillPoint,
    calibrate_points,
    check_engine_family,
)
from robot_latency.floor.devices import get_device
from robot_latency.floor.errors import CalibrationError
from robot_latency.records import RecordError, read_records

__all__ = ["RunPoints", "calibrate_runs", "engine_family_of", "run_points"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPoints:
    """What one run directory contributes to a calibration."""

    run_dir: str
    engine_family: str
    device_id: str
    decode: DecodePoint
    prefill: PrefillPoint | None
    itl_samples: int


def engine_family_of(manifest: dict[str, Any]) -> str | None:
    """Return the engine family a run's manifest describes, or None if it does not say."""
    engine = manifest.get("engine")
    options = manifest.get("engine_options") or {}
    if engine == "llamacpp":
        return "llamacpp-cuda" if int(options.get("n_gpu_layers", 0) or 0) != 0 else "llamacpp-cpu"
    if engine == "onnx":
        info = json.dumps(manifest.get("engine_info") or {})
        return "ort-cuda" if "CUDAExecutionProvider" in info else "ort-cpu"
    if engine == "sim":
        family = options.get("engine_family")
        return family or None
    return None


def _manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "manifest.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CalibrationError(f"{path}: cannot read ({err.strerror or err})") from err
    except ValueError as err:
        raise CalibrationError(f"{path}: not JSON ({err})") from err
    if not isinstance(doc, dict):
        raise CalibrationError(f"{path}: not a run manifest")
    return doc


def run_points(run_dir: str | Path, *, engine_family: str | None = None) -> RunPoints:
    """Read one run directory into its decode (and prefill) point.

    Raises:
        CalibrationError: a missing or unreadable file, a run without a floor (no model facts)
            or without two generated tokens in any model cycle, or no engine family.
    """
    d = Path(run_dir)
    manifest = _manifest(d)
    floor = (manifest.get("floor") or {}).get("host")
    model = manifest.get("model")
    if not isinstance(floor, dict) or not isinstance(model, dict):
        raise CalibrationError(f"{d}: the run has no floor prediction (it was run without a "
                               "model facts); cannot place it against a floor")
    family = engine_family or engine_family_of(manifest)
    if family is None:
        raise CalibrationError(f"{d}: the manifest does not say the engine family; pass one "
                               "(--engine-family)")
    family = check_engine_family(family)
    try:
        records = read_records(d / "cycles.jsonl")
    except RecordError as err:
        raise CalibrationError(str(err)) from err
    model_cycles = [r for r in records if r.plan_source == "model" or r.tokens_out >= 2]
    gaps = [g for r in model_cycles for g in r.itl_ns]
    if not gaps:
        raise CalibrationError(f"{d}: no inter-token gaps in {len(records)} cycles")
    contexts = [(r.tokens_in or 0) + r.tokens_out // 2 for r in model_cycles if r.itl_ns]
    context = int(statistics.median(contexts)) if contexts else 0
    bandwidth_gbps = float(floor["bandwidth_gbps"])
    bytes_per_step = float(floor["weight_bytes_per_step"]) + float(
        floor.get("kv_bytes_per_token") or 0) * context
    floor_ms = bytes_per_step / (bandwidth_gbps * 1e9) * 1e3
    device_id = str(floor["device_id"])
    decode = DecodePoint(label=str(d), device_id=device_id, model=str(model.get("name")),
                         floor_ms=floor_ms, measured_ms=statistics.median(gaps) / 1e6)
    return RunPoints(run_dir=str(d), engine_family=family, device_id=device_id, decode=decode,
                     prefill=_prefill_point(d, device_id, model, records), itl_samples=len(gaps))


def _prefill_point(d: Path, device_id: str, model: dict[str, Any],
                   records: Sequence[Any]) -> PrefillPoint | None:
    """Median prefill against the compute floor at the median uncached prompt length."""
    pairs = [(r.phases_ns["prefill"] / 1e6, (r.tokens_in or 0) - (r.prefix_cache_tokens or 0))
             for r in records if r.phases_ns.get("prefill") and r.tokens_in]
    pairs = [(ms, n) for ms, n in pairs if n > 0]
    if not pairs:
        return None
    device = get_device(device_id)
    if device.peak_flops is None:
        return None
    total = float(model.get("weight_bytes_total") or 0)
    share = float(model.get("weight_bytes_per_step") or 0) / total if total else 1.0
    params = float(model["params"]) * share
    tokens = statistics.median(n for _, n in pairs)
    compute_floor_ms = 2.0 * params * tokens / device.peak_flops * 1e3
    return PrefillPoint(label=str(d), compute_floor_ms=compute_floor_ms,
                        measured_ms=statistics.median(ms for ms, _ in pairs))


def calibrate_runs(run_dirs: Sequence[str | Path], *, engine_family: str | None = None,
                   fixed_overhead_ms: float | None = None) -> tuple[Calibration, list[RunPoints]]:
    """Fit a calibration from run directories of one engine family on one device.

    Raises:
        CalibrationError: no runs, runs of different families or devices, or a single model
            size without ``fixed_overhead_ms`` (the message says how to proceed).
    """
    if not run_dirs:
        raise CalibrationError("no run directories given")
    runs = [run_points(d, engine_family=engine_family) for d in run_dirs]
    families = sorted({r.engine_family for r in runs})
    devices = sorted({r.device_id for r in runs})
    if len(families) > 1 or len(devices) > 1:
        raise CalibrationError(f"runs mix engine families {families} or devices {devices}; "
                               "calibrate one family on one device at a time")
    prefill = [r.prefill for r in runs if r.prefill is not None]
    try:
        cal = calibrate_points([r.decode for r in runs], engine_family=families[0],
                               device_id=devices[0], scope="device", source="runs",
                               fixed_overhead_ms=fixed_overhead_ms,
                               prefill=prefill if len(prefill) == len(runs) else ())
    except CalibrationError as err:
        if "model size" in str(err):
            raise CalibrationError(f"{err}: add a run of another model size, or pass "
                                   "--fixed-overhead-ms to hold the overhead") from err
        raise
    return cal, runs
