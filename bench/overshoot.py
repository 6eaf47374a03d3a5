"""How late does the planner loop publish when the model misses its deadline?

Every cycle asks an engine that cannot finish in time, so every cycle falls back at the loop's
give-up time (deadline - publish margin): the publish time then measures how precisely the loop's
thread wakes while the engine burns CPU in its worker process. The margin is the CLI's default
(learned from the loop's own lateness, ``--margin-ms -1``) unless ``--margin-ms`` fixes it; each
cycle's own margin is read from its record. Reports, over N cycles:

    wake_late   published - give-up time (the thread's wake-up latency plus fallback + publish)
    overshoot   max(0, published - deadline)       (what the robot sees)

Load: the simulated engine spins on one core (``busy_wait``), like a one-thread CPU engine;
``--load-procs`` adds processes that spin too (2 cores here: 1 = both cores busy).

The core budget is the product's own (:class:`~robot_latency.planner.budget.CpuBudget`, the
``loop_cpus`` / ``engine_cpus`` / ``engine_nice`` / ``loop_priority`` settings). Every cycle
also records the CPU time the hypervisor stole from this machine since the previous one
(Linux's steal counter, 10 ms ticks), so a late publish the guest could not prevent is told
apart from one the loop caused. ``--baseline`` measures the machine itself: the same budget
and load, but the loop's thread only sleeps to each give-up time and notes how late it woke
(like ``cyclictest``), with no planner, worker pipe or records.

    python bench/overshoot.py --cycles 10000 --period-ms 20 --deadline-ms 10   # CLI default
    python bench/overshoot.py --cycles 10000 --period-ms 20 --deadline-ms 10 --margin-ms 2 \
        --pin --rt
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from benchio import emit_result

from robot_latency.cli.run_args import CLI_PUBLISH_MARGIN_MS
from robot_latency.lifetime import start_process
from robot_latency.planner.budget import CpuBudget, apply_to_loop_thread, freeze_heap
from robot_latency.planner.config import RunSettings
from robot_latency.planner.loop import PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.margin import PUBLISH_FLOOR_MS
from robot_latency.planner.worker import ProcessRunner
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord

CMD = "pick up the red cup and put it on the tray"


def _spin_forever() -> None:
    while True:
        pass


def _steal_ns() -> int:
    return round(psutil.cpu_times().steal * 1e9)


def stats_ms(values_ns: list[int]) -> dict[str, float] | None:
    if not values_ns:
        return None
    arr = np.asarray(values_ns, dtype=np.float64) / 1e6
    p50, p99, p999 = np.percentile(arr, [50, 99, 99.9])
    return {"p50": float(p50), "p99": float(p99), "p99.9": float(p999), "max": float(arr.max()),
            "n": int(arr.size)}


def _late_split(late_ns: list[int], steal_ns: list[int], *,
                threshold_ns: int = 0) -> dict[str, object]:
    """Cycles late by more than ``threshold_ns``, how many of them saw the host steal CPU, and
    the lateness over the cycles during which it stole none."""
    late = [i for i, v in enumerate(late_ns) if v > threshold_ns]
    clean = [v for v, s in zip(late_ns, steal_ns, strict=True) if s == 0]
    return {"late_cycles": len(late),
            "late_cycles_with_host_steal": sum(1 for i in late if steal_ns[i] > 0),
            "cycles_with_host_steal": sum(1 for s in steal_ns if s > 0),
            "host_steal_ms_total": sum(steal_ns) / 1e6,
            "without_host_steal_ms": stats_ms(clean)}


def _planner(args: argparse.Namespace, budget: CpuBudget) -> dict[str, object]:
    """The real loop: every cycle falls back at its give-up time while the engine burns CPU."""
    # An engine that needs ~1 s per token at this efficiency: it never makes a 10 ms deadline.
    options = {"device": "orin-nano-4gb", "efficiency": 0.01, "busy_wait": not args.no_busy,
               "jitter_sigma": 0.0}
    # Only integers are kept per cycle (tuples of ints are not tracked by the garbage
    # collector): the product writes its records to disk, and 10,000 live CycleRecords would
    # make the bench's own full collections, not the loop, the tail.
    records: list[tuple[int, int, int, int, bool, bool, int]] = []
    last_steal = [_steal_ns()]

    def sink(rec: CycleRecord) -> None:
        now = _steal_ns()
        records.append((rec.published_ns or 0, rec.deadline_ns, rec.overshoot_ns or 0,
                        now - last_steal[0], rec.skipped, rec.plan_source == "fallback",
                        rec.margin_ns or 0))
        last_steal[0] = now

    with ProcessRunner("sim", options, hang_timeout_ms=5000, worker_nice=budget.engine_nice,
                       worker_cpus=budget.resolved_engine_cpus(),
                       spin_ms=budget.spin_ms,
                       nap_ms=0.0 if args.no_nap else budget.nap_ms) as runner:
        # After the worker is spawned (it resets its own scheduler anyway).
        state = apply_to_loop_thread(budget)
        loop = PlannerLoop(
            RunSettings(period_ms=args.period_ms, deadline_ms=args.deadline_ms,
                        publish_margin_ms=args.margin_ms, fallback=("rule", "stop")),
            runner, publish=lambda env: None, sink=sink, planning=load_planning(None))
        loop.submit(InboundCommand("c0", CMD, loop.clock()))
        if not args.no_freeze:
            state["gc_frozen_objects"] = freeze_heap()
        last_steal[0] = _steal_ns()
        t0 = time.perf_counter()
        loop.run_periodic(args.cycles)
        wall_s = time.perf_counter() - t0
    ran = [r for r in records if not r[4]]
    wake = [pub - (dl - margin) for pub, dl, *_, margin in ran]
    margins = [r[6] for r in ran]
    overshoot = [r[2] for r in ran]
    return {
        "cycles": len(records),
        "skipped": len(records) - len(ran),
        "fallbacks": sum(r[5] for r in ran),
        "deadline_misses": sum(r[4] or r[0] > r[1] for r in records),
        "wake_late_ms": stats_ms(wake),
        "overshoot_ms": stats_ms(overshoot),
        "overshoot": _late_split(overshoot, [r[3] for r in ran]),
        "margin_ms": stats_ms(margins),
        "publish_margin": loop.publish_margin.summary(),
        "loop_thread": state,
        "wall_s": wall_s,
    }


def _baseline(args: argparse.Namespace, budget: CpuBudget) -> dict[str, object]:
    """The machine alone: sleep to each give-up time (1.5 ms spin at the end), note the delay."""
    proc = start_process(mp.get_context("spawn"), _spin_forever, daemon=True)
    # the engine's stand-in, on the engine's cores at the engine's niceness
    engine_cpus = budget.resolved_engine_cpus()
    if engine_cpus:
        os.sched_setaffinity(proc.pid, engine_cpus)
    os.setpriority(os.PRIO_PROCESS, proc.pid, budget.engine_nice)
    try:
        state = apply_to_loop_thread(budget)
        margin_ms = args.margin_ms if args.margin_ms >= 0 else PUBLISH_FLOOR_MS
        period, offset = round(args.period_ms * 1e6), round((args.deadline_ms
                                                             - margin_ms) * 1e6)
        spin = 1_500_000
        late: list[int] = []
        steal: list[int] = []
        last = _steal_ns()
        start = time.monotonic_ns() + period
        t0 = time.perf_counter()
        for n in range(args.cycles):
            target = start + n * period + offset
            while (left := target - time.monotonic_ns()) > spin:
                time.sleep((left - spin) / 1e9)
            while time.monotonic_ns() < target:
                pass
            late.append(time.monotonic_ns() - target)
            now = _steal_ns()
            steal.append(now - last)
            last = now
        wall_s = time.perf_counter() - t0
    finally:
        proc.kill()
    return {"cycles": args.cycles, "wake_late_ms": stats_ms(late),
            # later than the margin: the publish would have missed the deadline
            "wake_late": _late_split(late, steal, threshold_ns=round(margin_ms * 1e6)),
            "loop_thread": state, "wall_s": wall_s}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--cycles", type=int, default=10000)
    ap.add_argument("--period-ms", type=float, default=20.0)
    ap.add_argument("--deadline-ms", type=float, default=10.0)
    ap.add_argument("--margin-ms", type=float, default=CLI_PUBLISH_MARGIN_MS,
                    help="publish margin; < 0 (the CLI's default): learned (--baseline: 2 ms)")
    ap.add_argument("--load-procs", type=int, default=0, help="extra spinning processes")
    ap.add_argument("--no-busy", action="store_true", help="engine sleeps instead of spinning")
    ap.add_argument("--worker-nice", type=int, default=5, help="niceness added to the engine")
    ap.add_argument("--rt", action="store_true",
                    help="loop_priority=50: the loop under SCHED_FIFO (needs rtprio rights)")
    ap.add_argument("--pin", action="store_true",
                    help="loop_cpus=0: the loop on CPU 0, the engine worker on the others")
    ap.add_argument("--no-nap", action="store_true",
                    help="unpinned: poll the last stretch without napping (the earlier wait)")
    ap.add_argument("--no-freeze", action="store_true",
                    help="do not freeze the start-up heap (gc.freeze) before the loop starts")
    ap.add_argument("--baseline", action="store_true",
                    help="the machine's own wake-up latency: no planner, same budget and load")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()

    n_cpu = len(os.sched_getaffinity(0))
    budget = CpuBudget(loop_cpus=(0,) if args.pin and n_cpu > 1 else (),
                       engine_nice=args.worker_nice, loop_priority=50 if args.rt else 0)
    loads = [start_process(mp, _spin_forever, daemon=True) for _ in range(args.load_procs)]
    try:
        if args.baseline:
            result = _baseline(args, budget)
        else:
            result = _planner(args, budget)
    finally:
        for p in loads:
            p.kill()
    result.update(load_procs=args.load_procs, budget=budget.to_dict(),
                  busy_engine=not args.no_busy,
                  spin_ms=budget.spin_ms, nap_ms=0.0 if args.no_nap else budget.nap_ms,
                  load_avg_1min=os.getloadavg()[0])
    return emit_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
