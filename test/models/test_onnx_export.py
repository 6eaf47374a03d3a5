"""ONNX export of a llama GGUF: ONNX Runtime's logits against llama.cpp's on the same weights.

The model is a small random-weight llama with the planner's real tokenizer, written in the test;
what is checked is that the graph computes llama.cpp's function (RMSNorm, adjacent-pair RoPE,
GQA, SwiGLU, KV cache), not the model's quality.

Tolerance: max |onnx - llama.cpp| <= 1e-4 x the largest |logit| of the prompt (F32 weights,
F32 KV cache in llama.cpp). Measured here: about 1.5e-6 on logits of scale ~2 (summation order).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx  # noqa: F401  (a hard requirement: a missing one fails)
import onnxruntime as ort
import pytest

from robot_latency.llama_load import load_policy, open_llama
from robot_latency.models.onnx_export import (
    OnnxExportError,
    export_all,
    export_onnx,
    onnx_io_names,
    quantize_onnx_int8,
)
from robot_latency.models.tokenizer import build_vocab, format_prompt

COMMANDS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
            "bring me the blue bottle", "find the green ball then go to the garage"]
REL_TOL = 1e-4
N_LAYERS, N_KV, HEAD_DIM = 2, 2, 32


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory: pytest.TempPathFactory,
              random_llama_gguf: Callable[..., Path]) -> Path:
    """A 2-layer random llama (128 wide, 4 query / 2 KV heads: GQA) with the planner vocabulary;
    norm gains away from 1 so a mistake in their use shows."""
    return random_llama_gguf(tmp_path_factory.mktemp("onnx") / "rand.gguf", n_layers=N_LAYERS,
                             n_kv_heads=N_KV, seed=0)


@pytest.fixture(scope="module")
def llm(gguf_path: Path):
    # F32 KV cache: an F16 cache alone moves logits by ~1e-3.
    model = open_llama(load_policy(), model_path=str(gguf_path), n_ctx=256, logits_all=True,
                       type_k=0, type_v=0, n_threads=2, verbose=False)
    yield model
    model.close()


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _feeds(tokens: list[int], past: list[np.ndarray] | None = None) -> dict[str, np.ndarray]:
    feeds = {"input_ids": np.array([tokens], np.int64)}
    names = onnx_io_names(N_LAYERS)[0][1:]
    for i, name in enumerate(names):
        feeds[name] = past[i] if past is not None else np.zeros((1, N_KV, 0, HEAD_DIM), np.float32)
    return feeds


def _llama_logits(llm, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])  # (T, V)


def test_io_names_and_shapes(gguf_path: Path, tmp_path: Path) -> None:
    sess = _session(export_onnx(gguf_path, tmp_path / "m.onnx"))
    ins, outs = onnx_io_names(N_LAYERS)
    assert [i.name for i in sess.get_inputs()] == ins
    assert [o.name for o in sess.get_outputs()] == outs
    assert sess.get_inputs()[1].shape == [1, N_KV, "past_seq", HEAD_DIM]
    assert sess.get_outputs()[0].shape == [1, 1, build_vocab().size]


def test_fp32_logits_match_llamacpp(gguf_path: Path, llm, tmp_path: Path) -> None:
    sess = _session(export_onnx(gguf_path, tmp_path / "all.onnx", logits="all"))
    worst = 0.0
    for cmd in COMMANDS:
        tokens = llm.tokenize(format_prompt(cmd).encode(), add_bos=True, special=True)
        ref = _llama_logits(llm, tokens)
        got = sess.run(None, _feeds(tokens))[0][0]          # (T, V), every position
        scale = float(np.abs(ref).max())
        diff = float(np.abs(got - ref).max())
        worst = max(worst, diff / scale)
        assert diff <= REL_TOL * scale, f"{cmd!r}: max diff {diff} at logit scale {scale}"
        assert (got.argmax(-1) == ref.argmax(-1)).all()
    assert worst < REL_TOL


def test_kv_cache_split_equals_one_pass(gguf_path: Path, llm, tmp_path: Path) -> None:
    """Prefill in two pieces through past/present equals llama.cpp on the whole prompt, and
    the last-position output equals the all-positions output's last row."""
    sess_all = _session(export_onnx(gguf_path, tmp_path / "all.onnx", logits="all"))
    sess_last = _session(export_onnx(gguf_path, tmp_path / "last.onnx"))
    tokens = llm.tokenize(format_prompt(COMMANDS[0]).encode(), add_bos=True, special=True)
    ref = _llama_logits(llm, tokens)
    k = len(tokens) // 2
    first = sess_all.run(None, _feeds(tokens[:k]))
    second = sess_all.run(None, _feeds(tokens[k:], first[1:]))
    assert second[1].shape == (1, N_KV, len(tokens), HEAD_DIM)  # present = past + new
    got = np.concatenate([first[0][0], second[0][0]])
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
    last = sess_last.run(None, _feeds(tokens[k:], first[1:]))[0]
    assert last.shape == (1, 1, ref.shape[1])
    np.testing.assert_allclose(last[0, 0], second[0][0, -1], atol=1e-5)


