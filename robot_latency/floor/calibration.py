"""Calibrations: the fitted (efficiency, overhead) of one engine family on one device.

A calibration turns the bandwidth floor into a prediction (docs/REFERENCE.md, "Predictions: two
terms, calibrated")::

    itl_pred  = itl_floor / efficiency + overhead_ms
    ttft_pred = prefill_compute_floor / compute_efficiency + prefill_overhead_ms

It comes from the published table (:mod:`robot_latency.floor.published`) or from real runs
(:mod:`robot_latency.floor.runs`), and is written as a small JSON file that ``predict``, ``floor``
and the simulated engine accept. A file is checked when read: its shape, its engine family, and
the device it was fitted for.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.floor.errors import CalibrationError
from robot_latency.floor.fit import TwoTermFit, fit_two_term, leave_one_out

__all__ = [
    "CALIBRATION_FORMAT",
    "DEFAULT_COMPUTE_EFFICIENCY",
    "ENGINE_FAMILIES",
    "Calibration",
    "DecodePoint",
    "PrefillPoint",
    "calibrate_points",
    "check_engine_family",
    "read_calibration",
    "write_calibration",
]

logger = logging.getLogger(__name__)

CALIBRATION_FORMAT = "robot_latency.calibration/1"

#: Engine families a calibration is fitted for; the id is what --engine-family takes.
ENGINE_FAMILIES: dict[str, str] = {
    "llamacpp-cuda": "llama.cpp with every layer on an NVIDIA GPU",
    "llamacpp-cpu": "llama.cpp on the CPU",
    "mlc": "MLC LLM (TVM-compiled kernels)",
    "tensorrt": "TensorRT-LLM / TensorRT Edge-LLM",
    "ort-cuda": "ONNX Runtime, CUDA execution provider",
    "ort-cpu": "ONNX Runtime, CPU execution provider",
    "vllm": "vLLM",
}

#: Fraction of the compute peak a prefill reaches when no prefill measurement calibrates it.
DEFAULT_COMPUTE_EFFICIENCY = 0.3

#: Relative half-width of the interval when the fit has too few points to measure its spread.
DEFAULT_SPREAD_REL = 0.15


def check_engine_family(name: str) -> str:
    """Return the engine family id for ``name``; raise CalibrationError listing the known ones."""
    key = name.strip().lower()
    if key not in ENGINE_FAMILIES:
        raise CalibrationError(f"unknown engine family {name!r}; known families: "
                               f"{', '.join(ENGINE_FAMILIES)}")
    return key


@dataclass(frozen=True)
class DecodePoint:
    """One measured decode rate next to its floor: a row of the table or one run."""

    label: str
    device_id: str
    model: str
    floor_ms: float
    measured_ms: float
    #: the step's FLOPs at the device's peak (0: unknown); see ``Calibration.compute_ratio``
    compute_ms: float = 0.0


@dataclass(frozen=True)
class PrefillPoint:
    """One measured prefill next to its compute floor (at the device's compute figure)."""

    label: str
    compute_floor_ms: float
    measured_ms: float


@dataclass(frozen=True)
class Calibration:
    """What a prediction needs from a fit, and where the numbers come from.

    ``scope`` is ``device`` (fitted on this device's points) or ``family`` (pooled over the
    family's devices, each point against its own device's floor: the overhead is assumed to
    carry over). ``interval_rel`` is (lo, hi): the prediction's interval is
    ``[pred * (1 + lo), pred * (1 + hi)]``, from the leave-one-out errors of the fit's points.

    ``sources`` are the sources of the rows the decode terms rest on; ``set_aside`` the flagged
    sources kept out of this device's answer (:mod:`robot_latency.floor.published_sources`).
    ``prefill_calibrated`` is False where no prefill measurement of the engine family exists:
    the compute efficiency is then a default, and every answer says ``prefill uncalibrated``.
    ``prefill_interval_rel`` is the TTFT interval's (lo, hi), None without one.
    """

    engine_family: str
    device_id: str
    scope: str
    efficiency: float
    overhead_ms: float
    overhead_fixed: bool
    interval_rel: tuple[float, float]
    compute_efficiency: float
    prefill_overhead_ms: float
    prefill_calibrated: bool
    source: str
    basis: tuple[str, ...]
    residuals_rel: tuple[float, ...] = ()
    notes: tuple[str, ...] = field(default=())
    sources: tuple[str, ...] = ()
    set_aside: tuple[str, ...] = ()
    prefill_scope: str | None = None
    prefill_basis: tuple[str, ...] = ()
    prefill_interval_rel: tuple[float, float] | None = None
    prefill_notes: tuple[str, ...] = ()
    #: How far below the compute peak a decode step's arithmetic runs, next to its bytes: the
    #: step is ``max(bytes floor, compute_ratio * FLOPs at peak) / efficiency + overhead``
    #: (0: bandwidth only). Fitted per engine family and module family on sources that measured
    #: one model in several power modes (robot_latency.floor.published_modes).
    compute_ratio: float = 0.0
    #: The distinct sources behind the device's answer: the sources of the family's rows on
    #: the device (flagged ones set aside), else those of the rows the fit rests on; and the
    #: share each side of the decode interval was widened by because there is only one
    #: (the family's leave-one-source-out error; robot_latency.floor.published_support).
    answer_sources: tuple[str, ...] = ()
    source_widening_rel: float = 0.0
    #: The same for the TTFT answer: the distinct sources of the family's prefill rows on the
    #: device, else those of the prefill rows its fit rests on; and the share each side of the
    #: TTFT interval was widened by because there is only one (the family's prefill
    #: leave-one-source-out error).
    prefill_sources: tuple[str, ...] = ()
    prefill_source_widening_rel: float = 0.0

    def decode_floor_ms(self, floor_ms: float, compute_ms: float | None) -> float:
        """Return the floor a step's prediction scales: the bytes floor or, where the mode's
        compute caps it harder, ``compute_ratio`` times the FLOPs at its peak."""
        return max(floor_ms, self.compute_ratio * (compute_ms or 0.0))

    @property
    def prefill_status(self) -> str:
        """One line: where the prefill terms come from (``prefill uncalibrated`` without any)."""
        if not self.prefill_calibrated:
            return (f"prefill uncalibrated: default compute efficiency "
                    f"{self.compute_efficiency:g}, no prefill measurement of {self.engine_family}")
        where = f", {self.prefill_scope} scope" if self.prefill_scope else ""
        basis = f" on {len(self.prefill_basis)} rows" if self.prefill_basis else ""
        return f"prefill calibrated{basis}{where}"

    def describe(self) -> dict[str, Any]:
        """Return the ``calibration`` entry of a prediction: what the numbers come from."""
        return {
            "engine_family": self.engine_family,
            "device_id": self.device_id,
            "scope": self.scope,
            "source": self.source,
            "basis": list(self.basis),
            "overhead_fixed": self.overhead_fixed,
            "interval_rel": list(self.interval_rel),
            "prefill": self.prefill_status,
            "prefill_calibrated": self.prefill_calibrated,
            "prefill_interval_rel": (None if self.prefill_interval_rel is None
                                     else list(self.prefill_interval_rel)),
            "prefill_basis": list(self.prefill_basis),
            "sources": list(self.sources),
            "set_aside": list(self.set_aside),
            "decode_compute_ratio": self.compute_ratio,
            "answer_sources": list(self.answer_sources),
            "source_count": len(self.answer_sources),
            "source_widening_rel": self.source_widening_rel,
            "prefill_source_count": len(self.prefill_sources),
            "prefill_source_widening_rel": self.prefill_source_widening_rel,
            "notes": [*self.notes, *self.prefill_notes],
        }

    def to_dict(self) -> dict[str, Any]:
        """Return the calibration file's content."""
        return {
            "format": CALIBRATION_FORMAT,
            "engine_family": self.engine_family,
            "device_id": self.device_id,
            "scope": self.scope,
            "decode": {"efficiency": self.efficiency, "overhead_ms": self.overhead_ms,
                       "overhead_fixed": self.overhead_fixed,
                       "interval_rel": list(self.interval_rel),
                       "residuals_rel": list(self.residuals_rel)},
            "prefill": {"compute_efficiency": self.compute_efficiency,
                        "overhead_ms": self.prefill_overhead_ms,
                        "calibrated": self.prefill_calibrated,
                        "interval_rel": (None if self.prefill_interval_rel is None
                                         else list(self.prefill_interval_rel))},
            "source": self.source,
            "basis": list(self.basis),
            "notes": list(self.notes),
        }


def _interval(floors_ms: Sequence[float], measured_ms: Sequence[float],
              fit: TwoTermFit) -> tuple[float, float]:
    """Return (lo, hi) relative bounds: measured / predicted - 1 over the points' LOO errors.

    A measurement m predicted at p has m = p * (1 + r) with r = m / p - 1; the interval covers
    every point's r. Fewer than three points give no out-of-sample errors: the default spread.
    """
    rs: list[float] = []
    if len(floors_ms) >= 3:
        for err in leave_one_out(floors_ms, measured_ms):
            if err is not None:
                rs.append(1.0 / (1.0 + err) - 1.0)  # err = p/m - 1  ->  m/p - 1
    if not rs:
        rs = [-DEFAULT_SPREAD_REL, DEFAULT_SPREAD_REL, *fit.residuals_rel]
    return (min(0.0, *rs), max(0.0, *rs))


def calibrate_points(points: Sequence[DecodePoint], *, engine_family: str, device_id: str,
                     scope: str, source: str, fixed_overhead_ms: float | None = None,
                     prefill: Sequence[PrefillPoint] = (),
                     notes: Sequence[str] = (), quiet: bool = False) -> Calibration:
    """Fit a calibration from decode points (and prefill points, where there are some).

    ``quiet`` keeps a held overhead out of the log (it is still in the notes): the published
    table's leave-one-out fits hold it by design.

    Raises:
        CalibrationError: no points, or a single model size without ``fixed_overhead_ms``.
    """
    family = check_engine_family(engine_family)
    if not points:
        raise CalibrationError(f"no decode points for engine family {family!r} on {device_id!r}")
    floors = [p.floor_ms for p in points]
    measured = [p.measured_ms for p in points]
    fit = fit_two_term(floors, measured, fixed_overhead_ms=fixed_overhead_ms)
    all_notes = list(notes)
    if fixed_overhead_ms is not None:
        msg = (f"one model size: overhead held at {fixed_overhead_ms:g} ms, efficiency fitted "
               "alone")
        (logger.debug if quiet else logger.warning)("%s (%s on %s)", msg, family, device_id)
        all_notes.append(msg)
    # without prefill points the prefill overhead is not the decode one (a decode step's fixed
    # cost says nothing about a prompt pass): 0, and the answer says "prefill uncalibrated"
    ce, p_overhead, p_cal = DEFAULT_COMPUTE_EFFICIENCY, 0.0, False
    p_interval: tuple[float, float] | None = None
    if prefill:
        pf = [p.compute_floor_ms for p in prefill]
        pm = [p.measured_ms for p in prefill]
        try:
            pfit = fit_two_term(pf, pm)
        except CalibrationError as err:
            # One prompt length (or one model size): the compute efficiency absorbs it all.
            logger.debug("prefill: %s; holding its overhead at 0", err)
            pfit = fit_two_term(pf, pm, fixed_overhead_ms=0.0)
            all_notes.append("prefill from one size: its overhead held at 0 ms")
        ce, p_overhead, p_cal = pfit.efficiency, pfit.overhead_ms, True
        # the TTFT interval from the prefill points' own leave-one-out errors, as for decode
        p_interval = _interval(pf, pm, pfit)
    return Calibration(
        engine_family=family, device_id=device_id, scope=scope, efficiency=fit.efficiency,
        overhead_ms=fit.overhead_ms, overhead_fixed=fit.overhead_fixed,
        interval_rel=_interval(floors, measured, fit), compute_efficiency=ce,
        prefill_overhead_ms=p_overhead, prefill_calibrated=p_cal, source=source,
        basis=tuple(p.label for p in points), residuals_rel=fit.residuals_rel,
        notes=tuple(all_notes), prefill_basis=tuple(p.label for p in prefill),
        prefill_interval_rel=p_interval)


def write_calibration(cal: Calibration, path: str | Path) -> None:
    """Write a calibration file (JSON)."""
    Path(path).write_text(json.dumps(cal.to_dict(), indent=2) + "\n", encoding="utf-8")


def _number(path: Path, key: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CalibrationError(f"{path}: field {key!r} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise CalibrationError(f"{path}: field {key!r} must be {'> 0' if positive else '>= 0'}, "
                               f"got {value!r}")
    return float(value)


def _section(path: Path, doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise CalibrationError(f"{path}: field {key!r} must be an object, got {value!r}")
    return value


def read_calibration(path: str | Path, *, engine_family: str | None = None,
                     device_id: str | None = None) -> Calibration:
    """Read a calibration file; check its shape and, if given, its family and device.

    Raises:
        CalibrationError: a file that cannot be read, is not a calibration, has a field of the
            wrong type, or was fitted for another engine family or device (naming both).
    """
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise CalibrationError(f"{p}: cannot read calibration ({err.strerror or err})") from err
    except ValueError as err:
        raise CalibrationError(f"{p}: not a JSON calibration file ({err})") from err
    if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CalibrationError(f"{p}: not a calibration file (format {got!r}, expected "
                               f"{CALIBRATION_FORMAT!r})")
    decode, prefill = _section(p, doc, "decode"), _section(p, doc, "prefill")
    family = doc.get("engine_family")
    if not isinstance(family, str):
        raise CalibrationError(f"{p}: field 'engine_family' must be a string, got {family!r}")
    family = check_engine_family(family)
    device = doc.get("device_id")
    if not isinstance(device, str) or not device:
        raise CalibrationError(f"{p}: field 'device_id' must be a device id, got {device!r}")
    if engine_family is not None and check_engine_family(engine_family) != family:
        raise CalibrationError(f"{p}: fitted for engine family {family!r}, not {engine_family!r}")
    if device_id is not None and device_id != device:
        raise CalibrationError(f"{p}: fitted for device {device!r}, not {device_id!r}; "
                               "calibrate on the target device")
    interval = decode.get("interval_rel")
    if (not isinstance(interval, list) or len(interval) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       for v in interval) or not interval[0] <= 0 <= interval[1]):
        raise CalibrationError(f"{p}: field 'decode.interval_rel' must be [lo <= 0, hi >= 0], "
                               f"got {interval!r}")
    basis = doc.get("basis", [])
    notes = doc.get("notes", [])
    if not isinstance(basis, list) or not isinstance(notes, list):
        raise CalibrationError(f"{p}: fields 'basis' and 'notes' must be lists")
    residuals = decode.get("residuals_rel", [])
    if not isinstance(residuals, list):
        raise CalibrationError(f"{p}: field 'decode.residuals_rel' must be a list")
    return Calibration(
        engine_family=family, device_id=device, scope=str(doc.get("scope", "device")),
        efficiency=_number(p, "decode.efficiency", decode.get("efficiency")),
        overhead_ms=_number(p, "decode.overhead_ms", decode.get("overhead_ms"), positive=False),
        overhead_fixed=bool(decode.get("overhead_fixed", False)),
        interval_rel=(float(interval[0]), float(interval[1])),
        compute_efficiency=_number(p, "prefill.compute_efficiency",
                                   prefill.get("compute_efficiency")),
        prefill_overhead_ms=_number(p, "prefill.overhead_ms", prefill.get("overhead_ms"),
                                    positive=False),
        prefill_calibrated=bool(prefill.get("calibrated", False)),
        prefill_interval_rel=_interval_or_none(p, prefill.get("interval_rel")),
        source=f"{doc.get('source', 'file')} ({p})", basis=tuple(str(b) for b in basis),
        residuals_rel=tuple(float(r) for r in residuals), notes=tuple(str(n) for n in notes))


def _interval_or_none(path: Path, value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            or not value[0] <= 0 <= value[1]):
        raise CalibrationError(f"{path}: field 'prefill.interval_rel' must be [lo <= 0, hi >= 0] "
                               f"or null, got {value!r}")
    return (float(value[0]), float(value[1]))


def median_abs(values: Sequence[float]) -> float:
    """Return the median of the absolute values."""
    return statistics.median(abs(v) for v in values)
