"""Predictions for a device the user does not have: the calibrated two-term model.

``predict_target`` puts a model on a device under an engine family's calibration::

    itl_pred_ms  = itl_floor_ms / efficiency + overhead_ms
    ttft_pred_ms = compute_floor_ms / compute_efficiency + prefill_overhead_ms

where ``itl_floor_ms`` is the bandwidth floor (bytes per step / bandwidth) and
``compute_floor_ms`` is ``2 * params * prompt_tokens`` at the device's compute figure. The floor is
reported beside the prediction and is never raised by it: the interval's low end is clamped at
the floor. docs/REFERENCE.md, "Predictions: two terms, calibrated".
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from robot_latency.floor.calibration import Calibration, check_engine_family, read_calibration
from robot_latency.floor.devices import HardwareProfile
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import ModelProfile
from robot_latency.floor.predict import predict_floor, prefill_params
from robot_latency.floor.published import table_calibration

__all__ = ["TargetPrediction", "predict_target", "resolve_calibration"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TargetPrediction:
    """A calibrated prediction for one model on one device under one engine family."""

    device_id: str
    model_name: str
    quant: str | None
    engine_family: str
    context_tokens: int
    prompt_tokens: int | None
    itl_floor_ms: float
    itl_pred_ms: float
    itl_pred_interval_ms: tuple[float, float]
    ttft_pred_ms: float | None
    prefill_floor_ms: float | None
    efficiency: float
    overhead_ms: float
    compute_efficiency: float
    prefill_overhead_ms: float
    calibration: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (``itl_pred_interval_ms`` as ``[lo, hi]``)."""
        out = asdict(self)
        out["itl_pred_interval_ms"] = list(self.itl_pred_interval_ms)
        return out


def resolve_calibration(engine_family: str, device: HardwareProfile, *,
                        calibration: str | Path | None = None) -> Calibration:
    """Return the calibration to predict with: a file if given, else the published table's.

    Raises:
        CalibrationError: an unknown family, a file of the wrong shape or for another device or
            family, or a family the table cannot calibrate.
    """
    family = check_engine_family(engine_family)
    if calibration is not None and str(calibration):
        return read_calibration(calibration, engine_family=family, device_id=device.id)
    return table_calibration(family, device.id)


def predict_target(model: ModelProfile, device: HardwareProfile, cal: Calibration, *,
                   context_tokens: int = 0, prompt_tokens: int | None = None,
                   cached_prefix_tokens: int = 0) -> TargetPrediction:
    """Predict ITL (and TTFT, given a prompt length) of ``model`` on ``device`` under ``cal``.

    Args:
        model: the model's profile.
        device: the target device's profile.
        cal: the engine family's calibration for that device.
        context_tokens: tokens already in the KV cache during decode.
        prompt_tokens: prompt length for the TTFT prediction (None: no TTFT).
        cached_prefix_tokens: prompt tokens served from a prefix cache (not prefilled).

    Raises:
        FloorError: a value out of range, or a calibration fitted for another device.
    """
    if cal.device_id != device.id:
        raise FloorError(f"calibration is for device {cal.device_id!r}, not {device.id!r}")
    uncached = None if prompt_tokens is None else max(0, prompt_tokens - cached_prefix_tokens)
    floor = predict_floor(model, device, context_tokens=context_tokens,
                          prompt_tokens=uncached if device.peak_flops else None)
    itl = floor.itl_floor_ms / cal.efficiency + cal.overhead_ms
    lo = max(floor.itl_floor_ms, itl * (1.0 + cal.interval_rel[0]))
    hi = itl * (1.0 + cal.interval_rel[1])
    ttft: float | None = None
    if uncached is not None and device.peak_flops:
        compute_floor_ms = 2.0 * prefill_params(model) * uncached / device.peak_flops * 1e3
        ttft = compute_floor_ms / cal.compute_efficiency + cal.prefill_overhead_ms
        if floor.prefill_floor_ms is not None:
            ttft = max(ttft, floor.prefill_floor_ms)
    return TargetPrediction(
        device_id=device.id, model_name=model.name, quant=model.quant,
        engine_family=cal.engine_family, context_tokens=context_tokens,
        prompt_tokens=prompt_tokens, itl_floor_ms=floor.itl_floor_ms, itl_pred_ms=itl,
        itl_pred_interval_ms=(lo, hi), ttft_pred_ms=ttft,
        prefill_floor_ms=floor.prefill_floor_ms, efficiency=cal.efficiency,
        overhead_ms=cal.overhead_ms, compute_efficiency=cal.compute_efficiency,
        prefill_overhead_ms=cal.prefill_overhead_ms, calibration=cal.describe())
