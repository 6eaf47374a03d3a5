"""planner_node against the node a user would write, measured where the plans are received.

For each quantization level of the demo's model (the shipped planner inflated into the
Qwen2.5-0.5B shape): ``planner_node`` (event mode, deadline, fallback) and ``bench/naive_node.py``
(rclpy + ``create_completion`` per command, no deadline, no fallback), each fed the same stream
by the same ``bag_replayer``, which measures at its subscriber: reaction time p50/p99/max, the
share of commands answered after the deadline or never, and the worst gap between plans.

    python bench/client_edge.py --out docs/bench/client_edge.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.demo import DemoConfig, _bin, _ros_args, run_one
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.ladder import (
    INFLATED_PREFIX,
    build_ladder,
    default_cache_dir,
    ensure_inflated,
)
from robot_latency.streams import SHIPPED_DIR

NAIVE = Path(__file__).resolve().parent / "naive_node.py"
KEYS = ("commands", "answered", "answered_late", "superseded", "unanswered",
        "late_or_never_rate", "receiver_miss_rate", "receiver_miss_rate_ci95",
        "reaction_client_ms", "worst_plan_gap_ms", "plans_unmatched")


def run_naive(model: Path, *, stream: Path, out: Path, speed: float, deadline_ms: float,
              n_threads: int, tail_s: float) -> dict[str, Any]:
    """Run the naive node and the replayer once; return the client summary."""
    out.mkdir(parents=True)
    env = {**os.environ, "ROS_DOMAIN_ID": str(random.randint(1, 200)),
           "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "PYTHONUNBUFFERED": "1"}
    with open(out / "naive_node.log", "wb") as nlog, open(out / "bag_replayer.log", "wb") as rlog:
        node = subprocess.Popen([sys.executable, str(NAIVE), *_ros_args(
            {"model": str(model), "n_threads": n_threads})], env=env, stdout=nlog,
            stderr=subprocess.STDOUT)
        try:
            subprocess.run([_bin("bag_replayer"), *_ros_args(
                {"bag": str(stream), "speed": speed, "tail_s": tail_s,
                 "wait_for_subscriber_s": 300.0, "deadline_ms": deadline_ms,
                 "client_log_dir": str(out)})],
                env=env, stdout=rlog, stderr=subprocess.STDOUT, timeout=1800, check=True)
        finally:
            node.send_signal(signal.SIGINT)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
    return json.loads((out / "client_summary.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quants", default="Q8_0,Q4_K_M,Q4_0")
    ap.add_argument("--stream", default=str(SHIPPED_DIR / "steady_operator"))
    ap.add_argument("--speed", type=float, default=3.0)
    ap.add_argument("--deadline-ms", type=float, default=400.0)
    ap.add_argument("--n-threads", type=int, default=1, help="engine threads, both nodes")
    ap.add_argument("--tail-s", type=float, default=10.0,
                    help="how long the replayer waits for late plans after the last command")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    quants = args.quants.split(",")
    cache = default_cache_dir()
    src = ensure_inflated(bundled_model_path("planner"), "qwen2.5-0.5b", cache)
    man = build_ladder(src, cache, quants=quants, name=INFLATED_PREFIX + "qwen2.5-0.5b")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="client_edge-"))
    cpus = sorted(os.sched_getaffinity(0))
    budget = {"loop_cpus": str(cpus[0])} if len(cpus) > 1 else {}
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    for q in quants:
        model = man.path(q)
        config = DemoConfig(label=q, params={
            "engine": "llamacpp", "model": str(model), "device_profile": "orin-nano-8gb",
            "mode": "event", "deadline_ms": args.deadline_ms,
            "period_ms": max(500.0, args.deadline_ms), "n_threads": args.n_threads, **budget})
        run_dir = run_one(config, stream=Path(args.stream), run_dir=work / q / "planner_node",
                          speed=args.speed, tail_s=args.tail_s)
        planner = json.loads((run_dir / "client_summary.json").read_text())
        naive = run_naive(model, stream=Path(args.stream), out=work / q / "naive_node",
                          speed=args.speed, deadline_ms=args.deadline_ms,
                          n_threads=args.n_threads, tail_s=args.tail_s)
        results[q] = {"planner_node": {k: planner.get(k) for k in KEYS},
                      "naive_node": {k: naive.get(k) for k in KEYS}}
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return emit_result({"stream": args.stream, "speed": args.speed,
                        "deadline_ms": args.deadline_ms, "n_threads": args.n_threads,
                        "loop_cpus": budget.get("loop_cpus"), "cpus": len(cpus),
                        "seconds": round(time.perf_counter() - t0, 1), "levels": results},
                       args.out)


if __name__ == "__main__":
    sys.exit(main())
