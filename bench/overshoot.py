"""How late does the planner loop publish when the model misses its deadline?

Every cycle asks an engine that cannot finish in time, so every cycle falls back at the loop's
give-up time (deadline - publish margin): the publish time then measures how precisely the loop's
thread wakes while the engine burns CPU in its worker process. Reports, over N cycles:

    wake_late   published - give-up time (the thread's wake-up latency plus fallback + publish)
    overshoot   max(0, published - deadline)       (what the robot sees)

Load: the simulated engine spins on one core (``busy_wait``), like a one-thread CPU engine;
``--load-procs`` adds processes that spin too (2 cores here: 1 = both cores busy).

    python bench/overshoot.py --cycles 10000 --period-ms 20 --deadline-ms 10 --margin-ms 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

from robot_latency.planner.config import PlannerConfig
from robot_latency.planner.loop import PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.worker import ProcessRunner
from robot_latency.records import CycleRecord

CMD = "pick up the red cup and put it on the tray"


def _spin_forever() -> None:
    while True:
        pass


def stats_ms(values_ns: list[int]) -> dict[str, float]:
    arr = np.asarray(values_ns, dtype=np.float64) / 1e6
    p50, p99, p999 = np.percentile(arr, [50, 99, 99.9])
    return {"p50": float(p50), "p99": float(p99), "p99.9": float(p999), "max": float(arr.max()),
            "n": int(arr.size)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--period-ms", type=float, default=20.0)
    ap.add_argument("--deadline-ms", type=float, default=10.0)
    ap.add_argument("--margin-ms", type=float, default=2.0)
    ap.add_argument("--load-procs", type=int, default=0, help="extra spinning processes")
    ap.add_argument("--no-busy", action="store_true", help="engine sleeps instead of spinning")
    ap.add_argument("--worker-nice", type=int, default=5, help="niceness added to the engine")
    ap.add_argument("--rt", action="store_true",
                    help="run the loop under SCHED_FIFO priority 50 (needs root or CAP_SYS_NICE)")
    ap.add_argument("--pin", action="store_true",
                    help="pin the loop to CPU 0 and the engine worker to the other CPUs")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()

    # An engine that needs ~1 s per token at this efficiency: it never makes a 10 ms deadline.
    options = {"device": "orin-nano-4gb", "efficiency": 0.01, "busy_wait": not args.no_busy,
               "jitter_sigma": 0.0}
    loads = [mp.Process(target=_spin_forever, daemon=True) for _ in range(args.load_procs)]
    for p in loads:
        p.start()
    records: list[CycleRecord] = []
    try:
        n_cpu = os.cpu_count() or 1
        worker_cpus = tuple(range(1, n_cpu)) if args.pin and n_cpu > 1 else None
        if worker_cpus:
            os.sched_setaffinity(0, {0})
        with ProcessRunner("sim", options, hang_timeout_ms=5000, worker_nice=args.worker_nice,
                           worker_cpus=worker_cpus) as runner:
            if args.rt:
                # After the worker is spawned, so that only the loop runs real-time.
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
            loop = PlannerLoop(
                PlannerConfig(period_ms=args.period_ms, deadline_ms=args.deadline_ms,
                              publish_margin_ms=args.margin_ms, fallback=("rule", "stop")),
                runner, publish=lambda env: None, sink=records.append)
            loop.submit(InboundCommand("c0", CMD, loop.clock()))
            t0 = time.perf_counter()
            loop.run_periodic(args.cycles)
            wall_s = time.perf_counter() - t0
    finally:
        for p in loads:
            p.kill()
    ran = [r for r in records if not r.skipped]
    margin_ns = round(args.margin_ms * 1e6)
    wake = [r.published_ns - (r.deadline_ns - margin_ns) for r in ran]
    result = {
        "command": " ".join(sys.argv),
        "cycles": len(records),
        "skipped": len(records) - len(ran),
        "fallbacks": sum(r.plan_source == "fallback" for r in ran),
        "deadline_misses": sum(not r.deadline_met for r in records),
        "wake_late_ms": stats_ms(wake),
        "overshoot_ms": stats_ms([r.overshoot_ns for r in ran]),
        "load_procs": args.load_procs,
        "worker_nice": args.worker_nice,
        "pinned": bool(args.pin),
        "realtime_loop": bool(args.rt),
        "busy_engine": not args.no_busy,
        "wall_s": wall_s,
    }
    text = json.dumps(result, indent=2)
    sys.stdout.write(text + "\n")
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
