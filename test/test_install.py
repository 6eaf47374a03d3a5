"""The install colcon runs: ``setup.py install --prefix P --single-version-externally-managed``.

Runs with the setuptools of the interpreter running the tests: the current one in the main venv,
setuptools 59.6 (Ubuntu 22.04's, what colcon uses on a Jetson with JetPack 6) in the
compatibility venv (``make compat``).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "robot_latency"
#: What setup.py reads: the package and the ament files it installs.
SOURCES = ("setup.py", "package.xml", "resource", "launch", "config", PACKAGE)
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def _shipped_data() -> list[Path]:
    """Every file under robot_latency/data in the source tree, relative to the package."""
    pkg = ROOT / PACKAGE
    return sorted(p.relative_to(pkg) for p in (pkg / "data").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def test_prefix_install_puts_streams_launch_config_and_executables_in_place(
        tmp_path: Path) -> None:
    # The version for the messages, without importing setuptools into this process (its
    # distutils shim fails once another test module has imported the stdlib distutils).
    setuptools_version = importlib.metadata.version("setuptools")

    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=SKIP)
        else:
            shutil.copy2(ROOT / name, src / name)
    prefix, record = tmp_path / "install", tmp_path / "install.log"
    done = subprocess.run(
        # As colcon runs it: the egg-base relative (setuptools 59.6 refuses absolute paths).
        [sys.executable, "setup.py", "egg_info", "--egg-base", "..",
         "build", "--build-base", str(tmp_path / "build"),
         "install", "--prefix", str(prefix), "--record", str(record),
         "--single-version-externally-managed"],
        cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"setuptools {setuptools_version}:\n{done.stderr}"
    site = Path(sysconfig.get_path("purelib", vars={"base": str(prefix),
                                                    "platbase": str(prefix)}))
    assert (site / PACKAGE / "cli" / "__init__.py").is_file(), f"no package under {site}"
    shipped = _shipped_data()
    assert any(p.suffix == ".mcap" for p in shipped) and any(p.suffix == ".gguf" for p in shipped)
    missing = [str(p) for p in shipped if not (site / PACKAGE / p).is_file()]
    assert not missing, f"setuptools {setuptools_version} did not install {missing}"
    share = prefix / "share" / PACKAGE
    for pattern, where in (("launch/*.launch.py", "launch"), ("config/*.yaml", "config")):
        names = sorted(p.name for p in ROOT.glob(pattern))
        assert names and sorted(p.name for p in (share / where).iterdir()) == names
    assert (share / "package.xml").is_file()
    assert (prefix / "share/ament_index/resource_index/packages" / PACKAGE).is_file()
    # `ros2 run robot_latency <exe>` looks in <prefix>/lib/<package>.
    for exe in ("robot-latency", "planner_node", "bag_replayer"):
        path = prefix / "lib" / PACKAGE / exe
        assert path.is_file() and os.access(path, os.X_OK), path
    assert not (prefix / "bin").exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    version = subprocess.run([str(prefix / "lib" / PACKAGE / "robot-latency"), "--version"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("robot-latency ")
