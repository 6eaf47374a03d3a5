"""The ament_python package shape: package.xml, setup.py data files, entry points, lint."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_package_xml_format_3_with_runtime_depends() -> None:
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.tag == "package" and root.get("format") == "3"
    assert root.findtext("name") == "robot_latency"
    exec_deps = {e.text for e in root.findall("exec_depend")}
    assert {"rclpy", "std_msgs", "diagnostic_msgs", "launch", "launch_ros",
            "ros2launch"} <= exec_deps
    assert "python3-pytest" in {e.text for e in root.findall("test_depend")}
    assert root.find("export/build_type").text == "ament_python"


def test_versions_agree() -> None:
    from robot_latency import __version__

    xml_version = ET.parse(ROOT / "package.xml").getroot().findtext("version")
    setup_src = (ROOT / "setup.py").read_text()
    assert xml_version == __version__
    assert f'version="{__version__}"' in setup_src


def test_setup_installs_ament_files_and_console_scripts() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    src = (ROOT / "setup.py").read_text()
    assert (ROOT / "resource" / "robot_latency").is_file()
    for needle in ("resource/{PACKAGE}", "package.xml", "launch/*.launch.py", "config/*.yaml",
                   "share/ament_index/resource_index/packages"):
        assert needle in src
    scripts = {
        node.value.split("=")[0].strip(): node.value.split("=")[1].strip()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " = " in node.value
        and ":" in node.value
    }
    assert set(scripts) == {"robot-latency", "planner_node", "bag_replayer",
                            "managed_planner_node"}
    for target in scripts.values():
        module, func = target.split(":")
        mod = __import__(module, fromlist=[func])
        assert callable(getattr(mod, func)), target


def test_core_imports_without_ros() -> None:
    """Core modules must not import rclpy (only robot_latency.ros may)."""
    code = ("import sys, robot_latency.cli, robot_latency.records, robot_latency.stats;"
            "assert 'rclpy' not in sys.modules, 'core imported rclpy'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff is not None, "ruff is not installed (requirements/test.txt pins it)"
    targets = [p for p in ("robot_latency", "test", "bench", "tools", "launch", "setup.py")
               if (ROOT / p).exists()]
    proc = subprocess.run([ruff, "check", *targets], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
