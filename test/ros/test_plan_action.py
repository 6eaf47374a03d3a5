"""The PlanCommand action from outside, over Fast DDS: the ``planner_node`` executable in its own
process, an rclpy action client in this one (no mocks).

Two planners: llama.cpp on the shipped planner model (the 60 goals of the shipped stream, one
at a time as a behaviour tree sends them) and the simulated engine on a slow target, so that a
goal is still decoding when it is cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.lifetime import popen
from robot_latency.records import read_records
from robot_latency.streams import read_stream
from robot_latency_interfaces.action import PlanCommand
from robot_latency_interfaces.msg import Plan

BIN = Path(sys.executable).parent
STREAM = Path(__file__).resolve().parents[2] / "robot_latency" / "data" / "streams" / \
    "steady_operator"
PHASES = ("queue", "prefill", "decode", "fallback")
NODE_DEADLINE_MS = 1500.0
Spinner = Any  # test/ros/conftest.py's Spinner


@dataclass
class Sent:
    """One goal as this client saw it."""

    goal_id: str
    deadline_ms: float
    sent_ns: int
    result_ns: int | None = None
    status: int | None = None
    plan: Plan | None = None
    feedback: list[PlanCommand.Feedback] = field(default_factory=list)
    accepted: bool | None = None
    handle: Any = None


class Client:
    """A behaviour tree's view of the planner: goals, feedback, results, cancels; and the topics
    it listens to beside them."""

    def __init__(self, spin: Spinner, namespace: str = "") -> None:
        self.node = spin.add(Node(f"bt_client{namespace.replace('/', '_')}",
                                  context=spin.executor.context))
        self.wait_for = spin.wait_for
        self.action = ActionClient(self.node, PlanCommand, f"{namespace}/planner/plan_command")
        self.lock = threading.Lock()
        # goals go out from the executor's thread (Humble's and Jazzy's rclpy race otherwise,
        # see robot_latency.ros.action_client)
        self.queue: list[tuple[Sent, PlanCommand.Goal, uuid.UUID]] = []
        self.wake = self.node.create_guard_condition(self._send_queued)
        self.plans: list[Plan] = []
        self.json_plans: list[dict] = []
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(Plan, f"{namespace}/planner/plan", self._on_plan, qos)
        self.node.create_subscription(String, f"{namespace}/planner/plan_json",
                                      self._on_json, qos)

    def _on_plan(self, msg: Plan) -> None:
        with self.lock:
            self.plans.append(msg)

    def _on_json(self, msg: String) -> None:
        with self.lock:
            self.json_plans.append(json.loads(msg.data))

    def topic(self) -> list[Plan]:
        with self.lock:
            return list(self.plans)

    def send(self, text: str, deadline_ms: float = 0.0) -> Sent:
        goal_uuid = uuid.uuid4()
        goal = PlanCommand.Goal(command=text, deadline_ms=deadline_ms)
        sent = Sent(goal_uuid.hex, deadline_ms or NODE_DEADLINE_MS, 0)
        with self.lock:
            self.queue.append((sent, goal, goal_uuid))
        self.wake.trigger()
        return sent

    def _send_queued(self) -> None:
        with self.lock:
            queued, self.queue = self.queue, []
        for sent, goal, goal_uuid in queued:
            sent.sent_ns = time.perf_counter_ns()
            goal.sent = self.node.get_clock().now().to_msg()
            future = self.action.send_goal_async(
                goal, feedback_callback=lambda m, s=sent: s.feedback.append(m.feedback),
                goal_uuid=_uuid_msg(goal_uuid))
            future.add_done_callback(lambda f, s=sent: self._accepted(s, f))

    def in_executor(self, call: Callable[[], Any]) -> Any:
        """Call ``call`` in the executor's thread (as the sends); return the future it returns."""
        box: list[Any] = []
        guard = self.node.create_guard_condition(lambda: box.append(call()))
        guard.trigger()
        self.wait_for(lambda: box, 30, "the executor to run the call")
        return box[0]

    def _accepted(self, sent: Sent, future: Any) -> None:
        handle = future.result()
        sent.handle, sent.accepted = handle, handle.accepted
        if handle.accepted:
            handle.get_result_async().add_done_callback(lambda f: self._result(sent, f))

    @staticmethod
    def _result(sent: Sent, future: Any) -> None:
        sent.result_ns = time.perf_counter_ns()  # read in the callback, as a BT node would
        response = future.result()
        sent.status, sent.plan = response.status, response.result.plan


