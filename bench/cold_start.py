"""A planner node's cold start, seen from an outside client: start to ready, then the first goal.

For each node kind (``planner_node``; ``managed_planner_node`` configured and activated as
planner.launch.py's autostart does), a fresh process on llama.cpp with the shipped planner
model, event mode, and an rclpy client in this process on a private domain. The client does
what a behaviour tree's first call does: it waits for the PlanCommand action server and for
``/planner/ready`` (true), then sends its first goal with ``sent`` set, then ``--goals`` more,
one after another, for comparison. Each trial records, on this host's monotonic clock (the
node's clock too):

    process_start_to_ready_ms       the node process started (``popen``) to ready seen here
    ready_to_first_goal_accepted_ms ready seen to the first goal's acceptance
    first_goal                      sent to accepted, sent to result (the client-edge latency),
                                    in the goal's deadline (here and by the node's account),
                                    the plan's source
    later_goals                     the same figures (p50, max) for the goals after it
    node                            the node's own record (cold_start.json: its start-up
                                    events and phases, robot_latency.ros.cold_start,
                                    and how it had its target calibration: the calibration
                                    cache's outcome, robot_latency.floor.calstore)

Then SIGTERM, and the exit status. Every trial is a fresh process; the repeats are
interleaved (both kinds in one repeat, the order alternating). Each figure's median, min and
max over the repeats per kind are in ``by_node``.

    python bench/cold_start.py --repeats 3 --goals 10 --out docs/bench/cold_start.json
    python bench/cold_start.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import rclpy
from benchio import emit_result
from rclpy.action import ActionClient
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import Bool
from unique_identifier_msgs.msg import UUID

from robot_latency.lifetime import popen
from robot_latency.ros.cold_start import COLD_START_NAME
from robot_latency.ros.readiness import ready_qos
from robot_latency.rosenv import localhost_env, ros_args
from robot_latency_interfaces.action import PlanCommand

BIN = Path(sys.executable).parent
NODES = ("planner_node", "managed_planner_node")
#: Commands the goals carry (the shipped planner's vocabulary), in turn.
COMMANDS = ("pick up the blue box", "put the red cup on the tray", "go to the kitchen",
            "stop", "pick up the green bottle and put it in the bin")
POLL_S = 0.005


def _ms(a_ns: int | None, b_ns: int | None) -> float | None:
    return None if a_ns is None or b_ns is None else (b_ns - a_ns) / 1e6


class Client:
    """An outside rclpy client of one planner process: readiness and goals, spun in a thread."""

    def __init__(self, domain_id: int) -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = Node("cold_start_client", context=self.context)
        self.ready_ns: int | None = None  # when true was first seen
        self.node.create_subscription(Bool, "/planner/ready", self._on_ready, ready_qos())
        self.action = ActionClient(self.node, PlanCommand, "/planner/plan_command")
        self._lock = threading.Lock()
        self._goal: dict[str, Any] = {}
        self._wake = self.node.create_guard_condition(self._send)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set() and self.context.ok():
            self.executor.spin_once(timeout_sec=0.05)

    def _on_ready(self, msg: Bool) -> None:
        if msg.data and self.ready_ns is None:
            self.ready_ns = time.perf_counter_ns()

    def is_ready(self) -> bool:
        return self.ready_ns is not None and self.action.server_is_ready()

    def goal(self, text: str, deadline_ms: float, timeout_s: float) -> dict[str, Any]:
        """Send one goal from the executor's thread (``sent`` stamped there, just before the
        request) and wait for its result; return its times (ns, monotonic) and its plan."""
        with self._lock:
            self._goal = {"text": text, "deadline_ms": deadline_ms, "done": threading.Event()}
            box = self._goal
        self._wake.trigger()
        box["timed_out"] = not box["done"].wait(timeout_s)
        return box

    def _send(self) -> None:
        with self._lock:
            box = self._goal
        goal = PlanCommand.Goal(command=box["text"], deadline_ms=float(box["deadline_ms"]))
        box["sent_ns"] = time.perf_counter_ns()
        goal.sent = self.node.get_clock().now().to_msg()
        box["goal_id"] = uuid.uuid4().hex
        future = self.action.send_goal_async(
            goal, goal_uuid=UUID(uuid=list(uuid.UUID(box["goal_id"]).bytes)))

        def on_result(f: Any) -> None:
            box["result_ns"] = time.perf_counter_ns()
            res = f.result()
            box["plan"] = None if res is None else res.result.plan
            box["done"].set()

        def on_accepted(f: Any) -> None:
            box["accepted_ns"] = time.perf_counter_ns()
            handle = f.result()
            box["accepted"] = bool(handle is not None and handle.accepted)
            if box["accepted"]:
                handle.get_result_async().add_done_callback(on_result)
            else:
                box["done"].set()

        future.add_done_callback(on_accepted)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


def _goal_figures(box: dict[str, Any]) -> dict[str, Any]:
    plan = box.get("plan")
    latency = _ms(box.get("sent_ns"), box.get("result_ns"))
    return {"accepted": box.get("accepted", False), "timed_out": box["timed_out"],
            "sent_to_accepted_ms": _ms(box.get("sent_ns"), box.get("accepted_ns")),
            "latency_ms": latency,
            "in_deadline": latency is not None and latency <= box["deadline_ms"],
            "node_deadline_met": None if plan is None else bool(plan.deadline_met),
            "source": None if plan is None else plan.source,
            "fallback_reason": None if plan is None else plan.fallback_reason}


def trial(kind: str, *, out: Path, goals: int, deadline_ms: float, node_deadline_ms: float,
          start_timeout_s: float) -> dict[str, Any]:
    """One fresh node process of ``kind``: start, ready, the first goal, ``goals`` more, stop."""
    domain = random.randint(1, 100)
    env = {**localhost_env(), "ROS_DOMAIN_ID": str(domain), "PYTHONUNBUFFERED": "1"}
    log_dir = out / "run"
    client = Client(domain)
    err_path = out / "node.log"
    try:
        with open(err_path, "wb") as err:
            start_ns = time.perf_counter_ns()
            proc = popen([str(BIN / kind), *ros_args({
                "engine": "llamacpp", "mode": "event", "log_dir": log_dir,
                "deadline_ms": node_deadline_ms, "period_ms": node_deadline_ms})],
                env=env, stdout=err, stderr=subprocess.STDOUT)
            up = None
            if kind == "managed_planner_node":
                up = popen([sys.executable, "-m", "robot_latency.ros.lifecycle_autostart",
                            "/planner_node", "--timeout-s", str(start_timeout_s)], env=env,
                           stdout=err, stderr=subprocess.STDOUT)
            end = time.monotonic() + start_timeout_s
            while not client.is_ready() and proc.poll() is None and time.monotonic() < end:
                time.sleep(POLL_S)
            if not client.is_ready():
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{kind} not ready in {start_timeout_s} s (see {err_path})")
            ready_ns = client.ready_ns
            first = client.goal(COMMANDS[0], deadline_ms, start_timeout_s)
            later = [_goal_figures(client.goal(COMMANDS[(i + 1) % len(COMMANDS)], deadline_ms,
                                               start_timeout_s)) for i in range(goals)]
            proc.send_signal(signal.SIGTERM)
            status = proc.wait(timeout=120)
            if up is not None:
                up.wait(timeout=30)
    finally:
        client.close()
    cold_path = log_dir / COLD_START_NAME
    node = json.loads(cold_path.read_text()) if cold_path.exists() else None
    lat = [g["latency_ms"] for g in later if g["latency_ms"] is not None]
    return {"node_kind": kind, "exit_status": status,
            "process_start_to_ready_ms": _ms(start_ns, ready_ns),
            "ready_to_first_goal_accepted_ms": _ms(ready_ns, first.get("accepted_ns")),
            "first_goal": _goal_figures(first),
            "later_goals": {"n": len(later), "in_deadline": sum(g["in_deadline"] for g in later),
                            "latency_p50_ms": statistics.median(lat) if lat else None,
                            "latency_max_ms": max(lat) if lat else None,
                            "sent_to_accepted_max_ms": max(
                                (g["sent_to_accepted_ms"] or 0.0 for g in later), default=None)},
            "node": node}


FIGURES = {"process_start_to_ready_ms": ("process_start_to_ready_ms",),
           "ready_to_first_goal_accepted_ms": ("ready_to_first_goal_accepted_ms",),
           "first_goal_sent_to_accepted_ms": ("first_goal", "sent_to_accepted_ms"),
           "first_goal_latency_ms": ("first_goal", "latency_ms"),
           "later_goals_latency_p50_ms": ("later_goals", "latency_p50_ms"),
           "later_goals_latency_max_ms": ("later_goals", "latency_max_ms"),
           "node_model_load_ms": ("node", "phases_ms", "model_load_ms"),
           "node_run_open_ms": ("node", "phases_ms", "run_open_ms"),
           "node_prediction_ms": ("node", "phases_ms", "prediction_ms"),
           "node_calibration_at_configure_ms": ("node", "phases_ms", "calibration_ms"),
           "node_warm_up_ms": ("node", "phases_ms", "warm_up_ms"),
           "node_process_start_to_ready_ms": ("node", "phases_ms", "process_start_to_ready_ms")}


def _get(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def by_node(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median, min and max over the repeats, per node kind."""
    result: dict[str, Any] = {}
    for kind in sorted({t["node_kind"] for t in trials}):
        mine = [t for t in trials if t["node_kind"] == kind]
        figures: dict[str, Any] = {}
        for name, path in FIGURES.items():
            values = [v for t in mine if isinstance(v := _get(t, path), (int, float))]
            figures[name] = ({"median": statistics.median(values), "min": min(values),
                              "max": max(values), "n": len(values)} if values else None)
        figures["first_goal_in_deadline"] = sum(t["first_goal"]["in_deadline"] for t in mine)
        figures["first_goal_by_model"] = sum(t["first_goal"]["source"] == "model" for t in mine)
        # how each trial's node had its target calibration (robot_latency.floor.calstore)
        figures["calibration_cache"] = [_get(t, ("node", "calibration_cache", "outcome"))
                                        for t in mine]
        figures["trials"] = len(mine)
        result[kind] = figures
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--nodes", default=",".join(NODES),
                        help=f"node kinds, comma separated, of {', '.join(NODES)}")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per kind")
    parser.add_argument("--goals", type=int, default=10, help="goals after the first")
    parser.add_argument("--deadline-ms", type=float, default=800.0,
                        help="each goal's deadline_ms (the node's deadline is --node-deadline-ms)")
    parser.add_argument("--node-deadline-ms", type=float, default=1500.0,
                        help="the node's deadline_ms and period_ms parameters")
    parser.add_argument("--start-timeout-s", type=float, default=240.0,
                        help="give up on a node not ready (or a goal not answered) after this")
    parser.add_argument("--host-note", default="",
                        help="what else ran on the host (recorded with the figures)")
    parser.add_argument("--smoke", action="store_true", help="one repeat, one more goal")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    kinds = [k for k in args.nodes.split(",") if k]
    bad = [k for k in kinds if k not in NODES]
    if bad or not kinds:
        parser.error(f"--nodes: unknown node kind {bad[0] if bad else args.nodes!r}")
    repeats, goals = (1, 1) if args.smoke else (args.repeats, args.goals)
    trials: list[dict[str, Any]] = []
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
        for r in range(repeats):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                out = Path(tmp) / f"{kind}-{r}"
                out.mkdir()
                t = trial(kind, out=out, goals=goals, deadline_ms=args.deadline_ms,
                          node_deadline_ms=args.node_deadline_ms,
                          start_timeout_s=args.start_timeout_s)
                t["repeat"] = r
                trials.append(t)
                sys.stderr.write(f"{kind} repeat {r}: ready after "
                                 f"{t['process_start_to_ready_ms']:.0f} ms, first goal "
                                 f"{t['first_goal']['latency_ms']} ms\n")
    return emit_result({"nodes": kinds, "repeats": repeats, "goals_after_first": goals,
                        "goal_deadline_ms": args.deadline_ms,
                        "node_deadline_ms": args.node_deadline_ms, "engine": "llamacpp",
                        "model": "shipped planner", "host_note": args.host_note,
                        "cpus_allowed": sorted(os.sched_getaffinity(0)),
                        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
                        "by_node": by_node(trials), "trials": trials}, args.out)


if __name__ == "__main__":
    sys.exit(main())
