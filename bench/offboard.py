"""Offboard planning benchmarks, each against a real llama-cpp-python server on loopback.

    http_cost  the HTTP path's own cost: the same model in-process (llama.cpp) and on the server
               (openai engine over loopback), the same commands, interleaved repeats, without the
               grammar (ITL p50 ratio target <= 1.10, TTFT p50 difference <= +15 ms) and with it
               (which adds llama-cpp-python's full-vocabulary grammar pass on the server)
    fleet      N robots on one server (robot-latency fleet's core): per N, the model's plans and
               the fallbacks (which degrade with N) beside the deadline misses (which the
               fallback keeps near 0; Wilson 95%), and ITL/TTFT p99
    hedge      onboard-only, offboard-only and hybrid (each --policies policy) on the same
               stream while a fleet of --load robots loads the server: model-plan-in-time rate
               and late plans (targets: first_valid >= the better of the two alone,
               prefer_server >= offboard alone, nothing late); --onboard-model/--onboard-quant
               give the robot a model of its own (a slow one: the hedge then has to help)
    leak       --cycles cycles against the server, killed at a third and restarted at half:
               threads, open files and RSS before and after, every cycle's plan and reason
    kill       robot-latency run (the CLI, its own process) against the server, SIGKILLed --kills
               times per run (as a stream begins, mid-stream, between requests; the server's log
               says whether a request was streaming) and restarted each time; per run the cycles,
               late cycles, fallbacks by reason and their lateness, what each kill hit
               (bench/offboard_kill.py); target: 0 late, every mid-request kill a server fault

    python bench/offboard.py http_cost --model planner-inflated-qwen2.5-0.5b --quant Q4_K_M \
        --repeats 5 --commands 60 --out docs/bench/offboard_http_cost.json
    python bench/offboard.py fleet --robots 1,2,4,8 --out docs/bench/offboard_fleet.json
    python bench/offboard.py hedge --load 4 --repeats 3 --out docs/bench/offboard_hedge.json
    python bench/offboard.py hedge --onboard-model planner-inflated-qwen2.5-0.5b \
        --onboard-quant Q8_0 --load 0 --deadline-ms 400 --period-ms 500 \
        --out docs/bench/offboard_hedge_slow_onboard.json
    python bench/offboard.py leak --cycles 1000 --out docs/bench/offboard_leak.json
    python bench/offboard.py kill --kills 5 --repeats 3 --out docs/bench/offboard_kill.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from benchio import emit_result

from robot_latency import lifetime
from robot_latency.engines.base import GenerationRequest, StopReason, create_engine
from robot_latency.engines.llama_server import LocalServer
from robot_latency.lifetime import popen
from robot_latency.planner.budget import CpuBudget
from robot_latency.planner.config import RunSettings
from robot_latency.planner.loop import InlineRunner, PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.resolve import resolve_model_file
from robot_latency.profiles.profile import load_planning
from robot_latency.stats import distribution, wilson_interval
from robot_latency.streams import read_stream

COMMANDS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
            "bring me the blue bottle", "find the green ball then go to the garage quickly"]
STREAM = Path(__file__).resolve().parents[1] / "robot_latency/data/streams/steady_operator"


def _server(args: argparse.Namespace, log_dir: Path) -> LocalServer:
    return LocalServer(args.model_path, n_threads=args.threads, log_path=log_dir / "server.log")


def _stream(args: argparse.Namespace) -> Any:
    stream = read_stream(str(args.stream))
    if args.max_commands:
        stream = dataclasses.replace(stream, commands=stream.commands[: args.max_commands])
    return stream


# --- http_cost ---------------------------------------------------------------------------------
def _measure(engine: Any, planning: Any, commands: list[str], *, grammar: bool = True
             ) -> tuple[list[float], list[float]]:
    ttft, itl = [], []
    for text in commands:
        prompt = planning.build(text)
        request = GenerationRequest(prompt=prompt.suffix, prefix=prompt.prefix,
                                    max_tokens=planning.max_tokens,
                                    deadline_ns=time.perf_counter_ns() + 30_000_000_000,
                                    grammar=planning.contract.grammar if grammar else None,
                                    stop=planning.stop, messages=planning.messages(text))
        trace = engine.generate(request)
        stamps = trace.token_ns
        if trace.server is None and trace.stop_reason is StopReason.DONE and stamps:
            # In-process, the end-of-text token is stamped too; a server sends no text for it
            # (its last chunk only carries the finish_reason): compare the text tokens only.
            stamps = stamps[:-1]
        if stamps:
            ttft.append((stamps[0] - trace.started_ns) / 1e6)
            itl += [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    return ttft, itl


def _http_cost_pairs(local: Any, remote: Any, planning: Any, commands: list[str], repeats: int,
                     grammar: bool) -> dict[str, Any]:
    """Interleaved repeats of the same commands in-process and on the server."""
    _measure(local, planning, commands[:3], grammar=grammar)  # warm both
    _measure(remote, planning, commands[:3], grammar=grammar)
    reps: list[dict[str, Any]] = []
    for rep in range(repeats):
        order = [("inprocess", local), ("server", remote)]
        if rep % 2:
            order.reverse()  # interleaved: neither path always runs first
        row: dict[str, Any] = {}
        for name, engine in order:
            ttft, itl = _measure(engine, planning, commands, grammar=grammar)
            row[name] = {"ttft_p50_ms": distribution(ttft).p50,
                         "itl_p50_ms": distribution(itl).p50,
                         "ttft_n": len(ttft), "itl_n": len(itl)}
        reps.append(row)
    ratio = statistics.median(r["server"]["itl_p50_ms"] / r["inprocess"]["itl_p50_ms"]
                              for r in reps)
    diff = statistics.median(r["server"]["ttft_p50_ms"] - r["inprocess"]["ttft_p50_ms"]
                             for r in reps)
    return {"repeats": reps, "itl_p50_ratio_median": ratio, "ttft_p50_diff_ms_median": diff,
            "meets_targets": ratio <= 1.10 and diff <= 15.0}


def cmd_http_cost(args: argparse.Namespace) -> dict[str, Any]:
    """The same model and commands, in-process and on the server, without the grammar (the
    HTTP path's own cost: the targets) and with it. llama-cpp-python's server tests every
    vocabulary token against the GBNF grammar at each step; the in-process engine tests the
    argmax first (engines/llama_sampling.py), as llama.cpp's own server does: so the grammar
    pair also carries that server's grammar pass."""
    planning = load_planning(None)
    commands = [COMMANDS[i % len(COMMANDS)] for i in range(args.commands)]
    modes = {"both": (False, True), "off": (False,), "on": (True,)}[args.grammar]
    with tempfile.TemporaryDirectory() as tmp, _server(args, Path(tmp)) as server:
        local = create_engine("llamacpp", model_path=str(args.model_path),
                              n_threads=args.threads, n_threads_batch=args.threads)
        remote = create_engine("openai", server_url=server.url)
        try:
            pairs = {("with_grammar" if g else "without_grammar"):
                     _http_cost_pairs(local, remote, planning, commands, args.repeats, g)
                     for g in modes}
        finally:
            local.close()
            remote.close()
    own = pairs.get("without_grammar") or pairs["with_grammar"]
    return {"benchmark": "offboard http_cost", "model": str(args.model_path),
            "threads": args.threads, "commands": args.commands, **pairs,
            "targets": {"itl_p50_ratio_max": 1.10, "ttft_p50_diff_ms_max": 15.0,
                        "measured_on": "without_grammar" if "without_grammar" in pairs
                        else "with_grammar"},
            "meets_targets": own["meets_targets"]}


# --- fleet -------------------------------------------------------------------------------------
def cmd_fleet(args: argparse.Namespace) -> dict[str, Any]:
    from robot_latency.planner.fleet import FleetSpec, run_fleet

    sizes = tuple(int(x) for x in args.robots.split(","))
    with tempfile.TemporaryDirectory() as tmp, _server(args, Path(tmp)) as server:
        out = Path(args.runs_dir) if args.runs_dir else Path(tmp) / "fleet"
        settings = RunSettings(period_ms=args.period_ms, deadline_ms=args.deadline_ms,
                               server_url=server.url)
        doc = run_fleet(FleetSpec(sizes=sizes, out=out, settings=settings,
                                  arrivals=args.arrivals, seed=args.seed), _stream(args))
    for size in doc["sizes"]:
        size.pop("run_dirs", None)
    doc.pop("plot", None)
    # Per N at a glance: what the model planned and what fell back, beside the late plans.
    by_n = {str(s["robots"]): {"model_plan_rate": s["model_plan_rate"],
                               "fallback_rate": s["fallback_rate"],
                               "deadline_miss_rate": s["miss_rate"]} for s in doc["sizes"]}
    return {"benchmark": "offboard fleet", "model": str(args.model_path),
            "threads": args.threads, "by_robots": by_n, **doc}


# --- hedge -------------------------------------------------------------------------------------
def _load_robot(url: str, i: int, period_s: float, stop: Any, done: Any, busy_s: Any) -> None:
    planning = load_planning(None)
    engine = create_engine("openai", server_url=url)
    try:
        k = i
        while not stop.is_set():
            start = time.monotonic()
            _measure(engine, planning, [COMMANDS[k % len(COMMANDS)]])
            took = time.monotonic() - start
            with done.get_lock():
                done.value += 1
                busy_s.value += took
            k += 1
            stop.wait(max(0.0, period_s - took))
    finally:
        engine.close()


def _load_main(url: str, n: int, period_s: float, cpus: frozenset[int] | None, stop: Any,
               done: Any, busy_s: Any) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    threads = [threading.Thread(target=_load_robot, args=(url, i, period_s, stop, done, busy_s),
                                daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


#: How long the load robots may take to get their first answers.
LOAD_START_TIMEOUT_S = 300.0


class FleetLoad:
    """``n`` robots asking the server one plan each per ``period_ms`` until stopped.

    They run in a process of their own (on ``cpus``), so their client threads never share the
    measured planner's interpreter: the load is the server's, not the robot's.
    """

    def __init__(self, url: str, n: int, period_ms: float,
                 cpus: frozenset[int] | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self._done = ctx.Value("l", 0)
        self._busy_s = ctx.Value("d", 0.0, lock=False)
        self.proc = lifetime.process(ctx, _load_main, daemon=True,
                                     args=(url, n, period_ms / 1000, cpus, self.stop, self._done,
                                           self._busy_s))
        self.n = n
        self.started = 0.0
        self.wall_s = 0.0

    @property
    def requests(self) -> int:
        return int(self._done.value)

    def summary(self) -> dict[str, Any]:
        """Requests answered, their mean time at the client (queue included), and the mean
        number in flight (Little's law: above 1, requests wait for one another)."""
        n = self.requests
        busy = float(self._busy_s.value)
        return {"requests": n, "mean_request_ms": busy / n * 1e3 if n else None,
                "wall_s": self.wall_s,
                "mean_requests_in_flight": busy / self.wall_s if self.wall_s else None}

    def __enter__(self) -> FleetLoad:
        lifetime.start(self.proc)
        # The load is on once every robot has had one answer: a measurement started before
        # then (the spawned process still importing) would run on an idle server.
        give_up = time.monotonic() + LOAD_START_TIMEOUT_S
        while self.requests < self.n and self.proc.is_alive() and time.monotonic() < give_up:
            time.sleep(0.05)
        if self.requests < self.n:
            self.__exit__()
            raise RuntimeError(f"the {self.n} load robots had {self.requests} answers after "
                               f"{LOAD_START_TIMEOUT_S:.0f} s: the load did not start")
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.monotonic() - self.started
        self.stop.set()
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()


def _in_time(run_dir: Path) -> dict[str, Any]:
    from robot_latency.records import read_records

    recs = read_records(run_dir / "cycles.jsonl")
    asked = [r for r in recs if r.command_id is not None and not r.skipped]
    good = sum(1 for r in asked if r.plan_source == "model" and r.deadline_met)
    late = sum(1 for r in recs if not r.deadline_met)
    ci = wilson_interval(good, len(asked))
    return {"cycles": len(recs), "asked": len(asked), "model_plan_in_time": good,
            "model_plan_in_time_rate": good / len(asked) if asked else None,
            "model_plan_in_time_ci95": list(ci) if ci else None, "late": late}


def _hedge_targets(rates: dict[str, float | None], late: dict[str, int]
                   ) -> dict[str, dict[str, Any]]:
    """Each hybrid policy's target: first_valid at least the better of the two alone,
    prefer_server at least offboard alone (the server's plan is the one it prefers); nothing
    late."""
    on, off = rates["onboard"] or 0.0, rates["offboard"] or 0.0
    out = {}
    for name in late:
        floor = max(on, off) if name == "hybrid_first_valid" else off
        out[name] = {"at_least": floor, "late": late[name],
                     "met": (rates[name] or 0.0) >= floor and late[name] == 0}
    return out


def cmd_hedge(args: argparse.Namespace) -> dict[str, Any]:
    from robot_latency.planner.replay import run_replay
    from robot_latency.planner.resolve import resolve_run

    stream = _stream(args)
    policies = tuple(p for p in args.policies.split(",") if p)
    onboard_path = args.onboard_path or args.model_path
    onboard_threads = args.onboard_threads or args.threads
    # The robot's loop under SCHED_FIFO when asked (docs/ROS.md, "Real-time"): on the one core left
    # to the robot, the normal scheduler let the niced engine hold the core a few ms past the
    # loop's give-up time.
    settings = RunSettings(period_ms=args.period_ms, deadline_ms=args.deadline_ms,
                           model=str(onboard_path), n_threads=onboard_threads,
                           n_threads_batch=onboard_threads,
                           cpu=CpuBudget(loop_priority=args.loop_priority))
    hybrids = tuple(f"hybrid_{p}" for p in policies)
    configs = ("onboard", "offboard", *hybrids)
    # The server stands for another machine: it and its load get the last core, the robot (the
    # loop and its onboard worker, which inherits this process's cores) the others. On one shared
    # pool the server's work would slow the onboard engine in the hybrid runs only.
    have = sorted(os.sched_getaffinity(0))
    server_cpus = robot_cpus = None
    if args.split_cores and len(have) >= 2:
        server_cpus, robot_cpus = frozenset(have[-1:]), frozenset(have[:-1])
        os.sched_setaffinity(0, robot_cpus)
    reps: list[dict[str, Any]] = []
    server = LocalServer(args.model_path, n_threads=args.threads, cpus=server_cpus)
    with tempfile.TemporaryDirectory() as tmp, server, \
            FleetLoad(server.url, args.load, args.load_period_ms or args.period_ms,
                      cpus=server_cpus) as load:
        for rep in range(args.repeats):
            row: dict[str, Any] = {}
            shift = rep % len(configs)
            order = configs[shift:] + configs[:shift]  # interleaved, rotating
            for name in order:
                run_dir = Path(args.runs_dir or tmp) / f"rep{rep}-{name}"
                engine = "hybrid" if name in hybrids else \
                    {"onboard": "llamacpp", "offboard": "openai"}[name]
                policy = name[len("hybrid_"):] if name in hybrids else settings.hybrid_policy
                run, _ = resolve_run(dataclasses.replace(
                    settings, log_dir=run_dir, engine=engine, server_url=server.url,
                    hybrid_policy=policy))
                run_replay(run, stream)
                row[name] = _in_time(run_dir)
            reps.append(row)
    load_summary = load.summary()

    def med(name: str) -> float | None:
        vals = [r[name]["model_plan_in_time_rate"] for r in reps
                if r[name]["model_plan_in_time_rate"] is not None]
        return statistics.median(vals) if vals else None
    rates = {name: med(name) for name in configs}
    late = {name: sum(r[name]["late"] for r in reps) for name in hybrids}
    targets = _hedge_targets(rates, late)
    return {"benchmark": "offboard hedge", "model": str(args.model_path),
            "threads": args.threads, "onboard_model": str(onboard_path),
            "onboard_threads": onboard_threads, "policies": list(policies),
            "load_robots": args.load,
            "load_period_ms": args.load_period_ms or args.period_ms, "load": load_summary,
            "server_cpus": sorted(server_cpus) if server_cpus else None,
            "robot_cpus": sorted(robot_cpus) if robot_cpus else None,
            "deadline_ms": args.deadline_ms, "period_ms": args.period_ms,
            "loop_priority": args.loop_priority,
            "repeats": reps, "model_plan_in_time_rate_median": rates,
            "hybrid_late_cycles": late, "targets": targets,
            "meets_target": all(t["met"] for t in targets.values())}


# --- leak --------------------------------------------------------------------------------------
def cmd_leak(args: argparse.Namespace) -> dict[str, Any]:
    proc = psutil.Process(os.getpid())
    kill_at, back_at = args.cycles // 3, args.cycles // 2
    warm = min(10, max(1, args.cycles // 10))
    with tempfile.TemporaryDirectory() as tmp:
        server = _server(args, Path(tmp)).start()
        # Counted, not kept: a list of every record would itself grow the RSS measured here.
        counts = {"cycles": 0, "planned": 0, "misses": 0}
        reasons: dict[str, int] = {}
        measuring = [False]

        def sink(rec: Any) -> None:
            if not measuring[0]:
                return
            counts["cycles"] += 1
            counts["planned"] += rec.plan is not None
            counts["misses"] += not rec.deadline_met
            key = rec.fallback_reason or "model"
            reasons[key] = reasons.get(key, 0) + 1

        engine = create_engine("openai", server_url=server.url)
        config = RunSettings(period_ms=args.deadline_ms, deadline_ms=args.deadline_ms)
        loop = PlannerLoop(config, InlineRunner(engine), publish=lambda _e: None, sink=sink,
                           planning=load_planning(None))
        try:
            for i in range(warm):
                now = loop.clock()
                loop.run_cycle(i, now, InboundCommand(f"w{i}", COMMANDS[i % 5], now))
            gc.collect()
            before = {"threads": threading.active_count(), "fds": proc.num_fds(),
                      "rss_bytes": proc.memory_info().rss}
            measuring[0] = True
            for i in range(args.cycles):
                if i == kill_at:
                    server.stop()
                if i == back_at:
                    server.start()
                now = loop.clock()
                loop.run_cycle(warm + i, now, InboundCommand(f"c{i}", COMMANDS[i % 5], now))
            gc.collect()
            after = {"threads": threading.active_count(), "fds": proc.num_fds(),
                     "rss_bytes": proc.memory_info().rss}
        finally:
            engine.close()
            server.stop()
    return {"benchmark": "offboard leak", "cycles": args.cycles, "killed_at": kill_at,
            "restarted_at": back_at, "before": before, "after": after,
            "rss_growth_bytes": after["rss_bytes"] - before["rss_bytes"],
            "thread_growth": after["threads"] - before["threads"],
            "fd_growth": after["fds"] - before["fds"],
            "every_cycle_planned": counts["planned"] == counts["cycles"] == args.cycles,
            "deadline_misses": counts["misses"],
            "reasons": reasons}


# --- kill --------------------------------------------------------------------------------------
#: How long a run may take beyond its stream before it counts as hung (s).
KILL_RUN_GRACE_S = 600.0


def _served_between(args: argparse.Namespace) -> int:
    """Requests served between kills: as given, else the run's cycles over kills + 2 (each tick
    asks the server once a command is in, so the kills are spread over the run; the one part
    more leaves room for the cycles the server is down)."""
    from robot_latency.planner.replay import planned_cycles

    if args.served_between:
        return int(args.served_between)
    settings = RunSettings(period_ms=args.period_ms, deadline_ms=args.deadline_ms)
    return max(3, planned_cycles(settings, _stream(args)) // (args.kills + 2))


def _kill_once(args: argparse.Namespace, server: LocalServer, stream_path: Path,
               labels: Path | None, run_dir: Path, logs: Path) -> dict[str, Any]:
    """One ``robot-latency run`` against ``server`` with the kills; its summary."""
    import json

    from offboard_kill import Killer, cli_run_command, run_summary

    from robot_latency.records import read_records

    cmd = cli_run_command(stream_path, server.url, run_dir, deadline_ms=args.deadline_ms,
                          period_ms=args.period_ms, labels=labels)
    killer = Killer(server, args.kills, served_between=_served_between(args))
    out, err = logs / f"{run_dir.name}.json", logs / f"{run_dir.name}.stderr"
    with open(out, "wb") as fout, open(err, "wb") as ferr:
        proc = popen(cmd, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL)
        try:
            killer.run(alive=lambda: proc.poll() is None)
            rc = proc.wait(timeout=_stream(args).duration_ns / 1e9 + KILL_RUN_GRACE_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if rc != 0:
        tail = " | ".join(err.read_text(errors="replace").strip().splitlines()[-8:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}: {tail}")
    summary = json.loads(out.read_text())
    row = run_summary(read_records(run_dir / "cycles.jsonl"), killer.done, asked=args.kills,
                      drill=killer.at_end())
    # The run's own count beside the records': the same cycles, the same misses.
    row["run_summary"] = {k: summary.get(k) for k in ("cycles", "deadline_misses",
                                                      "deadline_miss_rate")}
    return row


def cmd_kill(args: argparse.Namespace) -> dict[str, Any]:
    from robot_latency.profiles.labels import default_labels_path
    from robot_latency.streams.jsonl import write_jsonl

    reps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        stream_path, labels = args.stream, None
        if args.max_commands:  # the CLI reads whole streams: hand it the first commands
            stream_path = write_jsonl(tmp_path / "stream.jsonl", _stream(args).commands)
            labels = default_labels_path(args.stream)
        runs = Path(args.runs_dir) if args.runs_dir else tmp_path / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        with _server(args, tmp_path) as server:
            for rep in range(args.repeats):
                row = _kill_once(args, server, Path(stream_path), labels, runs / f"rep{rep}",
                                 tmp_path)
                reps.append({"repeat": rep, **row})
    total = {key: sum(r[key] for r in reps) for key in (
        "cycles", "late", "kills", "kills_mid_request", "mid_request_cycles", "mid_request_cut",
        "mid_request_answered", "mid_request_given_up", "mid_request_other",
        "mid_request_late")}
    return {"benchmark": "offboard kill", "model": str(args.model_path),
            "threads": args.threads, "stream": str(args.stream),
            "max_commands": args.max_commands, "deadline_ms": args.deadline_ms,
            "period_ms": args.period_ms, "kills_per_run": args.kills,
            "served_between": _served_between(args), "repeats": reps, **total,
            "targets": {"late": 0, "mid_request_reasons": ["server_error", "server_unreachable"],
                        "mid_request_other": 0},
            "meets_target": total["late"] == 0 and total["mid_request_other"] == 0
            and total["mid_request_late"] == 0}


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name, func in (("http_cost", cmd_http_cost), ("fleet", cmd_fleet),
                       ("hedge", cmd_hedge), ("leak", cmd_leak), ("kill", cmd_kill)):
        p = sub.add_parser(name, allow_abbrev=False)
        p.set_defaults(func=func)
        p.add_argument("--model", default="planner",
                       help="GGUF path or shipped name (planner, planner-inflated-<preset>)")
        p.add_argument("--quant", default=None, help="ladder level of --model (e.g. Q4_K_M)")
        p.add_argument("--threads", type=int, default=1, help="llama.cpp threads, both sides")
        p.add_argument("--out", type=Path, default=None, help="write the JSON here too")
        p.add_argument("--stream", type=Path, default=STREAM)
        p.add_argument("--max-commands", type=int, default=0)
        p.add_argument("--deadline-ms", type=float, default=150.0)
        p.add_argument("--period-ms", type=float, default=200.0)
        if name == "http_cost":
            p.add_argument("--repeats", type=int, default=5)
            p.add_argument("--commands", type=int, default=60)
            p.add_argument("--grammar", default="both", choices=("both", "off", "on"),
                           help="off: the HTTP path's own cost (the targets); on: with the "
                                "server's grammar pass; both (default)")
        if name == "fleet":
            p.add_argument("--robots", default="1,2,4,8")
            p.add_argument("--arrivals", default="offset", choices=("offset", "poisson"))
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--runs-dir", default=None, help="keep the run directories here")
        if name == "hedge":
            p.add_argument("--load", type=int, default=4, help="robots loading the server")
            p.add_argument("--runs-dir", default=None, help="keep the run directories here")
            p.add_argument("--loop-priority", type=int, default=0,
                           help="the loop thread's SCHED_FIFO priority (0: normal scheduler)")
            p.add_argument("--load-period-ms", type=float, default=0.0,
                           help="each loading robot asks once per this (0: --period-ms)")
            p.add_argument("--no-split-cores", dest="split_cores", action="store_false",
                           help="run the server on the same cores as the robot (default: the "
                                "server and its load on the last core, the robot on the rest)")
            p.add_argument("--repeats", type=int, default=3)
            p.add_argument("--policies", default="first_valid,prefer_server",
                           help="hybrid policies to run, comma-separated")
            p.add_argument("--onboard-model", default=None,
                           help="the robot's own model (default: --model, the server's)")
            p.add_argument("--onboard-quant", default=None, help="ladder level of it")
            p.add_argument("--onboard-threads", type=int, default=0,
                           help="llama.cpp threads on the robot (0: --threads)")
        if name == "leak":
            p.add_argument("--cycles", type=int, default=1000)
        if name == "kill":
            p.add_argument("--kills", type=int, default=5, help="SIGKILLs of the server per run")
            p.add_argument("--repeats", type=int, default=3, help="runs, one server throughout")
            p.add_argument("--served-between", type=int, default=0,
                           help="requests the server must have ended since it (re)started "
                                "before the next kill (0: the run's cycles / (kills + 2))")
            p.add_argument("--runs-dir", default=None, help="keep the run directories here")
    args = parser.parse_args()
    args.model_path = Path(resolve_model_file(args.model, args.quant) or args.model)
    onboard = getattr(args, "onboard_model", None) or (
        args.model if getattr(args, "onboard_quant", None) else None)
    args.onboard_path = None if onboard is None else Path(
        resolve_model_file(onboard, args.onboard_quant) or onboard)
    result = args.func(args)
    result["machine_note"] = ("figures from a busy machine unless run on a quiet one; see "
                              "docs/BENCHMARKS.md")
    return emit_result(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
