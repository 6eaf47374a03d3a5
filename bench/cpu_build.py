"""What the llama.cpp CPU settings cost: extra buffer types on/off and portable/native builds.

Per quant level, one child process per (build, extra_bufts) cell loads the model with the
project's engine (n_threads as given, no prefix cache, so every prompt is prefilled whole) and
runs ``--gens`` planner generations under the profile's grammar: TTFT (start to first token:
the whole prompt's prefill) and every inter-token gap. The cells are interleaved within each
repeat (order rotated each repeat), so a busy stretch of the machine falls on all of them.

    python bench/cpu_build.py --model planner-inflated-qwen2.5-0.5b --quants Q8_0,Q4_K_M,Q4_0 \\
        [--builds native=,portable=DIR] [--extra-bufts on,off] [--repeats 3] [--gens 8]

``--builds NAME=DIR``: DIR is put first on the child's ``PYTHONPATH`` (a llama-cpp-python
installed there with ``pip install --no-deps --target DIR WHEEL``); an empty DIR is the venv's
own. Each result carries the build's llama.cpp system info, so the JSON says what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchio import emit_result
from decode_shapes import machine_state

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
from robot_latency.engines import GenerationRequest, create_engine
from robot_latency.llama_load import llama_system_info
from robot_latency.profiles.profile import load_planning

path, extra_bufts, threads, gens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
planning = load_planning(None)
engine = create_engine("llamacpp", model_path=path, n_threads=threads, prefix_cache=False,
                       extra_bufts=extra_bufts, max_new_tokens=planning.max_tokens)
commands = ["pick up the red cup and put it on the tray", "go to the kitchen slowly",
            "bring the blue towel to the table", "stop"]
ttft, itl, tokens = [], [], 0
for i in range(gens + 1):  # the first is a warm-up
    p = planning.build(commands[i % len(commands)])
    t = engine.generate(GenerationRequest(prompt=p.suffix, prefix=p.prefix,
                                          max_tokens=planning.max_tokens,
                                          grammar=planning.contract.grammar,
                                          complete=planning.contract.kind))
    if i == 0 or not t.token_ns:
        continue
    ttft.append((t.token_ns[0] - t.started_ns) / 1e6)
    itl += [(b - a) / 1e6 for a, b in zip(t.token_ns, t.token_ns[1:])]
    tokens += len(t.token_ns)
info = engine.info()
engine.close()
print(json.dumps({"ttft_ms": ttft, "itl_ms": itl, "tokens": tokens,
                  "use_extra_bufts": info["load_policy"]["use_extra_bufts"],
                  "system_info": llama_system_info()}))
"""


def _cell(path: Path, build_dir: str, extra_bufts: str, args: argparse.Namespace
          ) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (build_dir, str(ROOT),
                                                     env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), extra_bufts,
                           str(args.threads), str(args.gens)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr[-500:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="planner-inflated-qwen2.5-0.5b",
                   help="a model name or GGUF (its ladder levels are built on first use)")
    p.add_argument("--quants", default="Q8_0,Q4_K_M,Q4_0")
    p.add_argument("--builds", default="venv=",
                   help="NAME=DIR,...: llama-cpp-python builds (DIR first on PYTHONPATH)")
    p.add_argument("--extra-bufts", default="on,off")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    from robot_latency.models.ladder import ladder_model_path

    builds = dict(item.split("=", 1) for item in args.builds.split(","))
    quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    bufts = [b.strip() for b in args.extra_bufts.split(",") if b.strip()]
    paths = {q: Path(ladder_model_path(args.model, q)) for q in quants}
    cells = [(q, b, e) for q in quants for b in builds for e in bufts]
    before = machine_state()
    runs: dict[str, list[dict[str, Any]]] = {f"{q}/{b}/{e}": [] for q, b, e in cells}
    for r in range(args.repeats):
        shift = r % len(cells)
        for q, b, e in cells[shift:] + cells[:shift]:
            runs[f"{q}/{b}/{e}"].append(_cell(paths[q], builds[b], e, args))
    table: dict[str, Any] = {}
    for key, reps in runs.items():
        ok = [x for x in reps if "error" not in x]
        table[key] = {
            "n_repeats": len(ok), "errors": [x["error"] for x in reps if "error" in x],
            "ttft_ms_p50": _median([_median(x["ttft_ms"]) for x in ok if x["ttft_ms"]]),
            "itl_ms_p50": _median([_median(x["itl_ms"]) for x in ok if x["itl_ms"]]),
            "itl_n": sum(len(x["itl_ms"]) for x in ok),
            "use_extra_bufts": ok[0]["use_extra_bufts"] if ok else None,
            "system_info": ok[0]["system_info"] if ok else None}
    ratios: dict[str, Any] = {}
    for q in quants:
        for b in builds:
            on, off = table.get(f"{q}/{b}/on"), table.get(f"{q}/{b}/off")
            if on and off and on["itl_ms_p50"] and off["itl_ms_p50"]:
                ratios[f"{q}/{b} off/on"] = {
                    "itl": round(off["itl_ms_p50"] / on["itl_ms_p50"], 3),
                    "ttft": round(off["ttft_ms_p50"] / on["ttft_ms_p50"], 3)}
        names = list(builds)
        for other in names[1:]:
            for e in bufts:
                a, c = table.get(f"{q}/{names[0]}/{e}"), table.get(f"{q}/{other}/{e}")
                if a and c and a["itl_ms_p50"] and c["itl_ms_p50"]:
                    ratios[f"{q}/{e} {other}/{names[0]}"] = {
                        "itl": round(c["itl_ms_p50"] / a["itl_ms_p50"], 3),
                        "ttft": round(c["ttft_ms_p50"] / a["ttft_ms_p50"], 3)}
    return emit_result({"model": args.model, "quants": quants, "builds": builds,
                        "threads": args.threads, "gens": args.gens, "repeats": args.repeats,
                        "cells": table, "ratios": ratios,
                        "machine_before": before, "machine_after": machine_state()},
                       args.out)


if __name__ == "__main__":
    sys.exit(main())
