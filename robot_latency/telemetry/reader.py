"""The per-cycle telemetry reader: files found once (:mod:`.sources`), read into a record.

See the package's docstring for where each value comes from, what a failed read gives and what a
read costs.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from pathlib import Path

from robot_latency.clock import DEFAULT_CLOCK, Clock

# read_text follows nvpmodel.conf's absolute symlink inside `root`, as detection does.
from robot_latency.floor.jetson import detect_jetson, read_text
from robot_latency.telemetry.record import JetsonTelemetry
from robot_latency.telemetry.sources import (
    EMC_ACTIVITY,
    EMC_RATE,
    NVPMODEL_CONF,
    NVPMODEL_STATUS,
    OFFLINE_C,
    Cooling,
    Gpu,
    OcEvent,
    Rail,
    Zone,
    allowed_gpu_max,
    find_cooling,
    find_gpu,
    find_oc_events,
    find_rails,
    find_zones,
    read_bytes,
    readable,
)

__all__ = ["TelemetryReader", "telemetry_reader"]

logger = logging.getLogger(__name__)

_POWER_MODEL_RE = re.compile(r"<\s*POWER_MODEL\b([^>]*)>([^<]*)", re.DOTALL)
_GPU_MAX_FREQ_RE = re.compile(r"^\s*GPU\s+MAX_FREQ\s+(-?\d+)", re.MULTILINE)


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
        self._status = self._path(NVPMODEL_STATUS)
        self._gpu: Gpu | None = None
        self._emc_rate: str | None = None
        self._emc_activity: str | None = None
        self._zones: tuple[Zone, ...] = ()
        self._cooling: tuple[Cooling, ...] = ()
        self._rails: tuple[Rail, ...] = ()
        self._oc: tuple[OcEvent, ...] = ()
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
        self._gpu = find_gpu(self.root)
        rate = self._path(EMC_RATE)
        self._emc_rate = rate if readable(rate) else None
        self._emc_activity = next((p for p in map(self._path, EMC_ACTIVITY) if readable(p)), None)
        self._zones = tuple(find_zones(self.root, self._int))
        self._cooling = tuple(find_cooling(self.root, self._int))
        self._rails = tuple(find_rails(self.root))
        self._oc = tuple(find_oc_events(self.root))
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
            cap = allowed_gpu_max(gpu_mode_cap_hz, self._gpu.hw_max_hz)
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
            if temp_c <= OFFLINE_C:
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
        status = read_bytes(self._status)
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
        conf = read_text(self.root, NVPMODEL_CONF) or ""
        for block in _POWER_MODEL_RE.finditer(conf):
            attrs = dict(re.findall(r"(\w+)=([^\s>]+)", block.group(1)))
            if attrs.get("ID", "").isdigit() and int(attrs["ID"]) == mode_id:
                match = _GPU_MAX_FREQ_RE.search(block.group(2))
                cap = int(match.group(1)) if match else -1
                return cap if cap > 0 else None
        return None

    def _int(self, path: str) -> int | None:
        """Return the file's integer content, or None (logged once) if it is gone or garbage."""
        data = read_bytes(path)
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
