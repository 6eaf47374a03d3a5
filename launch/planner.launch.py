"""Launch the planner node.

    ros2 launch robot_latency planner.launch.py
    ros2 launch robot_latency planner.launch.py \
        params_file:=$(ros2 pkg prefix robot_latency)/share/robot_latency/config/orin_nano_8gb.yaml
    ros2 launch robot_latency planner.launch.py engine:=sim target_device:=orin-agx-64gb \
        deadline_ms:=80 period_ms:=100
    ros2 launch robot_latency planner.launch.py mode:=event     # a cycle per arriving command

    ros2 launch robot_latency planner.launch.py managed:=true      # configured and activated
    ros2 launch robot_latency planner.launch.py managed:=true autostart:=false   # then, or by a
    ros2 lifecycle set /planner_node configure                     # lifecycle manager (Nav2's):
    ros2 lifecycle set /planner_node activate

Every argument left empty keeps the value of the params file (or the node's default); a value
given here overrides it. ``managed:=true`` starts the managed (lifecycle) planner node:
``configure`` checks the parameters and loads the model, ``activate`` starts planning (both at
launch with ``autostart:=true``, the default; else it waits for a lifecycle manager);
``deactivate`` closes the run. The plain node (the default) plans from the start. The node
stops cleanly on Ctrl-C (cycles.jsonl flushed, summary.json written in log_dir).
"""

from launch.actions import DeclareLaunchArgument, EmitEvent, OpaqueFunction, RegisterEventHandler
from launch.events import matches_action
from launch.launch_context import LaunchContext
from launch.launch_description import LaunchDescription
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition

PACKAGE = "robot_latency"
EXECUTABLE = "planner_node"
MANAGED_EXECUTABLE = "managed_planner_node"

# Launch argument -> planner_node parameter of the same name ("" keeps the params file's value).
PLANNER_PARAMETERS = {
    "engine": "registered engine name (llamacpp, sim, ...)",
    "model": "GGUF path (sim: a shape preset); empty: the bundled planner model",
    "planner_profile": "planner profile: bundled-actions, instruct-json or a YAML path",
    "quant": "quant type of a preset model (e.g. Q4_K_M)",
    "draft_model": "draft GGUF for speculative decoding",
    "target_device": "target device datasheet (auto: the detected Jetson)",
    "deadline_ms": "deadline per cycle (ms)",
    "period_ms": "planner period (ms)",
    "mode": "periodic (a timer at period_ms; the deadline counts from the tick) or event (each "
            "arriving command starts a cycle; the deadline counts from its arrival)",
    "log_dir": "run directory (default ~/.ros/robot_latency/<timestamp>-<pid>)",
    "on_new_command": "event mode: queue (a newer command waits) or preempt (it aborts the "
                      "older generation; the older is recorded as superseded)",
    "server_url": "OpenAI-compatible server for engine openai or hybrid (http://HOST:PORT/v1)",
    "server_model": "model name to ask the server for (empty: the first it lists)",
    "server_api": "completions or chat",
    "hybrid_policy": "engine hybrid: first_valid or prefer_server",
    "device_profile": "old name of target_device, kept for one release",
}


def _managed(context: LaunchContext, parameters: list) -> list:
    """The managed node; with ``autostart`` it is configured, then activated once inactive."""
    node = LifecycleNode(package=PACKAGE, executable=MANAGED_EXECUTABLE, name="planner_node",
                         namespace="", output="screen", emulate_tty=True, parameters=parameters)
    autostart = LaunchConfiguration("autostart").perform(context).strip().lower()
    if autostart not in ("true", "1"):
        return [node]

    def change(transition: int) -> EmitEvent:
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(node),
                                           transition_id=transition))

    # configure -> (inactive) activate: what a lifecycle manager's autostart does.
    activate = RegisterEventHandler(OnStateTransition(
        target_lifecycle_node=node, start_state="configuring", goal_state="inactive",
        entities=[change(Transition.TRANSITION_ACTIVATE)]))
    return [activate, node, change(Transition.TRANSITION_CONFIGURE)]


def _planner(context: LaunchContext) -> list:
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
    if managed in ("true", "1"):
        return _managed(context, parameters)
    return [Node(package=PACKAGE, executable=EXECUTABLE, name="planner_node", output="screen",
                 emulate_tty=True, parameters=parameters)]


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
    arguments.append(DeclareLaunchArgument(
        "autostart", default_value="true",
        description="with managed:=true: configure and activate it at launch (false: leave it "
                    "unconfigured for a lifecycle manager)"))
    return LaunchDescription([*arguments, OpaqueFunction(function=_planner)])
