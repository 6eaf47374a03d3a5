"""PNG plots of one or more runs.

Every function takes ``runs`` (a sequence of ``(label, records, manifest)``, e.g.
:class:`~robot_latency.report.rundir.RunData`) and an output path, and returns the path written,
or None (with a log line) when there is nothing to plot, e.g. no inter-token gaps because every
cycle fell back. Figures are built with :class:`matplotlib.figure.Figure` directly: no pyplot,
no global state, safe off the main thread and without a display.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from robot_latency.records import CycleRecord
from robot_latency.report.diagnose import is_deadline_miss, is_model_miss, ordered_phases
from robot_latency.report.figsave import save_png
from robot_latency.report.phases import cycle_spans
from robot_latency.report.rundir import (
    RunData,
    deadline_ms,
    host_itl_floor_ms,
    target_device_id,
    target_itl_floor_ms,
    target_prediction,
)
from robot_latency.stats import wilson_interval

log = logging.getLogger(__name__)

#: Slowest cycles shown per run in the phase timeline.
TIMELINE_CYCLES = 10


#: What every plot takes: ``(label, records, manifest)`` per configuration.
Runs = Sequence[tuple[str, Sequence[CycleRecord], Mapping[str, Any] | None]]


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    return save_png(fig, path)


def _runs(runs: Runs) -> list[RunData]:
    return [RunData(*r) for r in runs]


def _plain_log_ticks(axis: Any) -> None:
    """Label a log axis 1, 2, 5, 10, 20, 50 rather than 10^0, and only there: labelling every
    minor tick runs the labels into each other (8 9 10) at the default size."""
    fmt = FuncFormatter(lambda v, _pos: f"{v:g}")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(fmt)
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(float(k) for k in range(1, 10))))
    axis.set_minor_formatter(NullFormatter())


def _cdf(ax: Axes, values_ms: Sequence[float], label: str) -> Line2D:
    xs = np.sort(np.asarray(values_ms, dtype=np.float64))
    ys = np.arange(1, xs.size + 1) / xs.size
    (line,) = ax.step(xs, ys, where="post", label=f"{label} (n={xs.size})")
    return line


def plot_itl_cdf(runs: Runs,
                 path: str | os.PathLike[str]) -> Path | None:
    """Plot the inter-token-gap CDF per configuration, with the host and target floor lines.

    The x axis is logarithmic (gaps span orders of magnitude when stalls occur). The host
    floor is a dashed line in the run's colour, the target floor a dotted one labelled with
    the device id.
    """
    data = [(r, [g / 1e6 for rec in r.records for g in rec.itl_ns]) for r in _runs(runs)]
    data = [(r, v) for r, v in data if v and min(v) > 0]
    if not data:
        log.info("ITL CDF not plotted: no inter-token gaps in any run")
        return None
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for run, values in data:
        colour = _cdf(ax, values, run.label).get_color()
        host = host_itl_floor_ms(run)
        if host is not None and host > 0:
            ax.axvline(host, color=colour, linestyle="--", linewidth=1,
                       label=f"{run.label}: host floor {host:.2f} ms")
        target = target_itl_floor_ms(run)
        if target is not None and target > 0:
            device = target_device_id(run) or "target"
            ax.axvline(target, color=colour, linestyle=":", linewidth=1.2,
                       label=f"{run.label}: {device} floor {target:.2f} ms")
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("inter-token latency (ms, log scale)")
    ax.set_ylabel("fraction of gaps ≤ x")
    ax.set_ylim(0, 1.02)
    ax.set_title("ITL CDF per configuration, with bandwidth-floor predictions")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def plot_ttft_cdf(runs: Runs,
                  path: str | os.PathLike[str]) -> Path | None:
    """Plot the time-to-first-token CDF per configuration, with the deadline lines."""
    data = [(r, [t / 1e6 for rec in r.records if (t := rec.ttft_ns) is not None])
            for r in _runs(runs)]
    data = [(r, v) for r, v in data if v]
    if not data:
        log.info("TTFT CDF not plotted: no cycle produced a token")
        return None
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    deadlines = set()
    for run, values in data:
        _cdf(ax, values, run.label)
        d = deadline_ms(run)
        if d is not None:
            deadlines.add(d)
    for d in sorted(deadlines):
        ax.axvline(d, color="red", linestyle="--", linewidth=1, label=f"deadline {d:g} ms")
    ax.set_xlabel("time to first token, from the scheduled start (ms)")
    ax.set_ylabel("fraction of cycles ≤ x")
    ax.set_ylim(0, 1.02)
    ax.set_title("TTFT CDF per configuration")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def plot_miss_rate(runs: Runs,
                   path: str | os.PathLike[str]) -> Path | None:
    """Plot deadline-miss and model-miss rates per configuration with 95% Wilson intervals."""
    data = [r for r in _runs(runs) if r.records]
    if not data:
        log.info("miss-rate plot not plotted: no cycles in any run")
        return None
    fig = Figure(figsize=(max(6, 1.3 * len(data) + 3), 5))
    ax = fig.add_subplot()
    x = np.arange(len(data))
    width = 0.38
    kinds = (("deadline miss (late or skipped)", is_deadline_miss, -width / 2),
             ("model miss (fallback answered)", is_model_miss, width / 2))
    for name, pred, offset in kinds:
        rates, lo_err, hi_err = [], [], []
        for run in data:
            n = len(run.records)
            k = sum(1 for rec in run.records if pred(rec))
            lo, hi = wilson_interval(k, n) or (0.0, 0.0)
            rate = k / n
            rates.append(100 * rate)
            lo_err.append(100 * (rate - lo))
            hi_err.append(100 * (hi - rate))
        ax.bar(x + offset, rates, width, yerr=[lo_err, hi_err], capsize=4, label=name)
    ax.set_xticks(x, [f"{r.label}\n(n={len(r.records)})" for r in data], fontsize=8)
    ax.set_ylabel("cycles (%), with 95% Wilson interval")
    ax.set_ylim(bottom=0)
    ax.set_title("Miss rate per configuration")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_phase_timeline(runs: Runs,
                        path: str | os.PathLike[str], *,
                        n_slowest: int = TIMELINE_CYCLES) -> Path | None:
    """Plot the phases of each run's ``n_slowest`` cycles (:func:`phase_timeline_figure`)."""
    fig = phase_timeline_figure(runs, n_slowest=n_slowest)
    return None if fig is None else _save(fig, path)


