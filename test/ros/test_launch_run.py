"""The launch files run for real: colcon builds the package into a scratch workspace, and a
``LaunchService`` (what ``ros2 launch`` runs) of Humble's and of rolling's ``launch`` and
``launch_ros`` (Jazzy's, with Jazzy's rclpy wheels) starts planner.launch.py and replay.launch.py
from its install space.

``launch`` and ``launch_ros`` are not on any package registry reachable here; their pure-Python
source is in ../shared/vendor/ros2_launch (see its README, and docs/ROS.md, "Launch files in
tests"). Without that folder these tests skip and say so.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from robot_latency.lifetime import follow_parent
from robot_latency.records import read_records
from robot_latency.rosenv import LOCALHOST_ENV, ros_facts
from robot_latency.streams import Command, write_bag

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT.parent / "shared" / "vendor" / "ros2_launch"
#: The launch sources run against this rclpy: Jazzy's with Jazzy's wheels (`make jazzy`); with
#: Kilted's, Humble's (a Jetson's) and rolling's (the Kilted-era API).
VERSIONS = ("jazzy",) if ros_facts().ros_distro == "jazzy" else ("humble", "rolling")
DRIVER = Path(__file__).with_name("launch_driver.py")
#: What colcon needs of the source tree (the package and the ament files it installs, and the
#: interface package beside it).
SOURCES = ("setup.py", "package.xml", "resource", "launch", "config", "robot_latency",
           "robot_latency_interfaces")
# Domains 1-100 are test_planner_node's and 1-200 the demo's: stay clear of both.
DOMAIN_ID = random.randint(201, 232)
SIM = ["engine:=sim", "target_device:=orin-agx-64gb", "period_ms:=100.0", "deadline_ms:=80.0"]

if not VENDOR.is_dir():
    pytest.skip(f"needs launch and launch_ros source in {VENDOR} (../shared/vendor/ros2_launch, "
                "see docs/ROS.md, 'Launch files in tests'); not present", allow_module_level=True)


@pytest.fixture(scope="module")
def install_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """colcon build both packages into a scratch workspace, as the README says (the interface
    package lies inside the Python package's folder, where colcon's crawl does not look: it is
    named as a second base path); return the environment of its setup.bash."""
    ws = tmp_path_factory.mktemp("ws")
    src = ws / "src" / "robot_latency"
    src.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, src / name)
    colcon = Path(sys.executable).with_name("colcon")
    assert colcon.is_file(), f"no colcon next to {sys.executable} (requirements/test.txt)"
    env = {**os.environ, "PATH": f"{colcon.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)  # build what is in the workspace, not this checkout
    # ROS 2's pip wheels lie in the venv's prefix (REFERENCE: AMENT_PREFIX_PATH=$VIRTUAL_ENV)
    prefix = str(Path(sys.executable).parent.parent)
    for var in ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH"):
        env[var] = os.pathsep.join(p for p in (env.get(var), prefix) if p)
    built = subprocess.run([str(colcon), "--log-base", str(ws / "log"), "build",
                            "--base-paths", str(src), str(src / "robot_latency_interfaces"),
                            "--build-base", str(ws / "build"),
                            "--install-base", str(ws / "install"),
                            "--cmake-args", "-DBUILD_TESTING=OFF"],
                           cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (ws / "install" / "robot_latency_interfaces" / "share" / "robot_latency_interfaces"
            / "package.xml").is_file(), built.stdout
    lib = ws / "install" / "robot_latency" / "lib" / "robot_latency"
    assert {"planner_node", "bag_replayer", "robot-latency"} <= {p.name for p in lib.iterdir()}
    dump = subprocess.run(["bash", "-c", f"source {ws / 'install' / 'setup.bash'} && env -0"],
                          env=env, capture_output=True, timeout=120, check=True)
    out = dict(line.split("=", 1) for line in dump.stdout.decode().split("\0") if "=" in line)
    assert str(ws / "install" / "robot_latency") in out["AMENT_PREFIX_PATH"].split(os.pathsep)
    return {**out, **LOCALHOST_ENV, "ROS_DOMAIN_ID": str(DOMAIN_ID), "PYTHONUNBUFFERED": "1",
            "_WS": str(ws)}


def _launch(env: dict[str, str], version: str, launch_file: str, want_plans: int,
            arguments: list[str], timeout_s: float = 120.0) -> tuple[dict, str]:
    share = Path(env["_WS"]) / "install" / "robot_latency" / "share" / "robot_latency"
    run_env = {**env, "PYTHONPATH": os.pathsep.join(
        [str(VENDOR / version), env.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(DRIVER), str(share / "launch" / launch_file),
                           str(want_plans), str(timeout_s), *arguments],
                          env=run_env, capture_output=True, text=True, timeout=timeout_s + 120,
                          preexec_fn=follow_parent())
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert str(VENDOR / version) in result["launch_version"], result["launch_version"]
    return result, log


def _check_run(log_dir: Path, log: str) -> dict:
    assert "process has died" not in log, log  # every process ended by itself or on SIGINT, 0
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["cycles"] == len(read_records(log_dir / "cycles.jsonl")) > 0
    assert json.loads((log_dir / "manifest.json").read_text())["status"] == "finished"
    return summary


@pytest.mark.parametrize("version", VERSIONS)
def test_planner_launch_plans_and_shuts_down_cleanly(install_env: dict[str, str], version: str,
                                                     tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    result, log = _launch(install_env, version, "planner.launch.py", 3,
                          [*SIM, f"log_dir:={log_dir}"])
    assert result["stopped_by"] == "plans", log
    assert len(result["plans"]) >= 3
    assert all(p["source"] in ("model", "fallback") for p in result["plans"])
    _check_run(log_dir, log)


@pytest.mark.parametrize("version", VERSIONS)
def test_replay_launch_plans_the_bag_and_ends_by_itself(install_env: dict[str, str],
                                                        version: str, tmp_path: Path) -> None:
    texts = ["go to the kitchen", "stop", "go to the door"]
    # 1.5 s apart: the probe's plan subscription is matched by DDS discovery on its own; on a
    # loaded machine that can take longer than a short replay (periodic mode re-plans the
    # newest command every tick, so the probe hears plans as soon as it is matched).
    bag = write_bag(tmp_path / "bag", [Command(i * 1_500_000_000, t, f"s:{i}")
                                       for i, t in enumerate(texts)])
    log_dir = tmp_path / "run"
    params = (Path(install_env["_WS"]) / "install" / "robot_latency" / "share" / "robot_latency"
              / "config" / "host.yaml")
    result, log = _launch(install_env, version, "replay.launch.py", 0,
                          [*SIM, f"bag:={bag}", f"log_dir:={log_dir}", f"params_file:={params}",
                           "min_subscribers:=2"])  # the planner and this probe
    assert result["stopped_by"] == "launch", log  # the replay's end shut the launch down
    assert "3 commands sent, 0 failed" in log
    summary = _check_run(log_dir, log)
    planned = {r.command_id for r in read_records(log_dir / "cycles.jsonl")
               if r.command_id and not r.skipped}
    assert planned and summary["cycles"] >= 1
    assert any(p["command_id"] in planned for p in result["plans"])
