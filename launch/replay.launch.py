"""Launch the planner node and replay a recorded command stream into it (the whole pipeline).

    ros2 launch robot_latency replay.launch.py bag:=/data/operator_session engine:=sim \
        target_device:=orin-nano-8gb
    ros2 launch robot_latency replay.launch.py bag:=/data/operator_session mode:=event

The bag replayer publishes the stream's commands on /planner/command at the recorded pace
(times ``speed``); when it has finished, the launch shuts down and the planner closes its run
(cycles.jsonl flushed, summary.json written in log_dir).
"""

import os

from launch.actions import (
    DeclareLaunchArgument,
    EmitEvent,
    IncludeLaunchDescription,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.launch_context import LaunchContext
from launch.launch_description import LaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = "robot_latency"
PLANNER_LAUNCH = "planner.launch.py"

# Arguments passed through to planner.launch.py unchanged.
PLANNER_ARGUMENTS = ("engine", "model", "planner_profile", "quant", "draft_model",
                     "device_profile", "deadline_ms", "period_ms", "mode", "log_dir", "params_file",
                     "managed", "autostart", "on_new_command", "server_url", "server_model",
                     "server_api", "hybrid_policy", "target_device")

# Launch argument -> bag_replayer parameter of the same name ("" keeps the node's default).
REPLAYER_PARAMETERS = {
    "bag": "rosbag2 directory, bare .mcap or .jsonl command stream (required)",
    "topic": "command topic in the bag (default: its only std_msgs/String topic)",
    "speed": "replay speed factor (2.0: twice as fast)",
    "min_subscribers": "listeners on the command topic to wait for before replaying (default 1: "
                       "the planner; more when a recorder or monitor listens too)",
}


def _nodes(context: LaunchContext) -> list:
    overrides = {}
    for name in REPLAYER_PARAMETERS:
        value = LaunchConfiguration(name).perform(context)
        if value != "":
            overrides[name] = value
    replayer = Node(package=PACKAGE, executable="bag_replayer", name="bag_replayer",
                    output="screen", emulate_tty=True, parameters=[overrides])
    planner = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), PLANNER_LAUNCH)),
        launch_arguments={name: LaunchConfiguration(name) for name in PLANNER_ARGUMENTS}.items())
    # The replay ending ends the run: Shutdown sends SIGINT, and the planner closes its run.
    done = RegisterEventHandler(OnProcessExit(
        target_action=replayer, on_exit=[EmitEvent(event=Shutdown(reason="replay finished"))]))
    return [planner, replayer, done]


def generate_launch_description() -> LaunchDescription:
    """Return the launch description: the arguments, the planner and the bag replayer."""
    arguments = [DeclareLaunchArgument(name, default_value="", description=description)
                 for name, description in REPLAYER_PARAMETERS.items()]
    arguments += [DeclareLaunchArgument(name, default_value="",
                                        description=f"passed to {PLANNER_LAUNCH}")
                  for name in PLANNER_ARGUMENTS]
    return LaunchDescription([*arguments, OpaqueFunction(function=_nodes)])
