"""``robot-latency envelope``: every level in every power mode on the target, and which to put on.

The levels' inputs come as ``predict --stream`` builds them (an untimed pass per level, cached, or
the labels without weights); each level is simulated in each mode of the device's module
(``--power-modes all``) with the capacity search, and J per plan and goodput beside
(:mod:`robot_latency.report.envelope`).
"""

from __future__ import annotations

import argparse
import json

from robot_latency.cli.common import UsageError, echo, emit_json, split_list
from robot_latency.cli.predict_modes import add_power_mode_args
from robot_latency.cli.predict_stream import (
    _finite,
    add_stream_args,
    checked_stream,
    stream_levels,
)
from robot_latency.floor.calibration import ENGINE_FAMILIES
from robot_latency.planner.config import DEFAULT_TARGET_DEVICE

__all__ = ["register"]


def cmd_envelope(args: argparse.Namespace) -> int:
    """Print the envelope per module: the table, the pick, what each figure rests on."""
    from robot_latency.planner.capacity import CapacityError
    from robot_latency.report.envelope import envelope, envelope_lines
    from robot_latency.report.target_answer import first_line

    devices = split_list(args.device)
    if not devices:
        raise UsageError("--device: give at least one device id")
    if args.calibration and args.power_modes:
        raise UsageError("--power-modes predicts from the published table; a --calibration "
                         "file is fitted for one device")
    args.device = devices[0]  # the levels' inputs name one; each mode replaces it
    stream, quants = checked_stream(args)
    levels = stream_levels(args, quants, stream)
    try:
        modules = envelope(levels, devices, all_modes=args.power_modes == "all",
                           miss_target=args.miss_target, draws=args.draws,
                           transport_margin_ms=args.target_transport_margin_ms)
    except CapacityError as err:
        raise UsageError(f"--stream {args.stream}: {err}") from err
    if args.json:
        emit_json(_finite(json.loads(json.dumps({
            "stream": str(args.stream), "speed": args.speed, "mode": args.mode,
            "deadline_ms": args.deadline_ms, "miss_target": args.miss_target,
            "modules": [m.to_dict() for m in modules]}, default=float))))
        return 0
    answers = [c.answer for c in modules[0].cells]
    warn = first_line(answers[:len(levels)])
    if warn:
        echo(warn)
    first = levels[0][1]
    basis = (first.assumption and "the labelled plans (no weights)") or "an untimed pass"
    echo(f"Operating envelope with {answers[0].engine_family}: {stream.name} "
         f"({len(stream.commands)} commands, x{args.speed:g}), {args.mode} mode, deadline "
         f"{args.deadline_ms:g} ms, miss target {100 * args.miss_target:g}%; the loop simulated "
         f"in each power mode from {basis} (this host's speed is not in it)")
    echo("")
    for line in envelope_lines(modules, miss_target=args.miss_target):
        echo(line)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``envelope`` command to the top-level parser."""
    p = sub.add_parser(
        "envelope", help="every level in every power mode on the target: miss rate, deadline "
                         "and rate held, J per plan, goodput, and which to put on the robot",
        description="Per level x power mode, the loop simulated on the target for a command "
                    "stream (as predict --stream), the highest command rate held, the "
                    "predicted J per plan and the goodput; then the level and mode to put on "
                    "the robot: meets --miss-target, then the least energy, ties to the "
                    "smaller file.")
    p.add_argument("--device", default=DEFAULT_TARGET_DEVICE,
                   help="device datasheet id(s), comma-separated (one module each)")
    p.add_argument("--model", default="qwen2.5-0.5b", help="GGUF path or preset id")
    p.add_argument("--quant", default=None,
                   help="one level (default for --quants): of a preset, its quant; of a GGUF "
                        "file, its ladder level")
    p.add_argument("--engine-family", default="llamacpp-cuda",
                   help=f"one of: {', '.join(ENGINE_FAMILIES)}")
    p.add_argument("--calibration", default=None,
                   help="calibration file from 'calibrate' (one device; not with "
                        "--power-modes)")
    p.add_argument("--json", action="store_true")
    add_stream_args(p, envelope=True)
    add_power_mode_args(p)
    p.set_defaults(func=cmd_envelope)
