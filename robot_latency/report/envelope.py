"""The operating envelope on the target: every level in every power mode, and which to put on.

Per level x power mode (each mode a datasheet of its own, :mod:`robot_latency.floor.power_modes`)
the loop is simulated on the target as ``predict --stream`` does it
(:func:`~robot_latency.report.target_answer.answers_for`, with the capacity search), and the
envelope adds:

- J per plan: the mean over the stream's commands the model is asked of the predicted energy of
  its complete plan (:func:`~robot_latency.floor.energy.plan_energy`: the prefill of its uncached
  prompt, its output tokens' decode; the wait not counted, idle watts being uncalibrated), the
  80% interval the mean of the commands' interval ends (the error is systematic: every command
  is off the same way); "energy uncalibrated" where the mode has no published energy row;
- goodput: the model's valid plans in time per second of the stream at its replay speed.

"Put on the robot", per module: among the level x mode cells whose predicted receiver miss rate
at the deadline meets the miss target, the least J per plan (equal to the mJ: a tie), ties to the
smaller file; a cell whose energy is uncalibrated ranks after every calibrated one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from robot_latency.floor.devices import DeviceSheet, get_device, power_modes_of
from robot_latency.floor.energy import ENERGY_COVERAGE, plan_energy, power_estimate
from robot_latency.planner.target_inputs import TargetInputs
from robot_latency.planner.target_sim import TargetAnswer
from robot_latency.report.table import markdown_lines
from robot_latency.report.target_answer import (
    PreparedLevel,
    answers_for,
    prepare_levels,
    rate_failed_text,
    rate_held_text,
    rests_on,
)

__all__ = ["EnvelopeCell", "ModuleEnvelope", "envelope", "envelope_lines", "pick_for_robot"]


@dataclass(frozen=True)
class EnvelopeCell:
    """One level in one power mode: the simulated answer, its energy and its goodput."""

    level: str
    device_id: str
    power_mode: str | None
    answer: TargetAnswer
    weight_bytes: int
    energy: dict[str, Any]
    goodput_plans_s: float | None
    goodput_interval_plans_s: tuple[float, float] | None

    @property
    def energy_j(self) -> float | None:
        return self.energy.get("energy_j")

    def meets(self, miss_target: float) -> bool:
        """Whether the point prediction's receiver miss rate holds ``miss_target``."""
        rate = self.answer.miss_rate
        return rate == rate and rate <= miss_target

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"level": self.level, "device_id": self.device_id,
                "power_mode": self.power_mode, "weight_bytes": self.weight_bytes,
                "miss_rate": self.answer.miss_rate,
                "miss_interval": list(self.answer.miss_interval),
                "min_deadline_ms": self.answer.min_deadline_ms,
                "capacity": self.answer.capacity, "energy": self.energy,
                "goodput_plans_s": self.goodput_plans_s,
                "goodput_interval_plans_s": None if self.goodput_interval_plans_s is None
                else list(self.goodput_interval_plans_s),
                "model_in_time_rate": self.answer.model_in_time_rate,
                "rests_on": self.answer.rests_on}


@dataclass(frozen=True)
class ModuleEnvelope:
    """Every cell of one module (its power modes x the levels), and the one to put on it."""

    module: str
    cells: tuple[EnvelopeCell, ...]
    pick: EnvelopeCell | None
    why: str
    modes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {"module": self.module, "modes": list(self.modes),
                "cells": [c.to_dict() for c in self.cells],
                "put_on_robot": None if self.pick is None else
                {"level": self.pick.level, "device_id": self.pick.device_id,
                 "power_mode": self.pick.power_mode},
                "why": self.why}


def stream_energy(p: PreparedLevel) -> dict[str, Any]:
    """J per plan of a prepared level: the mean of its asked commands' predicted plan energy.

    Returns the power model's status and figures (``power``), ``energy_j`` and its 80% interval
    (None where the mode's energy is uncalibrated), the plans counted, and the notes.
    """
    power = power_estimate(p.steps.device.id, p.steps.calibration.engine_family)
    asked = [c for c in p.cmds if c.asked]
    rel = p.steps.predict(1)
    ttft_rel = rel.ttft_interval_rel or (0.0, 0.0)
    plans = [plan_energy(power, ttft_ms=c.ttft_ms, itl_ms=c.itl_ms, output_tokens=c.tokens_out,
                         ttft_interval_ms=(c.ttft_ms * (1 + ttft_rel[0]),
                                           c.ttft_ms * (1 + ttft_rel[1])),
                         itl_interval_ms=(c.itl_ms * (1 + rel.itl_interval_rel[0]),
                                          c.itl_ms * (1 + rel.itl_interval_rel[1])))
             for c in asked]
    out: dict[str, Any] = {"status": power.status, "power": power.to_dict(),
                           "plans": len(plans), "energy_j": None, "energy_interval_j": None,
                           "interval_coverage": ENERGY_COVERAGE, "notes": []}
    if not plans or plans[0].energy_j is None:
        return out
    n = len(plans)
    out["energy_j"] = sum(e.energy_j or 0.0 for e in plans) / n
    out["energy_interval_j"] = [sum((e.energy_interval_j or (0.0, 0.0))[i] for e in plans) / n
                                for i in (0, 1)]
    out["notes"] = sorted({note for e in plans for note in e.notes})
    return out


