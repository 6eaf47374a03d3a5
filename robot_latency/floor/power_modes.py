"""Every nvpmodel power mode of every Orin module: its memory and compute caps, with sources.

A power mode caps the memory (EMC) clock, the GPU clock, the GPU's TPCs left powered and the CPU
cores online and their clock (the nvpmodel configuration's ``POWER_MODEL`` blocks; docs/
REFERENCE.md, "Power modes, energy and more published Jetson figures"). From those caps each
mode gets its own datasheet (:mod:`robot_latency.floor.devices` builds them from this table):

* bandwidth = bus width / 8 x EMC MHz x 2 (LPDDR5 moves two transfers per clock);
* dense FP16 peak = TPCs x 8 tensor cores (2 SMs of 4) x GPU MHz x 512 FLOP, derived here.

The caps are read from NVIDIA's nvpmodel configuration files as copied, unchanged, into a public
repository (:data:`CONF_SOURCE`); a cap of ``-1`` or ``0`` there means "no cap": the module's
hardware maximum (:class:`Module`). A mode's figures are those of the newest copy that has the
mode (the JetPack 6.2 "super" files where they list it, else the earlier files).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CONF_SOURCE", "MODES", "MODULES", "Module", "PowerMode", "modes_of"]

#: Where the nvpmodel configuration files were read (NVIDIA's files, copied into a public tree).
CONF_SOURCE = "https://github.com/LineageOS/android_device_nvidia_concord/blob/{commit}/nvpmodel/{file}"
_EARLY = "54e49538515b2e38a99731ab8805eccec2f302c6"  # the files as added in 2022, JetPack 5
_SUPER = "370b63a8dbe954cd5f2da0c24694a1af5796612f"  # the *_super.conf files (2024, JetPack 6.2)


@dataclass(frozen=True)
class Module:
    """One Orin module's hardware maxima: what a mode without a cap runs at."""

    id: str  # the base datasheet id (robot_latency.floor.devices)
    bus_bits: int  # LPDDR5 bus width
    tpcs: int  # TPC bits the TPC_PG_MASK can gate (a set bit gates that TPC)
    gpu_max_mhz: float  # the GPU's hardware maximum (datasheet)
    gpu_max_mhz_super: float | None  # in the JetPack 6.2 super configuration
    emc_max_mhz: float  # the EMC's hardware maximum before JetPack 6.2
    emc_max_mhz_super: float | None  # in the super configuration
    cpu_cores: int
    source: str


@dataclass(frozen=True)
class PowerMode:
    """One nvpmodel ``POWER_MODEL`` block: the caps a power mode sets, and where they are read.

    ``None`` for a clock is "no cap" (``-1`` or ``0`` in the file): the module's maximum.
    """

    module: str
    name: str  # nvpmodel's NAME, without AGX Orin's "MODE_" prefix
    nvpmodel_id: int
    super_conf: bool  # read from the JetPack 6.2 super configuration
    cpu_online: int
    cpu_max_mhz: float | None
    tpc_pg_mask: int
    gpu_max_mhz: float | None
    emc_max_mhz: float | None
    conf_file: str
    device_id: str  # the datasheet id this mode gets

    @property
    def source(self) -> str:
        """The file and block the caps were read from."""
        commit = _SUPER if self.super_conf else _EARLY
        url = CONF_SOURCE.format(commit=commit, file=self.conf_file)
        return f"{url}, POWER_MODEL ID={self.nvpmodel_id} NAME={self.name}"


_AGX_DS = "NVIDIA Jetson AGX Orin Series datasheet DS-10662"
_NXNANO_DS = "NVIDIA Jetson Orin NX Series DS-10712 and Orin Nano Series DS-11105 datasheets"

#: The modules with power-mode tables. AGX Orin Industrial (P3701-0008) is left out: its
#: configuration file was not found in a public copy.
MODULES: dict[str, Module] = {m.id: m for m in (
    Module("orin-agx-64gb", 256, 8, 1300.0, None, 3200.0, None, 12, _AGX_DS),
    Module("orin-agx-32gb", 256, 8, 930.0, None, 3200.0, None, 8, _AGX_DS),
    Module("orin-nx-16gb", 128, 4, 918.0, 1173.0, 3199.0, 3199.0, 8, _NXNANO_DS),
    Module("orin-nx-8gb", 128, 4, 765.0, 1173.0, 3199.0, 3199.0, 6, _NXNANO_DS),
    Module("orin-nano-8gb", 128, 4, 625.0, 1020.0, 2133.0, 3199.0, 6, _NXNANO_DS),
    Module("orin-nano-4gb", 64, 4, 625.0, 1020.0, 2133.0, 3199.0, 6, _NXNANO_DS),
)}

