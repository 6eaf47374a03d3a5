"""The ROS distro and rclpy version the manifest records, from whichever install provides rclpy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from robot_latency.rosenv import LOCALHOST_ENV, localhost_env, ros_facts

FACTS = "import json, robot_latency.rosenv as r; print(json.dumps(r.ros_facts().to_dict()))"


def _facts_in_child(env: dict[str, str]) -> dict[str, str | None]:
    done = subprocess.run([sys.executable, "-c", FACTS], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_pip_wheels_here() -> None:
    facts = ros_facts()
    assert facts.rclpy_path is not None
    # ros-<distro>-rclpy (Jazzy's wheels also install distributions named ros-rclpy and rclpy)
    wheel = next(d for d in metadata.distributions()
                 if re.fullmatch(r"ros-[a-z]+-rclpy", (d.metadata["Name"] or "").lower()))
    assert facts.rclpy_version == wheel.version
    distro = os.environ.get("ROS_DISTRO") or wheel.metadata["Name"].split("-")[1]
    assert facts.ros_distro == distro


def test_an_apt_style_install_is_read_from_its_package_xml(tmp_path: Path) -> None:
    """/opt/ros/humble layout: rclpy under local/lib/.../dist-packages, no pip metadata."""
    prefix = tmp_path / "opt" / "ros" / "humble"
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = prefix / "local" / "lib" / ver / "dist-packages"
    (site / "rclpy").mkdir(parents=True)
    (site / "rclpy" / "__init__.py").write_text("")
    (prefix / "share" / "rclpy").mkdir(parents=True)
    (prefix / "share" / "rclpy" / "package.xml").write_text(
        '<?xml version="1.0"?>\n<package format="3"><name>rclpy</name>'
        "<version>3.3.16</version></package>\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(Path.cwd())]),
           "ROS_DISTRO": "humble", "AMENT_PREFIX_PATH": str(prefix)}
    facts = _facts_in_child(env)
    assert facts["ros_distro"] == "humble" and facts["rclpy_version"] == "3.3.16"
    assert facts["rclpy_source"] == str(prefix / "share" / "rclpy" / "package.xml")


def test_no_rclpy_is_recorded_as_none(tmp_path: Path) -> None:
    # A child that cannot see the venv's packages: only the repository and the standard library.
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-S", "-c", FACTS], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["rclpy_version"] is None and facts["rclpy_path"] is None


def test_localhost_env_sets_both_variables() -> None:
    env = localhost_env({"ROS_DOMAIN_ID": "7"})
    assert env == {"ROS_DOMAIN_ID": "7", **LOCALHOST_ENV}
    assert LOCALHOST_ENV == {"ROS_LOCALHOST_ONLY": "1",
                             "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}
