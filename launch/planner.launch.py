"""Launch the planner node.

    ros2 launch robot_latency planner.launch.py
    ros2 launch robot_latency planner.launch.py \
        params_file:=$(ros2 pkg prefix robot_latency)/share/robot_latency/config/orin_nano_8gb.yaml
    ros2 launch robot_latency planner.launch.py engine:=sim device_profile:=orin-agx-64gb \
        deadline_ms:=80 period_ms:=100

    ros2 launch robot_latency planner.launch.py managed:=true      # then, or by a lifecycle
    ros2 lifecycle set /planner_node configure                     # manager (Nav2's):
    ros2 lifecycle set /planner_node activate

Every argument left empty keeps the value of the params file (or the node's default); a value
given here overrides it. ``managed:=true`` starts the managed (lifecycle) planner node: it waits
unconfigured for ``configure`` (parameters checked, model loaded) and ``activate`` (planning);
``deactivate`` closes the run. The plain node (the default) plans from the start. The node
stops cleanly on Ctrl-C (cycles.jsonl flushed, summary.json written in log_dir).
"""

from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.launch_context import LaunchContext
from launch.launch_description import LaunchDescription
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = "robot_latency"
EXECUTABLE = "planner_node"
MANAGED_EXECUTABLE = "managed_planner_node"

# Launch argument -> planner_node parameter of the same name ("" keeps the params file's value).
PLANNER_PARAMETERS = {
    "engine": "registered engine name (llamacpp, sim, ...)",
    "model": "GGUF path (sim: a shape preset); empty: the bundled planner model",
    "quant": "quant type of a preset model (e.g. Q4_K_M)",
    "draft_model": "draft GGUF for speculative decoding",
    "device_profile": "target device profile (auto: the detected Jetson)",
    "deadline_ms": "deadline per cycle (ms)",
    "period_ms": "planner period (ms)",
    "log_dir": "run directory (default ~/.ros/robot_latency/<timestamp>-<pid>)",
}


def _planner(context: LaunchContext) -> list[Node]:
    params_file = LaunchConfiguration("params_file").perform(context)
    overrides = {}
    for name in PLANNER_PARAMETERS:
        value = LaunchConfiguration(name).perform(context)
        if value != "":
            overrides[name] = value  # numbers as strings are accepted by the node
    parameters = ([params_file] if params_file else []) + [overrides]
    managed = LaunchConfiguration("managed").perform(context).strip().lower()
    if managed not in ("", "true", "false", "1", "0"):
        raise ValueError(f"managed:={managed!r}: must be true or false")
    return [Node(package=PACKAGE,
                 executable=MANAGED_EXECUTABLE if managed in ("true", "1") else EXECUTABLE,
                 name="planner_node", output="screen", emulate_tty=True, parameters=parameters)]


def generate_launch_description() -> LaunchDescription:
    """Return the launch description: the arguments and the planner node."""
    arguments = [DeclareLaunchArgument(name, default_value="", description=description)
                 for name, description in PLANNER_PARAMETERS.items()]
    arguments.append(DeclareLaunchArgument(
        "params_file", default_value="",
        description="planner_node params file (config/orin_agx_64gb.yaml, "
                    "config/orin_nano_8gb.yaml, config/host.yaml); empty: the node's defaults"))
    arguments.append(DeclareLaunchArgument(
        "managed", default_value="false",
        description="true: the managed (lifecycle) planner node, driven through "
                    "configure/activate/deactivate/cleanup; false: the plain node"))
    return LaunchDescription([*arguments, OpaqueFunction(function=_planner)])
