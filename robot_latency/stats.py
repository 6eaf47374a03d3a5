"""Statistics of a run: percentiles with their sample counts, miss rate with a Wilson interval,
speculative decoding's alpha, cost ratio and speed-up, and the run summary built from them.

One module below the planner, the report and the ROS nodes, which all import it: the planner
writes ``summary.json`` when a run closes, the report compares runs, the node's diagnostics
publish rolling percentiles.

``summary.json`` layout (stable; later tools script against it)::

    {"cycles": N, "deadline_misses": M, "deadline_miss_rate": M/N,
     "deadline_miss_rate_ci95": [lo, hi], "fallbacks": {"deadline": 3, ...},
     "ttft_ms": {"p50":..., "p90":..., "p99":..., "max":..., "mean":..., "n": ...,
                 "p99_9": ... (null below 1,000 samples)},
     "itl_ms": {...}, "tpot_ms": {...}, "e2e_ms": {...}, "overshoot_ms": {...}, ...,
     "host_steal_ms": {"total": ..., "cycles_with_steal": ..., "n": ...} or null,
     "speculative": {"alpha": ..., "cost_ratio": ..., "predicted_speedup": ..., ...} or null,
     "energy_per_plan_j": {"p50": ..., ..., "n": ..., "source": ...} or {"source": "not measured"},
     "warnings": [...]}

A statistic with no samples is ``None``, never 0.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robot_latency.records import CycleRecord

#: z for a two-sided 95% interval.
Z_95 = 1.959963984540054

#: Fewer samples than this behind a p99 gets a warning (docs/REFERENCE.md, "Tail latency").
P99_MIN_SAMPLES = 1000

#: Samples a p99.9 needs before it is given (below it the p99.9 is None): with fewer, it is the
#: largest sample or an interpolation between the two largest, no tail figure.
P99_9_MIN_SAMPLES = 1000

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
    #: None below :data:`P99_9_MIN_SAMPLES` samples
    p99_9: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return asdict(self)


def distribution(values: Iterable[float]) -> Distribution:
    """Summarise samples: p50/p90/p99 (linear interpolation), max, mean and n; p99.9 where
    there are at least :data:`P99_9_MIN_SAMPLES` samples."""
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if arr.size == 0:
        return Distribution(None, None, None, None, None, 0)
    p50, p90, p99, p999 = np.percentile(arr, [50, 90, 99, 99.9])
    return Distribution(float(p50), float(p90), float(p99), float(arr.max()), float(arr.mean()),
                        int(arr.size),
                        float(p999) if arr.size >= P99_9_MIN_SAMPLES else None)


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


@dataclass
class SpecStats:
    """Speculative-decoding counters (times in ns): of one generation, or summed over a run.

    The one place alpha, the cost ratio c and the formula's speed-up are computed from counts.
    """

    k: int
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_ns: int = 0
    verify_ns: int = 0
    per_round: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted)

    def add_round(self, drafted: int, accepted: int, draft_ns: int, verify_ns: int) -> None:
        """Count one draft-and-verify round."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.draft_ns += draft_ns
        self.verify_ns += verify_ns
        self.per_round.append((drafted, accepted))

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance rate: accepted / drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def cost_ratio(self) -> float | None:
        """c: draft time per drafted token over target time per verify pass."""
        if not self.drafted or not self.rounds or not self.verify_ns:
            return None
        return (self.draft_ns / self.drafted) / (self.verify_ns / self.rounds)

    @property
    def tokens_per_round(self) -> float | None:
        """Tokens each round yields: the accepted ones plus the target's own."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else None

    @property
    def predicted_speedup(self) -> float | None:
        """The formula's speedup from the measured alpha and c (v taken as 0)."""
        # Imported here: the floor model reads GGUF metadata (gguf, numpy); the ROS nodes' use of
        # this module (rolling percentiles) should not pay for it at start-up.
        from robot_latency.floor.predict import specdec_speedup

        alpha, c = self.alpha, self.cost_ratio
        if alpha is None or c is None or self.k < 1:
            return None
        return specdec_speedup(min(alpha, 1.0), self.k, c)

    def to_dict(self) -> dict[str, Any]:
        """Return the record form (with the derived alpha, c and predicted speedup)."""
        d = asdict(self)
        d.update(alpha=self.alpha, cost_ratio=self.cost_ratio,
                 predicted_speedup=self.predicted_speedup)
        return d

    @classmethod
    def total(cls, per_cycle: Iterable[dict[str, Any]]) -> SpecStats:
        """Sum records' ``draft`` dicts (the :meth:`to_dict` form); k is the largest seen."""
        out = cls(k=0)
        for d in per_cycle:
            out.k = max(out.k, int(d.get("k") or 0))
            for key in ("rounds", "drafted", "accepted", "draft_ns", "verify_ns"):
                setattr(out, key, getattr(out, key) + int(d.get(key) or 0))
        return out


def speculative_summary(records: Sequence[CycleRecord]) -> dict[str, Any] | None:
    """Speculative decoding over a run: rounds, alpha, c and the formula's speedup (v = 0).

    ``alpha`` = accepted / drafted; ``cost_ratio`` (c) = draft time per drafted token over
    verify time per round; ``tokens_per_round`` = (accepted + one target token) per round.
    None when no cycle drafted. The measured speed-up needs the same target without a draft:
    ``robot-latency report`` puts it next to the reference run (``tpot_speedup``).
    """
    drafted = [r.draft for r in records if r.draft and r.draft.get("rounds")]
    if not drafted:
        return None
    total = SpecStats.total(drafted)
    return {"cycles": len(drafted), "k": total.k, "rounds": total.rounds,
            "drafted": total.drafted, "accepted": total.accepted, "alpha": total.alpha,
            "cost_ratio": total.cost_ratio, "tokens_per_round": total.tokens_per_round,
            "predicted_speedup": total.predicted_speedup}


def _steal_ms(records: Sequence[CycleRecord]) -> dict[str, Any] | None:
    """CPU time a hypervisor took during the run, and in how many cycles (None: not known)."""
    steal = [r.host_steal_ns for r in records if r.host_steal_ns is not None]
    if not steal:
        return None
    return {"total": sum(steal) / 1e6, "cycles_with_steal": sum(1 for s in steal if s > 0),
            "n": len(steal)}


def energy_per_plan(records: Sequence[CycleRecord]) -> dict[str, Any]:
    """Return the distribution of the measured J per plan (each cycle that published one, from
    the previous publish to its own), or ``{"source": "not measured ..."}`` where no record
    measured one: never 0."""
    measured = [r for r in records if r.energy_mj is not None and r.published_ns is not None]
    if not measured:
        why = next((r.energy_source for r in records if r.energy_source), "not measured")
        return {"source": why}
    out = distribution([r.energy_mj / 1e3 for r in measured]).to_dict()
    out["total_j"] = sum(r.energy_mj for r in measured) / 1e3
    out["source"] = measured[-1].energy_source
    return out


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
        "energy_per_plan_j": energy_per_plan(records),
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
