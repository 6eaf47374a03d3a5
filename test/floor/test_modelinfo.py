"""Tests for robot_latency.floor.modelinfo: GGUF reading, presets, KV bytes and resolution.

The GGUF files are real, small llama-architecture files written with gguf.GGUFWriter (the
tiny_llama_gguf fixture, test/conftest.py): 2 layers, hidden 64, 4 heads / 2 KV heads
(head_dim 16), FFN 128, vocabulary 100.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from robot_latency.floor.errors import (
    ModelInfoError,
    UnknownPresetError,
    UnsupportedArchitectureError,
)
from robot_latency.floor.modelinfo import (
    GGML_TYPE_BPW,
    KV_DTYPE_BYTES,
    PRESET_BPW,
    PRESETS,
    QUANT_BPW,
    ModelFacts,
    ModelShape,
    facts_from_gguf,
    facts_from_hf_config,
    facts_from_preset,
    facts_manual,
    kv_bytes_per_token,
    quant_bpw,
    resolve_model,
)

Q = gguf.GGMLQuantizationType

N_LAYERS = 2  # the tiny file: hidden 64, 4 heads / 2 KV heads (KV width 32), FFN 128, vocab 100

# Elements, worked by hand for the tiny shape.
LAYER_MATRIX_ELEMS = 64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 3 * 128 * 64  # 36864
LAYER_VECTOR_ELEMS = 2 * 64  # attn_norm + ffn_norm
EMBD_ELEMS = 100 * 64  # 6400
TIED_PARAMS = N_LAYERS * (LAYER_MATRIX_ELEMS + LAYER_VECTOR_ELEMS) + EMBD_ELEMS + 64  # 80448
UNTIED_PARAMS = TIED_PARAMS + EMBD_ELEMS  # 86848


@pytest.fixture()
def untied_f32(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> Path:
    return tiny_llama_gguf(tmp_path / "untied.gguf")


@pytest.fixture()
def tied_f32(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> Path:
    return tiny_llama_gguf(tmp_path / "tied.gguf", tied=True, token_list=False)


@pytest.fixture()
def untied_q8(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> Path:
    return tiny_llama_gguf(
        tmp_path / "q8.gguf",
        matrix_type=Q.Q8_0,
        embd_type=Q.F16,
        file_type=gguf.LlamaFileType.MOSTLY_Q8_0,
    )


# ------------------------------------------------------------------------------------------------
# bits per weight and KV bytes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bpw"),
    [
        ("F32", 32), ("F16", 16), ("BF16", 16), ("Q8_0", 8.5), ("Q6_K", 6.5625), ("Q5_K", 5.5),
        ("Q5_0", 5.5), ("Q4_K", 4.5), ("Q4_0", 4.5), ("IQ4_XS", 4.25), ("Q3_K", 3.4375),
        ("Q2_K", 2.625), ("IQ2_XXS", 2.0625),
    ],
)
def test_ggml_type_bpw_matches_reference_table(name: str, bpw: float) -> None:
    assert GGML_TYPE_BPW[name] == bpw


def test_quant_bpw_prefers_preset_and_is_case_insensitive() -> None:
    assert quant_bpw("q4_k_m") == 4.90
    assert quant_bpw("Q4_K") == 4.5
    assert quant_bpw(" q8_0 ") == 8.52  # preset figure, not the per-type 8.5
    assert GGML_TYPE_BPW["Q8_0"] == 8.5
    assert quant_bpw("IQ4_XS") == 4.25
    assert PRESET_BPW["Q2_K"] == 3.17
    assert QUANT_BPW["Q4_K_M"] == 4.90 and QUANT_BPW["Q4_K"] == 4.5 and QUANT_BPW["Q8_0"] == 8.52


def test_quant_bpw_unknown_names_value_and_lists_valid() -> None:
    with pytest.raises(ModelInfoError) as exc:
        quant_bpw("Q9_Z")
    msg = str(exc.value)
    assert "'Q9_Z'" in msg and "Q4_K_M" in msg and "IQ4_XS" in msg


def test_kv_dtype_bytes() -> None:
    assert KV_DTYPE_BYTES["f32"] == 4
    assert KV_DTYPE_BYTES["f16"] == 2
    assert KV_DTYPE_BYTES["bf16"] == 2
    assert KV_DTYPE_BYTES["q8_0"] == 34 / 32
    assert KV_DTYPE_BYTES["q4_0"] == 18 / 32


def test_kv_bytes_per_token_hand_worked() -> None:
    assert kv_bytes_per_token(24, 2, 64) == 2 * 24 * 2 * 64 * 2 == 12288  # Qwen2.5-0.5B f16
    assert kv_bytes_per_token(32, 8, 128, "f16") == 131072  # Llama-3-8B
    assert kv_bytes_per_token(32, 8, 128, "F32") == 262144
    assert kv_bytes_per_token(32, 8, 128, "q8_0") == 65536 * 34 // 32 == 69632
    assert kv_bytes_per_token(32, 8, 128, "q4_0") == 65536 * 18 // 32 == 36864


def test_kv_bytes_per_token_rejects_bad_input() -> None:
    with pytest.raises(ModelInfoError, match="q3_k"):
        kv_bytes_per_token(2, 2, 16, "q3_k")
    with pytest.raises(ModelInfoError, match="n_layers"):
        kv_bytes_per_token(-1, 2, 16)


# ------------------------------------------------------------------------------------------------
# GGUF files
# ------------------------------------------------------------------------------------------------


def test_untied_f32_profile(untied_f32: Path) -> None:
    p = facts_from_gguf(untied_f32)
    assert p.source == "gguf"
    assert p.path == str(untied_f32)
    assert p.name == "tiny-llama"
    assert p.architecture == "llama"
    assert (p.n_layers, p.n_heads, p.n_kv_heads, p.head_dim) == (2, 4, 2, 16)
    assert (p.hidden, p.ffn, p.context_length, p.vocab_size) == (64, 128, 256, 100)
    assert p.tied_embeddings is False
    assert p.params == sum(t.n_elements for t in p.tensors) == UNTIED_PARAMS == 86848
    assert p.weight_bytes_total == 4 * 86848 == 347392
    # the 64x100 F32 embedding table (25600 bytes) is a lookup, not read per step
    assert p.weight_bytes_per_step == 347392 - 25600 == 321792
    assert p.tensor_types == {"F32": 347392}
    assert p.quant == "F32"  # no general.file_type: the dominant matrix type
    assert p.kv_dtype == "f16"
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2 == 256
    assert p.effective_bpw == pytest.approx(32.0)
    embd = next(t for t in p.tensors if t.name == "token_embd.weight")
    assert embd.shape == (64, 100)  # ggml order, ne0 first
    assert (embd.ggml_type, embd.n_elements, embd.n_bytes) == ("F32", 6400, 25600)


def test_tied_f32_profile_reads_embedding_in_full(tied_f32: Path) -> None:
    p = facts_from_gguf(tied_f32, kv_dtype="q8_0")
    assert p.tied_embeddings is True
    assert p.params == TIED_PARAMS == 80448
    assert p.weight_bytes_total == 4 * 80448 == 321792
    assert p.weight_bytes_per_step == p.weight_bytes_total  # token_embd is the output head
    assert p.vocab_size == 100  # no token list: from token_embd's shape
    assert p.kv_bytes_per_token == 128 * 34 // 32 == 136


def test_q8_0_profile_per_type_bytes(untied_q8: Path) -> None:
    p = facts_from_gguf(untied_q8)
    q8_elems = N_LAYERS * LAYER_MATRIX_ELEMS + EMBD_ELEMS  # layer matrices + output head = 80128
    assert p.tensor_types == {
        "F16": 6400 * 2,  # token_embd
        "F32": (2 * 2 * 64 + 64) * 4,  # 4 layer norms + output norm = 1280
        "Q8_0": q8_elems // 32 * 34,  # 34-byte blocks of 32 = 85136
    }
    assert p.tensor_types["Q8_0"] == 85136
    assert p.weight_bytes_total == 12800 + 1280 + 85136
    assert p.weight_bytes_per_step == 1280 + 85136
    assert p.quant == "Q8_0"  # from general.file_type
    assert p.params == UNTIED_PARAMS
    q_proj = next(t for t in p.tensors if t.name == "blk.0.attn_q.weight")
    assert (q_proj.ggml_type, q_proj.shape, q_proj.n_bytes) == ("Q8_0", (64, 64), 4096 // 32 * 34)


def test_gguf_profile_matches_shape_arithmetic(untied_f32: Path, tied_f32: Path) -> None:
    for path, tied in ((untied_f32, False), (tied_f32, True)):
        shape = ModelShape(
            id="tiny", name="tiny", architecture="llama", n_layers=2, hidden=64, n_heads=4,
            n_kv_heads=2, head_dim=16, ffn=128, vocab_size=100, tied_embeddings=tied,
            qkv_bias=False, context_length=256,
        )
        p = facts_from_gguf(path)
        assert shape.param_count() == p.params
        assert 4 * (shape.matrix_params_per_step() + shape.vector_params()) == (
            p.weight_bytes_per_step
        )


def test_key_length_sets_head_dim(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> None:
    p = facts_from_gguf(tiny_llama_gguf(tmp_path / "kl.gguf", key_length=32))
    assert p.head_dim == 32
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2


def test_general_file_type_name(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> None:
    path = tiny_llama_gguf(tmp_path / "f.gguf", file_type=gguf.LlamaFileType.MOSTLY_Q4_K_M)
    assert facts_from_gguf(path).quant == "Q4_K_M"
    path = tiny_llama_gguf(tmp_path / "g.gguf", file_type=gguf.LlamaFileType.ALL_F32)
    assert facts_from_gguf(path).quant == "F32"


def test_to_dict_is_json_ready(untied_q8: Path) -> None:
    p = facts_from_gguf(untied_q8)
    d = p.to_dict()
    assert "tensors" not in d
    assert d["weight_bytes_per_step"] == p.weight_bytes_per_step
    assert d["effective_bpw"] == pytest.approx(p.effective_bpw)
    full = json.loads(json.dumps(p.to_dict(include_tensors=True)))
    assert len(full["tensors"]) == len(p.tensors)
    assert full["tensors"][0]["shape"] == [64, 100]


def test_profile_is_frozen(untied_f32: Path) -> None:
    p = facts_from_gguf(untied_f32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.params = 1  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------
# GGUF errors: each names the file
# ------------------------------------------------------------------------------------------------


def _error(path: Path) -> str:
    with pytest.raises(ModelInfoError) as exc:
        facts_from_gguf(path)
    msg = str(exc.value)
    assert str(path) in msg
    return msg


def test_missing_file(tmp_path: Path) -> None:
    assert "no such file" in _error(tmp_path / "absent.gguf")


def test_directory(tmp_path: Path) -> None:
    assert "not a regular file" in _error(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "empty" in _error(path)


def test_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.zip"
    path.write_bytes(b"PK\x03\x04" + bytes(200))
    msg = _error(path)
    assert "not a GGUF file" in msg and "b'PK\\x03\\x04'" in msg and "b'GGUF'" in msg


def test_short_header(tmp_path: Path) -> None:
    path = tmp_path / "short.gguf"
    path.write_bytes(b"GGUF\x03\x00")
    assert "truncated" in _error(path)


def test_unsupported_version(tmp_path: Path, untied_f32: Path) -> None:
    data = bytearray(untied_f32.read_bytes())
    struct.pack_into("<I", data, 4, 9)
    path = tmp_path / "v9.gguf"
    path.write_bytes(bytes(data))
    assert "version 9" in _error(path)


@pytest.mark.parametrize("cut_bytes", [100, 4000, 20000, 330000])
def test_truncated(tmp_path: Path, untied_f32: Path, cut_bytes: int) -> None:
    data = untied_f32.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) - cut_bytes])
    assert "truncated" in _error(path)


@pytest.mark.parametrize("extra", [1, 2, 5, 100_000])
def test_over_claimed_tensor_count(tmp_path: Path, untied_f32: Path, extra: int) -> None:
    data = bytearray(untied_f32.read_bytes())
    (count,) = struct.unpack_from("<Q", data, 8)
    struct.pack_into("<Q", data, 8, count + extra)
    path = tmp_path / "over.gguf"
    path.write_bytes(bytes(data))
    msg = _error(path)
    if extra == 100_000:
        assert f"claims {count + extra} tensors" in msg


def test_unknown_tensor_type(tmp_path: Path, untied_f32: Path) -> None:
    data = bytearray(untied_f32.read_bytes())
    name = b"token_embd.weight"
    at = data.index(name) + len(name)  # then n_dims u32, dims 2 x u64, type u32
    assert struct.unpack_from("<I", data, at)[0] == 2
    struct.pack_into("<I", data, at + 4 + 16, 200)
    path = tmp_path / "newtype.gguf"
    path.write_bytes(bytes(data))
    assert "does not know" in _error(path)


def test_missing_block_count(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> None:
    msg = _error(tiny_llama_gguf(tmp_path / "nobc.gguf", block_count=None))
    assert "llama.block_count" in msg


def test_block_count_below_tensor_layers(tmp_path: Path,
                                         tiny_llama_gguf: Callable[..., Path]) -> None:
    msg = _error(tiny_llama_gguf(tmp_path / "bc.gguf", block_count=1))
    assert "layer 1" in msg and "block_count" in msg


def test_vocab_only_file(tmp_path: Path, tiny_llama_gguf: Callable[..., Path]) -> None:
    assert "no tensors" in _error(tiny_llama_gguf(tmp_path / "vocab.gguf", with_tensors=False))


def test_bad_kv_dtype_for_file(untied_f32: Path) -> None:
    with pytest.raises(ModelInfoError, match="KV cache type"):
        facts_from_gguf(untied_f32, kv_dtype="int3")


# ------------------------------------------------------------------------------------------------
# presets
# ------------------------------------------------------------------------------------------------

REFERENCE_PARAMS = {
    "llama-3-8b": 8.03e9,
    "llama-3.2-3b": 3.21e9,
    "llama-3.2-1b": 1.24e9,
    "qwen2.5-1.5b": 1.54e9,
    "qwen2.5-0.5b": 0.49e9,
    "tinyllama-1.1b": 1.10e9,
    "smollm2-360m": 0.36e9,
    "smollm2-135m": 0.135e9,
    # Parameter counts from the models' cards (Qwen2.5 cards print 3.09B and 7.61B; Phi-3.5-mini
    # 3.8B; Gemma-2-2B 2.61B; SmolLM2-1.7B 1.71B; Llama-2 6.74B, 13.0B, 69.0B).
    "llama-3.1-8b": 8.03e9,
    "qwen2.5-3b": 3.09e9,
    "qwen2.5-7b": 7.61e9,
    "smollm2-1.7b": 1.71e9,
    "gemma-2-2b": 2.61e9,
    "phi-3.5-mini": 3.82e9,
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 69.0e9,
    # llama.cpp's own count for Qwen3-0.6B (596.05M, which adds the q/k norms); the Qwen3 cards
    # print 1.7B, 4.0B and 8.2B; Gemma-3-1B 1.0B; Gemma-3-4B's text model is its card's 4.3B less
    # the ~0.42B vision encoder.
    "qwen3-0.6b": 0.596e9,
    "qwen3-1.7b": 1.72e9,
    "qwen3-4b": 4.02e9,
    "qwen3-8b": 8.19e9,
    "gemma-3-1b": 1.0e9,
    "gemma-3-4b": 3.88e9,
    # The distilled checkpoints' own counts (Hugging Face API for the 32B; llama.cpp's n_params
    # for the 14B's Qwen2.5-14B shape).
    "deepseek-r1-distill-qwen-14b": 14.77e9,
    "deepseek-r1-distill-qwen-32b": 32.76e9,
}


def test_preset_ids() -> None:
    assert set(PRESETS) == set(REFERENCE_PARAMS)


@pytest.mark.parametrize(("preset_id", "params"), sorted(REFERENCE_PARAMS.items()))
def test_preset_params_within_2_percent(preset_id: str, params: float) -> None:
    shape = PRESETS[preset_id]
    assert abs(shape.param_count() - params) / params < 0.02
    assert facts_from_preset(preset_id).params == shape.param_count()


def test_preset_exact_counts() -> None:
    assert PRESETS["llama-3-8b"].param_count() == 8_030_261_248  # the HF checkpoint's count
    assert PRESETS["qwen2.5-0.5b"].param_count() == 494_032_768
    assert PRESETS["deepseek-r1-distill-qwen-32b"].param_count() == 32_763_876_352
    assert PRESETS["deepseek-r1-distill-qwen-14b"].param_count() == 14_770_033_664


def test_preset_bytes_hand_worked_tied_f16() -> None:
    # SmolLM2-135M: q_dim 576, kv_dim 3*64 = 192
    attn = 576 * 576 + 2 * 576 * 192 + 576 * 576  # 884736
    mlp = 3 * 576 * 1536  # 2654208
    matrices = 30 * (attn + mlp) + 49152 * 576  # tied: one 49152x576 table = 134479872
    vectors = 30 * 2 * 576 + 576  # 35136
    assert matrices == 134_479_872 and vectors == 35_136
    p = facts_from_preset("smollm2-135m", quant="f16")
    assert p.params == matrices + vectors
    assert p.weight_bytes_total == matrices * 2 + vectors * 4 == 269_100_288
    assert p.weight_bytes_per_step == p.weight_bytes_total  # tied: read in full as the head
    assert p.quant == "F16" and p.source == "preset" and p.tensor_types == {}
    assert p.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2


def test_preset_bytes_untied_excludes_embedding() -> None:
    p = facts_from_preset("tinyllama-1.1b", quant="F16")
    assert p.weight_bytes_total - p.weight_bytes_per_step == 32000 * 2048 * 2
    q = facts_from_preset("llama-3-8b", quant="Q4_K_M")
    matrices = PRESETS["llama-3-8b"].matrix_params()
    vectors = PRESETS["llama-3-8b"].vector_params()
    assert q.weight_bytes_total == round(matrices * 4.90 / 8) + 4 * vectors
    assert q.effective_bpw == pytest.approx(4.90, abs=0.01)


def test_preset_qwen_has_qkv_bias() -> None:
    qwen = PRESETS["qwen2.5-0.5b"]
    assert qwen.qkv_bias and qwen.architecture == "qwen2"
    assert qwen.vector_params() == 24 * (2 * 896 + 896 + 2 * 128) + 896


def test_unknown_preset() -> None:
    with pytest.raises(UnknownPresetError) as exc:
        facts_from_preset("gpt-5")
    assert "gpt-5" in str(exc.value) and "llama-3-8b" in str(exc.value)


# ------------------------------------------------------------------------------------------------
# manual profiles and resolve_model
# ------------------------------------------------------------------------------------------------


def test_profile_manual() -> None:
    p = facts_manual(params=1_000_000_000, weight_bits=4.5, kv_bytes_per_token=4096, name="x")
    assert p.weight_bytes_total == p.weight_bytes_per_step == 562_500_000
    assert p.effective_bpw == pytest.approx(4.5)
    assert (p.source, p.name, p.kv_bytes_per_token, p.n_layers) == ("manual", "x", 4096, None)
    with pytest.raises(ModelInfoError):
        facts_manual(params=0, weight_bits=4.5, kv_bytes_per_token=1)
    with pytest.raises(ModelInfoError):
        facts_manual(params=10, weight_bits=0, kv_bytes_per_token=1)


def test_resolve_file(untied_f32: Path) -> None:
    p = resolve_model(str(untied_f32), kv_dtype="q4_0")
    assert isinstance(p, ModelFacts) and p.source == "gguf"
    assert p.kv_bytes_per_token == 128 * 18 // 32


def test_resolve_file_with_quant_is_an_error(untied_f32: Path) -> None:
    with pytest.raises(ModelInfoError, match="--quant applies to presets"):
        resolve_model(str(untied_f32), quant="Q4_K_M")


def test_resolve_preset_case_insensitive() -> None:
    p = resolve_model("Qwen2.5-0.5B")
    assert (p.source, p.name, p.quant) == ("preset", "Qwen2.5-0.5B", "Q4_K_M")
    assert p.kv_bytes_per_token == 12288
    assert resolve_model("qwen2.5-0.5b", quant="q8_0").quant == "Q8_0"


def test_resolve_unknown(tmp_path: Path) -> None:
    spec = str(tmp_path / "missing.gguf")
    with pytest.raises(UnknownPresetError) as exc:
        resolve_model(spec)
    msg = str(exc.value)
    assert spec in msg and "no such file" in msg and "smollm2-135m" in msg
    assert isinstance(exc.value, ModelInfoError) and isinstance(exc.value, KeyError)


def _config(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


# Qwen/Qwen3-0.6B's config.json, the fields the shape needs (and a few it ignores)
QWEN3_06B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "tie_word_embeddings": True, "vocab_size": 151936,
}


def test_hf_config_gives_the_presets_shape(tmp_path: Path) -> None:
    (tmp_path / "qwen3").mkdir()
    path = _config(tmp_path / "qwen3", QWEN3_06B_CONFIG)
    prof = resolve_model(str(path), quant="Q8_0")
    preset = facts_from_preset("qwen3-0.6b", quant="Q8_0")
    assert prof.source == "config.json" and prof.quant == "Q8_0"
    assert (prof.params, prof.weight_bytes_per_step, prof.kv_bytes_per_token) == (
        preset.params, preset.weight_bytes_per_step, preset.kv_bytes_per_token)
    assert resolve_model(str(path)).quant == "Q4_K_M"  # the default quant, as for a preset


def test_hf_config_multimodal_text_config_and_untied(tmp_path: Path) -> None:
    text = {**QWEN3_06B_CONFIG, "tie_word_embeddings": False}
    prof = facts_from_hf_config(_config(tmp_path, {"model_type": "qwen3_vl",
                                                     "text_config": text}))
    assert prof.tied_embeddings is False
    assert prof.weight_bytes_total > prof.weight_bytes_per_step


@pytest.mark.parametrize(("doc", "match"), [
    ({**QWEN3_06B_CONFIG, "model_type": "nemotron_h"}, "hybrid state-space"),
    ({**QWEN3_06B_CONFIG, "model_type": "lfm2"}, "hybrid state-space"),
    ({**QWEN3_06B_CONFIG, "model_type": "qwen3_moe", "num_experts": 128}, "mixture-of-experts"),
    ({**QWEN3_06B_CONFIG, "model_type": "mixtral", "num_local_experts": 8}, "mixture-of-experts"),
    ({**QWEN3_06B_CONFIG, "model_type": "falcon"}, "not a dense transformer the floor knows"),
])
def test_hf_config_refuses_what_it_cannot_count(tmp_path: Path, doc: dict, match: str) -> None:
    with pytest.raises(UnsupportedArchitectureError, match=match) as exc:
        facts_from_hf_config(_config(tmp_path, doc))
    assert len(str(exc.value).splitlines()) == 1 and "config.json" in str(exc.value)


@pytest.mark.parametrize(("doc", "match"), [
    ({**QWEN3_06B_CONFIG, "hidden_size": "big"}, "hidden_size"),
    ({k: v for k, v in QWEN3_06B_CONFIG.items() if k != "num_hidden_layers"},
     "num_hidden_layers"),
    ([1, 2], "expected a JSON object"),
])
def test_hf_config_bad_fields_are_named(tmp_path: Path, doc: object, match: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelInfoError, match=match):
        facts_from_hf_config(path)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ModelInfoError, match="not a JSON config"):
        resolve_model(str(tmp_path / "broken.json"))


def test_refused_preset_names_the_reason() -> None:
    with pytest.raises(UnsupportedArchitectureError, match=r"LFM2\.5-1\.2B.*hybrid state-space"):
        resolve_model("lfm2.5-1.2b")
    with pytest.raises(UnsupportedArchitectureError, match="Nemotron"):
        facts_from_preset("nemotron3-nano-4b")
