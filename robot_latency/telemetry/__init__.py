"""Per-cycle Jetson telemetry: power mode, GPU and EMC clocks, temperatures, throttling, rails.

The package holds the record (:mod:`.record`), where each source's files are found
(:mod:`.sources`) and the per-cycle reader (:mod:`.reader`); this module gathers their names.

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

from robot_latency.telemetry.reader import TelemetryReader, telemetry_reader
from robot_latency.telemetry.record import JetsonTelemetry

__all__ = ["JetsonTelemetry", "TelemetryReader", "telemetry_reader"]
