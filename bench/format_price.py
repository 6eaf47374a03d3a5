"""The output format's price, measured here: the JSON planner against the compact action
language on the same stream, at one level, interleaved, with the target's answer of each run.

    python bench/format_price.py --out docs/bench/format_price.json     # 3 repeats
    python bench/format_price.py --smoke

Per repeat, each format in turn (JSON, compact, JSON, compact, ...), through ``robot-latency run``
(the in-process loop, the real llama.cpp engine) with ``--target-answer``:

* ``json``: ``planner-json-inflated-<preset>`` with the ``bundled-json`` profile (chat prompt
  with the schema, JSON under the schema's grammar, Qwen2's tokenizer);
* ``compact``: ``planner-inflated-<preset>`` with the ``bundled-actions`` profile (one token per
  action word).

Per run: tokens per plan p50 / p95 of the model's plans in the run (only the plans it finished:
the short ones where most missed), model plans and model plan time p50 / p95 (cycle start to last
token), e2e p50 / p99, deadline miss rate here, and on the target the predicted e2e p50, receiver
miss rate, the smallest deadline held at 5% and the untimed pass's tokens per plan (every
command's complete plan). Medians over the repeats and the JSON / compact ratios are in
``summary``; its tokens per plan are the untimed pass's. ``--smoke``: the shipped small
planners (no inflation), three commands, one repeat.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchio import emit_result

from robot_latency.cli import main as cli_main
from robot_latency.records import read_records
from robot_latency.report.rundir import load_run
from robot_latency.report.target import simulated_answers
from robot_latency.streams import SHIPPED_DIR, read_stream, write_bag

FORMATS = {"json": ("planner-json-inflated-{preset}", "bundled-json"),
           "compact": ("planner-inflated-{preset}", "bundled-actions")}
SMOKE_MODELS = {"json": "planner-json", "compact": "planner"}


def _pcts(values: list[float], qs: tuple[int, ...]) -> list[float] | None:
    if not values:
        return None
    return [round(float(v), 2) for v in np.percentile(np.asarray(values), qs)]


def measure(run_dir: Path) -> dict[str, Any]:
    """The figures of one finished run directory (with its target.json)."""
    records = read_records(run_dir / "cycles.jsonl")
    plans = [r for r in records if r.plan_source == "model" and r.token_ns and r.started_ns]
    e2e = [(r.published_ns - (r.command_arrival_ns or r.scheduled_ns)) / 1e6 for r in records
           if r.published_ns is not None]
    missed = sum(1 for r in records if r.published_ns is None or r.published_ns > r.deadline_ns)
    answer = simulated_answers([load_run(run_dir)], [run_dir])[0]
    out: dict[str, Any] = {
        "cycles": len(records), "model_plans": len(plans),
        "tokens_per_plan_p50_p95": _pcts([float(len(r.token_ns)) for r in plans], (50, 95)),
        "plan_time_ms_p50_p95": _pcts([(r.token_ns[-1] - r.started_ns) / 1e6 for r in plans],
                                      (50, 95)),
        "e2e_ms_p50_p99": _pcts(e2e, (50, 99)),
        "deadline_miss_rate": round(missed / len(records), 4) if records else None}
    if answer is not None:
        out["target"] = {"device": answer.device_id, "e2e_p50_ms": answer.e2e_p50_ms,
                         "miss_rate": float(answer.miss_rate),
                         "min_deadline_ms": answer.min_deadline_ms,
                         "tokens_per_plan": answer.facts.get("tokens_per_plan"),
                         "budget_tokens": answer.facts.get("budget_tokens")}
    return out


def _median(runs: list[dict[str, Any]], get: Any) -> float | None:
    vals = [v for v in (get(r) for r in runs) if v is not None]
    return round(statistics.median(vals), 2) if vals else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats per format, and the JSON / compact ratios."""
    keys = {"tokens_per_plan_p50": lambda r: ((r.get("target") or {}).get("tokens_per_plan")
                                              or r["tokens_per_plan_p50_p95"] or [None])[0],
            "model_plans": lambda r: r["model_plans"],
            "plan_time_ms_p50": lambda r: (r["plan_time_ms_p50_p95"] or [None])[0],
            "e2e_ms_p50": lambda r: (r["e2e_ms_p50_p99"] or [None])[0],
            "deadline_miss_rate": lambda r: r["deadline_miss_rate"],
            "target_e2e_p50_ms": lambda r: r.get("target", {}).get("e2e_p50_ms"),
            "target_miss_rate": lambda r: r.get("target", {}).get("miss_rate"),
            "target_min_deadline_ms": lambda r: r.get("target", {}).get("min_deadline_ms")}
    med = {fmt: {k: _median([r for r in runs if r["format"] == fmt], f) for k, f in keys.items()}
           for fmt in FORMATS}
    ratios = {k: (round(med["json"][k] / med["compact"][k], 2)
                  if med["json"][k] and med["compact"][k] else None)
              for k in ("tokens_per_plan_p50", "plan_time_ms_p50", "e2e_ms_p50",
                        "target_e2e_p50_ms", "target_min_deadline_ms")}
    return {"median": med, "json_over_compact": ratios,
            "n": {fmt: sum(1 for r in runs if r["format"] == fmt) for fmt in FORMATS}}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--stream", type=Path, default=SHIPPED_DIR / "steady_operator")
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--quant", default="Q4_0")
    ap.add_argument("--device", default="orin-nano-8gb")
    ap.add_argument("--deadline-ms", type=float, default=1500.0)
    ap.add_argument("--speed", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="the shipped small planners, three commands, one repeat")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stream = args.stream
    with tempfile.TemporaryDirectory(prefix="format_price.") as tmp:
        if args.smoke:
            cmds = read_stream(stream).commands[:3]
            stream = write_bag(Path(tmp) / "stream", cmds)
            args.repeats = 1
        runs = []
        t0 = time.perf_counter()
        for rep in range(args.repeats):
            for fmt, (model, profile) in FORMATS.items():
                out = Path(tmp) / f"{fmt}-{rep}"
                argv = ["run", "--stream", str(stream), "--profile", profile,
                        "--device", args.device, "--deadline-ms", str(args.deadline_ms),
                        "--period-ms", str(args.deadline_ms), "--mode", "event",
                        "--speed", str(args.speed), "--target-answer", "--json",
                        "--out", str(out), "--label", fmt]
                argv += (["--model", SMOKE_MODELS[fmt]] if args.smoke else
                         ["--model", model.format(preset=args.preset), "--quant", args.quant])
                if cli_main(argv) != 0:
                    raise SystemExit(f"format_price: run {fmt} #{rep} failed")
                runs.append({"format": fmt, "repeat": rep, "profile": profile,
                             **measure(out)})
        wall_s = time.perf_counter() - t0
    return emit_result({
        "stream": str(args.stream), "preset": None if args.smoke else args.preset,
        "quant": None if args.smoke else args.quant, "device": args.device,
        "deadline_ms": args.deadline_ms, "speed": args.speed, "repeats": args.repeats,
        "order": "interleaved: json, compact per repeat", "wall_s": round(wall_s, 1),
        "runs": runs, "summary": summarize(runs)}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
