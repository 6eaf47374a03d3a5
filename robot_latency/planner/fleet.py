"""A fleet sharing one server: N robots' command streams replayed at once against one
OpenAI-compatible server, for each fleet size asked.

Each robot is a planner run of its own (engine ``openai``, inline runner, one loop thread; its run
directory ``OUT/N<n>/robot<i>``), with its own arrival process: the recorded stream shifted by
``i × period / N`` (``offset``), or the stream's commands re-timed by a Poisson process seeded
``seed + i`` (``poisson``). All robots live in one process: N loop threads and N client event-loop
threads, nothing more, whatever the stream's length.

Per fleet size the summary pools every robot's cycles: deadline-miss rate with its Wilson 95%
interval; the model's plans and the fallbacks' (``model_plans``, ``fallback_plans``, their
rates, the fallback rate's Wilson 95% interval; every fallback is a model miss, and
``fallbacks`` counts the cycles without a model plan by reason); TTFT and ITL p50/p99, and
queue time. The fallback keeps deadline misses near 0 as the fleet grows; what degrades is the
share of the model's own plans. The *model miss rate* joins the two: of the cycles the model was
due to answer (every cycle but those with no command yet, a refused command or a withdrawn one:
:data:`NOT_DUE`), the share whose published plan was not the model's or came after the deadline;
``worst_robot_model_miss_rate`` is the highest single robot's. A server does not say how long a
request waited
for it, so queue time is estimated at the robot: a cycle's TTFT over the TTFT p50 of the smallest
fleet measured (one robot when 1 is among the sizes), floored at 0.

Against llama-cpp-python's server (one generation at a time) the robots queue: TTFT and misses
grow with N while ITL stays flat. Against vLLM (continuous batching) the requests share each
decode step: ITL p99 grows with N (the batching dial) and queueing stays small until the batch
is full.

:func:`find_robots` searches the largest fleet that holds a target on the model miss rate: sizes
1, 2, 4, ... until one fails, then bisection between the largest held and the first failed
(:func:`robot_latency.planner.capacity.bisect_count`), each size a normal fleet run.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from robot_latency.planner.config import RunSettings
from robot_latency.records import CycleRecord, read_records
from robot_latency.stats import distribution, wilson_interval
from robot_latency.streams import CommandStream
from robot_latency.streams.arrivals import arrival_times_ns

log = logging.getLogger(__name__)

ARRIVALS = ("offset", "poisson")
#: Fallback reasons of cycles the model was never due to answer, whatever the load: no command
#: yet (periodic ticks before the first), a command refused as bad, a command withdrawn.
NOT_DUE = ("no_command", "bad_command", "cancelled")


@dataclass(frozen=True)
class FleetSpec:
    """What a fleet run replays, against which server.

    Args:
        sizes: fleet sizes to run, in order (e.g. (1, 2, 4, 8)); :func:`find_robots`
            chooses its own and leaves them unused (may be empty).
        out: the fleet directory.
        settings: each robot's settings: the loop's, the shared server's (``server_url``,
            ``server_model``, ``server_api``) and the planner profile; each robot runs them
            with engine ``openai``, the inline runner, and a run directory of its own.
        arrivals: ``offset`` or ``poisson`` (module docstring).
        rate_hz: the Poisson rate per robot (0: the stream's own mean rate).
        seed: robot ``i`` draws its Poisson arrivals with ``seed + i``.
        speed: replay speed factor of the recorded times.
    """

    sizes: tuple[int, ...]
    out: Path
    settings: RunSettings
    arrivals: str = "offset"
    rate_hz: float = 0.0
    seed: int = 0
    speed: float = 1.0

    def __post_init__(self) -> None:
        if any(n < 1 for n in self.sizes):
            raise ValueError(f"robots={self.sizes!r}: fleet sizes must be >= 1")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals={self.arrivals!r}: must be one of {ARRIVALS}")
        if self.rate_hz < 0:
            raise ValueError(f"rate_hz={self.rate_hz!r}: must be >= 0")


def robot_stream(stream: CommandStream, robot: int, n_robots: int, spec: FleetSpec
                 ) -> CommandStream:
    """Return robot ``robot``'s copy of the stream with its own arrival times and ids."""
    commands = list(stream.commands)
    if spec.arrivals == "poisson" and commands:
        own = (len(commands) - 1) / (commands[-1].t_ns / 1e9) \
            if len(commands) > 1 and commands[-1].t_ns > 0 else 1.0
        times = arrival_times_ns(len(commands), process="poisson",
                                 rate_hz=spec.rate_hz or own, seed=spec.seed + robot)
    else:
        shift = round(robot * spec.settings.period_ns / n_robots)
        times = [c.t_ns + shift for c in commands]
    moved = tuple(replace(c, t_ns=t, command_id=f"r{robot}:{c.command_id}")
                  for c, t in zip(commands, times, strict=True))
    return replace(stream, name=f"{stream.name}-robot{robot}", commands=moved)


def _robot_config(spec: FleetSpec, run_dir: Path, robot: int, n: int) -> Any:
    from robot_latency.planner.resolve import resolve_run

    run, _notes = resolve_run(replace(
        spec.settings, log_dir=run_dir, engine="openai", runner="inline",
        label=f"robot {robot} of {n}",
        extra={"fleet": {"robots": n, "robot": robot, "arrivals": spec.arrivals,
                         "seed": spec.seed + robot, "server_url": spec.settings.server_url}}))
    return run


def run_fleet_size(spec: FleetSpec, stream: CommandStream, n: int) -> list[Path]:
    """Replay ``n`` robots at once; return their run directories."""
    from robot_latency.planner.replay import run_replay

    size_dir = spec.out / f"N{n}"
    dirs = [size_dir / f"robot{i}" for i in range(n)]
    configs = [_robot_config(spec, d, i, n) for i, d in enumerate(dirs)]
    errors: list[str] = []
    start = threading.Barrier(n)

    def one(i: int) -> None:
        try:
            start.wait(timeout=600)
            run_replay(configs[i], robot_stream(stream, i, n, spec), speed=spec.speed)
        except Exception as err:  # reported after the others finish
            log.error("fleet N=%d robot %d: %s", n, i, err)
            errors.append(f"robot {i}: {err}")

    threads = [threading.Thread(target=one, args=(i,), name=f"robot{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"fleet of {n}: " + "; ".join(errors))
    return dirs


def model_misses(records: list[CycleRecord]) -> tuple[int, int]:
    """Return (cycles the model was due to answer, those it did not answer in time): the model
    miss rate's count (module docstring)."""
    due = [r for r in records if r.fallback_reason not in NOT_DUE]
    return len(due), sum(1 for r in due if r.plan_source != "model" or not r.deadline_met)


def summarize_fleet(n: int, records: list[CycleRecord], *,
                    ttft_alone_ms: float | None) -> dict[str, Any]:
    """Return one fleet size's summary from all its robots' records."""
    cycles = len(records)
    misses = sum(1 for r in records if not r.deadline_met)
    ci = wilson_interval(misses, cycles)
    ttft = [r.ttft_ns / 1e6 for r in records if r.ttft_ns is not None]
    itl = [g / 1e6 for r in records for g in r.itl_ns]
    queue = [max(0.0, t - ttft_alone_ms) for t in ttft] if ttft_alone_ms is not None else []
    reasons: dict[str, int] = {}
    for r in records:
        if r.plan_source != "model" and r.fallback_reason:
            reasons[r.fallback_reason] = reasons.get(r.fallback_reason, 0) + 1

    def pp(values: list[float]) -> dict[str, float | None]:
        d = distribution(values)
        return {"p50": d.p50, "p99": d.p99, "n": d.n}

    model_plans = sum(1 for r in records if r.plan_source == "model")
    fallback_plans = sum(1 for r in records if r.plan_source == "fallback")
    fci = wilson_interval(fallback_plans, cycles)
    due, missed = model_misses(records)
    mci = wilson_interval(missed, due)
    robots: dict[str, list[CycleRecord]] = {}
    for r in records:
        robots.setdefault(r.run_id, []).append(r)
    per_robot = [m / d for d, m in map(model_misses, robots.values()) if d]
    return {"robots": n, "cycles": cycles, "deadline_misses": misses,
            "miss_rate": misses / cycles if cycles else None,
            "miss_rate_ci95": list(ci) if ci else None,
            "model_plans": model_plans,
            "model_plan_rate": model_plans / cycles if cycles else None,
            "fallback_plans": fallback_plans,
            "fallback_rate": fallback_plans / cycles if cycles else None,
            "fallback_rate_ci95": list(fci) if fci else None,
            "fallbacks": reasons, "model_due": due, "model_misses": missed,
            "model_miss_rate": missed / due if due else None,
            "model_miss_rate_ci95": list(mci) if mci else None,
            "worst_robot_model_miss_rate": max(per_robot) if per_robot else None,
            "ttft_ms": pp(ttft), "itl_ms": pp(itl),
            "queue_ms": pp(queue), "queue_basis_ttft_p50_ms": ttft_alone_ms}


def measure_size(spec: FleetSpec, stream: CommandStream, n: int,
                 ttft_alone_ms: float | None) -> dict[str, Any]:
    """Run a fleet of ``n``, write ``OUT/N<n>/fleet_summary.json`` and return the summary;
    ``ttft_alone_ms`` None: this size's own TTFT p50 is the queue time's basis."""
    dirs = run_fleet_size(spec, stream, n)
    records = [r for d in dirs for r in read_records(d / "cycles.jsonl")]
    if ttft_alone_ms is None:
        ttft_alone_ms = distribution(r.ttft_ns / 1e6 for r in records
                                     if r.ttft_ns is not None).p50
    summary = summarize_fleet(n, records, ttft_alone_ms=ttft_alone_ms)
    summary["run_dirs"] = [str(d) for d in dirs]
    (spec.out / f"N{n}" / "fleet_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _fleet_doc(spec: FleetSpec, stream: CommandStream, results: list[dict[str, Any]]
               ) -> dict[str, Any]:
    return {"server_url": spec.settings.server_url, "arrivals": spec.arrivals,
            "seed": spec.seed, "deadline_ms": spec.settings.deadline_ms,
            "period_ms": spec.settings.period_ms, "stream": stream.source,
            "sizes": sorted(results, key=lambda s: s["robots"])}


def run_fleet(spec: FleetSpec, stream: CommandStream) -> dict[str, Any]:
    """Run every fleet size in turn; write the summaries and fleet.json; return the results
    (the plot is :func:`robot_latency.report.fleet_plot.plot_fleet`'s)."""
    if not spec.sizes:
        raise ValueError("robots=(): no fleet size to run")
    spec.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for n in sorted(spec.sizes):
        results.append(measure_size(spec, stream, n,
                                    results[0]["queue_basis_ttft_p50_ms"] if results else None))
    doc = _fleet_doc(spec, stream, results)
    (spec.out / "fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def search_robots(measure: Callable[[int], dict[str, Any]], *, miss_target: float,
                  trials: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Search the largest fleet size whose model miss rate stays at or under ``miss_target``.

    Sizes 1, 2, 4, ... until one fails, then bisection between the largest held and the first
    failed (:func:`~robot_latency.planner.capacity.bisect_count`), at most ``trials`` sizes.

    Args:
        measure: one fleet size's summary (:func:`summarize_fleet`'s keys; its
            ``model_miss_rate`` is the criterion, None counted as a failure: no cycle the model
            was due to answer).
        miss_target: the highest model miss rate that holds (fraction).
        trials: the most sizes tried.

    Returns:
        fleet.json's ``find_robots`` answer, and the summaries of the sizes tried, in order.

    Raises:
        CapacityError: a miss target outside [0, 1) or ``trials`` < 1 (before any size runs).
    """
    from robot_latency.planner.capacity import bisect_count

    summaries: list[dict[str, Any]] = []
    tried: list[dict[str, Any]] = []

    def miss_one(n: int) -> float:
        summary = measure(n)
        summaries.append(summary)
        rate = summary["model_miss_rate"]
        miss = 1.0 if rate is None else float(rate)
        tried.append({"robots": n, "model_miss_rate": miss, "held": miss <= miss_target,
                      "size_dir": f"N{n}"})
        log.info("find-robots: %d robots: model miss rate %.4f", n, miss)
        return miss

    found = bisect_count(miss_one, miss_target, trials=trials)
    answer = {"miss_target": miss_target, "criterion": "model_miss_rate", "max_trials": trials,
              "robots_held": found.held, "robots_failed": found.failed,
              "miss_held": found.miss_held, "miss_failed": found.miss_failed,
              "tried": found.tried, "trials": tried}
    return answer, summaries


def find_robots(spec: FleetSpec, stream: CommandStream, *, miss_target: float,
                trials: int) -> dict[str, Any]:
    """:func:`search_robots` with real fleets: each size tried a normal fleet run
    (``OUT/N<n>/``; ``spec.sizes`` is not used); writes fleet.json with every size tried and
    the answer under ``find_robots``; returns it."""
    spec.out.mkdir(parents=True, exist_ok=True)
    basis: list[float | None] = []  # the first size's (1 robot's) TTFT p50: the queue's basis

    def measure(n: int) -> dict[str, Any]:
        summary = measure_size(spec, stream, n, basis[0] if basis else None)
        basis.append(summary["queue_basis_ttft_p50_ms"])
        return summary

    answer, summaries = search_robots(measure, miss_target=miss_target, trials=trials)
    doc = _fleet_doc(spec, stream, summaries)
    doc["find_robots"] = answer
    (spec.out / "fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc
