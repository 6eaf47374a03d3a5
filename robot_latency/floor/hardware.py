"""Device profiles for the bandwidth floor: built-in figures, a host probe and Jetson detection.

A profile carries the two numbers the floor model needs (memory read bandwidth and dense FP16
peak) plus enough provenance to re-check them. Built-in figures come from REFERENCE.md section 4;
the host's figures are measured once and cached; on a Jetson the module and its nvpmodel power
mode are read from the device tree and nvpmodel's files, because the power mode changes the
memory bandwidth.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import re
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.floor.errors import ProbeError, UnknownDeviceError

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEVICES",
    "PROBE_VERSION",
    "HardwareProfile",
    "HostProbe",
    "JetsonInfo",
    "default_cache_path",
    "detect_jetson",
    "get_device",
    "list_devices",
    "load_or_probe_host",
    "probe_host",
]

logger = logging.getLogger(__name__)

HOST_ID = "host"
AUTO_ID = "auto"


@dataclass(frozen=True)
class HardwareProfile:
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
        """Return the profile as a JSON-ready dict."""
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Built-in profiles (REFERENCE.md section 4)
# --------------------------------------------------------------------------------------------

_GB = 1_000_000_000  # datasheets quote memory in GB = 1e9 bytes

_AGX_DS = "NVIDIA Jetson AGX Orin Series datasheet DS-10662"
_NX_DS = "NVIDIA Jetson Orin NX Series datasheet DS-10712"
_NANO_DS = "NVIDIA Jetson Orin Nano Series datasheet DS-11105"
_SUPER = "Super figures: JetPack 6.2 MAXN_SUPER mode, Jetson Linux power docs"
_DERIVED = (
    "FP16 TFLOPS derived here as tensor cores x GPU clock x 512 FLOP (dense), "
    "not printed by NVIDIA (REFERENCE.md section 4)"
)
# A capped mode's compute is derived from its nvpmodel block: TPCs left on by TPC_PG_MASK (a set
# bit gates a TPC; an Orin TPC is 2 SMs = 8 tensor cores) at the mode's GPU MAX_FREQ.
_CAPPED = "FP16 TFLOPS derived here from the mode's nvpmodel block: "


_PROFILES: tuple[HardwareProfile, ...] = (
    HardwareProfile(
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
    HardwareProfile(
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
            f"(REFERENCE.md section 4); {_CAPPED}3 of 8 TPCs (TPC_PG_MASK 248) = 24 tensor cores "
            "x 0.408 GHz x 512 = 5.0"
        ),
        notes="MODE_15W also takes 8 of the 12 CPU cores offline",
        family="orin-agx",
    ),
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
        id="orin-nx-16gb-10w",
        name="Jetson Orin NX 16GB (10W)",
        bandwidth_gbps=68.0,
        memory_bytes=16 * _GB,
        fp16_tflops=5.0,
        flops_derived=True,
        cpu_cores=4,
        power_mode="10W",
        source=(
            f"{_NX_DS}; nvpmodel 10W caps EMC at 2133 MHz -> 68 GB/s (REFERENCE.md section 4); "
            f"{_CAPPED}2 of 4 TPCs (TPC_PG_MASK 252) = 16 tensor cores x 0.612 GHz x 512 = 5.0"
        ),
        notes="10W also takes 4 of the 8 CPU cores offline",
        family="orin-nx",
    ),
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
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
    HardwareProfile(
        id="thor-t5000",
        name="Jetson Thor T5000 (MAXN)",
        bandwidth_gbps=273.0,
        memory_bytes=128 * _GB,
        fp16_tflops=None,
        flops_derived=False,
        cpu_cores=14,
        power_mode="MAXN",
        source="secondary sources (REFERENCE.md section 4)",
        notes=(
            "secondary sources; 256-bit LPDDR5X; published compute is FP4-focused, "
            "so no dense FP16 figure is given"
        ),
        family="thor",
    ),
    HardwareProfile(
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

DEVICES: dict[str, HardwareProfile] = {p.id: p for p in _PROFILES}


def list_devices() -> list[HardwareProfile]:
    """Return every built-in profile, in a stable order (the host is not included)."""
    return list(DEVICES.values())


def get_device(
    device_id: str, *, cache_path: Path | None = None, sysfs_root: Path = Path("/")
) -> HardwareProfile:
    """Return the profile for a device id, "host" (probed and cached) or "auto" (detected).

    "auto" picks the detected Jetson's profile, power mode considered, and falls back to the
    host probe anywhere else. An unknown id raises UnknownDeviceError listing the valid ids.
    """
    key = device_id.strip().lower()
    if key in DEVICES:
        return DEVICES[key]
    if key == HOST_ID:
        return load_or_probe_host(cache_path)
    if key == AUTO_ID:
        info = detect_jetson(sysfs_root)
        if info is not None and info.profile_id is not None:
            logger.info(
                "detected %s (module %s, power mode %s): using profile %s",
                info.model_string,
                info.module,
                info.power_mode,
                info.profile_id,
            )
            return DEVICES[info.profile_id]
        if info is not None:
            logger.warning(
                "Jetson %r has no built-in profile; probing it as a host", info.model_string
            )
        return load_or_probe_host(cache_path)
    valid = ", ".join([AUTO_ID, HOST_ID, *DEVICES])
    raise UnknownDeviceError(f"unknown device id {device_id!r}; valid ids: {valid}")


# --------------------------------------------------------------------------------------------
# Host probe
# --------------------------------------------------------------------------------------------

PROBE_VERSION = 1
DEFAULT_BUFFER_BYTES = 256 * 2**20
_MATMUL_N = 1024
_CACHE_FILE = "host_probe.json"


@dataclass(frozen=True)
class HostProbe:
    """What the host probe measured, plus the facts that say which machine it measured."""

    bandwidth_gbps: float
    bandwidth_single_gbps: float
    matmul_gflops: float
    cpu_cores: int
    memory_bytes: int
    cpu_model: str
    machine: str
    hostname: str
    probed_at: str
    probe_version: int

    def to_profile(self) -> HardwareProfile:
        """Return this measurement as the "host" profile."""
        return HardwareProfile(
            id=HOST_ID,
            name=f"This host ({self.cpu_model}, {self.cpu_cores} cores)",
            bandwidth_gbps=self.bandwidth_gbps,
            memory_bytes=self.memory_bytes,
            # A CPU host has no FP16 tensor peak; the measured float32 matmul rate stands in
            # for it as the prefill bound.
            fp16_tflops=self.matmul_gflops / 1e3,
            flops_derived=True,
            cpu_cores=self.cpu_cores,
            power_mode=None,
            source=f"measured by robot-latency probe on {self.probed_at[:10]}",
            notes=(
                f"all-core read {self.bandwidth_gbps:.1f} GB/s "
                f"(single thread {self.bandwidth_single_gbps:.1f} GB/s); "
                f"compute is a float32 numpy matmul, {self.matmul_gflops:.1f} GFLOP/s; "
                f"{self.machine} host {self.hostname}, probe v{self.probe_version}"
            ),
            family="host",
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the probe as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostProbe:
        """Build a probe from to_dict()'s output; raise ProbeError if it is malformed."""
        if not isinstance(d, dict):
            raise ProbeError(f"host probe record must be a JSON object, got {type(d).__name__}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                raise ProbeError(f"host probe record lacks {f.name!r}")
            value = d[f.name]
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            # bool is an int subclass; a bool anywhere here means the record is not ours.
            if isinstance(value, bool):
                raise ProbeError(f"host probe field {f.name!r} has the wrong type")
            if kind == "float":
                if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                    raise ProbeError(f"host probe field {f.name!r} must be a positive number")
                value = float(value)
            elif kind == "int":
                if not isinstance(value, int):
                    raise ProbeError(f"host probe field {f.name!r} must be an integer")
            elif not isinstance(value, str):
                raise ProbeError(f"host probe field {f.name!r} must be a string")
            values[f.name] = value
        return cls(**values)


def probe_host(
    *, buffer_bytes: int = DEFAULT_BUFFER_BYTES, repeats: int = 5, threads: int | None = None
) -> HostProbe:
    """Measure this machine's memory read bandwidth (all cores and one) and matmul rate.

    buffer_bytes should be well above the last-level cache, or the figure is cache bandwidth.
    threads defaults to the CPUs this process may run on.
    """
    if buffer_bytes < 8 * 1024:
        raise ValueError(f"buffer_bytes must be at least 8 KiB, got {buffer_bytes}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    n_threads = threads if threads is not None else _usable_cpus()
    if n_threads < 1:
        raise ValueError(f"threads must be at least 1, got {n_threads}")

    started_ns = time.perf_counter_ns()
    # Fill with ones, not zeros: untouched calloc'd pages all map to one shared zero page, and
    # reading those never leaves the cache.
    buffer = np.ones(buffer_bytes // 8, dtype=np.int64)
    single = _read_bandwidth_gbps(buffer, 1, repeats)
    multi = _read_bandwidth_gbps(buffer, n_threads, repeats)
    del buffer
    gflops = _matmul_gflops(_MATMUL_N, max(repeats, 3))

    probe = HostProbe(
        bandwidth_gbps=multi,
        bandwidth_single_gbps=single,
        matmul_gflops=gflops,
        cpu_cores=os.cpu_count() or 1,
        memory_bytes=_total_memory_bytes(),
        cpu_model=_cpu_model(),
        machine=platform.machine(),
        hostname=socket.gethostname(),
        probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        probe_version=PROBE_VERSION,
    )
    for name in ("bandwidth_gbps", "bandwidth_single_gbps", "matmul_gflops"):
        value = getattr(probe, name)
        if not (math.isfinite(value) and value > 0):
            raise ProbeError(f"host probe measured a meaningless {name}: {value}")
    logger.info(
        "host probe: read %.1f GB/s with %d threads (%.1f GB/s single), matmul %.1f GFLOP/s, "
        "in %.2f s",
        multi,
        n_threads,
        single,
        gflops,
        (time.perf_counter_ns() - started_ns) / 1e9,
    )
    return probe


def _read_bandwidth_gbps(buffer: np.ndarray, threads: int, repeats: int) -> float:
    """Return the median read bandwidth (GB/s) of `threads` threads summing their own slices.

    np.add.reduce releases the GIL and runs on one core, so one thread per core, each on a
    contiguous slice, reads with every core at once. int64 addition vectorises well enough to
    stay memory bound, where float64's pairwise summation is compute bound on some CPUs.
    """
    chunks = np.array_split(buffer, threads)
    with ThreadPoolExecutor(max_workers=threads) as pool:

        def one_pass_ns() -> int:
            start = time.perf_counter_ns()
            for _ in pool.map(np.add.reduce, chunks):
                pass
            return max(time.perf_counter_ns() - start, 1)

        one_pass_ns()  # warm up: start the workers, fault in pages and TLB entries
        elapsed_ns = statistics.median(one_pass_ns() for _ in range(repeats))
    return buffer.nbytes / elapsed_ns  # bytes per ns is GB/s


def _matmul_gflops(n: int, repeats: int) -> float:
    """Return the median float32 matmul rate (GFLOP/s) of an n x n product on numpy's BLAS."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    np.matmul(a, b)  # warm up: BLAS starts its own thread pool on first use

    def one_ns() -> int:
        start = time.perf_counter_ns()
        np.matmul(a, b)
        return max(time.perf_counter_ns() - start, 1)

    elapsed_ns = statistics.median(one_ns() for _ in range(repeats))
    return 2 * n**3 / elapsed_ns  # FLOP per ns is GFLOP/s


def _usable_cpus() -> int:
    """Return how many CPUs this process may run on (affinity and cgroup cpusets respected)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _total_memory_bytes() -> int:
    """Return the machine's total RAM in bytes."""
    try:
        import psutil
    except ImportError:  # psutil is optional; sysconf covers Linux and macOS
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return int(psutil.virtual_memory().total)


def _cpu_model() -> str:
    """Return a human CPU name from /proc/cpuinfo, else from the platform module."""
    with contextlib.suppress(OSError):
        for line in (
            Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        ):
            key, _, value = line.partition(":")
            # x86 names it "model name"; Arm boards often give only "Model" or "Hardware".
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def default_cache_path() -> Path:
    """Return where the host probe is cached.

    $ROBOT_LATENCY_CACHE_DIR, else $XDG_CACHE_HOME/robot_latency, else ~/.cache/robot_latency.
    """
    explicit = os.environ.get("ROBOT_LATENCY_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / _CACHE_FILE
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "robot_latency" / _CACHE_FILE


def load_or_probe_host(
    cache_path: Path | None = None,
    *,
    refresh: bool = False,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    repeats: int = 5,
    threads: int | None = None,
) -> HardwareProfile:
    """Return the host profile from the cache, probing (and caching) when it is absent or stale.

    A cache counts only for the machine and probe version that wrote it. A corrupt cache is
    reported and replaced; an unwritable cache is reported and the fresh probe still returned.
    The probe keywords are passed to probe_host().
    """
    path = cache_path if cache_path is not None else default_cache_path()
    if not refresh:
        cached = _read_cached_probe(path)
        if cached is not None:
            logger.debug("host profile from cache %s (probed %s)", path, cached.probed_at)
            return cached.to_profile()
    probe = probe_host(buffer_bytes=buffer_bytes, repeats=repeats, threads=threads)
    _write_cache(path, probe)
    return probe.to_profile()


def _read_cached_probe(path: Path) -> HostProbe | None:
    """Return the cached probe if it exists, parses, and was written for this machine."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("host probe cache %s is unreadable (%s); probing again", path, exc)
        return None
    try:
        probe = HostProbe.from_dict(json.loads(text))
    except (ValueError, ProbeError) as exc:  # json.JSONDecodeError is a ValueError
        logger.warning("host probe cache %s is corrupt (%s); probing again", path, exc)
        return None
    here = (socket.gethostname(), platform.machine(), os.cpu_count() or 1, PROBE_VERSION)
    there = (probe.hostname, probe.machine, probe.cpu_cores, probe.probe_version)
    if here != there:
        logger.info(
            "host probe cache %s was written for %s, not %s; probing again", path, there, here
        )
        return None
    return probe


def _write_cache(path: Path, probe: HostProbe) -> None:
    """Write the probe to `path` atomically; on failure, log a warning and carry on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(probe.to_dict(), f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            # A reader sees the old file or the new one, never half of one.
            os.replace(tmp_name, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
    except OSError as exc:
        logger.warning(
            "could not write host probe cache %s (%s); using the probe without caching it",
            path,
            exc,
        )


# --------------------------------------------------------------------------------------------
# Jetson detection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JetsonInfo:
    """What the device tree and nvpmodel say about a Jetson, and the profile that fits it."""

    model_string: str
    module: str | None
    power_mode: str | None
    power_mode_id: int | None
    profile_id: str | None


# Module part numbers (P-numbers) from NVIDIA's Jetson Linux partition-configuration docs.
# P3701-0000 is the AGX Orin development module (32 GB, but the 64 GB module's 12 CPUs and full
# GPU); JetPack 5 device trees also name it on other AGX Orin devkits, so memory decides there.
_PART_PROFILES: dict[str, tuple[str, ...]] = {
    "p3701-0000": ("orin-agx-32gb", "orin-agx-64gb"),
    "p3701-0004": ("orin-agx-32gb",),
    "p3701-0005": ("orin-agx-64gb",),
    "p3701-0008": ("orin-agx-industrial",),
    "p3767-0000": ("orin-nx-16gb",),
    "p3767-0001": ("orin-nx-8gb",),
    "p3767-0003": ("orin-nano-8gb",),
    "p3767-0004": ("orin-nano-4gb",),
    "p3767-0005": ("orin-nano-8gb",),  # the Orin Nano developer kit's module
    "p3834-0008": ("thor-t5000",),
}
# Module boards, for a part number whose SKU suffix is not in the table above. Where memory
# cannot tell candidates apart, the earlier (lower-bandwidth, so pessimistic) one wins.
_BOARD_PROFILES: dict[str, tuple[str, ...]] = {
    "p3701": ("orin-agx-32gb", "orin-agx-64gb"),
    "p3767": ("orin-nano-4gb", "orin-nano-8gb", "orin-nx-8gb", "orin-nx-16gb"),
    "p3834": ("thor-t5000",),
}
# Model-string keywords, for device trees that carry no module part number.
_MODEL_PROFILES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("thor", ("thor-t5000",)),
    ("agx orin", ("orin-agx-32gb", "orin-agx-64gb")),
    ("orin nx", ("orin-nx-8gb", "orin-nx-16gb")),
    ("orin nano", ("orin-nano-4gb", "orin-nano-8gb")),
)
# Power modes that change a module's figures; every other mode maps to the module's base profile.
_MODE_PROFILES: dict[str, dict[str, str]] = {
    "orin-agx-64gb": {"15W": "orin-agx-64gb-15w"},
    "orin-nx-16gb": {"10W": "orin-nx-16gb-10w", "MAXN_SUPER": "orin-nx-16gb-super"},
    "orin-nx-8gb": {"MAXN_SUPER": "orin-nx-8gb-super"},
    # 25W exists only in the Super conf, which runs EMC at full speed (102 GB/s): the Super
    # profile has the right bandwidth (its FLOP/s are MAXN_SUPER's, ~10% above 25W's clocks).
    "orin-nano-8gb": {"MAXN_SUPER": "orin-nano-8gb-super", "25W": "orin-nano-8gb-super"},
    "orin-nano-4gb": {"MAXN_SUPER": "orin-nano-4gb-super"},
}

_PART_RE = re.compile(r"\b(p\d{4})-(\d{4})\b")
_PMODE_RE = re.compile(r"\bpmode:(\d+)")
_POWER_MODEL_RE = re.compile(r"<\s*POWER_MODEL\b([^>]*)>")
_MAX_SYMLINKS = 8


def detect_jetson(root: Path = Path("/")) -> JetsonInfo | None:
    """Return the Jetson module and power mode found under `root`, or None on other machines.

    Reads <root>/proc/device-tree/{model,compatible}, <root>/proc/meminfo,
    <root>/var/lib/nvpmodel/status and <root>/etc/nvpmodel.conf. Files that are missing or
    garbled leave the matching fields None rather than failing.
    """
    model = " ".join(_device_tree_strings(root, "model"))
    compatible = _device_tree_strings(root, "compatible")
    is_tegra = any(s.startswith("nvidia,tegra") for s in compatible)
    if not is_tegra and "jetson" not in model.lower():
        return None

    module = _module_part_number(root, compatible)
    power_mode_id, power_mode = _power_mode(root)
    base = _base_profile(module, model, _mem_total_bytes(root))
    profile_id = None
    if base is not None:
        profile_id = _MODE_PROFILES.get(base, {}).get(power_mode or "", base)
    return JetsonInfo(
        model_string=model,
        module=module,
        power_mode=power_mode,
        power_mode_id=power_mode_id,
        profile_id=profile_id,
    )


def _resolve_under(root: Path, relative: str) -> Path:
    """Return root/relative, following a symlink at the end as if `root` were "/".

    /etc/nvpmodel.conf is an absolute symlink to /etc/nvpmodel/nvpmodel_<module>.conf; under a
    fixture root that target must be looked up inside the root, not on this machine.
    """
    path = root / relative
    for _ in range(_MAX_SYMLINKS):
        if not path.is_symlink():
            break
        target = Path(os.readlink(path))
        path = (
            root / target.relative_to(target.anchor)
            if target.is_absolute()
            else path.parent / target
        )
    return path


def _read_bytes(root: Path, relative: str) -> bytes | None:
    """Return the file's bytes, or None if it cannot be read."""
    with contextlib.suppress(OSError):
        return _resolve_under(root, relative).read_bytes()
    return None


def _read_text(root: Path, relative: str) -> str | None:
    """Return the file as text (bad bytes replaced), or None if it cannot be read."""
    data = _read_bytes(root, relative)
    return None if data is None else data.decode("utf-8", errors="replace")


def _device_tree_strings(root: Path, prop: str) -> list[str]:
    """Return a device-tree string property as its NUL-separated strings, empties dropped."""
    for base in ("proc/device-tree", "sys/firmware/devicetree/base"):
        data = _read_bytes(root, f"{base}/{prop}")
        if data is not None:
            parts = (p.decode("utf-8", errors="replace").strip() for p in data.split(b"\0"))
            return [p for p in parts if p]
    return []


def _module_part_number(root: Path, compatible: list[str]) -> str | None:
    """Return the module's part number ("p3701-0005"), skipping carrier-board numbers."""
    # JetPack 6 lists "nvidia,p3737-0000+p3701-0005" (carrier+module); JetPack 5 device trees
    # may only carry it in nvidia,dtsfilename (".../tegra234-p3701-0000-p3737-0000.dts").
    sources = [*compatible, *_device_tree_strings(root, "nvidia,dtsfilename")]
    for text in sources:
        for board, sku in _PART_RE.findall(text):
            if board in _BOARD_PROFILES:
                return f"{board}-{sku}"
    return None


def _mem_total_bytes(root: Path) -> int | None:
    """Return MemTotal from <root>/proc/meminfo in bytes, or None."""
    text = _read_text(root, "proc/meminfo")
    if text is None:
        return None
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _power_mode(root: Path) -> tuple[int | None, str | None]:
    """Return the nvpmodel mode (id, name), or None for what cannot be read.

    nvpmodel keeps the current mode in /var/lib/nvpmodel/status as "pmode:0002" (often with a
    fan-mode field after it) and names modes in /etc/nvpmodel.conf as
    "< POWER_MODEL ID=2 NAME=MAXN_SUPER >". AGX Orin spells modes "MODE_15W"; the prefix is
    dropped so every module reads "15W".
    """
    status = _read_text(root, "var/lib/nvpmodel/status")
    match = _PMODE_RE.search(status or "")
    if match is None:
        if status is not None:
            logger.warning("unrecognised nvpmodel status %r under %s", status[:80], root)
        return None, None
    mode_id = int(match.group(1))
    conf = _read_text(root, "etc/nvpmodel.conf") or ""
    for block in _POWER_MODEL_RE.finditer(conf):
        attrs = dict(re.findall(r"(\w+)=([^\s>]+)", block.group(1)))
        if attrs.get("ID", "").isdigit() and int(attrs["ID"]) == mode_id and "NAME" in attrs:
            name = attrs["NAME"].upper()
            return mode_id, name.removeprefix("MODE_")
    return mode_id, None


def _base_profile(module: str | None, model: str, mem_total_bytes: int | None) -> str | None:
    """Return the module's base (non-mode) profile id, or None for an unknown Jetson."""
    if module is not None and module in _PART_PROFILES:
        candidates = _PART_PROFILES[module]
    else:
        by_model = next((ids for key, ids in _MODEL_PROFILES if key in model.lower()), None)
        by_board = _BOARD_PROFILES.get(module.split("-")[0]) if module else None
        if by_board and by_model:
            candidates = tuple(c for c in by_board if c in by_model) or by_board
        else:
            candidates = by_board or by_model or ()
    if not candidates:
        return None
    if mem_total_bytes is None or len(candidates) == 1:
        return candidates[0]
    # MemTotal sits below the module's nominal size (carve-outs), but module sizes step by 2x,
    # so the nearest size on a log scale is unambiguous.
    return min(candidates, key=lambda c: abs(math.log(DEVICES[c].memory_bytes / mem_total_bytes)))
