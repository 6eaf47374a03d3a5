"""The ``predict`` and ``calibrate`` commands: calibrated predictions for a device you do not have.

``predict`` puts a model on a device under an engine family's calibration (the published table's,
or a file from ``calibrate``); ``predict --validate`` predicts every row of the published table
from a fit without it. ``calibrate`` fits a calibration file from run directories.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from robot_latency.cli.common import UsageError, echo, emit_json, nonneg_int
from robot_latency.cli.predict_vision import (
    add_vision_args,
    echo_vision,
    vision_answer,
    vision_json,
    wants_vision,
)
from robot_latency.floor.calibration import ENGINE_FAMILIES, write_calibration
from robot_latency.floor.devices import get_device
from robot_latency.floor.modelinfo import facts_manual, resolve_model
from robot_latency.floor.published import (
    INTERVAL_COVERAGE,
    load_table,
    nearest_rows,
    validate_table,
)
from robot_latency.floor.published_checks import device_stability, validate_prefill
from robot_latency.floor.published_support import leave_one_source_out_coverage
from robot_latency.floor.published_vision import validate_vision
from robot_latency.floor.runs import calibrate_runs
from robot_latency.floor.target import (
    adjust_for_model,
    predict_target,
    resolve_calibration,
    with_published_size,
)
from robot_latency.planner.config import DEFAULT_TARGET_DEVICE
from robot_latency.report.table import fmt, n_sources

__all__ = ["register"]


def cmd_predict(args: argparse.Namespace) -> int:
    """Print a calibrated prediction, or the table's leave-one-out validation."""
    if args.validate:
        return _validate(args)
    if args.stream is not None:
        return _predict_stream(args)
    for flag, value in (("--image-policy", args.image_policy),
                        ("--max-frame-age-ms", args.max_frame_age_ms),
                        ("--fit-scales", args.fit_scales)):
        if value is not None:
            raise UsageError(f"{flag}: only with --stream FILE (the loop simulated on the "
                             "target)")
    path, quant = _model_and_quant(args.model, args.quant)
    if getattr(args, "power_modes", None):
        return _predict_power_modes(args, path, quant)
    want_vision = wants_vision(args)
    device = get_device(args.device)
    model = resolve_model(path, quant=quant)
    from_table = not args.calibration
    model_notes: tuple[str, ...] = ()
    if from_table:
        model, model_notes = with_published_size(path, model, device_id=device.id)
    cal = resolve_calibration(args.engine_family, device, calibration=args.calibration)
    pred = predict_target(model, device, cal, context_tokens=args.context,
                          prompt_tokens=args.prompt_tokens)
    adj = None
    if from_table:
        pred, adj = adjust_for_model(pred, cal, _preset_of(path))
        if adj is not None and adj.note() is not None:
            model_notes = (*model_notes, str(adj.note()))
    near = (nearest_rows(cal.engine_family, device.id, model.weight_bytes_per_step)
            if from_table else [])
    vision = vision_answer(args, model, device, cal) if want_vision else None
    if args.json:
        out = pred.to_dict()
        out["interval_coverage"] = INTERVAL_COVERAGE if from_table else None
        out["nearest_rows"] = [r.to_dict() for r in near]
        out["model_notes"] = list(model_notes)
        out["model_adjustment"] = None if adj is None else adj.to_dict()
        out["energy"] = _energy(args, pred)
        out["source_counts"] = _source_counts(cal, out["energy"]) if from_table else None
        out["vision"] = vision_json(vision)
        emit_json(out)
        return 0
    lo, hi = pred.itl_pred_interval_ms
    echo(f"{pred.model_name} ({pred.quant or '-'}) on {pred.device_id}, "
         f"{pred.engine_family}, {pred.context_tokens} tokens of context")
    seen = adj is not None and adj.seen
    how = "out errors of models measured in other setups" if seen else "model-out errors"
    span = (f"{100 * INTERVAL_COVERAGE:.0f}% interval, {_rests(cal)}from the family's "
            f"leave-one-{how}" if from_table else "interval from the calibration's own points")
    echo(f"  ITL predicted  {pred.itl_pred_ms:8.2f} ms/token  [{lo:.2f}, {hi:.2f}] {span}  "
         f"({1e3 / pred.itl_pred_ms:.1f} tok/s)")
    echo(f"  ITL floor      {pred.itl_floor_ms:8.2f} ms/token  (bytes per step / bandwidth)")
    echo(f"  efficiency     {pred.efficiency:8.3f}   overhead {pred.overhead_ms:.2f} ms/step")
    if pred.ttft_pred_ms is not None:
        span_t = ("" if pred.ttft_pred_interval_ms is None else
                  f"  [{pred.ttft_pred_interval_ms[0]:.1f}, {pred.ttft_pred_interval_ms[1]:.1f}]"
                  f" {100 * INTERVAL_COVERAGE:.0f}% interval")
        if from_table and cal.prefill_calibrated:
            span_t += f", {n_sources(len(cal.prefill_sources))}" \
                + _widened(cal.prefill_source_widening_rel, "prefill ")
        echo(f"  TTFT predicted {pred.ttft_pred_ms:8.2f} ms{span_t}  ({pred.prompt_tokens} "
             f"prompt tokens; floor {pred.ttft_floor_ms:.2f} ms)")
    echo(f"  prefill        {pred.prefill_status}")
    if vision is not None:
        echo_vision(vision)
    _echo_energy(_energy(args, pred))
    echo(f"  calibration    {cal.source}, scope {cal.scope}: {', '.join(cal.basis)}")
    if cal.sources or cal.set_aside:
        echo(f"  rests on       {'; '.join(cal.sources) or '-'}")
        echo(f"  set aside      {'; '.join(cal.set_aside) or 'none'}")
    for note in (*model_notes, *cal.notes, *cal.prefill_notes):
        echo(f"  note: {note}")
    if near:
        where = "this device" if near[0].device == device.id else "other devices (none here)"
        echo(f"  published rows it leans on ({where}, nearest in bytes per step):")
        for r in near:
            echo(f"    {r.id:34} {r.model} {r.quant:7} {r.published_itl_ms:7.2f} ms "
                 f"({r.published_tok_s:.1f} tok/s), floor {r.floor_ms:.2f} ms, "
                 f"{r.power_mode or 'mode not stated'}, {r.date or 'date not stated'}")
            echo(f"      {r.url}")
    return 0


