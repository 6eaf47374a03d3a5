"""The managed planner node serves the PlanCommand action too, and accepts goals only while
active: the node in its own process, driven through its lifecycle services, goals from an rclpy
action client here (real DDS, no mocks). As a Nav2 lifecycle node's action server, it exists
from configure to cleanup and rejects goals while inactive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from action_msgs.msg import GoalStatus
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.action import ActionClient
from rclpy.context import Context
from rclpy.node import Node

from robot_latency.lifetime import popen
from robot_latency.rosenv import LOCALHOST_ENV
from robot_latency_interfaces.action import PlanCommand

Spinner = Any  # test/ros/conftest.py's Spinner


class Caller:
    """A lifecycle manager and a behaviour tree in one node."""

    def __init__(self, spin: Spinner) -> None:
        self.spin = spin
        self.node = spin.add(Node("managed_action_caller", context=spin.executor.context))
        self.change = self.node.create_client(ChangeState, "/planner_node/change_state")
        self.action = ActionClient(self.node, PlanCommand, "/planner/plan_command")

    def transition(self, transition_id: int) -> bool:
        assert self.change.wait_for_service(timeout_sec=60.0)
        request = ChangeState.Request()
        request.transition.id = transition_id
        future = self.change.call_async(request)
        self.spin.wait_for(future.done, 120, f"transition {transition_id}")
        return bool(future.result().success)

    def goal(self, text: str) -> tuple[bool, int | None]:
        """Send a goal; return whether it was accepted and, if so, its final status."""
        future = self.action.send_goal_async(PlanCommand.Goal(command=text))
        self.spin.wait_for(future.done, 60, "the goal response")
        handle = future.result()
        if not handle.accepted:
            return False, None
        result = handle.get_result_async()
        self.spin.wait_for(result.done, 60, "the goal result")
        return True, result.result().status


@pytest.fixture(scope="module")
def caller(ros_context: Context, spinner_for: Callable[[Context], Spinner],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Caller]:
    log_dir = tmp_path_factory.mktemp("managed-action")
    env = {**os.environ, **LOCALHOST_ENV,
           "ROS_DOMAIN_ID": str(ros_context.get_domain_id()), "PYTHONUNBUFFERED": "1"}
    proc = popen(
        [sys.executable, "-m", "robot_latency.ros.managed_planner_node", "--ros-args",
         "-p", "engine:=sim", "-p", "target_device:=orin-agx-64gb", "-p", "mode:=event",
         "-p", "deadline_ms:=3000.0", "-p", "period_ms:=3000.0", "-p", f"log_dir:={log_dir}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with spinner_for(ros_context) as spin:
        c = Caller(spin)
        try:
            yield c
        finally:
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out.decode(errors="replace")


def test_goals_are_accepted_only_while_active(caller: Caller) -> None:
    assert caller.transition(Transition.TRANSITION_CONFIGURE)
    caller.spin.wait_for(caller.action.server_is_ready, 60, "the action server")
    assert caller.goal("go to the kitchen") == (False, None)  # inactive
    assert caller.transition(Transition.TRANSITION_ACTIVATE)
    assert caller.goal("go to the kitchen") == (True, GoalStatus.STATUS_SUCCEEDED)
    assert caller.transition(Transition.TRANSITION_DEACTIVATE)
    assert caller.goal("go to the kitchen") == (False, None)
    assert caller.transition(Transition.TRANSITION_ACTIVATE)  # a second run serves them again
    assert caller.goal("stop") == (True, GoalStatus.STATUS_SUCCEEDED)
    assert caller.transition(Transition.TRANSITION_DEACTIVATE)
    assert caller.transition(Transition.TRANSITION_CLEANUP)
