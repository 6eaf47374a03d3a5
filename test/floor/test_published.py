"""The shipped published-measurement table: its schema, its sources, and leave-one-out."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from robot_latency.floor.calibration import ENGINE_FAMILIES
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import CalibrationError, TableError
from robot_latency.floor.modelinfo import PRESETS
from robot_latency.floor.published import (
    OPTIONAL_ROW_FIELDS,
    ROW_FIELDS,
    default_table_path,
    family_interval,
    load_table,
    model_adjustment,
    nearest_rows,
    not_predicted_reason,
    row_point,
    table_calibration,
    validate_table,
)
from robot_latency.floor.shapes import REFUSED_MODELS


def test_table_schema_sources_and_size() -> None:
    raw = yaml.safe_load(default_table_path().read_text(encoding="utf-8"))
    allowed = set(ROW_FIELDS) | set(OPTIONAL_ROW_FIELDS)
    assert all(set(ROW_FIELDS) <= set(row) <= allowed for row in raw["rows"])
    rows = load_table()
    assert len(rows) >= 35
    assert len({r.source for r in rows}) >= 6
    assert len({r.url for r in rows}) >= 6
    for r in rows:
        assert r.url.startswith("https://")
        assert r.device in DEVICES and (r.model in PRESETS or r.model in REFUSED_MODELS)
        assert r.engine_family in ENGINE_FAMILIES
        assert r.tok_s > 0 and r.itl_ms > 0
        if not_predicted_reason(r) is not None:
            continue
        # a published rate is never faster than the bandwidth floor allows (bytes counted at
        # the row's quant, at most 10% generous for 4-bit schemes with smaller scales)
        assert row_point(r).floor_ms <= 1.1 * r.itl_ms, r.id


def test_recent_llamacpp_rows_cover_sources_devices_and_small_models() -> None:
    recent = validate_table()["recent_llamacpp"]
    assert recent["predicted"] >= 10 and len(recent["sources"]) >= 3
    assert recent["modules"] >= 3  # Orin Nano, Orin NX, AGX Orin (and Thor, not predicted)
    assert recent["small_model_rows"] >= 4
    for r in load_table():
        if r.engine_family == "llamacpp-cuda" and (r.date or "") >= "2025":
            # a recent row carries its date and build (or a note that the build is not stated)
            assert r.date and (r.build or r.engine_version or "not stated" in r.notes), r.id


def test_leave_one_out_meets_the_targets() -> None:
    result = validate_table()
    table = load_table()
    assert result["predicted"] == sum(1 for r in table if not_predicted_reason(r) is None)
    assert result["predicted"] >= 35 and result["sources"] >= 6
    assert result["median_abs_error"] <= 0.12
    assert result["by_family"]["llamacpp-cuda"]["median_abs_error"] <= 0.15
    for family in ("mlc", "tensorrt"):
        assert result["by_family"][family]["median_abs_error"] <= 0.12, family
    notes = {r.id: r.notes for r in table}
    for row_id in (*result["past_35_percent"], *result["new_model_past_35_percent"]):
        assert "Past 35% in validation" in notes[row_id], row_id  # explained in the table
    for family, f in result["by_family"].items():
        if f["predicted"] >= 8:
            assert f["coverage_80"] >= 0.75, family
            assert f["new_model_coverage_80"] >= 0.75, family
    # a model never measured is predicted worse than one measured in other power modes
    f = result["by_family"]["llamacpp-cuda"]
    assert f["model_adjusted"] >= 20
    assert f["new_model_median_abs_error"] > f["median_abs_error"]
    assert {r["scope"] for r in result["rows"]} <= {"setup", "device", "family", None}


def test_a_left_out_row_moves_nothing_that_predicts_it() -> None:
    # change one published figure tenfold: its own prediction (fit, model factor, interval)
    # must not move, while the rows whose model factor it feeds do
    table = load_table()
    target = "smolhub-25w-gemma3-1b"
    changed = tuple(replace(r, tok_s=r.tok_s / 10, published_itl_ms=10 * r.itl_ms)
                    if r.id == target else r for r in table)
    before = {r["id"]: r for r in validate_table(table)["rows"]}
    after = {r["id"]: r for r in validate_table(changed)["rows"]}
    for key in ("predicted_ms", "interval_ms", "model_factor", "new_model_predicted_ms"):
        assert after[target][key] == pytest.approx(before[target][key]), key
    other = "smolhub-15w-gemma3-1b"
    assert target in before[other]["model_basis"]
    assert after[other]["predicted_ms"] > before[other]["predicted_ms"]
    # the new-model prediction of a row uses no row of its model at all
    assert after[other]["new_model_predicted_ms"] == pytest.approx(
        before[other]["new_model_predicted_ms"])


def test_model_adjustment_leans_on_the_same_source_only() -> None:
    adj = model_adjustment("llamacpp-cuda", "orin-agx-64gb", "qwen3-0.6b")
    assert not adj.seen and adj.factor == 1.0  # measured on AGX Orin by one source only
    adj = model_adjustment("llamacpp-cuda", "orin-nano-8gb-super-25w", "gemma-3-1b")
    assert adj.seen and adj.factor > 1.0 and len(adj.basis) == 3
    assert all(b.startswith("smolhub-") and "-25w-" not in b for b in adj.basis)
    assert model_adjustment("llamacpp-cuda", "orin-nano-8gb-super-25w", "qwen3-4b").factor == 1.0


def test_each_interval_holds_its_row_as_reported() -> None:
    for r in validate_table()["rows"]:
        if r["predicted_ms"] is None:
            assert r["reason"] and r["inside_interval"] is None
            continue
        lo, hi = r["interval_ms"]
        assert lo <= r["predicted_ms"] <= hi and lo >= r["floor_ms"]
        assert r["inside_interval"] == (lo <= r["measured_ms"] <= hi)


def test_refused_models_and_prefill_metrics_are_listed_not_predicted() -> None:
    rows = {r["id"]: r for r in validate_table()["rows"]}
    hybrid = rows["smolhub-maxn-lfm2.5-1.2b"]
    assert hybrid["predicted_ms"] is None and "hybrid state-space" in hybrid["reason"]
    jal = rows["jal-llamacpp-agx-orin-64gb-nemotron3-nano-4b"]
    assert "prefill" in jal["reason"] and "Nemotron" in jal["reason"]


def test_setup_scope_when_the_setup_covers_two_sizes() -> None:
    cal = table_calibration("mlc", "orin-nano-8gb-super")
    assert cal.scope == "setup" and cal.device_id == "orin-nano-8gb-super"
    assert all(b.startswith("jal-super-") for b in cal.basis)
    assert cal.interval_rel[0] <= 0 <= cal.interval_rel[1]
    # the overhead differs by power mode where the data has it: same module, 7W and MAXN_SUPER
    slow = table_calibration("llamacpp-cuda", "orin-nano-8gb-7w")
    fast = table_calibration("llamacpp-cuda", "orin-nano-8gb-super")
    assert slow.overhead_ms > fast.overhead_ms and slow.efficiency < fast.efficiency


def test_interval_is_the_familys_leave_one_out_spread() -> None:
    lo, hi = family_interval("llamacpp-cuda")
    assert lo < 0 < hi
    cal = table_calibration("llamacpp-cuda", "orin-agx-64gb")  # rests on two sources
    assert cal.interval_rel == (lo, hi)
    # leaving a row out changes the residuals the interval is built from
    assert family_interval("llamacpp-cuda", exclude="zoe-nx-llama3.2-3b") != (lo, hi)


def test_nearest_rows_prefer_the_device_then_the_size() -> None:
    rows = nearest_rows("llamacpp-cuda", "orin-nano-8gb", 470_000_000)
    assert rows and all(r.device == "orin-nano-8gb" for r in rows)
    assert rows[0].model == "qwen2.5-0.5b"  # 469 MB, the nearest file
    elsewhere = nearest_rows("llamacpp-cuda", "orin-nano-4gb", 470_000_000)
    assert elsewhere and all(r.device != "orin-nano-4gb" for r in elsewhere)


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
    ({"itl_ms": 5.0}, "exactly one of tok_s and itl_ms"),
    ({"tok_s": None}, "exactly one of tok_s and itl_ms"),
    ({"metric": "vibes"}, "unknown metric"),
    ({"clocks_locked": "yes"}, "clocks_locked"),
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


def test_start_up_logs_one_summary_line(caplog: pytest.LogCaptureFixture) -> None:
    """Fitting the published table logs one INFO line, not one per refitted overhead."""
    from robot_latency.floor import published_fit

    published_fit._log_table_summary.cache_clear()
    with caplog.at_level(logging.INFO, logger="robot_latency"):
        table_calibration("llamacpp-cuda", "orin-nano-8gb")
        table_calibration("mlc", "orin-nano-8gb")
    infos = [r for r in caplog.records if r.levelno >= logging.INFO
             and r.name.startswith("robot_latency.floor")]
    assert len(infos) == 1, [r.getMessage() for r in infos]
    assert "published table" in infos[0].getMessage()
    assert "refitting" not in caplog.text
