"""Start what a launch file in launch/ starts, where ROS 2's ``launch`` is not installed.

No package registry reachable here ships ``launch``, ``launch_ros`` or ``ros2cli`` as wheels, so
the venv that ``make`` builds (rclpy and the messages from pip wheels) cannot ``ros2 launch``.
``robot-latency launch NAME [--params-file F] [name:=value ...]`` starts the same nodes, the
console scripts the launch file names, with the same parameters:

- ``planner``: ``planner_node`` (``managed:=true``: ``managed_planner_node``, configured and
  activated once it is up when ``autostart`` is true, as the launch file's event handlers do);
- ``replay``: that planner and ``bag_replayer``; the replay ending ends the launch.

A launch argument ``name:=value`` becomes the node parameter of the same name (``-p
name:=value``, typed the way rclpy and launch_ros type it, from YAML), an empty one keeps the
params file's value, and ``params_file:=F`` (or ``--params-file F``) is the planner's
``--params-file``. The argument tables are read from the launch files themselves (their
``PLANNER_PARAMETERS``, ``REPLAYER_PARAMETERS`` and ``PLANNER_ARGUMENTS``), so the two cannot
drift apart. Ctrl-C or SIGTERM stops every node with SIGINT, which closes its run (cycles.jsonl
flushed, summary.json written); a node that has not stopped after ``stop_timeout_s`` is killed.
"""

from __future__ import annotations

import ast
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from robot_latency.errors import RobotLatencyError
from robot_latency.lifetime import popen
from robot_latency.rosenv import ros_args

__all__ = ["LAUNCHES", "LaunchError", "NodeProcess", "declared_arguments", "launch_dir",
           "plan_launch", "run_launch"]

_LOG = logging.getLogger(__name__)

#: The launch files this command mirrors, by the name it takes.
LAUNCHES = {"planner": "planner.launch.py", "replay": "replay.launch.py"}
#: Launch arguments that are not node parameters.
_PLANNER_SPECIAL = ("params_file", "managed", "autostart")
#: How often the processes are polled (s).
_POLL_S = 0.1


class LaunchError(RobotLatencyError):
    """A launch that cannot start: an unknown launch or argument, a launch folder not found."""


@dataclass(frozen=True)
class NodeProcess:
    """One process of a launch: its console script (or module) and its ROS arguments."""

    name: str
    argv: tuple[str, ...]
    ends_launch: bool = False
    helper: bool = field(default=False)  # ends by itself (the lifecycle autostart)


def launch_dir() -> Path:
    """Return the folder holding the launch files: the checkout's, else the installed share/.

    Raises:
        LaunchError: neither exists.
    """
    for candidate in (Path(__file__).resolve().parents[1] / "launch",
                      Path(sys.prefix) / "share" / "robot_latency" / "launch"):
        if (candidate / LAUNCHES["planner"]).is_file():
            return candidate
    raise LaunchError("no launch files found (neither launch/ beside the package nor "
                      f"{Path(sys.prefix) / 'share' / 'robot_latency' / 'launch'})")


def _tables(path: Path) -> dict[str, tuple[str, ...]]:
    """Return the launch file's name tables (``*_PARAMETERS`` dicts, ``*_ARGUMENTS`` tuples)."""
    tables: dict[str, tuple[str, ...]] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id.endswith(("PARAMETERS", "ARGUMENTS")):
            items = (node.value.keys if isinstance(node.value, ast.Dict)
                     else getattr(node.value, "elts", []))
            tables[target.id] = tuple(i.value for i in items if isinstance(i, ast.Constant))
    return tables


def declared_arguments(path: Path) -> set[str]:
    """Return every argument the launch file declares (its tables and its literal names)."""
    names = {name for table in _tables(path).values() for name in table}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "DeclareLaunchArgument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
    return names