def _rests(cal: Any) -> str:
    """``1 source (widened by ...), `` or ``3 sources, ``: the decode answer's sources."""
    return f"{n_sources(len(cal.answer_sources))}{_widened(cal.source_widening_rel)}, "


def _widened(rel: float, what: str = "") -> str:
    """`` (widened by ...)`` where an interval was widened for resting on one source."""
    return (f" (widened by {100 * rel:.1f}% each side, the family's {what}leave-one-source-out "
            "error)" if rel else "")


def _preset_of(model: str) -> str | None:
    """The preset the per-model correction looks up: a preset id, or the preset a ladder file
    was inflated from (as the records and the report take it)."""
    from robot_latency.planner.target_inputs import model_preset

    return model_preset(model)


def _energy(args: argparse.Namespace, pred: Any) -> dict[str, Any]:
    """J per token and per plan (robot_latency.cli.predict_energy)."""
    from robot_latency.cli.predict_energy import energy_answer

    return energy_answer(args, pred)


def _source_counts(cal: Any, energy: dict[str, Any]) -> dict[str, int | None]:
    """The number of sources behind each figure: ITL, TTFT (None: prefill uncalibrated), the
    power model (J per token and per plan; None: energy uncalibrated)."""
    power = energy.get("power") or {}
    return {"itl": len(cal.answer_sources),
            "ttft": len(cal.prefill_sources) if cal.prefill_calibrated else None,
            "energy": (len(power.get("sources") or []) if power.get("decode_watts") is not None
                       else None)}


def _echo_energy(answer: dict[str, Any]) -> None:
    from robot_latency.cli.predict_energy import echo_energy

    echo_energy(answer)


def _predict_power_modes(args: argparse.Namespace, path: str, quant: str | None) -> int:
    """``--power-modes all``: every nvpmodel mode of the module (cli/predict_modes.py)."""
    from robot_latency.cli.predict_modes import cmd_predict_power_modes

    return cmd_predict_power_modes(args, path, quant, _preset_of(path))


def _predict_stream(args: argparse.Namespace) -> int:
    """``--stream``: the loop simulated on the device (robot_latency.cli.predict_stream)."""
    from robot_latency.cli.predict_stream import cmd_predict_stream

    return cmd_predict_stream(args)


