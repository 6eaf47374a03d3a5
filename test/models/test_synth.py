"""Synthetic random-weight GGUFs of preset shapes (timing only)."""

from __future__ import annotations

import gguf
import llama_cpp  # noqa: F401  (a hard requirement: a missing one fails)
import pytest

from robot_latency.engines.base import GenerationRequest, create_engine
from robot_latency.floor.modelinfo import PRESETS, ModelShape, facts_from_gguf
from robot_latency.models import synth as syn
from robot_latency.models.ladder import LadderError
from robot_latency.models.tokenizer import build_vocab, format_prompt
from robot_latency.profiles.actions import actions_gbnf


def test_smollm2_135m_q4_0(tmp_path) -> None:
    out = syn.synth("smollm2-135m", "Q4_0", tmp_path / "s.gguf", seed=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.gguf"]  # intermediate F16 deleted
    preset = PRESETS["smollm2-135m"]
    prof = facts_from_gguf(out)
    assert (prof.n_layers, prof.n_heads, prof.n_kv_heads, prof.head_dim, prof.hidden, prof.ffn) == (
        30, 9, 3, 64, 576, 1536)
    assert prof.vocab_size == preset.vocab_size
    assert prof.tied_embeddings is True
    assert abs(prof.params / preset.param_count() - 1) < 0.02
    assert prof.quant == "Q4_0"
    assert prof.tensor_types.get("Q4_0", 0) > 0.5 * prof.weight_bytes_total
    assert syn.SYNTH_DESCRIPTION in prof.name
    desc = gguf.GGUFReader(str(out)).get_field("general.description").contents()
    assert "timing only" in desc
    # Loadable, and the planner's prompts tokenize (noise out, under the grammar).
    engine = create_engine("llamacpp", model_path=str(out), n_threads=1, n_ctx=64,
                           abort_callback=False)
    try:
        trace = engine.generate(GenerationRequest(prompt=format_prompt("pick up the red cup"),
                                                  max_tokens=3, grammar=actions_gbnf()))
        assert trace.error is None
        assert trace.prompt_tokens == 7  # <s> pick up the red cup <plan>
        assert 1 <= len(trace.tokens) <= 3
    finally:
        engine.close()


def test_custom_shape_f16_untied_deterministic(tmp_path) -> None:
    shape = ModelShape(
        id="t", name="Tiny", architecture="llama", n_layers=2, hidden=128, n_heads=2,
        n_kv_heads=1, head_dim=64, ffn=256, vocab_size=build_vocab().size + 10,
        tied_embeddings=False, qkv_bias=False, context_length=256,
    )
    a = syn.synth(shape, "F16", tmp_path / "a.gguf", seed=1)
    b = syn.synth(shape, "F16", tmp_path / "b.gguf", seed=1)
    assert a.read_bytes() == b.read_bytes()
    prof = facts_from_gguf(a)
    assert prof.params == shape.param_count()
    assert prof.tied_embeddings is False
    assert prof.context_length == 256


def test_bad_inputs(tmp_path) -> None:
    with pytest.raises(syn.SynthError, match="unknown preset"):
        syn.synth("nope", "F16", tmp_path / "x.gguf")
    with pytest.raises(LadderError, match="valid:"):
        syn.synth("smollm2-135m", "Q9", tmp_path / "x.gguf")


def test_head_dim_not_hidden_over_heads_loads_and_decodes(tmp_path) -> None:
    """Qwen3's layout (16 heads of 128 in a 1024-wide model), reduced: 4 heads of 64, 192 wide."""
    shape = ModelShape(
        id="w", name="WideHeads", architecture="qwen3", n_layers=2, hidden=192, n_heads=4,
        n_kv_heads=2, head_dim=64, ffn=256, vocab_size=build_vocab().size + 3,
        tied_embeddings=True, qkv_bias=False, context_length=128,
    )
    assert shape.n_heads * shape.head_dim != shape.hidden
    out = syn.synth(shape, "F16", tmp_path / "w.gguf", seed=2)
    prof = facts_from_gguf(out)
    assert (prof.hidden, prof.n_heads, prof.n_kv_heads, prof.head_dim) == (192, 4, 2, 64)
    assert prof.params == shape.param_count()
    reader = gguf.GGUFReader(str(out))
    assert reader.get_field("llama.attention.key_length").contents() == 64
    (q,) = [t for t in reader.tensors if t.name == "blk.0.attn_q.weight"]
    assert list(q.shape) == [192, 256]  # ggml order: (in, out)
    engine = create_engine("llamacpp", model_path=str(out), n_threads=1, n_ctx=64,
                           abort_callback=False)
    try:
        trace = engine.generate(GenerationRequest(prompt=format_prompt("stop"), max_tokens=2,
                                                  grammar=actions_gbnf()))
        assert trace.error is None and 1 <= len(trace.tokens) <= 2
    finally:
        engine.close()
