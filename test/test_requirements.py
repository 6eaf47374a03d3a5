"""requirements/*.txt, setup.py's lower bounds and package.xml's rosdep keys agree.

setup.py's lower bounds are what the compatibility venv tests (requirements/compat.txt); base.txt
pins the main venv; jetson.txt is for CPython 3.10 on aarch64 with numpy < 2; every runtime
dependency with a rosdep key is in package.xml.
"""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQS = ROOT / "requirements"
#: rosdep keys (ros/rosdistro rosdep/python.yaml) of the runtime dependencies that have one.
ROSDEP_KEYS = {"numpy": "python3-numpy", "psutil": "python3-psutil", "pyyaml": "python3-yaml",
               "matplotlib": "python3-matplotlib", "tqdm": "python3-tqdm",
               "rosbags": "python3-rosbags-pip"}
#: Runtime dependencies without a usable rosdep key: pip (requirements/jetson.txt), named in
#: docs/INSTALL.md. (python3-jsonschema and python3-pil exist, but Ubuntu 22.04's are 3.2 and
#: 9.0, older than the tested 4.26 and 12.3.)
NO_ROSDEP_KEY = {"gguf", "onnx", "jsonschema", "mcap", "pillow"}
#: Older in compat.txt than in base.txt: the point of the compatibility venv.
OLDEST = {"numpy", "matplotlib"}


def _pins(path: Path) -> dict[str, str]:
    """name (lower case) -> pinned version of every ``name==version`` line."""
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^;\s]+)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _install_requires() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "INSTALL_REQUIRES" for t in node.targets):
            specs = ast.literal_eval(node.value)
            return {s.split(">=")[0].lower(): s.split(">=")[1] for s in specs}
    raise AssertionError("no INSTALL_REQUIRES in setup.py")


def test_setup_lower_bounds_are_the_tested_oldest_versions() -> None:
    bounds, compat = _install_requires(), _pins(REQS / "compat.txt")
    assert bounds == {name: compat[name] for name in bounds}


def test_compat_matches_base_except_the_oldest_numpy_and_matplotlib() -> None:
    base, compat = _pins(REQS / "base.txt"), _pins(REQS / "compat.txt")
    assert set(base) <= set(compat)
    for name, version in base.items():
        if name in OLDEST:
            assert _version(compat[name]) < _version(version), name
        else:
            assert compat[name] == version, name
    assert _version(compat["numpy"]) < (2,)


def test_jetson_requirements_cover_the_runtime_with_numpy_1() -> None:
    jetson, bounds = _pins(REQS / "jetson.txt"), _install_requires()
    assert set(bounds) <= set(jetson)
    assert all(_version(jetson[n]) >= _version(b) for n, b in bounds.items())
    assert _version(jetson["numpy"]) < (2,)
    # Built for the board (CUDA) or NVIDIA's wheel, never from PyPI here.
    assert "llama-cpp-python" not in jetson and "onnxruntime-gpu" not in jetson


def test_package_xml_names_every_runtime_dependency_that_has_a_rosdep_key() -> None:
    root = ET.parse(ROOT / "package.xml").getroot()
    exec_deps = {e.text for e in root.findall("exec_depend")}
    bounds = _install_requires()
    assert set(bounds) == set(ROSDEP_KEYS) | NO_ROSDEP_KEY
    assert {ROSDEP_KEYS[n] for n in bounds if n in ROSDEP_KEYS} <= exec_deps
    # The Jetson install (moved from the README into docs/INSTALL.md) pip-installs exactly those.
    install = (ROOT / "docs" / "INSTALL.md").read_text()
    section = install[install.index("## On a Jetson"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    assert all(name in section for name in NO_ROSDEP_KEY)