def phase_timeline_figure(runs: Runs, *, n_slowest: int = TIMELINE_CYCLES) -> Figure | None:
    """Draw the phases of each run's ``n_slowest`` cycles on their timeline, with the deadline.

    One panel per configuration; a bar per cycle (slowest at the top). Each phase is drawn where
    it ran (:func:`robot_latency.report.phases.cycle_spans`); a phase that is part of another
    (``sample`` and ``grammar`` inside ``decode``) is a thinner bar inside its parent, never laid
    after it. Cycles are ranked by scheduled-to-published time.
    """
    panels = []
    for run in _runs(runs):
        timed = [r for r in run.records if r.phases_ns and r.cycle_ns is not None]
        timed.sort(key=lambda r: r.cycle_ns or 0, reverse=True)
        if timed:
            panels.append((run, timed[:n_slowest][::-1]))
    if not panels:
        log.info("phase timeline not plotted: no cycle recorded its phases")
        return None
    names = ordered_phases({p for _, recs in panels for r in recs for p in r.phases_ns})
    cmap = _colours(len(names))
    colours = dict(zip(names, cmap, strict=True))
    height = sum(0.35 * len(recs) + 1.0 for _, recs in panels)
    fig = Figure(figsize=(9, max(3.0, height)))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    shown: set[str] = set()
    for ax, (run, recs) in zip(axes, panels, strict=True):
        y = np.arange(len(recs))
        for i, rec in enumerate(recs):
            for span in cycle_spans(rec):
                # Nested phases: thinner, drawn over their parent (parents come first).
                h = 0.8 * 0.6 ** span.depth
                ax.barh(i, span.dur_ns / 1e6, left=(span.start_ns - rec.scheduled_ns) / 1e6,
                        height=h, color=colours[span.name], zorder=2 + span.depth,
                        label=None if span.name in shown else
                        (span.name if span.parent is None else f"{span.name} (in {span.parent})"))
                shown.add(span.name)
        # the publish time, where the phases do not account for all of the cycle
        ax.scatter([(r.cycle_ns or 0) / 1e6 for r in recs], y, marker="|", s=120, color="black",
                   zorder=6, label=None if "published" in shown else "published")
        shown.add("published")
        d = deadline_ms(run)
        if d is not None:
            ax.axvline(d, color="red", linestyle="--", linewidth=1.2,
                       label=None if "deadline" in shown else "deadline")
            shown.add("deadline")
        ax.set_yticks(y, [_timeline_label(r) for r in recs], fontsize=7)
        ax.set_ylabel("cycle")
        ax.set_title(f"{run.label}: {len(recs)} slowest cycles", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    # The deadline inside every panel, not on its edge: room to its right, the same scale.
    ends = [(r.cycle_ns or 0) / 1e6 for _, recs in panels for r in recs]
    ends += [d for run, _ in panels if (d := deadline_ms(run)) is not None]
    for ax in axes:
        ax.set_xlim(0, max(ends) * 1.08 if ends and max(ends) > 0 else None)
    axes[-1].set_xlabel("time since the scheduled start (ms)")
    # One legend under the last panel (fig.legend floated above the panels).
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    below_in = 0.5  # under the x label, in inches, whatever the panel's height
    ax_h_in = axes[-1].get_position().height * fig.get_figheight()
    axes[-1].legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -below_in / ax_h_in),
                    ncol=min(4, len(labels)), fontsize=7, frameon=False)
    return fig


