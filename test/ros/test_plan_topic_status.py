"""The plan topic's greenwave-compatible status from cycle records (pure Python)."""

from __future__ import annotations

import pytest

from robot_latency.records import CycleRecord
from robot_latency.ros.diagnostics import (
    OK,
    WARN,
    DiagnosticsError,
    DiagnosticThresholds,
    plan_topic_report,
)

MS = 1_000_000


def _records(period_ms: float, n: int, *, reaction_ms: float = 30.0) -> list[CycleRecord]:
    out = []
    for i in range(n):
        tick = int(i * period_ms * MS)
        out.append(CycleRecord(run_id="r", cycle=i, scheduled_ns=tick, deadline_ns=tick + 80 * MS,
                               started_ns=tick, published_ns=tick + int(reaction_ms * MS),
                               data_ns=tick))
    return out


def test_a_plan_per_period_is_ok_and_its_keys_are_greenwaves() -> None:
    report = plan_topic_report(_records(100.0, 11), DiagnosticThresholds(), topic="/planner/plan",
                               period_ms=100.0, mode="periodic")
    assert report.name == "/planner/plan" and report.level == OK
    assert float(report.values["frame_rate_node"]) == pytest.approx(10.0)
    assert float(report.values["frame_rate_msg"]) == pytest.approx(10.0)
    assert float(report.values["current_delay_from_realtime_ms"]) == pytest.approx(30.0)
    assert float(report.values["expected_frequency"]) == pytest.approx(10.0)
    assert report.values["total_dropped_frames"] == "0"


def test_a_slow_plan_rate_warns_and_skipped_cycles_count_as_dropped() -> None:
    records = _records(150.0, 11)
    records.append(CycleRecord(run_id="r", cycle=11, scheduled_ns=2_000 * MS,
                               deadline_ns=2_080 * MS, skipped=True))
    report = plan_topic_report(records, DiagnosticThresholds(plan_rate_tolerance_percent=10),
                               topic="/planner/plan", period_ms=100.0, mode="periodic")
    assert report.level == WARN and "expected 10.00 Hz" in report.message
    assert report.values["total_dropped_frames"] == "1"
    wide = plan_topic_report(records, DiagnosticThresholds(plan_rate_tolerance_percent=50),
                             topic="/planner/plan", period_ms=100.0, mode="periodic")
    assert wide.level == OK


def test_no_records_is_no_rate_never_zero() -> None:
    report = plan_topic_report([], DiagnosticThresholds(), topic="/p", period_ms=100.0,
                               mode="event")
    assert report.level == OK and report.values["frame_rate_node"] == "n/a"
    assert report.values["expected_frequency"] == "0.000"


def test_bad_thresholds_name_the_parameter() -> None:
    with pytest.raises(DiagnosticsError, match="plan_expected_hz"):
        DiagnosticThresholds(plan_expected_hz=-1.0)
