"""Benchmarks of the llama.cpp engine: harness overhead, abort latency, prefix cache, speculation.

Each subcommand prints one JSON object (medians, ratios measured side by side in one run, and
sample counts) and can write it with --out. Figures go to docs/BENCHMARKS.md with the command.

    python bench/engine.py overhead --model M.gguf [--tokens 64 --runs 20 --n-threads 2]
    python bench/engine.py abort    --model M.gguf [--prompt-words 400 --trials 30]
    python bench/engine.py prefix   --model M.gguf [--runs 30]
    python bench/engine.py specdec  --model M.gguf --draft D.gguf [-k 4 --commands 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from benchio import emit_result

from robot_latency.engines import GenerationRequest, StopReason, create_engine
from robot_latency.models.tokenizer import format_prompt
from robot_latency.profiles.actions import actions_gbnf

CMD = "pick up the red cup and put it on the tray"


def _ms(ns: float) -> float:
    return ns / 1e6


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _engine(args: argparse.Namespace, **extra: Any) -> Any:
    return create_engine("llamacpp", model_path=args.model, n_threads=args.n_threads,
                         n_ctx=args.n_ctx, **extra)


def bench_overhead(args: argparse.Namespace) -> dict[str, Any]:
    """Harness ITL against llama.cpp's own per-token eval time (llama_perf), in the same runs.

    ``overhead_pct`` compares totals over the same tokens (every gap against the eval time of
    the token it waited for): what the harness adds. ``overhead_median_vs_mean_pct`` compares
    the median gap with llama.cpp's mean per-token eval time (llama_perf gives only totals).

    Also: the abort callback always armed against armed only near the deadline, and the
    grammar's cost, each measured side by side (interleaved runs).
    """
    variants = {
        "plain": ({}, None, None),
        "grammar": ({}, actions_gbnf(), None),
        # A deadline far away: the default policy never arms the callback in decode...
        "deadline_armed_near": ({"arm_margin_steps": 2.0}, None, 3600),
        # ...this one keeps it armed for every token.
        "deadline_always_armed": ({"arm_margin_steps": 1e12}, None, 3600),
    }
    engines = {name: _engine(args, **opts) for name, (opts, _, _) in variants.items()}
    itl: dict[str, list[float]] = {name: [] for name in variants}
    eval_ms_per_tok: dict[str, list[float]] = {name: [] for name in variants}
    # Totals over the same tokens: harness gaps against llama.cpp's eval time.
    sum_itl_ms = dict.fromkeys(variants, 0.0)
    sum_eval_ms = dict.fromkeys(variants, 0.0)
    try:
        for _ in range(args.runs):
            for name, (_, grammar, deadline_s) in variants.items():
                e = engines[name]
                e.perf_reset()
                deadline = (time.perf_counter_ns() + int(deadline_s * 1e9)
                            if deadline_s else None)
                # Prompt-independent decode: no grammar end, fixed token count.
                tr = e.generate(GenerationRequest(prompt=format_prompt(CMD),
                                                  max_tokens=args.tokens, grammar=grammar,
                                                  deadline_ns=deadline))
                gaps = [b - a for a, b in zip(tr.token_ns, tr.token_ns[1:], strict=False)]
                itl[name].extend(_ms(g) for g in gaps)
                perf = e.perf()
                if perf["n_eval"]:
                    eval_ms_per_tok[name].append(perf["t_eval_ms"] / perf["n_eval"])
                    # each gap is one eval (of the previous token) plus sampling
                    per_eval = perf["t_eval_ms"] / perf["n_eval"]
                    sum_itl_ms[name] += _ms(sum(gaps))
                    sum_eval_ms[name] += per_eval * len(gaps)
    finally:
        for e in engines.values():
            e.close()
    out: dict[str, Any] = {}
    for name in variants:
        med_itl = statistics.median(itl[name])
        med_eval = statistics.median(eval_ms_per_tok[name])
        out[name] = {"itl_p50_ms": med_itl, "itl_p99_ms": _pct(itl[name], 99),
                     "llama_eval_ms_per_token_p50": med_eval,
                     "overhead_median_vs_mean_pct": 100 * (med_itl / med_eval - 1),
                     "overhead_pct": 100 * (sum_itl_ms[name] / sum_eval_ms[name] - 1),
                     "n_itl": len(itl[name]),
                     "n_runs": len(eval_ms_per_tok[name])}
    out["always_armed_vs_near_pct"] = 100 * (out["deadline_always_armed"]["itl_p50_ms"]
                                             / out["deadline_armed_near"]["itl_p50_ms"] - 1)
    out["grammar_vs_plain_pct"] = 100 * (out["grammar"]["itl_p50_ms"]
                                         / out["plain"]["itl_p50_ms"] - 1)
    return out


def bench_abort(args: argparse.Namespace) -> dict[str, Any]:
    """Time from the abort signal to generate() returning, during a long prefill."""
    e = _engine(args, chunk_tokens=args.chunk or args.n_ctx, prefix_cache=False)
    prompt = format_prompt(" ".join(["pick up the red cup"] * (args.prompt_words // 5)))
    latencies: list[float] = []
    prefill_full: list[float] = []
    try:
        full = e.generate(GenerationRequest(prompt=prompt, max_tokens=1))
        prefill_ms = _ms(full.prefill_ns or 0)
        prefill_full.append(prefill_ms)
        rng = np.random.default_rng(0)
        for _ in range(args.trials):
            abort = threading.Event()
            set_at: list[int] = []

            def fire(ev: threading.Event = abort, out: list[int] = set_at) -> None:
                out.append(time.perf_counter_ns())
                ev.set()

            timer = threading.Timer(float(rng.uniform(0.2, 0.8)) * prefill_ms / 1e3, fire)
            timer.start()
            tr = e.generate(GenerationRequest(prompt=prompt, max_tokens=1), abort=abort)
            timer.join()
            if tr.stop_reason is StopReason.ABORTED and set_at:
                latencies.append(_ms(tr.finished_ns - set_at[0]))
    finally:
        e.close()
    return {"prefill_ms": prefill_full[0], "prompt_tokens": full.prompt_tokens,
            "chunk_tokens": args.chunk or args.n_ctx,
            # None when no abort landed inside a prefill (a tiny model's prefill can end first)
            "abort_latency_p50_ms": statistics.median(latencies) if latencies else None,
            "abort_latency_max_ms": max(latencies) if latencies else None, "n": len(latencies),
            "trials": args.trials}


def bench_prefix(args: argparse.Namespace) -> dict[str, Any]:
    """TTFT of a re-planned command with the prefix cache on and off (interleaved)."""
    on, off = _engine(args), _engine(args, prefix_cache=False)
    ttft: dict[str, list[float]] = {"on": [], "off": []}
    req = GenerationRequest(prompt=format_prompt(CMD + " and then go to the kitchen slowly"),
                            max_tokens=1)
    try:
        for e in (on, off):
            e.generate(req)  # warm
        for _ in range(args.runs):
            for name, e in (("on", on), ("off", off)):
                tr = e.generate(req)
                ttft[name].append(_ms(tr.token_ns[0] - tr.started_ns))
        reused = on.generate(req).prefix_cache_tokens
    finally:
        on.close()
        off.close()
    p50_on, p50_off = statistics.median(ttft["on"]), statistics.median(ttft["off"])
    return {"ttft_p50_ms_cache_on": p50_on, "ttft_p50_ms_cache_off": p50_off,
            "speedup": p50_off / p50_on, "reused_tokens": reused, "n": args.runs}


def bench_specdec(args: argparse.Namespace) -> dict[str, Any]:
    """Measured speedup of draft-model speculation against the same target alone.

    Costs are in units of one target pass, T1 = the target's median inter-token gap measured
    in the same run: c = draft time per drafted token / T1, and v = extra verify cost per drafted
    token, (verify time per round / T1 - 1) / drafted per round. The formula's speedup is given
    both with v = 0 (memory-bound verification, the textbook case) and with the measured v.
    """
    from robot_latency.floor.predict import expected_tokens_per_round
    from robot_latency.models.corpus import CorpusConfig, generate_corpus

    corpus = generate_corpus(CorpusConfig())
    commands = [c.text for c in corpus.heldout][: args.commands]
    grammar = actions_gbnf()
    plain = _engine(args)
    spec = _engine(args, draft="model", draft_model_path=args.draft, draft_k=args.k,
                   draft_adaptive=args.adaptive)
    decode = {"plain": [], "spec": []}
    gaps: list[int] = []
    stats = {"drafted": 0, "accepted": 0, "draft_ns": 0, "verify_ns": 0, "rounds": 0}
    identical = 0
    try:
        for cmd in commands:
            req = GenerationRequest(prompt=format_prompt(cmd), max_tokens=24, grammar=grammar)
            a = plain.generate(req)
            b = spec.generate(req)
            identical += a.tokens == b.tokens
            decode["plain"].append(a.token_ns[-1] - a.token_ns[0])
            decode["spec"].append(b.token_ns[-1] - b.token_ns[0])
            gaps.extend(y - x for x, y in zip(a.token_ns, a.token_ns[1:], strict=False))
            for key in stats:
                stats[key] += b.draft[key]
    finally:
        plain.close()
        spec.close()
    t1 = statistics.median(gaps)
    alpha = stats["accepted"] / stats["drafted"]
    k_mean = stats["drafted"] / stats["rounds"]
    c = (stats["draft_ns"] / stats["drafted"]) / t1
    v = max(0.0, ((stats["verify_ns"] / stats["rounds"]) / t1 - 1) / k_mean)
    e = expected_tokens_per_round(alpha, args.k)
    measured = sum(decode["plain"]) / sum(decode["spec"])
    predicted_v0 = e / (args.k * c + 1)
    predicted = e / (args.k * c + 1 + args.k * v)
    return {"k": args.k, "alpha": alpha, "c": c, "v": v, "target_pass_ms": t1 / 1e6,
            "verify_per_round_ms": stats["verify_ns"] / stats["rounds"] / 1e6,
            "drafted_per_round": k_mean, "rounds": stats["rounds"],
            "measured_speedup": measured, "predicted_speedup_v0": predicted_v0,
            "predicted_speedup": predicted, "measured_over_predicted": measured / predicted,
            "identical_outputs": identical, "n": len(commands)}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("overhead", "abort", "prefix", "specdec"):
        p = sub.add_parser(name, allow_abbrev=False)
        p.add_argument("--model", required=True)
        p.add_argument("--n-threads", type=int, default=1)
        p.add_argument("--n-ctx", type=int, default=1024)
        p.add_argument("--out", type=Path, default=None)
    sub.choices["overhead"].add_argument("--tokens", type=int, default=64)
    sub.choices["overhead"].add_argument("--runs", type=int, default=20)
    sub.choices["abort"].add_argument("--prompt-words", type=int, default=400)
    sub.choices["abort"].add_argument("--trials", type=int, default=30)
    sub.choices["abort"].add_argument("--chunk", type=int, default=0,
                                      help="prefill chunk tokens (0: the whole prompt at once)")
    sub.choices["prefix"].add_argument("--runs", type=int, default=30)
    sub.choices["specdec"].add_argument("--draft", required=True)
    sub.choices["specdec"].add_argument("-k", type=int, default=4)
    sub.choices["specdec"].add_argument("--adaptive", action="store_true")
    sub.choices["specdec"].add_argument("--commands", type=int, default=40)
    args = ap.parse_args()
    fn = {"overhead": bench_overhead, "abort": bench_abort, "prefix": bench_prefix,
          "specdec": bench_specdec}[args.what]
    result = fn(args)
    return emit_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
