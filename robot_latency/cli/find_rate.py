"""``sweep --find-rate`` and ``run --find-rate``: the highest replay speed this host holds at a
miss target, measured.

Each trial is a real run of the one configuration the flags name, at one replay speed, in its own
run directory ``OUT/find_rate/x<speed>``; its miss rate is the run's own (the receiver's, from
``client_summary.json``, where the run has one, else the planner's ``summary.json``). The speeds
tried come from :func:`robot_latency.planner.capacity.bisect_speed`: ``--speed`` first, doubling
or halving to a bracket, then bisection, at most ``--find-rate-trials`` runs. The answer is
printed and written to ``OUT/find_rate.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from robot_latency.cli.common import UsageError, echo, emit_json, search_answer_lines, split_list
from robot_latency.cli.run_args import (
    add_host_load,
    first_missing,
    read_labels_arg,
    read_stream_arg,
    remove_failed_start,
    settings_from_args,
)
from robot_latency.hostcheck.load import LoadWatch

FIND_RATE_JSON = "find_rate.json"


def run_miss_rate(run_dir: Path) -> tuple[float, str]:
    """The run's miss rate and whose it is (``receiver`` or ``planner``)."""
    client = run_dir / "client_summary.json"
    if client.is_file():
        rate = json.loads(client.read_text(encoding="utf-8")).get("receiver_miss_rate")
        if rate is not None:
            return float(rate), "receiver"
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    return float(summary["deadline_miss_rate"]), "planner"


def trial_dir(out: Path, speed: float) -> Path:
    """A trial's run directory: ``OUT/find_rate/x<speed>``."""
    return out / "find_rate" / f"x{speed:.6g}"


def check_search_args(miss_target: float, trials: int, trials_flag: str) -> None:
    """Refuse a miss target outside [0, 1) or a trials cap under 1 (``--find-rate``,
    ``fleet --find-robots``), naming the flag."""
    if trials < 1:
        raise UsageError(f"{trials_flag}: must be >= 1, got {trials}")
    if not 0 <= miss_target < 1:
        raise UsageError(f"--miss-target: must be in [0, 1), got {miss_target:g}")


def _axis(args: argparse.Namespace, flag: str) -> str | None:
    """``sweep``'s axis flag (``--quants``, ...) where the command has it; ``run`` has none."""
    return getattr(args, flag.lstrip("-").replace("-", "_"), None)


def _check_one_configuration(args: argparse.Namespace) -> None:
    for flag in ("--quants", "--engines", "--devices", "--deadlines", "--image-policies",
                 "--frame-scales"):
        value = _axis(args, flag)
        if len(split_list(value)) > 1:
            raise UsageError(f"{flag}: --find-rate searches one configuration, got {value!r}")
    for flag, field in (("--image-policies", "image_policy"), ("--frame-scales", "frame_scale")):
        value = _axis(args, flag)
        if value:  # one value: the configuration's own
            one = split_list(value, float if field == "frame_scale" else str, flag=flag)[0]
            setattr(args, field, one)
    repeats = getattr(args, "repeats", 1)
    if repeats != 1:
        raise UsageError(f"--repeats: --find-rate runs each speed once, got {repeats}")
    if args.asap:
        raise UsageError("--asap: --find-rate varies the replay speed; drop --asap")
    if args.target_answer:
        raise UsageError("--target-answer: --find-rate measures this host only; for the "
                         "target's rate ask predict --stream --find-rate")
    check_search_args(args.miss_target, args.find_rate_trials, "--find-rate-trials")
    if not args.speed > 0:
        raise UsageError(f"--speed: must be > 0, got {args.speed:g}")