def _validate(args: argparse.Namespace) -> int:
    rows = load_table(args.table) if args.table else None
    result = validate_table(rows)
    result["leave_one_source_out"] = leave_one_source_out_coverage(rows)
    result["device_stability"] = device_stability(rows=rows)
    result["prefill"] = validate_prefill()
    result["vision"] = validate_vision()
    if args.json:
        emit_json(result)
        return 0
    echo(f"{'row':44} {'device':24} {'published':>9} {'floor':>7} {'predicted':>9} "
         f"{'error':>7} {'80% interval':>17} in  fit")
    for r in result["rows"]:
        if r["predicted_ms"] is None:
            floor = fmt(r["floor_ms"])
            echo(f"{r['id']:44} {r['device']:24} {r['measured_ms']:9.2f} {floor:>7} "
                 f"{'-':>9} {'-':>7} {'-':>17} -   not predicted: {r['reason']}")
            continue
        lo, hi = r["interval_ms"]
        echo(f"{r['id']:44} {r['device']:24} {r['measured_ms']:9.2f} {r['floor_ms']:7.2f} "
             f"{r['predicted_ms']:9.2f} {100 * r['error_rel']:+6.1f}% "
             f"{f'[{lo:.1f}, {hi:.1f}]':>17} {'y' if r['inside_interval'] else 'n':2}  "
             f"{r['scope']}")
    for family, f in result["by_family"].items():
        if f["predicted"]:
            echo(f"{family:>14}: {f['predicted']} rows, median |error| "
                 f"{100 * f['median_abs_error']:.1f}%, max {100 * f['max_abs_error']:.1f}%, "
                 f"{f['inside_80']}/{f['predicted']} inside their 80% interval")
    for r in result["rows"]:
        if r["notes"]:
            echo(f"past 35%: {r['id']} ({100 * r['error_rel']:+.1f}%): {r['notes']}")
    med, mx = result["median_abs_error"], result["max_abs_error"]
    echo(f"\nms/token, each row predicted from a fit without it: {result['predicted']} rows "
         f"predicted ({result['not_predicted']} not), {result['sources']} sources; "
         f"median |error| {100 * med:.1f}%, max {100 * mx:.1f}%" if med is not None else
         "\nno row could be predicted")
    _validate_sources(result)
    return 0


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _validate_sources(result: dict[str, Any]) -> None:
    """Print leave-one-model-out, leave-one-source-out, the source flags, device stability and
    the prefill table's validation beside the leave-one-out summary."""
    loso = result["leave_one_source_out"]
    echo("\nleave-one-out / leave-one-model-out / leave-one-source-out (median |error|):")
    for family, f in result["by_family"].items():
        if f["predicted"]:
            echo(f"{family:>14}: {_pct(f['median_abs_error'])} / "
                 f"{_pct(f['new_model_median_abs_error'])} / "
                 f"{_pct(loso['by_family'].get(family, {}).get('median_abs_error'))}")
    for family, f in loso["by_family"].items():
        if f["predicted"]:
            echo(f"{family:>14}: leave-one-source-out, {f['inside_80']}/{f['predicted']} rows "
                 f"inside the interval their device's answer states without their source "
                 f"({_pct(f['coverage_80'])}; {_pct(f['coverage_80_unwidened'])} before the "
                 f"one-source widening, {f['widened']} widened)")
    for family, checks in loso["source_checks"].items():
        for c in checks:
            if c["flagged"]:
                echo(f"flagged ({family}): {c['source']}: {c['reason']}")
    stab = result["device_stability"]
    worst = stab["max_ratio"]
    echo(f"{stab['engine_family']}: largest move of a device's answer when one source is "
         f"dropped: x{worst:.2f}" if worst else "no device answer to check")
    for device, d in stab["devices"].items():
        echo(f"  {device:26} x{d['max_ratio']:.2f}")
    pf = result["prefill"]
    echo(f"\nprefill: {pf['total_rows']} rows from {len(pf['sources'])} sources on "
         f"{len(pf['devices'])} devices, each predicted from a fit without it")
    for family, f in pf["by_family"].items():
        cov = "-" if f["coverage_80"] is None else f"{f['inside_80']}/{f['predicted']}"
        echo(f"{family:>14}: {f['predicted']} predicted, median |error| "
             f"{_pct(f['median_abs_error'])}, max {_pct(f['max_abs_error'])}, inside 80% "
             f"{cov}; leave-one-model-out {_pct(f['new_model_median_abs_error'])}, "
             f"leave-one-source-out {_pct(f['new_source_median_abs_error'])}")
    vis = result["vision"]
    if not vis["validated"]:
        echo(f"\nvision: {vis['reason']}")
        return
    echo(f"\nvision: {vis['total_rows']} rows, each predicted from a fit without it")
    for family, f in vis["by_family"].items():
        echo(f"{family:>14}: {f['predicted']} predicted, median |error| "
             f"{_pct(f['median_abs_error'])}, max {_pct(f['max_abs_error'])}")