def _goodput(p: PreparedLevel, a: TargetAnswer) -> tuple[float | None, tuple[float, float] | None]:
    """Valid model plans in time per second of the stream (at its replay speed), and the
    interval of the answer's *model plans in time* rate on the same scale."""
    if len(p.cmds) < 2 or not a.commands:
        return None, None
    span_s = (p.cmds[-1].arrival_ms - p.cmds[0].arrival_ms) / 1e3
    if span_s <= 0:
        return None, None
    per_s = a.commands / span_s
    lo, hi = a.model_in_time_interval
    return a.model_in_time_rate * per_s, (lo * per_s, hi * per_s)


def pick_for_robot(cells: Sequence[EnvelopeCell], miss_target: float
                   ) -> tuple[EnvelopeCell | None, str]:
    """Name the level and power mode to put on the robot, and why (the rule in words).

    Rule: meets the miss target (point prediction, at the deadline), then the least J per plan
    (equal to the mJ: a tie; an uncalibrated energy ranks after every calibrated one), ties to
    the smaller file.
    """
    rule = (f"the rule: a predicted receiver miss rate at most {100 * miss_target:g}%, then "
            "the least J per plan (equal to the mJ: a tie; energy uncalibrated ranks last), "
            "ties to the smaller file")
    ok = [c for c in cells if c.meets(miss_target)]
    if not ok:
        best = min(cells, key=lambda c: (c.answer.miss_rate, c.weight_bytes), default=None)
        near = "" if best is None else (
            f"; the lowest is {best.level} in {best.power_mode or best.device_id} "
            f"({100 * best.answer.miss_rate:.1f}%)")
        return None, (f"none: no level meets {100 * miss_target:g}% in any mode{near} "
                      f"({rule})")

    def key(c: EnvelopeCell) -> tuple[int, float, int]:
        j = c.energy_j
        return (j is None, 0.0 if j is None else round(j, 3), c.weight_bytes)

    pick = min(ok, key=key)
    energy = ("energy uncalibrated in every mode that meets it" if pick.energy_j is None
              else f"{pick.energy_j:.3f} J per plan")
    rails = sorted({str(c.energy["power"].get("rail")) for c in ok if c.energy_j is not None})
    mixed = "" if len(rails) < 2 else (
        f"; NOTE: the energies compared were measured on different rails ({', '.join(rails)}), "
        "not like for like")
    return pick, (f"{len(ok)} of {len(cells)} level x mode cells meet the target; "
                  f"{pick.level} in {pick.power_mode or pick.device_id} ({pick.device_id}): "
                  f"{100 * pick.answer.miss_rate:.1f}% missed, {energy} ({rule}){mixed}")


def envelope(levels: Sequence[tuple[str, TargetInputs]], device_ids: Sequence[str], *,
             all_modes: bool = False, miss_target: float, draws: int,
             transport_margin_ms: float | None = None) -> list[ModuleEnvelope]:
    """Simulate every level in every mode of each device's module; pick one per module.

    Args:
        levels: (label, inputs) per level (the inputs' device is replaced by each mode's).
        device_ids: the devices (a module's modes once, however many of them are named).
        all_modes: every nvpmodel mode of each device's module; False: the devices alone.
        miss_target: the receiver miss rate held (the deadline held, the rate held, the pick).
        draws: Monte Carlo draws per answer.
        transport_margin_ms: the target's measured transport margin; None: the stated default.

    Raises:
        FloorError: an unknown device.
        CapacityError: a stream of fewer than two commands at different times.
    """
    modules: dict[str, list[DeviceSheet]] = {}
    for device_id in device_ids:
        sheets = power_modes_of(device_id) if all_modes else [get_device(device_id)]
        group = modules.setdefault(sheets[0].module or sheets[0].id, [])
        group.extend(s for s in sheets if s.id not in {g.id for g in group})
    out = []
    for module, sheets in modules.items():
        cells: list[EnvelopeCell] = []
        for sheet in sheets:
            prepared = prepare_levels(
                [(label, replace(inputs, device_id=sheet.id), None) for label, inputs in levels],
                transport_margin_ms=transport_margin_ms)
            answers = answers_for(prepared, draws=draws, miss_target=miss_target,
                                  find_rate=True, curve=False)
            for p, a in zip(prepared, answers, strict=True):
                good, good_iv = _goodput(p, a)
                cells.append(EnvelopeCell(
                    level=p.label, device_id=sheet.id, power_mode=sheet.power_mode, answer=a,
                    weight_bytes=p.steps.model.weight_bytes_total, energy=stream_energy(p),
                    goodput_plans_s=good, goodput_interval_plans_s=good_iv))
        pick, why = pick_for_robot(cells, miss_target)
        out.append(ModuleEnvelope(module, tuple(cells), pick, why,
                                  tuple(s.power_mode or s.id for s in sheets)))
    return out


