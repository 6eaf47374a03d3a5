"""Tests for robot_latency.telemetry: per-cycle Jetson telemetry read from a fixture sysfs tree.

The fixture trees under test/fixtures/jetson-telemetry/ are small, hand-written copies of what a
Jetson Orin exposes. Device tree, meminfo and nvpmodel files are copied from the detection
fixtures (test/fixtures/jetson/agx-orin-64gb-maxn and orin-nano-8gb-super). Where each other
path and its unit come from:

* GPU devfreq ``/sys/class/devfreq/17000000.ga10b`` -> ``/sys/devices/17000000.ga10b/devfreq/
  17000000.ga10b/{cur_freq,max_freq,min_freq,available_frequencies}`` in Hz (JetPack 5): the
  ``PARAM TYPE=CLOCK NAME=GPU`` block of L4T r35's Orin nvpmodel conf, and rbonghi/jetson_stats
  ``jtop/core/gpu.py`` (find_igpu: devfreq nodes named ga10b/gpu/gv11b/gp10b; igpu_read_freq:
  Hz, divided by 1000 for kHz). JetPack 6 names the node ``17000000.gpu`` under
  ``/sys/devices/platform/bus@0/`` (several public monitoring scripts read
  ``/sys/devices/platform/bus@0/17000000.gpu/load`` and ``/sys/class/devfreq/17000000.gpu``).
* GPU load ``<gpu device>/load``, per-mille: jetson_stats ``igpu_read_status`` (load / 10 = %).
* EMC ``/sys/kernel/debug/bpmp/debug/clk/emc/rate`` in Hz: jetson_stats ``jtop/core/memory.py``
  read_emc (and jetson_clocks' EMC_CUR_FREQ for tegra186/194/234, jetson_stats issue #323).
  EMC activity ``/sys/kernel/actmon_avg_activity/mc_all`` (JetPack 5) and
  ``/sys/kernel/debug/cactmon/mc_all`` (JetPack 6, jetson_stats PR #471). Unit: kHz of
  activity, load % = mc_all / rate_MHz / 10 as MangoHud's Jetson code computes it; jetson_stats
  divides by rate_kHz only and shows 0% on Orin (its issue #715), which is 100x too small.
* thermal zones ``/sys/class/thermal/thermal_zone*/{type,temp}``, millidegrees C: kernel
  Documentation/thermal/sysfs-api; zone names cpu-, gpu-, cv0-2-, soc0-2-, tj-thermal from the
  mainline tegra234.dtsi BPMP thermal-zones patch; tj-thermal's active trips at 85/105 C from
  tegra234-p3701-0008.dtsi; passive "sw-throttle" trips at 99 C from the tegra234 soc*-thermal
  patch; -256 C for an offline sensor from jetson_stats ``TEMPERATURE_OFFLINE`` and tegrastats.
* cooling devices ``/sys/class/thermal/cooling_device*/{type,cur_state,max_state}``: kernel
  sysfs-api; type names ``cpufreq-<cpu>`` (drivers/thermal/cpufreq_cooling.c) and
  ``devfreq-<dev>`` (drivers/thermal/devfreq_cooling.c); ``pwm-fan`` for the Jetson fan.
* over-current ``/sys/class/hwmon/hwmon*/{name=soctherm_oc, oc{1,2,3}_throt_en,
  oc{1,2,3}_event_cnt}``: NVIDIA's tegra23x_oc_event driver (hwmon name "soctherm_oc",
  cumulative counters read from BPMP MRQ_OC_STATUS).
* rails ``/sys/bus/i2c/drivers/ina3221/1-004{0,1}/hwmon/hwmon*/{in<n>_label,in<n>_input (mV),
  curr<n>_input (mA)}``: jetson_stats ``jtop/core/power.py`` (skips "NC" labels and channel 7);
  AGX Orin labels VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 on 0x40 and VDDQ_VDD2_1V8AO on 0x41 from
  the mainline tegra234-p3701.dtsi power-sensor nodes and tegrastats output.

Not verified on hardware: the exact GPU frequency tables, and whether L4T registers a devfreq
cooling device for the GPU (the throttled fixture has one; the reader only relies on the type).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.telemetry import JetsonTelemetry, TelemetryReader, telemetry_reader

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "jetson-telemetry"
DETECT_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "jetson"

AGX_GPU = "sys/devices/17000000.ga10b"
AGX_DEVFREQ = f"{AGX_GPU}/devfreq/17000000.ga10b"
AGX_RAILS = {  # mV * mA / 1000
    "VDD_GPU_SOC": 4984 * 625 / 1000,  # 3115.0
    "VDD_CPU_CV": 4984 * 875 / 1000,  # 4361.0
    "VIN_SYS_5V0": 4968 * 1000 / 1000,  # 4968.0
    "VDDQ_VDD2_1V8AO": 4984 * 250 / 1000,  # 1246.0
}


def _copy(case: str, tmp_path: Path) -> Path:
    """Return a writable copy of a fixture tree (links kept, as sysfs has them)."""
    root = tmp_path / case
    shutil.copytree(FIXTURES / case, root, symlinks=True)
    return root


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Each fixture read gives the hand-written values
# ---------------------------------------------------------------------------------------------


def test_agx_orin_maxn_normal_state() -> None:
    reader = telemetry_reader(FIXTURES / "agx-orin-maxn")
    assert reader is not None and reader.available
    t = reader.read()
    assert t.power_mode == "MAXN"
    assert t.gpu_freq_hz == 1_300_500_000
    assert t.gpu_max_freq_hz == 1_300_500_000
    assert t.gpu_load_pct == pytest.approx(31.2)  # 312 per-mille
    assert t.emc_freq_hz == 3_199_000_000
    assert t.emc_load_pct == pytest.approx(25.0)  # 799750 kHz of 3199000 kHz
    assert t.temperatures_c == {
        "cpu-thermal": 52.5,
        "gpu-thermal": 50.031,
        "cv0-thermal": 49.5,
        "soc0-thermal": 48.843,
        "tj-thermal": 52.5,
    }
    # The fan at 3/10 is cooling, not throttling; no passive trip reached; GPU at the mode's max.
    assert t.throttled is False
    assert t.throttle_reasons == ()
    assert t.power_mw == pytest.approx(AGX_RAILS)
    assert t.read_ns is not None and t.read_cost_ns is not None and t.read_cost_ns >= 0


def test_agx_orin_throttled_state() -> None:
    reader = telemetry_reader(FIXTURES / "agx-orin-throttled")
    assert reader is not None
    t = reader.read()
    assert t.power_mode == "MAXN"
    assert t.gpu_freq_hz == 816_000_000
    assert t.gpu_max_freq_hz == 816_000_000
    assert t.gpu_load_pct == pytest.approx(99.8)
    assert t.emc_load_pct == pytest.approx(90.0)  # 2879100 kHz of 3199000 kHz
    assert t.temperatures_c["tj-thermal"] == 101.5
    assert t.temperatures_c["cpu-thermal"] == 99.5
    assert t.throttled is True
    assert t.throttle_reasons == (
        # MAXN's GPU MAX_FREQ is -1, so the cap is the top of available_frequencies.
        "gpu_capped:816000000<1300500000",
        # cpu-thermal's passive trip is 99 C; tj-thermal's trips are active (fan) only.
        "trip:cpu-thermal=99.5>=99",
        "cooling:cpufreq-cpu0=15/15",
        "cooling:devfreq-17000000.ga10b=4/10",
    )
    # The over-current counters (2 and 27 events) were already there when the reader started.
    assert not any(r.startswith("over_current") for r in t.throttle_reasons)


def test_orin_nano_minimal_tree() -> None:
    reader = telemetry_reader(FIXTURES / "orin-nano-minimal")
    assert reader is not None
    t = reader.read()
    assert t.power_mode == "15W"
    # JetPack 6 node name; load found at the platform/bus@0 path (no device link in this tree).
    assert t.gpu_freq_hz == 612_000_000
    assert t.gpu_max_freq_hz == 612_000_000
    assert t.gpu_load_pct == pytest.approx(87.5)
    assert t.emc_freq_hz is None  # no debugfs
    assert t.emc_load_pct is None
    # cv0-thermal reads -256 C (sensor offline) and tj-thermal reads empty: both left out.
    assert t.temperatures_c == {"cpu-thermal": 45.031, "gpu-thermal": 44.5, "soc0-thermal": 45.5}
    # 612 MHz is below the hardware's 1020 MHz but is exactly what 15W allows: not throttled.
    assert t.throttled is False
    assert t.throttle_reasons == ()
    assert t.power_mw == {}


def test_to_dict_is_json_ready() -> None:
    reader = telemetry_reader(FIXTURES / "agx-orin-throttled")
    assert reader is not None
    d = reader.read().to_dict()
    assert set(d) == {
        "power_mode",
        "gpu_freq_hz",
        "gpu_max_freq_hz",
        "gpu_load_pct",
        "emc_freq_hz",
        "emc_load_pct",
        "temperatures_c",
        "throttled",
        "throttle_reasons",
        "power_mw",
        "read_ns",
        "read_cost_ns",
    }
    assert isinstance(d["throttle_reasons"], list)
    assert json.loads(json.dumps(d, allow_nan=False)) == d


def test_read_timing_comes_from_the_injected_clock() -> None:
    clock = ScriptedClock(1_000, steps_ns=[250, 0])
    reader = TelemetryReader(FIXTURES / "agx-orin-maxn", clock=clock)
    t = reader.read()
    assert t.read_ns == 1_000
    assert t.read_cost_ns == 250


# ---------------------------------------------------------------------------------------------
# Missing files and garbage
# ---------------------------------------------------------------------------------------------


def test_files_missing_at_discovery_leave_fields_none(tmp_path: Path) -> None:
    root = _copy("agx-orin-maxn", tmp_path)
    (root / AGX_DEVFREQ / "cur_freq").unlink()  # no GPU node without cur_freq
    shutil.rmtree(root / "sys/kernel")  # no EMC
    shutil.rmtree(root / "sys/bus")  # no rails
    (root / "var/lib/nvpmodel/status").unlink()
    t = TelemetryReader(root).read()
    assert t.power_mode is None
    assert (t.gpu_freq_hz, t.gpu_max_freq_hz, t.gpu_load_pct) == (None, None, None)
    assert (t.emc_freq_hz, t.emc_load_pct) == (None, None)
    assert t.power_mw == {}
    assert t.temperatures_c["tj-thermal"] == 52.5  # what is there is still read


def test_files_vanishing_after_discovery_give_none(tmp_path: Path) -> None:
    root = _copy("agx-orin-maxn", tmp_path)
    reader = TelemetryReader(root)
    (root / AGX_DEVFREQ / "cur_freq").unlink()
    (root / AGX_GPU / "load").unlink()
    (root / "sys/kernel/debug/bpmp/debug/clk/emc/rate").unlink()
    (root / "sys/class/thermal/thermal_zone4/temp").unlink()
    (root / "sys/bus/i2c/drivers/ina3221/1-0041/hwmon/hwmon4/curr2_input").unlink()
    t = reader.read()
    assert t.gpu_freq_hz is None
    assert t.gpu_max_freq_hz == 1_300_500_000
    assert t.gpu_load_pct is None
    assert t.emc_freq_hz is None
    assert t.emc_load_pct is None  # the load needs the rate
    assert "tj-thermal" not in t.temperatures_c
    assert "VDDQ_VDD2_1V8AO" not in t.power_mw
    assert t.power_mw["VDD_GPU_SOC"] == pytest.approx(3115.0)


@pytest.mark.parametrize("garbage", ["", "garbage\n", "\xff\xfe", "12abc\n", "-\n"])
def test_garbage_gives_none_without_raising(tmp_path: Path, garbage: str) -> None:
    root = _copy("agx-orin-throttled", tmp_path)
    reader = TelemetryReader(root)
    for relative in (
        f"{AGX_DEVFREQ}/cur_freq",
        f"{AGX_DEVFREQ}/max_freq",
        f"{AGX_GPU}/load",
        "sys/kernel/actmon_avg_activity/mc_all",
        "sys/class/thermal/thermal_zone0/temp",
        "sys/class/thermal/cooling_device1/cur_state",
        "sys/class/hwmon/hwmon5/oc3_event_cnt",
        "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3/in1_input",
    ):
        _write(root, relative, garbage)
    t = reader.read()
    assert (t.gpu_freq_hz, t.gpu_max_freq_hz, t.gpu_load_pct) == (None, None, None)
    assert t.emc_freq_hz == 3_199_000_000
    assert t.emc_load_pct is None
    assert "cpu-thermal" not in t.temperatures_c
    assert "VDD_GPU_SOC" not in t.power_mw
    # What is left still decides: the GPU devfreq cooling device at 4/10.
    assert t.throttled is True
    assert t.throttle_reasons == ("cooling:devfreq-17000000.ga10b=4/10",)


def test_bad_file_is_logged_once_at_debug(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _copy("agx-orin-maxn", tmp_path)
    reader = TelemetryReader(root)
    _write(root, f"{AGX_DEVFREQ}/cur_freq", "garbage\n")
    with caplog.at_level(logging.DEBUG, logger="robot_latency.telemetry"):
        for _ in range(3):
            assert reader.read().gpu_freq_hz is None
    lines = [r for r in caplog.records if "cur_freq" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.DEBUG


def test_duplicate_zone_types_get_distinct_keys(tmp_path: Path) -> None:
    root = _copy("orin-nano-minimal", tmp_path)
    _write(root, "sys/class/thermal/thermal_zone7/type", "cpu-thermal\n")
    _write(root, "sys/class/thermal/thermal_zone7/temp", "46000\n")
    t = TelemetryReader(root).read()
    assert t.temperatures_c["cpu-thermal"] == 45.031
    assert t.temperatures_c["cpu-thermal:thermal_zone7"] == 46.0


def test_a_bug_in_reading_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reader = TelemetryReader(FIXTURES / "agx-orin-maxn")

    def broken(start_ns: int) -> JetsonTelemetry:
        raise RuntimeError("bug")

    monkeypatch.setattr(reader, "_read", broken)
    with caplog.at_level(logging.ERROR, logger="robot_latency.telemetry"):
        t = reader.read()
    assert t.power_mode is None and t.throttled is None and t.read_cost_ns is not None
    assert any("failed" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# Not a Jetson
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["empty", "not-jetson"])
def test_factory_returns_none_off_a_jetson(tmp_path: Path, case: str) -> None:
    root = tmp_path if case == "empty" else DETECT_FIXTURES / "not-jetson"
    assert telemetry_reader(root) is None


def test_reader_off_a_jetson_returns_an_empty_record(tmp_path: Path) -> None:
    reader = TelemetryReader(tmp_path)
    assert reader.available is False
    t = reader.read()
    assert t == JetsonTelemetry(read_ns=t.read_ns, read_cost_ns=t.read_cost_ns)
    assert t.throttled is None and t.temperatures_c == {} and t.power_mw == {}


# ---------------------------------------------------------------------------------------------
# Files are re-read every call; only discovery is cached
# ---------------------------------------------------------------------------------------------


def test_reading_twice_reflects_a_change(tmp_path: Path) -> None:
    root = _copy("agx-orin-maxn", tmp_path)
    reader = TelemetryReader(root)
    first = reader.read()
    _write(root, f"{AGX_DEVFREQ}/cur_freq", "612000000\n")
    _write(root, f"{AGX_GPU}/load", "1000\n")
    _write(root, "sys/class/thermal/thermal_zone4/temp", "61250\n")
    _write(root, "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3/curr1_input", "1250\n")
    _write(root, "sys/class/thermal/cooling_device1/cur_state", "3\n")
    second = reader.read()
    assert first.gpu_freq_hz == 1_300_500_000 and second.gpu_freq_hz == 612_000_000
    assert second.gpu_load_pct == pytest.approx(100.0)
    assert first.temperatures_c["tj-thermal"] == 52.5
    assert second.temperatures_c["tj-thermal"] == 61.25
    assert second.power_mw["VDD_GPU_SOC"] == pytest.approx(4984 * 1250 / 1000)
    assert first.throttled is False
    assert second.throttled is True
    assert second.throttle_reasons == ("cooling:cpufreq-cpu0=3/15",)


def test_a_power_mode_change_is_picked_up(tmp_path: Path) -> None:
    root = _copy("agx-orin-maxn", tmp_path)
    reader = TelemetryReader(root)
    assert reader.read().power_mode == "MAXN"
    # nvpmodel -m 1: MODE_15W caps the GPU at 408 MHz (its GPU MAX_FREQ), which is not throttling.
    _write(root, "var/lib/nvpmodel/status", "pmode:0001 fmode:quiet\n")
    _write(root, f"{AGX_DEVFREQ}/max_freq", "408000000\n")
    t = reader.read()
    assert t.power_mode == "15W"
    assert t.throttled is False
    # Below the mode's own cap is.
    _write(root, f"{AGX_DEVFREQ}/max_freq", "306000000\n")
    assert reader.read().throttle_reasons == ("gpu_capped:306000000<408000000",)


def test_over_current_events_since_the_last_read(tmp_path: Path) -> None:
    root = _copy("agx-orin-throttled", tmp_path)
    _write(root, f"{AGX_DEVFREQ}/max_freq", "1300500000\n")  # leave only the OC source
    _write(root, "sys/class/thermal/thermal_zone0/temp", "60000\n")
    _write(root, "sys/class/thermal/cooling_device1/cur_state", "0\n")
    _write(root, "sys/class/thermal/cooling_device2/cur_state", "0\n")
    reader = TelemetryReader(root)
    assert reader.read().throttle_reasons == ()
    _write(root, "sys/class/hwmon/hwmon5/oc3_event_cnt", "32\n")  # was 27
    t = reader.read()
    assert t.throttled is True
    assert t.throttle_reasons == ("over_current:oc3+5",)
    # Counters are cumulative: no new event, no reason.
    assert reader.read().throttle_reasons == ()


def test_over_current_event_with_throttling_disabled_is_ignored(tmp_path: Path) -> None:
    root = _copy("agx-orin-maxn", tmp_path)
    _write(root, "sys/class/hwmon/hwmon5/oc2_throt_en", "0\n")
    reader = TelemetryReader(root)
    _write(root, "sys/class/hwmon/hwmon5/oc2_event_cnt", "9\n")
    assert reader.read().throttle_reasons == ()


def test_new_files_after_discovery_are_not_looked_for(tmp_path: Path) -> None:
    root = _copy("orin-nano-minimal", tmp_path)
    reader = TelemetryReader(root)
    _write(root, "sys/kernel/debug/bpmp/debug/clk/emc/rate", "2133000000\n")
    assert reader.read().emc_freq_hz is None  # discovery is cached ...
    assert TelemetryReader(root).read().emc_freq_hz == 2_133_000_000  # ... until a new reader


def test_fixture_links_are_relative() -> None:
    # The fixture's sysfs links must resolve inside the tree, wherever it is copied.
    for case in ("agx-orin-maxn", "agx-orin-throttled"):
        for link in (FIXTURES / case / "sys").rglob("*"):
            if link.is_symlink():
                assert not os.path.isabs(os.readlink(link)), link
                assert link.resolve().is_relative_to(FIXTURES / case), link
