"""The device table for the bandwidth floor: built-in datasheets and the id lookup.

A datasheet carries the two numbers the floor model needs (memory read bandwidth and dense FP16
peak) plus enough provenance to re-check them. Built-in figures are those of docs/REFERENCE.md,
"Jetson modules and comparison devices". ``get_device`` also resolves "host" (the probe in
:mod:`robot_latency.floor.probe`) and "auto" (detection in :mod:`robot_latency.floor.jetson`)
through the resolvers :mod:`robot_latency.floor.device_lookup` registers: the probe and the
detector read this table, so the table imports neither of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from robot_latency.floor.errors import UnknownDeviceError
from robot_latency.floor.power_modes import MODES, PowerMode, cap_fields, sheet_fields

__all__ = [
    "AUTO_ID",
    "DEVICES",
    "HOST_ID",
    "DeviceResolver",
    "DeviceSheet",
    "get_device",
    "list_devices",
    "power_modes_of",
    "register_resolver",
]

HOST_ID = "host"
AUTO_ID = "auto"

@dataclass(frozen=True)
class DeviceSheet:
    """One device as the floor model sees it: bandwidth, memory, compute and provenance."""

    id: str
    name: str
    bandwidth_gbps: float
    memory_bytes: int
    fp16_tflops: float | None
    flops_derived: bool
    cpu_cores: int | None
    power_mode: str | None
    source: str
    notes: str = ""
    family: str = ""
    #: True where ``fp16_tflops`` is a peak the hardware cannot exceed (a datasheet figure, or
    #: one derived from cores and clocks): only then does a prefill get a *floor* from it. The
    #: host's figure is a measured sustained rate, which real kernels can beat.
    flops_is_peak: bool = True
    #: The module this sheet is a power mode of (its base datasheet id; "" where no mode table
    #: covers it) and the mode's caps (robot_latency.floor.power_modes; None: not known).
    module: str = ""
    nvpmodel_id: int | None = None
    emc_max_mhz: float | None = None
    gpu_max_mhz: float | None = None
    gpu_tpcs: int | None = None
    cpu_max_mhz: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0):
            raise ValueError(
                f"{self.id}: bandwidth_gbps must be positive, got {self.bandwidth_gbps}"
            )
        if self.memory_bytes <= 0:
            raise ValueError(f"{self.id}: memory_bytes must be positive, got {self.memory_bytes}")
        if self.fp16_tflops is not None and not (
            math.isfinite(self.fp16_tflops) and self.fp16_tflops > 0
        ):
            raise ValueError(f"{self.id}: fp16_tflops must be positive, got {self.fp16_tflops}")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Return the memory read bandwidth in bytes per second."""
        return self.bandwidth_gbps * 1e9

    @property
    def peak_flops(self) -> float | None:
        """Return the dense FP16 peak in FLOP/s, or None where it is unknown."""
        return None if self.fp16_tflops is None else self.fp16_tflops * 1e12

    def to_dict(self) -> dict[str, Any]:
        """Return the datasheet as a JSON-ready dict."""
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Built-in datasheets (docs/REFERENCE.md, Jetson modules)
# --------------------------------------------------------------------------------------------

_GB = 1_000_000_000  # datasheets quote memory in GB = 1e9 bytes

_AGX_DS = "NVIDIA Jetson AGX Orin Series datasheet DS-10662"
_NX_DS = "NVIDIA Jetson Orin NX Series datasheet DS-10712"
_NANO_DS = "NVIDIA Jetson Orin Nano Series datasheet DS-11105"
_SUPER = "Super figures: JetPack 6.2 MAXN_SUPER mode, Jetson Linux power docs"
_DERIVED = (
    "FP16 TFLOPS derived here as tensor cores x GPU clock x 512 FLOP (dense), "
    "not printed by NVIDIA (docs/REFERENCE.md, Jetson modules)"
)
# A capped mode's compute is derived from its nvpmodel block: TPCs left on by TPC_PG_MASK (a set
# bit gates a TPC; an Orin TPC is 2 SMs = 8 tensor cores) at the mode's GPU MAX_FREQ.
_CAPPED = "FP16 TFLOPS derived here from the mode's nvpmodel block: "


