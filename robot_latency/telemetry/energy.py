"""Energy per cycle, measured: the module's input power integrated over each cycle's phases.

Which power is integrated (found once under a root, as the rest of the telemetry):

* Jetson Thor: the INA238 at ``/sys/bus/i2c/drivers/ina238/*/hwmon/hwmon*/power1_input`` (in
  microwatts), the whole module's input; its label from ``in1_label``, else ``VIN``.
* Orin NX and Orin Nano: the INA3221 rail labelled ``VDD_IN`` (``in<n>_input`` mV x
  ``curr<n>_input`` mA), the module's input.
* AGX Orin (no ``VDD_IN`` on its INA3221s): the sum of every connected INA3221 rail
  (``VDD_GPU_SOC``, ``VDD_CPU_CV``, ``VIN_SYS_5V0``, ``VDDQ_VDD2_1V8AO``), named so.

An :class:`EnergyMeter` reads that power on its own thread every ``period_ns`` and keeps the
samples; :func:`integrate_mj` is the trapezoid integral of a window, the power interpolated
linearly at the window's edges, and None where the samples do not reach both edges. A cycle's
energy (:func:`cycle_energy`) is the integral from the end of the previous cycle (its plan's
publish) to this plan's publish, split into the wait before the cycle started, the prefill (to
the first token), the decode (to the last token) and the rest (grammar, fallback, publish): the
records' energies add up to the run's. Where no rail is readable (any machine but a Jetson),
there is no meter, and a record says ``not measured``, never 0.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from robot_latency.telemetry.sources import find_rails, read_bytes, readable

__all__ = [
    "NOT_MEASURED",
    "EnergyMeter",
    "PowerInput",
    "PowerSample",
    "cycle_energy",
    "find_power_input",
    "integrate_mj",
    "read_power_mw",
]

log = logging.getLogger(__name__)

#: What a record's ``energy_source`` says where no rail is readable.
NOT_MEASURED = "not measured"
_INPUT_RAIL = "VDD_IN"


@dataclass(frozen=True)
class PowerInput:
    """The files whose power is integrated: ``(millivolts, milliamps)`` pairs of INA3221 rails,
    or INA238 ``power1_input`` files (microwatts); ``label`` says what they count."""

    label: str
    rails: tuple[tuple[str, str], ...] = ()
    microwatts: tuple[str, ...] = ()


def find_power_input(root: Path) -> PowerInput | None:
    """Return the module's input power files under ``root``, or None where none is readable."""
    ina238 = sorted(Path(root, "sys/bus/i2c/drivers/ina238").glob("*/hwmon/hwmon*/power1_input"))
    ina238 = [p for p in ina238 if readable(str(p))]
    if ina238:
        label = (read_bytes(str(ina238[0].parent / "in1_label")) or b"VIN").strip()
        return PowerInput(f"{label.decode('utf-8', errors='replace')} (INA238)",
                          microwatts=tuple(str(p) for p in ina238))
    rails = list(find_rails(root))
    if not rails:
        return None
    inputs = [r for r in rails if r.name == _INPUT_RAIL]
    if inputs:
        return PowerInput(_INPUT_RAIL, rails=((inputs[0].millivolts, inputs[0].milliamps),))
    return PowerInput("sum of " + "+".join(r.name for r in rails),
                      rails=tuple((r.millivolts, r.milliamps) for r in rails))


def _int(path: str) -> int | None:
    data = read_bytes(path)
    try:
        return int(data.split()[0]) if data else None
    except (ValueError, IndexError):
        return None


def read_power_mw(inp: PowerInput) -> float | None:
    """Return the input's power now in mW (None where any of its files cannot be read)."""
    total = 0.0
    for mv_path, ma_path in inp.rails:
        mv, ma = _int(mv_path), _int(ma_path)
        if mv is None or ma is None:
            return None
        total += mv * ma / 1e3
    for path in inp.microwatts:
        uw = _int(path)
        if uw is None:
            return None
        total += uw / 1e3
    return total


@dataclass(frozen=True)
class PowerSample:
    """One power reading: when (the injected clock, ns) and how much (mW)."""

    t_ns: int
    mw: float


def _at(samples: Sequence[PowerSample], times: list[int], t_ns: int) -> float:
    """The power at ``t_ns``, linear between the samples around it (``t_ns`` inside them)."""
    i = bisect.bisect_left(times, t_ns)
    if times[i] == t_ns:
        return samples[i].mw
    a, b = samples[i - 1], samples[i]
    return a.mw + (b.mw - a.mw) * (t_ns - a.t_ns) / (b.t_ns - a.t_ns)


