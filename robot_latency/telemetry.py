"""Per-cycle Jetson telemetry: power mode, GPU and EMC clocks, temperatures, throttling, rails.

A :class:`TelemetryReader` finds the sysfs files once, when it is built (globs and directory
listings are slow), and each :meth:`TelemetryReader.read` then only opens and reads the small
files it found, so a cycle record can carry the machine's state at a cost well under 1 ms
(median about 0.11 ms for the ~35 files of the AGX Orin fixture tree on an x86 host;
kernel-backed files on a real board cost more, see "Cost" below). Every path is taken under an
injectable ``root``, as in
:func:`robot_latency.floor.jetson.detect_jetson`, so tests run against fixture trees.

Where each value comes from (Jetson Orin, JetPack 5 = L4T r35 and JetPack 6 = L4T r36):

* power mode: ``/var/lib/nvpmodel/status`` + ``/etc/nvpmodel.conf``, parsed by
  ``detect_jetson``; the status file is re-read every cycle and the conf only when it changes.
* GPU: the devfreq node ``/sys/class/devfreq/<addr>.<gpu>`` whose name ends in ``ga10b``
  (Orin, JetPack 5), ``gpu`` (JetPack 6), ``gv11b`` or ``gp10b``: ``cur_freq`` and
  ``max_freq`` in Hz, ``available_frequencies`` (read once, for the hardware maximum). Load is
  ``<device>/load`` in per-mille, found through the node's ``device`` link or at
  ``/sys/devices/platform/bus@0/17000000.gpu/load`` (JetPack 6) or
  ``/sys/devices/17000000.ga10b/load`` (JetPack 5).
* EMC: ``/sys/kernel/debug/bpmp/debug/clk/emc/rate`` in Hz (debugfs: root only). Load from the
  activity monitor, ``/sys/kernel/actmon_avg_activity/mc_all`` (JetPack 5) or
  ``/sys/kernel/debug/cactmon/mc_all`` (JetPack 6), in kHz of activity:
  ``load % = 100 * mc_all / rate_kHz`` (unit inferred from public tools, not from NVIDIA docs;
  see test/test_telemetry.py).
* temperatures: ``/sys/class/thermal/thermal_zone*/{type,temp}``, millidegrees C, keyed by
  type (``cpu-thermal``, ``gpu-thermal``, ``tj-thermal``...). A zone that reads -256 C (BPMP's
  "sensor offline", e.g. the CV zones on an Orin Nano), empty or unreadable is left out.
* throttling, from four sources (``throttle_reasons`` names each that fired):
  ``cooling:<type>=<cur>/<max>``, a cooling device other than a fan
  (``/sys/class/thermal/cooling_device*``) with ``cur_state`` > 0;
  ``gpu_capped:<max_freq_hz><<cap_hz>``, the GPU devfreq ``max_freq`` below what the power mode
  allows (the mode's ``GPU MAX_FREQ`` in nvpmodel.conf, else the hardware maximum): thermal
  capping or a manual cap, never the power mode itself;
  ``trip:<zone>=<temp_c>>=<trip_c>``, a zone at or above its lowest ``passive`` trip point
  (``active`` trips run the fan and are not throttling);
  ``over_current:oc<n>+<events>``, a ``soctherm_oc`` hwmon counter (``oc<n>_event_cnt``,
  cumulative) that rose since the previous read, for an event whose ``oc<n>_throt_en`` is 1.
  ``throttled`` is None when none of the four could be checked.
* power rails: INA3221 hwmon under ``/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*``:
  ``in<n>_label``, ``in<n>_input`` (mV) and ``curr<n>_input`` (mA) for channels 1-3; rails
  labelled ``NC`` (not connected) are skipped. ``power_mw = mV * mA / 1000``.

Failure: ``read()`` never raises. A file that vanishes or holds garbage makes its field None (or
drops its key from a dict) and is logged at debug level once per path.

Non-Jetson machines: :func:`telemetry_reader` returns None. A :class:`TelemetryReader` built
there anyway has ``available`` False and its ``read()`` returns an empty record (every value
None, dicts empty) rather than None, so callers handle one type.

Cost: a read is about 30-40 ``open``/``read``/``close`` calls of a few bytes each. On a board,
thermal zones and the ``soctherm_oc`` counters are answered by the BPMP firmware over IPC, so
they cost more than a plain file; ``read_cost_ns`` records what each read actually took.

The reader keeps the previous over-current counts and the set of paths already logged, so one
reader belongs to one thread.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from robot_latency.clock import DEFAULT_CLOCK, Clock

# read_text follows nvpmodel.conf's absolute symlink inside `root`, as detection does.
from robot_latency.floor.jetson import detect_jetson, read_text

__all__ = ["JetsonTelemetry", "TelemetryReader", "telemetry_reader"]

logger = logging.getLogger(__name__)

# Devfreq node names end in the GPU's device-tree name: ga10b (Orin, JetPack 5), gpu (JetPack 6),
# gv11b (Xavier), gp10b (TX2). jetson_stats' find_igpu() accepts the same four.
_GPU_NAMES = ("ga10b", "gpu", "gv11b", "gp10b")
_GPU_LOAD_FALLBACKS = (
    "sys/devices/platform/bus@0/17000000.gpu/load",  # JetPack 6
    "sys/devices/17000000.ga10b/load",  # JetPack 5
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/gpu.0/load",  # older Jetsons
)
_EMC_RATE = "sys/kernel/debug/bpmp/debug/clk/emc/rate"
_EMC_ACTIVITY = (
    "sys/kernel/actmon_avg_activity/mc_all",  # JetPack 5
    "sys/kernel/debug/cactmon/mc_all",  # JetPack 6
)
_NVPMODEL_STATUS = "var/lib/nvpmodel/status"
_NVPMODEL_CONF = "etc/nvpmodel.conf"
# BPMP reports a sensor that is off (e.g. Orin Nano's CV zones) as -256 C.
_OFFLINE_C = -256.0
_INA3221_CHANNELS = (1, 2, 3)  # in4-6 are shunt voltages, in7 their sum
_OC_EVENTS = (1, 2, 3)  # soctherm_oc: under-voltage, average and instantaneous over-current
_POWER_MODEL_RE = re.compile(r"<\s*POWER_MODEL\b([^>]*)>([^<]*)", re.DOTALL)
_GPU_MAX_FREQ_RE = re.compile(r"^\s*GPU\s+MAX_FREQ\s+(-?\d+)", re.MULTILINE)
_INDEX_RE = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class JetsonTelemetry:
    """One read of the Jetson's power, clock, thermal and throttle state; unknown values are None.

    Frequencies are in Hz, loads in percent (0-100), temperatures in degrees C, rail power in
    mW. ``read_ns`` is the clock reading when the read began and ``read_cost_ns`` how long it took.
    """

    power_mode: str | None = None
    gpu_freq_hz: int | None = None
    gpu_max_freq_hz: int | None = None
    gpu_load_pct: float | None = None
    emc_freq_hz: int | None = None
    emc_load_pct: float | None = None
    temperatures_c: dict[str, float] = field(default_factory=dict)
    throttled: bool | None = None
    throttle_reasons: tuple[str, ...] = ()
    power_mw: dict[str, float] = field(default_factory=dict)
    read_ns: int | None = None
    read_cost_ns: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-ready dict."""
        out = asdict(self)
        out["throttle_reasons"] = list(self.throttle_reasons)
        return out


