"""planner.launch.py with managed:=true in a real LaunchService: configured, activated, closed.

Needs the launch / launch_ros source in ../shared/vendor/ros2_launch (no registry ships them);
the package is installed into a prefix the way colcon does, and the launch file run from there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from robot_latency.lifetime import popen
from robot_latency.rosenv import ros_facts

ROOT = Path(__file__).resolve().parents[2]
VENDORS = ROOT.parent / "shared" / "vendor" / "ros2_launch"
#: Jazzy's launch source with Jazzy's rclpy wheels (`make jazzy`); else Humble's and rolling's.
DISTROS = ("jazzy",) if ros_facts().ros_distro == "jazzy" else ("humble", "rolling")


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not all((VENDORS / distro / "launch").is_dir() for distro in DISTROS):
        pytest.skip(f"needs the launch/launch_ros source in {VENDORS} (outside the repository; "
                    "docs/ROS.md, 'Launch files in tests')")
    tmp = tmp_path_factory.mktemp("prefix")
    subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(tmp / "build"),
                    "install", "--prefix", str(tmp / "p"), "--single-version-externally-managed",
                    "--record", str(tmp / "record.txt")], cwd=ROOT, check=True,
                   capture_output=True)
    return tmp / "p"


@pytest.mark.parametrize("distro", DISTROS)
def test_managed_launch_configures_activates_and_closes_the_run(prefix: Path, tmp_path: Path,
                                                                distro: str) -> None:
    vendor = VENDORS / distro
    run = tmp_path / "run"
    code = f"""
import sys
sys.path.insert(0, {str(vendor)!r})  # launch, launch_ros, composition_interfaces
from launch import LaunchDescription, LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
ld = LaunchDescription([IncludeLaunchDescription(PythonLaunchDescriptionSource(
    {str(prefix / "share" / "robot_latency" / "launch" / "planner.launch.py")!r}),
    launch_arguments={{"managed": "true", "engine": "sim", "target_device": "orin-agx-64gb",
                      "period_ms": "100", "deadline_ms": "80",
                      "log_dir": {str(run)!r}}}.items())])
ls = LaunchService()
ls.include_launch_description(ld)
sys.exit(ls.run())
"""
    env = {**os.environ, "AMENT_PREFIX_PATH": str(prefix),
           "ROS_DOMAIN_ID": str(random.randint(231, 232)), "PYTHONUNBUFFERED": "1",
           "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_LOCALHOST_ONLY": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # SIGINT at its default in the launch, whatever this process inherited: a background job of a
    # non-interactive shell ignores SIGINT, and an ignored SIGINT would reach the launch ignored.
    proc = popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, start_new_session=True,
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        # Activated by the launch's autostart: the run directory fills with cycles.
        end = time.monotonic() + 120
        while not ((run / "cycles.jsonl").exists()
                   and len((run / "cycles.jsonl").read_text().splitlines()) >= 3):
            assert proc.poll() is None, b"".join(out).decode(errors="replace")
            assert time.monotonic() < end, b"".join(out).decode(errors="replace")
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)  # the launch shuts down; the node closes its run
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # The launch has exited, but its last lines may still be in the pipe: the log is
        # whole once the reader has read to its end (the pipe closes when the launch and the
        # node it started have both exited), not when the launch's exit was seen.
        reader.join(timeout=60)
    assert not reader.is_alive(), "the launch's output never ended (a process kept the pipe)"
    log = b"".join(out).decode(errors="replace")
    assert "configured: engine sim" in log and "active: run 1" in log, log
    assert (run / "summary.json").is_file(), log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["cycles"] == len((run / "cycles.jsonl").read_text().splitlines())