_PROFILES: tuple[DeviceSheet, ...] = (
    DeviceSheet(
        id="orin-agx-64gb",
        name="Jetson AGX Orin 64GB (MAXN)",
        bandwidth_gbps=204.8,
        memory_bytes=64 * _GB,
        fp16_tflops=42.5,
        flops_derived=True,
        cpu_cores=12,
        power_mode="MAXN",
        source=f"{_AGX_DS}; {_DERIVED}",
        notes="256-bit LPDDR5; 12 Cortex-A78AE cores",
        family="orin-agx",
    ),
    DeviceSheet(
        id="orin-agx-64gb-15w",
        name="Jetson AGX Orin 64GB (15W)",
        bandwidth_gbps=136.5,
        memory_bytes=64 * _GB,
        fp16_tflops=5.0,
        flops_derived=True,
        cpu_cores=4,
        power_mode="15W",
        source=(
            f"{_AGX_DS}; nvpmodel MODE_15W caps EMC at 2133 MHz: 204.8 x 2133/3200 = 136.5 GB/s "
            f"(docs/REFERENCE.md, Jetson modules); {_CAPPED}3 of 8 TPCs (TPC_PG_MASK 248) = "
            "24 tensor cores x 0.408 GHz x 512 = 5.0"
        ),
        notes="MODE_15W also takes 8 of the 12 CPU cores offline",
        family="orin-agx",
    ),
    DeviceSheet(
        id="orin-agx-32gb",
        name="Jetson AGX Orin 32GB (MAXN)",
        bandwidth_gbps=204.8,
        memory_bytes=32 * _GB,
        fp16_tflops=27.0,
        flops_derived=True,
        cpu_cores=8,
        power_mode="MAXN",
        source=f"{_AGX_DS}; {_DERIVED}",
        notes="256-bit LPDDR5; 8 Cortex-A78AE cores",
        family="orin-agx",
    ),
    DeviceSheet(
        id="orin-agx-industrial",
        name="Jetson AGX Orin Industrial (MAXN)",
        bandwidth_gbps=204.8,
        memory_bytes=64 * _GB,
        fp16_tflops=39.0,
        flops_derived=True,
        cpu_cores=12,
        power_mode="MAXN",
        source=f"{_AGX_DS}; {_DERIVED}",
        notes="64 GB LPDDR5 with ECC",
        family="orin-agx",
    ),
    DeviceSheet(
        id="orin-nx-16gb",
        name="Jetson Orin NX 16GB (MAXN)",
        bandwidth_gbps=102.4,
        memory_bytes=16 * _GB,
        fp16_tflops=15.0,
        flops_derived=True,
        cpu_cores=8,
        power_mode="MAXN",
        source=f"{_NX_DS}; {_DERIVED}",
        notes="128-bit LPDDR5",
        family="orin-nx",
    ),
    DeviceSheet(
        id="orin-nx-16gb-super",
        name="Jetson Orin NX 16GB Super (MAXN_SUPER)",
        bandwidth_gbps=102.4,
        memory_bytes=16 * _GB,
        fp16_tflops=19.2,
        flops_derived=True,
        cpu_cores=8,
        power_mode="MAXN_SUPER",
        source=f"{_NX_DS}; {_SUPER}; {_DERIVED}",
        notes="same memory bandwidth as MAXN; higher GPU clock",
        family="orin-nx",
    ),
    DeviceSheet(
        id="orin-nx-16gb-10w",
        name="Jetson Orin NX 16GB (10W)",
        bandwidth_gbps=68.0,
        memory_bytes=16 * _GB,
        fp16_tflops=5.0,
        flops_derived=True,
        cpu_cores=4,
        power_mode="10W",
        source=(
            f"{_NX_DS}; nvpmodel 10W caps EMC at 2133 MHz -> 68 GB/s "
            "(docs/REFERENCE.md, Jetson modules); "
            f"{_CAPPED}2 of 4 TPCs (TPC_PG_MASK 252) = 16 tensor cores x 0.612 GHz x 512 = 5.0"
        ),
        notes="10W also takes 4 of the 8 CPU cores offline",
        family="orin-nx",
    ),
    DeviceSheet(
        id="orin-nx-8gb",
        name="Jetson Orin NX 8GB (MAXN)",
        bandwidth_gbps=102.4,
        memory_bytes=8 * _GB,
        fp16_tflops=12.5,
        flops_derived=True,
        cpu_cores=6,
        power_mode="MAXN",
        source=f"{_NX_DS}; {_DERIVED}",
        notes="128-bit LPDDR5",
        family="orin-nx",
    ),
    DeviceSheet(
        id="orin-nx-8gb-super",
        name="Jetson Orin NX 8GB Super (MAXN_SUPER)",
        bandwidth_gbps=102.4,
        memory_bytes=8 * _GB,
        fp16_tflops=19.2,
        flops_derived=True,
        cpu_cores=6,
        power_mode="MAXN_SUPER",
        source=f"{_NX_DS}; {_SUPER}; {_DERIVED}",
        notes="same memory bandwidth as MAXN; higher GPU clock",
        family="orin-nx",
    ),
    DeviceSheet(
        id="orin-nano-8gb",
        name="Jetson Orin Nano 8GB (15W)",
        bandwidth_gbps=68.0,
        memory_bytes=8 * _GB,
        fp16_tflops=10.2,
        flops_derived=True,
        cpu_cores=6,
        power_mode="15W",
        source=f"{_NANO_DS}; {_DERIVED}",
        notes="128-bit LPDDR5; 7W/15W modes run EMC at 2133 MHz",
        family="orin-nano",
    ),
    DeviceSheet(
        id="orin-nano-8gb-super",
        name="Jetson Orin Nano 8GB Super (MAXN_SUPER)",
        bandwidth_gbps=102.0,
        memory_bytes=8 * _GB,
        fp16_tflops=16.7,
        flops_derived=True,
        cpu_cores=6,
        power_mode="MAXN_SUPER",
        source=f"{_NANO_DS}; {_SUPER}; {_DERIVED}",
        notes="EMC at 3199 MHz",
        family="orin-nano",
    ),
    DeviceSheet(
        id="orin-nano-8gb-7w",
        name="Jetson Orin Nano 8GB (7W)",
        bandwidth_gbps=68.0,
        memory_bytes=8 * _GB,
        fp16_tflops=3.3,
        flops_derived=True,
        cpu_cores=4,
        power_mode="7W",
        source=(f"{_NANO_DS}; GPU clock ~408 MHz as published for this mode (docs/REFERENCE.md, "
                f"Sources of recent Jetson decode figures); {_CAPPED}2 of 4 TPCs (TPC_PG_MASK "
                "252) = 16 tensor cores x 0.408 GHz x 512 = 3.3 (the TPC mask and 4 CPU cores "
                "are those of the 7W block of nvpmodel_p3767_0003.conf; the JetPack 6.2.1 file "
                "with this mode as -m 3 was not found in a public copy)"),
        notes="EMC at 2133 MHz; the lowest GPU and CPU clocks of the module",
        family="orin-nano",
    ),
    DeviceSheet(
        id="orin-nano-8gb-super-25w",
        name="Jetson Orin Nano 8GB Super (25W)",
        bandwidth_gbps=102.0,
        memory_bytes=8 * _GB,
        fp16_tflops=13.4,
        flops_derived=True,
        cpu_cores=6,
        power_mode="25W",
        source=(f"{_NANO_DS}; {_SUPER}; GPU clock ~820 MHz and CPU 1420 MHz in this mode: Table 5 "
                "of https://github.com/YuvrajSingh-mist/smolperfbenchmark/blob/main/"
                "benchmark-jetson-nano-orin-super/non-reasoning-models/benchmark_report.md; "
                "EMC 3199 MHz (102 GB/s) as the 25W block of nvpmodel_p3767_0003_super.conf "
                "sets it (caps below), consistent with the same report's 0.6-1B models "
                "decoding at 25W only 8-9% slower than at MAXN_SUPER (Table 9); FP16 TFLOPS "
                "derived here as 32 tensor cores x 820 MHz x 512 FLOP, the clock the report "
                "read on its board (the file caps the GPU at 918 MHz: 15.0 TFLOPS there)"),
        notes=("EMC at 3199 MHz as in MAXN_SUPER; lower GPU and CPU clocks; GPU 820 MHz as "
               "measured, 918 MHz as capped"),
        family="orin-nano",
    ),
    DeviceSheet(
        id="orin-nano-4gb",
        name="Jetson Orin Nano 4GB (10W)",
        bandwidth_gbps=34.0,
        memory_bytes=4 * _GB,
        fp16_tflops=5.1,
        flops_derived=True,
        cpu_cores=6,
        power_mode="10W",
        source=f"{_NANO_DS}; {_DERIVED}",
        notes="64-bit LPDDR5",
        family="orin-nano",
    ),
    DeviceSheet(
        id="orin-nano-4gb-super",
        name="Jetson Orin Nano 4GB Super (MAXN_SUPER)",
        bandwidth_gbps=51.0,
        memory_bytes=4 * _GB,
        fp16_tflops=8.4,
        flops_derived=True,
        cpu_cores=6,
        power_mode="MAXN_SUPER",
        source=f"{_NANO_DS}; {_SUPER}; {_DERIVED}",
        notes="64-bit LPDDR5",
        family="orin-nano",
    ),
    DeviceSheet(
        id="thor-t5000",
        name="Jetson Thor T5000 (MAXN)",
        bandwidth_gbps=273.0,
        memory_bytes=128 * _GB,
        fp16_tflops=None,
        flops_derived=False,
        cpu_cores=14,
        power_mode="MAXN",
        source="secondary sources (docs/REFERENCE.md, Jetson modules)",
        notes=(
            "secondary sources; 256-bit LPDDR5X; published compute is FP4-focused, "
            "so no dense FP16 figure is given"
        ),
        family="thor",
    ),
    DeviceSheet(
        id="h100-sxm",
        name="NVIDIA H100 SXM (comparison)",
        bandwidth_gbps=3350.0,
        memory_bytes=80 * _GB,
        fp16_tflops=989.0,
        flops_derived=False,
        cpu_cores=None,
        power_mode=None,
        source="NVIDIA H100 Tensor Core GPU specification (dense FP16 tensor)",
        notes="datacenter reference point, not an edge target",
        family="datacenter",
    ),
)



