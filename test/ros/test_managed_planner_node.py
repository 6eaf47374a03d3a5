"""The managed (lifecycle) planner node, driven through its lifecycle services over real DDS.

The node runs as its own process (``python -m robot_latency.ros.managed_planner_node``); this
test is the outside client a lifecycle manager would be: it calls ``/planner_node/change_state``
and ``/planner_node/get_state`` (lifecycle_msgs) and publishes commands on /planner/command.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rclpy.context import Context
from rclpy.lifecycle import LifecycleState
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.lifetime import popen
from robot_latency.records import read_records
from robot_latency.ros.client_edge import tag_command
from robot_latency.ros.managed_planner_node import ManagedPlannerNode

DOMAIN_ID = random.randint(201, 230)
NODE = "/planner_node"
Spinner = Any  # test/ros/conftest.py's Spinner, handed out by the spinner_for fixture


def _env() -> dict[str, str]:
    return {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_LOCALHOST_ONLY": "1",
            "PYTHONUNBUFFERED": "1"}


class Manager:
    """The outside client: lifecycle service calls, commands out, plans in."""

    def __init__(self, spin: Spinner) -> None:
        self.node = spin.add(Node("test_lifecycle_manager", context=spin.executor.context))
        self.wait_for = spin.wait_for
        self.change = self.node.create_client(ChangeState, f"{NODE}/change_state")
        self.get = self.node.create_client(GetState, f"{NODE}/get_state")
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.node.create_publisher(String, "/planner/command", qos)
        self.plans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.node.create_subscription(String, "/planner/plan_json", self._plan, qos)
        self.diagnostics: list[tuple[str, int, str]] = []
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._diag, 100)

    def _diag(self, msg: DiagnosticArray) -> None:
        with self.lock:
            self.diagnostics += [(s.name, s.level[0] if isinstance(s.level, bytes) else s.level,
                                  s.message) for s in msg.status]

    def _plan(self, msg: String) -> None:
        with self.lock:
            self.plans.append(json.loads(msg.data))

    def _call(self, client: Any, request: Any, timeout_s: float = 120.0) -> Any:
        assert client.wait_for_service(timeout_sec=60.0), "lifecycle service not found"
        future = client.call_async(request)
        end = time.monotonic() + timeout_s
        while not future.done():
            assert time.monotonic() < end, "no answer from the lifecycle service"
            time.sleep(0.01)
        return future.result()

    def transition(self, transition_id: int) -> bool:
        req = ChangeState.Request()
        req.transition.id = transition_id
        return bool(self._call(self.change, req).success)

    def state(self) -> int:
        return int(self._call(self.get, GetState.Request()).current_state.id)


@pytest.fixture(scope="module")
def manager(spinner_for: Callable[[Context], Spinner]) -> Iterator[Manager]:
    context = Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    spin = spinner_for(context)
    try:
        yield Manager(spin)
    finally:
        spin.close()
        context.try_shutdown()


def _start(tmp_path: Path, params: dict[str, str]) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "robot_latency.ros.managed_planner_node", "--ros-args"]
    for k, v in params.items():
        args += ["-p", f"{k}:={v}"]
    log = open(tmp_path / "node.log", "wb")
    return popen(args, env=_env(), stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=60)


def test_a_bad_model_path_fails_configure_and_leaves_it_unconfigured(
        manager: Manager, tmp_path: Path) -> None:
    proc = _start(tmp_path, {"engine": "llamacpp", "model": str(tmp_path / "missing.gguf"),
                             "log_dir": str(tmp_path / "run"), "diagnostics_period_s": "0.2"})
    try:
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert not manager.transition(Transition.TRANSITION_CONFIGURE)
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert proc.poll() is None  # the node lives on, ready for a corrected configure
        # /diagnostics is volatile: the ERROR is repeated until a transition succeeds, so it is
        # seen however late this subscription matched.
        errors = manager.wait_for(
            lambda: (lambda got: got if len(got) >= 2 else None)(
                [d for d in manager.diagnostics if d[0].endswith(": lifecycle")]), 30,
            "the ERROR diagnostic, repeated")
        assert all(level == DiagnosticStatus.ERROR[0] and "missing.gguf" in message
                   for _, level, message in errors), errors
    finally:
        assert _stop(proc) == 0
    log = (tmp_path / "node.log").read_text()
    assert "configure failed" in log and "missing.gguf" in log


def test_transitions_in_order_and_out_of_order(manager: Manager, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(tmp_path, {"engine": "sim", "target_device": "orin-agx-64gb",
                             "mode": "event", "deadline_ms": "150.0", "period_ms": "200.0",
                             "log_dir": str(run)})
    try:
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        # Out of order: the standard refusal, and the state stays.
        assert not manager.transition(Transition.TRANSITION_ACTIVATE)
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert manager.transition(Transition.TRANSITION_CONFIGURE)
        assert manager.state() == State.PRIMARY_STATE_INACTIVE
        assert not run.exists()  # configured (engine loaded), no run yet
        assert not manager.transition(Transition.TRANSITION_CONFIGURE)
        assert manager.state() == State.PRIMARY_STATE_INACTIVE
        assert manager.transition(Transition.TRANSITION_ACTIVATE)
        assert manager.state() == State.PRIMARY_STATE_ACTIVE
        manager.wait_for(lambda: manager.pub.get_subscription_count() > 0, 30,
                         "the command subscriber")
        for i in range(5):
            manager.pub.publish(String(data=f"go to the kitchen {i}"))
            time.sleep(0.4)
        manager.wait_for(lambda: len(manager.plans) >= 3, 60, "plans while active")
        manager.wait_for(
            lambda: any(d[0] == "planner_node: deadline" for d in manager.diagnostics), 30,
            "health on /diagnostics while active")
        assert manager.transition(Transition.TRANSITION_DEACTIVATE)
        assert manager.state() == State.PRIMARY_STATE_INACTIVE
        # The run closed by deactivate is complete: summary agrees with the flushed records.
        summary = json.loads((run / "summary.json").read_text())
        records = read_records(run / "cycles.jsonl")
        assert summary["cycles"] == len(records) >= 3
        assert all(r.published_ns is not None or r.skipped for r in records)
        assert json.loads((run / "manifest.json").read_text())["status"] == "finished"
        n_plans = len(manager.plans)
        # Inactive: a command is received and dropped (the node says so in its log), and no
        # plan answers it, then or after the next activation.
        node_log = tmp_path / "node.log"
        dropped_before = node_log.read_text().count("received while not active")
        manager.pub.publish(String(data=tag_command("while-inactive", "stop")))
        manager.wait_for(
            lambda: node_log.read_text().count("received while not active") > dropped_before,
            30, "the node to drop the command received while inactive")
        assert len(manager.plans) == n_plans
        # Again: a second run in its own directory, without reloading the model.
        assert manager.transition(Transition.TRANSITION_ACTIVATE)
        manager.pub.publish(String(data=tag_command("after", "go to the kitchen")))
        manager.wait_for(lambda: any(p["command_id"] == "after" for p in list(manager.plans)),
                         60, "the plan for the command sent once active again")
        assert not any(p["command_id"] == "while-inactive" for p in list(manager.plans))
        assert [p["command_id"] for p in manager.plans[n_plans:]] == ["after"]
        assert manager.transition(Transition.TRANSITION_DEACTIVATE)
        assert (run.with_name("run-2") / "summary.json").exists()
        assert not manager.transition(Transition.TRANSITION_DEACTIVATE)
        assert manager.state() == State.PRIMARY_STATE_INACTIVE
        assert manager.transition(Transition.TRANSITION_CLEANUP)
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert manager.transition(Transition.TRANSITION_UNCONFIGURED_SHUTDOWN)
        assert manager.state() == State.PRIMARY_STATE_FINALIZED
    finally:
        assert _stop(proc) == 0, (tmp_path / "node.log").read_text()


def test_shutdown_from_active_closes_the_run(manager: Manager, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _start(tmp_path, {"engine": "sim", "target_device": "orin-agx-64gb",
                             "period_ms": "100.0", "deadline_ms": "80.0", "log_dir": str(run)})
    try:
        assert manager.transition(Transition.TRANSITION_CONFIGURE)
        assert manager.transition(Transition.TRANSITION_ACTIVATE)
        manager.wait_for(lambda: (run / "cycles.jsonl").exists()
                         and len((run / "cycles.jsonl").read_text().splitlines()) >= 3, 60,
                         "cycles")
        assert manager.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN)
        assert manager.state() == State.PRIMARY_STATE_FINALIZED
        summary = json.loads((run / "summary.json").read_text())
        assert summary["cycles"] == len(read_records(run / "cycles.jsonl"))
    finally:
        assert _stop(proc) == 0, (tmp_path / "node.log").read_text()


def test_the_error_stops_repeating_once_a_configure_succeeds(
        ros_context: Context, spinner_for: Callable[[Context], Spinner], tmp_path: Path) -> None:
    """In-process, on a domain of its own: a failed configure's ERROR stands and repeats; with
    the parameter corrected, the next configure succeeds and clears it."""
    spin = spinner_for(ros_context)
    node = None
    lock = threading.Lock()
    errors: list[str] = []

    def on_diag(msg: DiagnosticArray) -> None:
        with lock:
            errors.extend(s.message for s in msg.status if s.name.endswith(": lifecycle"))

    try:
        node = spin.add(ManagedPlannerNode(context=ros_context, parameter_overrides=[
            Parameter("engine", value="llamacpp"),
            Parameter("model", value=str(tmp_path / "missing.gguf")),
            Parameter("log_dir", value=str(tmp_path / "run")),
            Parameter("diagnostics_period_s", value=0.2)]))
        client = spin.add(Node("standing_error_client", context=ros_context))
        client.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 100)
        change = client.create_client(ChangeState, f"{NODE}/change_state")

        def configure() -> bool:  # through the service: the transition runs in the spinner
            assert change.wait_for_service(timeout_sec=30), "no change_state service"
            request = ChangeState.Request()
            request.transition.id = Transition.TRANSITION_CONFIGURE
            future = change.call_async(request)
            spin.wait_for(future.done, 120, "the configure transition")
            return bool(future.result().success)

        assert not configure()
        assert node.core.standing.names == ("lifecycle",)
        spin.wait_for(lambda: len(list(errors)) >= 2, 30, "the ERROR, repeated")
        assert all("missing.gguf" in m for m in list(errors))
        assert node.set_parameters([Parameter("model", value="")])[0].successful  # bundled
        assert configure(), node.last_error
        assert node.core.standing.names == ()
    finally:
        spin.stop()  # before on_shutdown destroys the node's topics
        if node is not None:
            node.on_shutdown(LifecycleState(0, "test"))
        spin.close()
