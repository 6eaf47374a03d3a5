"""Predictions for a device the user does not have: the calibrated two-term model.

``predict_target`` puts a model on a device under an engine family's calibration::

    itl_pred_ms  = max(itl_floor_ms, compute_ratio * FLOPs at peak) / efficiency + overhead_ms
    ttft_pred_ms = compute_floor_ms / compute_efficiency + prefill_overhead_ms

where ``itl_floor_ms`` is the bandwidth floor (bytes per step / bandwidth) and
``compute_floor_ms`` is ``2 * params * prompt_tokens`` at the device's compute figure. The floors
are reported beside the predictions and a prediction never goes below its floor: the TTFT's is
``max(weights read once, prompt compute)`` (``predict.ttft_floor``), and each interval's low end
is clamped at its floor. A calibration without prefill measurements says ``prefill uncalibrated``
in every answer (``prefill_status``). docs/REFERENCE.md, "Predictions: two terms, calibrated".
From the published table, a model the same source measured in other power modes is moved by its
own rows there (``adjust_for_model``), with the interval of predictions made that way.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from robot_latency.floor.calibration import Calibration, check_engine_family, read_calibration
from robot_latency.floor.calstore import CachedCalibration, cached_table_calibration
from robot_latency.floor.devices import DeviceSheet, get_device
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import ModelFacts, resolve_model
from robot_latency.floor.predict import predict_floor, prefill_params, ttft_floor
from robot_latency.floor.published import (
    INTERVAL_COVERAGE,
    ModelAdjustment,
    NearRow,
    family_interval,
    load_table,
    model_adjustment,
    nearest_rows,
    published_file_bytes,
    scale_to_file,
)

__all__ = [
    "PublishedPrediction",
    "TargetPrediction",
    "adjust_for_model",
    "predict_target",
    "predict_with_interval",
    "resolve_calibration",
    "resolve_calibration_noted",
    "with_published_size",
]

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
    ttft_floor_ms: float | None = None
    ttft_pred_interval_ms: tuple[float, float] | None = None
    prefill_calibrated: bool = False
    prefill_status: str = ""
    #: ``compute`` where the mode's compute (``compute_ratio`` x FLOPs at its peak) sets the
    #: prediction's floor, ``bandwidth`` where the bytes do
    decode_bound: str = "bandwidth"

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (intervals as ``[lo, hi]``)."""
        out = asdict(self)
        out["itl_pred_interval_ms"] = list(self.itl_pred_interval_ms)
        if self.ttft_pred_interval_ms is not None:
            out["ttft_pred_interval_ms"] = list(self.ttft_pred_interval_ms)
        return out


def resolve_calibration(engine_family: str, device: DeviceSheet, *,
                        calibration: str | Path | None = None) -> Calibration:
    """Return the calibration to predict with: a file if given, else the published table's.

    Raises:
        CalibrationError: an unknown family, a file of the wrong shape or for another device or
            family, or a family the table cannot calibrate.
    """
    return resolve_calibration_noted(engine_family, device, calibration=calibration)[0]


def resolve_calibration_noted(engine_family: str, device: DeviceSheet, *,
                              calibration: str | Path | None = None
                              ) -> tuple[Calibration, CachedCalibration | None]:
    """:func:`resolve_calibration`, and how the table's answer was had (the calibration cache,
    :mod:`robot_latency.floor.calstore`; None: a file was given).

    Raises:
        CalibrationError: as :func:`resolve_calibration`.
    """
    family = check_engine_family(engine_family)
    if calibration is not None and str(calibration):
        return read_calibration(calibration, engine_family=family, device_id=device.id), None
    got = cached_table_calibration(family, device)
    return got.calibration, got


