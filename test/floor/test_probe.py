"""Tests for robot_latency.floor.probe: the host probe and its cache."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pytest

from robot_latency.floor.devices import get_device
from robot_latency.floor.errors import ProbeError
from robot_latency.floor.probe import (
    BUSY_LOAD_PER_CORE,
    PROBE_VERSION,
    HostProbe,
    default_cache_path,
    load_or_probe_host,
    probe_host,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jetson"
GB = 1_000_000_000

# Small and quick: these tests check plumbing, not the machine's real bandwidth.
FAST_PROBE = {"buffer_bytes": 4 * 2**20, "repeats": 2}

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
    record["load_avg_1m"] = 0.0  # taken on a quiet host (a loaded suite's own load aside)
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
    profile = probe.to_sheet()
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
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.probe"):
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


def test_a_probe_taken_on_a_busy_host_is_not_reused(tmp_path: Path) -> None:
    # Other work on the memory bus lowers the bandwidth read, and a floor from it could exceed
    # a measurement: such a probe is kept (with its load) but the next call probes again.
    cache = tmp_path / "host_probe.json"
    record = _sentinel_record(probe_host(**FAST_PROBE))
    record["load_avg_1m"] = BUSY_LOAD_PER_CORE * record["cpu_cores"] + 0.01
    cache.write_text(json.dumps(record))
    assert load_or_probe_host(cache, **FAST_PROBE).bandwidth_gbps != SENTINEL_BANDWIDTH
    record["load_avg_1m"] = BUSY_LOAD_PER_CORE * record["cpu_cores"]
    cache.write_text(json.dumps(record))
    assert load_or_probe_host(cache, **FAST_PROBE).bandwidth_gbps == SENTINEL_BANDWIDTH


def test_unwritable_cache_warns_and_still_returns_profile(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    cache = blocker / "host_probe.json"
    with caplog.at_level(logging.WARNING, logger="robot_latency.floor.probe"):
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


def test_get_device_auto_elsewhere_uses_the_host_cache(tmp_path: Path) -> None:
    cache = tmp_path / "host_probe.json"
    cache.write_text(json.dumps(_sentinel_record(probe_host(**FAST_PROBE))))
    profile = get_device("auto", cache_path=cache, sysfs_root=FIXTURES / "not-jetson")
    assert profile.id == "host"
    assert profile.bandwidth_gbps == SENTINEL_BANDWIDTH
