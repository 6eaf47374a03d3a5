"""Launch files and params files name only what the package has.

The ``launch`` / ``launch_ros`` packages cannot be installed here, so the launch files are
parsed, not run: every executable is a console script of setup.py, every parameter they pass is
declared by the node that gets it, every file they reference exists, and every config YAML holds
only declared parameters with values the node accepts. Where the launch source is vendored
(../shared/vendor/ros2_launch), the planner launch file's own function also runs in a real
``LaunchContext``, and launch_ros expands the node's parameters as ``ros2 launch`` would.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from robot_latency.ros.params import PLANNER_NAMES, planner_settings
from robot_latency.ros.replayer_params import REPLAYER_NAMES

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))
CONFIGS = sorted((ROOT / "config").glob("*.yaml"))
NODE_PARAMETERS = {"planner_node": PLANNER_NAMES, "bag_replayer": REPLAYER_NAMES,
                   "managed_planner_node": PLANNER_NAMES}
PLANNER_LAUNCH_ARGUMENTS = {"model", "quant", "engine", "deadline_ms", "period_ms", "mode",
                            "draft_model",
                            "target_device", "params_file", "log_dir", "planner_profile",
                            "managed", "autostart", "on_new_command", "server_url",
                            "server_model", "server_api", "hybrid_policy",
                            "device_profile"}  # the old name of target_device, for one release


def _console_scripts() -> set[str]:
    text = (ROOT / "setup.py").read_text()
    return set(re.findall(r'"([\w-]+)\s*=\s*robot_latency\.[\w.]+:\w+"', text))


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _module_constant(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _declared_arguments(tree: ast.Module) -> set[str]:
    """Return the launch argument names: literal ones, and those of comprehensions over a
    module-level table (``[DeclareLaunchArgument(name, ...) for name in TABLE]``)."""
    names: set[str] = set()
    for call in _calls(tree, "DeclareLaunchArgument"):
        if isinstance(call.args[0], ast.Constant):
            names.add(call.args[0].value)
    for comp in ast.walk(tree):
        if not isinstance(comp, ast.ListComp):
            continue
        if not (isinstance(comp.elt, ast.Call)
                and getattr(comp.elt.func, "id", None) == "DeclareLaunchArgument"):
            continue
        iterated = comp.generators[0].iter
        while isinstance(iterated, (ast.Call, ast.Attribute)):  # TABLE.items()
            iterated = iterated.func if isinstance(iterated, ast.Call) else iterated.value
        names.update(_module_constant(tree, iterated.id))  # type: ignore[attr-defined]
    return names


def test_there_are_two_launch_files() -> None:
    assert {p.name for p in LAUNCH_FILES} == {"planner.launch.py", "replay.launch.py"}


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_names_only_what_exists(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    scripts = _console_scripts()
    assert {"planner_node", "bag_replayer"} <= scripts
    nodes = _calls(tree, "Node") + _calls(tree, "LifecycleNode")
    assert nodes, f"{path.name} starts no node"
    for call in nodes:
        executable = _keyword(call, "executable")
        # A choice (``MANAGED if managed else PLAIN``): both branches must exist.
        choices = ([executable.body, executable.orelse] if isinstance(executable, ast.IfExp)
                   else [executable])
        values = [c.value if isinstance(c, ast.Constant)
                  else _module_constant(tree, getattr(c, "id", "")) for c in choices]
        for value in values:
            assert value in scripts, f"{path.name}: executable {value!r} is no console script"
        value = values[0]
        package = _keyword(call, "package")
        pkg = (package.value if isinstance(package, ast.Constant)
               else _module_constant(tree, getattr(package, "id", "")))
        assert pkg == "robot_latency"
        # Parameters given as dict literals must be declared by that node.
        params = _keyword(call, "parameters")
        for d in ast.walk(params) if params is not None else ():
            if isinstance(d, ast.Dict):
                for key in d.keys:
                    assert isinstance(key, ast.Constant) and key.value in NODE_PARAMETERS[value]
    # Parameters passed by name from a module table: the table's names are the node's.
    planner = _module_constant(tree, "PLANNER_PARAMETERS") or {}
    replayer = _module_constant(tree, "REPLAYER_PARAMETERS") or {}
    assert set(planner) <= PLANNER_NAMES, set(planner) - PLANNER_NAMES
    assert set(replayer) <= REPLAYER_NAMES, set(replayer) - REPLAYER_NAMES
    # Referenced files exist in the package.
    for const in ast.walk(tree):
        if isinstance(const, ast.Constant) and isinstance(const.value, str):
            if re.fullmatch(r"[\w./-]+\.(launch\.py|yaml)", const.value):
                assert ((ROOT / "launch" / const.value).exists()
                        or (ROOT / const.value).exists()), const.value


def test_planner_launch_arguments() -> None:
    tree = ast.parse((ROOT / "launch" / "planner.launch.py").read_text())
    assert _declared_arguments(tree) == PLANNER_LAUNCH_ARGUMENTS
    replay = ast.parse((ROOT / "launch" / "replay.launch.py").read_text())
    passed = set(_module_constant(replay, "PLANNER_ARGUMENTS"))
    assert passed == PLANNER_LAUNCH_ARGUMENTS
    assert {"bag", "topic", "speed"} <= _declared_arguments(replay)


def test_setup_installs_launch_and_config() -> None:
    text = (ROOT / "setup.py").read_text()
    assert 'glob("launch/*.launch.py")' in text and 'glob("config/*.yaml")' in text


def test_three_target_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"orin_agx_64gb.yaml", "orin_nano_8gb.yaml",
                                         "host.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_holds_valid_declared_parameters(path: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert list(data) == ["planner_node"], "layout: planner_node: ros__parameters: ..."
    params = data["planner_node"]["ros__parameters"]
    assert set(params) <= PLANNER_NAMES, set(params) - PLANNER_NAMES
    settings = planner_settings({**params, "log_dir": str(tmp_path)})
    planner = settings.run.settings
    assert planner.deadline_ms < planner.period_ms
    assert settings.values["target_device"] == params["target_device"]


VENDOR = ROOT.parent / "shared" / "vendor" / "ros2_launch"

#: Run planner.launch.py's function in a real LaunchContext with NAME:=VALUE arguments; print the
#: node's parameters as launch_ros expands them (its temporary params file, read back).
_EXPAND = """
import importlib.util, json, sys
import yaml
from launch.launch_context import LaunchContext
spec = importlib.util.spec_from_file_location("planner_launch", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ctx = LaunchContext()
for e in mod.generate_launch_description().entities:
    if type(e).__name__ == "DeclareLaunchArgument":
        ctx.launch_configurations[e.name] = "".join(x.perform(ctx) for x in e.default_value)
for kv in sys.argv[2:]:
    k, v = kv.split(":=", 1)
    ctx.launch_configurations[k] = v
node = mod._planner(ctx)[-1]
node._perform_substitutions(ctx)
layers = []  # in the order the node applies them: a later one wins
for path, is_file in node._Node__expanded_parameter_arguments:
    doc = yaml.safe_load(open(path)) if is_file else {}
    layers += [value["ros__parameters"] for value in doc.values()]
print(json.dumps(layers))
"""


@pytest.mark.parametrize("version", ["humble", "rolling"])
def test_mode_is_a_launch_argument_that_reaches_the_node(version: str) -> None:
    # Event mode needed an edited params file; mode:=event now sets the node's parameter, over
    # the params file's.
    if not (VENDOR / version).is_dir():
        pytest.skip(f"needs launch and launch_ros source in {VENDOR / version} "
                    "(docs/ROS.md, 'Launch files in tests'); not present")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(VENDOR / version), str(ROOT)])}
    params_file = ROOT / "config" / "orin_nano_8gb.yaml"
    assert yaml.safe_load(params_file.read_text())["planner_node"]["ros__parameters"][
        "mode"] == "periodic"

    def expand(*arguments: str) -> dict:
        """The parameters the node gets, each the last layer's that sets it."""
        done = subprocess.run([sys.executable, "-c", _EXPAND,
                               str(ROOT / "launch" / "planner.launch.py"), *arguments],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        layers = json.loads(done.stdout.strip().splitlines()[-1])
        return {k: v for layer in layers for k, v in layer.items()}

    assert expand("mode:=event", f"params_file:={params_file}")["mode"] == "event"
    assert expand(f"params_file:={params_file}")["mode"] == "periodic"  # the file's stands
    assert expand("mode:=event") == {"mode": "event"}  # no file: just what was given
