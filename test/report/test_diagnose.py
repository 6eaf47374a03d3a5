"""Tail diagnosis on hand-built records: miss-cause rules, the E2E-vs-TPOT verdict, buckets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from robot_latency.records import CycleRecord
from robot_latency.report.diagnose import (
    CAUSES,
    TAIL_MIN_SAMPLES,
    VERDICT_LENGTH,
    VERDICT_TOO_FEW,
    VERDICT_UNSTABLE,
    attribute_cause,
    diagnose,
    is_deadline_miss,
    is_model_miss,
)

MS = 1_000_000
DEADLINE_MS = 100


def _rec(cycle: int, *, queue_ms: float = 1, prefill_ms: float = 20,
         itl_ms: list[float] | None = None, published_ms: float | None = None,
         source: str = "model", reason: str | None = None, engine_error: str | None = None,
         skipped: bool = False, tokens_in: int | None = 50, no_tokens: bool = False
         ) -> CycleRecord:
    """A cycle on a scripted clock: queue, prefill to the first token, then the gaps."""
    sched = cycle * 1000 * MS
    started = sched + int(queue_ms * MS)
    gaps = [10.0] * 5 if itl_ms is None else itl_ms
    tokens: list[int] = []
    if not (no_tokens or skipped):
        tokens = [started + int(prefill_ms * MS)]
        for g in gaps:
            tokens.append(tokens[-1] + int(g * MS))
    if skipped:
        published = None
    elif published_ms is not None:
        published = sched + int(published_ms * MS)
    else:
        published = (tokens[-1] if tokens else started) + MS
    phases = {} if skipped else {"queue": started - sched, "prefill": int(prefill_ms * MS)}
    if tokens:
        phases["decode"] = tokens[-1] - tokens[0]
    return CycleRecord(run_id="r", cycle=cycle, scheduled_ns=sched,
                       deadline_ns=sched + DEADLINE_MS * MS,
                       started_ns=None if skipped else started, published_ns=published,
                       token_ns=tokens, tokens_in=tokens_in, phases_ns=phases,
                       plan_source="none" if skipped else source,
                       fallback_reason="skipped" if skipped else reason,
                       engine_error=engine_error, skipped=skipped)


def _run_with_each_cause() -> list[CycleRecord]:
    normal = [_rec(i) for i in range(20)]  # 1 + 20 + 50 = 71 ms: met; median gap 10 ms
    return [
        *normal,
        _rec(100, itl_ms=[10, 10, 60, 10]),              # 111 ms late; one 60 ms gap: stall
        _rec(101, prefill_ms=70, itl_ms=[10, 10, 10]),   # 101 ms late; prefill 70% of budget
        _rec(102, no_tokens=True, published_ms=5, source="fallback", reason="engine_error",
             engine_error="RuntimeError('boom')"),      # in time, but the engine failed
        _rec(103, queue_ms=40),                          # 111 ms late; queue 40% of budget
        _rec(104, itl_ms=[16] * 6, published_ms=99, source="fallback",
             reason="deadline"),                         # model gave up in time: decode slow
        _rec(105, skipped=True),
        _rec(106, published_ms=130),                     # tokens in by 71 ms, plan at 130 ms
    ]


def test_each_miss_attributed_to_its_cause() -> None:
    records = _run_with_each_cause()
    diag = diagnose(records)
    by_cycle = {m.cycle: m for m in diag.misses}
    assert by_cycle[100].cause == "stall"
    assert by_cycle[101].cause == "prefill_too_long"
    assert by_cycle[102].cause == "engine_fault"
    assert by_cycle[103].cause == "queueing"
    assert by_cycle[104].cause == "decode_too_slow"
    assert by_cycle[105].cause == "skipped"
    assert by_cycle[106].cause == "publish_late"
    assert set(by_cycle) == {100, 101, 102, 103, 104, 105, 106}  # normal cycles are not misses
    assert diag.median_itl_ms == pytest.approx(10.0)


def test_two_kinds_of_miss_counted_separately() -> None:
    diag = diagnose(_run_with_each_cause())
    # late or skipped: stall, prefill, queueing, skipped, publish_late
    assert diag.deadline_misses == 5
    # a fallback answered for the model: engine fault, model out of time
    assert diag.model_misses == 2
    assert diag.causes_deadline == {"skipped": 1, "superseded": 0, "engine_fault": 0,
                                    "invalid_output": 0, "bad_command": 0, "host_steal": 0,
                                    "publish_late": 1, "queueing": 1, "stall": 1,
                                    "prefill_too_long": 1, "decode_too_slow": 0}
    assert diag.causes_model["engine_fault"] == 1 and diag.causes_model["decode_too_slow"] == 1
    assert sum(diag.causes_model.values()) == 2
    assert sum(diag.causes.values()) == 7
    assert list(diag.causes) == list(CAUSES)


def test_model_miss_published_late_counts_in_both() -> None:
    late_fallback = _rec(7, itl_ms=[10] * 9, published_ms=120, source="fallback",
                         reason="deadline")
    assert is_deadline_miss(late_fallback) and is_model_miss(late_fallback)
    diag = diagnose([_rec(i) for i in range(5)] + [late_fallback])
    assert diag.deadline_misses == 1 and diag.model_misses == 1
    assert sum(diag.causes.values()) == 1  # one cycle, counted once overall


@pytest.mark.parametrize(("reason", "cause"), [
    ("server_unreachable", "engine_fault"), ("server_error", "engine_fault"),
    ("server_malformed", "engine_fault"), ("engine_unavailable", "engine_fault"),
    ("invalid_output", "invalid_output"), ("bad_command", "bad_command"),
    ("no_command", "bad_command"), ("deadline", "decode_too_slow")])
def test_every_fallback_is_a_model_miss(reason: str, cause: str) -> None:
    # A fallback answered in time, for this reason: a model miss, not a deadline miss.
    fallback = _rec(1, itl_ms=[16] * 6, published_ms=99, source="fallback", reason=reason)
    assert is_model_miss(fallback) and not is_deadline_miss(fallback)
    diag = diagnose([_rec(i) for i in range(5)] + [fallback])
    assert diag.model_misses == 1 and diag.deadline_misses == 0
    assert diag.causes_model[cause] == 1 and sum(diag.causes_model.values()) == 1


def test_model_misses_equal_fallbacks_of_every_kind() -> None:
    # The report that showed "model miss 5.0%" beside "fallback 55.0%": server_unreachable
    # fallbacks are model misses too.
    records = [_rec(i) for i in range(9)]
    records += [_rec(10 + i, no_tokens=True, published_ms=5, source="fallback",
                     reason="server_unreachable") for i in range(10)]
    records.append(_rec(30, itl_ms=[16] * 6, published_ms=99, source="fallback",
                        reason="deadline"))
    diag = diagnose(records)
    fallbacks = sum(1 for r in records if r.plan_source == "fallback")
    assert diag.model_misses == fallbacks == 11
    assert diag.causes_model["engine_fault"] == 10


def test_rule_order_engine_fault_before_queueing_and_no_token_is_prefill() -> None:
    both = _rec(1, queue_ms=60, no_tokens=True, published_ms=99, source="fallback",
                reason="engine_unavailable", engine_error="not loaded")
    assert attribute_cause(both, median_itl_ns=10 * MS) == "engine_fault"
    silent = _rec(2, prefill_ms=30, no_tokens=True, published_ms=99, source="fallback",
                  reason="deadline")
    assert attribute_cause(silent, median_itl_ns=10 * MS) == "prefill_too_long"
    # a tighter deadline passed explicitly turns the 30 ms prefill into the cause too
    slow = _rec(3, prefill_ms=30, itl_ms=[10] * 8)
    assert attribute_cause(slow, median_itl_ns=10 * MS, deadline_ns=50 * MS) == \
        "prefill_too_long"
    assert attribute_cause(slow, median_itl_ns=None) == "decode_too_slow"


def test_host_steal_explains_a_late_publish_only_when_it_covers_the_lateness() -> None:
    late = _rec(1, published_ms=130)  # tokens in time, plan 30 ms late: publish_late
    assert attribute_cause(late, median_itl_ns=10 * MS) == "publish_late"
    late.host_steal_ns = 20 * MS  # the VM was stopped, but for less than the lateness
    assert attribute_cause(late, median_itl_ns=10 * MS) == "publish_late"
    late.host_steal_ns = 30 * MS
    assert attribute_cause(late, median_itl_ns=10 * MS) == "host_steal"
    # a model miss answered in time: steal over 10% of the 100 ms budget is the cause
    gave_up = _rec(2, itl_ms=[16] * 6, published_ms=99, source="fallback", reason="deadline")
    gave_up.host_steal_ns = 10 * MS
    assert attribute_cause(gave_up, median_itl_ns=10 * MS) == "decode_too_slow"
    gave_up.host_steal_ns = 20 * MS
    assert attribute_cause(gave_up, median_itl_ns=10 * MS) == "host_steal"
    # an engine fault stays an engine fault whatever the host did
    fault = _rec(3, no_tokens=True, published_ms=5, source="fallback", reason="engine_error",
                 engine_error="boom")
    fault.host_steal_ns = 50 * MS
    assert attribute_cause(fault, median_itl_ns=10 * MS) == "engine_fault"


def test_verdict_length_variance_when_output_lengths_vary() -> None:
    # every gap exactly 10 ms; output lengths from 2 to 100 tokens
    records = [_rec(i, itl_ms=[10] * (1 + (i * 7) % 99)) for i in range(200)]
    tail = diagnose(records).tail
    assert tail.tpot_ratio == pytest.approx(1.0)
    assert tail.e2e_ratio is not None and tail.e2e_ratio > 1.5
    assert tail.verdict == VERDICT_LENGTH


def test_verdict_unstable_when_per_token_decode_is_noisy() -> None:
    rng = np.random.default_rng(0)
    # the same 10 tokens every cycle, but each cycle decodes at its own (noisy) speed
    records = [_rec(i, itl_ms=list(10 * rng.lognormal(0, 0.5) * np.ones(9)))
               for i in range(200)]
    tail = diagnose(records).tail
    assert tail.tpot_ratio is not None and tail.tpot_ratio > 1.5
    assert tail.verdict == VERDICT_UNSTABLE


def test_phase_split_and_buckets() -> None:
    records = [_rec(i, tokens_in=10 + i, itl_ms=[10] * (1 + i % 6)) for i in range(40)]
    records.append(_rec(40, tokens_in=None, prefill_ms=90))  # no prompt length: not bucketed
    diag = diagnose(records)
    phases = {p.phase: p for p in diag.phases}
    assert [p.phase for p in diag.phases] == ["queue", "prefill", "decode"]
    assert phases["queue"].mean_ms == pytest.approx(1.0)
    assert phases["queue"].n == 41
    assert 0 < phases["prefill"].share < 1
    assert sum(b.n for b in diag.prompt_buckets) == 40
    assert sum(b.n for b in diag.output_buckets) == 41
    assert 2 <= len(diag.prompt_buckets) <= 4
    # buckets do not overlap and are ordered
    for a, b in zip(diag.prompt_buckets, diag.prompt_buckets[1:], strict=False):
        assert a.hi < b.lo
    late = [b for b in diag.prompt_buckets if b.deadline_misses]
    assert not late  # the one late cycle has no prompt length
    assert all(b.e2e_n == b.n for b in diag.output_buckets)
    json.dumps(diag.to_dict())  # JSON-ready


def test_no_records_is_all_none() -> None:
    diag = diagnose([])
    assert diag.cycles == 0 and diag.deadline_misses == 0
    assert diag.tail.e2e_ratio is None and diag.median_itl_ms is None
    assert diag.phases == [] and diag.prompt_buckets == []


def test_a_given_up_cycle_is_split_into_its_parts_with_numbers() -> None:
    """A cycle the loop gave up on holds the phases its engine ran so far (queue, worker wait,
    prefill, decode); the diagnosis lists them per miss, and the report shows them."""
    from robot_latency.report.markdown import _slowest_misses

    rec = _rec(7, queue_ms=30, prefill_ms=50, itl_ms=[4] * 3, published_ms=99,
               source="fallback", reason="deadline")
    rec.phases_ns["worker_wait"] = 5 * MS
    rec.phases_ns["fallback"] = MS // 10
    rec.phases_ns["sample"] = 2 * MS  # inside decode: not a part of its own
    diag = diagnose([_rec(i) for i in range(5)] + [rec])
    (miss,) = diag.misses
    assert miss.model_miss and not miss.deadline_miss and miss.tokens_out == 4
    assert list(miss.parts_ms)[:5] == ["queue", "worker_wait", "prefill", "decode", "fallback"]
    assert miss.parts_ms["queue"] == pytest.approx(30) and miss.parts_ms["decode"] == 12
    assert "sample" not in miss.parts_ms
    # queue plus the wait behind an earlier aborted generation: 35 of 100 ms is queueing
    assert miss.cause == "queueing"
    assert sum(miss.parts_ms.values()) == pytest.approx(miss.cycle_ms)
    text = "\n".join(_slowest_misses(diag))
    assert "queue 30.0, worker_wait 5.0, prefill 50.0, decode 12.0" in text


def test_a_superseded_cycle_is_its_own_cause() -> None:
    rec = _rec(3, published_ms=None, source="none", reason="superseded", itl_ms=[10])
    rec.published_ns = None
    assert attribute_cause(rec, median_itl_ns=10 * MS) == "superseded"


def test_no_tail_verdict_from_a_few_samples() -> None:
    # A handful of cycles, lengths varying: the ratio alone would say "length variance" (or
    # "tight"), but a p99 of 7 samples is their max.
    few = [_rec(i, itl_ms=[10] * (1 + (i * 7) % 99)) for i in range(7)]
    tail = diagnose(few).tail
    assert tail.e2e_n == 7 and tail.verdict == VERDICT_TOO_FEW
    assert tail.e2e_ratio is not None  # the figures are still shown, with their n
    just = [_rec(i, itl_ms=[10] * (1 + (i * 7) % 99)) for i in range(TAIL_MIN_SAMPLES)]
    assert diagnose(just).tail.verdict == VERDICT_LENGTH
    short = just[:-1]
    assert diagnose(short).tail.verdict == VERDICT_TOO_FEW
