"""The flags of one run (``run``, ``sweep``, ``run``/``sweep --find-rate``) and what they
become: the run's settings, its stream and labels, the server check at start, the host load
beside the summary, a failed start's cleanup, the target's answer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from robot_latency.cli.common import (
    UsageError,
    cpu_list_arg,
    nonneg_int,
    positive_int,
)
from robot_latency.engines.openai_config import SERVER_APIS
from robot_latency.hostcheck.load import HostLoad
from robot_latency.models.ladder import VALID_QUANTS
from robot_latency.planner.budget import CpuBudget
from robot_latency.planner.config import (
    FRAME_POLICIES,
    HYBRID_POLICIES,
    MODES,
    ON_NEW_COMMAND,
    RUNNERS,
    VISION_ENCODERS,
    RunSettings,
)


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Turn --engine-opt KEY=VALUE pairs into typed options (int, float, bool or str)."""
    opts: dict[str, Any] = {}
    for item in args.engine_opt or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--engine-opt {item!r}: expected KEY=VALUE")
        value: Any = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        opts[key.replace("-", "_")] = value
    return opts


def read_stream_arg(args: argparse.Namespace) -> Any:
    """Return the command stream the flags name (--stream, --topic, --state-topic)."""
    from robot_latency.streams import read_stream

    return read_stream(args.stream, topic=args.topic, state_topic=args.state_topic,
                       on_bad_line="skip" if args.skip_bad_lines else "error")


def settings_from_args(args: argparse.Namespace, out: Path, stream: Any, *, engine: str,
                       quant: str | None, device: str, deadline_ms: float, period_ms: float,
                       label: str | None) -> RunSettings:
    """Return one configuration's settings from the flags (a sweep point: the axes given).

    Raises:
        UsageError: a bad value; the message names its flag.
    """
    from robot_latency.cli.settings import settings_from_flags, usage_error
    from robot_latency.planner.config import SettingsError

    try:
        cpu = CpuBudget(loop_cpus=args.loop_cpus, engine_cpus=args.engine_cpus,
                        engine_nice=args.engine_nice, loop_priority=args.loop_priority)
    except SettingsError as err:
        raise usage_error(err) from err
    return settings_from_flags(
        period_ms=period_ms, deadline_ms=deadline_ms, mode=args.mode,
        max_tokens=args.max_tokens, fallback=tuple(f.strip() for f in args.fallback.split(",")),
        publish_margin_ms=args.publish_margin_ms, on_new_command=args.on_new_command,
        log_dir=out, engine=engine, model=args.model, quant=quant, profile=args.profile,
        draft_model=args.draft, draft_k=args.draft_k or 0, target_device=device,
        mmproj=args.mmproj, image_policy=args.image_policy, frame_scale=args.frame_scale,
        vision_encoder=args.vision_encoder,
        n_threads=args.n_threads,
        n_threads_batch=args.n_threads_batch,
        n_gpu_layers=args.n_gpu_layers, engine_options=_engine_options(args), cpu=cpu,
        runner=args.runner, engine_family=args.engine_family, calibration=args.calibration,
        label=label, server_url=args.server_url, server_model=args.server_model,
        server_api=args.server_api, hybrid_policy=args.hybrid_policy,
        extra={"stream": {"path": str(args.stream), "name": stream.name,
                          "topic": stream.topic, "commands": len(stream.commands),
                          "skipped_lines": list(stream.skipped_lines)},
               "replay": {"mode": "asap" if args.asap else "recorded",
                          "speed": None if args.asap else args.speed}})


def run_config_from_args(args: argparse.Namespace, out: Path, stream: Any, *, engine: str,
                         quant: str | None, device: str, deadline_ms: float,
                         period_ms: float, label: str | None,
                         cores: frozenset[int] | None = None) -> Any:
    """Resolve one configuration's run with the builder the nodes use too."""
    from robot_latency.cli.settings import resolve_or_usage

    return resolve_or_usage(settings_from_args(
        args, out, stream, engine=engine, quant=quant, device=device, deadline_ms=deadline_ms,
        period_ms=period_ms, label=label), cores=cores)


def check_server_at_start(engine: str, server_url: str) -> None:
    """Refuse a server engine whose server does not answer now (one line naming the URL).

    The ROS node starts anyway and falls back until the server answers; an offline run has
    nothing to measure without it.
    """
    from robot_latency.planner.resolve import SERVER_ENGINES

    if engine not in SERVER_ENGINES:
        return
    if not server_url:
        raise UsageError(f"--server-url: the {engine} engine needs a server URL "
                         "(e.g. http://127.0.0.1:8000/v1)")
    from robot_latency.engines.openai_server import check_server

    check_server(server_url)


def add_host_load(summary: dict[str, Any], load: HostLoad, run_dir: Path) -> None:
    """Keep the run's host load beside its summary: ``host_load.json``, and ``host_load`` (with
    the overload warning among ``warnings``, when there is one) in the summary and
    ``summary.json``."""
    import json

    from robot_latency.stats import write_summary

    load.write(run_dir)
    summary["host_load"] = load.to_dict()
    if load.warning:
        summary["warnings"] = [*summary.get("warnings", []), load.warning]
    path = run_dir / "summary.json"
    if path.exists():
        saved = json.loads(path.read_text())
        saved["host_load"], saved["warnings"] = summary["host_load"], summary["warnings"]
        write_summary(saved, path)


