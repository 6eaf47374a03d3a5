"""What a cycle does with its camera frame (planner/frame_policy.py): reuse, every, fit.

The policy's bookkeeping on traces of its own making, then ``fit`` through real llama.cpp with a
tiny tower: a downscaled frame costs fewer image tokens, and a budget nothing fits plans
text-only, said in the record.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_latency.engines.base import FrameImage, GenerationRequest, GenerationTrace
from robot_latency.engines.llamacpp import LlamaCppEngine
from robot_latency.engines.llamacpp_config import LlamaCppConfig
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.mmproj import SHAPES, write_mmproj
from robot_latency.planner.config import RunSettings
from robot_latency.planner.frame_policy import COST_WINDOW, FIT_SCALES, FramePolicy
from robot_latency.profiles.profile import load_planning
from robot_latency.streams.scene import render_scene

MS = 1_000_000
FRAME = FrameImage(key="cam@1", data=b"png")


def _trace(*, image_ms: float = 0.0, text_ms: float = 10.0, reused: bool = False
           ) -> GenerationTrace:
    t = GenerationTrace(started_ns=0, tokenized_ns=0, prefill_chunk_ns=[int(text_ms * MS / 2)],
                        token_ns=[int(text_ms * MS / 2), int(text_ms * MS)], tokens=[1, 2])
    if image_ms:
        t.phases_extra_ns.update(image_encode=int(image_ms * MS / 2),
                                 image_prefill=int(image_ms * MS / 2))
        t.prefill_chunk_ns = [int((text_ms / 2 + image_ms) * MS)]
        t.token_ns = [int((text_ms / 2 + image_ms) * MS), int((text_ms + image_ms) * MS)]
        t.image = {"tokens": 16, "reused": reused, "layout_ns": 0}
    return t


def test_reuse_and_every() -> None:
    reuse, every = FramePolicy("reuse", 1.0), FramePolicy("every", 1.0)
    assert reuse.choose(FRAME, 3, 0) == (FRAME, None)  # whatever the budget
    sent, note = every.choose(FRAME, 3, 10**12)
    assert note is None and sent.key == "cam@1#3" and sent.data == FRAME.data
    assert every.choose(FRAME, 4, 10**12)[0].key == "cam@1#4"  # never the same twice
    assert reuse.choose(None, 3, 0) == (None, None)
    with pytest.raises(ValueError, match="image_policy"):
        RunSettings(image_policy="sometimes")


def test_fit_learns_each_scale_and_falls_to_text_only() -> None:
    fit = FramePolicy("fit", 1.0)
    first, note = fit.choose(FRAME, 0, 100 * MS)  # nothing measured: the full frame is tried
    assert note is None and first.scale == 1.0 and first.key == "cam@1@1"
    fit.learn(first, _trace(image_ms=300.0, text_ms=40.0))
    # the same frame again: in the KV cache at the scale it went in with, whatever the budget
    assert fit.choose(FRAME, 1, 1 * MS) == (first, None)
    fit.learn(first, _trace(text_ms=40.0, image_ms=1.0, reused=True))  # reused: no image cost
    assert list(fit.cost_ns[1.0]) == [300 * MS]
    new = FrameImage(key="cam@2", data=b"png")
    smaller, _ = fit.choose(new, 2, 100 * MS)  # 300 + 40 > 100: the next scale, not measured
    assert smaller.scale == FIT_SCALES[1] == 0.75 and smaller.key == "cam@2@0.75"
    fit.learn(smaller, _trace(image_ms=50.0, text_ms=40.0))
    assert fit.choose(FrameImage(key="cam@3", data=b"png"), 3, 100 * MS)[0].scale == 0.75
    cycle = 4
    for scale, cost in ((0.5, 45.0), (0.25, 42.0)):  # each tried once as the budget shrinks
        sent, _ = fit.choose(FrameImage(key=f"cam@{cycle}", data=b"png"), cycle, 80 * MS)
        assert sent.scale == scale
        fit.learn(sent, _trace(image_ms=cost, text_ms=40.0))
        cycle += 1
    last = sent
    none, note = fit.choose(FrameImage(key="cam@9", data=b"png"), 9, 60 * MS)
    assert none is None and note["text_only"] and note["policy"] == "fit"
    assert note["smallest_cost_ms"] == 42.0 and note["text_ms"] == 40.0
    # that text-only cycle cut the last frame from the KV cache: it is not taken as cached
    assert fit.choose(FrameImage(key=last.key.split("@0.25")[0], data=b"png"), 10, MS)[0] \
        is None
    # the largest of the newest costs counts, and only the newest COST_WINDOW
    for _ in range(COST_WINDOW):
        fit.learn(last, _trace(image_ms=5.0, text_ms=40.0))
    assert max(fit.cost_ns[0.25]) == 5 * MS
    assert fit.choose(FrameImage(key="cam@11", data=b"png"), 11, 60 * MS)[0].scale == 0.25
    # a failed generation teaches nothing
    before = list(fit.text_ns)
    fit.learn(first, GenerationTrace(started_ns=0, error="boom"))
    assert list(fit.text_ns) == before


def test_a_downscaled_frame_costs_fewer_image_tokens_through_llama_cpp(tmp_path: Path) -> None:
    """idefics3 tiles the frame: a 256x256 frame is 4 tiles and the global view of a 128-px
    tower, at half scale one tile and the view."""
    lm = bundled_model_path("planner")
    planning = load_planning("bundled-actions")
    mmproj = write_mmproj(SHAPES["tiny-shuffle"], tmp_path / "s.gguf", lm_path=lm)
    eng = LlamaCppEngine(LlamaCppConfig(model_path=str(lm), n_threads=1, n_ctx=512,
                                        warm_prefix=planning.prefix, max_suffix_tokens=64,
                                        max_new_tokens=planning.max_tokens,
                                        mmproj_path=str(mmproj)))
    png = render_scene(1, width=256, height=256)
    try:
        chunks = {}
        for scale in (1.0, 0.5):
            prompt = planning.build("stop")
            t = eng.generate(GenerationRequest(
                prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
                grammar=planning.contract.grammar,
                image=FrameImage(key=f"f@{scale:g}", data=png, scale=scale)))
            assert t.error is None, t.error
            chunks[scale] = (t.image["chunks"], t.image["tokens"])
    finally:
        eng.close()
    assert chunks == {1.0: (5, 80), 0.5: (2, 32)}