def test_opset_18_builds_the_same_function(gguf_path: Path, llm, tmp_path: Path) -> None:
    sess = _session(export_onnx(gguf_path, tmp_path / "o18.onnx", opset=18, logits="all"))
    tokens = llm.tokenize(format_prompt("stop").encode(), add_bos=True, special=True)
    ref = _llama_logits(llm, tokens)
    assert np.abs(sess.run(None, _feeds(tokens))[0][0] - ref).max() <= REL_TOL * np.abs(ref).max()


def test_int8_loads_runs_and_is_smaller(gguf_path: Path, llm, tmp_path: Path) -> None:
    fp32 = export_onnx(gguf_path, tmp_path / "m.onnx")
    int8 = quantize_onnx_int8(fp32, tmp_path / "m.int8.onnx")
    assert int8.stat().st_size < 0.6 * fp32.stat().st_size
    sess = _session(int8)
    assert sess.get_modelmeta().custom_metadata_map["weights"] == "int8"
    tokens = llm.tokenize(format_prompt(COMMANDS[0]).encode(), add_bos=True, special=True)
    ref = _llama_logits(llm, tokens)[-1]
    got = sess.run(None, _feeds(tokens))[0][0, 0]
    # Dynamic INT8 moves logits by a few percent of their scale; it does not break them.
    assert np.corrcoef(got, ref)[0, 1] > 0.9


def test_export_all_writes_manifest(gguf_path: Path, tmp_path: Path) -> None:
    manifest = export_all(gguf_path, tmp_path)
    for kind, name in (("fp32", "rand.onnx"), ("int8", "rand.int8.onnx")):
        entry = manifest["files"][kind]
        path = tmp_path / name
        assert entry["path"] == name and entry["bytes"] == path.stat().st_size
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (tmp_path / "rand.onnx.json").is_file()


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(OnnxExportError, match=r"bad\.gguf"):
        export_onnx(bad, tmp_path / "x.onnx")
    with pytest.raises(OnnxExportError, match="opset"):
        export_onnx(bad, tmp_path / "x.onnx", opset=11)
    with pytest.raises(OnnxExportError, match=r"missing\.onnx"):
        quantize_onnx_int8(tmp_path / "missing.onnx", tmp_path / "y.onnx")


def test_large_models_write_external_data(gguf_path: Path, llm, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Past protobuf's 2 GB limit the weights go beside the graph; same function, same files
    in the manifest."""
    import robot_latency.models.onnx_export as mod

    monkeypatch.setattr(mod, "EXTERNAL_DATA_BYTES", 0)
    manifest = export_all(gguf_path, tmp_path)
    assert manifest["files"]["fp32"]["data"]["path"] == "rand.onnx.data"
    assert manifest["files"]["fp32"]["bytes"] < 100_000  # the graph only
    tokens = llm.tokenize(format_prompt("stop").encode(), add_bos=True, special=True)
    ref = _llama_logits(llm, tokens)[-1]
    got = _session(tmp_path / "rand.onnx").run(None, _feeds(tokens))[0][0, 0]
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
    assert _session(tmp_path / "rand.int8.onnx").run(None, _feeds(tokens))[0].shape[-1] == ref.size


def test_shipped_planner_logits_match_on_heldout_prompts(tmp_path: Path) -> None:
    """The shipped planner as ONNX against llama.cpp F32 on held-out commands."""

    from robot_latency.models.bundled import bundled_model_path, load_manifest
    from robot_latency.models.corpus import corpus_config_from_dict, generate_corpus

    path = bundled_model_path()
    held = generate_corpus(corpus_config_from_dict(load_manifest()["corpus"])).heldout[:20]
    sess = _session(export_onnx(path, tmp_path / "planner.onnx", logits="all"))
    ref_llm = open_llama(load_policy(), model_path=str(path), n_ctx=128, logits_all=True,
                         type_k=0, type_v=0, verbose=False)
    try:
        for cmd in held:
            tokens = ref_llm.tokenize(format_prompt(cmd.text).encode(), add_bos=True,
                                      special=True)
            ref = _llama_logits(ref_llm, tokens)
            feeds = {"input_ids": np.array([tokens], np.int64)}
            for inp in sess.get_inputs()[1:]:  # empty past: [1, n_kv, 0, head_dim]
                feeds[inp.name] = np.zeros((1, inp.shape[1], 0, inp.shape[3]), np.float32)
            got = sess.run(None, feeds)[0][0]
            scale = float(np.abs(ref).max())
            assert float(np.abs(got - ref).max()) <= REL_TOL * scale, cmd.text
            assert (got.argmax(-1) == ref.argmax(-1)).all(), cmd.text
    finally:
        ref_llm.close()
