"""``fleet --find-robots``' search and criterion, with a scripted trial function (no server): the
size found holds the target and one more robot does not, the trials cap is kept, and "none held"
and "every size held" are reported as such."""

from __future__ import annotations

from typing import Any

import pytest

from robot_latency.cli.fleet import answer_lines
from robot_latency.planner.capacity import CapacityError, bisect_count
from robot_latency.planner.fleet import search_robots, summarize_fleet
from robot_latency.records import CycleRecord


def _holds_up_to(limit: int, seen: list[int]) -> Any:
    def miss(n: int) -> float:
        seen.append(n)
        return 0.0 if n <= limit else 0.5
    return miss


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 12, 13, 30])
def test_the_size_found_holds_and_one_more_fails(limit: int) -> None:
    seen: list[int] = []
    found = bisect_count(_holds_up_to(limit, seen), 0.05, trials=20)
    assert (found.held, found.failed) == (limit, limit + 1)
    assert (found.miss_held, found.miss_failed) == (0.0, 0.5)
    # doubling from 1 to the first failure, then bisection; it stops once the two are
    # neighbours, never running a size twice
    first_fail = next(i for i, n in enumerate(seen) if n > limit)
    assert seen[: first_fail + 1] == [2 ** i for i in range(first_fail + 1)]
    assert all(seen[first_fail] // 2 < n < seen[first_fail] for n in seen[first_fail + 1:])
    assert len(seen) == len(set(seen)) == found.tried < 20


def test_the_trials_cap_is_kept() -> None:
    seen: list[int] = []
    found = bisect_count(_holds_up_to(5, seen), 0.05, trials=5)
    assert seen == [1, 2, 4, 8, 6] and found.tried == 5
    assert (found.held, found.failed) == (4, 6)  # bracketed, not yet narrowed to 5/6
    seen.clear()
    short = bisect_count(_holds_up_to(100, seen), 0.05, trials=3)
    assert seen == [1, 2, 4] and (short.held, short.failed) == (4, None)
    with pytest.raises(CapacityError, match="trials"):
        bisect_count(_holds_up_to(1, []), 0.05, trials=0)
    with pytest.raises(CapacityError, match="miss target"):
        bisect_count(_holds_up_to(1, []), 1.0, trials=3)


def _summary(n: int, miss: float | None) -> dict[str, Any]:
    return {"robots": n, "model_miss_rate": miss}


def test_search_robots_reports_none_held_and_every_size_held() -> None:
    never, tried = search_robots(lambda n: _summary(n, 0.2), miss_target=0.05, trials=6)
    assert [s["robots"] for s in tried] == [1] and never["tried"] == 1
    assert never["robots_held"] is None and never["robots_failed"] == 1
    lines = answer_lines(never)
    assert "none held: 1 robot missed 20.00%" in lines[1] and len(lines) == 2

    always, tried = search_robots(lambda n: _summary(n, 0.0), miss_target=0.05, trials=4)
    assert [s["robots"] for s in tried] == [1, 2, 4, 8]
    assert (always["robots_held"], always["robots_failed"]) == (8, None)
    assert "every size tried held" in answer_lines(always)[2]

    # a size with no cycle the model was due to answer counts as a failure
    empty, _ = search_robots(lambda n: _summary(n, None), miss_target=0.05, trials=3)
    assert empty["robots_held"] is None and empty["trials"][0]["model_miss_rate"] == 1.0


def test_search_robots_answer_matches_its_trials() -> None:
    rates = {1: 0.0, 2: 0.01, 4: 0.04, 8: 0.3, 6: 0.12, 5: 0.06}
    answer, tried = search_robots(lambda n: _summary(n, rates[n]), miss_target=0.05, trials=6)
    assert [s["robots"] for s in tried] == [1, 2, 4, 8, 6, 5]
    assert (answer["robots_held"], answer["robots_failed"]) == (4, 5)
    assert (answer["miss_held"], answer["miss_failed"]) == (0.04, 0.06)
    assert [t["held"] for t in answer["trials"]] == [True, True, True, False, False, False]
    assert answer["criterion"] == "model_miss_rate" and answer["max_trials"] == 6
    lines = answer_lines(answer)
    assert "held   4 robots, model miss rate 4.00%" in lines[1]
    assert "failed 5 robots, model miss rate 6.00%" in lines[2]


def _cycle(run: str, i: int, source: str, *, reason: str | None = None,
           late: bool = False) -> CycleRecord:
    ms = 1_000_000
    sched = i * 300 * ms
    return CycleRecord(run_id=run, cycle=i, scheduled_ns=sched, deadline_ns=sched + 150 * ms,
                       started_ns=sched, published_ns=sched + (160 if late else 140) * ms,
                       plan_source=source, fallback_reason=reason)


def test_the_model_miss_rate_joins_fallbacks_and_late_plans() -> None:
    # robot a: 1 cycle with no command yet (not due), 3 model plans in time, 1 late, 1 fallback;
    # robot b: 4 model plans in time. Due 9, missed 2 (a's late plan and its fallback).
    a = [_cycle("a", 0, "fallback", reason="no_command")] \
        + [_cycle("a", i, "model") for i in range(1, 4)] \
        + [_cycle("a", 4, "model", late=True), _cycle("a", 5, "fallback", reason="deadline")]
    b = [_cycle("b", i, "model") for i in range(4)]
    s = summarize_fleet(2, a + b, ttft_alone_ms=None)
    assert (s["cycles"], s["model_due"], s["model_misses"]) == (10, 9, 2)
    assert s["model_miss_rate"] == 2 / 9 and s["worst_robot_model_miss_rate"] == 2 / 5
    lo, hi = s["model_miss_rate_ci95"]
    assert lo < 2 / 9 < hi
    # the deadline misses alone say far less: one late plan in 10 cycles
    assert s["deadline_misses"] == 1 and s["fallback_rate"] == 2 / 10
