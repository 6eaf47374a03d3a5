"""A vision tower written here loads beside the shipped planner in llama.cpp's libmtmd, and a
rendered frame's image cost is timed: image tokens as the tower's shape says, a positive encode
and image prefill, and one-line errors for a missing file or a projector of the wrong width.

Real llama.cpp throughout, on the tiny shapes (untrained weights: only the shapes and the times
mean anything)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from robot_latency.engines.llamalog import LOGGER_NAME
from robot_latency.engines.vision import FrameCost, VisionCost, VisionError, check_pair
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.mmproj import (
    SHAPES,
    MmprojError,
    at_resolution,
    gguf_field,
    lm_embedding_width,
    mmproj_output_width,
    tower_shape,
    write_mmproj,
)
from robot_latency.streams.scene import render_scene

LM = bundled_model_path("planner")


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mmproj")
    return {name: write_mmproj(SHAPES[name], out / f"{name}.gguf", lm_path=LM)
            for name in ("tiny-mlp", "tiny-shuffle")}


def _frame(px: int, seed: int = 0) -> bytes:
    return render_scene(seed, width=px, height=px)


def test_the_real_shapes_give_their_model_cards_token_counts() -> None:
    assert tower_shape("clip-l14-336").tokens_per_tile == 576  # LLaVA-1.5: 24 x 24
    assert tower_shape("siglip-b16-512").tokens_per_tile == 64  # SmolVLM: 32 x 32 / 16
    assert 300e6 < tower_shape("clip-l14-336").params < 310e6  # ViT-L/14: about 303 M
    assert 85e6 < tower_shape("siglip-b16-512").params < 95e6  # SigLIP-base: about 86 M
    assert at_resolution(tower_shape("clip-l14-336"), 224).tokens_per_tile == 256
    assert at_resolution(tower_shape("siglip-b16-512"), 384).tokens_per_tile == 36


def test_a_shape_llama_cpp_cannot_use_is_refused_naming_the_field() -> None:
    with pytest.raises(MmprojError, match=r"image_size_px=300: must be a multiple of "
                       r"patch_px=14"):
        at_resolution(tower_shape("clip-l14-336"), 300)
    with pytest.raises(MmprojError, match=r"image_size_px=480: 30 patches a side is not a "
                       r"multiple of scale_factor=4"):
        at_resolution(tower_shape("siglip-b16-512"), 480)
    with pytest.raises(MmprojError, match=r"tower='vit-h': must be one of"):
        tower_shape("vit-h")


def test_the_file_holds_the_keys_and_the_lm_width(towers: dict[str, Path]) -> None:
    width = lm_embedding_width(LM)
    for name, path in towers.items():
        assert gguf_field(path, "general.architecture") == "clip"
        assert gguf_field(path, "clip.projector_type") == SHAPES[name].projector
        assert gguf_field(path, "clip.vision.image_size") == SHAPES[name].image_size_px
        assert mmproj_output_width(path) == width == check_pair(LM, path)
    assert gguf_field(towers["tiny-shuffle"], "clip.vision.projector.scale_factor") == 4


def _check(cost: FrameCost) -> None:
    assert cost.encode_ms > 0 and cost.image_prefill_ms > 0
    assert set(cost.to_dict()) == {"image_tokens", "image_chunks", "text_tokens", "encode_ms",
                                   "image_prefill_ms"}


def test_mlp_frame_is_one_chunk_of_a_token_per_patch(towers: dict[str, Path]) -> None:
    shape = SHAPES["tiny-mlp"]
    with VisionCost(LM, towers["tiny-mlp"], n_ctx=256, n_batch=64) as vision:
        # any frame size: the mlp preprocessing resizes it to the tile
        for px in (shape.image_size_px, 96):
            cost = vision.frame_cost(_frame(px))
            assert (cost.image_tokens, cost.image_chunks) == (shape.tokens_per_tile, 1) == (16, 1)
            _check(cost)


def test_pixel_shuffle_frame_is_the_global_view_and_one_tile(towers: dict[str, Path]) -> None:
    shape = SHAPES["tiny-shuffle"]
    with VisionCost(LM, towers["tiny-shuffle"], n_ctx=256, n_batch=64) as vision:
        cost = vision.frame_cost(_frame(shape.image_size_px))
    # (128 / 8 / 4) ** 2 = 16 tokens per tile; llama.cpp's idefics3 adds the global view
    assert shape.tokens_per_tile == 16
    assert (cost.image_tokens, cost.image_chunks) == (2 * 16, 2)
    assert cost.text_tokens > 0  # the view's and the tile's wrapping text, not decoded here
    _check(cost)


def test_the_resolution_setting_sets_the_tokens(tmp_path: Path) -> None:
    shape = at_resolution(SHAPES["tiny-mlp"], 96)
    path = write_mmproj(shape, tmp_path / "mlp96.gguf", lm_path=LM)
    with VisionCost(LM, path, n_ctx=256, n_batch=64) as vision:
        cost = vision.frame_cost(_frame(64))
    assert cost.image_tokens == shape.tokens_per_tile == 36


def test_a_missing_mmproj_is_one_line_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(VisionError) as err:
        VisionCost(LM, missing)
    assert str(err.value) == f"{missing}: no such file"
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("not a gguf\n")
    with pytest.raises(VisionError, match=rf"^{not_gguf}: not a GGUF") as err:
        VisionCost(LM, not_gguf)
    assert "\n" not in str(err.value)


def test_a_projector_of_another_width_is_one_line_naming_the_field(tmp_path: Path) -> None:
    wrong = write_mmproj(SHAPES["tiny-mlp"], tmp_path / "w64.gguf", n_embd_out=64)
    width = lm_embedding_width(LM)
    with pytest.raises(VisionError) as err:
        VisionCost(LM, wrong)
    assert str(err.value) == (f"{wrong}: projector output width 64 != the language model's "
                              f"embedding_length {width} ({LM})")


def test_libmtmd_lines_go_to_the_log_not_stderr(towers: dict[str, Path],
                                                capfd: pytest.CaptureFixture[str],
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    with VisionCost(LM, towers["tiny-mlp"], n_ctx=256, n_batch=64) as vision:
        vision.frame_cost(_frame(64))
    assert "clip_model_loader" not in capfd.readouterr().err
    assert any("clip_model_loader" in r.getMessage() for r in caplog.records)