def _j(e: dict[str, Any]) -> str:
    if e.get("energy_j") is None:
        return "energy uncalibrated"
    lo, hi = e["energy_interval_j"]
    return f"{e['energy_j']:.3f} [{lo:.3f}, {hi:.3f}]"


def _where(c: EnvelopeCell) -> str:
    return f"{c.power_mode or '-'} ({c.device_id})"


def mode_rests_on(cells: Sequence[EnvelopeCell]) -> str:
    """One line for one power mode's cells: what their timing figures (miss rate, deadline, rate,
    goodput) rest on, as ``predict --stream`` says it, and what their J per plan rests on, with
    the number of sources of each."""
    c = cells[0]
    passes = ", ".join(dict.fromkeys(str(x.answer.rests_on.get("untimed_pass", "-"))
                                     for x in cells))
    a = replace(c.answer, label=f"{_where(c)}, {', '.join(x.level for x in cells)}",
                rests_on={**c.answer.rests_on, "untimed_pass": passes})
    timing = a.rests_on.get("source_count")
    timing = len(a.rests_on.get("sources") or []) if timing is None else timing
    power = c.energy["power"]
    if power.get("decode_watts") is None:
        energy = c.energy["status"]
    else:
        energy = (f"{len(power['basis'])} published energy rows from {len(power['sources'])} "
                  f"source(s) ({'; '.join(power['sources'])}; {power['rail']} rail, "
                  f"{power['phase']})")
    return (f"{rests_on(a)[:-1]}; timing on {timing} source(s); J per plan: {energy}.")


def envelope_table(cells: Sequence[EnvelopeCell], miss_target: float) -> list[str]:
    """Markdown lines: one row per level x power mode."""
    rows = []
    for c in cells:
        a, cap = c.answer, c.answer.capacity or {}
        good = "-" if c.goodput_plans_s is None else (
            f"{c.goodput_plans_s:.3f} [{c.goodput_interval_plans_s[0]:.3f}, "  # type: ignore[index]
            f"{c.goodput_interval_plans_s[1]:.3f}]")  # type: ignore[index]
        rows.append([c.level.replace("|", "\\|"), _where(c),
                     f"{100 * a.miss_rate:.1f}% [{100 * a.miss_interval[0]:.1f}, "
                     f"{100 * a.miss_interval[1]:.1f}]",
                     "-" if a.min_deadline_ms is None else f"{a.min_deadline_ms:g}",
                     rate_held_text(cap) if cap else "-", rate_failed_text(cap) if cap else "-",
                     _j(c.energy), good])
    pct = f"{100 * miss_target:g}%"
    return markdown_lines(
        ["level", "power mode (device)", "predicted receiver miss [95%]",
         f"smallest deadline held at {pct} ms", f"highest rate held at {pct} cmd/s [slow, "
         "fast end] (replay speed)", "first rate that failed cmd/s",
         f"J per plan [{100 * ENERGY_COVERAGE:.0f}%]", "goodput plans/s [95%]"], rows,
        aligned=False)


def envelope_lines(modules: Sequence[ModuleEnvelope], *, miss_target: float) -> list[str]:
    """The envelope as Markdown lines: per module its table, the pick, what each figure rests
    on; then the energy's notes."""
    lines: list[str] = []
    notes: set[str] = set()
    for m in modules:
        levels = sorted({c.level for c in m.cells}, key=[c.level for c in m.cells].index)
        lines += [f"### {m.module}: {len(levels)} levels x {len(m.modes)} power modes", ""]
        lines += envelope_table(m.cells, miss_target)
        pick = "none" if m.pick is None else f"{m.pick.level} in {_where(m.pick)}"
        lines += ["", f"Put on the robot: {pick}. {m.why[0].upper()}{m.why[1:]}.", "",
                  "What each figure rests on:", ""]
        by_mode: dict[str, list[EnvelopeCell]] = {}
        for c in m.cells:
            by_mode.setdefault(c.device_id, []).append(c)
        lines += [f"- {mode_rests_on(cells)}" for cells in by_mode.values()]
        lines.append("")
        notes |= {n for c in m.cells for n in c.energy.get("notes", [])}
    if notes:
        lines += ["Notes of the energy (every calibrated cell):", "",
                  *(f"- {n}" for n in sorted(notes)), ""]
    return lines
