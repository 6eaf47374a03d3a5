"""The host probe: this machine's memory read bandwidth and matmul rate, measured and cached.

The figures are measured once per machine and probe version and cached as JSON (see
``default_cache_path``). The matmul rate is a sustained float32 figure, not a peak: it is the
"host" datasheet's compute figure for predictions, never for a floor (docs/REFERENCE.md, "The
latency model").
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
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

from robot_latency.floor.devices import HOST_ID, DeviceSheet
from robot_latency.floor.errors import ProbeError

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "PROBE_VERSION",
    "HostProbe",
    "default_cache_path",
    "load_or_probe_host",
    "probe_host",
]

logger = logging.getLogger(__name__)

PROBE_VERSION = 2
#: A cached probe taken while the 1-minute load average was above this many runnable tasks per
#: core is not reused: other work shared the memory bus, so the bandwidth it read is too low and
#: a floor from it could exceed a measurement. The next call probes again.
BUSY_LOAD_PER_CORE = 0.5
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
    load_avg_1m: float

    def to_sheet(self) -> DeviceSheet:
        """Return this measurement as the "host" datasheet."""
        return DeviceSheet(
            id=HOST_ID,
            name=f"This host ({self.cpu_model}, {self.cpu_cores} cores)",
            bandwidth_gbps=self.bandwidth_gbps,
            memory_bytes=self.memory_bytes,
            # A CPU host has no FP16 tensor peak; the measured float32 matmul rate stands in
            # for it in prefill *predictions*. It is not a peak (llama.cpp's quantized kernels
            # beat numpy's float32 matmul), so it never gives a prefill floor.
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
            flops_is_peak=False,
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
                low_ok = f.name == "load_avg_1m" and isinstance(value, (int, float)) and value == 0
                if (not isinstance(value, (int, float)) or not math.isfinite(value)
                        or (value <= 0 and not low_ok)):
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
    load_avg = os.getloadavg()[0]
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
        load_avg_1m=round(load_avg, 2),
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
) -> DeviceSheet:
    """Return the host datasheet from the cache, probing (and caching) when it is absent or stale.

    A cache counts only for the machine and probe version that wrote it. A corrupt cache is
    reported and replaced; an unwritable cache is reported and the fresh probe still returned.
    The probe keywords are passed to probe_host().
    """
    path = cache_path if cache_path is not None else default_cache_path()
    if not refresh:
        cached = _read_cached_probe(path)
        if cached is not None:
            logger.debug("host datasheet from cache %s (probed %s)", path, cached.probed_at)
            return cached.to_sheet()
    probe = probe_host(buffer_bytes=buffer_bytes, repeats=repeats, threads=threads)
    _write_cache(path, probe)
    return probe.to_sheet()


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
        data = json.loads(text)
        if isinstance(data, dict) and data.get("probe_version") != PROBE_VERSION:
            logger.info("host probe cache %s was written by probe v%s, not v%d; probing again",
                        path, data.get("probe_version"), PROBE_VERSION)
            return None
        probe = HostProbe.from_dict(data)
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
    if probe.load_avg_1m > BUSY_LOAD_PER_CORE * probe.cpu_cores:
        logger.info("host probe cache %s was taken on a busy host (load %.2f on %d cores); "
                    "probing again", path, probe.load_avg_1m, probe.cpu_cores)
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
