"""``vision_encoder=onnx``: the llama.cpp engine encodes the frame with the tower's ONNX export.

Real llama.cpp (libmtmd lays the frame out either way) and real ONNX Runtime, the shipped planner
with the tiny untrained towers, one thread each. The ONNX embeddings are within 5e-3 of clip's
(test_vision_onnx.py), so the plans are clip's; the phases, the frame cache and the record's
``image`` are the engine's as with clip, which says the encoder that ran.

The untrained tower's frames barely move a grammar-constrained plan (two frames, and even
all-zero embeddings, give the same tokens), so the logits of the first generated token say more:
the ONNX encode moves them far less than another frame does (measured: 1.8e-3 and 7e-4 against
0.59; all-zero embeddings 1.1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from robot_latency.cli import main
from robot_latency.engines.base import EngineError, FrameImage, GenerationRequest, StopReason
from robot_latency.engines.llama_image import frame_sentinel
from robot_latency.engines.llamacpp import LlamaCppEngine
from robot_latency.engines.llamacpp_config import LlamaCppConfig
from robot_latency.errors import SettingsError
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.mmproj import SHAPES, write_mmproj
from robot_latency.models.onnx_cache import ensure_vision_onnx
from robot_latency.planner.config import RunSettings
from robot_latency.profiles.profile import load_planning
from robot_latency.records import read_records
from robot_latency.ros.params import ParamError, planner_settings
from robot_latency.streams.scene import render_scene

LM = bundled_model_path("planner")
COMMAND = "pick up the red cup"
#: How much more another frame moves the first token's logits than the ONNX encode may.
MARGIN = 50


@pytest.fixture(scope="module")
def planning():
    return load_planning("bundled-actions")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A model cache of the module's own: the ONNX export is written there once."""
    path = tmp_path_factory.mktemp("rlcache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROBOT_LATENCY_CACHE_DIR", str(path))
        yield path / "models"


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mmproj")
    return {name: write_mmproj(SHAPES[name], out / f"{name}.gguf", lm_path=LM)
            for name in ("tiny-mlp", "tiny-shuffle")}


def _engine(mmproj: Path, encoder: str, planning) -> LlamaCppEngine:
    """The planner with ``mmproj``; its ``logits`` (the last position's, by ``n_tokens`` after
    each ``eval``) are kept for the test."""
    eng = LlamaCppEngine(LlamaCppConfig(model_path=str(LM), n_threads=1, n_ctx=512,
                                         warm_prefix=planning.prefix, max_suffix_tokens=64,
                                         max_new_tokens=planning.max_tokens,
                                         mmproj_path=str(mmproj), vision_encoder=encoder))
    llm, evaluate, n_vocab = eng.llm, eng.llm.eval, eng.llm.n_vocab()
    eng.logits = {}  # type: ignore[attr-defined]

    def eval_keeping_logits(tokens: list[int]) -> None:
        evaluate(tokens)
        eng.logits[llm.n_tokens] = np.ctypeslib.as_array(  # type: ignore[attr-defined]
            llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).copy()

    llm.eval = eval_keeping_logits
    return eng


@pytest.fixture(scope="module")
def engines(towers: dict[str, Path], cache: Path, planning
            ) -> Iterator[dict[str, LlamaCppEngine]]:
    pair = {enc: _engine(towers["tiny-mlp"], enc, planning) for enc in ("clip", "onnx")}
    yield pair
    for eng in pair.values():
        eng.close()


def _frame(seed: int, size: tuple[int, int] = (96, 72)) -> FrameImage:
    return FrameImage(key=f"frame-{seed}", data=render_scene(seed, width=size[0],
                                                              height=size[1]))


def _ask(engine: LlamaCppEngine, planning, frame: FrameImage | None, command: str = COMMAND):
    prompt = planning.build(command)
    trace = engine.generate(GenerationRequest(
        prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
        grammar=planning.contract.grammar, complete=planning.contract.kind, image=frame))
    assert trace.error is None, trace.error
    assert trace.stop_reason in (StopReason.DONE, StopReason.COMPLETE)
    return trace