_A64, _A32 = "nvpmodel_p3701_0000.conf", "nvpmodel_p3701_0004.conf"
_NX16, _NX8 = "nvpmodel_p3767_0000_super.conf", "nvpmodel_p3767_0001_super.conf"
_N8, _N8S = "nvpmodel_p3767_0003.conf", "nvpmodel_p3767_0003_super.conf"
_N4, _N4S = "nvpmodel_p3767_0004.conf", "nvpmodel_p3767_0004_super.conf"

#: Every mode, base modes included (their device id is the module's). P3701-0000 is the AGX Orin
#: developer kit's module, with the 64GB module's 12 CPUs and 8 TPCs: its file stands for the
#: 64GB module (P3701-0005), whose own file was not found in a public copy.
MODES: tuple[PowerMode, ...] = (
    PowerMode("orin-agx-64gb", "MAXN", 0, False, 12, None, 0, None, None, _A64, "orin-agx-64gb"),
    PowerMode("orin-agx-64gb", "15W", 1, False, 4, 1113.6, 248, 408.0, 2133.0, _A64,
              "orin-agx-64gb-15w"),
    PowerMode("orin-agx-64gb", "30W", 2, False, 8, 1728.0, 240, 612.0, None, _A64,
              "orin-agx-64gb-30w"),
    PowerMode("orin-agx-64gb", "50W", 3, False, 12, 1497.6, 0, 816.0, None, _A64,
              "orin-agx-64gb-50w"),
    PowerMode("orin-agx-32gb", "MAXN", 0, False, 8, None, 128, None, None, _A32, "orin-agx-32gb"),
    PowerMode("orin-agx-32gb", "15W", 1, False, 4, 1113.6, 248, 408.0, 2133.0, _A32,
              "orin-agx-32gb-15w"),
    PowerMode("orin-agx-32gb", "30W", 2, False, 8, 1728.0, 240, 612.0, None, _A32,
              "orin-agx-32gb-30w"),
    PowerMode("orin-agx-32gb", "40W", 3, False, 8, 1497.6, 128, 816.0, None, _A32,
              "orin-agx-32gb-40w"),
    PowerMode("orin-nx-16gb", "MAXN", 0, False, 8, None, 240, None, None,
              "nvpmodel_p3767_0000.conf", "orin-nx-16gb"),
    PowerMode("orin-nx-16gb", "MAXN_SUPER", 0, True, 8, None, 240, None, None, _NX16,
              "orin-nx-16gb-super"),
    PowerMode("orin-nx-16gb", "10W", 1, True, 4, 1190.4, 252, 612.0, 2133.0, _NX16,
              "orin-nx-16gb-10w"),
    PowerMode("orin-nx-16gb", "15W", 2, True, 4, 1420.8, 252, 612.0, None, _NX16,
              "orin-nx-16gb-15w"),
    PowerMode("orin-nx-16gb", "25W", 3, True, 8, 1497.6, 240, 408.0, None, _NX16,
              "orin-nx-16gb-25w"),
    PowerMode("orin-nx-16gb", "40W", 4, True, 8, 1497.6, 240, 1173.0, None, _NX16,
              "orin-nx-16gb-super-40w"),
    PowerMode("orin-nx-8gb", "MAXN", 0, False, 6, None, 240, None, None,
              "nvpmodel_p3767_0001.conf", "orin-nx-8gb"),
    PowerMode("orin-nx-8gb", "MAXN_SUPER", 0, True, 6, None, 240, None, None, _NX8,
              "orin-nx-8gb-super"),
    PowerMode("orin-nx-8gb", "10W", 1, True, 4, 1190.4, 252, 612.0, 2133.0, _NX8,
              "orin-nx-8gb-10w"),
    PowerMode("orin-nx-8gb", "15W", 2, True, 4, 1420.8, 252, 612.0, None, _NX8,
              "orin-nx-8gb-15w"),
    PowerMode("orin-nx-8gb", "20W", 3, True, 6, 1497.6, 240, 408.0, None, _NX8,
              "orin-nx-8gb-20w"),
    PowerMode("orin-nx-8gb", "40W", 4, True, 6, 1984.0, 240, 1173.0, None, _NX8,
              "orin-nx-8gb-super-40w"),
    PowerMode("orin-nano-8gb", "15W", 0, False, 6, None, 240, None, None, _N8, "orin-nano-8gb"),
    PowerMode("orin-nano-8gb", "7W", 1, False, 4, 960.0, 252, 408.0, 2133.0, _N8,
              "orin-nano-8gb-7w"),
    PowerMode("orin-nano-8gb", "25W", 1, True, 6, 1344.0, 240, 918.0, 3199.0, _N8S,
              "orin-nano-8gb-super-25w"),
    PowerMode("orin-nano-8gb", "MAXN_SUPER", 2, True, 6, None, 240, None, None, _N8S,
              "orin-nano-8gb-super"),
    PowerMode("orin-nano-4gb", "10W", 0, False, 6, None, 252, None, None, _N4, "orin-nano-4gb"),
    PowerMode("orin-nano-4gb", "7W_AI", 1, False, 4, 806.4, 252, 408.0, 2133.0, _N4,
              "orin-nano-4gb-7w-ai"),
    PowerMode("orin-nano-4gb", "7W_CPU", 2, False, 4, 960.0, 252, 306.0, 2133.0, _N4,
              "orin-nano-4gb-7w-cpu"),
    PowerMode("orin-nano-4gb", "25W", 1, True, 6, 1728.0, 252, 1020.0, 3199.0, _N4S,
              "orin-nano-4gb-super-25w"),
    PowerMode("orin-nano-4gb", "MAXN_SUPER", 2, True, 6, None, 252, None, None, _N4S,
              "orin-nano-4gb-super"),
)


