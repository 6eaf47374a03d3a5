"""Tests for robot_latency.floor.jetson: detection on fixture trees, and "auto"."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from robot_latency.floor.devices import DEVICES, get_device
from robot_latency.floor.jetson import JetsonInfo, detect_jetson

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jetson"
GB = 1_000_000_000

# Small and quick: these tests check plumbing, not the machine's real bandwidth.
FAST_PROBE = {"buffer_bytes": 4 * 2**20, "repeats": 2}

# ---------------------------------------------------------------------------------------------
# Jetson detection, on fixture trees
# ---------------------------------------------------------------------------------------------

DETECTION_CASES = {
    "agx-orin-64gb-maxn": JetsonInfo(
        model_string="NVIDIA Jetson AGX Orin Developer Kit",
        module="p3701-0005",
        power_mode="MAXN",
        power_mode_id=0,
        device_id="orin-agx-64gb",
    ),
    "agx-orin-64gb-15w": JetsonInfo(
        model_string="NVIDIA Jetson AGX Orin Developer Kit",
        module="p3701-0005",
        power_mode="15W",
        power_mode_id=1,
        device_id="orin-agx-64gb-15w",
    ),
    "agx-orin-32gb-devkit-jp5": JetsonInfo(
        model_string="Jetson AGX Orin",
        module="p3701-0000",
        power_mode="30W",
        power_mode_id=2,
        device_id="orin-agx-32gb-30w",  # every nvpmodel mode has its own datasheet
    ),
    "orin-nano-8gb-super": JetsonInfo(
        model_string="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
        module="p3767-0005",
        power_mode="MAXN_SUPER",
        power_mode_id=2,
        device_id="orin-nano-8gb-super",
    ),
    "orin-nx-16gb-10w": JetsonInfo(
        model_string="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
        module="p3767-0000",
        power_mode="10W",
        power_mode_id=1,
        device_id="orin-nx-16gb-10w",
    ),
    "orin-nano-4gb-no-part-number": JetsonInfo(
        model_string="NVIDIA Jetson Orin Nano Developer Kit",
        module=None,
        power_mode="10W",
        power_mode_id=0,
        device_id="orin-nano-4gb",
    ),
    "thor-t5000": JetsonInfo(
        model_string="NVIDIA Jetson AGX Thor Developer Kit",
        module="p3834-0008",
        power_mode="MAXN",
        power_mode_id=0,
        device_id="thor-t5000",
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
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.jetson"):
        info = detect_jetson(FIXTURES / "agx-orin-64gb-bad-status")
    assert info == JetsonInfo(
        model_string="NVIDIA Jetson AGX Orin Developer Kit",
        module="p3701-0005",
        power_mode=None,
        power_mode_id=None,
        device_id="orin-agx-64gb",
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
    assert info.device_id == "orin-agx-64gb"


def test_other_modes_map_to_the_module_base_profile(tmp_path: Path) -> None:
    root = _copy_fixture("orin-nano-8gb-super", tmp_path)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0000 fmode:quiet\n")
    info = detect_jetson(root)
    assert info is not None
    assert (info.power_mode, info.device_id) == ("15W", "orin-nano-8gb")


def test_nano_super_25w_keeps_full_memory_bandwidth(tmp_path: Path) -> None:
    # The Super conf's 25W mode runs EMC at full speed (102 GB/s) at its own, lower GPU clock.
    root = _copy_fixture("orin-nano-8gb-super", tmp_path)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0001 fmode:quiet\n")
    info = detect_jetson(root)
    assert info is not None
    assert (info.power_mode, info.device_id) == ("25W", "orin-nano-8gb-super-25w")


def test_development_module_with_64gb_memory_maps_to_64gb(tmp_path: Path) -> None:
    root = _copy_fixture("agx-orin-32gb-devkit-jp5", tmp_path)
    (root / "proc/meminfo").write_text("MemTotal:       64335836 kB\n")
    info = detect_jetson(root)
    assert info is not None
    assert info.device_id == "orin-agx-64gb-30w"  # the fixture runs MODE_30W


def test_memory_splits_modules_when_part_number_absent(tmp_path: Path) -> None:
    root = _copy_fixture("orin-nano-4gb-no-part-number", tmp_path)
    (root / "proc/meminfo").write_text("MemTotal:        7802212 kB\n")
    info = detect_jetson(root)
    assert info is not None
    assert info.device_id == "orin-nano-8gb"


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
    assert (info.module, info.device_id) == (None, None)


def test_get_device_auto_on_a_jetson() -> None:
    profile = get_device("auto", sysfs_root=FIXTURES / "orin-nx-16gb-10w")
    assert profile is DEVICES["orin-nx-16gb-10w"]
