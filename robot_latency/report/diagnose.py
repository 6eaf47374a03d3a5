"""Tail diagnosis: why a run's slow cycles are slow, and what each miss was caused by.

Two kinds of miss (docs/REFERENCE.md, "Tail latency"; both are counted, neither hides the other):

* **deadline miss** (``deadline_misses``): the loop broke its promise. No plan was published by
  the deadline: published late, or the cycle was skipped after an overrun. This is the same
  count as ``summary.json``'s ``deadline_misses`` (``not record.deadline_met``).
* **model miss** (``model_misses``): the model did not deliver the plan, and a fallback
  answered instead: ``plan_source == "fallback"``, whatever the ``fallback_reason`` (out of
  time, engine error or unavailable, a server unreachable, failing or malformed, invalid
  output, a bad or no command). Every fallback is a model miss, so the model-miss count equals
  the fallback count in every table. A model miss answered in time is *not* a deadline miss;
  that is the fallback doing its job.

Every cycle that is either kind of miss is attributed to exactly one cause, by the first rule
that matches, in this order (thresholds are module constants):

1. ``skipped``: the cycle was skipped (the loop was still busy with an earlier one).
2. ``superseded``: a newer command preempted the generation (``on_new_command: preempt``); the
   command got no plan of its own.
3. ``engine_fault``: ``engine_error`` is set, or the fallback reason is one of
   :data:`ENGINE_FAULT_REASONS` (the engine failed or was not loaded; the server was
   unreachable, answered an error or a malformed stream).
4. ``invalid_output``: the model's output did not parse or validate (fallback reason
   ``invalid_output``).
5. ``bad_command``: the command itself could not be planned for (fallback reason
   ``bad_command`` or ``no_command``).
6. ``host_steal``: a hypervisor stopped this virtual machine during the cycle
   (``host_steal_ns``, Linux's steal counter): at least as long as the plan was late (a late
   publish), or for over :data:`STEAL_SHARE` of the deadline budget (a model miss). Nothing
   inside the guest causes or prevents it; a Jetson never shows it.
7. ``publish_late``: published late although the model's last token came by the deadline; the
   time went after the model (parsing, grammar, fallback, publishing), not in it.
8. ``queueing``: the queue wait (scheduled to started, plus ``worker_wait``: the engine worker
   still finishing an earlier, aborted generation) exceeds :data:`QUEUE_SHARE` of the deadline
   budget.
9. ``stall``: one inter-token gap of the cycle exceeds :data:`STALL_FACTOR` x the run's median
   inter-token gap.
10. ``prefill_too_long``: the prefill phase exceeds :data:`PREFILL_SHARE` of the deadline budget,
   or no token came at all before the cycle gave up (the whole budget went before the first
   token).
11. ``decode_too_slow``: everything else: tokens came steadily, just too slowly or too many.

The tail verdict (E2E against TPOT p99/p50) needs :data:`TAIL_MIN_SAMPLES` samples of each;
with fewer it says so (:data:`VERDICT_TOO_FEW`) instead of judging the tail.

The deadline budget is each record's own (``deadline_ns - scheduled_ns``) unless ``deadline_ms``
is given.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from robot_latency.records import CycleRecord

log = logging.getLogger(__name__)

#: Causes a miss is attributed to, in rule order.
CAUSES = ("skipped", "superseded", "engine_fault", "invalid_output", "bad_command", "host_steal",
          "publish_late", "queueing", "stall", "prefill_too_long", "decode_too_slow")

#: Fallback reasons of an engine or server that failed (the ``engine_fault`` cause).
ENGINE_FAULT_REASONS = ("engine_error", "engine_unavailable", "server_unreachable",
                        "server_error", "server_malformed")

#: Hypervisor steal above this fraction of the deadline budget makes a model miss "host_steal".
STEAL_SHARE = 0.1
#: Queue wait above this fraction of the deadline budget makes a miss "queueing".
QUEUE_SHARE = 0.25
#: One inter-token gap above this multiple of the run's median gap makes a miss a "stall".
STALL_FACTOR = 5.0
#: A prefill above this fraction of the deadline budget makes a miss "prefill_too_long".
PREFILL_SHARE = 0.5

#: TPOT p99/p50 at or above this: per-token decode itself is unstable.
TPOT_UNSTABLE_RATIO = 1.5
#: E2E p99/p50 at or above this multiple of TPOT's: the E2E tail comes from elsewhere.
E2E_OVER_TPOT = 1.5

VERDICT_UNSTABLE = "per-token decode itself is unstable"
VERDICT_LENGTH = "length variance or prefill/queueing, not a slow decoder"
#: Fewest E2E and TPOT samples (each) behind a tail verdict. Below 100 samples numpy's p99
#: (linear interpolation) lies between the two largest samples, so p99/p50 is little more than
#: max/median: one slow cycle, not a tail.
TAIL_MIN_SAMPLES = 100

VERDICT_TIGHT = "tight tail: E2E and TPOT p99/p50 are both small"
VERDICT_NO_DATA = "not enough data (needs E2E and TPOT samples)"
VERDICT_TOO_FEW = (f"too few samples for a tail verdict (needs at least {TAIL_MIN_SAMPLES} "
                   "E2E and TPOT samples each)")

#: Phases in the order they run in a cycle; others follow alphabetically.
PHASE_ORDER = ("queue", "worker_wait", "tokenize", "image_encode", "image_prefill", "prefill",
               "decode", "grammar", "abort", "fallback", "publish")

#: Quantile buckets per length axis (fewer when there are fewer distinct lengths).
N_BUCKETS = 4


def is_deadline_miss(rec: CycleRecord) -> bool:
    """The plan was not published by the deadline (late or skipped)."""
    return not rec.deadline_met


def is_model_miss(rec: CycleRecord) -> bool:
    """The model did not deliver and a fallback answered, for any reason (module docstring)."""
    return rec.plan_source == "fallback"


def _ms(values_ns: Sequence[float]) -> list[float]:
    return [v / 1e6 for v in values_ns]


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else None


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


@dataclass(frozen=True)
class TailRatio:
    """E2E versus TPOT tail width (p99/p50), with the sample counts and the verdict."""

    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    e2e_ratio: float | None
    e2e_n: int
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    tpot_ratio: float | None
    tpot_n: int
    itl_ratio: float | None
    itl_n: int
    verdict: str


@dataclass(frozen=True)
class PhaseStat:
    """Time in one phase: mean and p99 over the cycles where it ran, and its share of all time.

    ``share`` is the phase's total time over the total cycle time (scheduled to published) of all
    cycles; shares need not sum to 1 (an engine may report overlapping phases).
    """

    phase: str
    n: int
    mean_ms: float
    p99_ms: float
    share: float | None


@dataclass(frozen=True)
class Bucket:
    """Cycles whose length (prompt or output tokens) lies in ``[lo, hi]``."""

    lo: int
    hi: int
    n: int
    deadline_misses: int
    model_misses: int
    deadline_miss_rate: float
    model_miss_rate: float
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    e2e_n: int


@dataclass(frozen=True)
class MissCause:
    """One attributed miss: which cycle, which kinds of miss it was, and its cause."""

    cycle: int
    deadline_miss: bool
    model_miss: bool
    cause: str
    #: the cycle's time by part (top-level phases, ms), what was left unaccounted for up to
    #: the publish (``other``), and the tokens the model had produced when it was given up
    parts_ms: dict[str, float] = field(default_factory=dict)
    tokens_out: int = 0
    cycle_ms: float | None = None


@dataclass
class Diagnosis:
    """The tail diagnosis of one run (see the module docstring for every definition)."""

    cycles: int
    deadline_ms: float | None
    deadline_misses: int
    model_misses: int
    tail: TailRatio
    phases: list[PhaseStat]
    prompt_buckets: list[Bucket]
    output_buckets: list[Bucket]
    #: Per cause: every attributed cycle counted once.
    causes: dict[str, int]
    #: Per cause, deadline misses only (late or skipped).
    causes_deadline: dict[str, int]
    #: Per cause, model misses only (a fallback answered).
    causes_model: dict[str, int]
    median_itl_ms: float | None
    misses: list[MissCause] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return asdict(self)


def _tail_ratio(records: Sequence[CycleRecord]) -> TailRatio:
    e2e = _ms([r.e2e_ns for r in records if r.e2e_ns is not None])
    tpot = _ms([t for r in records if (t := r.tpot_ns) is not None])
    itl = _ms([g for r in records for g in r.itl_ns])
    e2e50, e2e99 = _pct(e2e, 50), _pct(e2e, 99)
    tp50, tp99 = _pct(tpot, 50), _pct(tpot, 99)
    e2e_ratio, tpot_ratio = _ratio(e2e99, e2e50), _ratio(tp99, tp50)
    if e2e_ratio is None or tpot_ratio is None:
        verdict = VERDICT_NO_DATA
    elif min(len(e2e), len(tpot)) < TAIL_MIN_SAMPLES:
        verdict = VERDICT_TOO_FEW
    elif tpot_ratio >= TPOT_UNSTABLE_RATIO:
        verdict = VERDICT_UNSTABLE
    elif e2e_ratio >= E2E_OVER_TPOT * tpot_ratio:
        verdict = VERDICT_LENGTH
    else:
        verdict = VERDICT_TIGHT
    return TailRatio(e2e50, e2e99, e2e_ratio, len(e2e), tp50, tp99, tpot_ratio, len(tpot),
                     _ratio(_pct(itl, 99), _pct(itl, 50)), len(itl), verdict)


def phase_split(records: Sequence[CycleRecord]) -> list[PhaseStat]:
    """Return time per phase (mean and p99 ms where it ran, share of the total cycle time)."""
    per_phase: dict[str, list[int]] = {}
    for rec in records:
        for name, value in rec.phases_ns.items():
            per_phase.setdefault(name, []).append(value)
    total_ns = sum(c for r in records if (c := r.cycle_ns) is not None)
    out = []
    for name in ordered_phases(per_phase):
        values = _ms(per_phase[name])
        share = sum(per_phase[name]) / total_ns if total_ns > 0 else None
        out.append(PhaseStat(name, len(values), float(np.mean(values)),
                             float(np.percentile(values, 99)), share))
    return out


def ordered_phases(names: Any) -> list[str]:
    """Return phase names in cycle order (:data:`PHASE_ORDER`), unknown ones after, sorted."""
    names = set(names)
    return [p for p in PHASE_ORDER if p in names] + sorted(names - set(PHASE_ORDER))


def _edges(values: Sequence[int], n_buckets: int) -> list[tuple[int, int]]:
    """Bucket bounds ``[(lo, hi), ...]``: one per distinct value when few, else by quantile."""
    distinct = sorted(set(values))
    if not distinct:
        return []
    if len(distinct) <= n_buckets:
        return [(v, v) for v in distinct]
    qs = np.quantile(np.asarray(values, dtype=np.float64), np.linspace(0, 1, n_buckets + 1))
    cuts = sorted({int(np.ceil(q)) for q in qs[1:-1]})
    bounds = []
    lo = distinct[0]
    for cut in cuts:
        if lo <= cut - 1 < distinct[-1]:
            bounds.append((lo, cut - 1))
            lo = cut
    bounds.append((lo, distinct[-1]))
    # drop buckets no value falls in (quantile cuts between two distinct values)
    return [(a, b) for a, b in bounds if any(a <= v <= b for v in distinct)]


def length_buckets(records: Sequence[CycleRecord], key: Callable[[CycleRecord], int | None],
                   *, n_buckets: int = N_BUCKETS) -> list[Bucket]:
    """Bucket cycles by a length (``key``; None excludes a cycle) with miss rates and E2E."""
    keyed = [(k, r) for r in records if (k := key(r)) is not None]
    out = []
    for lo, hi in _edges([k for k, _ in keyed], n_buckets):
        members = [r for k, r in keyed if lo <= k <= hi]
        e2e = _ms([r.e2e_ns for r in members if r.e2e_ns is not None])
        dm = sum(1 for r in members if is_deadline_miss(r))
        mm = sum(1 for r in members if is_model_miss(r))
        out.append(Bucket(lo, hi, len(members), dm, mm, dm / len(members), mm / len(members),
                          _pct(e2e, 50), _pct(e2e, 99), len(e2e)))
    return out


def attribute_cause(rec: CycleRecord, *, median_itl_ns: float | None,
                    deadline_ns: float | None = None) -> str:
    """Return the cause of one missed cycle (rules in the module docstring).

    Args:
        rec: the missed cycle.
        median_itl_ns: the run's median inter-token gap (ns); None disables the stall rule.
        deadline_ns: the deadline budget (ns); default: the record's own.
    """
    budget = deadline_ns if deadline_ns is not None else rec.deadline_budget_ns
    if rec.skipped or rec.fallback_reason == "skipped":
        return "skipped"
    if rec.fallback_reason == "superseded":
        return "superseded"
    if rec.engine_error or rec.fallback_reason in ENGINE_FAULT_REASONS:
        return "engine_fault"
    if rec.fallback_reason == "invalid_output":
        return "invalid_output"
    if rec.fallback_reason in ("bad_command", "no_command"):
        return "bad_command"
    if rec.host_steal_ns and rec.published_ns is not None:
        late = rec.published_ns - rec.deadline_ns
        explained = (rec.host_steal_ns >= late if late > 0
                     else rec.host_steal_ns > STEAL_SHARE * budget)
        if explained:
            return "host_steal"
    if (rec.token_ns and rec.published_ns is not None and rec.token_ns[-1] <= rec.deadline_ns
            < rec.published_ns):
        return "publish_late"
    queue = rec.queue_wait_ns
    if queue is None:
        queue = rec.phases_ns.get("queue")
    if queue is not None:
        queue += rec.phases_ns.get("worker_wait", 0)  # behind an earlier, aborted generation
    if queue is not None and budget > 0 and queue > QUEUE_SHARE * budget:
        return "queueing"
    if median_itl_ns is not None and median_itl_ns > 0:
        if any(g > STALL_FACTOR * median_itl_ns for g in rec.itl_ns):
            return "stall"
    prefill = rec.phases_ns.get("prefill")
    if prefill is not None and budget > 0 and prefill > PREFILL_SHARE * budget:
        return "prefill_too_long"
    if not rec.token_ns:
        return "prefill_too_long"  # the whole budget went before a first token
    return "decode_too_slow"


def miss_parts_ms(rec: CycleRecord) -> dict[str, float]:
    """Split a cycle's time into its parts (ms), in cycle order.

    The top-level phases (``sample``/``grammar`` are inside ``decode``); ``other`` is the
    cycle time (scheduled to published) the phases do not cover: prompt building, the pipe to
    the engine worker, the wake-up. A cycle given up on holds the phases its engine ran until
    the loop gave up (queue, prefill, decode so far).
    """
    from robot_latency.report.phases import top_level_phases

    top = top_level_phases({k: int(v) for k, v in rec.phases_ns.items() if v is not None})
    parts = {name: top[name] / 1e6 for name in ordered_phases(top)}
    if rec.cycle_ns is not None:
        other = rec.cycle_ns - sum(v for k, v in top.items() if k != "publish")
        if other > 0:
            parts["other"] = other / 1e6
    return parts


def diagnose(records: Sequence[CycleRecord], *, deadline_ms: float | None = None) -> Diagnosis:
    """Diagnose a run's tail: E2E vs TPOT width, phase split, length buckets, miss causes.

    Args:
        records: the run's cycle records.
        deadline_ms: the deadline budget to judge against; default: each record's own.

    Returns:
        A :class:`Diagnosis`; statistics without samples are None.
    """
    itl_all = [g for r in records for g in r.itl_ns]
    median_itl_ns = float(np.median(itl_all)) if itl_all else None
    budget_ns = None if deadline_ms is None else deadline_ms * 1e6
    misses = []
    for rec in records:
        dm, mm = is_deadline_miss(rec), is_model_miss(rec)
        if dm or mm:
            misses.append(MissCause(rec.cycle, dm, mm, attribute_cause(
                rec, median_itl_ns=median_itl_ns, deadline_ns=budget_ns),
                miss_parts_ms(rec), rec.tokens_out,
                None if rec.cycle_ns is None else rec.cycle_ns / 1e6))

    def count(selected: list[MissCause]) -> dict[str, int]:
        c = Counter(m.cause for m in selected)
        return {cause: c.get(cause, 0) for cause in CAUSES}

    if deadline_ms is None and records:
        budgets = sorted(r.deadline_budget_ns for r in records)
        deadline_ms = budgets[len(budgets) // 2] / 1e6
    return Diagnosis(
        cycles=len(records),
        deadline_ms=deadline_ms,
        deadline_misses=sum(1 for m in misses if m.deadline_miss),
        model_misses=sum(1 for m in misses if m.model_miss),
        tail=_tail_ratio(records),
        phases=phase_split(records),
        prompt_buckets=length_buckets(records, lambda r: r.tokens_in),
        output_buckets=length_buckets(records, lambda r: r.tokens_out),
        causes=count(misses),
        causes_deadline=count([m for m in misses if m.deadline_miss]),
        causes_model=count([m for m in misses if m.model_miss]),
        median_itl_ms=None if median_itl_ns is None else median_itl_ns / 1e6,
        misses=misses,
    )