def tpcs_on(mode: PowerMode) -> int:
    """Return the TPCs a mode leaves powered: the module's TPCs less those its mask gates."""
    total = MODULES[mode.module].tpcs
    return total - bin(mode.tpc_pg_mask & ((1 << total) - 1)).count("1")


def gpu_mhz(mode: PowerMode) -> float:
    """Return the mode's GPU clock cap (the module's maximum where the mode sets none)."""
    m = MODULES[mode.module]
    top = m.gpu_max_mhz_super if mode.super_conf and m.gpu_max_mhz_super else m.gpu_max_mhz
    return mode.gpu_max_mhz if mode.gpu_max_mhz is not None else top


def emc_mhz(mode: PowerMode) -> float:
    """Return the mode's EMC clock cap (the module's maximum where the mode sets none)."""
    m = MODULES[mode.module]
    top = m.emc_max_mhz_super if mode.super_conf and m.emc_max_mhz_super else m.emc_max_mhz
    return mode.emc_max_mhz if mode.emc_max_mhz is not None else top


def bandwidth_gbps(mode: PowerMode) -> float:
    """Return bus bytes x EMC MHz x 2 transfers per clock, in GB/s (1e9 bytes/s)."""
    return MODULES[mode.module].bus_bits / 8 * emc_mhz(mode) * 2 / 1e3


def fp16_tflops(mode: PowerMode) -> float:
    """Return TPCs x 8 tensor cores x GPU GHz x 512 FLOP (dense FP16), in TFLOPS (derived)."""
    return tpcs_on(mode) * 8 * gpu_mhz(mode) / 1e3 * 512 / 1e3


def modes_of(module: str) -> list[PowerMode]:
    """Return the modes of ``module`` (a base datasheet id), in the table's order."""
    return [m for m in MODES if m.module == module]


def cap_fields(mode: PowerMode) -> dict[str, Any]:
    """Return the datasheet fields that carry a mode's caps (robot_latency.floor.devices)."""
    return {"module": mode.module, "nvpmodel_id": mode.nvpmodel_id,
            "emc_max_mhz": emc_mhz(mode), "gpu_max_mhz": gpu_mhz(mode),
            "gpu_tpcs": tpcs_on(mode), "cpu_max_mhz": mode.cpu_max_mhz}


def sheet_fields(mode: PowerMode, base_name: str, memory_bytes: int,
                 family: str) -> dict[str, Any]:
    """Return the datasheet fields of a mode without a hand-written sheet: every figure derived
    from its caps (its module's memory, name and family given)."""
    bw, tf = bandwidth_gbps(mode), fp16_tflops(mode)
    module = MODULES[mode.module]
    return {
        "id": mode.device_id,
        "name": (f"{base_name.rsplit(' (', 1)[0]}"
                 f"{' Super' if 'super' in mode.device_id else ''} ({mode.name})"),
        "bandwidth_gbps": round(bw, 1),
        "memory_bytes": memory_bytes,
        "fp16_tflops": round(tf, 2),
        "flops_derived": True,
        "cpu_cores": mode.cpu_online,
        "power_mode": mode.name,
        "source": (f"{module.source}; bandwidth derived here as {module.bus_bits}-bit / 8 x EMC "
                   f"{emc_mhz(mode):g} MHz x 2 = {bw:.1f} GB/s; FP16 TFLOPS derived here as "
                   f"{tpcs_on(mode)} TPCs x 8 tensor cores x {gpu_mhz(mode):g} MHz x 512 FLOP"),
        "notes": (f"{mode.cpu_online} of {module.cpu_cores} CPU cores online"
                  + (f" at up to {mode.cpu_max_mhz:g} MHz" if mode.cpu_max_mhz else "")
                  + ("; JetPack 6.2 super configuration" if mode.super_conf else "")),
        "family": family,
    }