def _uuid_msg(goal_uuid: uuid.UUID) -> Any:
    from unique_identifier_msgs.msg import UUID

    return UUID(uuid=list(goal_uuid.bytes))


def _start_planner(context: Context, log_dir: Path, *params: str,
                   namespace: str = "") -> subprocess.Popen:
    env = {**os.environ, "ROS_DOMAIN_ID": str(context.get_domain_id()),
           "ROS_LOCALHOST_ONLY": "1", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
           "PYTHONUNBUFFERED": "1"}
    args = [str(BIN / "planner_node"), "--ros-args", "-p", "mode:=event",
            "-p", f"log_dir:={log_dir}", *(a for p in params for a in ("-p", p)),
            *(["-r", f"__ns:={namespace}"] if namespace else [])]
    return popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


@pytest.fixture(scope="module")
def spin(ros_context: Context, spinner_for: Callable[[Context], Spinner]) -> Iterator[Spinner]:
    with spinner_for(ros_context) as s:
        yield s


@pytest.fixture(scope="module")
def llama_planner(ros_context: Context, spin: Spinner,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    """planner_node on llama.cpp and the shipped planner model, event mode."""
    log_dir = tmp_path_factory.mktemp("llama-run")
    proc = _start_planner(ros_context, log_dir, "engine:=llamacpp",
                          f"deadline_ms:={NODE_DEADLINE_MS}", f"period_ms:={NODE_DEADLINE_MS}")
    client = Client(spin)
    try:
        spin.wait_for(lambda: client.action.server_is_ready() or proc.poll() is not None, 120,
                      "the planner's action server")
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        # The server is discovered while the node still loads its model (it spins after): a
        # first goal, not counted, tells when it serves.
        _wait_done(client, client.send("stop"), 120)
        yield client, log_dir
    finally:
        output = _stop(proc)
    assert "action /planner/plan_command" in output, output


def _wait_done(client: Client, sent: Sent, timeout_s: float = 60) -> None:
    client.wait_for(lambda: sent.accepted is False or sent.status is not None, timeout_s,
                    f"the result of goal {sent.goal_id}")


def test_sixty_goals_of_the_shipped_stream_each_get_their_plan_by_the_deadline(
        llama_planner: tuple[Client, Path]) -> None:
    client, log_dir = llama_planner
    texts = [c.text for c in read_stream(STREAM).commands]
    assert len(texts) == 60
    goals = []
    for i, text in enumerate(texts):
        # every other goal asks for a shorter deadline than the node's own
        sent = client.send(text, deadline_ms=0.0 if i % 2 else 900.0)
        _wait_done(client, sent)
        goals.append(sent)
    assert all(g.accepted for g in goals)
    assert all(g.status == GoalStatus.STATUS_SUCCEEDED for g in goals)
    late = [g for g in goals if g.result_ns - g.sent_ns > g.deadline_ms * 1e6]
    assert late == [], [((g.result_ns - g.sent_ns) / 1e6, g.deadline_ms) for g in late]
    sources = [g.plan.source for g in goals]
    assert set(sources) <= {"model", "fallback"} and "model" in sources
    for g in goals:
        assert g.plan.command_id == g.goal_id and g.plan.deadline_ms == g.deadline_ms
        assert g.plan.header.stamp.sec > 0 and g.plan.cycle >= 0
        assert g.plan.outcome in ("plan", "refused")
        if g.plan.outcome == "refused":  # never a motion: no steps, what refused on its own
            assert list(g.plan.steps) == [] and json.loads(g.plan.plan_json) is None
            assert json.loads(g.plan.refusal_json)["steps"][0]["action"] == "refuse"
        else:  # the action language: typed steps, the same as the JSON plan's
            steps = json.loads(g.plan.plan_json)["steps"]
            assert [s.action for s in g.plan.steps] == [s["action"] for s in steps]
        # Feedback in order: phases, tokens and elapsed time never go back. (Feedback is a
        # topic and the result a service answer: the last feedback can reach the client after
        # the result, which rclpy then drops; so no particular phase is asserted per goal.)
        phases = [f.phase for f in g.feedback]
        assert [PHASES.index(p) for p in phases] == sorted(PHASES.index(p) for p in phases)
        tokens = [f.tokens for f in g.feedback]
        assert tokens == sorted(tokens)
        elapsed = [f.elapsed_ms for f in g.feedback]
        assert elapsed == sorted(elapsed)
        assert "fallback" not in phases or g.plan.source == "fallback"
    # feedback on the model's generations: tokens counted while they came out
    decoding = [g for g in goals if g.plan.source == "model"
                and any(f.phase == "decode" and f.tokens > 0 for f in g.feedback)]
    assert decoding, [[f.phase for f in g.feedback] for g in goals]
    # each goal's plan went out on the plan topics too, the same cycle
    client.wait_for(lambda: {g.goal_id for g in goals} <= {p.command_id for p in client.topic()},
                    30, "the goals' plans on /planner/plan")
    on_topic = {p.command_id: p for p in client.topic()}
    assert all(on_topic[g.goal_id].cycle == g.plan.cycle for g in goals)
    client.wait_for(lambda: {g.goal_id for g in goals}
                    <= {p["command_id"] for p in list(client.json_plans)}, 30,
                    "the goals' JSON plans on /planner/plan_json")
    # a cycle's record is written after its plan (and an aborted generation's partial trace)
    records = client.wait_for(lambda: (lambda got: got if {g.goal_id for g in goals} <= set(got)
                                       else None)(
        {r.command_id: r for r in read_records(log_dir / "cycles.jsonl")}), 30,
        "the goals' cycle records")
    assert all(records[g.goal_id].command_sent_ns is not None for g in goals)  # from the send
    assert all(records[g.goal_id].plan_source == g.plan.source for g in goals)


@pytest.fixture(scope="module")
def slow_planner(ros_context: Context, spin: Spinner,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, Path]]:
    """planner_node on the simulated engine, an 8B model on an Orin Nano 4GB (a token every
    few hundred ms), in the namespace /slow."""
    log_dir = tmp_path_factory.mktemp("slow-run")
    proc = _start_planner(ros_context, log_dir, "engine:=sim", "model:=llama-3-8b",
                          "quant:=Q8_0", "target_device:=orin-nano-4gb",
                          "deadline_ms:=20000.0", "period_ms:=20000.0", namespace="/slow")
    client = Client(spin, "/slow")
    try:
        spin.wait_for(lambda: client.action.server_is_ready() or proc.poll() is not None, 120,
                      "the slow planner's action server")
        yield client, log_dir
    finally:
        _stop(proc)


