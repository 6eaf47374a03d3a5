"""What ROS 2 install this process would use, found without importing rclpy (core stays ROS-free).

Works for every way rclpy arrives: Humble from apt on a Jetson (``/opt/ros/humble``, no pip
metadata: the version is in ``share/rclpy/package.xml``), a colcon workspace, or the pip wheels of
a distro (``ros-kilted-rclpy``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Distros whose pip-wheel rclpy distributions are looked up by name (newest first).
ROS_DISTROS = ("rolling", "kilted", "jazzy", "iron", "humble")

#: Keep DDS discovery on this machine. Humble's rcl reads ROS_LOCALHOST_ONLY; Iron and later read
#: ROS_AUTOMATIC_DISCOVERY_RANGE (and warn, but still honour, the old variable until it goes).
LOCALHOST_ENV = {"ROS_LOCALHOST_ONLY": "1", "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}


@dataclass(frozen=True)
class RosFacts:
    """The ROS 2 install this process would use.

    Attributes:
        ros_distro: ``$ROS_DISTRO`` (set by a sourced setup file), else the distro of the pip
            wheel that provides rclpy, else None.
        rclpy_version: rclpy's version, or None where rclpy is not installed.
        rclpy_source: where the version came from: ``pip:<distribution>`` or the package.xml path.
        rclpy_path: the directory rclpy would be imported from, or None.
    """

    ros_distro: str | None
    rclpy_version: str | None
    rclpy_source: str | None
    rclpy_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _package_xml_version(path: Path) -> str | None:
    try:
        return ET.parse(path).getroot().findtext("version")
    except (OSError, ET.ParseError) as err:
        log.debug("could not read %s: %s", path, err)
        return None


def _adjacent_package_xml(rclpy_dir: Path | None) -> Path | None:
    """rclpy's ament package.xml in the prefix it is imported from, if it has one.

    ``<prefix>/lib/pythonX.Y/{site,dist}-packages/rclpy`` or, on Debian layouts (apt's
    ``/opt/ros/humble``), ``<prefix>/local/lib/pythonX.Y/dist-packages/rclpy``.
    """
    if rclpy_dir is None:
        return None
    for up in (3, 4):
        if len(rclpy_dir.parents) > up:
            candidate = rclpy_dir.parents[up] / "share" / "rclpy" / "package.xml"
            if candidate.is_file():
                return candidate
    return None


def _ament_package_xml() -> Path | None:
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        candidate = Path(prefix) / "share" / "rclpy" / "package.xml" if prefix else None
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def ros_facts() -> RosFacts:
    """Return the ROS distro and the rclpy version, from whichever install provides rclpy.

    In order: the pip wheel distribution of a distro (``ros-<distro>-rclpy``) that installed the
    imported rclpy, the ament package.xml of the prefix rclpy is imported from (apt, colcon), a
    package.xml on AMENT_PREFIX_PATH, a distribution named ``rclpy``.
    """
    distro = os.environ.get("ROS_DISTRO") or None
    try:
        spec = importlib.util.find_spec("rclpy")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return RosFacts(distro, None, None, None)
    rclpy_dir: Path | None = None
    if spec.origin:
        rclpy_dir = Path(spec.origin).parent
    elif spec.submodule_search_locations:
        rclpy_dir = Path(next(iter(spec.submodule_search_locations)))
    where = str(rclpy_dir) if rclpy_dir is not None else None
    wheel = _pip_rclpy(distro, rclpy_dir)
    if distro is None and wheel is not None:
        distro = wheel[0].split("-")[1]  # ros-<distro>-rclpy
    # A pip wheel's own version first: Jazzy's ros-jazzy-rclpy 7.1.6 ships rclpy's package.xml
    # of 7.1.5 (the wheel was rebuilt), and the wheel is what requirements/ pin.
    if wheel is not None:
        return RosFacts(distro, wheel[1], f"pip:{wheel[0]}", where)
    xml = _adjacent_package_xml(rclpy_dir)
    if xml is not None:
        return RosFacts(distro, _package_xml_version(xml), str(xml), where)
    xml = _ament_package_xml()
    if xml is not None:
        return RosFacts(distro, _package_xml_version(xml), str(xml), where)
    try:
        return RosFacts(distro, metadata.version("rclpy"), "pip:rclpy", where)
    except metadata.PackageNotFoundError:
        return RosFacts(distro, None, None, where)


def _pip_rclpy(distro: str | None, rclpy_dir: Path | None) -> tuple[str, str] | None:
    """(name, version) of the ``ros-<distro>-rclpy`` wheel that installed the imported rclpy."""
    names = ([f"ros-{distro}-rclpy"] if distro else []) + [f"ros-{d}-rclpy" for d in ROS_DISTROS]
    for name in dict.fromkeys(names):  # keep order, no repeats
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        located = Path(str(dist.locate_file("rclpy")))
        if rclpy_dir is None or located.resolve() == rclpy_dir.resolve():
            return name, dist.version
    return None


def ros_args(params: Mapping[str, object], params_file: str = "") -> list[str]:
    """Return a node's ``--ros-args`` for parameter values (``-p name:=value``; booleans as
    ``true``/``false``), after ``--params-file`` when one is given."""
    args = ["--ros-args"]
    if params_file:
        args += ["--params-file", params_file]
    for key, value in params.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        args += ["-p", f"{key}:={text}"]
    return args


def localhost_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Return ``base`` (default: this process's environment) with discovery kept on loopback."""
    return {**(os.environ if base is None else base), **LOCALHOST_ENV}
