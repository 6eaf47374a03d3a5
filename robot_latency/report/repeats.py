"""Repeated runs of one configuration: medians across runs, with a distribution-free interval.

``sweep --repeats N`` runs every configuration N times, round robin (each configuration once,
then each again: a slow stretch of the host lands on every configuration alike), and reports per
configuration the median across its runs of each figure, with the order-statistic interval for
the median: ``[x_(k), x_(n-k+1)]`` of the sorted runs' values covers the true median with
probability ``1 - 2 P(Bin(n, 1/2) <= k - 1)`` whatever the distribution; the largest ``k``
reaching 95% is taken, and with too few runs for 95% (fewer than 6) the interval is the range,
its own coverage stated (3 runs: 75%, 5 runs: 93.8%).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from robot_latency.report.compare import ComparisonRow
from robot_latency.report.table import markdown_lines

__all__ = ["REPEAT_METRICS", "MedianInterval", "median_interval", "repeat_lines",
           "repeat_summary"]

#: The comparison's figures summarized across runs (name, unit for the table).
REPEAT_METRICS: tuple[tuple[str, str], ...] = (
    ("ttft_p50_ms", "ms"), ("ttft_p99_ms", "ms"), ("itl_p50_ms", "ms"), ("itl_p99_ms", "ms"),
    ("deadline_miss_rate", "%"), ("model_miss_rate", "%"), ("fallback_rate", "%"),
    ("tpot_p50_ms", "ms"))


@dataclass(frozen=True)
class MedianInterval:
    """The median of ``n`` runs' values and its order-statistic interval at ``coverage``."""

    median: float
    lo: float
    hi: float
    coverage: float
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "lo": self.lo, "hi": self.hi,
                "coverage": self.coverage, "n": self.n}


def _binom_cdf_half(k: int, n: int) -> float:
    """P(Bin(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_interval(values: Sequence[float], confidence: float = 0.95) -> MedianInterval:
    """The median of ``values`` and the narrowest order-statistic interval for it reaching
    ``confidence`` (the range, with its own lower coverage, where none does).

    Raises:
        ValueError: no values.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval: no values")
    best_k, coverage = 1, 1.0 - 2.0 * _binom_cdf_half(0, n) if n > 1 else 0.0
    for k in range(1, n // 2 + 1):
        cov = 1.0 - 2.0 * _binom_cdf_half(k - 1, n)
        if cov >= confidence:
            best_k, coverage = k, cov
    return MedianInterval(statistics.median(xs), xs[best_k - 1], xs[n - best_k], coverage, n)


def repeat_summary(rows: Sequence[ComparisonRow], configuration_of: dict[str, str],
                   order: Sequence[str]) -> dict[str, Any]:
    """Per configuration, each figure's median across its runs with its interval.

    Args:
        rows: the comparison rows of every run (``label`` names the run).
        configuration_of: run label -> the configuration's label.
        order: the run labels in the order they ran.
    """
    groups: dict[str, list[ComparisonRow]] = {}
    for row in rows:
        groups.setdefault(configuration_of[row.label], []).append(row)
    out = []
    for config, runs in groups.items():
        figures: dict[str, Any] = {}
        for name, _ in REPEAT_METRICS:
            vals = [v for v in (getattr(r, name) for r in runs) if v is not None]
            figures[name] = None if not vals else {
                **median_interval(vals).to_dict(), "values": vals}
        out.append({"configuration": config, "runs": [r.label for r in runs],
                    "figures": figures})
    return {"repeats": max((len(c["runs"]) for c in out), default=0), "order": list(order),
            "configurations": out}


def _cell(fig: dict[str, Any] | None, unit: str) -> str:
    if fig is None:
        return "-"
    scale, spec = (100.0, ".1f") if unit == "%" else (1.0, ".2f")
    return (f"{scale * fig['median']:{spec}} [{scale * fig['lo']:{spec}}, "
            f"{scale * fig['hi']:{spec}}]")


def repeat_lines(summary: dict[str, Any]) -> list[str]:
    """Markdown lines: one row per configuration, each figure's median [interval] across runs."""
    configs = summary["configurations"]
    if not configs:
        return []
    covs = sorted({f["coverage"] for c in configs for f in c["figures"].values() if f})
    cov = ", ".join(f"{100 * c:.1f}%" for c in covs) or "-"
    head = [f"Median across {summary['repeats']} runs per configuration, run round robin "
            f"[the order-statistic interval of the median: {cov} coverage]:", ""]
    rows = [[c["configuration"].replace("|", "\\|"), str(len(c["runs"])),
             *(_cell(c["figures"][name], unit) for name, unit in REPEAT_METRICS)]
            for c in configs]
    return head + markdown_lines(["configuration", "runs",
                                  *(f"{n} ({u})" if u == "%" else n
                                    for n, u in REPEAT_METRICS)], rows, aligned=False)
