"""The answer on the target without this host's speed: the untimed pass per level (quiet, and
with the cores kept busy), the answers from each, and how long the simulation takes.

    python bench/target_sim.py --model planner-inflated-qwen2.5-0.5b \
        --quants Q8_0 Q4_K_M Q4_0 --load 2 --out docs/bench/target_sim.json
    python bench/target_sim.py --engine sim --model qwen2.5-0.5b --smoke

Per level: the untimed pass's wall time (no cache; ``--first-from-cache``: the first pass from
the cache where it is there), run once on the machine as it is and once with ``--load`` busy
processes (one per core kept busy); the two passes' facts must be the same (tokens, plans, stop
reasons), and so the predicted target miss rate and p50 e2e. Then the
simulation: ``--draws`` Monte Carlo draws x the levels, best of ``--repeats``, with and without
the deadline curve.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.lifetime import popen
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_inputs import TargetInputs, untimed_inputs
from robot_latency.planner.target_sim import sim_commands, target_answer
from robot_latency.report.target_answer import answers_from_inputs
from robot_latency.streams import SHIPPED_DIR, read_stream


def _busy(n: int) -> list[subprocess.Popen[bytes]]:
    return [popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def _facts(inputs: TargetInputs) -> list[tuple[Any, ...]]:
    return [(c.command_id, c.uncached_prompt_tokens, c.tokens_out, c.stop_reason, c.text)
            for c in inputs.untimed.commands]


def _summary(a: Any) -> dict[str, Any]:
    return {"miss_rate": a.miss_rate, "miss_interval": list(a.miss_interval),
            "model_in_time_rate": a.model_in_time_rate, "e2e_p50_ms": a.e2e_p50_ms,
            "e2e_p99_ms": a.e2e_p99_ms, "min_deadline_ms": a.min_deadline_ms,
            "commands": a.commands}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default=RunSettings().engine)
    ap.add_argument("--model", default="planner-inflated-qwen2.5-0.5b")
    ap.add_argument("--quants", nargs="+", default=["Q8_0", "Q4_K_M", "Q4_0"])
    ap.add_argument("--stream", type=Path, default=SHIPPED_DIR / "steady_operator")
    ap.add_argument("--speed", type=float, default=3.0)
    ap.add_argument("--mode", default="event")
    ap.add_argument("--deadline-ms", type=float, default=400.0)
    ap.add_argument("--device", default="orin-nano-8gb")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="busy processes for the second pass")
    ap.add_argument("--first-from-cache", action="store_true",
                    help="take the first pass from the untimed cache where it is there (e.g. "
                         "the demo's); the loaded pass always runs")
    ap.add_argument("--smoke", action="store_true", help="3 commands, 50 draws, 1 repeat")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stream = read_stream(args.stream)
    if args.smoke:
        stream = type(stream)(stream.name, stream.source, stream.commands[:3], stream.topic)
        args.draws, args.repeats = 50, 1
    levels: dict[str, Any] = {}
    inputs: dict[str, dict[str, TargetInputs]] = {"quiet": {}, "loaded": {}}
    for q in args.quants:
        settings = RunSettings(log_dir=Path("bench-target-sim"), engine=args.engine,
                               model=args.model, quant=q, mode=args.mode,
                               deadline_ms=args.deadline_ms, target_device=args.device)
        row: dict[str, Any] = {}
        for kind in ("quiet", "loaded") if args.load else ("quiet",):
            procs = _busy(args.load) if kind == "loaded" else []
            try:
                t0 = time.perf_counter()
                cached = kind == "quiet" and args.first_from_cache
                inputs[kind][q] = untimed_inputs(settings, stream, speed=args.speed,
                                                 use_cache=cached)
                row[f"untimed_pass_{kind}_s"] = time.perf_counter() - t0
            finally:
                _stop(procs)
        up = inputs["quiet"][q].untimed
        row.update(commands=len(up.commands),
                   tokens_out_total=sum(c.tokens_out for c in up.commands),
                   plans_valid=sum(c.plan_valid for c in up.commands),
                   stop_reasons=sorted({str(c.stop_reason) for c in up.commands}))
        if args.load:
            row["same_facts_quiet_and_loaded"] = (_facts(inputs["quiet"][q])
                                                  == _facts(inputs["loaded"][q]))
        levels[q] = row
    answers = {kind: answers_from_inputs([(q, i, None) for q, i in by.items()],
                                         draws=args.draws)
               for kind, by in inputs.items() if by}
    for kind, rows in answers.items():
        for a in rows:
            levels[a.label][f"answer_{kind}"] = _summary(a)
    # the simulation's time: the levels x draws, as predict --stream and the report run it
    prepared = []
    for q, i in inputs["quiet"].items():
        steps = i.predictor()
        prepared.append((q, sim_commands(stream, i.untimed, steps, speed=args.speed), steps,
                         i.settings))
    best_point, best_curve = float("inf"), float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for q, cmds, steps, s in prepared:
            target_answer(q, cmds, steps, s, draws=args.draws, curve=False)
        t1 = time.perf_counter()
        answers_from_inputs([(q, i, None) for q, i in inputs["quiet"].items()],
                            draws=args.draws)
        t2 = time.perf_counter()
        best_point, best_curve = min(best_point, t1 - t0), min(best_curve, t2 - t1)
    return emit_result({
        "engine": args.engine, "model": args.model, "stream": str(args.stream),
        "speed": args.speed, "mode": args.mode, "deadline_ms": args.deadline_ms,
        "device": args.device, "load_processes": args.load,
        "first_pass_from_cache": args.first_from_cache, "levels": levels,
        "simulation": {"commands": len(stream.commands), "levels": len(args.quants),
                       "draws": args.draws, "repeats": args.repeats,
                       "best_s_at_the_deadline": best_point,
                       "best_s_with_curve_and_min_deadline_and_step_predictions": best_curve},
        "note": "measured on a shared 2-core machine (other jobs running): not a headline "
                "figure"}, args.out)


if __name__ == "__main__":
    sys.exit(main())
