"""``robot-latency predict --stream FILE``: the answer on the target without a timed run.

Per level (``--quants``): the untimed pass of the stream under the model and the planner profile
(run once, then cached by content hash), the loop simulated on the target
(:mod:`robot_latency.planner.target_sim`), and the deadline curve as a table and a plot. With a
vision tower each cycle also pays the camera frame (:mod:`robot_latency.planner.target_image`).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from robot_latency.cli.common import (
    UsageError,
    echo,
    emit_json,
    nonneg_int,
    quant_list_arg,
    split_list,
)
from robot_latency.planner.config import MODES, ON_NEW_COMMAND, RunSettings
from robot_latency.planner.target_image import IMAGE_POLICIES

log = logging.getLogger(__name__)

_D = RunSettings()


#: The profile a preset's no-weights answer uses unless told: the chat template and JSON.
PRESET_PROFILE = "instruct-json"


def _is_preset(model: str) -> bool:
    from robot_latency.floor.shapes import PRESETS

    return not Path(model).exists() and model.strip().lower() in PRESETS


def without_weights(args: argparse.Namespace) -> bool:
    """Whether the answer is built from the labels (no untimed pass): ``--from-labels``, or a
    model preset (no GGUF to run) with the llama.cpp engine."""
    return bool(args.from_labels) or (_is_preset(args.model) and args.engine == "llamacpp")


def _shipped_file(model: str) -> str:
    """A shipped model's name (``planner``) as its GGUF file; anything else as it is."""
    from robot_latency.models.bundled import BundledModelError, bundled_model_path

    if Path(model).exists():
        return model
    try:
        return str(bundled_model_path(model))
    except BundledModelError:
        return model


def level_inputs(args: argparse.Namespace, quant: str | None, stream: Any) -> Any:
    """Resolve one level, run (or load) its untimed pass, or build it from the labels without
    weights (:func:`without_weights`); return its TargetInputs."""
    from robot_latency.cli.settings import settings_from_flags, usage_error
    from robot_latency.planner.config import SettingsError
    from robot_latency.planner.target_inputs import labelled_inputs, untimed_inputs
    from robot_latency.planner.untimed import UntimedError
    from robot_latency.profiles.profile import ProfileError
    from robot_latency.profiles.vocab import VocabError

    labelled = without_weights(args)
    profile = args.profile or (PRESET_PROFILE if labelled and _is_preset(args.model) else None)
    settings = settings_from_flags(
        log_dir=Path("predict-stream"), engine=args.engine,
        model=None if labelled else args.model, quant=None if labelled else quant,
        profile=profile, max_tokens=args.max_tokens, mode=args.mode,
        deadline_ms=args.deadline_ms,
        period_ms=max(args.period_ms, args.deadline_ms) if args.mode == "periodic"
        else args.period_ms, on_new_command=args.on_new_command,
        publish_margin_ms=args.publish_margin_ms, target_device=args.device,
        engine_family=args.engine_family, calibration=args.calibration)
    if labelled:
        if quant is not None and Path(args.model).is_file():
            raise UsageError(f"--quant {quant}: without weights, give the level's GGUF file "
                             "itself (its vocabulary and its bytes are read from it)")
        try:
            return labelled_inputs(settings, stream, model=_shipped_file(args.model),
                                   quant=quant, labels_path=args.labels, speed=args.speed)
        except (UntimedError, VocabError, ProfileError) as err:
            raise UsageError(f"--stream {args.stream}: {err}") from err
    try:
        return untimed_inputs(settings, stream, speed=args.speed)
    except SettingsError as err:
        raise usage_error(err) from err


def stream_levels(args: argparse.Namespace, quants: list[str | None],
                  stream: Any) -> list[tuple[str, Any]]:
    """Return (label, TargetInputs) per level of ``quants``. Without weights a preset's levels
    share one labelled pass (its tokenizer is the same at every level): it is built once."""
    out: list[tuple[str, Any]] = []
    shared = None
    for q in quants:
        label = q or Path(args.model).name
        if shared is not None:
            out.append((label, replace(shared, quant=q)))
            continue
        inputs = level_inputs(args, q, stream)
        if without_weights(args) and not Path(args.model).is_file():
            shared = inputs
        out.append((label, inputs))
    return out


def checked_stream(args: argparse.Namespace) -> tuple[Any, list[str | None]]:
    """Check ``--speed`` and ``--miss-target``, read ``--stream``; return it and the levels
    (``--quants``, else ``--quant``)."""
    from robot_latency.streams import StreamError, read_stream

    if not args.speed > 0:
        raise UsageError(f"--speed: must be > 0, got {args.speed!r}")
    if not 0 <= args.miss_target < 1:
        raise UsageError(f"--miss-target: must be in [0, 1), got {args.miss_target!r}")
    try:
        stream = read_stream(args.stream,
                             on_bad_line="skip" if args.skip_bad_lines else "error")
    except (StreamError, OSError) as err:
        raise UsageError(f"--stream {args.stream}: {err}") from err
    return stream, split_list(args.quants) or [args.quant]


