"""``robot-latency predict --stream FILE``: the answer on the target without a timed run.

Per level (``--quants``): the untimed pass of the stream under the model and the planner profile
(run once, then cached by content hash), the loop simulated on the target
(:mod:`robot_latency.planner.target_sim`), and the deadline curve as a table and a plot.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from robot_latency.cli.common import UsageError, echo, emit_json
from robot_latency.planner.config import MODES, ON_NEW_COMMAND, RunSettings

log = logging.getLogger(__name__)

_D = RunSettings()


def level_inputs(args: argparse.Namespace, quant: str | None, stream: Any) -> Any:
    """Resolve one level, run (or load) its untimed pass; return its TargetInputs."""
    from robot_latency.cli.settings import settings_from_flags, usage_error
    from robot_latency.planner.config import SettingsError
    from robot_latency.planner.target_inputs import untimed_inputs

    settings = settings_from_flags(
        log_dir=Path("predict-stream"), engine=args.engine, model=args.model, quant=quant,
        profile=args.profile or None, mode=args.mode, deadline_ms=args.deadline_ms,
        period_ms=max(args.period_ms, args.deadline_ms) if args.mode == "periodic"
        else args.period_ms, on_new_command=args.on_new_command,
        publish_margin_ms=args.publish_margin_ms,
        transport_margin_ms=args.transport_margin_ms, target_device=args.device,
        engine_family=args.engine_family, calibration=args.calibration)
    try:
        return untimed_inputs(settings, stream, speed=args.speed)
    except SettingsError as err:
        raise usage_error(err) from err


def cmd_predict_stream(args: argparse.Namespace) -> int:
    """Print the simulated answer per level, the deadline curve, and draw it (``--plot``)."""
    from robot_latency.report.target_answer import (
        answer_lines,
        answers_from_inputs,
        plot_deadline_curve,
    )
    from robot_latency.streams import StreamError, read_stream

    if not args.speed > 0:
        raise UsageError(f"--speed: must be > 0, got {args.speed!r}")
    if not 0 <= args.miss_target < 1:
        raise UsageError(f"--miss-target: must be in [0, 1), got {args.miss_target!r}")
    try:
        stream = read_stream(args.stream)
    except (StreamError, OSError) as err:
        raise UsageError(f"--stream {args.stream}: {err}") from err
    quants = args.quants or [args.quant]
    levels = [(q or Path(args.model).name, level_inputs(args, q, stream), None) for q in quants]
    answers = answers_from_inputs(levels, draws=args.draws, miss_target=args.miss_target)
    plot = plot_deadline_curve(answers, args.plot) if args.plot else None
    if args.json:
        emit_json({"stream": str(args.stream), "plot": str(plot) if plot else None,
                   "levels": [json.loads(json.dumps(a.to_dict(), default=float))
                              for a in answers]})
        return 0
    a0 = answers[0]
    echo(f"On {a0.device_id} with {a0.engine_family}: {stream.name} ({len(stream.commands)} "
         f"commands, x{args.speed:g}), {args.mode} mode, deadline {args.deadline_ms:g} ms; "
         "the loop simulated on the target from an untimed pass (this host's speed is not in "
         "it)")
    echo("")
    for line in answer_lines(answers):
        echo(line)
    if plot is not None:
        echo(f"deadline curve: {plot}")
    return 0


def add_stream_args(p: argparse.ArgumentParser) -> None:
    """Add the ``--stream`` mode's flags to the ``predict`` parser."""
    from robot_latency.planner.target_sim import DEFAULT_DRAWS, DEFAULT_MISS_TARGET

    g = p.add_argument_group("the answer for a command stream (--stream)")
    g.add_argument("--stream", type=Path, default=None,
                   help="a rosbag2 directory, .mcap or .jsonl: simulate the planner loop on "
                        "the device for it (an untimed pass per level, cached)")
    g.add_argument("--quants", nargs="+", default=None, metavar="QUANT",
                   help="with --stream: the levels to answer for (default: --quant)")
    g.add_argument("--engine", default=_D.engine, choices=("llamacpp", "sim", "onnx"),
                   help="the engine of the untimed pass (default llamacpp)")
    g.add_argument("--profile", default="", help="planner profile (default bundled-actions)")
    g.add_argument("--deadline-ms", type=float, default=_D.deadline_ms)
    g.add_argument("--period-ms", type=float, default=_D.period_ms)
    g.add_argument("--mode", default=_D.mode, choices=MODES)
    g.add_argument("--on-new-command", default=_D.on_new_command, choices=ON_NEW_COMMAND)
    g.add_argument("--speed", type=float, default=1.0, help="replay speed of the stream")
    g.add_argument("--publish-margin-ms", type=float, default=_D.publish_margin_ms)
    g.add_argument("--transport-margin-ms", type=float, default=0.0,
                   help="the transport margin on the target (a ROS run's measured one)")
    g.add_argument("--miss-target", type=float, default=DEFAULT_MISS_TARGET,
                   help="the miss rate the smallest held deadline is stated at (fraction)")
    g.add_argument("--draws", type=int, default=DEFAULT_DRAWS,
                   help="Monte Carlo draws of the prediction's error")
    g.add_argument("--plot", type=Path, default=None, help="write the deadline curve PNG here")
