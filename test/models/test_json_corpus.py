"""The JSON planner's corpus, model pieces and full-vocabulary export, on small real files.

Real Qwen2 tokenizer (the shipped vocabulary-only GGUF), real llama.cpp; torch for the model.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from robot_latency.llama_load import load_policy, open_llama
from robot_latency.models.corpus import CorpusConfig, generate_corpus
from robot_latency.models.export import GGUFShape
from robot_latency.models.json_corpus import END_OF_TURN, build_json_corpus, plan_text
from robot_latency.models.json_export import build_full, read_compact, write_compact
from robot_latency.models.json_train import TokenMap, _unk_head, greedy_json, token_map
from robot_latency.models.torch_llama import LlamaModel
from robot_latency.profiles.actions import REFUSE_PLAN, is_refusal
from robot_latency.profiles.profile import load_planning
from robot_latency.profiles.vocab import VocabTokenizer, vocab_path

SMALL = CorpusConfig(n_train=60, n_heldout=10, n_refuse_train=10, n_refuse_heldout=5)


@pytest.fixture(scope="module")
def tok():
    with VocabTokenizer.for_family("qwen2") as t:
        yield t


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(SMALL)


@pytest.fixture(scope="module")
def jcorpus(corpus, tok):
    return build_json_corpus(corpus, tok)


def test_plan_text_is_compact_canonical_json_the_contract_accepts(corpus):
    contract = load_planning("bundled-json").contract
    for c in corpus.train + corpus.refuse_train:
        text = plan_text(c)
        assert " " not in text  # the grammar admits no optional whitespace
        plan = contract.parse(text)
        assert list(plan["steps"][0]) == ["action", "target", "target_kind", "color", "speed"]
    refusal = corpus.refuse_train[0]
    assert json.loads(plan_text(refusal)) == REFUSE_PLAN
    assert is_refusal(contract.parse(plan_text(refusal)))


def test_rows_are_the_profiles_prompt_and_the_plan_in_qwen2_ids(jcorpus, corpus, tok):
    planning = load_planning("bundled-json")
    assert planning.profile.chat_format == "chatml"
    assert jcorpus.prefix == tuple(tok.tokenize(planning.prefix, add_bos=True, special=True))
    assert tok.detokenize(jcorpus.prefix).startswith("<|im_start|>system\n")
    assert 400 <= len(jcorpus.prefix) <= 600  # an instruct model's system prompt, not a stub
    assert jcorpus.end_of_turn == tok.tokenize(END_OF_TURN)[0]
    assert len(jcorpus.train) == len(corpus.train) + len(corpus.refuse_train)
    for row in jcorpus.train[:20] + jcorpus.heldout + jcorpus.refuse_heldout:
        suffix = tok.detokenize(row.suffix)
        assert suffix == f"<|im_start|>user\n{row.command.text}<|im_end|>\n<|im_start|>assistant\n"
        assert tok.detokenize(row.answer) == plan_text(row.command) + END_OF_TURN
        assert row.answer[-1] == jcorpus.end_of_turn
    assert all(is_refusal(json.loads(plan_text(r.command))) for r in jcorpus.refuse_heldout)


def test_forward_cached_after_a_shared_prefix_equals_the_whole_sequence():
    torch.manual_seed(0)
    shape = GGUFShape(vocab_size=50, dim=64, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=96)
    model = LlamaModel(shape).eval()
    prefix = torch.randint(0, 50, (1, 9))
    rows = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        _, past = model.forward_cached(prefix)
        cached, _ = model.forward_cached(rows, past)
        whole = model(torch.cat((prefix.expand(3, -1), rows), dim=1))[:, 9:]
    torch.testing.assert_close(cached, whole, atol=1e-5, rtol=1e-4)


def test_unk_column_is_all_unused_ids_together():
    tmap = TokenMap(ids=(3, 7, 11), n_vocab=1000)
    logits = torch.zeros(1, 4)
    out = _unk_head(logits, tmap)
    assert out[0, tmap.unk] == pytest.approx(math.log(997))
    assert tmap.compact([7, 5]) == [1, tmap.unk] and tmap.real([2, 3]) == [11, -1]


def _tiny_compact(jcorpus, tok, tmp_path, *, seed: int):
    """A random one-layer model over the corpus's id map, written as a compact GGUF."""
    tmap = token_map(jcorpus, tok.n_vocab)
    torch.manual_seed(seed)
    shape = GGUFShape(vocab_size=tmap.size, dim=32, n_layers=1, n_heads=1, n_kv_heads=1,
                      ffn_dim=64, context_length=1024)
    model = LlamaModel(shape).eval()
    return tmap, shape, model, write_compact(tmp_path / "c.gguf", shape, model.gguf_tensors(),
                                             tmap)