def test_a_goal_cancelled_mid_decode_returns_cancelled_and_publishes_nothing(
        slow_planner: tuple[Client, Path]) -> None:
    client, log_dir = slow_planner
    goal = client.send("pick up the red cup and put it on the tray")
    client.wait_for(lambda: any(f.phase == "decode" and f.tokens > 0 for f in goal.feedback),
                    120, "decode feedback")
    cancel = client.in_executor(goal.handle.cancel_goal_async)
    client.wait_for(cancel.done, 30, "the cancel response")
    assert len(cancel.result().goals_canceling) == 1
    _wait_done(client, goal, 30)
    assert goal.status == GoalStatus.STATUS_CANCELED
    assert goal.plan.source == "none" and goal.plan.fallback_reason == "cancelled"
    assert goal.result_ns - goal.sent_ns < 20000 * 1e6  # by its deadline, decode cut short
    # A goal sent after it is planned and published; the cancelled one never was (one
    # publisher, in order: its plan would have come first).
    after = client.send("stop")
    _wait_done(client, after, 120)
    assert after.status == GoalStatus.STATUS_SUCCEEDED
    client.wait_for(lambda: after.goal_id in {p.command_id for p in client.topic()}, 30,
                    "the later goal's plan on the topic")
    assert goal.goal_id not in {p.command_id for p in client.topic()}
    assert goal.goal_id not in {p["command_id"] for p in list(client.json_plans)}
    rec = next(r for r in read_records(log_dir / "cycles.jsonl") if r.command_id == goal.goal_id)
    assert rec.fallback_reason == "cancelled" and rec.plan_source == "none"
    assert rec.published_ns is None