def test_onnx_plans_as_clip_and_keeps_the_frame_cache(engines, planning, cache: Path,
                                                      towers: dict[str, Path]) -> None:
    clip, onnx = engines["clip"], engines["onnx"]
    first: dict[tuple[str, int], np.ndarray] = {}
    for seed in (1, 2):  # two different frames, each new to the KV cache
        theirs, ours = _ask(clip, planning, _frame(seed)), _ask(onnx, planning, _frame(seed))
        assert ours.tokens == theirs.tokens and len(ours.tokens) > 1
        first["clip", seed] = clip.logits[theirs.prompt_tokens]
        first["onnx", seed] = onnx.logits[ours.prompt_tokens]
        assert (theirs.image["encoder"], ours.image["encoder"]) == ("clip", "onnx")
        phases = ours.phases_ns()
        assert phases["image_encode"] > 0 and phases["image_prefill"] > 0
        assert not ours.image["reused"] and (ours.image["tokens"], ours.image["chunks"]) == (
            SHAPES["tiny-mlp"].tokens_per_tile, 1)
        # the same prompt positions, the frame's marked with its sentinel, evaluated (not found)
        assert (ours.prompt_tokens, ours.prefix_cache_tokens) == (theirs.prompt_tokens,
                                                                  theirs.prefix_cache_tokens)
        held = list(onnx.llm.input_ids[:onnx.llm.n_tokens])
        assert held == list(clip.llm.input_ids[:clip.llm.n_tokens])
        assert held.count(frame_sentinel(f"frame-{seed}")) == ours.image["tokens"]
    frame_shift = float(np.abs(first["clip", 1] - first["clip", 2]).max())
    gap = max(float(np.abs(first["onnx", s] - first["clip", s]).max()) for s in (1, 2))
    assert gap < frame_shift / MARGIN, (gap, frame_shift)
    again = _ask(onnx, planning, _frame(2), "stop")  # unchanged frame: found in the KV cache
    assert again.image["reused"] and again.image["encoder"] == "onnx"
    assert not {"image_encode", "image_prefill"} & set(again.phases_ns())
    assert again.prefix_cache_tokens >= ours.prefix_cache_tokens + again.image["tokens"]
    assert again.tokens == _ask(clip, planning, _frame(2), "stop").tokens
    # the export was written once into the model cache and is found there again
    written = onnx.frames._onnx.onnx_path
    assert written.is_relative_to(cache / "onnx")
    mtime_ns, inode = written.stat().st_mtime_ns, written.stat().st_ino
    assert ensure_vision_onnx(towers["tiny-mlp"]) == written
    assert (written.stat().st_mtime_ns, written.stat().st_ino) == (mtime_ns, inode)
    assert not [p for p in written.parent.parent.iterdir() if p.name.startswith(".")]


def test_idefics3_frames_in_their_tiles_and_view(towers: dict[str, Path], cache: Path,
                                                planning) -> None:
    """The tile and the global view, or six tiles and the view: each chunk encoded from its own
    pixels, the plan llama.cpp's clip gives."""
    pair = {enc: _engine(towers["tiny-shuffle"], enc, planning) for enc in ("clip", "onnx")}
    try:
        for seed, size, chunks in ((4, (100, 80), 2), (5, (400, 300), 7)):
            theirs = _ask(pair["clip"], planning, _frame(seed, size))
            ours = _ask(pair["onnx"], planning, _frame(seed, size))
            assert (ours.image["tokens"], ours.image["chunks"]) == (16 * chunks, chunks)
            assert ours.image["encoder"] == "onnx" and theirs.image["encoder"] == "clip"
            assert ours.tokens == theirs.tokens and ours.phases_ns()["image_prefill"] > 0
    finally:
        for eng in pair.values():
            eng.close()


def test_a_run_records_the_onnx_encoder(towers: dict[str, Path], cache: Path,
                                        tmp_path: Path) -> None:
    assert main(["streams", "make", "--process", "periodic", "--rate-hz", "2", "--count", "3",
                 "--frames-hz", "1", "--out", str(tmp_path / "bag")]) == 0
    plans = {}
    for enc in ("clip", "onnx"):
        out = tmp_path / enc
        assert main(["run", "--stream", str(tmp_path / "bag"), "--mmproj",
                     str(towers["tiny-mlp"]), "--vision-encoder", enc, "--mode", "event",
                     "--deadline-ms", "60000", "--n-threads", "1", "--n-threads-batch", "1",
                     "--runner", "inline", "--out", str(out)]) == 0
        records = [r for r in read_records(out / "cycles.jsonl") if r.plan_source == "model"]
        assert len(records) == 3 and all(r.image["encoder"] == enc for r in records)
        paid = [r for r in records if not r.image["reused"]]
        assert paid and all({"image_encode", "image_prefill"} <= set(r.phases_ns) for r in paid)
        plans[enc] = [r.plan for r in records]
    assert plans["onnx"] == plans["clip"]


def test_a_bad_vision_encoder_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"^llamacpp: vision_encoder='tpu': must be one of"):
        LlamaCppConfig(model_path=str(LM), mmproj_path="t.gguf", vision_encoder="tpu")
    with pytest.raises(EngineError, match=r"^llamacpp: vision_encoder='onnx': needs mmproj_path"):
        LlamaCppConfig(model_path=str(LM), vision_encoder="onnx")
    with pytest.raises(SettingsError, match=r"vision_encoder: 'onnx': only with mmproj") as err:
        RunSettings(vision_encoder="onnx")
    assert err.value.name == "vision_encoder" and "\n" not in str(err.value)
    with pytest.raises(ParamError, match=r"vision_encoder") as perr:
        planner_settings({"vision_encoder": "tpu", "log_dir": str(tmp_path / "r")})
    assert "\n" not in str(perr.value)