def test_full_export_places_rows_at_real_ids_and_matches_torch_in_llama_cpp(jcorpus, tok,
                                                                           tmp_path):
    import llama_cpp

    tmap, _, model, compact = _tiny_compact(jcorpus, tok, tmp_path, seed=1)
    assert read_compact(compact)[2] == list(tmap.ids)
    full = build_full(compact, tmp_path / "full.gguf")
    llm = open_llama(load_policy(), model_path=str(full), n_ctx=1024, logits_all=True,
                     verbose=False,
                     n_threads=2, type_k=llama_cpp.GGML_TYPE_F32,
                     type_v=llama_cpp.GGML_TYPE_F32)
    try:
        assert llm.n_vocab() == tok.n_vocab == 151_936
        meta = llm.metadata
        assert meta["tokenizer.ggml.pre"] == "qwen2"
        assert meta["tokenizer.chat_template"] == tok.open()._llama.metadata[
            "tokenizer.chat_template"]
        row = jcorpus.heldout[0]
        ids = list(jcorpus.prefix[-40:]) + list(row.suffix)  # a short window: positions 0..
        assert llm.tokenize(tok.detokenize(ids).encode(), add_bos=False, special=True) == ids
        llm.eval(ids)
        got = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
        with torch.no_grad():
            want = model(torch.tensor([tmap.compact(ids)]))[0, -1].numpy()
        mapped = np.asarray(tmap.ids)
        np.testing.assert_allclose(got[mapped], want[:-1], atol=2e-2)  # F16 weights
        unmapped = np.ones(len(got), dtype=bool)
        unmapped[mapped] = False
        assert np.all(got[unmapped] == 0.0)  # zero output rows: logit 0 each
    finally:
        llm.close()
    assert vocab_path("qwen2").stat().st_size < full.stat().st_size


def test_greedy_json_stops_on_an_unused_id(jcorpus, tok):
    tmap = token_map(jcorpus, tok.n_vocab)
    shape = GGUFShape(vocab_size=tmap.size, dim=32, n_layers=1, n_heads=1, n_kv_heads=1,
                      ffn_dim=64, context_length=1024)
    model = LlamaModel(shape).eval()  # untrained: logits ~0 < log(n_unused), UNK wins
    outs = greedy_json(model, tmap, jcorpus.prefix, [r.suffix for r in jcorpus.heldout[:2]],
                       end=jcorpus.end_of_turn, max_new=5)
    assert outs == [[-1], [-1]]


def test_training_starts_from_a_compact_gguf_of_the_same_id_map(jcorpus, tok, tmp_path):
    from robot_latency.models.json_train import _init_state

    tmap, _, model, compact = _tiny_compact(jcorpus, tok, tmp_path, seed=2)
    state = _init_state(compact, tmap)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(state[name], value, atol=2e-3, rtol=0)  # stored as F16
    other = TokenMap(tmap.ids[:-1], tmap.n_vocab)
    with pytest.raises(ValueError, match=r"c\.gguf: its id map"):
        _init_state(compact, other)
