"""The fleet plot: deadline-miss rate (Wilson 95%) and ITL p99 against the number of robots
sharing one server (the seed's batching dial and queueing tail, measured)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure


def plot_fleet(sizes: Sequence[dict[str, Any]], path: str | Path, *,
               deadline_ms: float | None = None) -> Path:
    """Draw miss rate and ITL p99 (and TTFT p99) against N; return the PNG's path.

    Args:
        sizes: fleet summaries (:func:`robot_latency.planner.fleet.summarize_fleet`), any order.
        path: the PNG to write.
        deadline_ms: drawn as a line on the latency panel.
    """
    rows = sorted(sizes, key=lambda s: s["robots"])
    n = [s["robots"] for s in rows]
    rate = [100 * (s["miss_rate"] or 0.0) for s in rows]
    lo = [100 * s["miss_rate_ci95"][0] if s["miss_rate_ci95"] else 0.0 for s in rows]
    hi = [100 * s["miss_rate_ci95"][1] if s["miss_rate_ci95"] else 0.0 for s in rows]
    fig = Figure(figsize=(9, 3.6), constrained_layout=True)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.errorbar(n, rate, yerr=[[max(0.0, r - a) for r, a in zip(rate, lo, strict=True)],
                                [max(0.0, b - r) for r, b in zip(rate, hi, strict=True)]],
                 marker="o", capsize=4)
    ax1.set_xlabel("robots sharing the server")
    ax1.set_ylabel("deadline misses (%), Wilson 95%")
    ax1.set_xticks(n)
    ax1.set_ylim(bottom=0)
    for key, label, style in (("itl_ms", "ITL p99", "o-"), ("ttft_ms", "TTFT p99", "s--")):
        values = [s[key]["p99"] for s in rows]
        pts = [(x, y) for x, y in zip(n, values, strict=True) if y is not None]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    if deadline_ms:
        ax2.axhline(deadline_ms, color="grey", lw=0.8, ls=":", label="deadline")
    ax2.set_xlabel("robots sharing the server")
    ax2.set_ylabel("ms")
    ax2.set_xticks(n)
    ax2.set_yscale("log")
    ax2.legend(fontsize=8)
    fig.suptitle("One server, N robots: misses and latency tails")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