def predict_target(model: ModelFacts, device: DeviceSheet, cal: Calibration, *,
                   context_tokens: int = 0, prompt_tokens: int | None = None,
                   cached_prefix_tokens: int = 0) -> TargetPrediction:
    """Predict ITL (and TTFT, given a prompt length) of ``model`` on ``device`` under ``cal``.

    Args:
        model: the model's facts.
        device: the target device's datasheet.
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
    itl = (cal.decode_floor_ms(floor.itl_floor_ms, floor.itl_compute_floor_ms) / cal.efficiency
           + cal.overhead_ms)
    lo = max(floor.itl_floor_ms, itl * (1.0 + cal.interval_rel[0]))
    hi = itl * (1.0 + cal.interval_rel[1])
    ttft: float | None = None
    ttft_floor_ms: float | None = None
    ttft_interval: tuple[float, float] | None = None
    if uncached is not None and device.peak_flops:
        compute_floor_ms = 2.0 * prefill_params(model) * uncached / device.peak_flops * 1e3
        ttft_floor_ms = ttft_floor(model, device, uncached).floor_ms
        ttft = max(ttft_floor_ms,
                   compute_floor_ms / cal.compute_efficiency + cal.prefill_overhead_ms)
        if cal.prefill_interval_rel is not None:
            t_lo, t_hi = cal.prefill_interval_rel
            ttft_interval = (max(ttft_floor_ms, ttft * (1.0 + t_lo)), ttft * (1.0 + t_hi))
    return TargetPrediction(
        device_id=device.id, model_name=model.name, quant=model.quant,
        engine_family=cal.engine_family, context_tokens=context_tokens,
        prompt_tokens=prompt_tokens, itl_floor_ms=floor.itl_floor_ms, itl_pred_ms=itl,
        itl_pred_interval_ms=(lo, hi), ttft_pred_ms=ttft,
        prefill_floor_ms=floor.prefill_floor_ms, efficiency=cal.efficiency,
        overhead_ms=cal.overhead_ms, compute_efficiency=cal.compute_efficiency,
        prefill_overhead_ms=cal.prefill_overhead_ms, calibration=cal.describe(),
        ttft_floor_ms=ttft_floor_ms, ttft_pred_interval_ms=ttft_interval,
        prefill_calibrated=cal.prefill_calibrated, prefill_status=cal.prefill_status,
        decode_bound=("compute" if cal.decode_floor_ms(floor.itl_floor_ms,
                                                       floor.itl_compute_floor_ms)
                      > floor.itl_floor_ms else floor.decode_bound))


def adjust_for_model(pred: TargetPrediction, cal: Calibration, model_id: str | None, *,
                     adjustment: ModelAdjustment | None = None
                     ) -> tuple[TargetPrediction, ModelAdjustment | None]:
    """Move a published-table prediction by the model's own rows in the source's other setups.

    ``model_id`` is the preset id (a file or config.json path matches no row and changes
    nothing). Where rows move it, the point is scaled by ``ModelAdjustment.factor`` and the
    interval becomes that of predictions made the same way (``family_interval`` with
    ``model_seen``); otherwise the prediction is returned unchanged, with the interval of a model
    the table has not measured. ``adjustment``: the one this function returned before for the
    same calibration and model (a step predictor keeps it: it is the same for every step).
    """
    if model_id is None or cal.scope != "setup" or cal.source != "published table":
        return pred, None
    # the setup table_calibration fitted on this device (the best-documented one)
    adj = adjustment if adjustment is not None else \
        model_adjustment(cal.engine_family, cal.device_id, model_id)
    if not adj.seen:
        return pred, adj
    itl = pred.itl_pred_ms * adj.factor
    lo_rel, hi_rel = family_interval(cal.engine_family, model_seen=True)
    if cal.source_widening_rel:  # one source: widened as the device's own interval is
        lo_rel, hi_rel = max(-0.99, lo_rel - cal.source_widening_rel), \
            hi_rel + cal.source_widening_rel
    interval = (max(pred.itl_floor_ms, itl * (1.0 + lo_rel)), itl * (1.0 + hi_rel))
    return replace(pred, itl_pred_ms=itl, itl_pred_interval_ms=interval), adj


@dataclass(frozen=True)
class PublishedPrediction:
    """A decode step predicted from the published table: point, 80% interval, and the rows behind.

    ``itl_interval_ms`` holds the published figure of about 80% of the family's rows when each is
    predicted without itself (``robot-latency predict --validate`` reports the share that does);
    its low end is never below the floor. ``nearest_rows`` are the family's rows on the same
    device nearest in bytes per step (on any device where this one has none).
    """

    device_id: str
    engine_family: str
    model_name: str
    quant: str | None
    context_tokens: int
    itl_pred_ms: float
    itl_interval_ms: tuple[float, float]
    interval_coverage: float
    itl_floor_ms: float
    scope: str
    basis: tuple[str, ...]
    nearest_rows: tuple[NearRow, ...]
    notes: tuple[str, ...]
    model_factor: float = 1.0
    model_basis: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        out = asdict(self)
        out["itl_interval_ms"] = list(self.itl_interval_ms)
        out["nearest_rows"] = [r.to_dict() for r in self.nearest_rows]
        return out


def with_published_size(spec: str, model: ModelFacts, *,
                        device_id: str | None = None) -> tuple[ModelFacts, tuple[str, ...]]:
    """Return a preset's facts scaled to the GGUF size a published row states, with a note.

    Only a preset (``model.source == "preset"``) is scaled, and only where the table states the
    size of that preset at that quant; a file or config.json's facts are returned unchanged.
    """
    if model.source != "preset" or not model.quant:
        return model, ()
    stated = published_file_bytes(spec, model.quant, device_id=device_id)
    if stated is None:
        return model, ()
    return scale_to_file(model, stated[0]), (
        f"weight bytes from the GGUF size published row {stated[1]} states "
        f"({stated[0] / 1e6:.0f} MB; the preset's bits per weight would count "
        f"{model.weight_bytes_total / 1e6:.0f} MB)",)


def predict_with_interval(device: str | DeviceSheet, engine_family: str,
                          model: str | ModelFacts, quant: str | None = None, *,
                          context_tokens: int = 0) -> PublishedPrediction:
    """Predict the decode step of ``model`` on ``device`` under ``engine_family`` from the table.

    Args:
        device: a device id (``robot-latency devices``) or datasheet.
        engine_family: e.g. ``llamacpp-cuda``.
        model: a preset id, a GGUF or Hugging Face config.json path, or its facts.
        quant: the quant of a preset or config.json (default Q4_K_M); None for a GGUF file.
        context_tokens: tokens in the KV cache while decoding.

    Returns:
        The point prediction, its 80% interval, and the published rows it leans on.

    Raises:
        FloorError: an unknown device, family or model, a refused architecture, or a family the
            table cannot calibrate (each named in the message).
    """
    dev = get_device(device) if isinstance(device, str) else device
    prof = resolve_model(model, quant=quant) if isinstance(model, str) else model
    notes: tuple[str, ...] = ()
    if isinstance(model, str):
        prof, notes = with_published_size(model, prof, device_id=dev.id)
    cal = cached_table_calibration(check_engine_family(engine_family), dev).calibration
    pred = predict_target(prof, dev, cal, context_tokens=context_tokens)
    pred, adj = adjust_for_model(pred, cal, model if isinstance(model, str) else None)
    near = nearest_rows(cal.engine_family, dev.id, prof.weight_bytes_per_step,
                        rows=load_table())
    adj_note = () if adj is None or adj.note() is None else (adj.note(),)
    return PublishedPrediction(
        device_id=dev.id, engine_family=cal.engine_family, model_name=prof.name,
        quant=prof.quant, context_tokens=context_tokens, itl_pred_ms=pred.itl_pred_ms,
        itl_interval_ms=pred.itl_pred_interval_ms, interval_coverage=INTERVAL_COVERAGE,
        itl_floor_ms=pred.itl_floor_ms, scope=cal.scope, basis=cal.basis,
        nearest_rows=tuple(near), notes=(*notes, *cal.notes, *adj_note),
        model_factor=1.0 if adj is None else adj.factor,
        model_basis=() if adj is None else adj.basis)
