"""The camera frame in the planner's prompt: TTFT per cycle with a new frame, a reused one, none.

The llama.cpp engine runs with a vision tower (an mmproj written for the language model's width,
untrained: the times are real, the image means nothing) and plans ``--commands`` held-out
commands of the corpus three ways, interleaved, ``--repeats`` times:

- ``text``: no frame;
- ``every``: a new frame each cycle (a rendered table scene, its own key): each pays the encode
  and the image prefill (phases ``image_encode``, ``image_prefill``);
- ``reuse``: one frame for the whole block: the first cycle pays, the rest find it in the KV
  cache (the engine's frame cache, ``robot_latency/engines/llama_image.py``);
- ``fit`` (with ``--fit-budget-ms``): a new frame each cycle, as ``every``, sent at the scale
  the loop's ``fit`` policy picks for that budget (``robot_latency/planner/frame_policy.py``,
  learning the costs as the cycles run), or left out (text-only).

Per policy: TTFT (the generation's start to its first token, on the engine's clock) and e2e p50
over all cycles of all repeats, the encode and image prefill p50 over the cycles that paid them,
and how many did. The language model is the shipped JSON planner (full vocabulary, its own
profile) unless ``--lm`` names another.

    python bench/vision_loop.py --out vision_loop.json
    python bench/vision_loop.py --tower siglip-b16-512 --frame-px 1280x960 --commands 8 \
        --fit-budget-ms 3000
    python bench/vision_loop.py --smoke --out /tmp/vision_loop.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchio import emit_result

from robot_latency.engines.base import FrameImage, GenerationRequest
from robot_latency.engines.llamacpp import LlamaCppEngine
from robot_latency.engines.llamacpp_config import LlamaCppConfig
from robot_latency.models import bundled
from robot_latency.models.corpus import CorpusConfig, generate_corpus
from robot_latency.models.mmproj import at_resolution, tower_shape, write_mmproj
from robot_latency.planner.frame_policy import FramePolicy
from robot_latency.profiles.profile import load_planning
from robot_latency.streams.scene import render_scene

log = logging.getLogger("vision_loop")

POLICIES = ("text", "every", "reuse", "fit")


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _lm(choice: str, cache: Path) -> tuple[Path, str]:
    """(GGUF, profile) of ``--lm``: ``json`` (the shipped JSON planner), ``planner`` (the
    action planner) or a GGUF path (with ``--profile``)."""
    if choice == "json":
        return bundled.bundled_json_path(cache_dir=cache), "bundled-json"
    if choice == "planner":
        return bundled.bundled_model_path("planner"), "bundled-actions"
    path = Path(choice)
    if not path.is_file():
        raise SystemExit(f"--lm {choice}: no such file")
    return path, ""


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    lm, profile = _lm(args.lm, work)
    planning = load_planning(args.profile or profile or None)
    shape = tower_shape(args.tower)
    if args.image_px:
        shape = at_resolution(shape, args.image_px)
    mmproj = write_mmproj(shape, work / f"{shape.name}.gguf", lm_path=lm)
    w, h = (int(x) for x in args.frame_px.lower().split("x"))
    frames = [render_scene(i, width=w, height=h) for i in range(args.commands)]
    commands = [c.text for c in generate_corpus(CorpusConfig()).heldout[:args.commands]]
    engine = LlamaCppEngine(LlamaCppConfig(
        model_path=str(lm), n_threads=args.threads, n_ctx=args.n_ctx,
        warm_prefix=planning.prefix, max_suffix_tokens=64, max_new_tokens=planning.max_tokens,
        mmproj_path=str(mmproj)))
    policies = POLICIES if args.fit_budget_ms > 0 else POLICIES[:3]
    cycles: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    fit = FramePolicy("fit", 1.0)
    try:
        for rep in range(args.repeats):
            k = rep % len(policies)
            for policy in policies[k:] + policies[:k]:  # interleaved, rotated
                for i, text in enumerate(commands):
                    new = policy in ("every", "fit")
                    frame = None if policy == "text" else FrameImage(
                        key=f"r{rep}-{policy}-{i if new else 0}", data=frames[i if new else 0])
                    if policy == "fit":
                        frame, _ = fit.choose(frame, i, int(args.fit_budget_ms * 1e6))
                    prompt = planning.build(text)
                    t = engine.generate(GenerationRequest(
                        prompt=prompt.suffix, prefix=prompt.prefix,
                        max_tokens=planning.max_tokens, grammar=planning.contract.grammar,
                        complete=planning.contract.kind, image=frame))
                    if t.error is not None or not t.token_ns:
                        raise SystemExit(f"{policy} cycle {i}: {t.error or 'no token'}")
                    if policy == "fit":
                        fit.learn(frame, t)
                    ph = t.phases_ns()
                    cycles[policy].append({
                        "repeat": rep, "ttft_ms": (t.token_ns[0] - t.started_ns) / 1e6,
                        "e2e_ms": (t.token_ns[-1] - t.started_ns) / 1e6,
                        "image_encode_ms": ph.get("image_encode", 0) / 1e6 or None,
                        "image_prefill_ms": ph.get("image_prefill", 0) / 1e6 or None,
                        "image_tokens": (t.image or {}).get("tokens", 0),
                        "reused": bool((t.image or {}).get("reused")),
                        "scale": None if frame is None else frame.scale,
                        "tokens_out": len(t.tokens), "prompt_tokens": t.prompt_tokens})
    finally:
        engine.close()
    summary = {}
    for policy, rows in cycles.items():
        paid = [r for r in rows if r["image_prefill_ms"]]
        summary[policy] = {
            "cycles": len(rows), "frames_encoded": len(paid),
            "ttft_p50_ms": _p50([r["ttft_ms"] for r in rows]),
            "e2e_p50_ms": _p50([r["e2e_ms"] for r in rows]),
            "image_encode_p50_ms": _p50([r["image_encode_ms"] for r in paid]),
            "image_prefill_p50_ms": _p50([r["image_prefill_ms"] for r in paid]),
            "image_tokens": max((r["image_tokens"] for r in rows), default=0),
            "scales": {str(sc): sum(1 for r in rows if r["scale"] == sc)
                       for sc in sorted({r["scale"] for r in rows if r["scale"]}, reverse=True)},
            "text_only": sum(1 for r in rows if r["scale"] is None)}
    return {"lm": str(lm), "profile": planning.profile.name, "tower": shape.name,
            "image_px": shape.image_size_px, "frame_px": [w, h], "threads": args.threads,
            "commands": len(commands), "repeats": args.repeats,
            "fit_budget_ms": args.fit_budget_ms or None, "summary": summary,
            "cycles": cycles}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--lm", default="json", help="json, planner or a GGUF path")
    ap.add_argument("--profile", default="", help="the profile (default: the shipped model's)")
    ap.add_argument("--tower", default="siglip-b16-512")
    ap.add_argument("--image-px", type=int, default=0)
    ap.add_argument("--frame-px", default="640x480")
    ap.add_argument("--commands", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--fit-budget-ms", type=float, default=0.0,
                    help="also the fit policy, for this budget per cycle (0: not run)")
    ap.add_argument("--smoke", action="store_true",
                    help="the action planner, a tiny tower, 3 commands, 1 repeat")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.smoke:
        args.lm, args.tower, args.commands, args.repeats = "planner", "tiny-shuffle", 5, 1
        args.frame_px, args.n_ctx, args.fit_budget_ms = "256x256", 1024, 0.001
    with tempfile.TemporaryDirectory() as tmp:
        doc = run(args, Path(tmp))
    emit_result(doc, args.out)


if __name__ == "__main__":
    main()
