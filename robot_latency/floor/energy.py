"""Energy per plan, predicted: a power model per device and mode, fitted to published figures.

``robot_latency/data/published_energy.yaml`` holds published energy figures of LLM decoding on
Jetson modules (tok/J or J per token, beside the rate they were measured at), each with its
source, rail and phase. Each row gives the watts the rail drew: ``J per token x tok/s``. Rows
that share a *setup* (one source, one device and mode, one engine family, one rail, one phase)
share a power figure; a device's decode watts are the median of its best setup's rows (the one
with the most decode-phase rows of the engine family). Rails are never mixed: the joules of
``VDD_CPU_GPU_CV`` (CPU and GPU cores) and of the module's input are different quantities.

A plan's energy::

    J = prefill watts x TTFT + decode watts x decode time + idle watts x wait

where a watt figure no source gives is *uncalibrated* and said so: no source in the table gives
idle or prefill watts, so the prefill is counted at the decode watts (noted) and the wait is
not counted (``idle uncalibrated``); a device or mode without energy rows of the engine family
answers ``energy uncalibrated`` and no number. The interval is the 80% split-conformal interval
of the decode watts' leave-one-out errors (as the decode table's), joined with the time's
interval. ``validate_energy`` predicts every row from its setup without it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from robot_latency.floor.calibration import check_engine_family
from robot_latency.floor.devices import DEVICES
from robot_latency.floor.errors import FloorError, TableError
from robot_latency.floor.published_table import read_table_list, unique_rows

__all__ = [
    "ENERGY_COVERAGE",
    "EnergyRow",
    "PlanEnergy",
    "PowerEstimate",
    "default_energy_path",
    "load_energy_table",
    "plan_energy",
    "power_estimate",
    "validate_energy",
]

#: The share of rows the stated interval is meant to hold.
ENERGY_COVERAGE = 0.8
#: Phases a row's energy may cover.
PHASES = {"decode": "the decode phase's energy only",
          "request_average": "a whole request's average power (the prefill inside)"}
_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,), "source": (str,), "url": (str,), "device": (str,), "power_mode": (str,),
    "engine_family": (str,), "model_reported": (str,), "rail": (str,), "phase": (str,),
    "tok_s": (int, float), "date": (str,), "notes": (str,)}


@dataclass(frozen=True)
class EnergyRow:
    """One published energy figure: the rate it was measured at and the joules per token."""

    id: str
    source: str
    url: str
    device: str
    power_mode: str
    engine_family: str
    model_reported: str
    rail: str
    phase: str
    tok_s: float
    j_per_token: float
    date: str
    notes: str

    @property
    def watts(self) -> float:
        """The rail's power while the row's tokens were made: J per token x tokens per second."""
        return self.j_per_token * self.tok_s

    @property
    def setup(self) -> str:
        """What shares one power figure: source, device and mode, engine, rail, phase."""
        return " | ".join((self.source, self.device, self.engine_family, self.rail, self.phase))


def default_energy_path() -> Path:
    """Return the shipped energy table's path."""
    return Path(str(resources.files("robot_latency") / "data" / "published_energy.yaml"))


def _check(path: Path, i: int, raw: Any) -> EnergyRow:
    where = f"{path}: row {raw.get('id', i + 1) if isinstance(raw, dict) else i + 1}"
    if not isinstance(raw, dict):
        raise TableError(f"{where}: must be a mapping")
    energy = [k for k in ("tok_per_j", "j_per_token") if raw.get(k) is not None]
    missing = [k for k in _FIELDS if k not in raw]
    extra = [k for k in raw if k not in _FIELDS and k not in ("tok_per_j", "j_per_token")]
    if missing or extra or len(energy) != 1:
        raise TableError(f"{where}: missing fields {missing}, unknown fields {extra}; give "
                         "exactly one of tok_per_j and j_per_token")
    for key, kinds in _FIELDS.items():
        if isinstance(raw[key], bool) or not isinstance(raw[key], kinds):
            raise TableError(f"{where}: field {key!r} has type {type(raw[key]).__name__}")
    value = raw[energy[0]]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not raw["tok_s"] > 0:
        raise TableError(f"{where}: tok_s and {energy[0]} must be numbers > 0")
    if raw["device"] not in DEVICES:
        raise TableError(f"{where}: unknown device {raw['device']!r}")
    if raw["phase"] not in PHASES:
        raise TableError(f"{where}: unknown phase {raw['phase']!r}; known: {', '.join(PHASES)}")
    try:
        check_engine_family(raw["engine_family"])
    except FloorError as err:
        raise TableError(f"{where}: {err}") from err
    fields = {k: raw[k] for k in _FIELDS}
    fields["tok_s"] = float(raw["tok_s"])
    j_per_token = 1.0 / float(value) if energy[0] == "tok_per_j" else float(value)
    return EnergyRow(**fields, j_per_token=j_per_token)


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[EnergyRow, ...]:
    p = Path(path)
    return unique_rows(p, [_check(p, i, raw) for i, raw in enumerate(read_table_list(p, "rows"))])


