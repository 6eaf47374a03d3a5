"""The calibration cache (robot_latency.floor.calstore), on the real tables and the real fits: a
cached answer is the fresh one exactly; new table content, a corrupt entry or a cache that cannot
be written each give the fresh answer again, and say how it was had."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from robot_latency.floor.calstore import (
    cached_table_calibration,
    calibration_key,
    forget_in_memory,
    store_dir,
)
from robot_latency.floor.devices import get_device
from robot_latency.floor.published_support import table_calibration
from robot_latency.floor.published_table import default_table_path, load_table
from robot_latency.floor.target import resolve_calibration

FAMILY, DEVICE = "llamacpp-cuda", "orin-nano-8gb"
LOGGER = "robot_latency.floor.calstore"


def _lines(caplog: pytest.LogCaptureFixture, word: str = "") -> list[str]:
    """The cache's own log lines (holding ``word``)."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and word in r.getMessage()]


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache root of this test's own; nothing kept in memory before or after."""
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    forget_in_memory()
    yield tmp_path / "cache"
    forget_in_memory()


def test_a_cached_answer_is_the_fresh_one_exactly(cache: Path) -> None:
    device = get_device(DEVICE)
    first = cached_table_calibration(FAMILY, device)
    assert (first.outcome, first.written) == ("miss", True)
    assert first.path.parent == store_dir() and first.path.is_file()
    forget_in_memory()  # as a new process: from the file
    again = cached_table_calibration(FAMILY, device)
    assert (again.outcome, again.written) == ("hit", False)
    fresh = table_calibration(FAMILY, DEVICE)
    assert again.calibration == fresh and first.calibration == fresh
    assert again.key_digest == first.key_digest
    # what a run and predict ask for is the cached answer
    assert resolve_calibration(FAMILY, device) == fresh
    # within the process it is kept: the outcome is the one it was first had with
    assert cached_table_calibration(FAMILY, device) is again


def _slower_table(path: Path) -> Path:
    """The shipped decode table with every llama.cpp CUDA row 10% slower."""
    doc = yaml.safe_load(default_table_path().read_text(encoding="utf-8"))
    for row in doc["rows"]:
        if row["engine_family"] == FAMILY and row.get("tok_s") is not None:
            row["tok_s"] = row["tok_s"] * 0.9
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_new_table_content_misses_the_cache(cache: Path, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    device = get_device(DEVICE)
    shipped = cached_table_calibration(FAMILY, device)
    table = _slower_table(tmp_path / "decode.yaml")
    assert (calibration_key(FAMILY, device, decode_path=table)
            != calibration_key(FAMILY, device))
    forget_in_memory()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = cached_table_calibration(FAMILY, device, decode_path=table)
    # the entry of the shipped table is stale for these rows: set aside, said once, recomputed
    assert (got.outcome, got.written, got.path) == ("stale", True, shipped.path)
    assert len(_lines(caplog, "stale")) == 1
    assert got.calibration == table_calibration(FAMILY, DEVICE, rows=load_table(table))
    assert got.calibration != shipped.calibration
    forget_in_memory()
    assert cached_table_calibration(FAMILY, device, decode_path=table).outcome == "hit"
    forget_in_memory()
    assert cached_table_calibration(FAMILY, device).outcome == "stale"  # and back again


@pytest.mark.parametrize("content", ["{not json", "[]", json.dumps({"key": {}}),
                                     "", "\x00\x01"])
def test_a_corrupt_entry_is_recomputed(cache: Path, content: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    device = get_device(DEVICE)
    path = cached_table_calibration(FAMILY, device).path
    key = json.loads(path.read_text(encoding="utf-8"))["key"]
    path.write_text(content, encoding="utf-8")
    forget_in_memory()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        got = cached_table_calibration(FAMILY, device)
    assert got.outcome in ("corrupt", "stale") and got.written
    assert len(_lines(caplog)) == 1, _lines(caplog)
    assert got.calibration == table_calibration(FAMILY, DEVICE)
    assert json.loads(path.read_text(encoding="utf-8"))["key"] == key  # written whole again


def test_an_entry_with_the_right_key_and_a_broken_calibration_is_recomputed(
        cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    device = get_device(DEVICE)
    path = cached_table_calibration(FAMILY, device).path
    doc = json.loads(path.read_text(encoding="utf-8"))
    for broken in ({**doc["calibration"], "no_such_field": 1}, {"engine_family": FAMILY},
                   {**doc["calibration"], "basis": 3}):
        path.write_text(json.dumps({**doc, "calibration": broken}), encoding="utf-8")
        forget_in_memory()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            got = cached_table_calibration(FAMILY, device)
        assert (got.outcome, got.written) == ("corrupt", True)
        assert ["corrupt" in line for line in _lines(caplog)] == [True]
        assert got.calibration == table_calibration(FAMILY, DEVICE)


def test_a_cache_that_cannot_be_written_still_answers(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(blocker / "cache"))  # under a file
    forget_in_memory()
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            got = cached_table_calibration(FAMILY, get_device(DEVICE))
    finally:
        forget_in_memory()
    assert (got.outcome, got.written) == ("miss", False)
    assert got.calibration == table_calibration(FAMILY, DEVICE)
    assert len(_lines(caplog, "not written")) == 1
    assert list(tmp_path.iterdir()) == [blocker]  # nothing left behind
