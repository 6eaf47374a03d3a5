"""Where each telemetry source's files are: found once under a root, then read every cycle.

One ``find_*`` function per source (GPU devfreq node, thermal zones, cooling devices, INA3221
rails, ``soctherm_oc`` counters) globs and lists the sysfs tree once and returns the small files a
cycle then reads; :func:`read_bytes` is that per-cycle read. The package's docstring says where
each value comes from on JetPack 5 and 6.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EMC_ACTIVITY",
    "EMC_RATE",
    "NVPMODEL_CONF",
    "NVPMODEL_STATUS",
    "OFFLINE_C",
    "Cooling",
    "Gpu",
    "OcEvent",
    "Rail",
    "Zone",
    "allowed_gpu_max",
    "find_cooling",
    "find_gpu",
    "find_oc_events",
    "find_rails",
    "find_zones",
    "read_bytes",
    "readable",
]

#: Reads a file's integer content, None where it is gone or garbage (the reader logs it once).
ReadInt = Callable[[str], int | None]

# Devfreq node names end in the GPU's device-tree name: ga10b (Orin, JetPack 5), gpu (JetPack 6),
# gv11b (Xavier), gp10b (TX2). jetson_stats' find_igpu() accepts the same four.
_GPU_NAMES = ("ga10b", "gpu", "gv11b", "gp10b")
_GPU_LOAD_FALLBACKS = (
    "sys/devices/platform/bus@0/17000000.gpu/load",  # JetPack 6
    "sys/devices/17000000.ga10b/load",  # JetPack 5
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/gpu.0/load",  # older Jetsons
)
EMC_RATE = "sys/kernel/debug/bpmp/debug/clk/emc/rate"
EMC_ACTIVITY = (
    "sys/kernel/actmon_avg_activity/mc_all",  # JetPack 5
    "sys/kernel/debug/cactmon/mc_all",  # JetPack 6
)
NVPMODEL_STATUS = "var/lib/nvpmodel/status"
NVPMODEL_CONF = "etc/nvpmodel.conf"
# BPMP reports a sensor that is off (e.g. Orin Nano's CV zones) as -256 C.
OFFLINE_C = -256.0
_INA3221_CHANNELS = (1, 2, 3)  # in4-6 are shunt voltages, in7 their sum
_OC_EVENTS = (1, 2, 3)  # soctherm_oc: under-voltage, average and instantaneous over-current
_INDEX_RE = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class Gpu:
    """The GPU devfreq node's files (paths) and its hardware maximum."""

    cur_freq: str
    max_freq: str
    load: str | None
    hw_max_hz: int | None  # highest of available_frequencies, read once


@dataclass(frozen=True)
class Zone:
    """A thermal zone: its name, temperature file and lowest passive trip point."""

    name: str
    temp: str
    passive_trip_c: float | None  # lowest passive trip, read once


@dataclass(frozen=True)
class Cooling:
    """A cooling device other than a fan: its type, state file and highest state."""

    type: str
    cur_state: str
    max_state: int | None


@dataclass(frozen=True)
class Rail:
    """An INA3221 rail: its label and its voltage and current files."""

    name: str
    millivolts: str
    milliamps: str


@dataclass(frozen=True)
class OcEvent:
    """A ``soctherm_oc`` over-current event counter file."""

    name: str  # "oc1"
    event_cnt: str


def _under(root: Path, relative: str) -> str:
    return os.path.join(root, relative)


def find_gpu(root: Path) -> Gpu | None:
    """Return the GPU's devfreq files under ``root``, or None where there is no such node."""
    devfreq = Path(_under(root, "sys/class/devfreq"))
    for node in _sorted_by_index(devfreq.glob("*")):
        if node.name.rsplit(".", 1)[-1] not in _GPU_NAMES:
            continue
        cur, top = str(node / "cur_freq"), str(node / "max_freq")
        if not (readable(cur) and readable(top)):
            continue
        load: str | None = str(node / "device" / "load")
        if not readable(load):
            load = next((p for p in (_under(root, f) for f in _GPU_LOAD_FALLBACKS)
                         if readable(p)), None)
        hw_max = None
        table = read_bytes(str(node / "available_frequencies"))
        if table is not None:
            freqs = [int(f) for f in table.split() if f.isdigit()]
            hw_max = max(freqs) if freqs else None
        return Gpu(cur_freq=cur, max_freq=top, load=load, hw_max_hz=hw_max)
    return None


