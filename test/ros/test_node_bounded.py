"""What the planner node keeps per command stays bounded: goals and tagged topic commands, one
after another, through an in-process node (the sim engine, event mode).

An hour's soak (bench/node_soak.py) showed the node's RSS growing ~1.3 KB per command. Counted
here after each command, never timed: the executor's callback group (rclpy keeps a reference
there to every timer ever made, so the action server's feedback poll is one timer for its life),
the action server's goals, the clock bridge's remembered stamps, the loopback's pending publish
times, and run.mcap's chunk index (one packed entry per cycle, the file's index needs them all).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rclpy.context import Context
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.ros.action_client import GoalSender
from robot_latency.ros.client_edge import ClientTracker, make_sender
from robot_latency.ros.cycle_stats import ClockBridge
from robot_latency.ros.planner_node import PlannerNode
from robot_latency.ros.topics import COMMAND_TOPIC

WAIT_S = 60.0  # a hang guard, not a timing
TEXT = "pick up the red cup and put it on the tray"
Spinner = Any  # test/ros/conftest.py's Spinner


@pytest.fixture(scope="module")
def spin(ros_context: Context, spinner_for: Callable[[Context], Spinner]) -> Iterator[Spinner]:
    with spinner_for(ros_context) as s:
        yield s


def test_per_command_state_stays_bounded(ros_context: Context, spin: Spinner,
                                         tmp_path: Path) -> None:
    node = spin.add(PlannerNode(context=ros_context, parameter_overrides=[
        Parameter("engine", value="sim"), Parameter("target_device", value="orin-agx-64gb"),
        Parameter("mode", value="event"), Parameter("deadline_ms", value=400.0),
        Parameter("period_ms", value=500.0), Parameter("log_dir", value=str(tmp_path / "run"))]))
    assert node.startup_error is None, node.startup_error
    assert node.start()
    client = spin.add(Node("bounded_client", context=ros_context))
    tracker = ClientTracker(deadline_ms=400.0, via="action+topic")
    goals = GoalSender(client, tracker)
    pub = client.create_publisher(String, COMMAND_TOPIC,
                                  QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    send_topic = make_sender(tracker, lambda data: pub.publish(String(data=data)))
    spin.wait_for(lambda: goals.server_ready() and pub.get_subscription_count() >= 1,
                  WAIT_S, "the planner's action server and command subscription")
    core = node.core
    assert core.outputs is not None and node.driver is not None
    actions, loop, mcap = core.outputs.actions, node.driver.loop, node.driver.run.mcap

    def one(i: int) -> None:
        if i % 2 == 0:
            goals.send(f"g{i}", TEXT)
        else:
            send_topic(f"t{i}", TEXT)
        spin.wait_for(lambda: (loop.cycles_run == i + 1 and goals.pending == 0
                               and not actions._goals and actions._poll.is_canceled()),
                      WAIT_S, f"command {i} done")

    for i in range(4):
        one(i)
    entities = len(node.default_callback_group.entities)
    assert mcap.chunk_indexes is not None
    chunks = len(mcap.chunk_indexes)
    n = 40
    for i in range(4, 4 + n):
        one(i)
    spin.check()
    assert len(node.default_callback_group.entities) == entities
    assert not actions._done
    assert actions.goals_accepted == (4 + n) // 2
    assert len(core.outputs.clocks._from_ros) <= ClockBridge.KEEP_STAMPS
    # one chunk a cycle (its command in it), each entry the index's own bytes
    spin.wait_for(lambda: len(mcap.chunk_indexes) - chunks >= n, WAIT_S, "the last chunk")
    assert len(mcap.chunk_indexes) - chunks == n
    assert mcap.chunk_indexes.nbytes <= 128 * len(mcap.chunk_indexes)
    assert goals.rejected == goals.failed == 0  # every goal ended with its plan
    node.close()
