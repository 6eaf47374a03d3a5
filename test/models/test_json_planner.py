"""The shipped JSON planner through the project's llama.cpp engine: files, token counts, accuracy.

The full-vocabulary GGUF is built from the shipped compact file into a temporary model cache
(as a run does on first use), then planned with exactly as a run plans: the ``bundled-json``
profile's prefix and per-cycle part, greedy decoding under the schema's grammar, the contract's
parser. No torch needed.
"""

from __future__ import annotations

import pytest

from robot_latency.digest import sha256_file
from robot_latency.engines.base import GenerationRequest
from robot_latency.engines.llamacpp import LlamaCppEngine
from robot_latency.engines.llamacpp_config import LlamaCppConfig
from robot_latency.models import bundled
from robot_latency.models.corpus import corpus_config_from_dict, generate_corpus
from robot_latency.models.json_corpus import JSON_PROFILE, plan_text
from robot_latency.profiles.actions import is_refusal
from robot_latency.profiles.contract import complete_plan
from robot_latency.profiles.profile import load_planning
from robot_latency.profiles.vocab import VocabTokenizer

#: Held-out commands the suite plans: 100, not the 30 it took until the planner reached its
#: target. On 30 one command is 3.3 points, so 95% (29 of 30) cannot be told from 93%; the
#: shipped planner's 95.0% on 300 (docs/bench/json_planner_phase10_eval300.json) gets fewer
#: than 29 of the first 30 and 97 of the first 100. The bar is the same 95%; 100 take about 20 s
#: more.
N_HELDOUT = 100
#: ... of which the first ones the in-domain refusal check took before (none refused there).
N_HELDOUT_BEFORE = 30
N_REFUSE = 20


@pytest.fixture(scope="module")
def manifest():
    return bundled.load_json_manifest()


@pytest.fixture(scope="module")
def full_path(tmp_path_factory):
    return bundled.bundled_json_path(cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def corpus(manifest):
    return generate_corpus(corpus_config_from_dict(manifest["corpus"]))


@pytest.fixture(scope="module")
def planning():
    return load_planning(JSON_PROFILE)


@pytest.fixture(scope="module")
def engine(full_path, planning):
    eng = LlamaCppEngine(LlamaCppConfig(model_path=str(full_path), n_threads=2,
                                        warm_prefix=planning.prefix, max_suffix_tokens=64,
                                        max_new_tokens=planning.max_tokens))
    yield eng
    eng.close()


def _plan(engine, planning, text):
    prompt = planning.build(text)
    return prompt, engine.generate(GenerationRequest(
        prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
        grammar=planning.contract.grammar, complete=planning.contract.kind))


def test_files_match_the_manifest_and_the_full_build_is_deterministic(manifest, full_path):
    compact = bundled.MODELS_DIR / manifest["compact"]["file"]
    assert sha256_file(compact) == manifest["compact"]["sha256"]
    assert compact.stat().st_size < 8_000_000  # the repository holds the compact form only
    assert sha256_file(full_path) == manifest["full"]["sha256"]
    assert bundled.bundled_json_path(cache_dir=full_path.parent) == full_path  # reused


def test_token_counts_are_qwen2s_for_the_same_text(engine, planning, corpus):
    with VocabTokenizer.for_family("qwen2") as tok:
        for cmd in corpus.heldout[:4] + corpus.refuse_heldout[:2]:
            prompt, trace = _plan(engine, planning, cmd.text)
            assert trace.error is None
            assert prompt.prefix.startswith("<|im_start|>system\n")
            assert trace.prompt_tokens == (tok.count(prompt.prefix, add_bos=True)
                                           + tok.count(prompt.suffix))
            # The plan's tokens are the tokenizer's own tokenization of the text written.
            assert trace.tokens == tok.tokenize(trace.text, special=False)
            assert len(trace.tokens) == tok.count(trace.text, special=False)


@pytest.fixture(scope="module")
def sample(engine, planning, corpus):
    """(command, text, plan) of the first held-out in-domain and out-of-domain commands."""
    def run(commands):
        out = []
        for cmd in commands:
            _, trace = _plan(engine, planning, cmd.text)
            out.append((cmd, trace.text, complete_plan(planning.contract, trace.text)))
        return out
    return run(corpus.heldout[:N_HELDOUT]), run(corpus.refuse_heldout[:N_REFUSE])


def test_refusals_with_the_grammar(sample):
    held, ood = sample
    assert all(plan is not None for _, _, plan in held + ood)  # the grammar: always valid
    assert sum(is_refusal(plan) for _, _, plan in ood) >= 0.95 * N_REFUSE
    assert sum(is_refusal(plan) for _, _, plan in held) <= 0.01 * N_HELDOUT
    assert not any(is_refusal(plan) for _, _, plan in held[:N_HELDOUT_BEFORE])


def test_heldout_exact_match_with_the_grammar(sample):
    held, _ = sample
    assert sum(text == plan_text(cmd) for cmd, text, _ in held) >= 0.95 * N_HELDOUT