@dataclass(frozen=True)
class _Gpu:
    cur_freq: str
    max_freq: str
    load: str | None
    hw_max_hz: int | None  # highest of available_frequencies, read once


@dataclass(frozen=True)
class _Zone:
    name: str
    temp: str
    passive_trip_c: float | None  # lowest passive trip, read once


@dataclass(frozen=True)
class _Cooling:
    type: str
    cur_state: str
    max_state: int | None


@dataclass(frozen=True)
class _Rail:
    name: str
    millivolts: str
    milliamps: str


@dataclass(frozen=True)
class _OcEvent:
    name: str  # "oc1"
    event_cnt: str


class TelemetryReader:
    """Read Jetson telemetry each cycle from files found once under ``root``.

    Args:
        root: the filesystem root to read under ("/" on a Jetson, a fixture tree in tests).
        clock: integer-nanosecond monotonic clock for ``read_ns`` and ``read_cost_ns``.
    """

    def __init__(self, root: Path = Path("/"), *, clock: Clock = DEFAULT_CLOCK) -> None:
        self.root = Path(root)
        self._clock = clock
        self._logged: set[str] = set()
        # nvpmodel status text -> (mode name, the mode's GPU cap in Hz or None for "no cap")
        self._mode_cache: tuple[str, str | None, int | None] | None = None
        info = detect_jetson(self.root)
        self._available = info is not None
        self._status = self._path(_NVPMODEL_STATUS)
        self._gpu: _Gpu | None = None
        self._emc_rate: str | None = None
        self._emc_activity: str | None = None
        self._zones: tuple[_Zone, ...] = ()
        self._cooling: tuple[_Cooling, ...] = ()
        self._rails: tuple[_Rail, ...] = ()
        self._oc: tuple[_OcEvent, ...] = ()
        self._oc_last: dict[str, int] = {}
        if self._available:
            self._discover()

    @property
    def available(self) -> bool:
        """Return True if ``root`` is a Jetson (detected from its device tree)."""
        return self._available

    def read(self) -> JetsonTelemetry:
        """Return the current telemetry; never raises.

        On a non-Jetson every value is None and the dicts are empty.
        """
        start_ns = self._clock()
        if not self._available:
            return JetsonTelemetry(read_ns=start_ns, read_cost_ns=self._clock() - start_ns)
        try:
            record = self._read(start_ns)
        except Exception:  # a bug here must not abort the run: log it, return an empty record
            logger.exception("telemetry read under %s failed", self.root)
            record = JetsonTelemetry()
        return replace(record, read_ns=start_ns, read_cost_ns=self._clock() - start_ns)

    # ---------------------------------------------------------------------------------------
    # Discovery (once)
    # ---------------------------------------------------------------------------------------

    def _path(self, relative: str) -> str:
        return os.path.join(self.root, relative)

    def _discover(self) -> None:
        self._gpu = self._find_gpu()
        rate = self._path(_EMC_RATE)
        self._emc_rate = rate if _readable(rate) else None
        self._emc_activity = next((p for p in map(self._path, _EMC_ACTIVITY) if _readable(p)), None)
        self._zones = tuple(self._find_zones())
        self._cooling = tuple(self._find_cooling())
        self._rails = tuple(self._find_rails())
        self._oc = tuple(self._find_oc_events())
        self._power_mode()  # parse nvpmodel.conf now, not in the first cycle
        self._oc_last = {}
        for event in self._oc:
            count = self._int(event.event_cnt)
            if count is not None:
                self._oc_last[event.name] = count
        logger.debug(
            "telemetry under %s: gpu=%s emc_rate=%s emc_activity=%s zones=%d cooling=%d "
            "rails=%d oc_events=%d",
            self.root,
            self._gpu,
            self._emc_rate,
            self._emc_activity,
            len(self._zones),
            len(self._cooling),
            len(self._rails),
            len(self._oc),
        )

    def _find_gpu(self) -> _Gpu | None:
        devfreq = Path(self._path("sys/class/devfreq"))
        for node in _sorted_by_index(devfreq.glob("*")):
            if node.name.rsplit(".", 1)[-1] not in _GPU_NAMES:
                continue
            cur, top = str(node / "cur_freq"), str(node / "max_freq")
            if not (_readable(cur) and _readable(top)):
                continue
            load = str(node / "device" / "load")
            if not _readable(load):
                load = next((p for p in map(self._path, _GPU_LOAD_FALLBACKS) if _readable(p)), None)
            hw_max = None
            table = _read(str(node / "available_frequencies"))
            if table is not None:
                freqs = [int(f) for f in table.split() if f.isdigit()]
                hw_max = max(freqs) if freqs else None
            return _Gpu(cur_freq=cur, max_freq=top, load=load, hw_max_hz=hw_max)
        return None

    def _find_zones(self) -> Iterable[_Zone]:
        seen: set[str] = set()
        thermal = Path(self._path("sys/class/thermal"))
        for zone in _sorted_by_index(thermal.glob("thermal_zone*")):
            kind = _read(str(zone / "type"))
            temp = str(zone / "temp")
            if kind is None or not kind.strip() or not _readable(temp):
                continue
            name = kind.strip().decode("utf-8", errors="replace")
            if name in seen:  # two zones of one type: tell them apart by their directory
                name = f"{name}:{zone.name}"
            seen.add(name)
            yield _Zone(name=name, temp=temp, passive_trip_c=self._passive_trip_c(zone))

    def _passive_trip_c(self, zone: Path) -> float | None:
        trips = []
        for trip_type in zone.glob("trip_point_*_type"):
            if (_read(str(trip_type)) or b"").strip() != b"passive":
                continue
            temp_path = str(trip_type)[: -len("_type")] + "_temp"
            milli = self._int(temp_path)
            if milli is not None:
                trips.append(milli / 1000.0)
        return min(trips) if trips else None

    def _find_cooling(self) -> Iterable[_Cooling]:
        thermal = Path(self._path("sys/class/thermal"))
        for device in _sorted_by_index(thermal.glob("cooling_device*")):
            kind = (_read(str(device / "type")) or b"").strip().decode("utf-8", errors="replace")
            cur = str(device / "cur_state")
            # A fan spinning up is cooling, not throttling.
            if not kind or "fan" in kind.lower() or not _readable(cur):
                continue
            yield _Cooling(type=kind, cur_state=cur, max_state=self._int(str(device / "max_state")))

    def _find_rails(self) -> Iterable[_Rail]:
        drivers = Path(self._path("sys/bus/i2c/drivers/ina3221"))
        for hwmon in sorted(drivers.glob("*/hwmon/hwmon*")):
            for n in _INA3221_CHANNELS:
                label = (_read(str(hwmon / f"in{n}_label")) or b"").strip()
                mv, ma = str(hwmon / f"in{n}_input"), str(hwmon / f"curr{n}_input")
                if not label or label == b"NC" or not (_readable(mv) and _readable(ma)):
                    continue
                yield _Rail(
                    name=label.decode("utf-8", errors="replace"), millivolts=mv, milliamps=ma
                )

    def _find_oc_events(self) -> Iterable[_OcEvent]:
        hwmon_class = Path(self._path("sys/class/hwmon"))
        for hwmon in _sorted_by_index(hwmon_class.glob("hwmon*")):
            if (_read(str(hwmon / "name")) or b"").strip() != b"soctherm_oc":
                continue
            for n in _OC_EVENTS:
                count = str(hwmon / f"oc{n}_event_cnt")
                enabled = _read(str(hwmon / f"oc{n}_throt_en"))
                if _readable(count) and (enabled is None or enabled.strip() == b"1"):
                    yield _OcEvent(name=f"oc{n}", event_cnt=count)

    # ---------------------------------------------------------------------------------------
    # Per-cycle read
    # ---------------------------------------------------------------------------------------

    def _read(self, start_ns: int) -> JetsonTelemetry:
        power_mode, gpu_mode_cap_hz = self._power_mode()
        reasons: list[str] = []
        checked = False

        gpu_freq = gpu_max = None
        gpu_load = None
        if self._gpu is not None:
            gpu_freq = self._int(self._gpu.cur_freq)
            gpu_max = self._int(self._gpu.max_freq)
            if self._gpu.load is not None:
                per_mille = self._int(self._gpu.load)
                gpu_load = None if per_mille is None else per_mille / 10.0
            cap = _allowed_gpu_max(gpu_mode_cap_hz, self._gpu.hw_max_hz)
            if gpu_max is not None and cap is not None:
                checked = True
                if gpu_max < cap:
                    reasons.append(f"gpu_capped:{gpu_max}<{cap}")

        emc_freq = self._int(self._emc_rate) if self._emc_rate else None
        emc_load = None
        if self._emc_activity is not None and emc_freq:
            activity_khz = self._int(self._emc_activity)
            if activity_khz is not None:
                emc_load = 100.0 * activity_khz / (emc_freq / 1000.0)

        temperatures: dict[str, float] = {}
        for zone in self._zones:
            milli = self._int(zone.temp)
            if milli is None:
                continue
            temp_c = milli / 1000.0
            if temp_c <= _OFFLINE_C:
                self._log_once(zone.temp, "reads %.1f C: sensor offline", temp_c)
                continue
            temperatures[zone.name] = temp_c
            if zone.passive_trip_c is not None:
                checked = True
                if temp_c >= zone.passive_trip_c:
                    reasons.append(f"trip:{zone.name}={temp_c:g}>={zone.passive_trip_c:g}")

        for device in self._cooling:
            state = self._int(device.cur_state)
            if state is None:
                continue
            checked = True
            if state > 0:
                top = "?" if device.max_state is None else str(device.max_state)
                reasons.append(f"cooling:{device.type}={state}/{top}")

        for event in self._oc:
            count = self._int(event.event_cnt)
            if count is None:
                continue
            checked = True
            before = self._oc_last.get(event.name)
            self._oc_last[event.name] = count
            if before is not None and count > before:
                reasons.append(f"over_current:{event.name}+{count - before}")

        power: dict[str, float] = {}
        for rail in self._rails:
            mv, ma = self._int(rail.millivolts), self._int(rail.milliamps)
            if mv is not None and ma is not None:
                power[rail.name] = mv * ma / 1000.0

        return JetsonTelemetry(
            power_mode=power_mode,
            gpu_freq_hz=gpu_freq,
            gpu_max_freq_hz=gpu_max,
            gpu_load_pct=gpu_load,
            emc_freq_hz=emc_freq,
            emc_load_pct=emc_load,
            temperatures_c=temperatures,
            throttled=bool(reasons) if checked or reasons else None,
            throttle_reasons=tuple(reasons),
            power_mw=power,
            read_ns=start_ns,
        )

    def _power_mode(self) -> tuple[str | None, int | None]:
        """Return (mode name, the mode's GPU cap in Hz or None), re-parsing only on a change."""
        status = _read(self._status)
        text = "" if status is None else status.decode("utf-8", errors="replace")
        if self._mode_cache is None or self._mode_cache[0] != text:
            info = detect_jetson(self.root) if text else None
            name = info.power_mode if info is not None else None
            mode_id = info.power_mode_id if info is not None else None
            self._mode_cache = (text, name, self._gpu_mode_cap_hz(mode_id))
        return self._mode_cache[1], self._mode_cache[2]

    def _gpu_mode_cap_hz(self, mode_id: int | None) -> int | None:
        """Return the mode's GPU MAX_FREQ from nvpmodel.conf; None if absent or -1 (no cap)."""
        if mode_id is None:
            return None
        conf = read_text(self.root, _NVPMODEL_CONF) or ""
        for block in _POWER_MODEL_RE.finditer(conf):
            attrs = dict(re.findall(r"(\w+)=([^\s>]+)", block.group(1)))
            if attrs.get("ID", "").isdigit() and int(attrs["ID"]) == mode_id:
                match = _GPU_MAX_FREQ_RE.search(block.group(2))
                cap = int(match.group(1)) if match else -1
                return cap if cap > 0 else None
        return None

    def _int(self, path: str) -> int | None:
        """Return the file's integer content, or None (logged once) if it is gone or garbage."""
        data = _read(path)
        if data is None:
            self._log_once(path, "unreadable")
            return None
        try:
            return int(data.split()[0])
        except (ValueError, IndexError):
            self._log_once(path, "holds %r, not an integer", data[:40])
            return None

    def _log_once(self, path: str, message: str, *args: object) -> None:
        if path not in self._logged:
            self._logged.add(path)
            logger.debug("telemetry: %s " + message, path, *args)


