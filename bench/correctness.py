"""Correctness and goodput per quantization level, with the fallback `rule` against `hold`.

On the shipped labelled streams (their labels.jsonl: held-out commands with their plans, a fifth
off-vocabulary and labelled "refuse"), each cell is one level x one fallback chain, replayed in
event mode back to back (asap) through the real llama.cpp engine; cells are interleaved
(repeat, level, fallback) so a change in the machine's load spreads over all of them. Per cell:
correct rate, goodput (correct and published by the deadline), refusal rates; then medians over
the repeats, with n.

    python bench/correctness.py --levels Q8_0,Q4_K_M,Q4_0 --fallbacks rule,hold --repeats 3 \
        --deadline-ms 400 --out docs/bench/correctness.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.planner.config import RunSettings
from robot_latency.planner.replay import run_replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.profiles.labels import default_labels_path, label_schema, read_labels
from robot_latency.report.correctness import correctness_rows
from robot_latency.streams import SHIPPED_DIR, SHIPPED_STREAMS, CommandStream, read_stream

FIGURES = ("correct_rate", "goodput_rate", "correct_rate_model", "correct_rate_fallback",
           "refuse_rate", "in_domain_refuse_rate", "fallback_goodput_rule",
           "fallback_goodput_hold")


def _stream(names: list[str], limit: int | None) -> tuple[CommandStream, list[Path]]:
    """Return the named shipped streams as one stream (asap: their times do not count)."""
    commands, bags = [], []
    for name in names:
        bag = SHIPPED_DIR / name
        bags.append(bag)
        commands.extend(read_stream(bag).commands[:limit])
    commands = [c.__class__(t_ns=i, text=c.text, command_id=c.command_id)
                for i, c in enumerate(commands)]
    return CommandStream(name="+".join(names), source=str(bags[0]), commands=tuple(commands),
                         topic=None), bags


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="Q8_0,Q4_K_M,Q4_0")
    ap.add_argument("--fallbacks", default="rule,hold")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="planner", help="the model whose ladder levels run")
    ap.add_argument("--streams", default=",".join(s.name for s in SHIPPED_STREAMS))
    ap.add_argument("--limit", type=int, default=None, help="first N commands of each stream")
    ap.add_argument("--deadline-ms", type=float, default=400.0)
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    levels, fallbacks = args.levels.split(","), args.fallbacks.split(",")
    stream, bags = _stream(args.streams.split(","), args.limit)
    cells: dict[str, list[dict[str, Any]]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-correctness-") as tmp:
        labels = None
        for repeat in range(args.repeats):
            for level in levels:
                for policy in fallbacks:
                    key = f"{level} {policy}"
                    run_dir = Path(tmp) / f"{level}-{policy}-{repeat}"
                    settings = RunSettings(
                        engine="llamacpp", model=args.model, quant=level, mode="event",
                        deadline_ms=args.deadline_ms, period_ms=args.deadline_ms,
                        fallback=(policy, "stop"), log_dir=run_dir, label=key,
                        **({"n_threads": args.n_threads} if args.n_threads else {}),
                        extra={"replay": {"mode": "asap", "speed": 1.0}})
                    config, _ = resolve_run(settings)
                    if labels is None:
                        schema = label_schema(config.planning.contract)
                        labels = read_labels(default_labels_path(bags[0]), schema=schema)
                        for bag in bags[1:]:
                            more = read_labels(default_labels_path(bag), schema=schema)
                            labels.by_text.update(more.by_text)
                    run_replay(config, stream, asap=True, labels=labels)
                    row = correctness_rows([run_dir])[0].to_dict()
                    cells.setdefault(key, []).append(row)
                    sys.stderr.write(f"[{repeat + 1}/{args.repeats}] {key}: correct "
                                     f"{row['correct_rate']:.3f} goodput "
                                     f"{row['goodput_rate']:.3f}\n")

    def median(key: str, fig: str) -> float | None:
        values = [r[fig] for r in cells[key] if r[fig] is not None]
        return statistics.median(values) if values else None

    summary = {key: {"n_repeats": len(rows), "correct_n": rows[0]["correct_n"],
                     **{f"{fig}_median": median(key, fig) for fig in FIGURES}}
               for key, rows in cells.items()}
    return emit_result({
        "what": "correctness and goodput per level and fallback, medians over repeats",
        "conditions": {"levels": levels, "fallbacks": fallbacks, "repeats": args.repeats,
                       "model": args.model, "streams": args.streams, "limit": args.limit,
                       "commands": len(stream.commands), "deadline_ms": args.deadline_ms,
                       "mode": "event, asap", "interleaved": "repeat > level > fallback",
                       "on_time_at": "publish (in-process run: no receiver)"},
        "summary": summary, "cells": cells, "wall_s": round(time.perf_counter() - t0, 1),
    }, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
