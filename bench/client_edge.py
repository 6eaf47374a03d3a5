"""planner_node against the node a user would write, measured where the plans are received.

For each quantization level of the demo's model (the shipped planner inflated into the
Qwen2.5-0.5B shape), each node configuration is fed the same stream by the same
``bag_replayer``, which measures at its subscriber: reaction time p50/p99/max, the commands
answered by the model within the deadline, the share answered after the deadline or never, and
the worst gap between plans. Node configurations (``--nodes``):

    planner           planner_node, event mode, deadline, fallback, on_new_command=queue, the
                      default CPU budget (loop not pinned, engine niced on every core)
    planner-preempt   the same with on_new_command=preempt
    planner-action    planner, each command sent as a planner/plan_command goal (the PlanCommand
                      action) instead of on the topic; its result is the plan received
    naive             bench/naive_node.py (rclpy + create_completion per command, no deadline,
                      no fallback) at its best settings: prefill on every core, the grammar
    naive-nogrammar   the same without the grammar

Runs are interleaved (repeat 1: every configuration, repeat 2: every configuration in another
order, ...), so a machine that slows down over the run spreads over all of them; each figure is
the median over the repeats, with n.

    python bench/client_edge.py --repeats 3 --out docs/bench/client_edge.json
    python bench/client_edge.py --nodes planner,planner-preempt --stream bursty_operator \\
        --repeats 3 --out docs/bench/on_new_command_bursty.json
    python bench/client_edge.py --nodes planner,planner-action --quants Q4_0 --repeats 3 \\
        --out docs/bench/action_vs_topic.json

``--busy CORES`` keeps those cores busy for the whole bench, one spinning process pinned to
each (started before the first run, ended at the last): the receiver against the planner under
load. A busy figure, never a headline.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.demo_job import DemoConfig, _bin, run_one
from robot_latency.lifetime import popen
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.ladder import (
    INFLATED_PREFIX,
    build_ladder,
    default_cache_dir,
    ensure_inflated,
)
from robot_latency.records import read_records
from robot_latency.report.client import compare_edges, read_client_log, read_client_rows
from robot_latency.rosenv import ros_args
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

NAIVE = Path(__file__).resolve().parent / "naive_node.py"
NODES = ("planner", "planner-preempt", "planner-action", "naive", "naive-nogrammar")
KEYS = ("via", "commands", "answered", "answered_late", "superseded", "unanswered",
        "late_or_never_rate", "receiver_miss_rate", "receiver_miss_rate_ci95",
        "reaction_client_ms", "worst_plan_gap_ms", "plans_unmatched")
#: Figures whose median over the repeats the result gives.
MEDIANS = ("model_in_time_rate", "receiver_miss_rate", "late_or_never_rate",
           "planner_miss_rate", "reaction_p50_ms", "reaction_p99_ms", "worst_plan_gap_ms")
#: A process that spins on the core it is given (--busy).
BURNER = ("import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\n"
          "while True:\n    pass\n")


def busy_cores(text: str) -> list[int]:
    """The cores ``--busy`` names (comma-separated; empty: none); each must be one this process
    may run on."""
    cores = [int(c) for c in text.split(",") if c.strip()]
    allowed = os.sched_getaffinity(0)
    if any(c not in allowed for c in cores):
        raise ValueError(f"--busy {text!r}: cores must be of {sorted(allowed)}")
    return cores


def start_burners(cores: list[int]) -> list[subprocess.Popen[bytes]]:
    """One spinning process per core (they die with this process)."""
    return [popen([sys.executable, "-c", BURNER, str(c)]) for c in cores]


def run_naive(model: Path, *, stream: Path, out: Path, speed: float, deadline_ms: float,
              n_threads: int, n_threads_batch: int, grammar: bool,
              tail_s: float) -> dict[str, Any]:
    """Run the naive node and the replayer once; return the client summary."""
    out.mkdir(parents=True)
    env = {**os.environ, "ROS_DOMAIN_ID": str(random.randint(1, 200)),
           "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_LOCALHOST_ONLY": "1",
           "PYTHONUNBUFFERED": "1"}
    with open(out / "naive_node.log", "wb") as nlog, open(out / "bag_replayer.log", "wb") as rlog:
        node = popen([sys.executable, str(NAIVE), *ros_args(
            {"model": str(model), "n_threads": n_threads, "n_threads_batch": n_threads_batch,
             "grammar": grammar})], env=env, stdout=nlog, stderr=subprocess.STDOUT)
        try:
            subprocess.run([_bin("bag_replayer"), *ros_args(
                {"bag": str(stream), "speed": speed, "tail_s": tail_s,
                 "wait_for_subscriber_s": 300.0, "deadline_ms": deadline_ms,
                 "client_log_dir": str(out), "plan_json": True})],
                env=env, stdout=rlog, stderr=subprocess.STDOUT, timeout=1800, check=True)
        finally:
            node.send_signal(signal.SIGINT)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
    return json.loads((out / "client_summary.json").read_text())


def figures(run_dir: Path, summary: dict[str, Any], *, planner: bool) -> dict[str, Any]:
    """One run's figures: the client summary's, the model plans in time at the receiver, and
    (planner_node) the planner's own deadline-miss rate beside the receiver's."""
    rows = read_client_rows(run_dir)
    in_time = sum(1 for r in rows if r.get("deadline_met") and r.get("plan_source") == "model")
    out = {k: summary.get(k) for k in KEYS}
    reaction = summary.get("reaction_client_ms") or {}
    out.update(model_in_time=in_time, model_in_time_rate=in_time / len(rows) if rows else None,
               reaction_p50_ms=reaction.get("p50"), reaction_p99_ms=reaction.get("p99"))
    if planner:
        client = read_client_log(run_dir) or []
        edge = compare_edges("", read_records(run_dir / "cycles.jsonl"), client).summary
        out.update({k: edge.get(k) for k in ("planner_miss_rate", "receiver_excess_pts",
                                             "receiver_misses_exceed_planner")})
        margin = json.loads((run_dir / "summary.json").read_text()).get("transport_margin")
        out["transport_margin"] = margin
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the repeats, with n (the repeats that had it)."""
    out: dict[str, Any] = {}
    for key in MEDIANS:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        out[key] = {"median": statistics.median(values) if values else None, "n": len(values)}
    return out


