"""The camera frame in the llama.cpp engine's prompt, through real llama.cpp and libmtmd.

The shipped planner with a tiny vision tower written here (untrained: the image's embeddings mean
nothing, so only what the engine does with them is checked): a frame is encoded and prefilled
once, its phases recorded; the same frame again is found in the KV cache; another frame is
encoded again; text-only cycles around them plan exactly as they do with no frame ever seen.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.engines.base import EngineError, FrameImage, GenerationRequest, StopReason
from robot_latency.engines.llama_image import frame_sentinel
from robot_latency.engines.llamacpp import LlamaCppEngine
from robot_latency.engines.llamacpp_config import LlamaCppConfig
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.mmproj import SHAPES, write_mmproj
from robot_latency.profiles.profile import load_planning
from robot_latency.streams.scene import render_scene

LM = bundled_model_path("planner")
COMMAND = "pick up the red cup"


@pytest.fixture(scope="module")
def planning():
    return load_planning("bundled-actions")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, planning):
    mmproj = tmp_path_factory.mktemp("mmproj") / "t.gguf"  # written as a user writes one
    assert main(["models", "mmproj", "--tower", "tiny-mlp", "--model", "planner",
                 "--out", str(mmproj)]) == 0
    eng = LlamaCppEngine(LlamaCppConfig(model_path=str(LM), n_threads=2, n_ctx=512,
                                        warm_prefix=planning.prefix, max_suffix_tokens=64,
                                        max_new_tokens=planning.max_tokens,
                                        mmproj_path=str(mmproj)))
    yield eng
    eng.close()


def _frame(seed: int) -> FrameImage:
    return FrameImage(key=f"frame-{seed}", data=render_scene(seed, width=96, height=72))


def _ask(engine: LlamaCppEngine, planning, frame: FrameImage | None, command: str = COMMAND):
    prompt = planning.build(command)
    trace = engine.generate(GenerationRequest(
        prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
        grammar=planning.contract.grammar, complete=planning.contract.kind, image=frame))
    assert trace.error is None, trace.error
    assert trace.stop_reason in (StopReason.DONE, StopReason.COMPLETE)
    return trace


def test_a_frame_is_encoded_once_kept_in_the_kv_and_replaced_by_the_next(engine,
                                                                         planning) -> None:
    text_before = _ask(engine, planning, None)
    assert text_before.image is None and "image_encode" not in text_before.phases_ns()
    prefix = len(engine._prefix(planning.prefix))

    a1 = _ask(engine, planning, _frame(1))
    phases = a1.phases_ns()
    assert phases["image_encode"] > 0 and phases["image_prefill"] > 0
    assert a1.image["tokens"] == SHAPES["tiny-mlp"].tokens_per_tile == 16
    assert a1.image["chunks"] == 1 and not a1.image["reused"]
    # the prompt holds the frame: the prefix, the frame's positions, the command's tokens
    assert a1.prompt_tokens == text_before.prompt_tokens + a1.image["tokens"]
    assert a1.prefix_cache_tokens == prefix  # the frame was evaluated, not found cached
    # the phases add up: the encode and the image prefill are not counted in the prefill too
    assert a1.prefill_ns is not None and a1.prefill_ns >= 0
    assert sum(phases[p] for p in ("tokenize", "prefill", "image_encode", "image_prefill")) \
        <= a1.prefill_chunk_ns[-1] - a1.started_ns
    ids = list(engine.llm.input_ids[prefix: prefix + 16])
    assert ids == [frame_sentinel("frame-1")] * 16

    a2 = _ask(engine, planning, _frame(1), "stop")  # the same frame, another command
    assert a2.image["reused"] and "image_encode" not in a2.phases_ns()
    assert "image_prefill" not in a2.phases_ns()
    assert a2.prefix_cache_tokens >= prefix + 16

    b = _ask(engine, planning, _frame(2))  # a new frame: encoded again
    assert not b.image["reused"] and b.phases_ns()["image_prefill"] > 0
    assert list(engine.llm.input_ids[prefix: prefix + 16]) == [frame_sentinel("frame-2")] * 16

    a3 = _ask(engine, planning, _frame(1))  # frame 1 again after 2: the same plan as at first
    assert not a3.image["reused"] and a3.tokens == a1.tokens

    text_after = _ask(engine, planning, None)  # the frame's positions are cut from the cache
    assert text_after.image is None and text_after.tokens == text_before.tokens
    assert text_after.prompt_tokens == text_before.prompt_tokens


def test_a_bad_image_fails_the_generation_not_the_engine(engine, planning) -> None:
    prompt = planning.build(COMMAND)
    trace = engine.generate(GenerationRequest(
        prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
        grammar=planning.contract.grammar, image=FrameImage(key="bad", data=b"not a png")))
    assert trace.stop_reason == StopReason.ERROR and "frame bad: not an image" in trace.error
    assert _ask(engine, planning, _frame(3)).image["tokens"] == 16  # the engine goes on


def test_an_mmproj_of_another_width_is_refused_naming_it(tmp_path: Path) -> None:
    # a tower projecting to the draft's width (128) beside the planner (256)
    mmproj = write_mmproj(SHAPES["tiny-mlp"], tmp_path / "other.gguf",
                          lm_path=bundled_model_path("planner-draft"))
    with pytest.raises(EngineError, match=r"mmproj: .*other\.gguf"):
        LlamaCppEngine(LlamaCppConfig(model_path=str(LM), mmproj_path=str(mmproj)))
    with pytest.raises(EngineError, match="speculative decoding is text only"):
        LlamaCppConfig(model_path=str(LM), mmproj_path=str(mmproj), draft="prompt_lookup")


def test_an_idefics3_tower_whose_wrapper_tokens_the_model_lacks(tmp_path: Path, planning,
                                                               caplog) -> None:
    """SmolVLM's projector wraps its tiles in special tokens a SmolVLM vocabulary has and the
    planner's lacks (libmtmd gives -1 for them): they are left out, with a warning, and the
    frame's two chunks (global view and one tile) are encoded and prefilled."""
    mmproj = write_mmproj(SHAPES["tiny-shuffle"], tmp_path / "s.gguf", lm_path=LM)
    eng = LlamaCppEngine(LlamaCppConfig(model_path=str(LM), n_threads=1, n_ctx=512,
                                        warm_prefix=planning.prefix, max_suffix_tokens=64,
                                        max_new_tokens=planning.max_tokens,
                                        mmproj_path=str(mmproj)))
    try:
        before = _ask(eng, planning, None)
        with caplog.at_level("WARNING", logger="robot_latency.engines.llama_image"):
            seen = _ask(eng, planning, _frame(4))
        assert "lacks some of the projector's wrapper tokens" in caplog.text
        assert (seen.image["tokens"], seen.image["chunks"]) == (32, 2)
        assert seen.phases_ns()["image_prefill"] > 0
        assert _ask(eng, planning, None).tokens == before.tokens
    finally:
        eng.close()
