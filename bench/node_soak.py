"""planner_node soaked from outside: commands at a steady rate for an hour, through rclpy and DDS.

The node runs as its own process (``planner_node``, llama.cpp on the shipped compact planner by
default, event mode), started through :func:`robot_latency.lifetime.popen` so it dies with this
script. A client node here sends a command every ``1 / --rate-hz`` seconds, alternately as a
``planner/plan_command`` goal (:class:`~robot_latency.ros.action_client.GoalSender`) and as a
tagged command on ``planner/command`` (:func:`~robot_latency.ros.client_edge.make_sender`); one
:class:`~robot_latency.ros.client_edge.ClientTracker` matches the goals' results and the topic's
plans to what was sent, and each plan's cycle is acknowledged as the bag replayer does.

Measured: the node's process and its engine worker (psutil: RSS, open files, threads) after the
warm-up, every ``--sample-s`` and at the end; at the client edge, plans received against
commands sent, late at the receiver, superseded, unanswered; the receiver's misses against the
planner's own (the first cycle record of each command in the node's ``cycles.jsonl``): a
receiver miss that is neither a planner miss nor superseded is ``unexplained``.

    python bench/node_soak.py --duration-s 3600 --out docs/bench/node_soak_1h.json
    python bench/node_soak.py --smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import rclpy
from benchio import emit_result
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import Bool, String

from robot_latency.lifetime import popen
from robot_latency.models.bundled import bundled_model_path
from robot_latency.records import CycleRecord, read_records
from robot_latency.report.client import ClientRecord, client_summary
from robot_latency.ros.action_client import GoalSender
from robot_latency.ros.client_edge import ClientTracker, make_sender
from robot_latency.ros.plan_msg import plan_envelope
from robot_latency.ros.readiness import ready_qos
from robot_latency.ros.topics import ACK_TOPIC, COMMAND_TOPIC, PLAN_TOPIC, READY_TOPIC
from robot_latency.rosenv import localhost_env, ros_args
from robot_latency_interfaces.msg import Plan

log = logging.getLogger("node_soak")

BIN = Path(sys.executable).parent
COMMANDS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
            "bring me the blue bottle", "find the green ball then go to the garage quickly"]
#: Bounds, not timings: the node's start (model load, warm-up, loopback) and its exit.
START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
MB = 1e6
#: ROS domains drawn from: above the 1-200 the project's tests and other benches draw from,
#: within Fast DDS's port range (a domain's participants use UDP ports 7400 + 250 * domain on).
DOMAINS = range(201, 233)
PORT_BASE, DOMAIN_GAIN = 7400, 250


@dataclass(frozen=True)
class Sample:
    """The node's process tree at one moment: the node, its children (the engine worker)."""

    t_s: float
    node_rss_mb: float
    node_fds: int
    node_threads: int
    children: int
    children_rss_mb: float
    children_fds: int
    children_threads: int

    @property
    def rss_mb(self) -> float:
        return self.node_rss_mb + self.children_rss_mb

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rss_mb": round(self.rss_mb, 3)}


def free_domain() -> int:
    """A ROS domain no DDS participant on this host uses now (none of its UDP ports bound): a
    planner or client of another run on the same domain would answer this soak's commands."""
    try:
        used = {c.laddr.port for c in psutil.net_connections(kind="udp") if c.laddr}
    except psutil.Error:  # not allowed to list the sockets: a random draw
        used = set()
    free = [d for d in DOMAINS if not any(
        PORT_BASE + DOMAIN_GAIN * d <= p < PORT_BASE + DOMAIN_GAIN * (d + 1) for p in used)]
    return random.choice(free or list(DOMAINS))


def sample(proc: psutil.Process, t_s: float) -> Sample:
    """Read the node's RSS, open files and threads, and its live children's."""
    kids: list[tuple[int, int, int]] = []
    for child in proc.children(recursive=True):
        try:
            kids.append((child.memory_info().rss, child.num_fds(), child.num_threads()))
        except psutil.Error:  # ended meanwhile
            continue
    return Sample(round(t_s, 2), proc.memory_info().rss / MB, proc.num_fds(),
                  proc.num_threads(), len(kids), sum(k[0] for k in kids) / MB,
                  sum(k[1] for k in kids), sum(k[2] for k in kids))