def first_missing(path: Path) -> Path | None:
    """Return the outermost directory of ``path`` that does not exist yet (None: it exists)."""
    if path.exists():
        return None
    top = path
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    return top


def _recorded(out: Path) -> bool:
    """Whether the run directory holds a cycle record (a failed start leaves none)."""
    log = out / "cycles.jsonl"
    return log.is_file() and log.stat().st_size > 0


def remove_failed_start(created: Path | None, run_dir: Path) -> None:
    """Remove what a failed start created (``created``: the outermost directory the run made,
    :func:`first_missing`), unless the run recorded a cycle. A directory that existed before
    is the user's and stays."""
    import shutil

    if created is not None and created.exists() and not _recorded(run_dir):
        shutil.rmtree(created, ignore_errors=True)


def read_labels_arg(args: argparse.Namespace, contract: Any) -> Any:
    """Return the labels ``--labels`` names (else a bag directory's own ``labels.jsonl``),
    checked against the planner profile's schema; None when there are none."""
    from robot_latency.profiles.labels import default_labels_path, label_schema, read_labels

    path = args.labels or default_labels_path(args.stream)
    return None if path is None else read_labels(path, schema=label_schema(contract))


def write_target_answer(settings: RunSettings, stream: Any, run_dir: Path, *,
                        speed: float, transport_margin_ms: float | None = None) -> list[str]:
    """Run (or load from the cache) the untimed pass of ``stream`` with ``settings`` and write
    it into ``run_dir`` as ``target.json``, the report's first section; return that section's
    answer as Markdown lines. A level that cannot be predicted (no local model, an engine that
    fails) is one warning line: the run's records stay as they are."""
    from dataclasses import replace

    from robot_latency.floor.errors import FloorError
    from robot_latency.planner.config import SettingsError
    from robot_latency.planner.target_inputs import untimed_inputs, write_target_inputs
    from robot_latency.planner.untimed import UntimedError
    from robot_latency.report.rundir import load_runs
    from robot_latency.report.target import simulated_answers
    from robot_latency.report.target_answer import answer_lines

    try:
        inputs = untimed_inputs(replace(settings, log_dir=run_dir / ".untimed"), stream,
                                speed=speed)
    except (UntimedError, SettingsError, FloorError) as err:
        sys.stderr.write(f"WARNING: {run_dir}: no target answer: {err}\n")
        return []
    write_target_inputs(inputs, run_dir)
    answers = [a for a in simulated_answers(load_runs([run_dir]), [run_dir],
                                            transport_margin_ms=transport_margin_ms)
               if a is not None]
    return answer_lines(answers, curve=False) if answers else []


