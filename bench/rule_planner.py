"""Latency of the `rule` fallback planner (keyword matcher): it must answer well under 1 ms.

    python bench/rule_planner.py --commands 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from benchio import emit_result

from robot_latency.models.corpus import CorpusConfig, generate_corpus
from robot_latency.planner.config import RunSettings
from robot_latency.planner.fallback import FallbackChain, FallbackContext
from robot_latency.profiles.rules import rule_plan


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    commands = [c.text for c in generate_corpus(CorpusConfig()).heldout][: args.commands]
    chain = FallbackChain(("rule", "hold", "stop"), hold_max_age_ms=RunSettings().hold_max_age_ms)
    rule_ns: list[int] = []
    chain_ns: list[int] = []
    read = 0
    for _ in range(args.repeats):
        for cmd in commands:
            t0 = time.perf_counter_ns()
            steps = rule_plan(cmd)
            t1 = time.perf_counter_ns()
            chain.answer(FallbackContext(command=cmd, now_ns=t1))
            t2 = time.perf_counter_ns()
            rule_ns.append(t1 - t0)
            chain_ns.append(t2 - t1)
            read += steps is not None
    long_cmd = "pick up the red cup and put it on the tray " * 12  # ~500 characters
    long_ns = []
    for _ in range(200):
        t0 = time.perf_counter_ns()
        rule_plan(long_cmd)
        long_ns.append(time.perf_counter_ns() - t0)

    def us(values: list[int]) -> dict[str, float]:
        arr = np.asarray(values) / 1e3
        return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)),
                "max": float(arr.max()), "n": int(arr.size)}

    return emit_result({"rule_plan_us": us(rule_ns), "fallback_chain_us": us(chain_ns),
                        "long_command_us": us(long_ns),
                        "commands_read_fraction": read / len(rule_ns)}, args.out)


if __name__ == "__main__":
    sys.exit(main())
