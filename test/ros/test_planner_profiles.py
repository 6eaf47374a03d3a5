"""Planner profiles through planner_node over real rclpy and Fast DDS, on real llama.cpp.

Typed commands ("STOP!") get the same model plan as their plain forms; the robot state published
on /planner/state reaches the prompt of a profile whose template asks for it.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rclpy
import yaml
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.records import read_records
from robot_latency.ros.planner_node import PlannerNode

DOMAIN_ID = random.randint(101, 200)


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def ros() -> Iterator[tuple[Context, MultiThreadedExecutor]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        mp.setenv("ROS_LOCALHOST_ONLY", "1")
        context = Context()
        rclpy.init(context=context, domain_id=DOMAIN_ID)
        executor = MultiThreadedExecutor(num_threads=4, context=context)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            yield context, executor
        finally:
            executor.shutdown(timeout_sec=5)
            context.try_shutdown()
            spinner.join(5)


class Client:
    """Publishes commands and state; collects plan envelopes."""

    def __init__(self, context: Context) -> None:
        self.node = Node("profile_client", context=context)
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.plans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.commands = self.node.create_publisher(String, "/planner/command", qos)
        self.state = self.node.create_publisher(String, "/planner/state",
                                                QoSProfile(depth=1,
                                                           reliability=ReliabilityPolicy.RELIABLE))
        self.node.create_subscription(String, "/planner/plan", self._on_plan, qos)

    def _on_plan(self, msg: String) -> None:
        with self.lock:
            self.plans.append(json.loads(msg.data))

    def ask(self, text: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Send one command and return the plan envelope that answers it."""
        with self.lock:
            n = len(self.plans)
        self.commands.publish(String(data=text))
        return wait_for(lambda: self.plans[n] if len(self.plans) > n else None, timeout_s,
                        f"the plan for {text!r}")


def start_node(ros: tuple[Context, MultiThreadedExecutor], log_dir: Path,
               **params: Any) -> PlannerNode:
    context, executor = ros
    overrides = [Parameter("mode", value="event"), Parameter("deadline_ms", value=5000.0),
                 Parameter("period_ms", value=5000.0), Parameter("log_dir", value=str(log_dir)),
                 *(Parameter(k, value=v) for k, v in params.items())]
    node = PlannerNode(context=context, parameter_overrides=overrides)
    assert node.startup_error is None, node.startup_error
    executor.add_node(node)
    assert node.start()
    return node


def stop_node(ros: tuple[Context, MultiThreadedExecutor], node: PlannerNode) -> None:
    node.close()
    ros[1].remove_node(node)
    node.destroy_node()


def connect(ros: tuple[Context, MultiThreadedExecutor]) -> Client:
    client = Client(ros[0])
    ros[1].add_node(client.node)
    wait_for(lambda: client.commands.get_subscription_count() >= 1
             and client.node.count_publishers("/planner/plan") >= 1, 30,
             "the planner to be discovered")
    return client


def test_typed_and_plain_commands_get_the_same_plan_through_the_node(
        ros: tuple[Context, MultiThreadedExecutor], tmp_path: Path,
        typed_and_plain: list[tuple[str, str]]) -> None:
    node = start_node(ros, tmp_path / "run")
    client = connect(ros)
    try:
        for typed, plain in typed_and_plain:
            a, b = client.ask(typed), client.ask(plain)
            assert (a["source"], b["source"]) == ("model", "model"), (typed, a, b)
            assert a["plan"] == b["plan"], (typed, a["plan"], b["plan"])
        stop = client.ask("STOP!")
        assert [s["action"] for s in stop["plan"]["steps"]] == ["stop"]
    finally:
        ros[1].remove_node(client.node)
        client.node.destroy_node()
        stop_node(ros, node)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["profile"]["name"] == "bundled-actions"


def test_state_topic_reaches_the_prompt(ros: tuple[Context, MultiThreadedExecutor],
                                        tmp_path: Path) -> None:
    profile = tmp_path / "stateful.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "stateful", "normalize": "bundled", "chat_format": "raw",
        "prompt": {"user": "{state} {command}<plan>", "state_default": "idle"},
        "output": {"contract": "actions", "max_tokens": 24}}))
    node = start_node(ros, tmp_path / "run", planner_profile=str(profile))
    client = connect(ros)
    try:
        client.ask("stop")
        client.state.publish(String(data="docked"))
        # The state is taken at the next cycle: resend until a prompt shows it (delivery of the
        # state message is asynchronous).
        def saw_state() -> bool:
            client.ask("stop")
            return any(r.prompt == "docked stop<plan>"
                       for r in read_records(tmp_path / "run" / "cycles.jsonl"))
        wait_for(saw_state, 60, "a prompt carrying the published state")
    finally:
        ros[1].remove_node(client.node)
        client.node.destroy_node()
        stop_node(ros, node)
    prompts = [r.prompt for r in read_records(tmp_path / "run" / "cycles.jsonl")]
    assert prompts[0] == "idle stop<plan>"
    assert os.path.getsize(tmp_path / "run" / "summary.json") > 0
