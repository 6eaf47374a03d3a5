"""The node executables say in one line what is missing where ROS or the interfaces are not
installed (a plain pip install): a real interpreter that cannot import them."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from robot_latency.ros.entry import missing_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("entry", ["planner_node", "managed_planner_node", "bag_replayer"])
@pytest.mark.parametrize("hidden", ["robot_latency_interfaces", "rclpy"])
def test_a_node_without_a_ros_part_exits_with_one_line(tmp_path: Path, entry: str,
                                                       hidden: str) -> None:
    # A module of that name that cannot be imported stands in for its absence: what the
    # interpreter raises is the real ModuleNotFoundError of a missing package.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import importlib.abc, sys\n"
        "class _Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {hidden!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Hide())\n")
    code = f"import sys; from robot_latency.ros.entry import {entry}; sys.exit({entry}())"
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{entry}: cannot import {hidden}"), lines


def test_another_missing_module_is_not_hidden() -> None:
    err = ModuleNotFoundError("No module named 'yaml'", name="yaml")
    assert missing_line("planner_node", err) is None
    msgs = ModuleNotFoundError("No module named 'diagnostic_msgs'", name="diagnostic_msgs")
    assert "ROS 2 message package" in (missing_line("planner_node", msgs) or "")


def test_leave_flushes_what_was_written_and_keeps_the_status() -> None:
    # Block-buffered stdout (a pipe, PYTHONUNBUFFERED unset), a logging line and C's stdio:
    # all reach the pipe though the interpreter's finalization is skipped.
    code = ("import ctypes, logging, sys; from robot_latency.ros.entry import leave; "
            "logging.basicConfig(stream=sys.stdout, level=logging.INFO); "
            "sys.stdout.write('python line\\n'); logging.getLogger('x').info('logged line'); "
            "ctypes.CDLL(None).printf(b'c line\\n'); leave(3)")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["python line", "INFO:x:logged line", "c line"], done.stdout


def test_a_node_leaves_with_its_status_and_its_log_on_stdout(tmp_path: Path) -> None:
    # rcutils' console output on stdout (C stdio, block-buffered into a pipe): the bad
    # parameter's line is there, and the status is the node's 2.
    env = {**os.environ, "ROS_DOMAIN_ID": str(random.randint(101, 200)),
           "ROS_LOCALHOST_ONLY": "1", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
           "RCUTILS_LOGGING_USE_STDOUT": "1"}
    env.pop("PYTHONUNBUFFERED", None)
    done = subprocess.run([str(Path(sys.executable).parent / "planner_node"), "--ros-args",
                           "-p", "engine:=sim", "-p", "mode:=sometimes",
                           "-p", f"log_dir:={tmp_path / 'run'}"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "parameter 'mode'" in done.stdout, (done.stdout, done.stderr)