def load_energy_table(path: str | Path | None = None) -> list[EnergyRow]:
    """Read and check the energy table (the shipped one by default).

    Raises:
        TableError: naming the file, the row and the field that is wrong.
    """
    return list(_load(str(Path(path) if path is not None else default_energy_path())))


def _setup_rows(table: Sequence[EnergyRow], device_id: str, family: str,
                exclude: frozenset[str]) -> list[EnergyRow]:
    """The rows of the device's best setup of the family: most decode-phase rows, then most."""
    mine = [r for r in table if r.device == device_id and r.engine_family == family
            and r.id not in exclude]
    groups: dict[str, list[EnergyRow]] = {}
    for r in mine:
        groups.setdefault(r.setup, []).append(r)
    if not groups:
        return []
    return max(groups.values(), key=lambda g: (g[0].phase == "decode", len(g), g[0].setup))


def _watts(table: Sequence[EnergyRow], row: EnergyRow,
           exclude: frozenset[str]) -> float | None:
    """The row's watts predicted from its own setup's other rows (None: no other row)."""
    rest = [r.watts for r in table
            if r.setup == row.setup and r.id != row.id and r.id not in exclude]
    return statistics.median(rest) if rest else None


def _interval(table: Sequence[EnergyRow], exclude: frozenset[str]) -> tuple[float, float]:
    """80% split-conformal bounds of ``measured / predicted - 1`` over the rows' leave-one-out
    watts, every row in ``exclude`` kept out of the residuals and of each fit behind them."""
    res = []
    for row in table:
        if row.id in exclude:
            continue
        pred = _watts(table, row, exclude)
        if pred is not None:
            res.append(row.watts / pred - 1.0)
    res.sort()
    if len(res) < 3:
        return (-0.25, 0.25)
    n, tail = len(res), (1.0 - ENERGY_COVERAGE) / 2
    k_lo = max(1, math.floor(tail * (n + 1)))
    k_hi = min(n, math.ceil((1.0 - tail) * (n + 1)))
    return (min(0.0, res[k_lo - 1]), max(0.0, res[k_hi - 1]))


@dataclass(frozen=True)
class PowerEstimate:
    """A device's power while an engine family decodes there, and where it comes from.

    ``decode_watts`` is None where the table has no row of the family on the device (``status``
    then says ``energy uncalibrated``); ``prefill_watts`` and ``idle_watts`` are None where no
    source gives them (every source today).
    """

    device_id: str
    engine_family: str
    status: str
    decode_watts: float | None = None
    decode_watts_interval: tuple[float, float] | None = None
    prefill_watts: float | None = None
    idle_watts: float | None = None
    rail: str | None = None
    phase: str | None = None
    basis: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def calibrated(self) -> bool:
        """True where the decode watts rest on published rows."""
        return self.decode_watts is not None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        out = asdict(self)
        if self.decode_watts_interval is not None:
            out["decode_watts_interval"] = list(self.decode_watts_interval)
        return out


def power_estimate(device_id: str, engine_family: str, *,
                   rows: Sequence[EnergyRow] | None = None,
                   exclude: str | None = None) -> PowerEstimate:
    """Return the decode watts of ``engine_family`` on ``device_id`` with their 80% interval.

    A device or mode without a row of the family says ``energy uncalibrated`` (no number).
    """
    family = check_engine_family(engine_family)
    table = list(rows if rows is not None else load_energy_table())
    skip = frozenset({exclude} if exclude else ())
    setup = _setup_rows(table, device_id, family, skip)
    if not setup:
        return PowerEstimate(device_id, family, status=(
            f"energy uncalibrated: no published energy row of {family} on {device_id}"))
    watts = statistics.median(r.watts for r in setup)
    lo, hi = _interval(table, skip)
    r0 = setup[0]
    return PowerEstimate(
        device_id, family, decode_watts=watts,
        decode_watts_interval=(watts * (1 + lo), watts * (1 + hi)),
        status=(f"energy calibrated on {len(setup)} rows ({r0.rail} rail, {r0.phase}); prefill "
                "and idle watts uncalibrated"),
        rail=r0.rail, phase=r0.phase, basis=tuple(r.id for r in setup),
        sources=tuple(sorted({r.source for r in setup})))


