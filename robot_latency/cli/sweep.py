"""``sweep``: run several configurations on one stream and compare them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from robot_latency.cli.common import UsageError, echo, quant_level, quant_list_arg, split_list
from robot_latency.cli.find_rate import add_find_rate_args
from robot_latency.cli.run_args import (
    add_host_load,
    add_run_args,
    first_missing,
    read_labels_arg,
    read_stream_arg,
    remove_failed_start,
    settings_from_args,
    write_target_answer,
)
from robot_latency.hostcheck.load import LoadWatch
from robot_latency.models.ladder import VALID_QUANTS


def cmd_sweep(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tqdm import tqdm

    from robot_latency.cli.settings import resolve_or_usage, usage_error
    from robot_latency.planner.config import SettingsError
    from robot_latency.planner.replay import run_replay
    from robot_latency.report.compare import compare_runs, to_csv, to_json, to_markdown
    from robot_latency.report.correctness import correctness_for, correctness_markdown
    from robot_latency.report.rundir import load_runs

    if args.find_rate:
        from robot_latency.cli.find_rate import cmd_find_rate

        return cmd_find_rate(args)
    stream = read_stream_arg(args)
    margin = args.target_transport_margin_ms  # the target's, for its answer (None: default)
    axes: dict[str, list[Any]] = {
        "engine": split_list(args.engines) or [args.engine],
        "quant": split_list(args.quants) or [args.quant],
        "device": split_list(args.devices) or [args.device],
        "deadline_ms": split_list(args.deadlines, float, flag="--deadlines") or [args.deadline_ms],
        "image_policy": split_list(args.image_policies) or [args.image_policy],
        "frame_scale": split_list(args.frame_scales, float, flag="--frame-scales")
        or [args.frame_scale],
    }
    points = [{"engine": e, "quant": q, "device": d, "deadline_ms": dl, "image_policy": ip,
               "frame_scale": fs}
              for e in axes["engine"] for q in axes["quant"] for d in axes["device"]
              for dl in axes["deadline_ms"] for ip in axes["image_policy"]
              for fs in axes["frame_scale"]]
    for flag, value in (("--image-policies", args.image_policies),
                        ("--frame-scales", args.frame_scales)):
        if value and not args.mmproj:
            raise UsageError(f"{flag}: only with --mmproj FILE (a vision tower)")
    varied = [k for k, v in axes.items() if len(v) > 1] or ["engine"]
    _check_sweep_axes(axes)  # every level, device and engine name, before anything
    out = Path(args.out)
    sweep_created = first_missing(out)
    # Every point's settings are built (and a GGUF's levels quantized) before any point runs:
    # a bad setting or a level that cannot be built stops the sweep before it spends a run.
    # A point is the flags' settings with the point's axes replaced, then the builder.
    first = points[0]
    base = settings_from_args(args, out, stream, engine=first["engine"], quant=first["quant"],
                              device=first["device"], deadline_ms=first["deadline_ms"],
                              period_ms=max(args.period_ms, first["deadline_ms"]), label=None)
    if args.repeats < 1:
        raise UsageError(f"--repeats: must be >= 1, got {args.repeats}")
    run_dirs, configs, configuration_of = [], [], {}
    # --repeats N: every configuration once, then every one again (round robin)
    for r, point in ((r, pt) for r in range(1, args.repeats + 1) for pt in points):
        config_label = " ".join(_axis_label(k, point[k]) for k in varied)
        label = config_label if args.repeats == 1 else f"{config_label} #{r}"
        configuration_of[label] = config_label
        run_dir = out / (config_label.replace(" ", "_").replace("/", "-")
                         + ("" if args.repeats == 1 else f"_r{r}"))
        run_dirs.append(run_dir)
        try:
            settings = replace(base, log_dir=run_dir, engine=point["engine"],
                               quant=point["quant"], target_device=point["device"],
                               deadline_ms=point["deadline_ms"],
                               period_ms=max(args.period_ms, point["deadline_ms"]), label=label,
                               image_policy=point["image_policy"],
                               frame_scale=point["frame_scale"])
        except SettingsError as err:
            raise usage_error(err) from err
        configs.append((run_dir, resolve_or_usage(settings)))
    todo = []
    for run_dir, config in configs:
        if _sweep_point_done(run_dir, args.stream):
            sys.stderr.write(f"note: {run_dir} is already done; skipped (resumed sweep)\n")
        else:
            todo.append(config)
    labels = read_labels_arg(args, configs[0][1].planning.contract)
    for config in tqdm(todo, desc="sweep", unit="config", file=sys.stderr,
                       disable=not sys.stderr.isatty() and not args.progress):
        created = first_missing(Path(config.log_dir))
        watch = LoadWatch().start()
        try:
            summary = run_replay(config, stream, speed=args.speed, asap=args.asap,
                                 progress=True, labels=labels)
        except BaseException:
            # a point that fails to start leaves nothing; the points done before it stay
            remove_failed_start(created, Path(config.log_dir))
            if sweep_created is not None and sweep_created.is_dir() \
                    and not any(sweep_created.rglob("*")):
                remove_failed_start(sweep_created, Path(config.log_dir))
            raise
        load = watch.stop()
        add_host_load(summary, load, Path(config.log_dir))
        if load.warning:
            sys.stderr.write(f"WARNING: {config.label}: {load.warning}\n")
        if args.target_answer:
            write_target_answer(config.settings, stream, Path(config.log_dir),
                                speed=args.speed, transport_margin_ms=margin)
    # Plans are compared against the highest precision (report.compare.choose_reference).
    rows = compare_runs(run_dirs, transport_margin_ms=margin)
    to_csv(rows, out / "comparison.csv")
    to_json(rows, out / "comparison.json")
    echo(to_markdown(rows))
    if args.repeats > 1:
        _echo_repeats(rows, configuration_of, [c.label for _, c in configs], out)
    runs = load_runs(run_dirs)
    _echo_vision(runs, out)
    judged = correctness_for(runs, run_dirs, labels=labels,
                             comparison=out / "comparison.json", transport_margin_ms=margin)
    if judged:
        echo("\n" + correctness_markdown(judged))
    if args.target_answer:
        from robot_latency.report.target import simulated_answers
        from robot_latency.report.target_answer import answer_lines

        answers = [a for a in simulated_answers(load_runs(run_dirs), run_dirs,
                                                transport_margin_ms=margin) if a is not None]
        if answers:
            echo("\nOn the target, the loop simulated (each run's target.json; robot-latency "
                 "report puts it first):\n\n" + "\n".join(answer_lines(answers, curve=False)))
    echo(f"\nruns and comparison.csv / comparison.json in {out}")
    return 0


def _echo_repeats(rows: list[Any], configuration_of: dict[str, str], order: list[str],
                  out: Path) -> None:
    """Write OUT/repeats.json and print the medians across runs (robot_latency.report.repeats)."""
    import json

    from robot_latency.report.repeats import repeat_lines, repeat_summary

    summary = repeat_summary(rows, configuration_of, order)
    (out / "repeats.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    echo("\n" + "\n".join(repeat_lines(summary)))


def _echo_vision(runs: list[Any], out: Path) -> None:
    """Runs whose cycles planned with a camera frame: their frame figures (vision.json too)."""
    from robot_latency.report.vision_runs import vision_markdown, vision_row

    rows = [row for run in runs if (row := vision_row(run.label, run.records)) is not None]
    if rows:
        (out / "vision.json").write_text(json.dumps([r.to_dict() for r in rows], indent=2)
                                         + "\n", encoding="utf-8")
        echo("\nThe camera frame (docs/VISION.md):\n\n" + vision_markdown(rows))


def _axis_label(axis: str, value: Any) -> str:
    """A sweep point's value in its label: ``400ms``, ``x0.5`` (a frame scale), else as is."""
    if axis == "deadline_ms":
        return f"{value:g}ms"
    if axis == "frame_scale":
        return f"x{value:g}"
    return str(value)


def _check_sweep_axes(axes: dict[str, list[Any]]) -> None:
    """Refuse a bad level, device or engine name before any point runs (one line naming it)."""
    from robot_latency.engines import ENGINES  # importing the package registers them
    from robot_latency.floor.devices import get_device
    from robot_latency.floor.errors import FloorError
    for quant in axes["quant"]:
        if quant is not None:
            quant_level(quant, flag="--quants")  # main checked them already; a caller may not
    for device in axes["device"]:
        try:
            get_device(device)
        except FloorError as err:
            raise UsageError(f"--devices: {err}") from err
    for engine in axes["engine"]:
        if engine not in ENGINES:
            raise UsageError(f"--engines: unknown engine {engine!r}; known: "
                             f"{', '.join(sorted(ENGINES))}")


def _sweep_point_done(run_dir: Path, stream: str) -> bool:
    """Whether a sweep point's directory holds a finished run of the same stream.

    A directory left by an interrupted point (not finished) is moved aside to
    ``<sweep>/.incomplete/`` (kept, never deleted), so the point runs again. A finished run of
    another stream is refused.
    """
    import json
    import time

    manifest_path = run_dir / "manifest.json"
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return False
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    if manifest.get("status") == "finished" and (run_dir / "cycles.jsonl").is_file():
        done_stream = (manifest.get("stream") or {}).get("path")
        if done_stream not in (None, str(stream)):
            raise UsageError(f"--out: {run_dir} holds a finished run of another stream "
                             f"({done_stream}); choose a new directory")
        return True
    aside = run_dir.parent / ".incomplete" / f"{run_dir.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    aside.parent.mkdir(parents=True, exist_ok=True)
    run_dir.rename(aside)
    sys.stderr.write(f"note: {run_dir} was not finished; moved to {aside}, running it again\n")
    return False


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` command to the ``robot-latency`` parser."""
    p = sub.add_parser(
        "sweep", help="run several configurations on one stream and compare them",
        description="Runs every combination of the given axes (--quants, --engines, --devices, "
                    "--deadlines) on the same stream, one run directory each under OUT, then "
                    "prints the comparison table and writes OUT/comparison.csv and .json. Every "
                    "level, device and engine is checked before any runs; rerun into the same "
                    "OUT to resume: finished points are skipped, an unfinished one is moved to "
                    "OUT/.incomplete/ and run again.")
    add_run_args(p)
    quant_list_arg(p, "--quants", default=None,
                   help="comma-separated quant levels of --model (a GGUF's ladder, built on "
                        "first use; " + ", ".join(VALID_QUANTS) + "); plans are compared "
                        "against the highest-precision one")
    p.add_argument("--engines", default=None, help="comma-separated engine names")
    p.add_argument("--devices", default=None, help="comma-separated target device ids")
    p.add_argument("--progress", action="store_true",
                   help="the sweep's bar even when stderr is not a terminal")
    p.add_argument("--deadlines", default=None, help="comma-separated deadlines (ms)")
    p.add_argument("--image-policies", default=None,
                   help="with --mmproj: comma-separated image policies (reuse,every,fit)")
    p.add_argument("--frame-scales", default=None,
                   help="with --mmproj: comma-separated frame scales in (0, 1], e.g. 1,0.5")
    p.add_argument("--out", required=True, help="sweep directory to create")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per configuration, interleaved round robin (each configuration "
                        "once, then again); N > 1: OUT/repeats.json and a table of each "
                        "figure's median across runs with its order-statistic interval")
    add_find_rate_args(p)
    p.set_defaults(func=cmd_sweep)