def find_zones(root: Path, read_int: ReadInt) -> Iterable[Zone]:
    """Yield the thermal zones under ``root`` with a type and a readable temperature."""
    seen: set[str] = set()
    thermal = Path(_under(root, "sys/class/thermal"))
    for zone in _sorted_by_index(thermal.glob("thermal_zone*")):
        kind = read_bytes(str(zone / "type"))
        temp = str(zone / "temp")
        if kind is None or not kind.strip() or not readable(temp):
            continue
        name = str(kind.strip(), "utf-8", "replace")
        if name in seen:  # two zones of one type: tell them apart by their directory
            name = f"{name}:{zone.name}"
        seen.add(name)
        yield Zone(name=name, temp=temp, passive_trip_c=_passive_trip_c(zone, read_int))


def _passive_trip_c(zone: Path, read_int: ReadInt) -> float | None:
    trips = []
    for trip_type in zone.glob("trip_point_*_type"):
        if (read_bytes(str(trip_type)) or b"").strip() != b"passive":
            continue
        temp_path = str(trip_type)[: -len("_type")] + "_temp"
        milli = read_int(temp_path)
        if milli is not None:
            trips.append(milli / 1000.0)
    return min(trips) if trips else None


def find_cooling(root: Path, read_int: ReadInt) -> Iterable[Cooling]:
    """Yield the cooling devices under ``root`` other than fans."""
    thermal = Path(_under(root, "sys/class/thermal"))
    for device in _sorted_by_index(thermal.glob("cooling_device*")):
        kind = str((read_bytes(str(device / "type")) or b"").strip(), "utf-8", "replace")
        cur = str(device / "cur_state")
        # A fan spinning up is cooling, not throttling.
        if not kind or "fan" in kind.lower() or not readable(cur):
            continue
        yield Cooling(type=kind, cur_state=cur, max_state=read_int(str(device / "max_state")))


def find_rails(root: Path) -> Iterable[Rail]:
    """Yield the INA3221 rails under ``root`` that are connected and readable."""
    drivers = Path(_under(root, "sys/bus/i2c/drivers/ina3221"))
    for hwmon in sorted(drivers.glob("*/hwmon/hwmon*")):
        for n in _INA3221_CHANNELS:
            label = (read_bytes(str(hwmon / f"in{n}_label")) or b"").strip()
            mv, ma = str(hwmon / f"in{n}_input"), str(hwmon / f"curr{n}_input")
            if not label or label == b"NC" or not (readable(mv) and readable(ma)):
                continue
            yield Rail(name=str(label, "utf-8", "replace"), millivolts=mv, milliamps=ma)


def find_oc_events(root: Path) -> Iterable[OcEvent]:
    """Yield the ``soctherm_oc`` event counters under ``root`` whose throttling is enabled."""
    hwmon_class = Path(_under(root, "sys/class/hwmon"))
    for hwmon in _sorted_by_index(hwmon_class.glob("hwmon*")):
        if (read_bytes(str(hwmon / "name")) or b"").strip() != b"soctherm_oc":
            continue
        for n in _OC_EVENTS:
            count = str(hwmon / f"oc{n}_event_cnt")
            enabled = read_bytes(str(hwmon / f"oc{n}_throt_en"))
            if readable(count) and (enabled is None or enabled.strip() == b"1"):
                yield OcEvent(name=f"oc{n}", event_cnt=count)


def read_bytes(path: str) -> bytes | None:
    """Return up to 4 KiB of the file, or None if it cannot be read (os.* is the cheap path)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:  # sysfs answers some reads with EAGAIN/EIO (sensor not wired, BPMP busy)
        return None
    finally:
        os.close(fd)


def readable(path: str) -> bool:
    """Return True where ``path`` is a file this process can read."""
    return os.access(path, os.R_OK) and os.path.isfile(path)


def _sorted_by_index(paths: Iterable[Path]) -> list[Path]:
    """Sort thermal_zone2 before thermal_zone10."""

    def key(p: Path) -> tuple[int, str]:
        match = _INDEX_RE.search(p.name)
        return (int(match.group(1)) if match else -1, p.name)

    return sorted(paths, key=key)


def allowed_gpu_max(mode_cap_hz: int | None, hw_max_hz: int | None) -> int | None:
    """Return the GPU max the power mode allows: its cap, bounded by the hardware maximum."""
    caps = [c for c in (mode_cap_hz, hw_max_hz) if c is not None]
    return min(caps) if caps else None
