"""``devices``, ``probe``, ``detect``, ``model``, ``floor`` and ``specdec``: device datasheets,
model facts and bandwidth-floor predictions."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from robot_latency.cli.common import (
    UsageError,
    count_arg,
    echo,
    emit_json,
    fmt_bytes,
    nonneg_int,
    positive_int,
    render_table,
)
from robot_latency.floor.devices import DEVICES, DeviceSheet, get_device, list_devices
from robot_latency.floor.jetson import detect_jetson
from robot_latency.floor.modelinfo import ModelFacts, facts_manual, resolve_model
from robot_latency.floor.predict import FloorPrediction, predict_floor, specdec_estimate
from robot_latency.floor.probe import load_or_probe_host
from robot_latency.models.ladder import LADDER


def _device_row(d: DeviceSheet) -> list[str]:
    flops = "-" if d.fp16_tflops is None else (
        f"{d.fp16_tflops:.3g}" + (" (derived)" if d.flops_derived else ""))
    return [d.id, d.name, f"{d.bandwidth_gbps:.4g}", f"{d.memory_bytes / 1e9:.3g}", flops,
            d.power_mode or "-"]


def cmd_devices(args: argparse.Namespace) -> int:
    devices = list_devices()
    if args.json:
        emit_json([d.to_dict() for d in devices])
        return 0
    echo(render_table(["id", "name", "GB/s", "memory GB", "FP16 TFLOPS", "power mode"],
                [_device_row(d) for d in devices]))
    echo("\n`host` is this machine, measured once by `robot-latency probe` and cached.")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    sheet = load_or_probe_host(args.cache, refresh=args.refresh)
    if args.json:
        emit_json(sheet.to_dict())
        return 0
    echo(render_table(["id", "name", "GB/s", "memory GB", "FP16 TFLOPS", "power mode"],
                [_device_row(sheet)]))
    echo(f"source: {sheet.source}")
    return 0


def cmd_detect(args: argparse.Namespace) -> int:
    if not Path(args.root).is_dir():
        raise UsageError(f"--root {args.root}: not a directory")
    info = detect_jetson(Path(args.root))
    if args.json:
        # "profile_id" is the old key of "device_id", kept for one release for scripts.
        emit_json(None if info is None else {**info.__dict__, "profile_id": info.device_id})
        return 0
    if info is None:
        echo(f"not a Jetson (no device-tree model under {args.root})")
        return 0
    echo(f"model string : {info.model_string}")
    echo(f"module       : {info.module or 'unknown'}")
    echo(f"power mode   : {info.power_mode or 'unknown'} (id {info.power_mode_id})")
    echo(f"datasheet    : {info.device_id or 'no matching datasheet'}")
    return 0


#: Group names accepted wherever a device id is: each expands to its devices, in table order.
DEVICE_GROUPS = {
    "orin": lambda d: d.family.startswith("orin"),
    "jetson": lambda d: d.family.startswith(("orin", "thor")),
    "all": lambda d: True,
}


def _device_ids(spec: str | None, *, table: bool) -> list[str]:
    """Expand a comma-separated device list; groups (orin, jetson, all) expand in place."""
    if spec is None:
        if not table:
            raise UsageError("--device is required with --json (e.g. --device orin-agx-64gb)")
        spec = "orin"
    ids: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if item in DEVICE_GROUPS:
            ids.extend(d.id for d in DEVICES.values() if DEVICE_GROUPS[item](d))
        elif item:
            ids.append(item)
    return list(dict.fromkeys(ids))


def _models(args: argparse.Namespace, *, table: bool) -> list[ModelFacts]:
    manual = (args.params, args.weight_bits, args.kv_bytes_per_token)
    if args.model is not None:
        if any(v is not None for v in manual):
            raise UsageError("give either --model or --params/--weight-bits/"
                             "--kv-bytes-per-token, not both")
        if args.quant is None and table and not Path(args.model).exists():
            quants: Sequence[str | None] = LADDER
        else:
            quants = [args.quant]
        return [resolve_model(args.model, quant=q, kv_dtype=args.kv_dtype) for q in quants]
    if any(v is None for v in manual):
        raise UsageError("give --model GGUF_OR_PRESET, or all of --params, --weight-bits and "
                         "--kv-bytes-per-token")
    return [facts_manual(params=args.params, weight_bits=args.weight_bits,
                           kv_bytes_per_token=args.kv_bytes_per_token)]


def _predictions(args: argparse.Namespace, *, table: bool) -> list[FloorPrediction]:
    devices = [get_device(i, cache_path=args.cache) for i in _device_ids(args.device, table=table)]
    models = _models(args, table=table)
    draft = (resolve_model(args.draft, quant=args.draft_quant, kv_dtype=args.kv_dtype)
             if args.draft else None)
    def prompt_tokens(d: DeviceSheet) -> int | None:
        # A table skips the prefill of a device without a FLOP/s figure; --json asks for it
        # by name, so there it is an error.
        return None if table and d.peak_flops is None else args.prompt_tokens

    return [
        predict_floor(m, d, batch=args.batch, context_tokens=args.context,
                      prompt_tokens=prompt_tokens(d),
                      compute_efficiency=args.compute_efficiency, draft=draft)
        for d in devices for m in models
    ]


def cmd_floor(args: argparse.Namespace) -> int:
    preds = _predictions(args, table=not args.json)
    if args.json:
        dicts = [p.to_dict() for p in preds]
        if args.engine_family:  # the calibrated prediction beside each floor
            from robot_latency.cli import predict

            for d in dicts:
                d["target_prediction"] = predict.prediction_for_floor(args, d)
        emit_json(dicts[0] if len(dicts) == 1 else dicts)
        return 0
    quants = list(dict.fromkeys(p.quant or "-" for p in preds))
    devices = list(dict.fromkeys(p.device_id for p in preds))
    by_key = {(p.device_id, p.quant or "-"): p for p in preds}
    first = preds[0]
    echo(f"Decode ITL floor (ms/token; tokens/s) of {first.model_name} at batch {first.batch}, "
         f"{first.context_tokens} tokens of context. '!' = does not fit in memory.")
    rows = []
    for dev in devices:
        row = [dev, f"{by_key[(dev, quants[0])].bandwidth_gbps:.4g}"]
        for q in quants:
            p = by_key[(dev, q)]
            mark = "" if p.fits_in_memory else " !"
            row.append(f"{p.itl_floor_ms:.2f} ({p.throughput_floor_tok_s:.0f}){mark}")
        rows.append(row)
    echo(render_table(["device", "GB/s", *quants], rows))
    weights = [by_key[(devices[0], q)] for q in quants]
    echo("\nweights read per step: " + ", ".join(
        f"{q} {fmt_bytes(p.weight_bytes_per_step)}" for q, p in zip(quants, weights, strict=True)))
    if args.prompt_tokens is not None:
        echo(f"\nPrefill floor for {args.prompt_tokens} prompt tokens at compute efficiency "
             f"{args.compute_efficiency:g} (2 x params x tokens / FLOP/s):")
        echo(render_table(["device", "peak TFLOPS", "prefill floor ms"],
                    [[p.device_id,
                      "-" if p.peak_flops is None else f"{p.peak_flops / 1e12:.3g}",
                      "no FLOP/s figure" if p.prefill_floor_ms is None
                      else f"{p.prefill_floor_ms:.2f}"]
                     for p in preds if p.quant == first.quant]))
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    facts = resolve_model(args.model, quant=args.quant, kv_dtype=args.kv_dtype)
    if args.json:
        emit_json(facts.to_dict(include_tensors=args.tensors))
        return 0
    fields = [
        ("name", facts.name), ("source", facts.source), ("architecture", facts.architecture),
        ("layers", facts.n_layers), ("heads / kv heads", f"{facts.n_heads} / "
                                                             f"{facts.n_kv_heads}"),
        ("head_dim", facts.head_dim), ("hidden", facts.hidden), ("ffn", facts.ffn),
        ("context", facts.context_length), ("vocab", facts.vocab_size),
        ("tied output", facts.tied_embeddings), ("quant", facts.quant),
        ("params", f"{facts.params:,}"),
        ("weights", fmt_bytes(facts.weight_bytes_total)),
        ("read per decode step", fmt_bytes(facts.weight_bytes_per_step)),
        ("effective bits/weight", f"{facts.effective_bpw:.3f}"),
        (f"KV bytes/token ({facts.kv_dtype})", f"{facts.kv_bytes_per_token:,}"),
    ]
    for key, value in fields:
        echo(f"{key:<24} {value}")
    if facts.tensor_types:
        echo("bytes by tensor type    " + ", ".join(
            f"{t} {fmt_bytes(b)}" for t, b in sorted(facts.tensor_types.items())))
    return 0


def cmd_specdec(args: argparse.Namespace) -> int:
    est = specdec_estimate(args.alpha, args.k, args.c, args.v, max_k=args.max_k)
    if args.json:
        emit_json(est.to_dict())
        return 0
    echo(f"alpha={est.alpha:g} k={est.k} c={est.c:g} v={est.v:g}")
    echo(f"expected tokens per round : {est.expected_tokens_per_round:.3f}")
    echo(f"cost per round            : {est.cost_per_round:.3f} target passes")
    echo(f"speedup                   : {est.speedup:.3f}x")
    echo(f"best k in 1..{args.max_k:<12}: {est.best_k} ({est.best_speedup:.3f}x)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser("devices", help="list the device datasheets (bandwidth, memory, FLOP/s)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("probe", help="measure this host (bandwidth, matmul FLOP/s); cached")
    p.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    p.add_argument("--cache", type=Path, default=None, help="cache file (default: user cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("detect", help="detect a Jetson module and its power mode")
    p.add_argument("--root", default="/", help="filesystem root to read (default: /)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_detect)

    p = sub.add_parser("model", help="the facts of a GGUF file or a shape preset")
    p.add_argument("model", help="GGUF path or preset id (e.g. qwen2.5-0.5b)")
    p.add_argument("--quant", default=None, help="quant type for a preset (default Q4_K_M)")
    p.add_argument("--kv-dtype", default="f16", help="KV cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("--tensors", action="store_true", help="with --json: every tensor")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser(
        "floor", help="bandwidth-floor predictions of a model on devices",
        description="Without --device, a table over the Jetson Orin modules; without --quant "
                    "for a preset, over the quantization ladder. --json prints one object "
                    "(a list when several devices or quants are asked for).")
    p.add_argument("--device", default=None,
                   help="device ids, comma-separated; 'host' (probed), 'auto' (detected), "
                        "or a group: 'orin' (default for tables), 'jetson', 'all'")
    p.add_argument("--model", default=None, help="GGUF path or preset id")
    p.add_argument("--quant", default=None, help="quant type for a preset")
    p.add_argument("--params", type=count_arg, default=None, help="manual form: parameters")
    p.add_argument("--weight-bits", type=float, default=None, help="manual form: bits/weight")
    p.add_argument("--kv-bytes-per-token", type=nonneg_int, default=None,
                   help="manual form: KV bytes per token")
    p.add_argument("--kv-dtype", default="f16", help="KV cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("--context", type=nonneg_int, default=0,
                   help="tokens in the KV cache per sequence (default 0: weights only)")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--prompt-tokens", type=nonneg_int, default=None,
                   help="also predict the prefill floor for this prompt length")
    p.add_argument("--compute-efficiency", type=float, default=1.0,
                   help="fraction of peak FLOP/s a prefill reaches (default 1.0: the floor)")
    p.add_argument("--draft", default=None, help="draft model (GGUF or preset) for memory fit")
    p.add_argument("--draft-quant", default=None, help="quant type for a draft preset")
    p.add_argument("--cache", type=Path, default=None, help="host probe cache file")
    p.add_argument("--engine-family", default=None,
                   help="with --json: add that family's calibrated prediction (see 'predict')")
    p.add_argument("--calibration", default=None, help="calibration file for --engine-family")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_floor)

    p = sub.add_parser("specdec", help="expected speedup of speculative decoding")
    p.add_argument("--alpha", type=float, required=True, help="per-token acceptance rate")
    p.add_argument("-k", type=positive_int, required=True, help="tokens drafted per round")
    p.add_argument("-c", type=float, required=True, help="draft cost per token / target cost")
    p.add_argument("-v", type=float, default=0.0, help="extra verify cost per drafted token")
    p.add_argument("--max-k", type=positive_int, default=16, help="search best k in 1..N")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_specdec)
