"""The planner node with the openai engine over real rclpy: it starts although its server does
not answer, reports ERROR on /diagnostics and falls back, then plans from the server once a real
llama-cpp-python server comes up at that address."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.engines.llama_server import LocalServer, free_port
from robot_latency.models.bundled import bundled_model_path
from robot_latency.ros.planner_node import PlannerNode

Spinner = Any  # test/ros/conftest.py's Spinner, handed out by the spinner_for fixture


def test_node_starts_without_its_server_reports_error_and_plans_once_it_answers(
        tmp_path: Path, ros_context: Context,
        spinner_for: Callable[[Context], Spinner]) -> None:
    port = free_port()
    context = ros_context
    spin = spinner_for(context)
    server = LocalServer(bundled_model_path(), port=port, n_threads=1,
                         log_path=tmp_path / "server.log")
    lock = threading.Lock()
    plans: list[dict[str, Any]] = []
    diagnostics: list[DiagnosticArray] = []
    node = None
    try:
        node = PlannerNode(context=context, parameter_overrides=[
            Parameter("engine", value="openai"),
            Parameter("server_url", value=f"http://127.0.0.1:{port}/v1"),
            Parameter("period_ms", value=1000.0), Parameter("deadline_ms", value=900),
            Parameter("publish_margin_ms", value=50.0),
            Parameter("log_dir", value=str(tmp_path / "run")),
            Parameter("diagnostics_period_s", value=0.2)])
        spin.add(node)
        assert node.startup_error is None, node.startup_error
        node.start()
        probe = rclpy.create_node("offboard_probe", context=context)
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        pub = probe.create_publisher(String, "/planner/command", qos)

        def on_plan(msg: String) -> None:
            with lock:
                plans.append(json.loads(msg.data))

        def on_diag(msg: DiagnosticArray) -> None:
            with lock:
                diagnostics.append(msg)
        probe.create_subscription(String, "/planner/plan_json", on_plan, qos)
        probe.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 100)
        spin.add(probe)

        def engine_status() -> Any:
            with lock:
                for array in diagnostics[::-1]:
                    for s in array.status:
                        if s.name == "planner_node: engine":
                            return s
            return None
        status = spin.wait_for(engine_status, 30, "engine diagnostics")
        assert status.level == b"\x02" and f"127.0.0.1:{port}" in status.message

        spin.wait_for(lambda: pub.get_subscription_count() >= 1, 15, "the planner's subscription")
        pub.publish(String(data="pick up the red cup"))
        fallback = spin.wait_for(lambda: next((p for p in list(plans) if p["command_id"]
                                          and p["source"] == "fallback"), None), 30,
                            "a fallback plan")
        assert fallback["fallback_reason"] == "server_unreachable" and fallback["plan"]

        server.start()
        pub.publish(String(data="go to the kitchen"))
        model = spin.wait_for(lambda: next((p for p in list(plans) if p["source"] == "model"),
                                      None), 60, "a plan from the server")
        assert model["plan"]["steps"]
    finally:
        server.stop()
        if node is not None:
            node.close()
        spin.close()
