"""The planner node's command inputs: the tagged std_msgs/String on ``planner/command`` and the
typed ``robot_latency_interfaces/msg/Command`` on ``planner/command_typed``, read into one
:class:`ReceivedCommand` each and handed to one handler (one code path after reading).

A typed command's ``header.stamp`` is its send on the ROS clock; it is moved onto the loop's
clock by the node's :class:`~robot_latency.ros.cycle_stats.ClockBridge` (the offset its plans and
cycle stats are stamped back with, so their ``header.stamp`` is the command's exactly). A zero
stamp is no stamp (the deadline starts at the arrival), as an untagged string is.

Why two topic names: one node's subscriptions share a DDS participant, and Fast DDS (the default
RMW) refuses a second type on a topic name it already has (rmw_fastrtps:
"create_publisher() called for existing topic name ... with incompatible type"); other RMWs
differ (ros2/ros2 issue 1095). So the typed command has a name of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from robot_latency.ros.client_edge import ReceivedCommand, read_command
from robot_latency.ros.cycle_stats import ClockBridge
from robot_latency.ros.topics import COMMAND_TOPIC, COMMAND_TYPED_TOPIC
from robot_latency_interfaces.msg import Command

#: ``on_command(received, state)``: state is the command's own robot state (None: the latest).
CommandHandler = Callable[[ReceivedCommand, "str | None"], None]


def stamp_ns(msg: Command) -> int:
    """The typed command's header stamp in ns (0: unstamped)."""
    return int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)


def read_typed_command(msg: Command, *, clocks: ClockBridge,
                       loop_clock: Callable[[], int] | None) -> ReceivedCommand:
    """Read a typed command: its id (empty: None, the node numbers it), its text, and its send
    on ``loop_clock`` (None where unstamped or no loop clock is known)."""
    sent_ros_ns = stamp_ns(msg)
    sent_ns = (clocks.loop_ns(sent_ros_ns, loop_clock)
               if sent_ros_ns > 0 and loop_clock is not None else None)
    return ReceivedCommand(msg.id or None, msg.text, sent_ns)


def command_subscriptions(node: Node, on_command: CommandHandler, *, depth: int,
                          clock_id: str | None, clocks: ClockBridge,
                          loop_clock: Callable[[], Callable[[], int] | None]) -> list[Any]:
    """Subscribe to both command inputs; return the subscriptions.

    Args:
        on_command: called once per command received on either topic.
        depth: the queue depth (reliable).
        clock_id: this boot's monotonic clock id (a tagged string stamped on it keeps its send).
        clocks: moves a typed command's stamp onto the loop's clock.
        loop_clock: the open run's loop clock (None while no run is open).
    """
    qos = QoSProfile(depth=depth, reliability=ReliabilityPolicy.RELIABLE)

    def on_string(msg: String) -> None:
        on_command(read_command(msg.data, clock_id=clock_id), None)

    def on_typed(msg: Command) -> None:
        on_command(read_typed_command(msg, clocks=clocks, loop_clock=loop_clock()),
                   msg.state or None)

    return [node.create_subscription(String, COMMAND_TOPIC, on_string, qos),
            node.create_subscription(Command, COMMAND_TYPED_TOPIC, on_typed, qos)]
