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
share of the model's own plans. A server does not say how long a request waited
for it, so queue time is estimated at the robot: a cycle's TTFT over the TTFT p50 of the smallest
fleet measured (one robot when 1 is among the sizes), floored at 0.

Against llama-cpp-python's server (one generation at a time) the robots queue: TTFT and misses
grow with N while ITL stays flat. Against vLLM (continuous batching) the requests share each
decode step: ITL p99 grows with N (the batching dial) and queueing stays small until the batch
is full.
"""

from __future__ import annotations

import json
import logging
import threading
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


@dataclass(frozen=True)
class FleetSpec:
    """What a fleet run replays, against which server.

    Args:
        sizes: fleet sizes to run, in order (e.g. (1, 2, 4, 8)).
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
        if not self.sizes or any(n < 1 for n in self.sizes):
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
    return {"robots": n, "cycles": cycles, "deadline_misses": misses,
            "miss_rate": misses / cycles if cycles else None,
            "miss_rate_ci95": list(ci) if ci else None,
            "model_plans": model_plans,
            "model_plan_rate": model_plans / cycles if cycles else None,
            "fallback_plans": fallback_plans,
            "fallback_rate": fallback_plans / cycles if cycles else None,
            "fallback_rate_ci95": list(fci) if fci else None,
            "fallbacks": reasons, "ttft_ms": pp(ttft), "itl_ms": pp(itl),
            "queue_ms": pp(queue), "queue_basis_ttft_p50_ms": ttft_alone_ms}


def run_fleet(spec: FleetSpec, stream: CommandStream) -> dict[str, Any]:
    """Run every fleet size in turn; write the summaries and fleet.json; return the results
    (the plot is :func:`robot_latency.report.fleet_plot.plot_fleet`'s)."""
    spec.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    alone: float | None = None
    for n in sorted(spec.sizes):
        dirs = run_fleet_size(spec, stream, n)
        records = [r for d in dirs for r in read_records(d / "cycles.jsonl")]
        if alone is None:
            alone = distribution(r.ttft_ns / 1e6 for r in records if r.ttft_ns is not None).p50
        summary = summarize_fleet(n, records, ttft_alone_ms=alone)
        summary["run_dirs"] = [str(d) for d in dirs]
        (spec.out / f"N{n}" / "fleet_summary.json").write_text(
            json.dumps(summary, indent=2) + "\n")
        results.append(summary)
    doc = {"server_url": spec.settings.server_url, "arrivals": spec.arrivals, "seed": spec.seed,
           "deadline_ms": spec.settings.deadline_ms, "period_ms": spec.settings.period_ms,
           "stream": stream.source, "sizes": results}
    (spec.out / "fleet.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc
