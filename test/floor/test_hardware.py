"""Tests for robot_latency.floor.hardware: profiles, host probe and cache, Jetson detection."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path

import pytest

from robot_latency.floor.errors import ProbeError, UnknownDeviceError
from robot_latency.floor.hardware import (
    DEVICES,
    PROBE_VERSION,
    HardwareProfile,
    HostProbe,
    JetsonInfo,
    default_cache_path,
    detect_jetson,
    get_device,
    list_devices,
    load_or_probe_host,
    probe_host,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jetson"
GB = 1_000_000_000

# Small and quick: these tests check plumbing, not the machine's real bandwidth.
FAST_PROBE = {"buffer_bytes": 4 * 2**20, "repeats": 2}

# ---------------------------------------------------------------------------------------------
# Built-in profiles, against REFERENCE.md section 4 (typed out by hand, not computed)
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
    "orin-nano-4gb": (34.0, 4 * GB, 5.1, True, 6, "10W"),
    "orin-nano-4gb-super": (51.0, 4 * GB, 8.4, True, 6, "MAXN_SUPER"),
    "thor-t5000": (273.0, 128 * GB, None, False, 14, "MAXN"),
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
    assert HardwareProfile(**d) == p


def test_profiles_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEVICES["h100-sxm"].bandwidth_gbps = 1.0  # type: ignore[misc]


def test_profile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        HardwareProfile("x", "x", 0.0, GB, None, False, None, None, "test")
    with pytest.raises(ValueError):
        HardwareProfile("x", "x", 1.0, GB, math.nan, True, None, None, "test")


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


# ---------------------------------------------------------------------------------------------
# Jetson detection, on fixture trees
# ---------------------------------------------------------------------------------------------

DETECTION_CASES = {
    "agx-orin-64gb-maxn": JetsonInfo(
        model_string="NVIDIA Jetson AGX Orin Developer Kit",
        module="p3701-0005",
        power_mode="MAXN",
        power_mode_id=0,
        profile_id="orin-agx-64gb",
    ),
    "agx-orin-64gb-15w": JetsonInfo(
        model_string="NVIDIA Jetson AGX Orin Developer Kit",
        module="p3701-0005",
        power_mode="15W",
        power_mode_id=1,
        profile_id="orin-agx-64gb-15w",
    ),
    "agx-orin-32gb-devkit-jp5": JetsonInfo(
        model_string="Jetson AGX Orin",
        module="p3701-0000",
        power_mode="30W",
        power_mode_id=2,
        profile_id="orin-agx-32gb",
    ),
    "orin-nano-8gb-super": JetsonInfo(
        model_string="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        module="p3767-0005",
        power_mode="MAXN_SUPER",
        power_mode_id=2,
        profile_id="orin-nano-8gb-super",
    ),
    "orin-nx-16gb-10w": JetsonInfo(
        model_string="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
        module="p3767-0000",
        power_mode="10W",
        power_mode_id=1,
        profile_id="orin-nx-16gb-10w",
    ),
    "orin-nano-4gb-no-part-number": JetsonInfo(
        model_string="NVIDIA Jetson Orin Nano Developer Kit",
        module=None,
        power_mode="10W",
        power_mode_id=0,
        profile_id="orin-nano-4gb",
    ),
    "thor-t5000": JetsonInfo(
        model_string="NVIDIA Jetson AGX Thor Developer Kit",
        module="p3834-0008",
        power_mode="MAXN",
        power_mode_id=0,
        profile_id="thor-t5000",
    ),
}


@pytest.mark.parametrize("case", sorted(DETECTION_CASES))
def test_detect_jetson_fixture(case: str) -> None:
    assert detect_jetson(FIXTURES / case) == DETECTION_CASES[case]


def test_not_a_jetson() -> None:
    assert detect_jetson(FIXTURES / "not-jetson") is None


def test_machine_without_device_tree(tmp_path: Path) -> None:
    assert detect_jetson(tmp_path) is None


def test_garbage_status_keeps_module_and_falls_back_to_maxn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.hardware"):
        info = detect_jetson(FIXTURES / "agx-orin-64gb-bad-status")
    assert info == JetsonInfo(
        model_string="NVIDIA Jetson AGX Orin Developer Kit",
        module="p3701-0005",
        power_mode=None,
        power_mode_id=None,
        profile_id="orin-agx-64gb",
    )
    assert "nvpmodel status" in caplog.text


def _copy_fixture(case: str, tmp_path: Path) -> Path:
    root = tmp_path / case
    shutil.copytree(FIXTURES / case, root, symlinks=True)
    return root


def test_nvpmodel_conf_absolute_symlink_is_followed_inside_root(tmp_path: Path) -> None:
    # On a real board /etc/nvpmodel.conf -> /etc/nvpmodel/nvpmodel_p3767_0003_super.conf.
    root = _copy_fixture("orin-nano-8gb-super", tmp_path)
    per_module = root / "etc/nvpmodel/nvpmodel_p3767_0003_super.conf"
    per_module.parent.mkdir()
    (root / "etc/nvpmodel.conf").rename(per_module)
    (root / "etc/nvpmodel.conf").symlink_to("/etc/nvpmodel/nvpmodel_p3767_0003_super.conf")
    assert detect_jetson(root) == DETECTION_CASES["orin-nano-8gb-super"]


def test_missing_nvpmodel_conf_gives_id_without_name(tmp_path: Path) -> None:
    root = _copy_fixture("agx-orin-64gb-15w", tmp_path)
    (root / "etc/nvpmodel.conf").unlink()
    info = detect_jetson(root)
    assert info is not None
    assert (info.power_mode, info.power_mode_id) == (None, 1)
    assert info.profile_id == "orin-agx-64gb"


def test_other_modes_map_to_the_module_base_profile(tmp_path: Path) -> None:
    root = _copy_fixture("orin-nano-8gb-super", tmp_path)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0000 fmode:quiet\n")
    info = detect_jetson(root)
    assert info is not None
    assert (info.power_mode, info.profile_id) == ("15W", "orin-nano-8gb")


def test_nano_super_25w_keeps_full_memory_bandwidth(tmp_path: Path) -> None:
    # The Super conf's 25W mode runs EMC at full speed: 102 GB/s, the Super profile's figure.
    root = _copy_fixture("orin-nano-8gb-super", tmp_path)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0001 fmode:quiet\n")
    info = detect_jetson(root)
    assert info is not None
    assert (info.power_mode, info.profile_id) == ("25W", "orin-nano-8gb-super")


def test_development_module_with_64gb_memory_maps_to_64gb(tmp_path: Path) -> None:
    root = _copy_fixture("agx-orin-32gb-devkit-jp5", tmp_path)
    (root / "proc/meminfo").write_text("MemTotal:       64335836 kB\n")
    info = detect_jetson(root)
    assert info is not None
    assert info.profile_id == "orin-agx-64gb"


def test_memory_splits_modules_when_part_number_absent(tmp_path: Path) -> None:
    root = _copy_fixture("orin-nano-4gb-no-part-number", tmp_path)
    (root / "proc/meminfo").write_text("MemTotal:        7802212 kB\n")
    info = detect_jetson(root)
    assert info is not None
    assert info.profile_id == "orin-nano-8gb"


def test_part_number_read_from_dtsfilename_when_compatible_lacks_it(tmp_path: Path) -> None:
    root = _copy_fixture("agx-orin-32gb-devkit-jp5", tmp_path)
    (root / "proc/device-tree/compatible").write_bytes(b"nvidia,tegra234\0nvidia,tegra23x\0")
    info = detect_jetson(root)
    assert info is not None
    assert info.module == "p3701-0000"


def test_unknown_tegra_board_is_a_jetson_without_profile(tmp_path: Path) -> None:
    root = tmp_path / "xavier"
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/model").write_bytes(b"NVIDIA Jetson Xavier NX Developer Kit\0")
    (root / "proc/device-tree/compatible").write_bytes(
        b"nvidia,p3509-0000+p3668-0001\0nvidia,tegra194\0"
    )
    info = detect_jetson(root)
    assert info is not None
    assert (info.module, info.profile_id) == (None, None)


def test_get_device_auto_on_a_jetson() -> None:
    profile = get_device("auto", sysfs_root=FIXTURES / "orin-nx-16gb-10w")
    assert profile is DEVICES["orin-nx-16gb-10w"]


def test_get_device_auto_elsewhere_uses_the_host_cache(tmp_path: Path) -> None:
    cache = tmp_path / "host_probe.json"
    cache.write_text(json.dumps(_sentinel_record(probe_host(**FAST_PROBE))))
    profile = get_device("auto", cache_path=cache, sysfs_root=FIXTURES / "not-jetson")
    assert profile.id == "host"
    assert profile.bandwidth_gbps == SENTINEL_BANDWIDTH


# ---------------------------------------------------------------------------------------------
# Host probe and its cache
# ---------------------------------------------------------------------------------------------

SENTINEL_BANDWIDTH = 12345.0
SENTINEL_TIME = "2000-01-02T03:04:05+00:00"


def _sentinel_record(probe: HostProbe) -> dict:
    """Return a valid cache record for this machine whose figures no real probe produces."""
    record = probe.to_dict()
    record["bandwidth_gbps"] = SENTINEL_BANDWIDTH
    record["probed_at"] = SENTINEL_TIME
    return record


def test_probe_host_returns_sane_numbers() -> None:
    probe = probe_host(**FAST_PROBE, threads=2)
    for value in (probe.bandwidth_gbps, probe.bandwidth_single_gbps, probe.matmul_gflops):
        assert math.isfinite(value) and value > 0
    assert probe.cpu_cores == os.cpu_count()
    assert probe.memory_bytes > 0
    assert probe.cpu_model and probe.machine and probe.hostname
    assert probe.probe_version == PROBE_VERSION
    assert probe.probed_at.endswith("+00:00")


def test_probe_host_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        probe_host(buffer_bytes=16, repeats=1)
    with pytest.raises(ValueError):
        probe_host(buffer_bytes=2**20, repeats=0)
    with pytest.raises(ValueError):
        probe_host(buffer_bytes=2**20, repeats=1, threads=0)


def test_host_probe_dict_round_trip_and_profile() -> None:
    probe = probe_host(**FAST_PROBE)
    assert HostProbe.from_dict(json.loads(json.dumps(probe.to_dict()))) == probe
    profile = probe.to_profile()
    assert profile.id == "host" and profile.family == "host"
    assert profile.bandwidth_gbps == probe.bandwidth_gbps
    assert profile.memory_bytes == probe.memory_bytes
    assert profile.cpu_cores == probe.cpu_cores
    assert profile.peak_flops == pytest.approx(probe.matmul_gflops * 1e9)
    assert profile.source == f"measured by robot-latency probe on {probe.probed_at[:10]}"


@pytest.mark.parametrize(
    "broken",
    [
        {"bandwidth_gbps": "fast"},
        {"bandwidth_gbps": -1.0},
        {"cpu_cores": 2.5},
        {"cpu_cores": True},
        {"hostname": 7},
    ],
)
def test_host_probe_from_dict_rejects_malformed_records(broken: dict) -> None:
    record = probe_host(**FAST_PROBE).to_dict()
    record.update(broken)
    with pytest.raises(ProbeError):
        HostProbe.from_dict(record)
    del record["probed_at"]
    with pytest.raises(ProbeError):
        HostProbe.from_dict(record)


def test_cache_is_written_then_reused(tmp_path: Path) -> None:
    cache = tmp_path / "sub" / "host_probe.json"
    first = load_or_probe_host(cache, **FAST_PROBE)
    assert first.id == "host"
    assert cache.is_file()

    # Make the cached figures impossible for a real probe; the next call must return them.
    cache.write_text(
        json.dumps(_sentinel_record(HostProbe.from_dict(json.loads(cache.read_text()))))
    )
    second = load_or_probe_host(cache, **FAST_PROBE)
    assert second.bandwidth_gbps == SENTINEL_BANDWIDTH
    assert SENTINEL_TIME[:10] in second.source
    assert json.loads(cache.read_text())["probed_at"] == SENTINEL_TIME


def test_refresh_probes_again(tmp_path: Path) -> None:
    cache = tmp_path / "host_probe.json"
    cache.write_text(json.dumps(_sentinel_record(probe_host(**FAST_PROBE))))
    profile = load_or_probe_host(cache, refresh=True, **FAST_PROBE)
    assert profile.bandwidth_gbps != SENTINEL_BANDWIDTH
    assert json.loads(cache.read_text())["probed_at"] != SENTINEL_TIME


def test_corrupt_cache_warns_and_probes_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "host_probe.json"
    cache.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.hardware"):
        profile = load_or_probe_host(cache, **FAST_PROBE)
    assert profile.id == "host"
    assert str(cache) in caplog.text
    assert HostProbe.from_dict(json.loads(cache.read_text())).probe_version == PROBE_VERSION


def test_cache_from_another_machine_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "host_probe.json"
    record = _sentinel_record(probe_host(**FAST_PROBE))
    record["hostname"] = "some-other-robot"
    cache.write_text(json.dumps(record))
    profile = load_or_probe_host(cache, **FAST_PROBE)
    assert profile.bandwidth_gbps != SENTINEL_BANDWIDTH


def test_old_probe_version_is_not_used(tmp_path: Path) -> None:
    cache = tmp_path / "host_probe.json"
    record = _sentinel_record(probe_host(**FAST_PROBE))
    record["probe_version"] = PROBE_VERSION - 1
    cache.write_text(json.dumps(record))
    assert load_or_probe_host(cache, **FAST_PROBE).bandwidth_gbps != SENTINEL_BANDWIDTH


def test_unwritable_cache_warns_and_still_returns_profile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    cache = blocker / "host_probe.json"
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.hardware"):
        profile = load_or_probe_host(cache, **FAST_PROBE)
    assert profile.id == "host"
    assert str(cache) in caplog.text
    assert list(tmp_path.iterdir()) == [blocker]  # no temporary file left behind


def test_get_device_host_uses_cache_path(tmp_path: Path) -> None:
    cache = tmp_path / "host_probe.json"
    cache.write_text(json.dumps(_sentinel_record(probe_host(**FAST_PROBE))))
    assert get_device("host", cache_path=cache).bandwidth_gbps == SENTINEL_BANDWIDTH


def test_default_cache_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "explicit" / "host_probe.json"

    monkeypatch.delenv("ROBOT_LATENCY_CACHE_DIR")
    assert default_cache_path() == tmp_path / "xdg" / "robot_latency" / "host_probe.json"

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert (
        default_cache_path() == tmp_path / "home" / ".cache" / "robot_latency" / "host_probe.json"
    )
