"""The ``robot-latency`` command: argument parsing, then calls into the core.

Every subcommand that prints figures has a ``--json`` form with stable keys for scripts.
Errors in what the user gave (a file, a value, an id) exit with status 2 and one line that names it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency import __version__, cli_predict
from robot_latency.demo import DemoError
from robot_latency.errors import RobotLatencyError
from robot_latency.floor.devices import DEVICES, HardwareProfile, get_device, list_devices
from robot_latency.floor.errors import FloorError
from robot_latency.floor.jetson import detect_jetson
from robot_latency.floor.modelinfo import (
    ModelProfile,
    profile_manual,
    resolve_model,
)
from robot_latency.floor.predict import FloorPrediction, predict_floor, specdec_estimate
from robot_latency.floor.probe import load_or_probe_host
from robot_latency.planner.budget import CpuBudget, available_cpus, parse_cpu_list
from robot_latency.planner.config import ConfigError, PlannerConfig
from robot_latency.planner.session import RunError
from robot_latency.records import RecordError, read_records
from robot_latency.report.rundir import ReportError

try:  # the model tools need only gguf and llama-cpp-python, both installed; keep import cheap
    from robot_latency.models.ladder import LadderError as ModelBuildError
except ImportError:  # pragma: no cover
    ModelBuildError = RuntimeError  # type: ignore[misc,assignment]
from robot_latency.report.summary import summarize, write_summary
from robot_latency.streams import StreamError

log = logging.getLogger("robot_latency.cli")

#: The quantization ladder the project builds and compares (issue: models build).
QUANT_LADDER = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")


class UsageError(Exception):
    """Bad command-line input; printed as one line, exit status 2."""


def _emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Render a Markdown table (readable on a terminal, pasteable into docs)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


# --- devices / probe / detect ---------------------------------------------------------------

def _device_row(d: HardwareProfile) -> list[str]:
    flops = "-" if d.fp16_tflops is None else (
        f"{d.fp16_tflops:.3g}" + (" (derived)" if d.flops_derived else ""))
    return [d.id, d.name, f"{d.bandwidth_gbps:.4g}", f"{d.memory_bytes / 1e9:.3g}", flops,
            d.power_mode or "-"]


def cmd_devices(args: argparse.Namespace) -> int:
    devices = list_devices()
    if args.json:
        _emit_json([d.to_dict() for d in devices])
        return 0
    _out(_table(["id", "name", "GB/s", "memory GB", "FP16 TFLOPS", "power mode"],
                [_device_row(d) for d in devices]))
    _out("\n`host` is this machine, measured once by `robot-latency probe` and cached.")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    profile = load_or_probe_host(args.cache, refresh=args.refresh)
    if args.json:
        _emit_json(profile.to_dict())
        return 0
    _out(_table(["id", "name", "GB/s", "memory GB", "FP16 TFLOPS", "power mode"],
                [_device_row(profile)]))
    _out(f"source: {profile.source}")
    return 0


def cmd_detect(args: argparse.Namespace) -> int:
    info = detect_jetson(Path(args.root))
    if args.json:
        _emit_json(None if info is None else info.__dict__)
        return 0
    if info is None:
        _out(f"not a Jetson (no device-tree model under {args.root})")
        return 0
    _out(f"model string : {info.model_string}")
    _out(f"module       : {info.module or 'unknown'}")
    _out(f"power mode   : {info.power_mode or 'unknown'} (id {info.power_mode_id})")
    _out(f"profile      : {info.profile_id or 'no matching profile'}")
    return 0


# --- model / floor --------------------------------------------------------------------------

#: Group names accepted wherever a device id is: each expands to its profiles, in table order.
DEVICE_GROUPS = {
    "orin": lambda d: d.family.startswith("orin"),
    "jetson": lambda d: d.family.startswith(("orin", "thor")),
    "all": lambda d: True,
}


def _device_ids(spec: str | None, *, table: bool) -> list[str]:
    """Expand a comma-separated device list; groups (orin, jetson, all) expand in place."""
    if spec is None:
        if not table:
            raise UsageError("--device is required with --json (e.g. --device orin-agx-64gb)")
        spec = "orin"
    ids: list[str] = []
    for item in (s.strip() for s in spec.split(",")):
        if item in DEVICE_GROUPS:
            ids.extend(d.id for d in DEVICES.values() if DEVICE_GROUPS[item](d))
        elif item:
            ids.append(item)
    return list(dict.fromkeys(ids))


def _models(args: argparse.Namespace, *, table: bool) -> list[ModelProfile]:
    manual = (args.params, args.weight_bits, args.kv_bytes_per_token)
    if args.model is not None:
        if any(v is not None for v in manual):
            raise UsageError("give either --model or --params/--weight-bits/"
                             "--kv-bytes-per-token, not both")
        if args.quant is None and table and not Path(args.model).exists():
            quants: Sequence[str | None] = QUANT_LADDER
        else:
            quants = [args.quant]
        return [resolve_model(args.model, quant=q, kv_dtype=args.kv_dtype) for q in quants]
    if any(v is None for v in manual):
        raise UsageError("give --model GGUF_OR_PRESET, or all of --params, --weight-bits and "
                         "--kv-bytes-per-token")
    return [profile_manual(params=args.params, weight_bits=args.weight_bits,
                           kv_bytes_per_token=args.kv_bytes_per_token)]


def _predictions(args: argparse.Namespace, *, table: bool) -> list[FloorPrediction]:
    devices = [get_device(i, cache_path=args.cache) for i in _device_ids(args.device, table=table)]
    models = _models(args, table=table)
    draft = (resolve_model(args.draft, quant=args.draft_quant, kv_dtype=args.kv_dtype)
             if args.draft else None)
    def prompt_tokens(d: HardwareProfile) -> int | None:
        # A table skips the prefill of a device without a FLOP/s figure; --json asks for it
        # by name, so there it is an error.
        return None if table and d.peak_flops is None else args.prompt_tokens

    return [
        predict_floor(m, d, batch=args.batch, context_tokens=args.context,
                      prompt_tokens=prompt_tokens(d),
                      compute_efficiency=args.compute_efficiency, draft=draft)
        for d in devices for m in models
    ]


def cmd_floor(args: argparse.Namespace) -> int:
    preds = _predictions(args, table=not args.json)
    if args.json:
        dicts = [p.to_dict() for p in preds]
        if args.engine_family:  # the calibrated prediction beside each floor
            for d in dicts:
                d["target_prediction"] = cli_predict.prediction_for_floor(args, d)
        _emit_json(dicts[0] if len(dicts) == 1 else dicts)
        return 0
    quants = list(dict.fromkeys(p.quant or "-" for p in preds))
    devices = list(dict.fromkeys(p.device_id for p in preds))
    by_key = {(p.device_id, p.quant or "-"): p for p in preds}
    first = preds[0]
    _out(f"Decode ITL floor (ms/token; tokens/s) of {first.model_name} at batch {first.batch}, "
         f"{first.context_tokens} tokens of context. '!' = does not fit in memory.")
    rows = []
    for dev in devices:
        row = [dev, f"{by_key[(dev, quants[0])].bandwidth_gbps:.4g}"]
        for q in quants:
            p = by_key[(dev, q)]
            mark = "" if p.fits_in_memory else " !"
            row.append(f"{p.itl_floor_ms:.2f} ({p.throughput_floor_tok_s:.0f}){mark}")
        rows.append(row)
    _out(_table(["device", "GB/s", *quants], rows))
    weights = [by_key[(devices[0], q)] for q in quants]
    _out("\nweights read per step: " + ", ".join(
        f"{q} {_fmt_bytes(p.weight_bytes_per_step)}" for q, p in zip(quants, weights, strict=True)))
    if args.prompt_tokens is not None:
        _out(f"\nPrefill floor for {args.prompt_tokens} prompt tokens at compute efficiency "
             f"{args.compute_efficiency:g} (2 x params x tokens / FLOP/s):")
        _out(_table(["device", "peak TFLOPS", "prefill floor ms"],
                    [[p.device_id,
                      "-" if p.peak_flops is None else f"{p.peak_flops / 1e12:.3g}",
                      "no FLOP/s figure" if p.prefill_floor_ms is None
                      else f"{p.prefill_floor_ms:.2f}"]
                     for p in preds if p.quant == first.quant]))
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    profile = resolve_model(args.model, quant=args.quant, kv_dtype=args.kv_dtype)
    if args.json:
        _emit_json(profile.to_dict(include_tensors=args.tensors))
        return 0
    fields = [
        ("name", profile.name), ("source", profile.source), ("architecture", profile.architecture),
        ("layers", profile.n_layers), ("heads / kv heads", f"{profile.n_heads} / "
                                                             f"{profile.n_kv_heads}"),
        ("head_dim", profile.head_dim), ("hidden", profile.hidden), ("ffn", profile.ffn),
        ("context", profile.context_length), ("vocab", profile.vocab_size),
        ("tied output", profile.tied_embeddings), ("quant", profile.quant),
        ("params", f"{profile.params:,}"),
        ("weights", _fmt_bytes(profile.weight_bytes_total)),
        ("read per decode step", _fmt_bytes(profile.weight_bytes_per_step)),
        ("effective bits/weight", f"{profile.effective_bpw:.3f}"),
        (f"KV bytes/token ({profile.kv_dtype})", f"{profile.kv_bytes_per_token:,}"),
    ]
    for key, value in fields:
        _out(f"{key:<24} {value}")
    if profile.tensor_types:
        _out("bytes by tensor type    " + ", ".join(
            f"{t} {_fmt_bytes(b)}" for t, b in sorted(profile.tensor_types.items())))
    return 0


def cmd_specdec(args: argparse.Namespace) -> int:
    est = specdec_estimate(args.alpha, args.k, args.c, args.v, max_k=args.max_k)
    if args.json:
        _emit_json(est.to_dict())
        return 0
    _out(f"alpha={est.alpha:g} k={est.k} c={est.c:g} v={est.v:g}")
    _out(f"expected tokens per round : {est.expected_tokens_per_round:.3f}")
    _out(f"cost per round            : {est.cost_per_round:.3f} target passes")
    _out(f"speedup                   : {est.speedup:.3f}x")
    _out(f"best k in 1..{args.max_k:<12}: {est.best_k} ({est.best_speedup:.3f}x)")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    path = Path(args.cycles)
    summary = summarize(read_records(path))
    if args.out:
        write_summary(summary, args.out)
    if args.json or not args.out:
        _emit_json(summary)
    return 0


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


def _draft_options(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """--draft / --draft-k as engine options; refused for an engine that takes no draft."""
    if not getattr(args, "draft", None):
        if getattr(args, "draft_k", None):
            raise UsageError("--draft-k needs --draft")
        return {}
    if engine != "llamacpp":
        # A run labelled "with draft" that ran without one would mislead; refuse.
        raise UsageError(f"--draft: only the llamacpp engine takes a draft model, not {engine!r}")
    if not Path(args.draft).is_file():
        raise UsageError(f"--draft {args.draft}: no such file")
    opts: dict[str, Any] = {"draft": "model", "draft_model_path": str(Path(args.draft).resolve())}
    if args.draft_k:
        opts["draft_k"] = args.draft_k
    return opts


@dataclass(frozen=True)
class RunPoint:
    """One configuration of a run or a sweep: the axes a sweep can vary."""

    engine: str
    model: str | None
    quant: str | None
    device: str
    deadline_ms: float
    period_ms: float
    label: str | None = None


def _run_config(args: argparse.Namespace, point: RunPoint, out: Path,
                stream: Any) -> Any:
    """Build the RunConfig of one configuration from the command line and a point."""
    from robot_latency.planner.session import RunConfig

    planner = PlannerConfig(period_ms=point.period_ms, deadline_ms=point.deadline_ms,
                            mode=args.mode, max_tokens=args.max_tokens,
                            fallback=tuple(f.strip() for f in args.fallback.split(",")),
                            publish_margin_ms=args.publish_margin_ms)
    options = {**_engine_options(args), **_draft_options(args, point.engine)}
    if point.engine == "sim":
        # The simulated engine predicts the target device: it runs "on" it.
        options = {"device": point.device, "model": point.model or "qwen2.5-0.5b",
                   "quant": point.quant or "Q4_K_M", **options}
        if args.engine_family:
            options.update(engine_family=args.engine_family, calibration=args.calibration or "")
        host_device, model, quant = point.device, options["model"], options["quant"]
    else:
        model_path = _model_for_quant(point.model, point.quant)
        if model_path:
            options.setdefault("model_path", model_path)
        host_device, model, quant = "host", options.get("model_path"), None
        if model is None and point.engine == "llamacpp":
            from robot_latency.engines.llamacpp import resolve_model_path

            model = str(resolve_model_path(""))
    label = point.label or " ".join(str(x) for x in (
        point.engine, Path(str(model)).name if model else None, quant or point.quant,
        point.device, f"{point.deadline_ms:g}ms") if x)
    if options.get("draft") == "model" and not point.label:
        label += f" +draft {Path(options['draft_model_path']).name}"
    cpu = CpuBudget(loop_cpus=args.loop_cpus, engine_cpus=args.engine_cpus,
                    engine_nice=args.engine_nice, loop_priority=args.loop_priority)
    return RunConfig(planner=planner, log_dir=out, engine=point.engine, cpu=cpu,
                     engine_options=options, runner=args.runner, model=model, quant=quant,
                     host_device=host_device, target_device=point.device, label=label,
                     engine_family=args.engine_family, calibration=args.calibration,
                     extra={"stream": {"path": str(args.stream), "name": stream.name,
                                       "topic": stream.topic,
                                       "commands": len(stream.commands),
                                       "skipped_lines": list(stream.skipped_lines)},
                            "replay": {"mode": "asap" if args.asap else "recorded",
                                       "speed": None if args.asap else args.speed}})


def _model_for_quant(model: str | None, quant: str | None) -> str | None:
    """Return the GGUF to load for --model and --quant.

    A path is used as it is (with --quant: its ladder level, built on first use); the names
    'planner', 'planner-draft' and 'planner-inflated-<preset>' are the shipped models.
    """
    from robot_latency.models.ladder import INFLATED_PREFIX, ladder_model_path

    named = model in (None, "", "planner", "planner-draft") or (
        model is not None and model.startswith(INFLATED_PREFIX))
    if quant is None and not named:
        return model
    if quant is None and model in (None, "", "planner", "planner-draft"):
        from robot_latency.models.bundled import bundled_model_path

        return str(bundled_model_path(model or "planner"))
    return str(ladder_model_path(model, quant or "F16"))


def _read_stream(args: argparse.Namespace) -> Any:
    from robot_latency.streams import read_stream

    return read_stream(args.stream, topic=args.topic,
                       on_bad_line="skip" if args.skip_bad_lines else "error")


def _print_summary(args: argparse.Namespace, out: Path, summary: dict[str, Any]) -> None:
    ci = summary["deadline_miss_rate_ci95"]
    _out(f"run {out}: {summary['cycles']} cycles"
         + (" (as fast as possible: no arrival process, no queueing measured)"
            if args.asap else f" (recorded pace x{args.speed:g})"))
    if summary["cycles"]:
        _out(f"deadline misses {summary['deadline_misses']} "
             f"({100 * summary['deadline_miss_rate']:.2f}%, 95% CI "
             f"{100 * ci[0]:.2f}-{100 * ci[1]:.2f}%), fallbacks {summary['fallbacks']}")
    rows = [[m, str(summary[m]["n"])] + ["-" if summary[m][k] is None else f"{summary[m][k]:.2f}"
                                         for k in ("p50", "p90", "p99", "max")]
            for m in ("ttft_ms", "itl_ms", "e2e_ms", "cycle_ms", "overshoot_ms")]
    _out(_table(["metric", "n", "p50", "p90", "p99", "max"], rows))
    thin = [w.split(":")[0] for w in summary["warnings"] if "p99 from only" in w]
    if thin:
        _out(f"note: p99 rests on fewer than 1000 samples for {', '.join(thin)}")


def cmd_run(args: argparse.Namespace) -> int:
    from robot_latency.planner.replay import run_replay

    stream = _read_stream(args)
    point = RunPoint(engine=args.engine, model=args.model, quant=args.quant, device=args.device,
                     deadline_ms=args.deadline_ms, period_ms=args.period_ms, label=args.label)
    out = Path(args.out)
    summary = run_replay(_run_config(args, point, out, stream), stream, speed=args.speed,
                         asap=args.asap, handle_signals=True)
    if args.json:
        _emit_json(summary)
    else:
        _print_summary(args, out, summary)
    if summary.get("interrupted"):
        # Like a shell's 128 + SIGINT: the run stopped early, though its files are complete.
        sys.stderr.write(f"robot-latency run: interrupted after {summary['cycles']} cycles; "
                         f"{out} is complete up to there\n")
        return 130
    return 0


def _split(text: str | None, cast: Any = str) -> list[Any]:
    return [cast(x.strip()) for x in text.split(",") if x.strip()] if text else []


def cmd_sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from robot_latency.planner.replay import run_replay
    from robot_latency.report.compare import compare_runs, to_csv, to_json, to_markdown

    stream = _read_stream(args)
    axes = {
        "engine": _split(args.engines) or [args.engine],
        "quant": _split(args.quants) or [args.quant],
        "device": _split(args.devices) or [args.device],
        "deadline_ms": _split(args.deadlines, float) or [args.deadline_ms],
    }
    points = [RunPoint(engine=e, model=args.model, quant=q, device=d, deadline_ms=dl,
                       period_ms=max(args.period_ms, dl))
              for e in axes["engine"] for q in axes["quant"] for d in axes["device"]
              for dl in axes["deadline_ms"]]
    varied = [k for k, v in axes.items() if len(v) > 1] or ["engine"]
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} exists and is not empty; choose a new directory")
    run_dirs = []
    for point in tqdm(points, desc="sweep", unit="config", file=sys.stderr,
                      disable=not sys.stderr.isatty() and not args.progress):
        label = " ".join(f"{getattr(point, k):g}ms" if k == "deadline_ms"
                         else str(getattr(point, k)) for k in varied)
        point = RunPoint(**{**point.__dict__, "label": label})
        run_dir = out / label.replace(" ", "_").replace("/", "-")
        run_replay(_run_config(args, point, run_dir, stream), stream, speed=args.speed,
                   asap=args.asap)
        run_dirs.append(run_dir)
    rows = compare_runs(run_dirs)
    to_csv(rows, out / "comparison.csv")
    to_json(rows, out / "comparison.json")
    _out(to_markdown(rows))
    _out(f"\n{len(run_dirs)} runs in {out}; comparison.csv and comparison.json written. "
         f"Plots: robot-latency report {out}/*/")
    return 0


def cmd_streams_make(args: argparse.Namespace) -> int:
    from robot_latency.models.corpus import CorpusConfig, generate_corpus
    from robot_latency.streams import SHIPPED_STREAMS, make_shipped_streams, make_stream_file
    from robot_latency.streams.shipped import pick_texts

    # Held-out commands: the planner never saw them in training.
    texts = [c.text for c in generate_corpus(CorpusConfig()).heldout]
    out = Path(args.out)
    if args.shipped:
        for path in make_shipped_streams(out, texts, storage=args.storage):
            _out(f"wrote {path}")
        names = ", ".join(f"{s.name} ({s.process}, {s.rate_hz:g} Hz, {s.n_commands})"
                          for s in SHIPPED_STREAMS)
        _out(f"streams: {names}")
        return 0
    if args.process is None:
        raise UsageError("give --process periodic|poisson|bursty (or --shipped)")
    path = make_stream_file(out, pick_texts(texts, args.count, seed=args.seed),
                            process=args.process, rate_hz=args.rate_hz, seed=args.seed,
                            storage=args.storage, topic=args.topic)
    _out(f"wrote {path}: {args.count} commands, {args.process} at {args.rate_hz:g} Hz")
    return 0


def _show_ladder(man: Any, seconds: float) -> None:
    built = ", ".join(man.built) or "nothing (all current)"
    _out(f"{man.name}: built {built} in {seconds:.1f} s")
    rows = [[q, f"{lv.bytes / 1e6:.1f}", f"{lv.effective_bpw:.2f}", str(lv.file)]
            for q, lv in man.levels.items()]
    _out(_table(["quant", "MB", "bits/weight", "file"], rows))


def cmd_models_build(args: argparse.Namespace) -> int:
    import time

    from robot_latency.models.bundled import bundled_model_path
    from robot_latency.models.ladder import (
        INFLATED_PREFIX,
        build_ladder,
        default_cache_dir,
        ensure_inflated,
        plan_accuracy_by_level,
    )

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    _out(f"model cache: {cache}")
    planner = bundled_model_path("planner")
    t0 = time.perf_counter()
    man = build_ladder(planner, cache, quants=_split(args.quants), name="planner")
    _show_ladder(man, time.perf_counter() - t0)
    if args.accuracy:
        from robot_latency.models.bundled import load_manifest
        from robot_latency.models.corpus import corpus_config_from_dict, generate_corpus

        held = generate_corpus(corpus_config_from_dict(load_manifest()["corpus"])).heldout
        acc = plan_accuracy_by_level(man, held[: args.accuracy], reference="source")
        _out(f"\nplan exact-match against the shipped F32 planner, "
             f"{min(args.accuracy, len(held))} held-out commands:")
        _out(_table(["quant", "exact match"], [[q, f"{a:.3f}"] for q, a in acc.items()]))
    for preset in _split(args.inflate):
        t0 = time.perf_counter()
        src = ensure_inflated(planner, preset, cache)
        man = build_ladder(src, cache, quants=["F16", *_split(args.inflated_quants)],
                           name=INFLATED_PREFIX + preset)
        _out("")
        _show_ladder(man, time.perf_counter() - t0)
    return 0


def cmd_models_synth(args: argparse.Namespace) -> int:
    from robot_latency.models.synth import SYNTH_DESCRIPTION, synth

    out = Path(args.out or f"{args.shape}.{args.quant}.synth.gguf")
    path = synth(args.shape, args.quant, out, seed=args.seed)
    _out(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {SYNTH_DESCRIPTION}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import time

    from robot_latency.demo import DemoConfig, run_demo
    from robot_latency.models.bundled import bundled_model_path
    from robot_latency.models.ladder import (
        INFLATED_PREFIX,
        build_ladder,
        default_cache_dir,
        ensure_inflated,
    )
    from robot_latency.report.compare import compare_runs, to_markdown
    from robot_latency.streams import SHIPPED_DIR

    t_start = time.perf_counter()
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not empty; remove it or pass --out")
    quants = _split(args.quants)
    if len(quants) < 1:
        raise UsageError("--quants needs at least one level")
    cache = default_cache_dir()
    _out(f"[1/3] models: the shipped planner inflated into the {args.inflate} shape, "
         f"levels {', '.join(quants)} (cache {cache})")
    planner = bundled_model_path("planner")
    src = ensure_inflated(planner, args.inflate, cache)
    name = INFLATED_PREFIX + args.inflate
    man = build_ladder(src, cache, quants=quants, name=name)
    _show_ladder(man, time.perf_counter() - t_start)
    stream = Path(args.stream) if args.stream else SHIPPED_DIR / "steady_operator"
    _out(f"\n[2/3] bandwidth floor of these files on this host and the Orin modules "
         f"(ms per token at {args.context} tokens of context):")
    host = load_or_probe_host()
    devices = [host, *(d for d in DEVICES.values() if d.family.startswith("orin"))]
    models = {q: resolve_model(str(man.path(q))) for q in quants}
    rows = []
    for d in devices:
        row = [d.id, f"{d.bandwidth_gbps:.4g}"]
        for q in quants:
            p = predict_floor(models[q], d, context_tokens=args.context)
            row.append(f"{p.itl_floor_ms:.2f}")
        rows.append(row)
    _out(_table(["device", "GB/s", *quants], rows))
    _out(f"\n[3/3] replaying {stream} (x{args.speed:g}) through planner_node and bag_replayer "
         f"over ROS 2 (Fast DDS), deadline {args.deadline_ms:g} ms, one configuration per level")
    cpus = sorted(available_cpus())
    # The documented budget: the loop alone on the first core, the engine on the others.
    budget = {"loop_cpus": str(cpus[0])} if len(cpus) > 1 else {}
    configs = [DemoConfig(label=q, params={
        "engine": "llamacpp", "model": str(man.path(q)), "device_profile": args.device,
        "mode": args.mode, "deadline_ms": float(args.deadline_ms),
        "period_ms": float(max(args.period_ms, args.deadline_ms)), **budget,
        **({"n_threads": args.n_threads} if args.n_threads else {})}) for q in quants]
    runs, report = run_demo(configs, stream=stream, out_dir=out, speed=args.speed)
    _out("")
    _out(to_markdown(compare_runs(runs)))
    _out(f"\nreport with plots: {report}")
    _out(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from robot_latency.report.compare import compare_runs, to_markdown
    from robot_latency.report.markdown import write_report

    out = Path(args.out) if args.out else Path(args.runs[0]).parent / "report"
    report = write_report(args.runs, out, reference=args.reference)
    _out(to_markdown(compare_runs(args.runs, reference=args.reference)))
    _out(f"\nreport: {report}")
    return 0


# --- parser ---------------------------------------------------------------------------------

def _cpu_list(text: str) -> tuple[int, ...]:
    try:
        return parse_cpu_list(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from err
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _count(text: str) -> int:
    """Parse a count that may be written 494e6 or 0.5e9."""
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from err
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return round(value)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream", required=True, help="bag directory, .mcap or .jsonl")
    p.add_argument("--topic", default=None, help="command topic (default: the one String topic)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="JSONL: skip bad lines (reported) instead of stopping")
    p.add_argument("--engine", default="llamacpp",
                   help="engine name: llamacpp (default), onnx, sim (predicts --device)")
    p.add_argument("--model", default=None,
                   help="GGUF path, 'planner' (default: the bundled planner), "
                        "'planner-inflated-<preset>', or a preset for the sim engine")
    p.add_argument("--quant", default=None,
                   help="ladder level of --model (built on first use), or a preset's quant")
    p.add_argument("--device", default="orin-nano-8gb",
                   help="target device profile (the sim engine simulates it)")
    p.add_argument("--engine-opt", action="append", metavar="KEY=VALUE",
                   help="engine option, repeatable (e.g. n_threads=1, efficiency=0.35)")
    p.add_argument("--engine-family", default=None,
                   help="engine family whose calibrated prediction the target gets (the sim "
                        "engine then simulates it): mlc, llamacpp-cuda, tensorrt, ...")
    p.add_argument("--calibration", default=None,
                   help="calibration file for --engine-family on --device (from 'calibrate')")
    p.add_argument("--draft", default=None,
                   help="draft GGUF for speculative decoding (llamacpp engine)")
    p.add_argument("--draft-k", type=_positive_int, default=None,
                   help="tokens drafted per round (default: the engine's)")
    p.add_argument("--runner", default="process", choices=("process", "inline"))
    p.add_argument("--loop-cpus", type=_cpu_list, default=(),
                   help="CPUs the loop runs on, e.g. 0 or 0,2-3 (default: not pinned)")
    p.add_argument("--engine-cpus", type=_cpu_list, default=(),
                   help="CPUs the engine worker runs on (default: all but --loop-cpus)")
    p.add_argument("--engine-nice", type=int, default=CpuBudget().engine_nice,
                   help="niceness added to the engine worker (default %(default)s)")
    p.add_argument("--loop-priority", type=int, default=0,
                   help="SCHED_FIFO priority 1-99 for the loop (needs rtprio rights); "
                        "0: normal scheduler (default)")
    p.add_argument("--deadline-ms", type=float, default=150.0)
    p.add_argument("--period-ms", type=float, default=200.0)
    p.add_argument("--publish-margin-ms", type=float, default=2.0)
    p.add_argument("--mode", default="periodic", choices=("periodic", "event"))
    p.add_argument("--max-tokens", type=_positive_int, default=24)
    p.add_argument("--fallback", default="rule,hold,stop", help="fallback chain, in order")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed factor")
    p.add_argument("--asap", action="store_true",
                   help="ignore recorded times: one cycle per command, back to back")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``robot-latency`` command."""
    parser = argparse.ArgumentParser(
        prog="robot-latency",
        description="Latency testbed for language-model planners on edge robots.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("devices", help="list the device profiles (bandwidth, memory, FLOP/s)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)

    p = sub.add_parser("probe", help="measure this host (bandwidth, matmul FLOP/s); cached")
    p.add_argument("--refresh", action="store_true", help="measure again, ignoring the cache")
    p.add_argument("--cache", type=Path, default=None, help="cache file (default: user cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("detect", help="detect a Jetson module and its power mode")
    p.add_argument("--root", default="/", help="filesystem root to read (default: /)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_detect)

    p = sub.add_parser("model", help="profile a GGUF file or a shape preset")
    p.add_argument("model", help="GGUF path or preset id (e.g. qwen2.5-0.5b)")
    p.add_argument("--quant", default=None, help="quant type for a preset (default Q4_K_M)")
    p.add_argument("--kv-dtype", default="f16", help="KV cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("--tensors", action="store_true", help="with --json: every tensor")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_model)

    p = sub.add_parser(
        "floor", help="bandwidth-floor predictions of a model on devices",
        description="Without --device, a table over the Jetson Orin modules; without --quant "
                    "for a preset, over the quantization ladder. --json prints one object "
                    "(a list when several devices or quants are asked for).")
    p.add_argument("--device", default=None,
                   help="device ids, comma-separated; 'host' (probed), 'auto' (detected), "
                        "or a group: 'orin' (default for tables), 'jetson', 'all'")
    p.add_argument("--model", default=None, help="GGUF path or preset id")
    p.add_argument("--quant", default=None, help="quant type for a preset")
    p.add_argument("--params", type=_count, default=None, help="manual form: parameters")
    p.add_argument("--weight-bits", type=float, default=None, help="manual form: bits/weight")
    p.add_argument("--kv-bytes-per-token", type=_nonneg_int, default=None,
                   help="manual form: KV bytes per token")
    p.add_argument("--kv-dtype", default="f16", help="KV cache type (f16, f32, q8_0, q4_0)")
    p.add_argument("--context", type=_nonneg_int, default=0,
                   help="tokens in the KV cache per sequence (default 0: weights only)")
    p.add_argument("--batch", type=_positive_int, default=1)
    p.add_argument("--prompt-tokens", type=_nonneg_int, default=None,
                   help="also predict the prefill floor for this prompt length")
    p.add_argument("--compute-efficiency", type=float, default=1.0,
                   help="fraction of peak FLOP/s a prefill reaches (default 1.0: the floor)")
    p.add_argument("--draft", default=None, help="draft model (GGUF or preset) for memory fit")
    p.add_argument("--draft-quant", default=None, help="quant type for a draft preset")
    p.add_argument("--cache", type=Path, default=None, help="host probe cache file")
    p.add_argument("--engine-family", default=None,
                   help="with --json: add that family's calibrated prediction (see 'predict')")
    p.add_argument("--calibration", default=None, help="calibration file for --engine-family")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_floor)

    p = sub.add_parser("specdec", help="expected speedup of speculative decoding")
    p.add_argument("--alpha", type=float, required=True, help="per-token acceptance rate")
    p.add_argument("-k", type=_positive_int, required=True, help="tokens drafted per round")
    p.add_argument("-c", type=float, required=True, help="draft cost per token / target cost")
    p.add_argument("-v", type=float, default=0.0, help="extra verify cost per drafted token")
    p.add_argument("--max-k", type=_positive_int, default=16, help="search best k in 1..N")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_specdec)

    p = sub.add_parser(
        "run", help="replay a command stream through the planner; write a run directory",
        description="Replays a rosbag2 bag, a bare .mcap or a JSONL stream through the "
                    "deadline-enforced planner at the recorded pace (or --asap) and writes "
                    "OUT/cycles.jsonl, OUT/summary.json and OUT/manifest.json.")
    _add_run_args(p)
    p.add_argument("--label", default=None, help="name of this configuration in comparisons")
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--json", action="store_true", help="print summary.json")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "sweep", help="run several configurations on one stream and compare them",
        description="Runs every combination of the given axes (--quants, --engines, --devices, "
                    "--deadlines) on the same stream, one run directory each under OUT, then "
                    "prints the comparison table and writes OUT/comparison.csv and .json.")
    _add_run_args(p)
    p.add_argument("--quants", default=None, help="comma-separated quant types")
    p.add_argument("--engines", default=None, help="comma-separated engine names")
    p.add_argument("--devices", default=None, help="comma-separated target device ids")
    p.add_argument("--deadlines", default=None, help="comma-separated deadlines (ms)")
    p.add_argument("--progress", action="store_true", help="progress bar even without a tty")
    p.add_argument("--out", required=True, help="sweep directory to create")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("models", help="build the quantization ladder, inflated and synthetic "
                                      "models (nothing is downloaded)")
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    mp = msub.add_parser(
        "build", help="quantize the shipped planner (and its inflations) with llama.cpp",
        description="Builds the quantization ladder of the shipped planner with llama.cpp's "
                    "own quantizer, and the planner inflated function-preservingly into real "
                    "model shapes (same outputs, the real per-token cost) with its ladder. "
                    "Skips whatever is already built from the same source.")
    mp.add_argument("--quants", default="F16,Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0,Q3_K_M,Q2_K")
    mp.add_argument("--inflate", default="qwen2.5-0.5b",
                    help="comma-separated presets to inflate into ('' for none)")
    mp.add_argument("--inflated-quants", default="Q8_0,Q4_K_M,Q4_0")
    mp.add_argument("--accuracy", type=int, default=0,
                    help="also measure plan exact-match per level on N held-out commands")
    mp.add_argument("--cache-dir", default=None, help="default: the user cache")
    mp.set_defaults(func=cmd_models_build)
    mp = msub.add_parser("synth", help="a random-weight GGUF of a preset shape (timing only)")
    mp.add_argument("--shape", required=True, help="preset id, e.g. qwen2.5-0.5b")
    mp.add_argument("--quant", default="Q4_K_M")
    mp.add_argument("--out", default=None)
    mp.add_argument("--seed", type=int, default=0)
    mp.set_defaults(func=cmd_models_synth)

    p = sub.add_parser(
        "demo", help="the main job: quant levels of the inflated planner through ROS 2",
        description="Builds the inflated planner's quant levels (nothing downloaded), prints "
                    "their bandwidth floors on this host and the Orin modules, replays a "
                    "bundled command stream through the planner_node and bag_replayer "
                    "processes over ROS 2 for each level, then prints the comparison and "
                    "writes the report with plots.")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--quants", default="Q8_0,Q4_K_M,Q4_0")
    p.add_argument("--inflate", default="qwen2.5-0.5b", help="preset shape to inflate into")
    p.add_argument("--stream", default=None, help="default: the shipped steady_operator stream")
    p.add_argument("--speed", type=float, default=3.0)
    p.add_argument("--mode", default="event", choices=("periodic", "event"))
    # 400 ms sits between the levels' typical plan times here (one engine thread): the demo
    # shows how the miss rate moves with the quant level, not a row of zeros or of ones.
    p.add_argument("--deadline-ms", type=float, default=400.0)
    p.add_argument("--period-ms", type=float, default=500.0)
    p.add_argument("--device", default="orin-nano-8gb", help="target device for predictions")
    p.add_argument("--n-threads", type=int, default=0, help="engine threads (0: cores - 1)")
    p.add_argument("--context", type=_nonneg_int, default=32,
                   help="context tokens for the floor table")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("streams", help="command streams: make rosbag2 streams from the corpus")
    ssub = p.add_subparsers(dest="streams_command", required=True, metavar="ACTION")
    sp = ssub.add_parser("make", help="write a rosbag2 (MCAP) command stream",
                         description="Writes operator commands (held-out commands of the "
                                     "demo corpus, short and long mixed) with an arrival "
                                     "process as a rosbag2 bag directory.")
    sp.add_argument("--out", required=True, help="bag directory to create (--shipped: parent)")
    sp.add_argument("--shipped", action="store_true", help="the streams the project ships")
    sp.add_argument("--process", choices=("periodic", "poisson", "bursty"), default=None)
    sp.add_argument("--rate-hz", type=float, default=0.5, help="mean commands per second")
    sp.add_argument("--count", type=_positive_int, default=60)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    sp.add_argument("--topic", default="/planner/command")
    sp.set_defaults(func=cmd_streams_make)

    p = sub.add_parser("report", help="compare run directories; write plots and report.md")
    p.add_argument("runs", nargs="+", help="run directories (from robot-latency run)")
    p.add_argument("--out", default=None, help="report directory (default: RUN0/../report)")
    p.add_argument("--reference", default=None,
                   help="label of the run plans are compared against (default: the first)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("summarize", help="summarise a cycles.jsonl into summary.json")
    p.add_argument("cycles", help="path to a cycles.jsonl")
    p.add_argument("--out", default=None, help="write summary.json here")
    p.add_argument("--json", action="store_true", help="also print it")
    p.set_defaults(func=cmd_summarize)
    cli_predict.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except (UsageError, FloorError, RecordError, ConfigError, RunError, StreamError,
            ReportError, ModelBuildError, DemoError, RobotLatencyError) as err:
        sys.stderr.write(f"robot-latency {args.command}: error: {err}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
