"""The node executables' entry points: say in one line what is missing, instead of a traceback.

The nodes need ROS 2 (rclpy and the message packages) and this project's interface package,
``robot_latency_interfaces``. A plain ``pip install`` of the Python package has neither (the CLI
needs no ROS); a node started there exits with status 1 and one line naming what to install.
Imports nothing of ROS itself until the node module is imported.

Once a node's ``main()`` has returned (its run closed, its node destroyed, rclpy shut down), the
process leaves at once with that status (:func:`leave`): the interpreter's own finalization,
which would free what is left of rclpy and the DDS participant's threads in no set order, is
skipped. A node that had logged a bad parameter and returned status 2 once ended with SIGSEGV
(-11) instead, in a suite run (a rare crash at a Python node's exit: ros2/rclpy#178,
ros2/ros2_controllers#1933). A crash before that point prints its Python stack
(:mod:`faulthandler`), so the next one names where it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import importlib
import logging
import os
import sys
from collections.abc import Callable

#: The top-level modules the nodes need, and where each comes from.
NEEDS = {
    "rclpy": "ROS 2's rclpy: source a ROS 2 install, or `make install` (pip wheels, "
             "requirements/ros.txt)",
    "robot_latency_interfaces": "the interface package robot_latency_interfaces: `make install` "
                                "builds it into the venv, or colcon builds it beside the planner "
                                "(docs/ROS.md, 'Typed plans and the PlanCommand action')",
}


def missing_line(executable: str, err: ModuleNotFoundError) -> str | None:
    """The one line for a missing ROS module (None: not one the nodes need from outside)."""
    top = (err.name or "").split(".")[0]
    for module, where in NEEDS.items():
        if top == module:
            return f"{executable}: cannot import {err.name} ({where})"
    if top.endswith("_msgs") or top in ("builtin_interfaces", "unique_identifier_msgs"):
        return f"{executable}: cannot import {err.name} (a ROS 2 message package: {NEEDS['rclpy']})"
    return None


def leave(status: int) -> None:
    """End the process now with ``status``: Python logging, the standard streams and C's stdio
    buffers (rcutils' console output) flushed, the interpreter's finalization skipped (see the
    module's docstring)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    ctypes.CDLL(None).fflush(None)
    os._exit(status)


def _run(executable: str, module: str) -> Callable[[], int]:
    def main() -> int:
        if not faulthandler.is_enabled():
            faulthandler.enable()
        try:
            node_main = importlib.import_module(module).main
        except ModuleNotFoundError as err:
            line = missing_line(executable, err)
            if line is None:
                raise
            sys.stderr.write(line + "\n")
            return 1
        leave(int(node_main()))
        return 1  # not reached

    return main


planner_node = _run("planner_node", "robot_latency.ros.planner_node")
managed_planner_node = _run("managed_planner_node", "robot_latency.ros.managed_planner_node")
bag_replayer = _run("bag_replayer", "robot_latency.ros.bag_replayer")
