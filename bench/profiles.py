"""Planner-profile benchmarks: the fixed-prefix cache, and the engine's thread defaults.

prefix   TTFT p50 three ways, side by side in one run, on the instruct-json profile (its fixed
         prefix: system text and three examples) over the inflated Qwen2.5-0.5B at Q4_K_M, event
         mode, one cycle per command back to back (no queueing):
           cached     the prefix evaluated once at load; each cycle prefills its own part
           uncached   the prefix re-prefilled every cycle (prefix cache off)
           alone      the per-cycle part alone, no prefix at all (the floor of what caching
                      can reach)
         max_tokens 1: TTFT is the measure (the planner writes action tokens, not JSON, so
         later tokens would be cut anyway).

threads  The same stream (steady_operator at 3x, event mode, 400 ms deadline, bundled-actions
         profile, the inflated Qwen2.5-0.5B at Q4_K_M) through the planner under CPU budgets:
         the old defaults (1 decode and 1 prefill thread) against the new (prefill on every core
         the engine may use), unpinned, pinned, and pinned under SCHED_FIFO. TTFT, model plans
         in time and the loop's overshoot per configuration.

    python bench/profiles.py prefix --commands 20 --out docs/bench/prefix_cache.json
    python bench/profiles.py threads --out docs/bench/thread_defaults.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from benchio import emit_result

from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.ladder import ladder_model_path
from robot_latency.planner.budget import CpuBudget
from robot_latency.planner.config import RunSettings
from robot_latency.planner.replay import run_replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.profiles.profile import load_profile
from robot_latency.records import read_records
from robot_latency.streams import SHIPPED_DIR, CommandStream, read_stream

MODEL = "planner-inflated-qwen2.5-0.5b"


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _run(spec: RunSettings, stream: CommandStream, *, speed: float, asap: bool
         ) -> dict[str, Any]:
    config, _ = resolve_run(spec)
    summary = run_replay(config, stream, speed=speed, asap=asap)
    recs = [r for r in read_records(Path(spec.log_dir) / "cycles.jsonl") if not r.skipped]
    ttft = [r.ttft_ns / 1e6 for r in recs if r.ttft_ns is not None]
    over = [(r.overshoot_ns or 0) / 1e6 for r in recs]
    return {
        "engine_options": {k: v for k, v in config.engine_options.items()
                           if k in ("n_threads", "n_threads_batch", "prefix_cache")},
        "cpu": config.cpu.to_dict(),
        "cycles": len(recs),
        "ttft_p50_ms": statistics.median(ttft) if ttft else None,
        "ttft_p90_ms": _p(ttft, 0.9),
        "tokens_in_p50": statistics.median([r.tokens_in or 0 for r in recs]),
        "prefill_tokens_p50": statistics.median(
            [(r.tokens_in or 0) - (r.prefix_cache_tokens or 0) for r in recs]),
        "model_plans_in_time": sum(r.plan_source == "model" and r.deadline_met for r in recs),
        "fallbacks": summary.get("fallbacks"),
        "overshoot_p99_ms": _p(over, 0.99),
        "overshoot_max_ms": max(over) if over else None,
    }


def _model(args: argparse.Namespace) -> str:
    """The inflated Qwen2.5-0.5B at Q4_K_M, or the shipped tiny planner (``--model bundled``,
    for a smoke run)."""
    if args.model == "bundled":
        return str(bundled_model_path("planner"))
    return str(ladder_model_path(MODEL, "Q4_K_M"))


def cmd_prefix(args: argparse.Namespace) -> dict[str, Any]:
    model = _model(args)
    full = read_stream(SHIPPED_DIR / "steady_operator")
    stream = CommandStream(name=full.name, source=full.source,
                           commands=full.commands[: args.commands], topic=full.topic)
    profile = load_profile("instruct-json")
    work = Path(tempfile.mkdtemp(prefix="bench-prefix-"))
    # The per-cycle part alone: the same profile without its fixed prefix.
    data = yaml.safe_load(profile.text)
    data["prompt"].pop("system"), data["prompt"].pop("examples")
    data["output"]["schema"] = str(Path(profile.output.schema or "").resolve())
    alone = work / "alone.yaml"
    alone.write_text(yaml.safe_dump(data))
    planner = RunSettings(mode="event", deadline_ms=args.deadline_ms,
                          period_ms=args.deadline_ms, max_tokens=1)
    # The planner was trained on 128-token prompts: a 2048-token context holds the prefix
    # (position-wise untrained, which changes no timing).
    ctx = {"n_ctx": 2048}
    ways = {"cached": ("instruct-json", ctx),
            "uncached": ("instruct-json", {**ctx, "prefix_cache": False}),
            "alone": (str(alone), ctx)}
    out: dict[str, Any] = {}
    for name, (prof, opts) in ways.items():
        spec = replace(planner, log_dir=work / name, model=model, profile=prof,
                       n_threads=args.n_threads, n_threads_batch=args.n_threads_batch,
                       engine_options=opts)
        out[name] = _run(spec, stream, speed=1.0, asap=True)
        sys.stderr.write(f"{name}: {out[name]}\n")
    c, u, a = (out[k]["ttft_p50_ms"] for k in ("cached", "uncached", "alone"))
    return {"model": model, "profile": "instruct-json", "commands": len(stream.commands),
            "ways": out, "cached_over_alone": c / a, "uncached_over_cached": u / c,
            "targets": {"cached_over_alone_max": 1.3, "uncached_over_cached_min": 3.0}}


def cmd_threads(args: argparse.Namespace) -> dict[str, Any]:
    model = _model(args)
    full = read_stream(SHIPPED_DIR / "steady_operator")
    stream = CommandStream(name=full.name, source=full.source,
                           commands=full.commands[: args.max_commands or None],
                           topic=full.topic)
    planner = RunSettings(mode="event", deadline_ms=400.0, period_ms=500.0)
    work = Path(tempfile.mkdtemp(prefix="bench-threads-"))
    configs = {
        "old default (1/1, unpinned)": dict(n_threads=1, n_threads_batch=1),
        "new default, unpinned (1/2)": {},
        "pinned loop, normal scheduler (1/1)": dict(cpu=CpuBudget(loop_cpus=(0,))),
        "pinned loop, SCHED_FIFO 50 (1/2)": dict(cpu=CpuBudget(loop_cpus=(0,),
                                                               loop_priority=50)),
    }
    out: dict[str, Any] = {}
    for i, (name, kw) in enumerate(configs.items()):
        spec = replace(planner, log_dir=work / str(i), model=model, **kw)
        out[name] = _run(spec, stream, speed=args.speed, asap=False)
        sys.stderr.write(f"{name}: {out[name]}\n")
    return {"model": model, "stream": "steady_operator", "speed": args.speed,
            "deadline_ms": 400.0, "commands": len(stream.commands), "configs": out}


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prefix", allow_abbrev=False)
    p.add_argument("--commands", type=int, default=20)
    p.add_argument("--deadline-ms", type=float, default=60_000.0)
    p.add_argument("--n-threads", type=int, default=0)
    p.add_argument("--n-threads-batch", type=int, default=0)
    p.add_argument("--model", choices=("inflated", "bundled"), default="inflated")
    p.add_argument("--out", type=Path, default=None)
    p = sub.add_parser("threads", allow_abbrev=False)
    p.add_argument("--speed", type=float, default=3.0)
    p.add_argument("--model", choices=("inflated", "bundled"), default="inflated")
    p.add_argument("--max-commands", type=int, default=0, help="only the first N commands")
    p.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = cmd_prefix(args) if args.what == "prefix" else cmd_threads(args)
    return emit_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
