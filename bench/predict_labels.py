"""The answer without weights against the untimed pass, and the output format's price on the
target, both from the labelled plans of a shipped stream.

    python bench/predict_labels.py --out docs/bench/predict_labels.json
    python bench/predict_labels.py --smoke

1. ``check``: the bundled planner (its vocabulary loads without its weights) on the stream in
   its compact action format: the answer from the labels (``predict --from-labels``) against
   the answer from the untimed pass of the real model (``predict``), on ``--check-device``: e2e
   p50 / p99, miss rate, smallest deadline held, tokens per plan, and per command whether the
   model wrote the labelled plan and whether the token counts agree.
2. ``price``: per model preset (``--presets``, shipped Qwen2 tokenizer), output format (the
   ``instruct-json`` profile's compact JSON, the ``bundled-actions`` profile's action tokens)
   and device (``--devices``), from the labels alone: tokens per plan p50 / p95, e2e p50 / p99,
   predicted receiver miss rate, smallest deadline held at 5%, and the token budget at the
   deadline after a p50 and a p95 prompt. Both formats get the same output budget
   (``--max-tokens``, 160: instruct-json's own), so no plan is cut and the price is the
   format's alone.

No timing of this host enters any figure: the untimed pass counts tokens, the target's times
are predicted.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.models.bundled import bundled_model_path
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_inputs import labelled_inputs, untimed_inputs
from robot_latency.report.target_answer import answers_from_inputs
from robot_latency.streams import SHIPPED_DIR, read_stream

FORMATS = {"json": "instruct-json", "actions": "bundled-actions"}


def _answer(a: Any) -> dict[str, Any]:
    return {"e2e_p50_ms": a.e2e_p50_ms, "e2e_p99_ms": a.e2e_p99_ms,
            "miss_rate": float(a.miss_rate), "miss_interval": [float(v) for v in a.miss_interval],
            "model_in_time_rate": float(a.model_in_time_rate),
            "min_deadline_ms": a.min_deadline_ms, "commands": a.commands,
            "margin_ms": a.margin_ms, **{k: a.facts[k] for k in (
                "no_valid_plan", "cut_at_max_tokens", "tokens_per_plan", "prompt_tokens",
                "budget_tokens")}}


def check(stream: Any, device: str, settings: RunSettings, draws: int) -> dict[str, Any]:
    model = str(bundled_model_path())
    s = replace(settings, model=model, target_device=device, profile=None)
    t0 = time.perf_counter()
    ran = untimed_inputs(s, stream)
    t1 = time.perf_counter()
    assumed = labelled_inputs(s, stream, model=model)
    t2 = time.perf_counter()
    a_ran, a_assumed = answers_from_inputs([("untimed pass", ran, None),
                                            ("labels", assumed, None)], draws=draws)
    own = ran.untimed.by_id()
    wrote = [c for c in assumed.untimed.commands if c.asked and own[c.command_id].plan == c.plan]
    return {
        "model": Path(model).name, "device": device, "profile": "bundled-actions",
        "untimed_pass": _answer(a_ran), "labels": _answer(a_assumed),
        "e2e_p50_rel_diff": (a_assumed.e2e_p50_ms - a_ran.e2e_p50_ms) / a_ran.e2e_p50_ms,
        "commands_model_wrote_the_label": len(wrote),
        "commands_asked": sum(1 for c in assumed.untimed.commands if c.asked),
        "prompt_tokens_equal": all(c.prompt_tokens == own[c.command_id].prompt_tokens
                                   for c in assumed.untimed.commands),
        "tokens_out_equal_where_written": all(c.tokens_out == own[c.command_id].tokens_out
                                              for c in wrote),
        "untimed_pass_s": round(t1 - t0, 2), "labels_s": round(t2 - t1, 2)}


def price(stream: Any, presets: list[str], devices: list[str], quant: str,
          settings: RunSettings, draws: int, max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    for device in devices:
        for preset in presets:
            levels = []
            for fmt, profile in FORMATS.items():
                s = replace(settings, profile=profile, target_device=device,
                            max_tokens=max_tokens)
                inputs = labelled_inputs(s, stream, model=preset, quant=quant)
                levels.append((fmt, inputs, None))
            for a in answers_from_inputs(levels, draws=draws):
                rows.append({"device": device, "preset": preset, "quant": quant,
                             "format": a.label, "profile": FORMATS[a.label], **_answer(a)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--stream", type=Path, default=SHIPPED_DIR / "steady_operator")
    ap.add_argument("--check-device", default="orin-nano-8gb")
    ap.add_argument("--devices", nargs="+", default=["orin-nano-8gb", "orin-agx-64gb"])
    ap.add_argument("--presets", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--deadline-ms", type=float, default=400.0)
    ap.add_argument("--mode", default="event")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=160,
                    help="the output budget of both formats in the price (instruct-json's own; "
                         "the bundled-actions profile's 24 is sized for the bundled planner's "
                         "one-token actions, which a Qwen2 tokenizer spells in several)")
    ap.add_argument("--smoke", action="store_true", help="6 commands, 20 draws, one preset "
                    "and device")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stream = read_stream(args.stream)
    if args.smoke:
        stream = type(stream)(stream.name, stream.source, stream.commands[:6], stream.topic)
        args.draws, args.devices, args.presets = 20, args.devices[:1], args.presets[:1]
    settings = RunSettings(log_dir=Path(".untimed"), mode=args.mode,
                           deadline_ms=args.deadline_ms, period_ms=args.deadline_ms)
    return emit_result({
        "stream": str(args.stream), "commands": len(stream.commands),
        "deadline_ms": args.deadline_ms, "mode": args.mode, "draws": args.draws,
        "check": check(stream, args.check_device, settings, args.draws),
        "price": price(stream, args.presets, args.devices, args.quant, settings, args.draws,
                       args.max_tokens),
        "price_max_tokens": args.max_tokens,
        "note": "token counts from the model's own tokenizer; target times predicted (no "
                "timing of this host in any figure)"}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