_PC = RunSettings()  # the defaults, written once
#: ``run`` and ``sweep`` learn their publish margin (no middleware's margin to carry it, unlike
#: the node's transport margin): a fixed 2 ms left 1.6% of the cycles late unpinned.
CLI_PUBLISH_MARGIN_MS = -1.0


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Add the flags of one run (``run`` and ``sweep``)."""
    p.add_argument("--stream", required=True, help="bag directory, .mcap or .jsonl")
    p.add_argument("--topic", default=None, help="command topic (default: the one String topic)")
    p.add_argument("--state-topic", default=None,
                   help="bag topic of robot state text for a profile's {state} (JSONL: each "
                        "line's state field)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="JSONL: skip bad lines (reported) instead of stopping")
    p.add_argument("--labels", default=None, metavar="FILE",
                   help="labels JSONL, one {\"command_id\"|\"text\", \"expected\"} per line "
                        "(a plan, possibly partial, or \"refuse\"): every plan is judged "
                        "(default: the bag directory's labels.jsonl, if any)")
    p.add_argument("--engine", default=_PC.engine,
                   help="engine name: llamacpp (default), onnx, sim (predicts --device)")
    p.add_argument("--model", default=None,
                   help="GGUF path, 'planner' (default: the bundled planner), "
                        "'planner-inflated-<preset>', or a preset for the sim engine")
    p.add_argument("--quant", default=None,
                   help="ladder level of --model (built on first use), or a preset's quant: "
                        + ", ".join(VALID_QUANTS))
    p.add_argument("--device", default=_PC.target_device,
                   help="target device datasheet (the sim engine simulates it)")
    p.add_argument("--profile", default=None,
                   help="planner profile: a shipped name (bundled-actions, instruct-json; see "
                        "'robot-latency profiles') or a YAML path (default: bundled-actions)")
    p.add_argument("--engine-opt", action="append", metavar="KEY=VALUE",
                   help="engine option, repeatable (e.g. chunk_tokens=32, efficiency=0.35)")
    p.add_argument("--engine-family", default=None,
                   help="engine family whose calibrated prediction the target gets (the sim "
                        "engine then simulates it): mlc, llamacpp-cuda, tensorrt, ...")
    p.add_argument("--calibration", default=None,
                   help="calibration file for --engine-family on --device (from 'calibrate')")
    p.add_argument("--n-threads", type=nonneg_int, default=0,
                   help="decode threads (0: one per core the engine has to itself)")
    p.add_argument("--n-threads-batch", type=nonneg_int, default=0,
                   help="prefill threads (0: every core the engine may run on)")
    p.add_argument("--n-gpu-layers", type=int, default=0,
                   help="layers offloaded to the GPU (-1: all; a CUDA build of llama.cpp)")
    p.add_argument("--draft", default=None,
                   help="draft GGUF for speculative decoding (llamacpp engine)")
    p.add_argument("--draft-k", type=positive_int, default=None,
                   help="tokens drafted per round (default: the engine's)")
    p.add_argument("--mmproj", default=None,
                   help="a vision tower (mmproj GGUF) beside the model (llamacpp engine): each "
                        "cycle puts the stream's newest camera frame in the prompt (phases "
                        "image_encode, image_prefill; docs/VISION.md)")
    p.add_argument("--image-policy", default=_PC.image_policy, choices=FRAME_POLICIES,
                   help="with --mmproj: reuse (an unchanged frame stays in the KV cache), every "
                        "(encoded each cycle) or fit (downscaled, else left out, to fit the "
                        "budget left) (default %(default)s)")
    p.add_argument("--frame-scale", type=float, default=_PC.frame_scale,
                   help="with --mmproj, reuse or every: downscale each frame by this first, in "
                        "(0, 1] (default %(default)s)")
    p.add_argument("--vision-encoder", default=_PC.vision_encoder, choices=VISION_ENCODERS,
                   help="with --mmproj: what encodes the frame: clip (llama.cpp's, libmtmd) or "
                        "onnx (the tower's ONNX export on ONNX Runtime, cached in the model "
                        "cache) (default %(default)s)")
    p.add_argument("--runner", default=_PC.runner, choices=RUNNERS)
    p.add_argument("--loop-cpus", type=cpu_list_arg, default=(),
                   help="CPUs the loop runs on, e.g. 0 or 0,2-3 (default: not pinned)")
    p.add_argument("--engine-cpus", type=cpu_list_arg, default=(),
                   help="CPUs the engine worker runs on (default: all but --loop-cpus, all "
                        "under --loop-priority)")
    p.add_argument("--engine-nice", type=int, default=_PC.cpu.engine_nice,
                   help="niceness added to the engine worker (default %(default)s)")
    p.add_argument("--loop-priority", type=int, default=_PC.cpu.loop_priority,
                   help="SCHED_FIFO priority 1-99 for the loop (needs rtprio rights); "
                        "0: normal scheduler (default)")
    p.add_argument("--deadline-ms", type=float, default=_PC.deadline_ms)
    p.add_argument("--period-ms", type=float, default=_PC.period_ms)
    p.add_argument("--publish-margin-ms", type=float, default=CLI_PUBLISH_MARGIN_MS,
                   help="time kept before the deadline for the fallback and the publish; "
                        "< 0 (default): learned from the loop's own lateness at its give-up "
                        "time (recorded in manifest.json)")
    p.add_argument("--mode", default=_PC.mode, choices=MODES)
    p.add_argument("--max-tokens", type=nonneg_int, default=_PC.max_tokens,
                   help="most tokens per cycle (default 0: the profile's)")
    p.add_argument("--fallback", default=",".join(_PC.fallback),
                   help="fallback chain, in order (default %(default)s)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed factor")
    p.add_argument("--asap", action="store_true",
                   help="ignore recorded times: one cycle per command, back to back")
    p.add_argument("--on-new-command", default=_PC.on_new_command, choices=ON_NEW_COMMAND,
                   help="event mode: a command arriving while the model works on an older one "
                        "waits (queue) or aborts it, the older recorded as superseded (preempt)"
                        "; default %(default)s")
    p.add_argument("--server-url", default="",
                   help="OpenAI-compatible server (engines openai and hybrid), e.g. "
                        "http://127.0.0.1:8000/v1")
    p.add_argument("--server-model", default="",
                   help="model name to ask the server for (default: the first it lists)")
    p.add_argument("--server-api", default=_PC.server_api, choices=SERVER_APIS,
                   help="completions: the profile's rendered prompt; chat: its messages (the "
                        "server applies its chat template)")
    p.add_argument("--target-transport-margin-ms", type=float, default=None,
                   help="with --target-answer: the target's transport margin, measured on the "
                        "robot; default: a stated one (docs/REFERENCE.md, Transport margin), "
                        "never this run's (give it to report too)")
    p.add_argument("--target-answer", action="store_true",
                   help="after the run, an untimed pass of the stream (cached by content hash) "
                        "and the loop simulated on --device: the report's first section")
    p.add_argument("--hybrid-policy", default=_PC.hybrid_policy, choices=HYBRID_POLICIES,
                   help="engine hybrid: publish the first valid plan, or the server's when it "
                        "is valid by the give-up time")