def telemetry_reader(
    root: Path = Path("/"), *, clock: Clock = DEFAULT_CLOCK
) -> TelemetryReader | None:
    """Return a reader for the Jetson under ``root``, or None if it is not a Jetson.

    Args:
        root: the filesystem root to read under.
        clock: integer-nanosecond monotonic clock for the record's timing fields.

    Returns:
        A TelemetryReader whose files have been found, or None on any other machine.
    """
    reader = TelemetryReader(root, clock=clock)
    return reader if reader.available else None


def _read(path: str) -> bytes | None:
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


def _readable(path: str) -> bool:
    return os.access(path, os.R_OK) and os.path.isfile(path)


def _sorted_by_index(paths: Iterable[Path]) -> list[Path]:
    """Sort thermal_zone2 before thermal_zone10."""

    def key(p: Path) -> tuple[int, str]:
        match = _INDEX_RE.search(p.name)
        return (int(match.group(1)) if match else -1, p.name)

    return sorted(paths, key=key)


def _allowed_gpu_max(mode_cap_hz: int | None, hw_max_hz: int | None) -> int | None:
    """Return the GPU max the power mode allows: its cap, bounded by the hardware maximum."""
    caps = [c for c in (mode_cap_hz, hw_max_hz) if c is not None]
    return min(caps) if caps else None
