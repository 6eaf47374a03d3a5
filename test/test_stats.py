"""Summary statistics: percentiles with n, Wilson interval, fallbacks, sample-count warnings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from robot_latency.records import CycleRecord
from robot_latency.stats import distribution, summarize, wilson_interval, write_summary

MS = 1_000_000


def _rec(cycle: int, *, ttft_ms: int, itl_ms: list[int], deadline_ms: int = 50,
         source: str = "model", reason: str | None = None, skipped: bool = False) -> CycleRecord:
    sched = cycle * 1000 * MS
    tokens = [sched + ttft_ms * MS]
    for gap in itl_ms:
        tokens.append(tokens[-1] + gap * MS)
    published = None if skipped else tokens[-1] + MS
    return CycleRecord(run_id="r", cycle=cycle, scheduled_ns=sched,
                       deadline_ns=sched + deadline_ms * MS, started_ns=None if skipped else sched,
                       published_ns=published, token_ns=[] if skipped else tokens,
                       plan_source="none" if skipped else source, fallback_reason=reason,
                       skipped=skipped)


def test_wilson_hand_worked() -> None:
    # p = 0.5, n = 100, z = 1.96: centre 0.5, half-width 1.96*sqrt(0.0025 + 0.96^2/4e4)/1.0384
    lo, hi = wilson_interval(50, 100)
    z = 1.959963984540054
    half = z * math.sqrt(0.25 / 100 + z * z / 40000) / (1 + z * z / 100)
    assert lo == pytest.approx(0.5 - half) and hi == pytest.approx(0.5 + half)
    assert lo == pytest.approx(0.4038, abs=1e-4)


def test_wilson_at_zero_misses_is_not_degenerate() -> None:
    lo, hi = wilson_interval(0, 1000)
    assert lo == 0.0
    # the "rule of three"-like upper bound: about 3.8e-3 for n = 1000
    assert 0.003 < hi < 0.0045
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(5, 3)


def test_distribution_percentiles() -> None:
    d = distribution(range(1, 101))  # 1..100
    assert d.n == 100 and d.max == 100 and d.mean == 50.5
    assert d.p50 == pytest.approx(50.5)
    assert d.p99 == pytest.approx(99.01)
    empty = distribution([])
    assert empty.n == 0 and empty.p50 is None and empty.mean is None


def test_summary_counts_and_keys(tmp_path: Path) -> None:
    records = [
        _rec(0, ttft_ms=10, itl_ms=[5, 5]),
        _rec(1, ttft_ms=20, itl_ms=[5, 7]),
        _rec(2, ttft_ms=60, itl_ms=[5], source="fallback", reason="deadline"),
        _rec(3, ttft_ms=0, itl_ms=[], skipped=True, reason="skipped"),
    ]
    s = summarize(records)
    assert s["cycles"] == 4
    assert s["deadline_misses"] == 2  # the late one and the skipped one
    assert s["deadline_miss_rate"] == 0.5
    lo, hi = s["deadline_miss_rate_ci95"]
    assert lo < 0.5 < hi
    assert s["fallbacks"] == {"deadline": 1, "skipped": 1}
    assert s["itl_ms"]["n"] == 5 and s["itl_ms"]["max"] == 7.0
    assert s["ttft_ms"]["n"] == 3 and s["ttft_ms"]["max"] == 60.0
    assert s["e2e_ms"]["max"] == 65.0
    assert s["overshoot_ms"]["max"] == pytest.approx(16.0)  # 66 ms published vs 50 ms deadline
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "overshoot_ms"):
        assert set(s[metric]) == {"p50", "p90", "p99", "p99_9", "max", "mean", "n"}
    assert any("itl_ms" in w and "1000" in w for w in s["warnings"])
    out = write_summary(s, tmp_path / "summary.json")
    assert json.loads(out.read_text()) == s


def test_empty_run_has_none_not_zero() -> None:
    s = summarize([])
    assert s["cycles"] == 0
    assert s["deadline_miss_rate"] is None and s["deadline_miss_rate_ci95"] is None
    assert s["ttft_ms"]["p50"] is None and s["ttft_ms"]["n"] == 0
    assert s["warnings"] == []


def test_p99_9_from_a_thousand_samples_only() -> None:
    thin = distribution(range(999))
    assert thin.p99 is not None and thin.p99_9 is None
    assert thin.to_dict()["p99_9"] is None
    full = distribution(range(1, 2001))  # 1..2000: the 99.9th percentile is 1998.001
    assert full.n == 2000 and full.p99_9 == pytest.approx(1998.001)
    assert full.p99 < full.p99_9 < full.max