def _stream(args: argparse.Namespace, work: Path) -> Path:
    path = Path(args.stream)
    if not path.exists() and (SHIPPED_DIR / args.stream).exists():
        path = SHIPPED_DIR / args.stream
    if not args.max_commands:
        return path
    commands = read_stream(path).commands[: args.max_commands]
    return write_jsonl(work / "stream.jsonl", commands)


def _models(args: argparse.Namespace) -> dict[str, Path]:
    if args.model == "bundled":
        return {"bundled": bundled_model_path("planner")}
    quants = args.quants.split(",")
    cache = default_cache_dir()
    src = ensure_inflated(bundled_model_path("planner"), "qwen2.5-0.5b", cache)
    man = build_ladder(src, cache, quants=quants, name=INFLATED_PREFIX + "qwen2.5-0.5b")
    return {q: man.path(q) for q in quants}


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--quants", default="Q8_0,Q4_K_M,Q4_0")
    ap.add_argument("--model", default="inflated", choices=("inflated", "bundled"),
                    help="inflated: the demo's levels (--quants); bundled: the shipped tiny "
                         "planner (one level, for a smoke run)")
    ap.add_argument("--stream", default="steady_operator",
                    help="a shipped stream's name or a bag/JSONL path")
    ap.add_argument("--max-commands", type=int, default=0, help="only the first N commands")
    ap.add_argument("--nodes", default="planner,naive,naive-nogrammar",
                    help=f"node configurations, comma-separated, of {', '.join(NODES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--speed", type=float, default=3.0)
    ap.add_argument("--deadline-ms", type=float, default=400.0)
    ap.add_argument("--n-threads", type=int, default=0,
                    help="decode threads, both nodes; 0: planner_node's default, and "
                         "llama-cpp-python's for the naive node")
    ap.add_argument("--n-threads-batch", type=int, default=0,
                    help="the naive node's prefill threads; 0: every core (its best)")
    ap.add_argument("--tail-s", type=float, default=10.0,
                    help="how long the replayer waits for late plans after the last command")
    ap.add_argument("--busy", default="",
                    help="cores to keep busy for the whole bench, comma-separated (one "
                         "spinning process each); none by default")
    ap.add_argument("--keep", default=None, help="keep the run directories here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    bad = [n for n in nodes if n not in NODES]
    if bad or not nodes or args.repeats < 1:
        ap.error(f"--nodes: {bad or nodes} not of {', '.join(NODES)}; --repeats >= 1")
    try:
        busy = busy_cores(args.busy)
    except ValueError as err:
        ap.error(str(err))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="client_edge-"))
    work.mkdir(parents=True, exist_ok=True)
    stream = _stream(args, work)
    models = _models(args)
    cores = len(os.sched_getaffinity(0))
    naive_threads = args.n_threads or max(1, cores // 2)  # llama-cpp-python's own default
    naive_batch = args.n_threads_batch or cores
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        q: {n: [] for n in nodes} for q in models}
    t0 = time.perf_counter()
    burners = start_burners(busy)
    try:
        _run_all(args, models, nodes, stream, work, runs, naive_threads, naive_batch)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    levels = {q: {n: {"median": medians(rs), "runs": rs} for n, rs in by_node.items()}
              for q, by_node in runs.items()}
    return emit_result({"stream": str(args.stream), "max_commands": args.max_commands,
                        "speed": args.speed, "deadline_ms": args.deadline_ms,
                        "repeats": args.repeats, "nodes": nodes, "cpus": cores,
                        "busy_cores": busy,
                        "naive": {"n_threads": naive_threads, "n_threads_batch": naive_batch},
                        "planner_budget": "default (loop not pinned, woken early; engine "
                                          "niced on every core)",
                        "seconds": round(time.perf_counter() - t0, 1), "levels": levels},
                       args.out)


