"""The report's "Operating envelope" section: the runs' levels in every power mode of the target.

Where the run directories keep the target's inputs (``target.json``: the untimed pass, the
stream, the loop's rules) and predict from the published table (a ``--calibration`` file is
fitted for one device, not its other modes), every level is simulated in every nvpmodel mode of
the target device's module by :func:`robot_latency.report.envelope.envelope` (the same answer
``robot-latency envelope`` prints), and the section holds its table, the "put on the robot" pick
and what each figure rests on, with a Pareto plot of the predicted receiver miss rate against J
per plan (``envelope_pareto.png``: one point per level x mode, the pick marked, the cells no
other beats on both axes joined). A section of more than :data:`MAX_CELLS` cells is skipped
(said so in one line): the report stays cheap.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from robot_latency.floor.devices import power_modes_of
from robot_latency.floor.errors import FloorError
from robot_latency.planner.target_inputs import TargetInputs, read_target_inputs
from robot_latency.planner.target_sim import DEFAULT_DRAWS, DEFAULT_MISS_TARGET
from robot_latency.planner.untimed import UntimedError
from robot_latency.report.envelope import EnvelopeCell, ModuleEnvelope, envelope, envelope_lines
from robot_latency.report.figsave import save_png

__all__ = ["MAX_CELLS", "PARETO_PLOT", "envelope_section", "pareto_front", "plot_pareto"]

log = logging.getLogger(__name__)

#: More level x mode cells than this and the report skips the section (each cell is a Monte
#: Carlo with a capacity search: about 0.1 s).
MAX_CELLS = 200
#: The Pareto plot's file name in the report directory.
PARETO_PLOT = "envelope_pareto.png"


def _levels(labels: Sequence[str], run_dirs: Sequence[str | os.PathLike[str]]
            ) -> tuple[list[tuple[str, TargetInputs]], str | None]:
    """The runs' (label, inputs) for the envelope, or none and why not."""
    levels: list[tuple[str, TargetInputs]] = []
    for label, d in zip(labels, run_dirs, strict=True):
        try:
            inputs = read_target_inputs(d)
        except UntimedError:  # the opening section says so already
            continue
        if inputs is None:
            continue
        if inputs.calibration:
            return [], (f"{label} predicts from a calibration file ({inputs.calibration}), "
                        "fitted for one device: no other power mode to answer for")
        levels.append((label, inputs))
    if not levels:
        return [], None
    return levels, None


def envelope_section(labels: Sequence[str], run_dirs: Sequence[str | os.PathLike[str]],
                     out: Path, *, transport_margin_ms: float | None = None,
                     miss_target: float = DEFAULT_MISS_TARGET, draws: int = DEFAULT_DRAWS,
                     max_cells: int = MAX_CELLS) -> list[str]:
    """Return the report's "Operating envelope" section (Markdown lines; none where the runs
    keep no target inputs), writing the Pareto plot into ``out``.

    Args:
        labels: the runs' labels (each run a level), in the report's order.
        run_dirs: their directories.
        out: the report directory.
        transport_margin_ms: the target's measured transport margin (None: the stated one).
        miss_target: the receiver miss rate held (the pick's rule).
        draws: Monte Carlo draws per cell.
        max_cells: skip the section past this many level x mode cells.
    """
    levels, why_not = _levels(labels, run_dirs)
    if why_not is not None:
        return ["## Operating envelope", "", f"Not answered: {why_not}.", ""]
    if not levels:
        return []
    device_ids = sorted({inputs.device_id for _, inputs in levels})
    try:
        modes = {s.id for d in device_ids for s in power_modes_of(d)}
    except FloorError as err:
        log.warning("operating envelope: %s", err)
        return []
    cells = len(levels) * len(modes)
    head = ["## Operating envelope", "",
            f"Every level of these runs in every power mode of {', '.join(device_ids)}'s module "
            "(each mode a datasheet of its own), the loop simulated on the target as in the "
            "opening section, as `robot-latency envelope` answers it.", ""]
    if cells > max_cells:
        return [*head, f"Skipped: {len(levels)} levels x {len(modes)} power modes = {cells} "
                f"cells, more than the report's {max_cells} (run `robot-latency envelope`).", ""]
    try:
        modules = envelope(levels, device_ids, all_modes=True, miss_target=miss_target,
                           draws=draws, transport_margin_ms=transport_margin_ms)
    except (FloorError, UntimedError, ValueError) as err:
        log.warning("operating envelope: %s", err)
        return [*head, f"Not answered: {err}.", ""]
    lines = [*head, *envelope_lines(modules, miss_target=miss_target)]
    plot = plot_pareto(modules, out / PARETO_PLOT, miss_target=miss_target)
    if plot is not None:
        lines += [f"![Predicted miss rate against J per plan]({plot.name})", "",
                  "Each point a level in a power mode (energy uncalibrated cells have no J and "
                  "no point); the line joins the cells no other beats on both miss rate and J "
                  "per plan; the star is the pick.", ""]
    return lines


def pareto_front(cells: Sequence[EnvelopeCell]) -> list[EnvelopeCell]:
    """The cells with energy no other cell beats on both J per plan and predicted miss rate
    (lower is better on each; a tie on both keeps both), in order of J per plan."""
    have = [c for c in cells if c.energy_j is not None]

    def beaten(c: EnvelopeCell) -> bool:
        return any((o.energy_j or 0) <= (c.energy_j or 0)
                   and o.answer.miss_rate <= c.answer.miss_rate
                   and ((o.energy_j or 0) < (c.energy_j or 0)
                        or o.answer.miss_rate < c.answer.miss_rate) for o in have)

    return sorted((c for c in have if not beaten(c)),
                  key=lambda c: (c.energy_j or 0, c.answer.miss_rate))


def plot_pareto(modules: Sequence[ModuleEnvelope], path: str | os.PathLike[str], *,
                miss_target: float) -> Path | None:
    """Plot predicted receiver miss rate against J per plan, one point per level x mode with
    energy, the Pareto front joined and each module's pick starred; None without a point."""
    cells = [c for m in modules for c in m.cells if c.energy_j is not None]
    if not cells:
        log.info("envelope Pareto plot: no cell with energy")
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    by_level: dict[str, list[EnvelopeCell]] = {}
    for c in cells:
        by_level.setdefault(c.level, []).append(c)
    for level, group in by_level.items():
        ax.scatter([c.energy_j for c in group], [100 * c.answer.miss_rate for c in group],
                   label=level, s=28, zorder=3)
        for c in group:
            ax.annotate(str(c.power_mode or c.device_id), (c.energy_j or 0,
                        100 * c.answer.miss_rate), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    for m in modules:
        front = pareto_front(m.cells)
        if len(front) > 1:
            ax.plot([c.energy_j for c in front], [100 * c.answer.miss_rate for c in front],
                    color="0.4", lw=1, ls="-", zorder=2)
        if m.pick is not None and m.pick.energy_j is not None:
            ax.scatter([m.pick.energy_j], [100 * m.pick.answer.miss_rate], marker="*", s=220,
                       facecolor="none", edgecolor="black", lw=1.2, zorder=4,
                       label=f"put on the robot: {m.pick.level} in {m.pick.power_mode}")
    ax.axhline(100 * miss_target, color="tab:red", lw=1, ls="--",
               label=f"{100 * miss_target:g}% miss")
    ax.set_xlabel("predicted J per plan")
    ax.set_ylabel("predicted receiver miss rate (%)")
    ax.set_ylim(-2, 102)
    ax.set_title("Operating envelope: miss rate against energy per plan", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, framealpha=0.9)
    return save_png(fig, path)