class SoakClient:
    """The outside client: goals and tagged commands out, plans in, each cycle acknowledged."""

    def __init__(self, context: Context, deadline_ms: float) -> None:
        self.node = Node("node_soak_client", context=context)
        self.tracker = ClientTracker(deadline_ms=deadline_ms, via="action+topic")
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.node.create_publisher(String, COMMAND_TOPIC, qos)
        self.ack_pub = self.node.create_publisher(String, ACK_TOPIC, qos)
        self.send_topic = make_sender(self.tracker,
                                      lambda data: self.pub.publish(String(data=data)))
        self.goals = GoalSender(self.node, self.tracker, on_plan=lambda p: self._ack(p.cycle))
        self.goal_ids: set[str] = set()
        self.goal_plans_on_topic = 0
        self.planner_ready = False
        self._lock = threading.Lock()
        self.node.create_subscription(Plan, PLAN_TOPIC, self._on_plan, qos)
        self.node.create_subscription(Bool, READY_TOPIC, self._on_ready, ready_qos())
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, name="soak-client", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set() and self.executor.context.ok():
            self.executor.spin_once(timeout_sec=0.05)

    def _on_ready(self, msg: Bool) -> None:
        self.planner_ready = bool(msg.data)

    def _ack(self, cycle: int) -> None:
        if cycle >= 0:
            self.ack_pub.publish(String(data=str(cycle)))

    def _on_plan(self, msg: Plan) -> None:
        received_ns = self.tracker.clock()  # first: the callback's own delay is inside
        with self._lock:
            if msg.command_id in self.goal_ids:  # a goal's plan: its result is what counts
                self.goal_plans_on_topic += 1
                return
        self._ack(msg.cycle)
        self.tracker.received(plan_envelope(msg), received_ns)

    def ready(self) -> bool:
        return (self.planner_ready and self.goals.server_ready()
                and self.pub.get_subscription_count() >= 1)

    def send(self, i: int) -> str:
        """Send command ``i``: a goal when ``i`` is even, else tagged on the topic."""
        text = COMMANDS[i % len(COMMANDS)]
        if i % 2 == 0:
            with self._lock:  # the id is known before the goal goes out
                cid = self.goals.send(f"g{i}", text)
                self.goal_ids.add(cid)
            return cid
        cid = f"t{i}"
        self.send_topic(cid, text)
        return cid

    def settled(self) -> bool:
        """Every goal has its result and the newest command its plan."""
        return self.goals.pending == 0 and self.tracker.last_answered()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.executor.shutdown()
        self.goals.destroy()
        self.node.destroy_node()


def _wait(predicate: Any, timeout_s: float, poll_s: float = 0.05) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll_s)
    return bool(predicate())


