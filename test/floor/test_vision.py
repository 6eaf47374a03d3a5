"""The image's cost on the target: a tower's FLOPs, its tokens, and the prediction built on them.

The FLOPs of the tiny towers are checked against a count made another way: from the tensors an
mmproj actually holds (each weight matrix times the rows it multiplies), not from the ``clip.*``
keys. The chunk and token counts are checked against real llama.cpp (libmtmd) on rendered
frames. The shipped vision table has no row, so every answer says "vision uncalibrated"; a table
written here shows a calibrated answer and the leave-one-out validation.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from robot_latency.cli import main
from robot_latency.engines.vision import VisionCost
from robot_latency.floor.devices import get_device
from robot_latency.floor.errors import FloorError
from robot_latency.floor.modelinfo import resolve_model
from robot_latency.floor.published_vision import (
    load_vision_table,
    validate_vision,
    vision_fit,
)
from robot_latency.floor.target import resolve_calibration
from robot_latency.floor.vision import predict_vision
from robot_latency.floor.vision_tower import VisionTower, tower_from_mmproj
from robot_latency.models.bundled import bundled_model_path
from robot_latency.models.mmproj import SHAPES, lm_embedding_width, write_mmproj
from robot_latency.streams.scene import render_scene

LM = bundled_model_path("planner")
TINY = ("tiny-mlp", "tiny-shuffle")


def floor_tower(name: str, e: int = 896, px: int | None = None) -> VisionTower:
    s = SHAPES[name]
    return VisionTower(name=s.name, projector=s.projector,
                       image_size_px=px or s.image_size_px, patch_px=s.patch_px,
                       width=s.width, ffn=s.ffn, layers=s.layers, projection_dim=e,
                       scale_factor=s.scale_factor, class_token=s.class_token)


@pytest.fixture(scope="module")
def towers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mmproj")
    return {name: write_mmproj(SHAPES[name], out / f"{name}.gguf", lm_path=LM)
            for name in TINY}


def flops_from_tensors(path: Path) -> int:
    """One chunk's FLOPs counted from the file's tensors: 2 x (rows it multiplies) x (matrix
    size) for each weight matrix a pass uses, plus attention's two n x n x width products."""
    reader = GGUFReader(str(path))
    t = {x.name: tuple(int(d) for d in x.shape) for x in reader.tensors}
    kind = reader.fields["clip.projector_type"].contents()
    patch = int(reader.fields["clip.vision.patch_size"].contents())
    side = int(reader.fields["clip.vision.image_size"].contents()) // patch
    n_patches = side * side
    n = n_patches + (1 if "v.class_embd" in t else 0)
    blocks = sorted({int(k.split(".")[2]) for k in t if k.startswith("v.blk.")})
    if kind == "mlp":
        blocks = blocks[:-1]  # LLaVA reads the penultimate layer
    total = 2 * n_patches * int(np.prod(t["v.patch_embd.weight"]))
    for b in blocks:
        for m in ("attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"):
            total += 2 * n * int(np.prod(t[f"v.blk.{b}.{m}.weight"]))
        width = t[f"v.blk.{b}.attn_q.weight"][0]
        total += 2 * 2 * n * n * width
    if kind == "mlp":
        total += 2 * n_patches * (int(np.prod(t["mm.0.weight"])) + int(np.prod(t["mm.2.weight"])))
    else:
        scale = int(reader.fields["clip.vision.projector.scale_factor"].contents())
        total += 2 * (n_patches // scale ** 2) * int(np.prod(t["mm.model.fc.weight"]))
    return total


@pytest.mark.parametrize("name", TINY)
def test_a_tiny_towers_flops_match_a_count_from_its_tensors(name: str,
                                                            towers: dict[str, Path]) -> None:
    tower = tower_from_mmproj(towers[name])
    assert tower == replace(floor_tower(name, lm_embedding_width(LM)), name=tower.name)
    assert tower.flops_per_chunk() == flops_from_tensors(towers[name])


def test_the_real_towers_flops_are_the_reference_formula() -> None:
    # REFERENCE.md section 15: about 2 x params x patches + 4 x layers x patches^2 x width
    for name in ("clip-l14-336", "siglip-b16-512"):
        s, t = SHAPES[name], floor_tower(name)
        approx = 2 * s.params * t.positions * t.layers_run / s.layers \
            + 4 * t.layers_run * t.positions ** 2 * s.width
        assert t.flops_per_chunk() == pytest.approx(approx, rel=0.05)


@pytest.mark.parametrize("name", TINY)
def test_chunks_and_tokens_match_llama_cpp(name: str, towers: dict[str, Path]) -> None:
    tower = tower_from_mmproj(towers[name])
    with VisionCost(LM, towers[name], n_ctx=1024) as vision:
        for w, h in ((160, 120), (300, 120), (128, 400)):
            cost = vision.frame_cost(render_scene(0, width=w, height=h))
            assert (cost.image_chunks, cost.image_tokens) == (tower.chunks((w, h)),
                                                              tower.image_tokens((w, h)))


@pytest.mark.parametrize("device", ["orin-nano-8gb", "orin-agx-64gb"])
@pytest.mark.parametrize("name,sizes", [("clip-l14-336", (224, 280, 336, 448)),
                                        ("siglip-b16-512", (256, 384, 512, 640))])
def test_the_prediction_grows_with_the_resolution(device: str, name: str,
                                                  sizes: tuple[int, ...]) -> None:
    dev = get_device(device)
    cal = resolve_calibration("llamacpp-cuda", dev)
    lm = resolve_model("qwen2.5-0.5b", quant="Q4_K_M")
    preds = [predict_vision(floor_tower(name, px=px), lm, dev, cal, frame_px=(px, px))
             for px in sizes]
    for a, b in itertools.pairwise(preds):
        assert b.encode_gflop > a.encode_gflop and b.encode_ms > a.encode_ms
        assert b.image_tokens > a.image_tokens and b.image_prefill_ms > a.image_prefill_ms


def test_no_published_row_means_vision_uncalibrated() -> None:
    assert load_vision_table() == []
    dev = get_device("orin-nano-8gb")
    cal = resolve_calibration("llamacpp-cuda", dev)
    p = predict_vision(floor_tower("clip-l14-336"), resolve_model("qwen2.5-0.5b"), dev, cal,
                       prompt_tokens=300)
    assert not p.vision_calibrated and p.vision_status.startswith("vision uncalibrated")
    assert p.encode_ms == pytest.approx(p.encode_gflop * 1e9 / (dev.peak_flops
                                                                 * cal.compute_efficiency) * 1e3)
    assert p.ttft_with_image_ms is not None and p.text_ttft_ms is not None
    assert p.ttft_with_image_ms > p.encode_ms + p.text_ttft_ms
    check = validate_vision()
    assert not check["validated"] and "vision uncalibrated" in check["reason"]


def _table(tmp_path: Path, rows: list[tuple[str, float]]) -> Path:
    tower = {"projector": "mlp", "image_size_px": 336, "patch_px": 14, "width": 1024,
             "ffn": 4096, "layers": 24, "projection_dim": 4096, "scale_factor": 1,
             "class_token": True}
    setups = [{"setup": f"s{i}", "source": f"test source {i}", "url": "https://example.org",
               "device": device, "engine": "llama.cpp", "engine_family": "llamacpp-cuda",
               "build": None, "date": None, "power_mode": None, "notes": "written by a test",
               "rows": [{"model_reported": "tower", "tower": tower, "frame_px": [640, 480],
                         "encode_ms": ms}]}
              for i, (device, ms) in enumerate(rows)]
    path = tmp_path / "vision.yaml"
    path.write_text(json.dumps({"setups": setups}))  # JSON is YAML
    return path


def test_rows_calibrate_the_encode_and_are_validated_leave_one_out(tmp_path: Path) -> None:
    rows = load_vision_table(_table(tmp_path, [("orin-nano-8gb", 200.0),
                                               ("orin-agx-64gb", 60.0)]))
    fit = vision_fit("llamacpp-cuda", "orin-nano-8gb", rows=rows)
    assert fit is not None and fit.scope == "device" and len(fit.basis) == 1
    assert vision_fit("mlc", "orin-nano-8gb", rows=rows) is None
    dev = get_device("orin-nano-8gb")
    cal = resolve_calibration("llamacpp-cuda", dev)
    p = predict_vision(floor_tower("clip-l14-336", e=4096), resolve_model("qwen2.5-0.5b"), dev,
                       cal, vision_rows=rows)
    assert p.vision_calibrated and p.vision_status.startswith("vision calibrated")
    assert p.encode_ms == pytest.approx(200.0)  # its own row, one factor
    check = validate_vision(rows)
    assert check["validated"] and check["by_family"]["llamacpp-cuda"]["predicted"] == 2
    one = validate_vision(rows[:1])
    assert not one["validated"] and "at least 2" in one["reason"]


def test_a_tower_the_count_does_not_know_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(FloorError, match=r"projector_type='qwen2vl'"):
        VisionTower("x", "qwen2vl", 448, 14, 1280, 3420, 32, 2048)
    with pytest.raises(FloorError, match=r"image_size_px=300: not a multiple of patch_px=14"):
        floor_tower("clip-l14-336", px=300)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(FloorError, match=r"bad.gguf: not a GGUF"):
        tower_from_mmproj(bad)


def test_predict_prints_the_frame_beside_the_text_ttft(towers: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main(["predict", "--device", "orin-nano-8gb", "--vision-tower", "siglip-b16-512",
                 "--image-px", "384", "--prompt-tokens", "300"]) == 0
    out = capsys.readouterr().out
    assert "image encode" in out and "image prefill" in out and "text TTFT" in out
    # 640 x 480 at 384 px tiles: two tiles (sides rounded) and the view, 36 tokens each
    assert "3 chunks, 108 image tokens" in out
    assert "vision uncalibrated" in out
    assert main(["predict", "--device", "orin-agx-64gb", "--mmproj", str(towers["tiny-mlp"]),
                 "--model", str(LM), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vision"]["image_tokens"] == 16 and doc["vision"]["encode_ms"] > 0
    assert doc["vision"]["vision_calibrated"] is False