def _with_caps(sheet: DeviceSheet, mode: PowerMode) -> DeviceSheet:
    """Return ``sheet`` with the caps of its nvpmodel mode (its figures are left as they are)."""
    return replace(sheet, **cap_fields(mode), source=f"{sheet.source}; caps: {mode.source}")


def _mode_sheet(mode: PowerMode, base: DeviceSheet) -> DeviceSheet:
    """Return the datasheet of a power mode without a hand-written one, from its caps."""
    return _with_caps(DeviceSheet(**sheet_fields(mode, base.name, base.memory_bytes,
                                                 base.family)), mode)


def _all_sheets() -> dict[str, DeviceSheet]:
    """The hand-written sheets, each with its mode's caps, then every other power mode's."""
    by_device = {m.device_id: m for m in MODES}
    out: dict[str, DeviceSheet] = {}
    for p in _PROFILES:
        mode = by_device.get(p.id)
        out[p.id] = p if mode is None else _with_caps(p, mode)
        # the modes without a hand-written sheet follow their module's base sheet
        for m in MODES:
            if m.module == p.id and m.device_id not in out and not any(
                    q.id == m.device_id for q in _PROFILES):
                out[m.device_id] = _mode_sheet(m, p)
    return out


DEVICES: dict[str, DeviceSheet] = _all_sheets()


