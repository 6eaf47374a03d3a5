"""The highest command rate a level holds on the target: a search over the stream's replay speed.

``predict --stream ... --find-rate`` and ``envelope`` ask: how fast may the operator send commands
before the simulated receiver miss rate on the target (:mod:`robot_latency.planner.target_sim`,
the point prediction, at the run's deadline) goes over the target? The stream's arrival times are
divided by a *speed factor* (x2: every inter-arrival time halved); the rate is the stream's mean
arrival rate, ``(commands - 1) / (last arrival - first arrival)``, times the factor.

The search (:func:`search_speed`) is a bracket, then a k-section (bisection with ``points``
interior points a round instead of one): each round simulates all its candidate factors in one
vectorized pass, so three rounds cost about as much as three simulations. The first round tries a
log grid (:data:`LOW`..:data:`HIGH`, ``sqrt(2)`` apart); each later round refines between the
highest factor held and the first that failed. The miss rate is not quite monotone in the speed
(periodic ticks fall differently), so the factor *held* is the highest one tried below which every
factor tried held too, and the factor *failed* is the first one tried above it that did not: a
conservative answer that never skips over a failure it saw.

The rate is searched three times: at the point prediction, and with every command's prefill and
decode at the slow end and at the fast end of the prediction's 80% interval (the family's
systematic error, as the Monte Carlo draws it): the rate's interval.

Where every point costs a real run (``sweep``/``run --find-rate`` over replay speed, ``fleet
--find-robots`` over fleet size), the search is one point at a time instead:
:func:`bracket_bisect`, a bracket by doubling, then bisection, at most a set number of runs
(:func:`bisect_speed` over speed factors, :func:`bisect_count` over whole numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from robot_latency.errors import RobotLatencyError
from robot_latency.floor.steps import StepPredictor
from robot_latency.planner.config import RunSettings
from robot_latency.planner.target_sim import _Z80, SimCommand, _run, _service

__all__ = ["Bracket", "CapacityError", "RateAnswer", "bisect_count", "bisect_speed",
           "bracket_bisect", "find_rate", "search_speed", "stream_rate_cmd_s"]

#: A search's points: replay speed factors (float) or counts (int).
P = TypeVar("P", int, float)

#: The slowest and the fastest replay speed the first round tries.
LOW, HIGH = 2.0 ** -10, 2.0 ** 10
#: Interior points per refining round, and rounds after the first.
POINTS, ROUNDS = 16, 2


class CapacityError(RobotLatencyError):
    """A capacity search that cannot be asked: too few commands, or a bad target."""


@dataclass(frozen=True)
class Bracket(Generic[P]):
    """One search's outcome: the highest point held and the first point above it that failed.

    The points are replay speed factors (:func:`search_speed`, :func:`bisect_speed`) or counts
    (:func:`bisect_count`: fleet sizes). ``held`` is None when even the lowest point tried
    failed; ``failed`` is None when every point tried held. ``miss_*`` are the miss rates
    there; ``tried`` counts the points tried (simulated or run).
    """

    held: P | None
    failed: P | None
    miss_held: float | None
    miss_failed: float | None
    tried: int


def search_speed(miss_at: Callable[[np.ndarray], np.ndarray], miss_target: float, *,
                 low: float = LOW, high: float = HIGH, points: int = POINTS,
                 rounds: int = ROUNDS) -> Bracket[float]:
    """Find the highest speed factor whose miss rate (``miss_at``) is at most ``miss_target``.

    Args:
        miss_at: the miss rates at an array of speed factors (one vectorized evaluation).
        miss_target: the highest miss rate that holds (fraction).
        low, high: the first round's range (a log grid ``sqrt(2)`` apart).
        points: interior points per refining round.
        rounds: refining rounds after the first.
    """
    _check_target(miss_target)
    if not 0 < low < high:
        raise CapacityError(f"speed range: must be 0 < low < high, got {low!r}, {high!r}")
    n = math.ceil(2 * math.log2(high / low))
    grid = np.geomspace(low, high, n + 1)
    held: tuple[float, float] | None = None
    failed: tuple[float, float] | None = None
    tried = 0
    for r in range(rounds + 1):
        miss = np.asarray(miss_at(grid), dtype=float)
        tried += grid.size
        bad = np.flatnonzero(miss > miss_target)
        first = int(bad[0]) if bad.size else grid.size
        if first > 0:
            held = (float(grid[first - 1]), float(miss[first - 1]))
        if first < grid.size:
            failed = (float(grid[first]), float(miss[first]))
        if held is None or failed is None or r == rounds:
            break
        # refine strictly between the two, on a log scale
        grid = np.geomspace(held[0], failed[0], points + 2)[1:-1]
    return Bracket(held=None if held is None else held[0],
                   failed=None if failed is None else failed[0],
                   miss_held=None if held is None else held[1],
                   miss_failed=None if failed is None else failed[1], tried=tried)


def _check_target(miss_target: float) -> None:
    if not 0 <= miss_target < 1:
        raise CapacityError(f"miss target: must be in [0, 1), got {miss_target!r}")


def bracket_bisect(miss_one: Callable[[P], float], miss_target: float, *, start: P,
                   trials: int, lower: Callable[[P], P | None], higher: Callable[[P], P],
                   between: Callable[[P, P], P | None]) -> Bracket[P]:
    """Bracket, then bisect, when every point costs a real run: one point at a time.

    ``start`` first, then ``higher`` (while the points hold) or ``lower`` (while they fail)
    until a point held and a point failed bracket the answer, then ``between`` the highest
    point held and the lowest that failed; it stops after ``trials`` points, or when
    ``lower`` or ``between`` has no point left (None). A point that holds raises ``held``, one
    that fails lowers ``failed``: every point tried below the answer held and the one reported
    as failed did fail (``miss_*`` are their own miss rates), never a failure skipped over.

    Args:
        miss_one: the miss rate (fraction) measured at one point.
        miss_target: the highest miss rate that holds (fraction).
        start: the first point tried.
        trials: the most points tried (>= 1).
        lower, higher: the next point below a failure, above a hold, while unbracketed.
        between: the next point strictly between a hold and a failure above it.
    """
    _check_target(miss_target)
    if trials < 1:
        raise CapacityError(f"trials: must be >= 1, got {trials!r}")
    held: tuple[P, float] | None = None
    failed: tuple[P, float] | None = None
    point: P | None = start
    tried = 0
    while point is not None and tried < trials:
        miss = float(miss_one(point))
        tried += 1
        if miss <= miss_target:
            held = (point, miss)
        else:
            failed = (point, miss)
        if held is None:
            point = lower(failed[0])  # type: ignore[index]
        elif failed is None:
            point = higher(held[0])
        else:
            point = between(held[0], failed[0])
    return Bracket(held=None if held is None else held[0],
                   failed=None if failed is None else failed[0],
                   miss_held=None if held is None else held[1],
                   miss_failed=None if failed is None else failed[1], tried=tried)


def bisect_speed(miss_one: Callable[[float], float], miss_target: float, *, start: float,
                 trials: int) -> Bracket[float]:
    """The same question as :func:`search_speed` when every speed costs a real run.

    :func:`bracket_bisect` over speed factors: ``start``, then doubling (while it holds) or
    halving (while it fails), then bisection on a log scale (the geometric mean), all
    ``trials`` runs.

    Args:
        miss_one: the miss rate (fraction) measured at one speed factor.
        miss_target: the highest miss rate that holds (fraction).
        start: the first speed tried (> 0).
        trials: the most speeds tried (>= 1).
    """
    if not start > 0:
        raise CapacityError(f"start speed: must be > 0, got {start!r}")
    return bracket_bisect(miss_one, miss_target, start=float(start), trials=trials,
                          lower=lambda s: s / 2, higher=lambda s: s * 2,
                          between=lambda h, f: math.sqrt(h * f))


def bisect_count(miss_one: Callable[[int], float], miss_target: float, *, trials: int,
                 start: int = 1) -> Bracket[int]:
    """The largest count (a fleet's robots) whose miss rate holds ``miss_target``.

    :func:`bracket_bisect` over whole numbers: ``start``, then doubling while it holds (halving
    while it fails, never below 1), then the integer midpoint between the largest count held
    and the smallest that failed. It stops early once they are neighbours (``failed == held +
    1``: the answer) or when 1 failed (none holds).

    Args:
        miss_one: the miss rate (fraction) measured at one count.
        miss_target: the highest miss rate that holds (fraction).
        trials: the most counts tried (>= 1).
        start: the first count tried (>= 1).
    """
    if start < 1:
        raise CapacityError(f"start count: must be >= 1, got {start!r}")
    return bracket_bisect(miss_one, miss_target, start=int(start), trials=trials,
                          lower=lambda n: n // 2 if n > 1 else None, higher=lambda n: n * 2,
                          between=lambda h, f: (h + f) // 2 if f - h > 1 else None)


def stream_rate_cmd_s(cmds: Sequence[SimCommand]) -> float:
    """The commands' mean arrival rate at speed x1 (commands/s): the inverse of the mean
    inter-arrival time.

    Raises:
        CapacityError: fewer than two commands, or all at one instant (no rate to scale).
    """
    if len(cmds) < 2 or not cmds[-1].arrival_ms > cmds[0].arrival_ms:
        raise CapacityError(f"a command rate needs two commands at different times; the stream "
                            f"has {len(cmds)} command(s) over "
                            f"{(cmds[-1].arrival_ms - cmds[0].arrival_ms) if cmds else 0:g} ms")
    return (len(cmds) - 1) / ((cmds[-1].arrival_ms - cmds[0].arrival_ms) / 1e3)


@dataclass(frozen=True)
class RateAnswer:
    """The highest command rate held at the miss target, with its 80% interval.

    Speeds are factors on the stream's replay speed; rates are commands/s. ``held_*`` None:
    even the slowest speed tried missed too often; ``failed_*`` None: every speed tried held.
    ``held_interval`` is (the speed held at the prediction's slow end, at its fast end).
    """

    miss_target: float
    deadline_ms: float
    mode: str
    base_rate_cmd_s: float
    speed_held: float | None
    speed_failed: float | None
    miss_held: float | None
    miss_failed: float | None
    speed_held_interval: tuple[float | None, float | None]
    tried: int
    #: the replay speed the commands' arrivals were taken at (a factor multiplies it)
    base_speed: float = 1.0

    @property
    def rate_held_cmd_s(self) -> float | None:
        return None if self.speed_held is None else self.speed_held * self.base_rate_cmd_s

    @property
    def rate_failed_cmd_s(self) -> float | None:
        return None if self.speed_failed is None else self.speed_failed * self.base_rate_cmd_s

    @property
    def rate_held_interval_cmd_s(self) -> tuple[float | None, float | None]:
        return tuple(None if s is None else s * self.base_rate_cmd_s  # type: ignore[return-value]
                     for s in self.speed_held_interval)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (the rates included)."""
        out = asdict(self)
        out["speed_held_interval"] = list(self.speed_held_interval)
        out["rate_held_cmd_s"] = self.rate_held_cmd_s
        out["rate_failed_cmd_s"] = self.rate_failed_cmd_s
        out["rate_held_interval_cmd_s"] = list(self.rate_held_interval_cmd_s)
        return out


def miss_at_speeds(cmds: Sequence[SimCommand], rules: RunSettings, service: np.ndarray,
                   speeds: np.ndarray) -> np.ndarray:
    """The receiver miss rate (point: one service row) at each speed factor, in one pass."""
    speeds = np.asarray(speeds, dtype=float)
    arrival = np.array([x.arrival_ms for x in cmds])
    arrivals = arrival[None, :] / speeds[:, None]  # (S, C)
    rows = np.broadcast_to(service.reshape(1, -1), (speeds.size, len(cmds)))
    in_time, _, _, counted = _run(cmds, rules, np.array([rules.deadline_ms]), rows, arrivals)
    n = max(1, int(counted.sum()))
    return (~in_time[0] & counted).sum(axis=1) / n


def find_rate(cmds: Sequence[SimCommand], steps: StepPredictor, rules: RunSettings, *,
              miss_target: float, base_speed: float = 1.0) -> RateAnswer:
    """Search the highest replay speed of ``cmds`` at which the target holds ``miss_target``.

    Args:
        cmds: the commands (:func:`~robot_latency.planner.target_sim.sim_commands`), their
            arrivals at replay speed ``base_speed`` (the factors found multiply it).
        steps: the step predictor the commands were predicted with (for the interval ends).
        rules: the loop's rules on the target (:func:`~robot_latency.planner.target_sim.
            target_rules`): mode, deadline, period, margins.
        miss_target: the highest receiver miss rate that holds (fraction).

    Raises:
        CapacityError: fewer than two commands, or a miss target outside [0, 1).
    """
    base = stream_rate_cmd_s(cmds)
    # the point prediction, then every command at the 80% interval's slow and fast ends
    z = np.array([0.0, _Z80, -_Z80])
    service = _service(cmds, steps, z, z)  # (3, C)
    found = [search_speed(lambda s, row=row: miss_at_speeds(cmds, rules, row, s), miss_target)
             for row in service]
    point, slow, fast = found
    return RateAnswer(
        miss_target=miss_target, deadline_ms=rules.deadline_ms, mode=rules.mode,
        base_rate_cmd_s=base, speed_held=point.held, speed_failed=point.failed,
        miss_held=point.miss_held, miss_failed=point.miss_failed,
        speed_held_interval=(slow.held, fast.held), tried=sum(f.tried for f in found),
        base_speed=base_speed)
