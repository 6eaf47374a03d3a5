"""What a run's manifest and records say about the machine: host facts, package versions, and
the CPU time the hypervisor took (steal)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import psutil

from robot_latency import __version__


def host_steal_s() -> float | None:
    """CPU time the hypervisor has taken from this machine, all CPUs (s); None: not known.

    Linux's ``steal`` counter (``/proc/stat``, 10 ms ticks); 0 on bare metal such as a Jetson.
    """
    try:
        return getattr(psutil.cpu_times(), "steal", None)
    except (OSError, psutil.Error):
        return None


def package_versions() -> dict[str, str | None]:
    """Return the versions of the packages a run depends on (None: not installed)."""
    from importlib import metadata

    out: dict[str, str | None] = {"robot_latency": __version__}
    for name in ("llama-cpp-python", "onnxruntime-gpu", "onnxruntime", "numpy", "gguf",
                 "rosbags", "matplotlib", "onnx"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_facts() -> dict[str, Any]:
    """Return what the manifest records about the machine."""
    return {
        "hostname": platform.node(),
        "machine": platform.machine(),
        "system": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
    }