def _timeline_label(rec: CycleRecord) -> str:
    """A timeline row's label: the cycle, whether it missed, why it fell back, its tokens."""
    label = f"#{rec.cycle}" + (" miss" if is_deadline_miss(rec) else "")
    if rec.fallback_reason is not None:
        label += f" {rec.fallback_reason}"
    return label + f" {rec.tokens_out} tok"


def _colours(n: int) -> list[tuple[float, float, float, float]]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_measured_vs_predicted(runs: Runs,
                               path: str | os.PathLike[str]) -> Path | None:
    """Plot ITL against its floor (:func:`measured_vs_predicted_figure`)."""
    fig = measured_vs_predicted_figure(runs)
    return None if fig is None else _save(fig, path)


def measured_vs_predicted_figure(runs: Runs) -> Figure | None:
    """Draw ITL against its floor: measured on this host, and predicted on the target.

    Each run gives a filled point (host floor, measured ITL p50 on this host), its floor
    efficiency (floor / measured) in the legend, and, where the run carries a calibrated target
    prediction, a hollow triangle (target floor, predicted ITL on the target) with the
    prediction's interval as an error bar. The dashed y = x line is the floor itself: no point
    can lie below it.
    """
    points = []
    targets = []
    for run in _runs(runs):
        gaps = [g / 1e6 for rec in run.records for g in rec.itl_ns]
        floor = host_itl_floor_ms(run)
        if gaps and floor is not None and floor > 0:
            points.append((run.label, floor, float(np.median(gaps)), len(gaps)))
        pred = target_prediction(run)
        t_floor = target_itl_floor_ms(run)
        if pred is not None and t_floor is not None and t_floor > 0:
            targets.append((run.label, t_floor, pred, target_device_id(run) or "target"))
    if not points:
        log.info("measured-vs-predicted not plotted: no run has both ITL samples and a floor")
        return None
    fig = Figure(figsize=(6.5, 6))
    ax = fig.add_subplot()
    labels = list(dict.fromkeys([p[0] for p in points] + [t[0] for t in targets]))
    colour = dict(zip(labels, _colours(len(labels)), strict=True))
    for label, floor, measured, n in points:
        # The efficiency goes in the legend: labels next to close points overlap.
        ax.scatter([floor], [measured], s=40, color=colour[label], zorder=3,
                   label=f"{label}: measured here, floor eff. {floor / measured:.2f} (n={n})")
    values = [v for p in points for v in (p[1], p[2])]
    for label, t_floor, pred, device in targets:
        y = pred["itl_pred_ms"]
        interval = pred.get("itl_pred_interval_ms")
        yerr = None
        if isinstance(interval, list) and len(interval) == 2:
            yerr = [[max(0.0, y - interval[0])], [max(0.0, interval[1] - y)]]
            values += [interval[0], interval[1]]
        ax.errorbar([t_floor], [y], yerr=yerr, fmt="^", mfc="none", color=colour[label],
                    capsize=3, zorder=3,
                    label=f"{label}: predicted on {device} ({pred.get('engine_family')})")
        values += [t_floor, y]
    lo = min(values) * 0.5
    hi = max(values) * 2.0
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", label="y = x (at the floor)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis)
    _plain_log_ticks(ax.yaxis)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("ITL floor, bytes per step / bandwidth (ms/token, log scale)")
    ax.set_ylabel("ITL (ms/token): measured p50 here, or predicted on the target")
    ax.set_title("Decode step against its floor: measured here, predicted on the target",
                 fontsize=10)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    return fig


#: Every plot, by the file name the report gives it.
PLOTS = {
    "itl_cdf.png": plot_itl_cdf,
    "ttft_cdf.png": plot_ttft_cdf,
    "miss_rate.png": plot_miss_rate,
    "phase_timeline.png": plot_phase_timeline,
    "measured_vs_predicted.png": plot_measured_vs_predicted,
}


def write_plots(runs: Runs,
                out_dir: str | os.PathLike[str]) -> dict[str, Path | None]:
    """Write every plot into ``out_dir``; return file name -> path written (None: skipped)."""
    out = Path(out_dir)
    return {name: fn(runs, out / name) for name, fn in PLOTS.items()}
