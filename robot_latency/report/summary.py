"""Summaries of a run: percentiles with their sample counts, miss rate with a Wilson interval.

``summary.json`` layout (stable; later tools script against it)::

    {"cycles": N, "deadline_misses": M, "deadline_miss_rate": M/N,
     "deadline_miss_rate_ci95": [lo, hi], "fallbacks": {"deadline": 3, ...},
     "ttft_ms": {"p50":..., "p90":..., "p99":..., "max":..., "mean":..., "n": ...},
     "itl_ms": {...}, "tpot_ms": {...}, "e2e_ms": {...}, "overshoot_ms": {...}, ...,
     "host_steal_ms": {"total": ..., "cycles_with_steal": ..., "n": ...} or null,
     "speculative": {"alpha": ..., "cost_ratio": ..., "predicted_speedup": ..., ...} or null,
     "warnings": [...]}

A statistic with no samples is ``None``, never 0.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.records import CycleRecord

#: z for a two-sided 95% interval.
Z_95 = 1.959963984540054

#: Fewer samples than this behind a p99 gets a warning (REFERENCE section 3).
P99_MIN_SAMPLES = 1000

#: Per-cycle metrics summarised, in output order; ``itl_ms`` pools every gap of every cycle.
METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "overshoot_ms", "queue_wait_ms",
           "reaction_ms", "cycle_ms")


@dataclass(frozen=True)
class Distribution:
    """Percentiles of one metric, with the sample count behind them."""

    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    mean: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return asdict(self)


def distribution(values: Iterable[float]) -> Distribution:
    """Summarise samples: p50/p90/p99 (linear interpolation), max, mean and n."""
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if arr.size == 0:
        return Distribution(None, None, None, None, None, 0)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Distribution(float(p50), float(p90), float(p99), float(arr.max()), float(arr.mean()),
                        int(arr.size))


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float] | None:
    """Return the Wilson score interval for a proportion, or None when n == 0.

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 or n successes,
    which is where a deadline-miss rate usually sits.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return None
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At 0 or n successes the bound is exactly 0 or 1; say so rather than leave rounding dust.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def _metric_values(records: Sequence[CycleRecord], metric: str) -> list[float]:
    if metric == "itl_ms":
        return [g / 1e6 for r in records for g in r.itl_ns]
    attr = metric[: -len("_ms")] + "_ns"
    values = (getattr(r, attr) for r in records)
    return [v / 1e6 for v in values if v is not None]


def speculative_summary(records: Sequence[CycleRecord]) -> dict[str, Any] | None:
    """Speculative decoding over a run: rounds, alpha, c and the formula's speedup (v = 0).

    ``alpha`` = accepted / drafted; ``cost_ratio`` (c) = draft time per drafted token over
    verify time per round; ``tokens_per_round`` = (accepted + one target token) per round.
    None when no cycle drafted. The measured speed-up needs the same target without a draft:
    ``robot-latency report`` puts it next to the reference run (``tpot_speedup``).
    """
    from robot_latency.floor.predict import specdec_speedup

    stats = [r.draft for r in records if r.draft and r.draft.get("rounds")]
    if not stats:
        return None
    total = {key: sum(int(d.get(key) or 0) for d in stats)
             for key in ("rounds", "drafted", "accepted", "draft_ns", "verify_ns")}
    k = max(int(d.get("k") or 0) for d in stats)
    alpha = total["accepted"] / total["drafted"] if total["drafted"] else None
    c = None
    if total["drafted"] and total["verify_ns"]:
        c = (total["draft_ns"] / total["drafted"]) / (total["verify_ns"] / total["rounds"])
    predicted = (specdec_speedup(min(alpha, 1.0), k, c)
                 if alpha is not None and c is not None and k else None)
    return {"cycles": len(stats), "k": k, **{key: total[key] for key in
                                            ("rounds", "drafted", "accepted")},
            "alpha": alpha, "cost_ratio": c,
            "tokens_per_round": (total["accepted"] + total["rounds"]) / total["rounds"],
            "predicted_speedup": predicted}


def _steal_ms(records: Sequence[CycleRecord]) -> dict[str, Any] | None:
    """CPU time a hypervisor took during the run, and in how many cycles (None: not known)."""
    steal = [r.host_steal_ns for r in records if r.host_steal_ns is not None]
    if not steal:
        return None
    return {"total": sum(steal) / 1e6, "cycles_with_steal": sum(1 for s in steal if s > 0),
            "n": len(steal)}


def summarize(records: Sequence[CycleRecord]) -> dict[str, Any]:
    """Return the summary of a run's records (the ``summary.json`` layout above)."""
    n = len(records)
    misses = sum(1 for r in records if not r.deadline_met)
    ci = wilson_interval(misses, n)
    fallbacks = Counter(r.fallback_reason for r in records if r.plan_source != "model"
                        and r.fallback_reason is not None)
    out: dict[str, Any] = {
        "cycles": n,
        "deadline_misses": misses,
        "deadline_miss_rate": misses / n if n else None,
        "deadline_miss_rate_ci95": list(ci) if ci is not None else None,
        "skipped_cycles": sum(1 for r in records if r.skipped),
        "fallbacks": dict(sorted(fallbacks.items())),
        "plan_sources": dict(sorted(Counter(r.plan_source for r in records).items())),
        "host_steal_ms": _steal_ms(records),
        "speculative": speculative_summary(records),
    }
    warnings: list[str] = []
    for metric in METRICS:
        dist = distribution(_metric_values(records, metric))
        out[metric] = dist.to_dict()
        if 0 < dist.n < P99_MIN_SAMPLES:
            warnings.append(f"{metric}: p99 from only {dist.n} samples "
                            f"(fewer than {P99_MIN_SAMPLES}; it is not stable)")
    out["warnings"] = warnings
    return out


def write_summary(summary: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a summary as pretty JSON, atomically (a reader never sees half a file)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p