def integrate_mj(samples: Sequence[PowerSample], start_ns: int, end_ns: int) -> float | None:
    """Return the energy over ``[start_ns, end_ns]`` in mJ (trapezoids between the samples).

    ``samples`` in time order. None where they do not reach back to ``start_ns`` and on to
    ``end_ns``: a window the meter did not see is not measured.
    """
    if end_ns < start_ns or not samples:
        return None
    if samples[0].t_ns > start_ns or samples[-1].t_ns < end_ns:
        return None
    times = [s.t_ns for s in samples]
    inside = [s for s in samples if start_ns < s.t_ns < end_ns]
    points = [(start_ns, _at(samples, times, start_ns)), *((s.t_ns, s.mw) for s in inside),
              (end_ns, _at(samples, times, end_ns))]
    mw_ns = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in pairwise(points))
    return mw_ns * 1e-9  # mW x ns = 1e-12 J = 1e-9 mJ


class EnergyMeter:
    """Reads one :class:`PowerInput` every ``period_ns`` on its own thread and keeps the samples.

    ``sample()`` takes a reading now (the thread calls it; so may a caller that needs one at a
    window's end). Samples older than ``keep_ns`` before the newest are dropped. A context
    manager: the thread runs between ``__enter__`` and ``__exit__`` (or ``start``/``close``).
    """

    def __init__(self, inp: PowerInput, *, clock: Callable[[], int],
                 period_ns: int = 5_000_000, keep_ns: int = 600_000_000_000) -> None:
        self.input = inp
        self.clock = clock
        self.period_ns = period_ns
        self.keep_ns = keep_ns
        self._samples: deque[PowerSample] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def label(self) -> str:
        """What the meter counts (a rail's label, or the sum it takes)."""
        return self.input.label

    def sample(self) -> PowerSample | None:
        """Read the power now and keep it; None where the files cannot be read."""
        mw = read_power_mw(self.input)
        t_ns = self.clock()
        if mw is None:
            return None
        s = PowerSample(t_ns, mw)
        with self._lock:
            if self._samples and t_ns < self._samples[-1].t_ns:
                return None  # a reading from a racing thread, older than the newest kept
            self._samples.append(s)
            while self._samples and self._samples[0].t_ns < t_ns - self.keep_ns:
                self._samples.popleft()
        return s

    def samples(self) -> list[PowerSample]:
        """Return a copy of the kept samples, in time order."""
        with self._lock:
            return list(self._samples)

    def energy_mj(self, start_ns: int, end_ns: int) -> float | None:
        """Return the energy over ``[start_ns, end_ns]`` (None where not covered)."""
        return integrate_mj(self.samples(), start_ns, end_ns)

    def _run(self) -> None:
        while not self._stop.wait(self.period_ns / 1e9):
            self.sample()

    def start(self) -> EnergyMeter:
        """Start the sampling thread (a second start is a bug)."""
        if self._thread is not None:
            raise RuntimeError("energy meter already started")
        self.sample()
        self._thread = threading.Thread(target=self._run, name="energy-meter", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the sampling thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> EnergyMeter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _phase_bounds(rec: Any, prev_end_ns: int | None) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """The record's window and its phases: wait, prefill, decode, rest (each [start, end])."""
    end = rec.published_ns
    began = rec.started_ns if rec.started_ns is not None else rec.scheduled_ns
    start = prev_end_ns if prev_end_ns is not None and prev_end_ns <= began else began
    phases = {"wait": (start, began)}
    cut = began
    if rec.token_ns:
        first, last = rec.token_ns[0], rec.token_ns[-1]
        phases["prefill"] = (began, first)
        phases["decode"] = (first, last)
        cut = last
    phases["rest"] = (cut, max(cut, end))
    return start, end, phases


def cycle_energy(meter: EnergyMeter | None, rec: Any, prev_end_ns: int | None) -> dict[str, Any]:
    """Return a record's energy fields: ``energy_mj``, ``energy_phases_mj``, ``energy_source``.

    The window runs from ``prev_end_ns`` (the previous plan's publish; the cycle's start where
    None) to this plan's publish. Without a meter, or a plan, or samples covering the window:
    ``energy_mj`` None and ``energy_source`` saying ``not measured``.
    """
    if meter is None:
        return {"energy_mj": None, "energy_phases_mj": None,
                "energy_source": f"{NOT_MEASURED}: no power rail readable"}
    if rec.published_ns is None:
        return {"energy_mj": None, "energy_phases_mj": None,
                "energy_source": f"{NOT_MEASURED}: nothing published"}
    start, end, phases = _phase_bounds(rec, prev_end_ns)
    samples = meter.samples()
    total = integrate_mj(samples, start, end)
    if total is None:
        return {"energy_mj": None, "energy_phases_mj": None,
                "energy_source": f"{NOT_MEASURED}: {meter.label} not sampled over the cycle"}
    parts = {name: integrate_mj(samples, a, b) for name, (a, b) in phases.items()}
    return {"energy_mj": total, "energy_phases_mj": parts, "energy_source": meter.label}
