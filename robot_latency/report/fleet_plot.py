"""The fleet plot: against the number of robots sharing one server, the share of cycles the
model planned, the fallbacks' share and the deadline misses (each fallback's and miss's Wilson
95% interval), and ITL and TTFT p99 (the seed's batching dial and queueing tail, measured).

The fallback keeps deadline misses near 0 at any fleet size; the model's plans giving way to
fallbacks is where a fleet degrades, so both are drawn beside the misses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure


def _rate_line(ax: Axes, n: list[int], rows: Sequence[dict[str, Any]], key: str,
               ci_key: str | None, label: str, style: str) -> None:
    """One rate (%) against N, with its Wilson 95% bars where the summary has them."""
    pts = [(x, 100 * s[key], s.get(ci_key) if ci_key else None)
           for x, s in zip(n, rows, strict=True) if s.get(key) is not None]
    if not pts:
        return
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if ci_key:
        lo = [max(0.0, y - 100 * ci[0]) if ci else 0.0 for _, y, ci in pts]
        hi = [max(0.0, 100 * ci[1] - y) if ci else 0.0 for _, y, ci in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, capsize=4, label=label)
    else:
        ax.plot(xs, ys, style, label=label)


def plot_fleet(sizes: Sequence[dict[str, Any]], path: str | Path, *,
               deadline_ms: float | None = None) -> Path:
    """Draw model plans, fallbacks and deadline misses (%), and ITL and TTFT p99, against N;
    return the PNG's path.

    Args:
        sizes: fleet summaries (:func:`robot_latency.planner.fleet.summarize_fleet`), any order.
        path: the PNG to write.
        deadline_ms: drawn as a line on the latency panel.
    """
    rows = sorted(sizes, key=lambda s: s["robots"])
    n = [s["robots"] for s in rows]
    fig = Figure(figsize=(9, 3.6), constrained_layout=True)
    ax1, ax2 = fig.subplots(1, 2)
    _rate_line(ax1, n, rows, "model_plan_rate", None, "model plans", "o-")
    _rate_line(ax1, n, rows, "fallback_rate", "fallback_rate_ci95", "fallbacks (model misses)",
               "s--")
    _rate_line(ax1, n, rows, "miss_rate", "miss_rate_ci95", "deadline misses", "^:")
    ax1.set_xlabel("robots sharing the server")
    ax1.set_ylabel("share of cycles (%), Wilson 95%")
    ax1.set_xticks(n)
    ax1.set_ylim(0, 105)
    ax1.legend(fontsize=8)
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
    fig.suptitle("One server, N robots: model plans, fallbacks, misses and latency tails")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out
