"""The planner tokenizer under llama.cpp: one token per word, byte fallback, prompt format."""

from __future__ import annotations

import gguf  # noqa: F401  (a hard requirement: a missing one fails)
import llama_cpp  # noqa: F401  (a hard requirement: a missing one fails)
import pytest

from robot_latency.models.corpus import grammar_words
from robot_latency.models.tokenizer import SPACE, PlannerTokenizer, build_vocab, format_prompt
from robot_latency.profiles.actions import ACTION_TOKENS


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    with PlannerTokenizer(workdir=tmp_path_factory.mktemp("vocab")) as t:
        yield t


def test_vocab_is_small_and_complete() -> None:
    vocab = build_vocab()
    assert vocab.size < 1000
    for t in ACTION_TOKENS:
        vocab.id(t)
    assert vocab.id("<0x00>") and vocab.id("<0xFF>")


def test_every_grammar_word_is_one_token(tok) -> None:
    tok.check_words()
    assert len(grammar_words()) > 100


def test_prompt_format(tok) -> None:
    v = tok.vocab
    ids = tok.encode_prompt("Pick up the red cup!")
    assert format_prompt("Pick up the red cup!") == "pick up the red cup<plan>"
    assert ids == [v.bos_id] + [v.id(SPACE + w) for w in "pick up the red cup".split()] + [
        v.plan_id
    ]


def test_any_text_tokenizes_without_unk(tok) -> None:
    for text in ["zebra crossing 42", "pick up the cups", "go to the moon quickly"]:
        ids = tok.encode_prompt(text)
        assert tok.vocab.unk_id not in ids
        assert tok.decode(ids[1:-1]).strip() == text
