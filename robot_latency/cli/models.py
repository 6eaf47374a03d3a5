"""``models``: build quantization ladders, inflated and synthetic models (``streams`` is
:mod:`robot_latency.cli.streams`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from robot_latency.cli import onnx
from robot_latency.cli.common import UsageError, echo, quant_list_arg, render_table, split_list


def _show_ladder(man: Any, seconds: float) -> None:
    built = ", ".join(man.built) or "nothing (all current)"
    echo(f"{man.name}: built {built} in {seconds:.1f} s")
    rows = [[q, f"{lv.bytes / 1e6:.1f}", f"{lv.effective_bpw:.2f}", str(lv.file)]
            for q, lv in man.levels.items()]
    echo(render_table(["quant", "MB", "bits/weight", "file"], rows))


def cmd_models_build(args: argparse.Namespace) -> int:
    import time

    from robot_latency.models.bundled import bundled_model_path
    from robot_latency.models.ladder import (
        INFLATED_PREFIX,
        JSON_INFLATED_PREFIX,
        build_ladder,
        default_cache_dir,
    )

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    echo(f"model cache: {cache}")
    if args.planner == "json":
        if args.accuracy:
            raise UsageError("--accuracy: measured for --planner compact only (the JSON "
                             "planner's accuracy is in its manifest)")
        _build_inflations(bundled_model_path("planner-json"), args, cache, JSON_INFLATED_PREFIX)
        return 0
    planner = bundled_model_path("planner")
    t0 = time.perf_counter()
    man = build_ladder(planner, cache, quants=split_list(args.quants), name="planner")
    _show_ladder(man, time.perf_counter() - t0)
    if args.accuracy:
        from robot_latency.engines.greedy import plan_accuracy_by_level
        from robot_latency.models.bundled import load_manifest
        from robot_latency.models.corpus import corpus_config_from_dict, generate_corpus

        held = generate_corpus(corpus_config_from_dict(load_manifest()["corpus"])).heldout
        acc = plan_accuracy_by_level(man, held[: args.accuracy], reference="source")
        echo(f"\nplan exact-match against the shipped F32 planner, "
             f"{min(args.accuracy, len(held))} held-out commands:")
        echo(render_table(["quant", "exact match"], [[q, f"{a:.3f}"] for q, a in acc.items()]))
    _build_inflations(planner, args, cache, INFLATED_PREFIX)
    return 0


def _build_inflations(planner: Path, args: argparse.Namespace, cache: Path, prefix: str) -> None:
    """Inflate ``planner`` into each ``--inflate`` preset and build its ladder."""
    import time

    from robot_latency.models.ladder import build_ladder, ensure_inflated

    for preset in split_list(args.inflate):
        t0 = time.perf_counter()
        src = ensure_inflated(planner, preset, cache, name=prefix + preset)
        man = build_ladder(src, cache, quants=["F16", *split_list(args.inflated_quants)],
                           name=prefix + preset)
        echo("")
        _show_ladder(man, time.perf_counter() - t0)


def cmd_models_ladder(args: argparse.Namespace) -> int:
    import time

    from robot_latency.models.ladder import LadderError, build_ladder, default_cache_dir

    src = Path(args.gguf)
    if not src.is_file():
        raise LadderError(f"{src}: no such file")
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    quants = split_list(args.quants)
    if not quants:
        raise UsageError("--quants needs at least one level")
    t0 = time.perf_counter()
    man = build_ladder(src, cache, quants=quants)
    _show_ladder(man, time.perf_counter() - t0)
    echo(f"\nmanifest: {man.manifest_path}")
    echo(f"compare them: robot-latency sweep --model {src} --quants {','.join(quants)} "
         "--stream YOUR_BAG --profile YOUR_PROFILE --out runs/ladder")
    return 0


def cmd_models_synth(args: argparse.Namespace) -> int:
    from robot_latency.models.synth import SYNTH_DESCRIPTION, synth

    out = Path(args.out or f"{args.shape}.{args.quant}.synth.gguf")
    path = synth(args.shape, args.quant, out, seed=args.seed)
    echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {SYNTH_DESCRIPTION}")
    return 0


def cmd_models_mmproj(args: argparse.Namespace) -> int:
    from robot_latency.models.bundled import BundledModelError, bundled_model_path
    from robot_latency.models.mmproj import MmprojError, at_resolution, tower_shape, write_mmproj

    lm = Path(args.model)
    if not lm.is_file():
        try:
            lm = bundled_model_path(args.model)
        except BundledModelError as err:
            raise UsageError(f"--model {args.model}: no such file, nor a shipped model "
                             f"({err})") from None
    try:
        shape = tower_shape(args.tower)
    except MmprojError as err:
        raise UsageError(f"--tower: {err}") from None
    try:
        if args.image_px is not None:
            shape = at_resolution(shape, args.image_px)
    except MmprojError as err:
        raise UsageError(f"--image-px {args.image_px}: {err}") from None
    try:
        path = write_mmproj(shape, Path(args.out or f"{shape.name}.mmproj.gguf"), lm_path=lm)
    except MmprojError as err:
        raise UsageError(f"--model {lm}: {err}") from None
    echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): {shape.name} "
         f"({shape.projector}, {shape.image_size_px} px, {shape.tokens_per_tile} tokens a tile) "
         f"projecting to {lm.name}'s width; untrained weights: the times are real, the image "
         "means nothing to the model")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser("models", help="build the quantization ladder, inflated and synthetic "
                                      "models (nothing is downloaded)")
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    mp = msub.add_parser(
        "build", help="quantize the shipped planner (and its inflations) with llama.cpp",
        description="Builds the quantization ladder of the shipped planner with llama.cpp's "
                    "own quantizer, and the planner inflated function-preservingly into real "
                    "model shapes (same outputs, the real per-token cost) with its ladder. "
                    "Skips whatever is already built from the same source.")
    mp.add_argument("--planner", choices=("compact", "json"), default="compact",
                    help="compact: the action-language planner, its ladder and inflations; "
                         "json: the JSON planner's inflations only (default %(default)s)")
    quant_list_arg(mp, "--quants", default="F16,Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0,Q3_K_M,Q2_K")
    mp.add_argument("--inflate", default="qwen2.5-0.5b",
                    help="comma-separated presets to inflate into ('' for none)")
    quant_list_arg(mp, "--inflated-quants", default="Q8_0,Q4_K_M,Q4_0")
    mp.add_argument("--accuracy", type=int, default=0,
                    help="also measure plan exact-match per level on N held-out commands")
    mp.add_argument("--cache-dir", default=None, help="default: the user cache")
    mp.set_defaults(func=cmd_models_build)
    mp = msub.add_parser(
        "ladder", help="quantize your own F32/F16/BF16 GGUF into levels (llama.cpp's quantizer)",
        description="Builds the quantization levels of a GGUF into the model cache, with a "
                    "manifest; levels already built from the same file are skipped. 'sweep "
                    "--model FILE --quants ...' then compares them.")
    mp.add_argument("gguf", help="the source GGUF (F32, F16 or BF16)")
    quant_list_arg(mp, "--quants", default="Q8_0,Q4_K_M,Q4_0",
                    help="comma-separated levels (default %(default)s)")
    mp.add_argument("--cache-dir", default=None, help="default: the user cache")
    mp.set_defaults(func=cmd_models_ladder)
    mp = msub.add_parser("synth", help="a random-weight GGUF of a preset shape (timing only)")
    mp.add_argument("--shape", required=True, help="preset id, e.g. qwen2.5-0.5b")
    mp.add_argument("--quant", default="Q4_K_M")
    mp.add_argument("--out", default=None)
    mp.add_argument("--seed", type=int, default=0)
    mp.set_defaults(func=cmd_models_synth)
    mp = msub.add_parser("mmproj", help="a vision tower (mmproj GGUF) for a model: planner_node "
                                        "-p mmproj:=FILE times the frame in the loop")
    mp.add_argument("--tower", default="tiny-mlp",
                    help="clip-l14-336, siglip-b16-512, tiny-mlp or tiny-shuffle "
                         "(default %(default)s)")
    mp.add_argument("--image-px", type=int, default=None, help="the tower's tile side")
    mp.add_argument("--model", default="planner",
                    help="the language model it projects into: a GGUF or a shipped model name "
                         "(default %(default)s)")
    mp.add_argument("--out", default=None, help="default: <tower>.mmproj.gguf")
    mp.set_defaults(func=cmd_models_mmproj)
    onnx.register_models(msub)

