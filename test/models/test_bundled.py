"""The shipped planner GGUFs under llama.cpp: manifest, accuracy, grammar-constrained output.

Runs without torch: accuracy is recomputed here on held-out commands regenerated from the corpus
seed recorded in the manifest.
"""

from __future__ import annotations

import hashlib
import json

import gguf
import llama_cpp
import pytest

from robot_latency.models import bundled
from robot_latency.models.corpus import corpus_config_from_dict, generate_corpus
from robot_latency.models.evaluate import GGUFPlanner, acceptance_rate, exact_match
from robot_latency.models.tokenizer import build_vocab
from robot_latency.profiles.actions import expand_to_plan, parse_actions, validate_plan

N_EVAL = 200


@pytest.fixture(scope="module")
def manifest():
    return bundled.load_manifest()


@pytest.fixture(scope="module")
def heldout(manifest):
    c = manifest["corpus"]
    cfg = corpus_config_from_dict(c)
    return generate_corpus(cfg).heldout[:N_EVAL]


@pytest.fixture(scope="module")
def target():
    with GGUFPlanner(bundled.bundled_model_path()) as p:
        yield p


@pytest.fixture(scope="module")
def draft():
    with GGUFPlanner(bundled.bundled_draft_path()) as p:
        yield p


def test_manifest_matches_files(manifest) -> None:
    total = 0
    for model in manifest["models"].values():
        path = bundled.MODELS_DIR / model["file"]
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == model["sha256"], path
        assert len(data) == model["size_bytes"]
        total += len(data)
    total += (bundled.MODELS_DIR / "manifest.json").stat().st_size
    assert total < 50 * 1024 * 1024
    json.dumps(manifest)
    assert manifest["prompt"]["stop_token"] == "<end>"


def test_shipped_tokenizer_is_the_designed_one() -> None:
    vocab = build_vocab()
    for name in ("planner", "planner-draft"):
        reader = gguf.GGUFReader(str(bundled.bundled_model_path(name)))
        f = reader.fields["tokenizer.ggml.tokens"]
        tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        assert tuple(tokens) == vocab.tokens
        eos = reader.fields["tokenizer.ggml.eos_token_id"]
        assert int(eos.parts[eos.data[0]][0]) == vocab.eos_id


def test_target_heldout_exact_match(target, heldout, manifest) -> None:
    res = exact_match(target, heldout)
    assert res.n == N_EVAL
    recorded = manifest["models"]["target"]["heldout_exact_match"]
    print(f"target exact match {res.accuracy:.3f} on {res.n} (manifest: {recorded})")
    # 0.959 on all 1000 before the planner learned to refuse; the fine-tune that taught <refuse>
    # cost a point and a half (0.945), and a longer one from those weights gave it back (0.983)
    assert res.accuracy >= 0.95
    assert res.parsed == res.n


def test_grammar_constrained_output_parses(target, heldout) -> None:
    grammar = llama_cpp.LlamaGrammar.from_string(bundled.load_grammar_text(), verbose=False)
    for cmd in heldout[:10]:
        text = target.complete(cmd.text, grammar=grammar)
        steps = parse_actions(text)
        validate_plan(expand_to_plan(steps))


def test_grammar_constrains_the_draft(draft, heldout) -> None:
    # The draft is weaker; the grammar must still force a parseable plan out of it.
    grammar = llama_cpp.LlamaGrammar.from_string(bundled.load_grammar_text(), verbose=False)
    for cmd in heldout[:10]:
        parse_actions(draft.complete(cmd.text, grammar=grammar))


def test_draft_acceptance(target, draft, heldout) -> None:
    rate = acceptance_rate(target, draft, heldout[:20])
    assert rate is not None and 0.5 < rate <= 1.0


def test_stop_command(target) -> None:
    vocab = build_vocab()
    out = target.greedy("Stop!")
    assert [vocab.tokens[i] for i in out] == ["<stop>", "<end>"]


def test_shipped_model_tokenizes_prompts_as_designed(target, heldout) -> None:
    from robot_latency.models.tokenizer import SPACE

    vocab = build_vocab()
    for cmd in heldout:
        words = [vocab.id(SPACE + w) for w in cmd.text.split()]
        assert target.prompt(cmd.text) == [vocab.bos_id, *words, vocab.plan_id]
