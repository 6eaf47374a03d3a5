"""The first PlanCommand goal after start-up, from outside, over Fast DDS: ``planner_node``, and
``managed_planner_node`` configured and activated as planner.launch.py's autostart does, on
llama.cpp and the shipped planner model in its own process, an rclpy client here (no mocks).

A behaviour tree's first call after bring-up: it waits for the action server and for
``/planner/ready`` (true, transient local), then sends its first goal with its ``sent`` stamp.
Before the warm start the action server was discovered while the model still loaded, and the
first goal, stamped at its send, was answered by the fallback, already late; the first
generation was also cold (its prefill about 850 ms against 2 ms later). Asserted on events:
the first goal's plan is the model's, on time by the node's own account, and the node said it
was ready only after its warm-up generation and its loopback pings. The node's record of its
cold start (``cold_start.json``) holds every start-up event, in order, and the first goal's plan
as its first plan in time; its target calibration came from the calibration cache where an
earlier start had written it (the managed node has it at configure). Then SIGTERM: the node
exits 0 and nothing aborts on the way out (``terminate called ...`` on stderr).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.context import Context
from rclpy.node import Node
from std_msgs.msg import Bool
from unique_identifier_msgs.msg import UUID

from robot_latency.lifetime import popen
from robot_latency.records import read_records
from robot_latency.ros.cold_start import COLD_START_NAME, out_of_order
from robot_latency.ros.readiness import ready_qos
from robot_latency_interfaces.action import PlanCommand
from robot_latency_interfaces.msg import Plan

BIN = Path(sys.executable).parent
NODE_DEADLINE_MS = 1500.0
#: The first goal's own deadline: far above a warm goal's 20-60 ms here (a loaded 2-core
#: host), below a cold first generation's (850-1000 ms).
GOAL_DEADLINE_MS = 800.0
START_TIMEOUT_S = 240
Spinner = Any  # test/ros/conftest.py's Spinner


@dataclass
class Planner:
    """The node's process and a behaviour tree's client of it."""

    kind: str  # the executable
    proc: subprocess.Popen
    log_dir: Path
    node: Node
    action: ActionClient
    ready: list[bool]
    spin: Spinner
    #: the calibration cache held the target's calibration before the node started
    had_calibration: bool


def _send_first_goal(planner: Planner, text: str) -> dict[str, Any]:
    """Send one goal from the executor's thread (as robot_latency.ros.action_client does), its
    ``sent`` stamp set at the send; return what came back (``handle``, ``status``, ``plan``)."""
    box: dict[str, Any] = {}
    lock = threading.Lock()

    def on_result(future: Any) -> None:
        with lock:
            box["status"], box["plan"] = future.result().status, future.result().result.plan

    def on_accepted(future: Any) -> None:
        handle = future.result()
        with lock:
            box["handle"] = handle
        if handle.accepted:
            handle.get_result_async().add_done_callback(on_result)

    def send() -> None:
        goal = PlanCommand.Goal(command=text, deadline_ms=GOAL_DEADLINE_MS)
        goal.sent = planner.node.get_clock().now().to_msg()
        box["goal_id"] = uuid.uuid4()
        future = planner.action.send_goal_async(
            goal, goal_uuid=UUID(uuid=list(box["goal_id"].bytes)))
        future.add_done_callback(on_accepted)

    planner.node.create_guard_condition(send).trigger()
    planner.spin.wait_for(lambda: "status" in box or ("handle" in box
                                                      and not box["handle"].accepted),
                          120, "the first goal's result")
    return box


@pytest.fixture(scope="module", params=["planner_node", "managed_planner_node"])
def planner(request: pytest.FixtureRequest, ros_context: Context,
            spinner_for: Callable[[Context], Spinner],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planner]:
    """The node (plain, or managed and brought up as planner.launch.py's autostart does) on
    llama.cpp, started now; the client waits until it says it is ready."""
    log_dir = tmp_path_factory.mktemp("first-goal") / "run"
    # one calibration cache for the module's nodes: the first start fills it, a later one reads it
    cache = tmp_path_factory.getbasetemp() / "first-goal-cache"
    had_calibration = any((cache / "calibration").glob("*.json"))
    env = {**os.environ, "ROBOT_LATENCY_CACHE_DIR": str(cache),
           "ROS_DOMAIN_ID": str(ros_context.get_domain_id()),
           "ROS_LOCALHOST_ONLY": "1", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
           "PYTHONUNBUFFERED": "1"}
    # One prefill thread, as one decode thread: with the default (every core) a prefill on a
    # 2-core host whose other core a busy process holds waits at each of llama.cpp's thread
    # barriers for the descheduled thread; seen in a loaded suite run, a 10-token prefill took
    # 734-753 ms against 4-31 ms, and the first goal got the fallback for it, warm start or not.
    proc = popen([str(BIN / request.param), "--ros-args", "-p", "engine:=llamacpp",
                  "-p", "n_threads:=1", "-p", "n_threads_batch:=1",
                  "-p", "mode:=event", "-p", f"log_dir:={log_dir}",
                  "-p", f"deadline_ms:={NODE_DEADLINE_MS}", "-p", f"period_ms:={NODE_DEADLINE_MS}"],
                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if request.param == "managed_planner_node":
        up = popen([sys.executable, "-m", "robot_latency.ros.lifecycle_autostart",
                    "/planner_node", "--timeout-s", str(START_TIMEOUT_S)], env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = up.communicate(timeout=START_TIMEOUT_S + 30)
        assert up.returncode == 0, out.decode(errors="replace")
    with spinner_for(ros_context) as spin:
        node = spin.add(Node("first_goal_client", context=ros_context))
        ready: list[bool] = []
        node.create_subscription(Bool, "/planner/ready", lambda m: ready.append(m.data),
                                 ready_qos())
        action = ActionClient(node, PlanCommand, "/planner/plan_command")
        try:
            yield Planner(request.param, proc, log_dir, node, action, ready, spin,
                          had_calibration)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def _wait_ready(planner: Planner) -> None:
    planner.spin.wait_for(lambda: (planner.action.server_is_ready() and planner.ready
                                   and planner.ready[-1]) or planner.proc.poll() is not None,
                          START_TIMEOUT_S, "the action server and /planner/ready true")
    assert planner.proc.poll() is None, "planner_node exited during start-up"


def test_the_first_goal_after_ready_is_planned_by_the_model_by_its_deadline(
        planner: Planner) -> None:
    _wait_ready(planner)
    got = _send_first_goal(planner, "pick up the blue box")
    assert got["handle"].accepted
    plan: Plan = got["plan"]
    assert got["status"] == GoalStatus.STATUS_SUCCEEDED
    assert (plan.source, plan.fallback_reason) == ("model", ""), plan
    assert plan.deadline_met and plan.deadline_ms == GOAL_DEADLINE_MS
    goal_id = got["goal_id"].hex
    assert plan.command_id == goal_id
    # the node counted the deadline from the goal's send stamp, and met it
    records = planner.spin.wait_for(
        lambda: [r for r in read_records(planner.log_dir / "cycles.jsonl")
                 if r.command_id == goal_id] if (planner.log_dir / "cycles.jsonl").exists()
        else None, 30, "the first goal's cycle record")
    assert len(records) == 1
    rec = records[0]
    assert rec.command_sent_ns is not None and rec.plan_source == "model"
    assert rec.cycle == 0  # the warm-up is no cycle: nothing was published before this goal


def test_the_cold_start_is_recorded_in_order(planner: Planner) -> None:
    """The node's own record of its start-up (robot_latency.ros.cold_start): every phase there,
    in the order the node passed them, and the first plan in time is the first goal's."""
    _wait_ready(planner)
    path = planner.log_dir / COLD_START_NAME
    cold = planner.spin.wait_for(
        lambda: (doc if path.exists() and (doc := json.loads(path.read_text()))
                 ["first_plan_in_time"] is not None else None), 60, "the first plan in time")
    events = cold["events_ns"]
    assert set(events) >= {"process_start", "node_created", "model_load_started", "model_loaded",
                           "configured", "run_open_started", "prediction_ready", "run_opened",
                           "warm_up_started", "warm_up_ended", "margin_measured",
                           "action_warm_up_started", "action_warm_up_ended",
                           "ready", "first_plan", "first_plan_in_time"}, events
    assert out_of_order(events) == [], events
    assert list(events.values()) == sorted(events.values())  # kept in time order
    # the first goal came after ready, and its plan was the first plan, the model's, on time
    assert events["ready"] < events["first_plan"] == events["first_plan_in_time"]
    first = cold["first_plan_in_time"]
    assert first == cold["first_plan"] and first["cycle"] == 0 and first["sent_stamped"]
    assert first["source"] == "model" and first["deadline_met"]
    assert first["deadline_ms"] == GOAL_DEADLINE_MS
    # the node's own goal went through the action's goal, feedback and result paths before
    # ready, and was never planned (the first goal's cycle is cycle 0: the other test)
    warm = cold["action_warm_up"]
    assert warm["status"] == "succeeded" and warm["elapsed_ms"] >= 0, warm
    assert set(warm["feedback"]) <= {"queue", "prefill", "decode"}, warm
    assert events["warm_up_ended"] <= events["action_warm_up_started"] < events["ready"]
    phases = cold["phases_ms"]
    at_configure = phases.pop("calibration_ms")  # the managed node's only
    assert all(v is not None and v >= 0 for v in phases.values()), phases
    # the target calibration came from the cache where a start before this one had written it
    cache = cold["calibration_cache"]
    assert cache["outcome"] == ("hit" if planner.had_calibration else "miss"), cache
    assert cache["written"] == (not planner.had_calibration) and Path(cache["path"]).is_file()
    if planner.kind == "managed_planner_node":  # the model loads at configure, before the topics
        assert events["model_loaded"] < events["configured"]
        # and the calibration at configure too: the run opening at activate has it in memory
        assert events["configured"] < events["calibration_started"] < events["calibration_ready"]
        assert events["calibration_ready"] < events["run_open_started"] and at_configure >= 0
    else:  # the plain node's run opens, and its model loads, after it is configured
        assert events["configured"] < events["model_load_started"]
        assert "calibration_started" not in events and at_configure is None


def test_sigterm_stops_the_node_cleanly(planner: Planner) -> None:
    _wait_ready(planner)
    planner.proc.send_signal(signal.SIGTERM)
    out, err = planner.proc.communicate(timeout=120)
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    assert planner.proc.returncode == 0, stdout + stderr
    assert "terminate called" not in stderr, stderr
    assert "signal SIGTERM: stopping" in stderr and "run closed" in stderr, stderr
    # ready only after the warm-up generation and the loopback pings, in the node's own log
    lines = stderr.splitlines()
    at = {key: next(i for i, line in enumerate(lines) if key in line)
          for key in ("warm-up generation:", "transport loopback:", "planner ready:",
                      "action warm-up goal succeeded")}
    assert at["warm-up generation:"] < at["planner ready:"], stderr
    assert at["transport loopback:"] < at["planner ready:"], stderr
    assert at["action warm-up goal succeeded"] == at["planner ready:"], stderr  # one line
    summary = json.loads((planner.log_dir / "summary.json").read_text())
    warm = summary["warm_up"]
    assert warm["status"] == "ok" and warm["tokens_out"] > 0, warm
    # the cold start's record is the run's, in its summary and manifest as in its own file
    cold = json.loads((planner.log_dir / COLD_START_NAME).read_text())
    manifest = json.loads((planner.log_dir / "manifest.json").read_text())
    assert summary["cold_start"] == cold == manifest["cold_start"]
    assert at["planner ready:"] < next(i for i, line in enumerate(lines)
                                       if "cold start: ready" in line), stderr
    assert "cold start: first plan in time" in stderr, stderr
