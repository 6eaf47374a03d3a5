"""Run a launch file in a real ``LaunchService`` (what ``ros2 launch`` does) and listen for plans.

    python launch_driver.py LAUNCH_FILE WANT_PLANS TIMEOUT_S [name:=value ...]

With WANT_PLANS > 0 the launch is shut down (a Shutdown event, as Ctrl-C in ``ros2 launch``) once
that many plans arrived on /planner/plan_json; with 0 it runs until the launch ends by itself (the
replay launch ends when the replay is done). Either way it ends at TIMEOUT_S. The last line of
stdout is JSON: the plans received, ``LaunchService.run``'s return code, and what stopped it.
Used by test_launch_run.py with the ``launch``/``launch_ros`` of each ROS 2 version on PYTHONPATH.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import rclpy
from launch.actions import IncludeLaunchDescription
from launch.events import Shutdown
from launch.launch_description_sources import PythonLaunchDescriptionSource
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

import launch


def main() -> int:
    path, want, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    arguments = [tuple(a.split(":=", 1)) for a in sys.argv[4:]]
    rclpy.init(args=[sys.argv[0]])  # the launch arguments are not ROS arguments
    node = Node("launch_probe")
    lock = threading.Lock()
    plans: list[dict] = []

    def on_plan(msg: String) -> None:
        with lock:
            plans.append(json.loads(msg.data))

    node.create_subscription(String, "/planner/plan_json", on_plan,
                             QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE))
    # Also a listener on the command topic: a replay launched with min_subscribers:=2 waits until
    # this probe is discovered too, so its plan subscription is matched before plans flow.
    node.create_subscription(String, "/planner/command", lambda msg: None,
                             QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()

    service = launch.LaunchService()
    service.include_launch_description(launch.LaunchDescription([IncludeLaunchDescription(
        PythonLaunchDescriptionSource(path), launch_arguments=arguments)]))
    stopped_by = {"why": "launch"}
    finished = threading.Event()

    def watch() -> None:
        end = time.monotonic() + timeout_s
        while not finished.wait(0.05):
            with lock:
                enough = want > 0 and len(plans) >= want
            if enough or time.monotonic() > end:
                stopped_by["why"] = "plans" if enough else "timeout"
                service.emit_event(Shutdown(reason=f"test driver: {stopped_by['why']}"))
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    rc = service.run()
    finished.set()
    watcher.join(5)
    time.sleep(0.5)  # plans published just before the shutdown
    executor.shutdown(timeout_sec=5)
    spinner.join(5)
    node.destroy_node()
    rclpy.try_shutdown()
    with lock:
        got = list(plans)
    print(json.dumps({"plans": got, "run_rc": rc, "stopped_by": stopped_by["why"],
                      "launch_version": getattr(launch, "__file__", "")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
