"""Long-run reliability of the planner loop with a real engine: soak, flood, recovery.

    soak      N cycles of the llama.cpp planner (periodic, one command re-planned each tick with
              a rotating set of commands): RSS growth after warm-up, lost records, overshoot,
              miss rate.
    flood     commands at --flood-x times the cycle rate while the engine is slow (sim engine at
              a low efficiency): memory bound, drop counts, overshoot.
    recovery  the engine worker is SIGKILLed at cycle --kill-at: how many cycles fell back, and
              when the model answered again.

    python bench/soak.py soak --cycles 10000 --period-ms 60 --deadline-ms 50
    python bench/soak.py flood --cycles 1000 --flood-x 100
    python bench/soak.py recovery --cycles 200 --kill-at 50
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from benchio import emit_result

from robot_latency.planner.budget import CpuBudget, parse_cpu_list
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.resolve import ResolvedRun, resolve_run
from robot_latency.records import read_records

COMMANDS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
            "bring me the blue bottle", "find the green ball then go to the garage quickly"]


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    arr = np.asarray(values, dtype=np.float64)
    p50, p99 = np.percentile(arr, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(arr.max()), "n": int(arr.size)}


def _run(args: argparse.Namespace, config: ResolvedRun, *, per_cycle: Any = None) -> dict[str, Any]:
    rss: list[int] = []
    procs: list[psutil.Process] = []
    with PlannerRun(config, publish=lambda env: None) as run:
        loop_thread = run.enter_loop_thread()  # the CPU budget and frozen heap, as the node
        procs = [psutil.Process()]
        loop = run.loop
        original = loop.sink

        def sink(rec: Any) -> None:
            original(rec)
            total = 0
            for p in [*procs, *([psutil.Process(run.runner.pid)] if getattr(
                    run.runner, "pid", None) else [])]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            rss.append(total)
            if per_cycle is not None:
                per_cycle(run, rec)

        loop.sink = sink
        t0 = time.perf_counter()
        n = 0
        while n < args.cycles:
            loop.submit(InboundCommand(f"c{n}", COMMANDS[n % len(COMMANDS)], loop.clock()))
            n += loop.run_periodic(min(args.batch, args.cycles - n))
        wall_s = time.perf_counter() - t0
        summary = run.close()
    records = read_records(config.log_dir / "cycles.jsonl")
    warm = min(len(rss) - 1, args.warmup)
    return {"summary": summary, "records": records, "rss": rss, "warm": warm, "wall_s": wall_s,
            "loop_thread": loop_thread}


def _common(out: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    summary, records, rss, warm = out["summary"], out["records"], out["rss"], out["warm"]
    ids = [r.cycle for r in records]
    return {
        "cycles_asked": args.cycles,
        "records": len(records),
        "lost_or_duplicated": len(ids) - len(set(ids)) + (max(ids) + 1 - len(set(ids))
                                                          if ids else 0),
        "deadline_misses": summary["deadline_misses"],
        "deadline_miss_rate": summary["deadline_miss_rate"],
        "deadline_miss_rate_ci95": summary["deadline_miss_rate_ci95"],
        "fallbacks": summary["fallbacks"],
        "overshoot_ms": _pcts([r.overshoot_ns / 1e6 for r in records
                               if r.overshoot_ns is not None]),
        "itl_ms": {k: summary["itl_ms"][k] for k in ("p50", "p99", "max", "n")},
        "ttft_ms": {k: summary["ttft_ms"][k] for k in ("p50", "p99", "max", "n")},
        "rss_after_warmup_mb": rss[warm] / 1e6 if rss else None,
        "rss_end_mb": rss[-1] / 1e6 if rss else None,
        "rss_growth_mb": (rss[-1] - rss[warm]) / 1e6 if rss else None,
        "rss_max_mb": max(rss) / 1e6 if rss else None,
        "engine_restarts": summary["engine_restarts"],
        "mailbox": summary["mailbox"],
        "host_steal_ms": summary.get("host_steal_ms"),
        "loop_thread": out["loop_thread"],
        "wall_s": out["wall_s"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("soak", "flood", "recovery"))
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--period-ms", type=float, default=60.0)
    ap.add_argument("--deadline-ms", type=float, default=50.0)
    ap.add_argument("--model", default="", help="GGUF for the llama.cpp engine (default bundled)")
    ap.add_argument("--n-threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=200, help="cycles before RSS is baselined")
    ap.add_argument("--batch", type=int, default=50, help="cycles per run_periodic call")
    ap.add_argument("--flood-x", type=int, default=100, help="flood: commands per cycle")
    ap.add_argument("--kill-at", type=int, default=50, help="recovery: cycle to kill at")
    ap.add_argument("--loop-cpus", type=parse_cpu_list, default=(),
                    help="CPUs of the loop's thread (the engine gets the others), e.g. 0")
    ap.add_argument("--loop-priority", type=int, default=0,
                    help="SCHED_FIFO priority of the loop's thread (0: normal scheduler)")
    ap.add_argument("--log-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"soak-{args.what}-")) / "run"
    settings = RunSettings(period_ms=args.period_ms, deadline_ms=args.deadline_ms,
                           log_dir=log_dir,
                           cpu=CpuBudget(loop_cpus=args.loop_cpus,
                                         loop_priority=args.loop_priority))
    if args.what == "flood":
        config, _ = resolve_run(replace(
            settings, engine="sim", engine_options={"efficiency": 0.05}, model="qwen2.5-0.5b",
            quant="Q4_K_M", target_device="orin-nano-4gb"))

        def flood(run: PlannerRun, rec: Any) -> None:
            for i in range(args.flood_x):
                run.loop.submit(InboundCommand(f"f{rec.cycle}-{i}", COMMANDS[i % 5],
                                               run.loop.clock()))

        out = _run(args, config, per_cycle=flood)
    else:
        config, _ = resolve_run(replace(settings, engine="llamacpp", model=args.model or None,
                                        n_threads=args.n_threads))
        killed: dict[str, int] = {}

        def kill(run: PlannerRun, rec: Any) -> None:
            if args.what == "recovery" and rec.cycle == args.kill_at and not killed:
                killed["cycle"] = rec.cycle
                run.runner.kill_worker()

        out = _run(args, config, per_cycle=kill)
    result = _common(out, args)
    if args.what == "recovery":
        recs = out["records"]
        after = [r for r in recs if r.cycle > args.kill_at]
        first_model = next((r for r in after if r.plan_source == "model"), None)
        result["recovery"] = {
            "killed_after_cycle": args.kill_at,
            "fallback_cycles_after_kill": sum(r.plan_source != "model" for r in after[
                : (first_model.cycle - args.kill_at) if first_model else len(after)]),
            "first_model_plan_cycle": first_model.cycle if first_model else None,
            "recovery_ms": ((first_model.published_ns - recs[args.kill_at].published_ns) / 1e6
                            if first_model else None),
        }
    result["log_dir"] = str(log_dir)
    return emit_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