def _run_all(args: argparse.Namespace, models: dict[str, Path], nodes: list[str], stream: Path,
             work: Path, runs: dict[str, dict[str, list[dict[str, Any]]]], naive_threads: int,
             naive_batch: int) -> None:
    """Every repeat of every level and node, interleaved; each run's figures into ``runs``."""
    for rep in range(args.repeats):
        for level, model in models.items():
            order = nodes[rep % len(nodes):] + nodes[: rep % len(nodes)]  # interleaved
            for name in order:
                run_dir = work / level / name / str(rep)
                if name.startswith("planner"):
                    params: dict[str, Any] = {
                        "engine": "llamacpp", "model": str(model),
                        "target_device": "orin-nano-8gb", "mode": "event",
                        "deadline_ms": args.deadline_ms,
                        "period_ms": max(500.0, args.deadline_ms),
                        "on_new_command": "preempt" if name == "planner-preempt" else "queue"}
                    if args.n_threads:
                        params["n_threads"] = args.n_threads
                    via = "action" if name == "planner-action" else "topic"
                    run_one(DemoConfig(label=f"{level} {name}", params=params,
                                       replayer={"send_via": via}),
                            stream=stream, run_dir=run_dir, speed=args.speed,
                            tail_s=args.tail_s)
                    summary = json.loads((run_dir / "client_summary.json").read_text())
                else:
                    summary = run_naive(model, stream=stream, out=run_dir, speed=args.speed,
                                        deadline_ms=args.deadline_ms, n_threads=naive_threads,
                                        n_threads_batch=naive_batch,
                                        grammar=name == "naive", tail_s=args.tail_s)
                result = figures(run_dir, summary, planner=name.startswith("planner"))
                runs[level][name].append(result)
                sys.stderr.write(f"[{rep + 1}/{args.repeats}] {level} {name}: model in time "
                                 f"{result['model_in_time']}/{result['commands']}, receiver "
                                 f"miss rate {result['receiver_miss_rate']}\n")


if __name__ == "__main__":
    sys.exit(main())