@dataclass(frozen=True)
class PlanEnergy:
    """One plan's predicted energy: prefill, decode and wait, each None where uncalibrated."""

    status: str
    prefill_j: float | None
    decode_j: float | None
    wait_j: float | None
    energy_j: float | None
    energy_interval_j: tuple[float, float] | None
    j_per_output_token: float | None
    notes: tuple[str, ...]
    power: PowerEstimate

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        out = asdict(self)
        out["power"] = self.power.to_dict()
        if self.energy_interval_j is not None:
            out["energy_interval_j"] = list(self.energy_interval_j)
        return out


def plan_energy(power: PowerEstimate, *, ttft_ms: float | None, itl_ms: float,
                output_tokens: int, wait_ms: float = 0.0,
                ttft_interval_ms: tuple[float, float] | None = None,
                itl_interval_ms: tuple[float, float] | None = None) -> PlanEnergy:
    """Return the energy of one plan: its prefill, its ``output_tokens`` decode steps, its wait.

    The interval joins the watts' interval with the times' (low with low, high with high).
    """
    if power.decode_watts is None or power.decode_watts_interval is None:
        return PlanEnergy(power.status, None, None, None, None, None, None, (), power)
    w, (w_lo, w_hi) = power.decode_watts, power.decode_watts_interval
    notes = []
    decode_s = output_tokens * itl_ms / 1e3
    d_lo, d_hi = (output_tokens * t / 1e3 for t in (itl_interval_ms or (itl_ms, itl_ms)))
    p_s = (ttft_ms or 0.0) / 1e3
    p_lo, p_hi = (t / 1e3 for t in (ttft_interval_ms or (ttft_ms or 0.0, ttft_ms or 0.0)))
    pw = power.prefill_watts
    if pw is None:
        notes.append("prefill watts uncalibrated: the prefill counted at the decode watts")
    scale = (pw / w) if pw is not None else 1.0
    if ttft_ms is None:
        notes.append("no TTFT predicted: the prefill not counted")
    wait_j = None
    if power.idle_watts is not None:
        wait_j = power.idle_watts * wait_ms / 1e3
    elif wait_ms > 0:
        notes.append(f"idle uncalibrated: the {wait_ms:g} ms wait not counted")
    total = w * scale * p_s + w * decode_s + (wait_j or 0.0)
    lo = w_lo * (scale * p_lo + d_lo) + (wait_j or 0.0)
    hi = w_hi * (scale * p_hi + d_hi) + (wait_j or 0.0)
    return PlanEnergy(
        power.status, w * scale * p_s, w * decode_s, wait_j, total, (lo, hi),
        w * itl_ms / 1e3, tuple(notes), power)


def validate_energy(rows: Sequence[EnergyRow] | None = None) -> dict[str, Any]:
    """Predict every row's J per token from its setup without it (leave-one-out).

    ``error_rel`` is ``predicted / measured - 1`` on the J per token (the row's own rate times
    the watts of its setup's other rows); each row's 80% interval comes from the other rows'
    leave-one-out errors with it left out of every fit (nested), and ``inside`` says whether
    the published figure falls in it.
    """
    table = tuple(rows if rows is not None else load_energy_table())
    out = []
    for row in table:
        pred_w = _watts(table, row, frozenset())
        if pred_w is None:
            out.append({"id": row.id, "device": row.device, "source": row.source,
                        "measured_j_per_token": row.j_per_token, "predicted_j_per_token": None,
                        "reason": "no other row in its setup"})
            continue
        lo, hi = _interval(table, frozenset({row.id}))
        pred = pred_w / row.tok_s
        out.append({
            "id": row.id, "device": row.device, "source": row.source, "rail": row.rail,
            "phase": row.phase, "engine_family": row.engine_family,
            "measured_watts": row.watts, "predicted_watts": pred_w,
            "measured_j_per_token": row.j_per_token, "predicted_j_per_token": pred,
            "error_rel": pred / row.j_per_token - 1.0,
            "interval_j_per_token": [pred * (1 + lo), pred * (1 + hi)],
            "inside": pred * (1 + lo) <= row.j_per_token <= pred * (1 + hi)})
    done = [r for r in out if r.get("error_rel") is not None]
    errs = [abs(r["error_rel"]) for r in done]
    return {
        "rows": out, "predicted": len(done), "not_predicted": len(out) - len(done),
        "sources": sorted({r["source"] for r in done}),
        "devices": sorted({r["device"] for r in done}),
        "median_abs_error": statistics.median(errs) if errs else None,
        "max_abs_error": max(errs, default=None),
        "coverage_80": sum(1 for r in done if r["inside"]) / len(done) if done else None,
    }
