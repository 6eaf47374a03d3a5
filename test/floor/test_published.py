"""The shipped published-measurement table: its schema, its sources, and leave-one-out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from robot_latency.floor.calibration import ENGINE_FAMILIES
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError, TableError
from robot_latency.floor.modelinfo import PRESETS
from robot_latency.floor.published import (
    ROW_FIELDS,
    default_table_path,
    load_table,
    row_point,
    table_calibration,
    validate_table,
)


def test_table_schema_sources_and_size() -> None:
    raw = yaml.safe_load(default_table_path().read_text(encoding="utf-8"))
    assert all(set(row) == set(ROW_FIELDS) for row in raw["rows"])
    rows = load_table()
    assert len(rows) >= 10
    assert len({r.source for r in rows}) >= 3
    assert len({r.url for r in rows}) >= 3
    for r in rows:
        assert r.url.startswith("https://")
        assert r.device in DEVICES and r.model in PRESETS
        assert r.engine_family in ENGINE_FAMILIES
        assert r.tok_s > 0
        # a published rate is never faster than the bandwidth floor allows (bytes counted at
        # the row's quant, at most 10% generous for 4-bit schemes with smaller scales)
        assert row_point(r).floor_ms <= 1.1 * r.itl_ms, r.id


def test_leave_one_out_meets_the_targets() -> None:
    result = validate_table()
    assert result["predicted"] == len(load_table())
    assert result["median_abs_error"] <= 0.15
    assert result["max_abs_error"] <= 0.35
    assert {r["scope"] for r in result["rows"]} <= {"device", "family"}


def test_device_scope_when_two_sizes_on_the_device() -> None:
    cal = table_calibration("mlc", "orin-nano-8gb-super")
    assert cal.scope == "device" and cal.device_id == "orin-nano-8gb-super"
    assert all(b.startswith("jal-super-") for b in cal.basis)
    assert cal.interval_rel[0] <= 0 <= cal.interval_rel[1]


def test_family_scope_elsewhere_says_so() -> None:
    cal = table_calibration("mlc", "orin-agx-64gb")
    assert cal.scope == "family" and cal.notes and "orin-agx-64gb" in cal.notes[0]


def test_family_without_rows_is_refused_naming_the_families_with_rows() -> None:
    with pytest.raises(CalibrationError, match=r"too few vllm rows.*mlc"):
        table_calibration("vllm", "orin-agx-64gb")


def test_unknown_family_lists_the_known_ones() -> None:
    with pytest.raises(CalibrationError, match="known families: llamacpp-cuda"):
        table_calibration("tensorrt-llm-x", "orin-agx-64gb")


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({"rows": rows}))
    return path


def _good_row() -> dict:
    raw = yaml.safe_load(default_table_path().read_text(encoding="utf-8"))
    return dict(raw["rows"][0])


@pytest.mark.parametrize(("change", "match"), [
    ({"tok_s": -1.0}, "tok_s"),
    ({"tok_s": "fast"}, "tok_s"),
    ({"device": "orin-xyz"}, "orin-xyz"),
    ({"model": "llama-9"}, "llama-9"),
    ({"engine_family": "nope"}, "nope"),
    ({"quant": "Q9_X"}, "Q9_X"),
    ({"url": "ftp://x"}, "https"),
    ({"extra": 1}, "unknown fields"),
])
def test_bad_rows_are_named(tmp_path: Path, change: dict, match: str) -> None:
    row = {**_good_row(), **change}
    with pytest.raises(TableError, match=match):
        load_table(_write(tmp_path, [row]))


def test_missing_field_and_duplicate_ids(tmp_path: Path) -> None:
    row = _good_row()
    missing = {k: v for k, v in row.items() if k != "url"}
    with pytest.raises(TableError, match="missing fields \\['url'\\]"):
        load_table(_write(tmp_path, [missing]))
    (tmp_path / "dup").mkdir()
    with pytest.raises(TableError, match="duplicate"):
        load_table(_write(tmp_path / "dup", [row, row]))