def start_node(args: argparse.Namespace, work: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start planner_node (its own process, dying with this one); its output in ``work``."""
    params = {"engine": "llamacpp", "model": args.model, "mode": "event",
              "deadline_ms": args.deadline_ms, "period_ms": max(500.0, args.deadline_ms),
              "log_dir": str(work / "run")}
    with open(work / "planner_node.log", "wb") as out:
        return popen([str(BIN / "planner_node"), *ros_args(params)], env=env, stdout=out,
                     stderr=subprocess.STDOUT)


def stop_node(proc: subprocess.Popen, tree: list[psutil.Process]) -> dict[str, Any]:
    """SIGINT the node, wait for it (then SIGKILL); say what of its tree is left running."""
    proc.send_signal(signal.SIGINT)
    try:
        code: int | None = proc.wait(timeout=STOP_TIMEOUT_S)
        killed = False
    except subprocess.TimeoutExpired:
        proc.kill()
        code, killed = proc.wait(), True
    _, alive = psutil.wait_procs(tree, timeout=10)
    left = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.Error:  # ended meanwhile
            continue
    return {"exit_code": code, "killed": killed, "left_running": left}


def compare(records: list[ClientRecord], cycles: list[CycleRecord],
            goal_ids: set[str]) -> dict[str, Any]:
    """The receiver's misses against the planner's own, per command (its first cycle)."""
    first: dict[str, CycleRecord] = {}
    for rec in cycles:
        if rec.command_id is not None:
            first.setdefault(rec.command_id, rec)
    planner_misses = {c.command_id for c in records
                      if c.command_id in first and not first[c.command_id].deadline_met}
    receiver_misses = [c for c in records if not c.deadline_met]
    superseded = [c for c in records if c.status == "superseded"]
    unexplained = [c.command_id for c in receiver_misses
                   if c.status != "superseded" and c.command_id not in planner_misses]
    ways = {way: client_summary([c for c in records if (c.command_id in goal_ids) == (
        way == "action")], via=way) for way in ("action", "topic")}
    keys = ("commands", "answered", "answered_late", "superseded", "unanswered",
            "receiver_misses", "reaction_client_ms")
    return {
        "receiver_misses": len(receiver_misses),
        "planner_misses": len(planner_misses),
        "superseded": len(superseded),
        "unexplained_receiver_misses": unexplained,
        "receiver_le_planner_plus_superseded":
            len(receiver_misses) <= len(planner_misses) + len(superseded),
        "commands_with_a_cycle": sum(1 for c in records if c.command_id in first),
        "by_way": {way: {k: s[k] for k in keys} for way, s in ways.items()},
    }


def growth(start: Sample, end: Sample) -> dict[str, Any]:
    """Start (after warm-up) to end: RSS (MB, %), open files, threads, tree and node alone."""
    return {"rss_mb": round(end.rss_mb - start.rss_mb, 3),
            "rss_pct": round(100 * (end.rss_mb - start.rss_mb) / start.rss_mb, 3),
            "node_rss_mb": round(end.node_rss_mb - start.node_rss_mb, 3),
            "children_rss_mb": round(end.children_rss_mb - start.children_rss_mb, 3),
            "fds": (end.node_fds + end.children_fds) - (start.node_fds + start.children_fds),
            "threads": ((end.node_threads + end.children_threads)
                        - (start.node_threads + start.children_threads))}


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Start the node, wait for it, send for ``--duration-s``, settle, stop; the figures."""
    domain = free_domain()
    env = localhost_env({**os.environ, "ROS_DOMAIN_ID": str(domain), "PYTHONUNBUFFERED": "1"})
    os.environ.update(localhost_env({}))  # this process's rcl reads them at init
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    proc = start_node(args, work, env)
    client: SoakClient | None = None
    try:
        client = SoakClient(context, args.deadline_ms)
        t_start = time.monotonic()
        up = _wait(lambda: client.ready() or proc.poll() is not None, START_TIMEOUT_S)
        if not up or proc.poll() is not None:
            raise RuntimeError(f"planner_node not ready (exit {proc.poll()}); see "
                               f"{work / 'planner_node.log'}")
        ready_s = time.monotonic() - t_start
        node = psutil.Process(proc.pid)
        period_ns = round(1e9 / args.rate_hz)
        n_total = max(1, round(args.duration_s * args.rate_hz))
        n_warm = min(n_total - 1, round(args.warmup_s * args.rate_hz))
        load_start = os.getloadavg()
        t0 = time.perf_counter_ns()
        samples: list[Sample] = []
        baseline: Sample | None = None
        next_sample_ns = t0
        for i in range(n_total):
            at = t0 + i * period_ns
            while (left := at - time.perf_counter_ns()) > 0:
                time.sleep(min(left / 1e9, 0.05))
            client.send(i)
            now = time.perf_counter_ns()
            if i == n_warm:  # the warm-up's commands are sent: the baseline
                baseline = sample(node, (now - t0) / 1e9)
                samples.append(baseline)
                next_sample_ns = now + round(args.sample_s * 1e9)
            elif baseline is not None and now >= next_sample_ns:
                samples.append(sample(node, (now - t0) / 1e9))
                next_sample_ns += round(args.sample_s * 1e9)
        send_s = (time.perf_counter_ns() - t0) / 1e9
        settled = _wait(client.settled, args.tail_s)
        end = sample(node, (time.perf_counter_ns() - t0) / 1e9)
        samples.append(end)
        tree = [node, *node.children(recursive=True)]
        stopped = stop_node(proc, tree)
        assert baseline is not None
        records = client.tracker.records()
        summary = client.tracker.summary()
        run = work / "run"
        cycles = read_records(run / "cycles.jsonl") if (run / "cycles.jsonl").exists() else []
        node_summary = (json.loads((run / "summary.json").read_text())
                        if (run / "summary.json").exists() else {})
        rss = [s.rss_mb for s in samples]
        fds = [s.node_fds + s.children_fds for s in samples]
        threads = [s.node_threads + s.children_threads for s in samples]
        return {
            "duration_s": args.duration_s, "rate_hz": args.rate_hz,
            "deadline_ms": args.deadline_ms, "warmup_s": args.warmup_s,
            "sample_s": args.sample_s, "model": args.model,
            "cpus": sorted(os.sched_getaffinity(0)), "ros_domain_id": domain,
            "ready_s": round(ready_s, 2),
            "send_s": round(send_s, 2), "settled": settled,
            "loadavg_1_5_15": {"start": [round(x, 2) for x in load_start],
                               "end": [round(x, 2) for x in os.getloadavg()]},
            "commands_sent": len(records), "warmup_commands": n_warm,
            "plans_received": summary["plans_received"],
            "goal_plans_on_topic": client.goal_plans_on_topic,
            "goals": {"rejected": client.goals.rejected, "ended_without_plan":
                      client.goals.failed, "pending_at_end": client.goals.pending},
            "client": {k: summary[k] for k in (
                "commands", "answered", "answered_late", "superseded", "unanswered",
                "receiver_misses", "receiver_miss_rate", "receiver_miss_rate_ci95",
                "reaction_client_ms", "worst_plan_gap_ms", "plans_unmatched",
                "plans_without_command", "plans_unreadable")},
            "edge": compare(records, cycles, client.goal_ids),
            "planner": {k: node_summary.get(k) for k in (
                "cycles", "deadline_misses", "deadline_miss_rate", "fallbacks",
                "engine_restarts", "mailbox")},
            "process": {"start": baseline.to_dict(), "end": end.to_dict(),
                        "growth": growth(baseline, end),
                        "rss_mb_max": round(max(rss), 3),
                        "fds_range": [min(fds), max(fds)],
                        "threads_range": [min(threads), max(threads)],
                        "samples": [s.to_dict() for s in samples]},
            "node_stop": stopped,
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if client is not None:
            client.close()
        context.try_shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--duration-s", type=float, default=3600.0, help="how long commands go out")
    ap.add_argument("--rate-hz", type=float, default=2.0, help="commands per second")
    ap.add_argument("--deadline-ms", type=float, default=400.0, help="the node's deadline")
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="commands sent before the baseline sample of the node's process")
    ap.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples")
    ap.add_argument("--tail-s", type=float, default=60.0,
                    help="how long to wait for the last plans after the last send (a bound)")
    ap.add_argument("--model", default=str(bundled_model_path("planner")),
                    help="GGUF for the node (default: the shipped compact planner)")
    ap.add_argument("--smoke", action="store_true",
                    help="a short run: 10 s, 2 s warm-up, a sample every 2 s")
    ap.add_argument("--keep", type=Path, default=None, help="keep the node's run here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.smoke:
        args.duration_s, args.warmup_s, args.sample_s = 10.0, 2.0, 2.0
    if not (args.duration_s > 0 and args.rate_hz > 0 and args.deadline_ms > 0
            and args.sample_s > 0 and 0 <= args.warmup_s < args.duration_s):
        ap.error("--duration-s, --rate-hz, --deadline-ms, --sample-s must be > 0; "
                 "0 <= --warmup-s < --duration-s")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    work = args.keep or Path(tempfile.mkdtemp(prefix="node_soak-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        result = soak(args, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    g = result["process"]["growth"]
    log.info("node soak: %d commands, %d plans received, %d late at the receiver, "
             "%d receiver misses against %d planner misses + %d superseded; RSS %+.2f%%",
             result["commands_sent"], result["plans_received"],
             result["client"]["answered_late"], result["edge"]["receiver_misses"],
             result["edge"]["planner_misses"], result["edge"]["superseded"], g["rss_pct"])
    return emit_result(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
