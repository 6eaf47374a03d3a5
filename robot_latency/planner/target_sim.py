"""The planner loop simulated on the target: the answer for the user's device, whatever this host.

Per level, a discrete-event simulation of :class:`~robot_latency.planner.loop.PlannerLoop`'s
rules, fed by the stream's arrival times and the untimed pass
(:mod:`robot_latency.planner.untimed`):

- each command's service time on the target = predicted TTFT of its uncached prompt tokens
  + (tokens of its complete plan - 1) x predicted ITL (:mod:`robot_latency.floor.steps`), and
  with a camera frame its encode and image tokens (:mod:`robot_latency.planner.target_image`);
- event mode: a command starts when it arrives and the loop is free (``queue``), or aborts the
  command in progress (``preempt``: the older one is superseded, a miss); a command whose
  deadline passed before the loop was free is skipped (a miss);
- periodic mode: each tick plans the newest command that has arrived; a command replaced
  before any tick planned it is never planned (a miss); a deadline above the period runs the
  loop at the deadline, as the demo does;
- the loop gives up on the model at ``deadline - publish margin - transport margin`` and a
  fallback answers: a command is a *receiver miss* when the model's output is not ready by
  then, or it was skipped or superseded. It is *model plans in time* when, besides, its output
  is a complete plan the contract accepts (the untimed pass says). Commands the loop refuses
  before asking the model (empty, too long) are neither: they are counted and named.

Uncertainty: a Monte Carlo over the prediction's own errors. The engine family's error is
systematic (the same build on the same device is off the same way on every command), so each
draw scales every command's decode steps by one factor, and its prefill by another, drawn from
the prediction's interval (a split log-normal through its 10% and 90% points). The interval is
then widened by the sampling interval over *commands* (Wilson 95% at the number of commands, not
of cycles: re-plans of one command in periodic mode are not independent samples): the 2.5th
percentile over draws of the Wilson low end and the 97.5th of the high end. The same seed gives
every level the same draws. Not modelled: the target's own loop overhead, fallback time and
publish beyond the margins, and contention from other processes on the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robot_latency.floor.steps import StepPredictor
from robot_latency.planner.config import RunSettings
from robot_latency.planner.untimed import UntimedPass
from robot_latency.stats import Z_95
from robot_latency.streams import CommandStream

#: The miss rate the smallest held deadline is stated at, unless told otherwise.
DEFAULT_MISS_TARGET = 0.05
#: Monte Carlo draws per answer.
DEFAULT_DRAWS = 1000
#: Normal quantile of an 80% interval's ends (10% and 90%).
_Z80 = 1.2815515655446004


#: Ticks a periodic replay runs after the last command arrives (planner/replay.py's default).
TAIL_CYCLES = 1


#: The transport margin the target's answer keeps unless one measured on the robot is given
#: (``--target-transport-margin-ms``): the node's own rule (docs/REFERENCE.md, "Transport
#: margin": 2 x the one-way p99 + 0.5 ms) at a one-way p99 of 4 ms: half the top of the p99
#: the project measured for Fast DDS on loopback over both legs (command in, plan out) with both
#: executors (4-8 ms at p99, 2 ms at the median). A stated default, never a margin measured on
#: the host that runs the prediction.
DEFAULT_TARGET_TRANSPORT_MARGIN_MS = 8.5
#: Where the default comes from, in words (the answer prints it).
TARGET_TRANSPORT_SOURCE = ("default: the node's rule (2 x one-way p99 + 0.5 ms) at a 4 ms "
                           "one-way p99, half the 8 ms p99 of both legs measured for Fast DDS "
                           "on loopback (docs/REFERENCE.md, Transport margin); pass the robot's "
                           "own with --target-transport-margin-ms")


def target_rules(settings: RunSettings, *,
                 transport_margin_ms: float | None = None) -> tuple[RunSettings, str]:
    """Return the loop's rules on the target and where its transport margin comes from.

    The margins are the target's, never the host's: a learned publish margin counts at the
    value a learned one starts from, and the transport margin is ``transport_margin_ms`` (one
    measured on the robot) or :data:`DEFAULT_TARGET_TRANSPORT_MARGIN_MS`.
    """
    from dataclasses import replace

    from robot_latency.planner.margin import PUBLISH_START_MS

    publish = settings.publish_margin_ms if settings.publish_margin_ms >= 0 \
        else PUBLISH_START_MS
    if transport_margin_ms is None:
        transport, source = DEFAULT_TARGET_TRANSPORT_MARGIN_MS, TARGET_TRANSPORT_SOURCE
    else:
        transport, source = max(0.0, transport_margin_ms), "given (measured on the robot)"
    return replace(settings, publish_margin_ms=publish, transport_margin_ms=transport), source


def margin_ms(settings: RunSettings) -> float:
    """What the loop keeps before the deadline: the publish margin + the transport margin (a
    fixed one: the target's, from :func:`target_rules`). A learned publish margin (``< 0``)
    counts at the value a learned one starts from."""
    from robot_latency.planner.margin import PUBLISH_START_MS

    publish_ms = settings.publish_margin_ms if settings.publish_margin_ms >= 0 \
        else PUBLISH_START_MS
    return publish_ms + max(0.0, settings.transport_margin_ms)


@dataclass(frozen=True)
class SimCommand:
    """One command as the simulation sees it (times in ms from the stream's start)."""

    command_id: str
    arrival_ms: float
    asked: bool
    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    itl_floor_ms: float = 0.0
    tokens_out: int = 0
    plan_valid: bool = False
    ttft_floor_ms: float = 0.0
    #: the camera frame's vision encode before the prefill (0: no frame encoded this cycle;
    #: :mod:`robot_latency.planner.target_image`); its image tokens are in ``ttft_ms``
    encode_ms: float = 0.0

    @property
    def service_ms(self) -> float:
        return self.encode_ms + self.ttft_ms + max(0, self.tokens_out - 1) * self.itl_ms


@dataclass(frozen=True)
class TargetAnswer:
    """One level's predicted answer on the target (rates are fractions of ``commands``)."""

    label: str
    device_id: str
    engine_family: str
    deadline_ms: float
    margin_ms: float
    commands: int
    refused: int
    miss_rate: float
    miss_interval: tuple[float, float]
    model_in_time_rate: float
    model_in_time_interval: tuple[float, float]
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    miss_target: float
    min_deadline_ms: float | None
    draws: int
    e2e_ms: tuple[float, ...] = ()
    curve: tuple[tuple[float, float, float, float], ...] = ()
    rests_on: dict[str, Any] = field(default_factory=dict)
    #: the point prediction's commands (asked) whose valid model plan is in time there ...
    model_in_time_ids: tuple[str, ...] = ()
    #: ... and those answered by the fallback at the give-up (the rest: skipped, superseded)
    fallback_ids: tuple[str, ...] = ()
    #: what the pass found (:func:`pass_facts`): commands asked with no valid plan, outputs cut
    #: at max_tokens, tokens per plan and uncached prompt tokens at p50/p95, the token budget
    facts: dict[str, Any] = field(default_factory=dict)
    #: the highest command rate held at ``miss_target`` (``RateAnswer.to_dict`` of
    #: :mod:`robot_latency.planner.capacity`); None: not searched
    capacity: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def sim_commands(stream: CommandStream, untimed: UntimedPass, steps: StepPredictor, *,
                 speed: float = 1.0) -> list[SimCommand]:
    """Join the stream's arrivals with the untimed pass and the target's step predictions.

    Raises:
        UntimedError: a command of the stream has no entry in the pass.
    """
    from robot_latency.planner.untimed import UntimedError

    facts = untimed.by_id()
    out: list[SimCommand] = []
    for c in stream.commands:
        u = facts.get(c.command_id)
        if u is None:
            raise UntimedError(f"untimed pass {untimed.key[:12]}: no entry for command "
                               f"{c.command_id} of {stream.source}")
        arrival = c.t_ns / speed / 1e6
        if not u.asked or u.tokens_out < 1:
            out.append(SimCommand(c.command_id, arrival, asked=False))
            continue
        p = steps.predict(u.uncached_prompt_tokens, context_tokens=u.prompt_tokens)
        out.append(SimCommand(c.command_id, arrival, True, p.ttft_ms, p.itl_ms,
                              p.itl_floor_ms, u.tokens_out, u.plan_valid, p.ttft_floor_ms))
    return out


def _factors(rel: tuple[float, float] | None, z: np.ndarray) -> np.ndarray:
    """Multipliers from a relative 80% interval (lo < 0 < hi) at standard normal draws ``z``."""
    if rel is None:
        return np.ones_like(z)
    lo, hi = math.log1p(max(rel[0], -0.99)), math.log1p(max(rel[1], 0.0))
    # z = -1.28 gives the interval's low end (a faster target), z = +1.28 its high end
    return np.exp(np.where(z < 0, -z * lo / _Z80, z * hi / _Z80))


def _wilson(k: np.ndarray, n: int, z: float = Z_95) -> tuple[np.ndarray, np.ndarray]:
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # exact ends at 0 and n successes (no rounding residue above the point)
    return (np.where(k <= 0, 0.0, np.clip(mid - half, 0, 1)),
            np.where(k >= n, 1.0, np.clip(mid + half, 0, 1)))


def _run(cmds: Sequence[SimCommand], rules: RunSettings, deadlines: np.ndarray,
         service: np.ndarray, arrivals: np.ndarray | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Simulate the loop: (in_time, e2e_ms, answered) of shape (K deadlines, D draws, C
    commands), and the mask of commands counted (asked). ``answered``: the command got a plan
    of its own by its deadline, the model's in time or the fallback's at the give-up (not
    skipped, superseded or never planned). ``arrivals``: (D, C) arrival times (ms) per draw,
    in order (a capacity search draws replay speeds, :mod:`robot_latency.planner.capacity`);
    None: the commands' own, for every draw."""
    k, d = deadlines.size, service.shape[0]
    c = len(cmds)
    dl = deadlines[:, None]  # (K, 1)
    arrival = np.array([[x.arrival_ms for x in cmds]]) if arrivals is None \
        else np.asarray(arrivals, dtype=float).reshape(-1, c)  # (1 or D, C)
    asked = np.array([x.asked for x in cmds])
    in_time = np.zeros((k, d, c), dtype=bool)
    answered = np.zeros((k, d, c), dtype=bool)
    e2e = np.full((k, d, c), np.nan)
    margin = margin_ms(rules)
    if rules.mode == "periodic":
        period = np.maximum(rules.period_ms, deadlines)  # (K,)
        for ki in range(k):
            ok = service[:, :] <= deadlines[ki] - margin  # (D, C)
            planned = np.zeros(arrival.shape, dtype=bool)  # (1 or D, C)
            for row, times in enumerate(arrival):
                last = times[-1] if c else 0.0
                ticks = np.arange(math.floor(last / period[ki]) + 1 + TAIL_CYCLES) * period[ki]
                # the newest command that has arrived at each tick
                newest = np.searchsorted(times, ticks, side="right") - 1
                planned[row, newest[newest >= 0]] = True
            planned = np.broadcast_to(planned & asked, (d, c))
            in_time[ki] = ok & planned
            answered[ki] = planned
            e2e[ki][planned] = np.broadcast_to(service, (d, c))[planned]
        return in_time, e2e, answered, asked
    free = np.full((k, d), -np.inf)
    for i, x in enumerate(cmds):
        at = arrival[:, i][None, :]  # (1, 1 or D)
        start = np.maximum(at, free)
        deadline = at + dl
        skipped = start >= deadline
        if not x.asked:
            free = start
            continue
        give_up = deadline - margin
        done = start + service[:, i][None, :]
        end = np.where(skipped, start, np.where(done <= give_up, done,
                                                np.maximum(start, give_up)))
        ok = ~skipped & (done <= give_up)
        got = ~skipped
        if rules.on_new_command == "preempt" and i + 1 < c:
            nxt = arrival[:, i + 1][None, :]
            superseded = ~skipped & (nxt < end)
            ok &= ~superseded
            got &= ~superseded
            end = np.where(superseded, nxt, end)
        in_time[:, :, i] = ok
        answered[:, :, i] = got
        e2e[:, :, i] = np.where(skipped, np.nan, done - at)
        free = end
    return in_time, e2e, answered, asked


def _service(cmds: Sequence[SimCommand], steps: StepPredictor, z_prefill: np.ndarray,
             z_decode: np.ndarray) -> np.ndarray:
    """(D, C) service times: each draw scales prefill and decode by its own factor."""
    ttft = np.array([x.ttft_ms for x in cmds])
    itl = np.array([x.itl_ms for x in cmds])
    floor = np.array([x.itl_floor_ms for x in cmds])
    steps_n = np.array([max(0, x.tokens_out - 1) for x in cmds])
    ttft_floor = np.array([x.ttft_floor_ms for x in cmds])
    encode = np.array([x.encode_ms for x in cmds])
    probe = steps.predict(1)
    fp = _factors(probe.ttft_interval_rel, z_prefill)[:, None]
    fd = _factors(probe.itl_interval_rel, z_decode)[:, None]
    # the encode runs at the prefill's calibrated compute rate: it takes the prefill's draw
    return (np.maximum(ttft[None, :] * fp, ttft_floor[None, :]) + encode[None, :] * fp
            + steps_n[None, :] * np.maximum(itl[None, :] * fd, floor[None, :]))


def deadline_grid(cmds: Sequence[SimCommand], rules: RunSettings, n: int = 24) -> np.ndarray:
    """Deadlines (ms) for the curve: from just above the margins to past the slowest command
    (``cmds``: every level's, for one grid), and the run's own deadline."""
    top = max([x.service_ms for x in cmds if x.asked] or [rules.deadline_ms])
    lo = margin_ms(rules) + 1.0
    grid = np.linspace(lo, max(lo + 1.0, 1.25 * top + margin_ms(rules)), n)
    return np.unique(np.round(np.append(grid, rules.deadline_ms)))


def target_answer(label: str, cmds: Sequence[SimCommand], steps: StepPredictor,
                  rules: RunSettings, *, draws: int = DEFAULT_DRAWS, seed: int = 0,
                  miss_target: float = DEFAULT_MISS_TARGET, curve: bool = True,
                  grid: Sequence[float] | None = None,
                  rests_on: dict[str, Any] | None = None) -> TargetAnswer:
    """Simulate one level on the target: the one answer ``predict --stream`` and the report give.

    Args:
        label: the level's name.
        cmds: the commands (:func:`sim_commands`).
        steps: the step predictor the commands were predicted with (for the error's interval).
        rules: the run's settings whose loop rules apply (mode, deadline, period,
            on_new_command, and the target's margins: :func:`target_rules`).
        draws: Monte Carlo draws of the engine family's error.
        seed: the draws' seed (the same for every level: common draws).
        miss_target: the receiver miss rate the smallest held deadline is stated at.
        curve: also compute the deadline curve (miss rate against deadline, with intervals).
        grid: the curve's deadlines (ms; default :func:`deadline_grid`): give levels one grid.
        rests_on: what the answer rests on (sources, validation), carried into the answer.
    """
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, draws))
    z[:, 0] = 0.0  # draw 0 is the point prediction: no error
    service = _service(cmds, steps, z[0], z[1])
    counted = np.array([x.asked for x in cmds])
    n = int(counted.sum())
    valid = np.array([x.plan_valid for x in cmds])
    if not curve:
        grid = np.array([], dtype=float)
    grid = deadline_grid(cmds, rules) if grid is None else np.asarray(grid, dtype=float)
    deadlines = np.concatenate([[rules.deadline_ms], grid])
    in_time, e2e, answered, _ = _run(cmds, rules, deadlines, service)
    miss = (~in_time & counted).sum(axis=2)  # (K, D)
    good = (in_time & valid).sum(axis=2)
    def spread(lo: np.ndarray, hi: np.ndarray, point: float) -> tuple[float, float]:
        # the draws' Wilson ends; never an interval that leaves out the point itself
        return (min(point, float(np.percentile(lo, 2.5))),
                max(point, float(np.percentile(hi, 97.5))))

    if n:
        lo, hi = _wilson(miss.astype(float), n)
        glo, ghi = _wilson(good.astype(float), n)
        interval = spread(lo[0], hi[0], miss[0, 0] / n)
        g_interval = spread(glo[0], ghi[0], good[0, 0] / n)
    else:
        interval = g_interval = (0.0, 1.0)
    point_e2e = e2e[0, 0][counted & ~np.isnan(e2e[0, 0])]
    rows = tuple((float(dl), miss[j + 1, 0] / n, *spread(lo[j + 1], hi[j + 1], miss[j + 1, 0] / n))
                 for j, dl in enumerate(grid)) if n and curve else ()
    return TargetAnswer(
        label=label, device_id=steps.device.id, engine_family=steps.calibration.engine_family,
        deadline_ms=rules.deadline_ms, margin_ms=margin_ms(rules), commands=n,
        refused=len(cmds) - n, miss_rate=miss[0, 0] / n if n else float("nan"),
        miss_interval=interval, model_in_time_rate=good[0, 0] / n if n else float("nan"),
        model_in_time_interval=g_interval,
        e2e_p50_ms=float(np.percentile(point_e2e, 50)) if point_e2e.size else None,
        e2e_p99_ms=float(np.percentile(point_e2e, 99)) if point_e2e.size else None,
        miss_target=miss_target, min_deadline_ms=min_deadline_ms(cmds, rules, miss_target),
        draws=draws, e2e_ms=tuple(float(v) for v in e2e[0, 0][counted]), curve=rows,
        model_in_time_ids=tuple(x.command_id for x, ok in zip(
            cmds, in_time[0, 0] & valid, strict=True) if ok),
        fallback_ids=tuple(x.command_id for x, ok in zip(
            cmds, answered[0, 0] & ~(in_time[0, 0] & valid), strict=True) if ok),
        rests_on={**steps.describe(), **(rests_on or {})})


def _p(values: Sequence[int], q: float) -> int:
    """The ``q``-th percentile of counts, as one of them (nearest rank, upward)."""
    return int(np.percentile(np.asarray(values), q, method="higher"))


def token_budget(steps: StepPredictor, rules: RunSettings, uncached_prompt_tokens: int, *,
                 context_tokens: int = 0) -> int:
    """Output tokens that fit in the deadline on the target after a prompt of
    ``uncached_prompt_tokens`` (point prediction): n with TTFT + (n - 1) x ITL <= deadline -
    margins; 0 when the prefill alone does not fit."""
    p = steps.predict(uncached_prompt_tokens, context_tokens=context_tokens)
    room = rules.deadline_ms - margin_ms(rules) - p.ttft_ms
    return 0 if room < 0 else math.floor(room / p.itl_ms) + 1


def pass_facts(untimed: UntimedPass, steps: StepPredictor, rules: RunSettings) -> dict[str, Any]:
    """What the untimed pass found, for the answer's first line and its token budget: commands
    asked, those with no valid plan, those cut at ``max_tokens``; tokens per plan (of the
    complete outputs) and uncached prompt tokens (and their prompts' whole length) at p50 and
    p95; and the output tokens that fit in the deadline on the target after a p50 and a p95
    prompt."""
    asked = [c for c in untimed.commands if c.asked]
    cut = [c for c in asked if c.stop_reason == "max_tokens"]
    plans = [c.tokens_out for c in asked if c.stop_reason != "max_tokens" and c.tokens_out]
    out: dict[str, Any] = {
        "engine": untimed.engine, "asked": len(asked), "max_tokens": untimed.max_tokens,
        "no_valid_plan": sum(1 for c in asked if not c.plan_valid), "cut_at_max_tokens": len(cut),
        "tokens_per_plan": [_p(plans, 50), _p(plans, 95)] if plans else None,
        "prompt_tokens": None, "budget_tokens": None}
    if asked:
        uncached = [c.uncached_prompt_tokens for c in asked]
        context = [c.prompt_tokens for c in asked]
        prompts = [(_p(uncached, q), _p(context, q)) for q in (50, 95)]
        out["prompt_tokens"] = [u for u, _ in prompts]
        out["context_tokens"] = [n for _, n in prompts]
        out["budget_tokens"] = [token_budget(steps, rules, u, context_tokens=n)
                                for u, n in prompts]
    return out


def min_deadline_ms(cmds: Sequence[SimCommand], rules: RunSettings,
                    miss_target: float = DEFAULT_MISS_TARGET, *,
                    step_ms: float = 1.0) -> float | None:
    """The smallest deadline (to ``step_ms``) at which the point prediction's receiver miss rate
    is at most ``miss_target``; None when no command is asked."""
    asked = [x for x in cmds if x.asked]
    if not asked:
        return None
    service = np.array([[x.service_ms if x.asked else 0.0 for x in cmds]])
    hi = math.ceil(max(x.service_ms for x in asked) + margin_ms(rules) + 1.0)
    # queueing in event mode makes the rate not quite monotone in the deadline: scan a grid
    grid = np.arange(math.floor(margin_ms(rules)) + 1.0, 2 * hi + step_ms, step_ms)
    in_time, _, _, counted = _run(cmds, rules, grid, service)
    rate = (~in_time[:, 0, :] & counted).sum(axis=1) / counted.sum()
    ok = np.flatnonzero(rate <= miss_target)
    return float(grid[ok[0]]) if ok.size else None