def _model_and_quant(model: str, quant: str | None) -> tuple[str, str | None]:
    """A GGUF file with ``--quant`` means its ladder level, as for ``run`` and ``sweep`` (built
    into the model cache on first use); a preset takes the quant as it is."""
    if quant is None or not Path(model).is_file():
        return model, quant
    from robot_latency.models.ladder import LadderError, ladder_model_path

    try:
        return str(ladder_model_path(model, quant)), None
    except LadderError as err:
        raise UsageError(f"--quant {quant}: {err}") from err


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Fit a calibration from run directories; print residuals; write it with --out."""
    cal, runs = calibrate_runs(args.run_dirs, engine_family=args.engine_family,
                               fixed_overhead_ms=args.fixed_overhead_ms)
    if args.out is not None:
        write_calibration(cal, args.out)
    if args.json:
        emit_json({"calibration": cal.to_dict(), "out": str(args.out) if args.out else None,
               "runs": [{"run_dir": r.run_dir, "floor_ms": r.decode.floor_ms,
                         "measured_ms": r.decode.measured_ms, "itl_samples": r.itl_samples}
                        for r in runs]})
        return 0
    echo(f"{cal.engine_family} on {cal.device_id}: efficiency {cal.efficiency:.3f}, overhead "
         f"{cal.overhead_ms:.2f} ms/step{' (held)' if cal.overhead_fixed else ''}; "
         f"prefill compute efficiency {cal.compute_efficiency:.3f}")
    echo(f"{'run':40} {'floor ms':>9} {'measured ms':>12} {'fitted ms':>10} {'residual':>9}")
    for r, res in zip(runs, cal.residuals_rel, strict=True):
        fitted = r.decode.floor_ms / cal.efficiency + cal.overhead_ms
        echo(f"{r.run_dir[-40:]:40} {r.decode.floor_ms:9.2f} {r.decode.measured_ms:12.2f} "
             f"{fitted:10.2f} {100 * res:+8.1f}%")
    for note in cal.notes:
        echo(f"note: {note}")
    if args.out is not None:
        echo(f"wrote {args.out}")
    return 0


def prediction_for_floor(args: argparse.Namespace, floor: dict[str, Any]) -> dict[str, Any]:
    """Return the calibrated prediction for one of ``floor --json``'s devices and models."""
    device = get_device(floor["device_id"], cache_path=getattr(args, "cache", None))
    if args.model is None:  # the manual form: --params, --weight-bits, --kv-bytes-per-token
        model = facts_manual(params=int(args.params), weight_bits=args.weight_bits,
                               kv_bytes_per_token=args.kv_bytes_per_token)
    else:
        quant = None if Path(args.model).exists() else (args.quant or floor.get("quant"))
        model = resolve_model(args.model, quant=quant, kv_dtype=args.kv_dtype)
    cal = resolve_calibration(args.engine_family, device, calibration=args.calibration)
    return predict_target(model, device, cal, context_tokens=args.context,
                          prompt_tokens=args.prompt_tokens).to_dict()


def _add_stream_args(p: argparse.ArgumentParser) -> None:
    from robot_latency.cli.predict_stream import add_stream_args

    add_stream_args(p)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``predict`` and ``calibrate`` commands to the top-level parser."""
    from robot_latency.models.ladder import VALID_QUANTS

    families = ", ".join(ENGINE_FAMILIES)
    p = sub.add_parser(
        "predict", help="calibrated ITL/TTFT prediction for a device (efficiency + overhead)",
        description="itl = floor / efficiency + overhead, calibrated per engine family and "
                    "device from the published table (or --calibration). --validate: predict "
                    "every table row from a fit without it.")
    p.add_argument("--device", default=DEFAULT_TARGET_DEVICE, help="device datasheet id")
    p.add_argument("--model", default="qwen2.5-0.5b", help="GGUF path or preset id")
    p.add_argument("--quant", default=None,
                   help=f"level: of a preset, its quant (MLC q4f16 and 4-bit AWQ: Q4_0); of a "
                        f"GGUF file, its ladder level, built on first use as for run ("
                        f"{', '.join(VALID_QUANTS)})")
    p.add_argument("--engine-family", default="llamacpp-cuda", help=f"one of: {families}")
    p.add_argument("--context", type=nonneg_int, default=0, help="tokens in the KV cache")
    p.add_argument("--prompt-tokens", type=nonneg_int, default=None,
                   help="also predict the TTFT of this prompt length")
    p.add_argument("--calibration", default=None, help="calibration file from 'calibrate'")
    p.add_argument("--validate", action="store_true",
                   help="leave-one-out, leave-one-model-out and leave-one-source-out over the "
                        "published decode table, and leave-one-out over the prefill table")
    p.add_argument("--table", default=None, help="with --validate: another table file")
    p.add_argument("--json", action="store_true")
    _add_stream_args(p)
    from robot_latency.cli.predict_energy import add_energy_args
    from robot_latency.cli.predict_modes import add_power_mode_args

    add_power_mode_args(p)
    add_energy_args(p)
    add_vision_args(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("calibrate", help="fit efficiency and overhead from run directories",
                       description="Runs of one engine family on one device, covering at "
                                   "least two model sizes (bytes per step).")
    p.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, default=None, help="calibration file to write")
    p.add_argument("--engine-family", default=None,
                   help=f"family of the runs when the manifest does not say ({families})")
    p.add_argument("--fixed-overhead-ms", type=float, default=None,
                   help="hold the overhead (needed for runs of a single model size)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)
