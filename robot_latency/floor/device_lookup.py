"""Resolving the device ids that are not rows of the table: "host" (probed) and "auto" (detected).

The table (:mod:`robot_latency.floor.devices`) is read by the host probe and the Jetson detector,
so it cannot import them; this module imports all three and registers the two resolvers with
:func:`robot_latency.floor.devices.register_resolver`. The floor package imports this module, so
``get_device("host")`` and ``get_device("auto")`` work wherever ``get_device`` is imported from.
"""

from __future__ import annotations

import logging
from pathlib import Path

from robot_latency.floor.devices import (
    AUTO_ID,
    DEVICES,
    HOST_ID,
    DeviceSheet,
    register_resolver,
)
from robot_latency.floor.jetson import detect_jetson
from robot_latency.floor.probe import load_or_probe_host

__all__ = ["resolve_auto", "resolve_host"]

logger = logging.getLogger(__name__)


def resolve_host(cache_path: Path | None, sysfs_root: Path = Path("/")) -> DeviceSheet:
    """Return this machine's probed datasheet (cached at ``cache_path``; ``sysfs_root`` unused)."""
    return load_or_probe_host(cache_path)


def resolve_auto(cache_path: Path | None, sysfs_root: Path = Path("/")) -> DeviceSheet:
    """Return the detected Jetson's datasheet (power mode considered), else the host probe."""
    info = detect_jetson(sysfs_root)
    if info is not None and info.device_id is not None:
        logger.info(
            "detected %s (module %s, power mode %s): using datasheet %s",
            info.model_string,
            info.module,
            info.power_mode,
            info.device_id,
        )
        return DEVICES[info.device_id]
    if info is not None:
        logger.warning(
            "Jetson %r has no built-in datasheet; probing it as a host", info.model_string
        )
    return load_or_probe_host(cache_path)


register_resolver(HOST_ID, resolve_host)
register_resolver(AUTO_ID, resolve_auto)
