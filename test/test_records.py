"""Cycle records: derived timing from one clock, JSONL round trip, crash-tolerant reading."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.records import CycleRecord, JsonlSink, RecordError, read_records


def _record(cycle: int = 0, *, gaps_ns: tuple[int, ...] = (7_000_001, 9_999_999, 3),
            deadline_ms: int = 100) -> CycleRecord:
    """Build a record the way the loop does: every timestamp read from one scripted clock."""
    clock = ScriptedClock(start_ns=1_000_000_000 + cycle * 200_000_000)
    scheduled = clock()
    clock.advance(1_234)  # queue wait
    started = clock()
    clock.advance(12_345_678)  # tokenize + prefill
    tokens = [clock()]
    for gap in gaps_ns:
        clock.advance(gap)
        tokens.append(clock())
    clock.advance(50_000)
    published = clock()
    return CycleRecord(run_id="r1", cycle=cycle, scheduled_ns=scheduled,
                       deadline_ns=scheduled + deadline_ms * 1_000_000, started_ns=started,
                       published_ns=published, token_ns=tokens, command_id=f"c{cycle}",
                       command_arrival_ns=scheduled - 500, plan_source="model",
                       phases_ns={"queue": 1_234, "prefill": 12_345_678})


def test_e2e_equals_ttft_plus_sum_itl_exactly() -> None:
    rec = _record()
    assert rec.e2e_ns == rec.ttft_ns + sum(rec.itl_ns)
    assert rec.ttft_ns == 1_234 + 12_345_678
    assert rec.itl_ns == [7_000_001, 9_999_999, 3]
    assert rec.queue_wait_ns == 1_234
    assert rec.tokens_out == 4
    assert rec.tpot_ns == pytest.approx((7_000_001 + 9_999_999 + 3) / 3)
    assert rec.reaction_ns == rec.cycle_ns + 500


def test_deadline_met_and_overshoot() -> None:
    on_time = _record(deadline_ms=100)
    assert on_time.deadline_met and on_time.overshoot_ns == 0
    late = _record(deadline_ms=20)  # published at ~29.4 ms
    assert not late.deadline_met
    assert late.overshoot_ns == late.published_ns - late.deadline_ns > 0


def test_skipped_cycle_is_a_miss_even_without_publish_time() -> None:
    rec = CycleRecord(run_id="r", cycle=3, scheduled_ns=0, deadline_ns=10, skipped=True,
                      plan_source="none", fallback_reason="skipped")
    assert not rec.deadline_met
    assert rec.ttft_ns is None and rec.e2e_ns is None and rec.tpot_ns is None
    assert rec.overshoot_ns is None


def test_undefined_metrics_are_none_not_zero() -> None:
    rec = CycleRecord(run_id="r", cycle=0, scheduled_ns=0, deadline_ns=10, published_ns=5,
                      plan_source="fallback", fallback_reason="engine_error")
    d = rec.to_dict()
    assert d["ttft_ms"] is None and d["e2e_ms"] is None and d["tpot_ms"] is None
    assert d["itl_ms"] == []


def test_rejects_backwards_tokens_and_unknown_source() -> None:
    with pytest.raises(RecordError, match="backwards"):
        CycleRecord(run_id="r", cycle=0, scheduled_ns=0, deadline_ns=1, token_ns=[5, 4])
    with pytest.raises(RecordError, match="plan_source"):
        CycleRecord(run_id="r", cycle=0, scheduled_ns=0, deadline_ns=1, plan_source="oracle")


def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "cycles.jsonl"
    records = [_record(i) for i in range(5)]
    with JsonlSink(path) as sink:
        for r in records:
            sink.write(r)
            # flushed per record: the line is on disk before the next cycle starts
            assert path.read_text().count("\n") == sink.written
    back = read_records(path)
    assert back == records
    line = json.loads(path.read_text().splitlines()[0])
    assert line["ttft_ms"] == pytest.approx(records[0].ttft_ns / 1e6)
    assert line["deadline_met"] is True


def test_derived_fields_in_the_file_are_recomputed_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    d = _record().to_dict()
    d["ttft_ms"] = -1.0
    path.write_text(json.dumps(d) + "\n")
    assert read_records(path)[0].ttft_ns == 1_234 + 12_345_678


def test_partial_last_line_is_skipped_with_warning(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "cycles.jsonl"
    with JsonlSink(path) as sink:
        sink.write(_record(0))
        sink.write(_record(1))
    full = _record(2).to_json()
    with open(path, "a") as fh:
        fh.write(full[: len(full) // 2])  # a crash mid-write
    with caplog.at_level(logging.WARNING):
        back = read_records(path)
    assert [r.cycle for r in back] == [0, 1]
    assert "line 3" in caplog.text and "partial" in caplog.text


def test_bad_line_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    path.write_text(_record(0).to_json() + "\n{not json\n" + _record(1).to_json() + "\n")
    with pytest.raises(RecordError, match=r"cycles\.jsonl, line 2"):
        read_records(path)


def test_missing_field_names_it(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    path.write_text(json.dumps({"run_id": "r", "cycle": 0}) + "\n" + _record().to_json() + "\n")
    with pytest.raises(RecordError, match="scheduled_ns"):
        read_records(path)


def test_unwritable_log_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RecordError, match="cannot open the cycle log"):
        JsonlSink(blocker / "cycles.jsonl")


def test_append_keeps_earlier_records(tmp_path: Path) -> None:
    path = tmp_path / "cycles.jsonl"
    with JsonlSink(path) as sink:
        sink.write(_record(0))
    with JsonlSink(path) as sink:
        sink.write(_record(1))
    assert [r.cycle for r in read_records(path)] == [0, 1]