def cmd_predict_stream(args: argparse.Namespace) -> int:
    """Print the simulated answer per level, the deadline curve, and draw it (``--plot``)."""
    from robot_latency.cli.predict_vision import image_setting
    from robot_latency.planner.capacity import CapacityError
    from robot_latency.report.target_answer import (
        answer_lines,
        answers_from_inputs,
        first_line,
        plot_deadline_curve,
    )

    image = image_setting(args)
    stream, quants = checked_stream(args)
    levels = [(label, inputs, None) for label, inputs in stream_levels(args, quants, stream)]
    try:
        answers = answers_from_inputs(levels, draws=args.draws, miss_target=args.miss_target,
                                      transport_margin_ms=args.target_transport_margin_ms,
                                      find_rate=args.find_rate, image=image)
    except CapacityError as err:
        raise UsageError(f"--find-rate: --stream {args.stream}: {err}") from err
    plot = plot_deadline_curve(answers, args.plot) if args.plot else None
    if args.json:
        emit_json({"stream": str(args.stream), "plot": str(plot) if plot else None,
                   "levels": [_finite(json.loads(json.dumps(a.to_dict(), default=float)))
                              for a in answers]})
        return 0
    a0 = answers[0]
    warn = first_line(answers)
    if warn:
        echo(warn)
    basis = "the labelled plans (no weights)" if a0.facts.get("engine") == "labels" \
        else "an untimed pass"
    echo(f"On {a0.device_id} with {a0.engine_family}: {stream.name} ({len(stream.commands)} "
         f"commands, x{args.speed:g}), {args.mode} mode, deadline {args.deadline_ms:g} ms; "
         f"the loop simulated on the target from {basis} (this host's speed is not in it)")
    echo("")
    lines = answer_lines(answers)
    for line in lines[2:] if warn else lines:  # the warning is the first line already
        echo(line)
    if plot is not None:
        echo(f"deadline curve: {plot}")
    return 0


def _finite(value: Any) -> Any:
    """``value`` with NaN (a command never planned has no e2e) as None: strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def add_stream_args(p: argparse.ArgumentParser, *, envelope: bool = False) -> None:
    """Add the ``--stream`` mode's flags to the ``predict`` parser (``envelope``: to the
    ``envelope`` parser, where ``--stream`` is required and the rate is always found)."""
    from robot_latency.planner.target_sim import DEFAULT_DRAWS, DEFAULT_MISS_TARGET

    g = p.add_argument_group("the answer for a command stream (--stream)")
    g.add_argument("--stream", type=Path, default=None, required=envelope,
                   help="a rosbag2 directory, .mcap or .jsonl: simulate the planner loop on "
                        "the device for it (an untimed pass per level, cached)")
    quant_list_arg(g, "--quants", default=None,
                   help="with --stream: the levels to answer for, space- or comma-separated "
                        "(default: --quant)")
    g.add_argument("--from-labels", action="store_true",
                   help="no untimed pass, no weights: assume the model writes each command's "
                        "labelled plan, tokenized by its own tokenizer (a GGUF's vocabulary "
                        "alone; a preset's shipped one). The default for a model preset")
    g.add_argument("--labels", default=None, metavar="FILE",
                   help="labels JSONL for --from-labels (default: the labels.jsonl beside the "
                        "stream, and a JSONL stream's own \"expected\")")
    g.add_argument("--max-tokens", type=nonneg_int, default=0,
                   help="the output budget per command (0: the profile's output.max_tokens)")
    g.add_argument("--skip-bad-lines", action="store_true",
                   help="JSONL: skip bad lines (reported) instead of stopping")
    g.add_argument("--engine", default=_D.engine, choices=("llamacpp", "sim", "onnx"),
                   help="the engine of the untimed pass (default llamacpp)")
    g.add_argument("--profile", default="",
                   help="planner profile (default bundled-actions; instruct-json for a model "
                        "preset's answer without weights)")
    g.add_argument("--deadline-ms", type=float, default=_D.deadline_ms)
    g.add_argument("--period-ms", type=float, default=_D.period_ms)
    g.add_argument("--mode", default=_D.mode, choices=MODES)
    g.add_argument("--on-new-command", default=_D.on_new_command, choices=ON_NEW_COMMAND)
    g.add_argument("--speed", type=float, default=1.0, help="replay speed of the stream")
    g.add_argument("--publish-margin-ms", type=float, default=_D.publish_margin_ms)
    g.add_argument("--target-transport-margin-ms", "--transport-margin-ms", type=float,
                   default=None, dest="target_transport_margin_ms",
                   help="the target's transport margin, measured on the robot (the node logs "
                        "it); default: a stated one (docs/REFERENCE.md, Transport margin), "
                        "never one measured on this host")
    g.add_argument("--miss-target", type=float, default=DEFAULT_MISS_TARGET,
                   help="the miss rate the smallest held deadline (and --find-rate's rate) "
                        "is stated at (fraction)")
    g.add_argument("--draws", type=int, default=DEFAULT_DRAWS,
                   help="Monte Carlo draws of the prediction's error")
    if envelope:
        return
    g.add_argument("--find-rate", action="store_true",
                   help="also find the highest command rate (the stream's arrivals scaled) at "
                        "which the predicted receiver miss rate stays at or under "
                        "--miss-target, and the first rate that failed")
    g.add_argument("--plot", type=Path, default=None, help="write the deadline curve PNG here")
    g.add_argument("--image-policy", default=None, metavar="|".join(IMAGE_POLICIES),
                   help="with a tower (--vision-tower / --mmproj): every (each command's frame "
                        "encoded, default), reuse (the image tokens reused while the frame is "
                        "unchanged; a stream without frames is one static frame) or fit (reuse, "
                        "and a new frame downscaled to the largest of --fit-scales whose "
                        "predicted cycle fits the deadline, else the command planned text-only)")
    g.add_argument("--fit-scales", type=float, nargs="+", default=None, metavar="S",
                   help="with --image-policy fit: the frame's scales to try, each in (0, 1] "
                        "(default 1 0.75 0.5 0.25)")
    g.add_argument("--max-frame-age-ms", type=float, default=None,
                   help="with a tower: a plan from a frame older than this at the receiver "
                        "counts as stale")
