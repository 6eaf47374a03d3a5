"""``predict --power-modes all``: the prediction in every nvpmodel mode of the device's module.

Each mode is a datasheet of its own (robot_latency.floor.power_modes): its bandwidth from the
EMC cap, its compute from the TPCs and GPU clock it leaves; each gets its own calibration (a
mode without published rows is fitted on the module's other modes, the compute ratio applied).
"""

from __future__ import annotations

import argparse
from typing import Any

from robot_latency.cli.common import UsageError, echo, emit_json
from robot_latency.cli.predict_energy import energy_answer
from robot_latency.floor.devices import DeviceSheet, get_device, power_modes_of
from robot_latency.floor.modelinfo import resolve_model
from robot_latency.floor.target import (
    TargetPrediction,
    adjust_for_model,
    predict_target,
    resolve_calibration,
    with_published_size,
)

__all__ = ["add_power_mode_args", "cmd_predict_power_modes"]


def add_power_mode_args(p: argparse.ArgumentParser) -> None:
    """Add ``--power-modes`` to the ``predict`` parser."""
    p.add_argument("--power-modes", choices=["all"], default=None,
                   help="answer for every nvpmodel power mode of --device's module")


def _predict_mode(args: argparse.Namespace, sheet: DeviceSheet, path: str,
                  quant: str | None, preset: str | None) -> TargetPrediction:
    model = resolve_model(path, quant=quant)
    if not args.calibration:
        model, _ = with_published_size(path, model, device_id=sheet.id)
    cal = resolve_calibration(args.engine_family, sheet, calibration=args.calibration)
    pred = predict_target(model, sheet, cal, context_tokens=args.context,
                          prompt_tokens=args.prompt_tokens)
    if not args.calibration:
        pred, _ = adjust_for_model(pred, cal, preset)
    return pred


def mode_caps(sheet: DeviceSheet) -> dict[str, Any]:
    """Return the caps of one mode as the answer lists them."""
    return {"device_id": sheet.id, "power_mode": sheet.power_mode,
            "nvpmodel_id": sheet.nvpmodel_id, "bandwidth_gbps": sheet.bandwidth_gbps,
            "emc_max_mhz": sheet.emc_max_mhz, "gpu_max_mhz": sheet.gpu_max_mhz,
            "gpu_tpcs": sheet.gpu_tpcs, "cpu_cores": sheet.cpu_cores,
            "cpu_max_mhz": sheet.cpu_max_mhz, "fp16_tflops": sheet.fp16_tflops,
            "source": sheet.source}


def cmd_predict_power_modes(args: argparse.Namespace, path: str, quant: str | None,
                            preset: str | None) -> int:
    """Print the prediction for every power mode of ``args.device``'s module."""
    if args.calibration:
        raise UsageError("--power-modes predicts from the published table; a --calibration "
                         "file is fitted for one device")
    sheets = power_modes_of(get_device(args.device).id)
    answers = []
    for sheet in sheets:
        pred = _predict_mode(args, sheet, path, quant, preset)
        answers.append((sheet, pred))
    energy = [energy_answer(args, p) for _, p in answers]
    if args.json:
        emit_json({"device": args.device, "modes": [
            {**mode_caps(s), "prediction": p.to_dict(), "energy": e}
            for (s, p), e in zip(answers, energy, strict=True)]})
        return 0
    first, module = answers[0][1], sheets[0].module or sheets[0].id
    echo(f"{first.model_name} ({first.quant or '-'}), {first.engine_family}, "
         f"{first.context_tokens} tokens of context, every power mode of {module}")
    echo(f"{'device':26} {'mode':10} {'GB/s':>6} {'GPU MHz':>7} {'TPCs':>4} {'CPUs':>4} "
         f"{'ITL ms':>7} {'80% interval':>15} {'src':>3} {'bound':9} {'scope':7} "
         f"{'mJ/token':>9} {'src':>3}")
    for (s, p), e in zip(answers, energy, strict=True):
        lo, hi = p.itl_pred_interval_ms
        mj = ("uncalibrated" if e["j_per_output_token"] is None
              else f"{1e3 * e['j_per_output_token']:9.1f}")
        mj_src = "-" if e["j_per_output_token"] is None else len(e["power"]["sources"])
        echo(f"{s.id:26} {s.power_mode or '-':10} {s.bandwidth_gbps:6.1f} "
             f"{s.gpu_max_mhz or 0:7.0f} {s.gpu_tpcs or 0:4d} {s.cpu_cores or 0:4d} "
             f"{p.itl_pred_ms:7.2f} {f'[{lo:.1f}, {hi:.1f}]':>15} "
             f"{p.calibration['source_count']:>3} {p.decode_bound:9} "
             f"{p.calibration['scope']:7} {mj:>9} {mj_src:>3}")
    echo("caps: nvpmodel POWER_MODEL blocks (robot-latency devices --json for each source); "
         "src: the number of sources each figure rests on (an interval on one source is "
         "widened by its family's leave-one-source-out error)")
    return 0