def cmd_find_rate(args: argparse.Namespace) -> int:
    """Search the highest replay speed held at ``--miss-target`` with real runs."""
    from robot_latency.cli.settings import resolve_or_usage
    from robot_latency.planner.capacity import bisect_speed
    from robot_latency.planner.replay import run_replay

    _check_one_configuration(args)
    stream = read_stream_arg(args)
    times_ns = [c.t_ns for c in stream.commands]
    if len(times_ns) < 2 or not times_ns[-1] > times_ns[0]:
        raise UsageError(f"--stream: --find-rate needs two commands at different times; "
                         f"{args.stream} has {len(times_ns)} over "
                         f"{(times_ns[-1] - times_ns[0]) / 1e6 if times_ns else 0:g} ms")
    base_rate_cmd_s = (len(times_ns) - 1) / ((times_ns[-1] - times_ns[0]) / 1e9)
    out = Path(args.out)
    if (out / "find_rate").exists():
        raise UsageError(f"--out: {out / 'find_rate'} exists; choose a new directory")
    one = {"engine": (split_list(_axis(args, "--engines")) or [args.engine])[0],
           "quant": (split_list(_axis(args, "--quants")) or [args.quant])[0],
           "device": (split_list(_axis(args, "--devices")) or [args.device])[0],
           "deadline_ms": (split_list(_axis(args, "--deadlines"), float, flag="--deadlines")
                           or [args.deadline_ms])[0]}
    trials: list[dict[str, Any]] = []

    def miss_one(speed: float) -> float:
        run_dir = trial_dir(out, speed)
        at = argparse.Namespace(**{**vars(args), "speed": speed})
        settings = settings_from_args(at, run_dir, stream, engine=one["engine"],
                                      quant=one["quant"], device=one["device"],
                                      deadline_ms=one["deadline_ms"],
                                      period_ms=max(args.period_ms, one["deadline_ms"]),
                                      label=f"x{speed:.6g}")
        config = resolve_or_usage(settings)
        labels = read_labels_arg(args, config.planning.contract)
        created = first_missing(run_dir)
        watch = LoadWatch().start()
        try:
            summary = run_replay(config, stream, speed=speed, asap=False, progress=True,
                                 labels=labels)
        except BaseException:
            remove_failed_start(created, run_dir)
            raise
        load = watch.stop()
        add_host_load(summary, load, run_dir)
        if load.warning:
            sys.stderr.write(f"WARNING: x{speed:.6g}: {load.warning}\n")
        miss, whose = run_miss_rate(run_dir)
        trials.append({"speed": speed, "rate_cmd_s": speed * base_rate_cmd_s,
                       "miss_rate": miss, "miss_of": whose,
                       "run_dir": str(run_dir.relative_to(out)),
                       "held": miss <= args.miss_target})
        sys.stderr.write(f"find-rate: x{speed:.6g} ({speed * base_rate_cmd_s:.3g} commands/s): "
                         f"{whose} miss rate {100 * miss:.2f}%\n")
        return miss

    found = bisect_speed(miss_one, args.miss_target, start=args.speed,
                         trials=args.find_rate_trials)
    doc = {"miss_target": args.miss_target, "deadline_ms": one["deadline_ms"],
           "base_rate_cmd_s": base_rate_cmd_s, "max_trials": args.find_rate_trials,
           "speed_held": found.held, "speed_failed": found.failed,
           "rate_held_cmd_s": None if found.held is None else found.held * base_rate_cmd_s,
           "rate_failed_cmd_s": None if found.failed is None else found.failed * base_rate_cmd_s,
           "miss_held": found.miss_held, "miss_failed": found.miss_failed,
           "tried": found.tried, "trials": trials}
    (out / FIND_RATE_JSON).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if getattr(args, "json", False):  # run --json; sweep has none
        emit_json(doc)
        return 0
    echo("\n".join(answer_lines(doc)) + f"\n\nruns in {out / 'find_rate'}; {FIND_RATE_JSON} in "
         f"{out}")
    return 0


def answer_lines(doc: dict[str, Any]) -> list[str]:
    """The answer in words: the speed held, the first that failed, their miss rates."""
    def at(speed: float | None, rate: float | None) -> str | None:
        return None if speed is None else f"x{speed:.4g} = {rate:.3g} commands/s"

    failed = (None if doc["speed_failed"] is None else
              at(doc["speed_failed"], doc["rate_failed_cmd_s"]) if doc["speed_held"] is not None
              else f"the slowest tried, x{doc['speed_failed']:.4g},")
    return search_answer_lines(
        f"Highest replay speed held on this host at a miss rate <= "
        f"{100 * doc['miss_target']:g}% (deadline {doc['deadline_ms']:g} ms, {doc['tried']} runs):",
        held=at(doc["speed_held"], doc["rate_held_cmd_s"]), failed=failed,
        miss_held=doc["miss_held"], miss_failed=doc["miss_failed"], rate_name="miss rate",
        what="speed", more_flag="--find-rate-trials")


def add_find_rate_args(p: argparse.ArgumentParser) -> None:
    """Add ``--find-rate``, ``--miss-target`` and ``--find-rate-trials`` to ``sweep`` and
    ``run``."""
    p.add_argument("--find-rate", action="store_true",
                   help="instead of one run or a sweep, search the highest replay speed "
                        "at which this host's measured miss rate stays <= --miss-target: "
                        "--speed first, doubling or halving, then bisection, one run per "
                        "speed under OUT/find_rate/; writes OUT/find_rate.json")
    p.add_argument("--miss-target", type=float, default=0.05,
                   help="--find-rate: the highest miss rate that holds (fraction)")
    p.add_argument("--find-rate-trials", type=int, default=6,
                   help="--find-rate: the most runs (speeds) tried")
