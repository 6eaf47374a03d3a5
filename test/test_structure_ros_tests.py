"""The in-process ROS tests spin their nodes only through test/ros/conftest.py's Spinner.

A node or topic destroyed from a test's thread while an executor spins in another one can kill
that executor's thread (ros2/rclpy#1142, #1355); every later test in the module then times out
waiting for a message nothing will deliver. This happened on CI. The Spinner stops its thread
before it destroys anything, so a test module must neither build an executor of its own nor
destroy ROS entities itself. The one exception is a node that was never spun, marked on its line
with ``# never spun``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROS_TESTS = Path(__file__).resolve().parent / "ros"
DESTROYERS = {"destroy_node", "destroy_publisher", "destroy_subscription", "destroy_timer",
              "destroy_client", "destroy_service", "destroy_lifecycle_publisher"}
EXEMPT = "# never spun"


def offences(source: str) -> list[tuple[int, str]]:
    """Return (line, what) for each executor built and each entity destroyed in ``source``."""
    lines = source.splitlines()
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name.endswith("Executor"):
            found.append((node.lineno, f"builds its own {name}"))
        elif name in DESTROYERS and EXEMPT not in lines[node.lineno - 1]:
            found.append((node.lineno, f"calls {name}() itself"))
    return sorted(found)


def test_the_check_catches_an_executor_and_a_destroy() -> None:
    source = ("from rclpy.executors import MultiThreadedExecutor\n"
              "ex = MultiThreadedExecutor(num_threads=4)\n"
              "node.destroy_publisher(pub)\n"
              "other.destroy_node()  # never spun\n")
    assert offences(source) == [(2, "builds its own MultiThreadedExecutor"),
                                (3, "calls destroy_publisher() itself")]


def test_ros_test_modules_leave_spinning_and_destroying_to_the_spinner() -> None:
    modules = sorted(ROS_TESTS.glob("test_*.py"))
    assert modules, ROS_TESTS
    bad = [f"{path.name}:{line}: {what}" for path in modules
           for line, what in offences(path.read_text())]
    assert not bad, ("use the spinner_for fixture (test/ros/conftest.py) instead:\n"
                     + "\n".join(bad))
