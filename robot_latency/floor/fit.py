"""The two-term fit behind every prediction: measured = floor / efficiency + overhead.

A decode step reads its bytes at a fraction of the memory bandwidth and pays a fixed cost per
step besides (kernel launches, sampling, the framework's own work): ``t = t_floor / e + t_o``
(docs/REFERENCE.md, "Predictions: two terms, calibrated"). A prefill has the same shape with the
compute floor in place of the bandwidth floor. With ``x = t_floor`` and ``y = t`` this is a straight
line ``y = s * x + t_o`` with ``s = 1 / e``; the fit minimises the squared *relative* residuals
(weights ``1 / y^2``), because the points span two orders of magnitude and a 10% miss on a 135M
model matters as much as one on an 8B model.

Two distinct floors are needed to separate the terms; with one, the overhead must be given.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from robot_latency.floor.errors import CalibrationError

__all__ = ["TwoTermFit", "fit_two_term", "leave_one_out"]

logger = logging.getLogger(__name__)

#: Floors closer than this (relative) count as the same model size.
SAME_SIZE_REL = 0.02


@dataclass(frozen=True)
class TwoTermFit:
    """A fitted ``y = x / efficiency + overhead_ms`` and how well it fits its points.

    ``residuals_rel`` are ``measured / fitted - 1`` per point, in input order;
    ``overhead_clamped`` is True where a negative fitted overhead was held at 0.
    """

    efficiency: float
    overhead_ms: float
    overhead_fixed: bool
    n_points: int
    n_sizes: int
    residuals_rel: tuple[float, ...]
    overhead_clamped: bool = False

    def predict_ms(self, floor_ms: float) -> float:
        """Return the predicted time for a floor of ``floor_ms``."""
        return floor_ms / self.efficiency + self.overhead_ms

    def to_dict(self) -> dict[str, Any]:
        """Return the fit as a JSON-ready dict."""
        out = asdict(self)
        out["residuals_rel"] = list(self.residuals_rel)
        return out


def distinct_sizes(floors_ms: Sequence[float]) -> int:
    """Return how many distinct floors there are (within ``SAME_SIZE_REL`` of each other)."""
    groups: list[float] = []
    for x in sorted(floors_ms):
        if not groups or x > groups[-1] * (1 + SAME_SIZE_REL):
            groups.append(x)
    return len(groups)


def _check_points(floors_ms: Sequence[float], measured_ms: Sequence[float]) -> None:
    if len(floors_ms) != len(measured_ms):
        raise CalibrationError(f"{len(floors_ms)} floors but {len(measured_ms)} measurements")
    if not floors_ms:
        raise CalibrationError("no points to fit")
    for x, y in zip(floors_ms, measured_ms, strict=True):
        if not (math.isfinite(x) and x > 0 and math.isfinite(y) and y > 0):
            raise CalibrationError(f"point (floor {x!r} ms, measured {y!r} ms): both must be "
                                   "finite and > 0")


def fit_two_term(floors_ms: Sequence[float], measured_ms: Sequence[float], *,
                 fixed_overhead_ms: float | None = None) -> TwoTermFit:
    """Fit ``measured = floor / efficiency + overhead`` by weighted least squares.

    Args:
        floors_ms: the floor of each point (ms), e.g. bytes per step / bandwidth.
        measured_ms: the measured time of each point (ms).
        fixed_overhead_ms: hold the overhead at this value and fit the efficiency alone; needed
            when the points cover a single model size.

    Returns:
        The fit. A negative fitted overhead is not physical: the fit is then redone with the
        overhead held at 0 (``overhead_clamped``; logged at DEBUG only, since the published
        table's validation runs hundreds of fits: its callers log one summary line).

    Raises:
        CalibrationError: bad points, or a single model size without ``fixed_overhead_ms``.
    """
    _check_points(floors_ms, measured_ms)
    sizes = distinct_sizes(floors_ms)
    if fixed_overhead_ms is None and sizes < 2:
        raise CalibrationError(
            f"the points cover {sizes} model size; separating efficiency from the per-step "
            "overhead needs at least two (or a fixed overhead)")
    xs = [float(x) for x in floors_ms]
    ys = [float(y) for y in measured_ms]
    ws = [1.0 / (y * y) for y in ys]
    fixed = fixed_overhead_ms is not None
    clamped = False
    if fixed:
        overhead = float(fixed_overhead_ms)  # type: ignore[arg-type]
        if not (math.isfinite(overhead) and overhead >= 0):
            raise CalibrationError(f"fixed overhead must be >= 0 ms, got {fixed_overhead_ms!r}")
        slope = _slope_through(xs, ys, ws, overhead)
    else:
        sw = sum(ws)
        sx = sum(w * x for w, x in zip(ws, xs, strict=True))
        sy = sum(w * y for w, y in zip(ws, ys, strict=True))
        sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
        sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys, strict=True))
        det = sw * sxx - sx * sx
        slope = (sw * sxy - sx * sy) / det
        overhead = (sy - slope * sx) / sw
        if overhead < 0:
            logger.debug("fitted overhead %.3f ms < 0; refitting with the overhead held at 0",
                         overhead)
            clamped = True
            overhead, fixed = 0.0, True
            slope = _slope_through(xs, ys, ws, 0.0)
    if not (math.isfinite(slope) and slope > 0):
        raise CalibrationError(f"fitted time per floor-ms {slope!r} is not positive: the points "
                               "do not grow with the floor")
    fit = TwoTermFit(efficiency=1.0 / slope, overhead_ms=overhead, overhead_fixed=fixed,
                     n_points=len(xs), n_sizes=sizes, residuals_rel=())
    residuals = tuple(y / fit.predict_ms(x) - 1.0 for x, y in zip(xs, ys, strict=True))
    return TwoTermFit(efficiency=fit.efficiency, overhead_ms=overhead, overhead_fixed=fixed,
                      n_points=len(xs), n_sizes=sizes, residuals_rel=residuals,
                      overhead_clamped=clamped)


def _slope_through(xs: list[float], ys: list[float], ws: list[float], overhead: float) -> float:
    """Weighted least-squares slope of ``y - overhead = s * x``."""
    num = sum(w * x * (y - overhead) for w, x, y in zip(ws, xs, ys, strict=True))
    den = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    return num / den


def leave_one_out(floors_ms: Sequence[float], measured_ms: Sequence[float]) -> list[float | None]:
    """Return each point's relative error when predicted from a fit without it.

    ``predicted / measured - 1`` per point; None where the other points cannot be fitted (fewer
    than two sizes left).
    """
    _check_points(floors_ms, measured_ms)
    out: list[float | None] = []
    for i in range(len(floors_ms)):
        xs = [x for j, x in enumerate(floors_ms) if j != i]
        ys = [y for j, y in enumerate(measured_ms) if j != i]
        if len(xs) < 2 or distinct_sizes(xs) < 2:
            out.append(None)
            continue
        fit = fit_two_term(xs, ys)
        out.append(fit.predict_ms(floors_ms[i]) / measured_ms[i] - 1.0)
    return out
