"""``robot-latency launch``: the launch files' nodes without ROS 2's launch, stopped cleanly.

The arguments it takes are the ones each launch file declares (checked against the launch file
run by the vendored ``launch`` where ../shared/vendor/ros2_launch is present); the nodes it starts
are real (rclpy over Fast DDS on loopback), and a SIGTERM, or the replay's end, closes the
planner's run with nothing left running.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from robot_latency.launcher import LaunchError, declared_arguments, launch_dir, plan_launch
from robot_latency.lifetime import follow_parent, popen
from robot_latency.records import read_records
from robot_latency.rosenv import LOCALHOST_ENV
from robot_latency.streams import Command, write_bag

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT.parent / "shared" / "vendor" / "ros2_launch" / "rolling"
# Domains 1-100 are test_planner_node's and 1-200 the demo's: stay clear of both.
DOMAIN_ID = random.randint(201, 232)
CLI = [sys.executable, "-m", "robot_latency.cli"]


def _env() -> dict[str, str]:
    return {**os.environ, **LOCALHOST_ENV, "ROS_DOMAIN_ID": str(DOMAIN_ID),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("name", ["planner.launch.py", "replay.launch.py"])
def test_declared_arguments_are_the_launch_files_own(name: str) -> None:
    if not VENDOR.is_dir():
        pytest.skip(f"needs launch's source in {VENDOR} (docs/ROS.md, 'Launch files in tests')")
    probe = ("import runpy, sys\nfrom launch.actions import DeclareLaunchArgument\n"
             "ld = runpy.run_path(sys.argv[1])['generate_launch_description']()\n"
             "print(' '.join(sorted(e.name for e in ld.entities "
             "if isinstance(e, DeclareLaunchArgument))))\n")
    done = subprocess.run([sys.executable, "-c", probe, str(ROOT / "launch" / name)],
                          env={**os.environ, "PYTHONPATH": str(VENDOR)}, capture_output=True,
                          text=True, timeout=120, check=True)
    assert set(done.stdout.split()) == declared_arguments(ROOT / "launch" / name)


def test_planner_arguments_become_the_nodes_parameters() -> None:
    assert launch_dir() == ROOT / "launch"
    [node] = plan_launch("planner", {"engine": "sim", "deadline_ms": "150", "model": "",
                                     "params_file": "config/host.yaml"})
    assert node.name == "planner_node" and Path(node.argv[0]).name == "planner_node"
    assert list(node.argv[1:]) == ["--ros-args", "--params-file", "config/host.yaml",
                                   "-p", "engine:=sim", "-p", "deadline_ms:=150"]
    managed = plan_launch("planner.launch.py", {"managed": "true"})
    assert [p.name for p in managed] == ["managed_planner_node", "lifecycle_autostart"]
    assert managed[1].helper
    assert [p.name for p in plan_launch("planner", {"managed": "true", "autostart": "false"})] \
        == ["managed_planner_node"]


def test_replay_starts_the_planner_and_the_replayer_which_ends_it() -> None:
    planner, replayer = plan_launch("replay", {"bag": "b", "speed": "3.0", "engine": "sim",
                                               "topic": ""})
    assert planner.name == "planner_node" and "engine:=sim" in planner.argv
    assert "bag:=b" not in planner.argv
    assert replayer.ends_launch and list(replayer.argv[1:]) == [
        "--ros-args", "-p", "bag:=b", "-p", "speed:=3.0"]


@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("nope", {}, "unknown launch 'nope'"),
    ("planner", {"bag": "b"}, "declares no argument bag"),
    ("planner", {"managed": "maybe"}, "managed:='maybe': must be true or false"),
    ("replay", {"params_file": "/nonexistent.yaml"}, "params_file /nonexistent.yaml: no such"),
])
def test_bad_launches_are_one_line_errors(name: str, arguments: dict[str, str],
                                          message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        plan_launch(name, arguments)


def test_the_command_names_a_bad_argument() -> None:
    done = subprocess.run([*CLI, "launch", "planner", "speeed:=1"], env=_env(),
                          capture_output=True, text=True, timeout=60, preexec_fn=follow_parent())
    assert done.returncode == 2
    assert "planner.launch.py declares no argument speeed" in done.stderr
    assert "Traceback" not in done.stderr


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:  # type: ignore[type-arg]
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the launch ended early (status {proc.returncode})"
        assert time.monotonic() < end, f"no {path} in {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.parametrize("managed", ["false", "true"])
def test_sigterm_stops_every_node_and_closes_the_run(managed: str, tmp_path: Path) -> None:
    # managed:=true: the run opens only once the node was configured and activated (autostart)
    run_dir = tmp_path / "run"
    launcher = popen([*CLI, "launch", "planner", f"managed:={managed}", "engine:=sim",
                                 "mode:=event", f"log_dir:={run_dir}"], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(run_dir / "manifest.json", launcher)
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert children, "the launcher started no process"
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode == 0, output[-3000:]
    assert not [c.pid for c in children if c.is_running() and c.status() != "zombie"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["cycles"] == len(read_records(run_dir / "cycles.jsonl"))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"


def test_the_replay_launch_ends_when_the_replay_does(tmp_path: Path) -> None:
    texts = ["go to the kitchen", "stop", "pick up the red cup"]
    bag = write_bag(tmp_path / "bag", [Command(i * 1_000_000_000, t, f"c{i}")
                                       for i, t in enumerate(texts)])
    run_dir = tmp_path / "run"
    done = subprocess.run([*CLI, "launch", "replay", f"bag:={bag}", "speed:=1.0", "engine:=sim",
                           "mode:=event", f"log_dir:={run_dir}"], env=_env(),
                          capture_output=True, text=True, timeout=300, preexec_fn=follow_parent())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The run is closed whole. (Commands are not counted: the launch file, like this command,
    # starts the replayer at once, and a command that reaches the planner before its run is
    # open is dropped with a warning, in ros2 launch too.)
    records = read_records(run_dir / "cycles.jsonl")
    assert json.loads((run_dir / "summary.json").read_text())["cycles"] == len(records)
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "finished"


def test_a_killed_launcher_takes_its_nodes_with_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launcher = popen([*CLI, "launch", "planner", "engine:=sim", f"log_dir:={run_dir}"],
                                env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(run_dir / "manifest.json", launcher)
        children = psutil.Process(launcher.pid).children(recursive=True)
        launcher.kill()  # no handler runs: the kernel's parent-death signal ends the nodes
        launcher.wait()
        _gone, alive = psutil.wait_procs(children, timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert not alive, f"still running after the launcher was killed: {alive}"
    assert (run_dir / "summary.json").exists()  # SIGTERM: the node closed its run
