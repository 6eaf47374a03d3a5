"""The torch ``mlp`` tower the seeing planner trains is llama.cpp's clip, and its trained weights
are written as an mmproj libmtmd loads.

Real llama.cpp (libmtmd of llama-cpp-python 0.3.36) on a random tower of the seeing planner's
shape beside the shipped JSON planner. Tolerance as test/engines/test_vision_onnx.py: 5e-3 of
the largest |value| (llama.cpp rounds activations to f16; measured here 1.4e-4 to 1.5e-4).
"""

from __future__ import annotations

import ctypes
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from robot_latency.engines.llamalog import route_mtmd_log
from robot_latency.engines.vision_onnx import preprocess_frame
from robot_latency.llama_load import load_policy, open_llama
from robot_latency.models.bundled import bundled_json_path
from robot_latency.models.mmproj import MmprojError, gguf_field, write_mmproj
from robot_latency.models.vision_onnx import read_tower
from robot_latency.models.vision_tower import SEEING_SHAPE, SeeingTower, write_trained_mmproj
from robot_latency.streams.scene import render_scene

REL_TOL = 5e-3
CHUNK_IMAGE = 1

def _libmtmd_embeddings(mmproj: Path, png: bytes) -> np.ndarray:
    """llama.cpp's embeddings of the frame's one image chunk (mtmd_encode_chunk)."""
    from llama_cpp import mtmd_cpp as m

    route_mtmd_log()
    llm = open_llama(load_policy("auto"), model_path=str(bundled_json_path()), n_ctx=256,
                     n_threads=1, n_threads_batch=1, verbose=False)
    params = m.mtmd_context_params_default()
    params.use_gpu, params.print_timings, params.n_threads, params.warmup = False, False, 1, False
    ctx = m.mtmd_init_from_file(str(mmproj).encode(), llm.model, params)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    data = img.tobytes()
    bitmap = m.mtmd_bitmap_init(img.width, img.height,
                                (ctypes.c_uint8 * len(data)).from_buffer_copy(data))
    chunks = m.mtmd_input_chunks_init()
    marker = m.mtmd_default_marker()
    text = m.mtmd_input_text(marker, len(marker), False, True)
    try:
        assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(text),
                               (m.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        assert m.mtmd_input_chunks_size(chunks) == 1  # the mlp projector wraps the image in none
        chunk = m.mtmd_input_chunks_get(chunks, 0)
        assert m.mtmd_input_chunk_get_type(chunk) == CHUNK_IMAGE
        n = m.mtmd_input_chunk_get_n_tokens(chunk)
        assert m.mtmd_encode_chunk(ctx, chunk) == 0
        width = llm.n_embd()
        return np.ctypeslib.as_array(m.mtmd_get_output_embd(ctx),
                                     shape=(n * width,)).reshape(n, width).copy()
    finally:
        m.mtmd_input_chunks_free(chunks)
        m.mtmd_bitmap_free(bitmap)
        m.mtmd_free(ctx)
        llm.close()


def _trained_like(seed: int) -> SeeingTower:
    tower = SeeingTower(SEEING_SHAPE, 128, seed=seed)
    with torch.no_grad():  # layernorms and biases away from 1 and 0, as training leaves them
        for name in tower.names:
            if name.endswith("bias") or "ln" in name:
                tower.w(name).add_(torch.randn_like(tower.w(name)) * 0.1)
    return tower


def test_the_torch_tower_is_llama_cpps_clip(tmp_path: Path) -> None:
    path = write_trained_mmproj(_trained_like(1), tmp_path / "t.mmproj.gguf", title="test")
    spec, tensors = read_tower(path)
    stored = SeeingTower.from_tensors(SEEING_SHAPE, tensors)  # f16 weights, as written
    for png in (render_scene(1), render_scene(2, width=64, height=64)):  # resampled, and not
        theirs = _libmtmd_embeddings(path, png)
        with torch.no_grad():
            ours = stored(torch.from_numpy(preprocess_frame(spec, png)[0]))[0].numpy()
        assert ours.shape == theirs.shape == (SEEING_SHAPE.tokens_per_tile, 128)
        assert float(np.abs(ours - theirs).max() / np.abs(theirs).max()) < REL_TOL


def test_trained_weights_are_written_as_given(tmp_path: Path) -> None:
    tower = _trained_like(2)
    path = write_trained_mmproj(tower, tmp_path / "t.gguf", title="trained")
    assert gguf_field(path, "general.name") == "trained"
    _, tensors = read_tower(path)
    for name, value in tower.gguf_tensors().items():
        assert np.allclose(tensors[name], value, rtol=1e-3, atol=1e-4), name  # f16 matrices
    del tensors["mm.0.bias"]
    with pytest.raises(MmprojError,
                       match=r"t2.gguf: tensor mm.0.bias: missing from the trained weights"):
        write_mmproj(SEEING_SHAPE, tmp_path / "t2.gguf", n_embd_out=128, tensors=tensors)
