"""The untimed pass of one demo level, batched against one command at a time.

Runs the pass of the demo's stream (the first ``--commands`` of ``steady_operator``) at one
level of the JSON planner (the model cache's ``planner-json-inflated-qwen2.5-0.5b.<level>.gguf``,
which ``make demo`` builds), with no cache, once per ``--sequences`` value, and writes the wall
and CPU seconds of each and whether every command's facts are the same::

    taskset -c 1 python bench/untimed_batch.py --level Q4_K_M --sequences 8 1 \
        --out docs/bench/untimed_batch.json
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import asdict, replace
from pathlib import Path

from benchio import emit_result

from robot_latency.models.ladder import JSON_INFLATED_PREFIX, default_cache_dir
from robot_latency.planner.config import RunSettings
from robot_latency.planner.resolve import resolve_run
from robot_latency.planner.untimed import run_untimed
from robot_latency.streams import SHIPPED_DIR, read_stream

log = logging.getLogger("untimed_batch")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--level", default="Q4_K_M")
    ap.add_argument("--inflate", default="qwen2.5-0.5b")
    ap.add_argument("--commands", type=int, default=30)
    ap.add_argument("--sequences", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--model", default="", help="a GGUF of the JSON planner instead of a level")
    ap.add_argument("--n-threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stream = read_stream(SHIPPED_DIR / "steady_operator")
    stream = replace(stream, commands=stream.commands[: args.commands])
    model = Path(args.model) if args.model else \
        default_cache_dir() / f"{JSON_INFLATED_PREFIX}{args.inflate}.{args.level}.gguf"
    run, _ = resolve_run(RunSettings(log_dir=Path(".untimed_batch"),
                                     model=str(model), profile="bundled-json",
                                     n_threads=args.n_threads))
    rows, passes = [], []
    for n in args.sequences:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        up = run_untimed(run, stream, cache_dir=None, sequences=n)
        wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        passes.append(up)
        rows.append({"sequences": n, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
                     "tokens_out": sum(c.tokens_out for c in up.commands),
                     "same_facts_as_first": up == passes[0]})
        log.info("sequences %d: %.1f s wall, %.1f s CPU, %d tokens, same facts: %s", n, wall_s,
                 cpu_s, rows[-1]["tokens_out"], rows[-1]["same_facts_as_first"])
    return emit_result({"model": str(model), "commands": len(stream.commands),
                        "n_threads": args.n_threads, "key": passes[0].key, "runs": rows,
                        "facts": [asdict(c) for c in passes[0].commands]}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