def _bin(name: str) -> str:
    """Return the console script next to this interpreter (the venv's), else the PATH's."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _is_true(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text not in ("", "true", "false", "1", "0"):
        raise LaunchError(f"{name}:={value!r}: must be true or false")
    return text in ("true", "1")


def plan_launch(name: str, arguments: Mapping[str, str], *, folder: Path | None = None
                ) -> list[NodeProcess]:
    """Return the processes the launch ``name`` starts for ``arguments`` (name -> value).

    Raises:
        LaunchError: an unknown launch, or an argument the launch file does not declare.
    """
    if name.removesuffix(".launch.py") not in LAUNCHES:
        raise LaunchError(f"unknown launch {name!r}; known: {', '.join(LAUNCHES)}")
    name = name.removesuffix(".launch.py")
    folder = folder or launch_dir()
    path = folder / LAUNCHES[name]
    unknown = sorted(set(arguments) - declared_arguments(path))
    if unknown:
        raise LaunchError(f"{path.name} declares no argument {', '.join(unknown)}; it declares "
                          f"{', '.join(sorted(declared_arguments(path)))}")
    params_file = arguments.get("params_file", "")
    if params_file and not Path(params_file).expanduser().is_file():
        raise LaunchError(f"params_file {params_file}: no such file")
    planner_tables = _tables(folder / LAUNCHES["planner"])
    planner_params = {k: v for k, v in arguments.items()
                      if k in planner_tables["PLANNER_PARAMETERS"] and v != ""}
    managed = _is_true("managed", arguments.get("managed", "false"))
    autostart = _is_true("autostart", arguments.get("autostart", "true") or "true")
    executable = "managed_planner_node" if managed else "planner_node"
    processes = [NodeProcess(executable, (_bin(executable),
                                          *ros_args(planner_params, params_file)))]
    if managed and autostart:
        processes.append(NodeProcess("lifecycle_autostart", (
            sys.executable, "-m", "robot_latency.ros.lifecycle_autostart", "/planner_node"),
            helper=True))
    if name == "replay":
        replayer = _tables(path)["REPLAYER_PARAMETERS"]
        params = {k: v for k, v in arguments.items() if k in replayer and v != ""}
        processes.append(NodeProcess("bag_replayer", (_bin("bag_replayer"),
                                                      *ros_args(params)), ends_launch=True))
    return processes


def _die_with_parent() -> None:
    """In the child: ask the kernel for SIGTERM when the launcher dies, however it dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the launcher's own stop still ends its children
        pass


def _stop(running: Sequence[tuple[NodeProcess, subprocess.Popen[bytes]]],
          timeout_s: float) -> None:
    """SIGINT every process still running (a node then closes its run), then kill stragglers."""
    for _spec, proc in running:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    end = time.monotonic() + timeout_s
    for spec, proc in running:
        try:
            proc.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _LOG.warning("%s did not stop within %.0f s of SIGINT: killed", spec.name, timeout_s)
            proc.kill()
            proc.wait()


def run_launch(processes: Sequence[NodeProcess], *, stop_timeout_s: float = 30.0) -> int:
    """Start ``processes`` and wait: until Ctrl-C or SIGTERM, a node that ends the launch, or a
    node that fails. Every process is stopped before this returns.

    Returns:
        0 for a stop asked for or a launch that ended by itself, else the failed node's status.
    """
    stop_asked: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop_asked.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    running: list[tuple[NodeProcess, subprocess.Popen[bytes]]] = []
    status = 0
    try:
        for spec in processes:
            _LOG.info("starting %s: %s", spec.name, " ".join(spec.argv))
            # A session of its own: a terminal's Ctrl-C reaches the launcher only, which
            # passes one SIGINT on (a node given two may not close its run).
            # (lifetime.popen: the child follows this process; _die_with_parent then asks for
            # SIGTERM instead of SIGKILL, so a node still closes its run)
            running.append((spec, popen(list(spec.argv), start_new_session=True,
                                        preexec_fn=_die_with_parent)))
        while not stop_asked:
            ended = [(spec, proc) for spec, proc in running if proc.poll() is not None]
            failed = [(s, p) for s, p in ended if p.returncode != 0]
            if failed:
                spec, proc = failed[0]
                _LOG.error("%s exited with status %d: stopping the launch", spec.name,
                           proc.returncode)
                status = proc.returncode
                break
            if any(spec.ends_launch for spec, _proc in ended):
                break
            if ended and all(spec.helper or proc.poll() is not None for spec, proc in running):
                break  # every node ended by itself
            time.sleep(_POLL_S)
    finally:
        _stop(running, stop_timeout_s)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status