def power_modes_of(device_id: str) -> list[DeviceSheet]:
    """Return every power mode's datasheet of ``device_id``'s module (the device itself
    included), in the table's order; a device without a mode table gives only itself.

    Raises:
        UnknownDeviceError: ``device_id`` is not a row of the table.
    """
    sheet = get_device(device_id)
    if not sheet.module:
        return [sheet]
    return [s for s in DEVICES.values() if s.module == sheet.module]


def list_devices() -> list[DeviceSheet]:
    """Return every built-in datasheet, in a stable order (the host is not included)."""
    return list(DEVICES.values())


#: Resolves an id that is not a row of the table: (cache_path, sysfs_root) -> its datasheet.
DeviceResolver = Callable[[Path | None, Path], DeviceSheet]

#: The resolvers of "host" and "auto", by id; filled by robot_latency.floor.device_lookup, which
#: the floor package imports first, so every caller of get_device finds them.
_RESOLVERS: dict[str, DeviceResolver] = {}


def register_resolver(device_id: str, resolver: DeviceResolver) -> None:
    """Make ``get_device(device_id)`` call ``resolver`` (for ids that are not rows of the table).

    Raises:
        ValueError: ``device_id`` is a row of the table.
    """
    key = device_id.strip().lower()
    if key in DEVICES:
        raise ValueError(f"device id {device_id!r} is a row of the table, not a resolver's id")
    _RESOLVERS[key] = resolver


def get_device(
    device_id: str, *, cache_path: Path | None = None, sysfs_root: Path = Path("/")
) -> DeviceSheet:
    """Return the datasheet for a device id, "host" (probed and cached) or "auto" (detected).

    "auto" picks the detected Jetson's datasheet, power mode considered, and falls back to the
    host probe anywhere else (:mod:`robot_latency.floor.device_lookup`). An unknown id raises
    UnknownDeviceError listing the valid ids.
    """
    key = device_id.strip().lower()
    if key in DEVICES:
        return DEVICES[key]
    resolver = _RESOLVERS.get(key)
    if resolver is not None:
        return resolver(cache_path, sysfs_root)
    valid = ", ".join([*sorted(_RESOLVERS), *DEVICES])
    raise UnknownDeviceError(f"unknown device id {device_id!r}; valid ids: {valid}")
