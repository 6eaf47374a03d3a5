"""Tests for robot_latency.floor.devices: the built-in profiles and the id lookup."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from robot_latency.floor.devices import (
    DEVICES,
    DeviceSheet,
    get_device,
    list_devices,
    power_modes_of,
)
from robot_latency.floor.errors import UnknownDeviceError
from robot_latency.floor.power_modes import MODULES, modes_of

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jetson"
GB = 1_000_000_000

# Small and quick: these tests check plumbing, not the machine's real bandwidth.
FAST_PROBE = {"buffer_bytes": 4 * 2**20, "repeats": 2}

# ---------------------------------------------------------------------------------------------
# Built-in profiles, against docs/REFERENCE.md, "Jetson modules" (typed out by hand, not computed)
# ---------------------------------------------------------------------------------------------

# id: (bandwidth GB/s, memory bytes, dense FP16 TFLOPS, flops derived, cpu cores, power mode)
EXPECTED = {
    "orin-agx-64gb": (204.8, 64 * GB, 42.5, True, 12, "MAXN"),
    "orin-agx-64gb-15w": (136.5, 64 * GB, 5.0, True, 4, "15W"),
    "orin-agx-32gb": (204.8, 32 * GB, 27.0, True, 8, "MAXN"),
    "orin-agx-industrial": (204.8, 64 * GB, 39.0, True, 12, "MAXN"),
    "orin-nx-16gb": (102.4, 16 * GB, 15.0, True, 8, "MAXN"),
    "orin-nx-16gb-super": (102.4, 16 * GB, 19.2, True, 8, "MAXN_SUPER"),
    "orin-nx-16gb-10w": (68.0, 16 * GB, 5.0, True, 4, "10W"),
    "orin-nx-8gb": (102.4, 8 * GB, 12.5, True, 6, "MAXN"),
    "orin-nx-8gb-super": (102.4, 8 * GB, 19.2, True, 6, "MAXN_SUPER"),
    "orin-nano-8gb": (68.0, 8 * GB, 10.2, True, 6, "15W"),
    "orin-nano-8gb-super": (102.0, 8 * GB, 16.7, True, 6, "MAXN_SUPER"),
    "orin-nano-8gb-7w": (68.0, 8 * GB, 3.3, True, 4, "7W"),
    "orin-nano-8gb-super-25w": (102.0, 8 * GB, 13.4, True, 6, "25W"),
    "orin-nano-4gb": (34.0, 4 * GB, 5.1, True, 6, "10W"),
    "orin-nano-4gb-super": (51.0, 4 * GB, 8.4, True, 6, "MAXN_SUPER"),
    "thor-t5000": (273.0, 128 * GB, None, False, 14, "MAXN"),
    # every other nvpmodel mode (robot_latency.floor.power_modes): EMC cap x bus, TPCs x clock
    "orin-agx-64gb-30w": (204.8, 64 * GB, 10.03, True, 8, "30W"),
    "orin-agx-64gb-50w": (204.8, 64 * GB, 26.74, True, 12, "50W"),
    "orin-agx-32gb-15w": (136.5, 32 * GB, 5.01, True, 4, "15W"),
    "orin-agx-32gb-30w": (204.8, 32 * GB, 10.03, True, 8, "30W"),
    "orin-agx-32gb-40w": (204.8, 32 * GB, 23.4, True, 8, "40W"),
    "orin-nx-16gb-15w": (102.4, 16 * GB, 5.01, True, 4, "15W"),
    "orin-nx-16gb-25w": (102.4, 16 * GB, 6.68, True, 8, "25W"),
    "orin-nx-16gb-super-40w": (102.4, 16 * GB, 19.22, True, 8, "40W"),
    "orin-nx-8gb-10w": (68.3, 8 * GB, 5.01, True, 4, "10W"),
    "orin-nx-8gb-15w": (102.4, 8 * GB, 5.01, True, 4, "15W"),
    "orin-nx-8gb-20w": (102.4, 8 * GB, 6.68, True, 6, "20W"),
    "orin-nx-8gb-super-40w": (102.4, 8 * GB, 19.22, True, 6, "40W"),
    "orin-nano-4gb-7w-ai": (34.1, 4 * GB, 3.34, True, 4, "7W_AI"),
    "orin-nano-4gb-7w-cpu": (34.1, 4 * GB, 2.51, True, 4, "7W_CPU"),
    "orin-nano-4gb-super-25w": (51.2, 4 * GB, 8.36, True, 6, "25W"),
    "h100-sxm": (3350.0, 80 * GB, 989.0, False, None, None),
}


def test_every_expected_profile_exists_and_nothing_else() -> None:
    assert set(DEVICES) == set(EXPECTED)


@pytest.mark.parametrize("device_id", sorted(EXPECTED))
def test_profile_figures_match_reference(device_id: str) -> None:
    bandwidth, memory, tflops, derived, cores, mode = EXPECTED[device_id]
    p = DEVICES[device_id]
    assert p.id == device_id
    assert p.bandwidth_gbps == pytest.approx(bandwidth)
    assert p.memory_bytes == memory
    assert p.fp16_tflops == (None if tflops is None else pytest.approx(tflops))
    assert p.flops_derived is derived
    assert p.cpu_cores == cores
    assert p.power_mode == mode
    assert p.name and p.source and p.family


def test_units_convert() -> None:
    p = DEVICES["orin-nano-8gb"]
    assert p.bandwidth_bytes_per_s == pytest.approx(68.0e9)
    assert p.peak_flops == pytest.approx(10.2e12)
    assert DEVICES["thor-t5000"].peak_flops is None


def test_derived_flops_say_so_in_source() -> None:
    for p in DEVICES.values():
        if p.flops_derived:
            assert "derived" in p.source, p.id
    assert "secondary sources" in DEVICES["thor-t5000"].notes


def test_families() -> None:
    assert {p.family for p in DEVICES.values()} == {
        "orin-agx",
        "orin-nx",
        "orin-nano",
        "thor",
        "datacenter",
    }


def test_ids_are_unique_stable_and_listed_in_order() -> None:
    listed = list_devices()
    ids = [p.id for p in listed]
    assert len(ids) == len(set(ids))
    assert ids == list(DEVICES)
    assert "host" not in ids and "auto" not in ids
    for device_id in ids:
        assert device_id == device_id.strip().lower()


def test_profile_to_dict_round_trips_through_json() -> None:
    p = DEVICES["orin-agx-64gb-15w"]
    d = json.loads(json.dumps(p.to_dict()))
    assert DeviceSheet(**d) == p


def test_profiles_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEVICES["h100-sxm"].bandwidth_gbps = 1.0  # type: ignore[misc]


def test_profile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        DeviceSheet("x", "x", 0.0, GB, None, False, None, None, "test")
    with pytest.raises(ValueError):
        DeviceSheet("x", "x", 1.0, GB, math.nan, True, None, None, "test")


def test_get_device_returns_builtin_profiles() -> None:
    assert get_device("orin-nano-8gb-super") is DEVICES["orin-nano-8gb-super"]
    assert get_device(" H100-SXM ") is DEVICES["h100-sxm"]


def test_unknown_device_lists_valid_ids() -> None:
    with pytest.raises(UnknownDeviceError) as excinfo:
        get_device("orin-pico")
    message = str(excinfo.value)
    assert "orin-pico" in message
    for device_id in [*DEVICES, "host", "auto"]:
        assert device_id in message
    assert isinstance(excinfo.value, KeyError)


# (module, mode) -> (EMC MHz, GPU MHz, TPCs on, CPUs online), typed from the nvpmodel files
MODE_CAPS = {
    ("orin-agx-64gb", "MAXN"): (3200.0, 1300.0, 8, 12),
    ("orin-agx-64gb", "15W"): (2133.0, 408.0, 3, 4),
    ("orin-agx-64gb", "30W"): (3200.0, 612.0, 4, 8),
    ("orin-agx-64gb", "50W"): (3200.0, 816.0, 8, 12),
    ("orin-agx-32gb", "40W"): (3200.0, 816.0, 7, 8),
    ("orin-nx-16gb", "25W"): (3199.0, 408.0, 4, 8),
    ("orin-nano-8gb", "7W"): (2133.0, 408.0, 2, 4),
    ("orin-nano-8gb", "MAXN_SUPER"): (3199.0, 1020.0, 4, 6),
    ("orin-nano-4gb", "7W_CPU"): (2133.0, 306.0, 2, 4),
}


@pytest.mark.parametrize("key", sorted(MODE_CAPS))
def test_every_mode_carries_its_caps_and_their_source(key: tuple[str, str]) -> None:
    module, mode = key
    sheet = next(s for s in power_modes_of(module) if s.power_mode == mode)
    emc, gpu, tpcs, cpus = MODE_CAPS[key]
    assert (sheet.emc_max_mhz, sheet.gpu_max_mhz, sheet.gpu_tpcs, sheet.cpu_cores) == (
        emc, gpu, tpcs, cpus)
    assert sheet.module == module
    assert "nvpmodel_p37" in sheet.source and f"NAME={mode}" in sheet.source


def test_power_modes_of_lists_every_mode_of_the_module() -> None:
    agx = [s.power_mode for s in power_modes_of("orin-agx-64gb-30w")]
    assert sorted(agx) == ["15W", "30W", "50W", "MAXN"]
    nx8 = {s.power_mode for s in power_modes_of("orin-nx-8gb")}
    assert nx8 == {"MAXN", "MAXN_SUPER", "10W", "15W", "20W", "40W"}
    assert power_modes_of("thor-t5000") == [DEVICES["thor-t5000"]]
    # every Orin module with a mode table has each of its modes as a row
    for module in MODULES:
        assert {m.device_id for m in modes_of(module)} == {
            s.id for s in power_modes_of(module)}
