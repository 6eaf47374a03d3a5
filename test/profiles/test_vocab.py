"""The shipped vocabulary-only tokenizers: real llama.cpp, no weights."""

from __future__ import annotations

import pytest

from robot_latency.profiles.vocab import VocabError, VocabTokenizer, vocab_path


def test_qwen2_vocabulary_loads_without_weights() -> None:
    with VocabTokenizer.for_family("qwen2") as tok:
        assert tok.n_vocab == 151936
        # chatml's control tokens are single ids when parsed as special, and text otherwise.
        ids = tok.tokenize("<|im_start|>user\nstop<|im_end|>", special=True)
        assert ids[0] == 151644 and ids[-1] == 151645
        assert len(tok.tokenize("<|im_start|>", special=False)) > 1
        text = '{"steps": [{"action": "stop"}]}'
        assert tok.detokenize(tok.tokenize(text)) == text
        assert tok.count(text) == len(tok.tokenize(text))


def test_unknown_family_and_missing_file_name_themselves(tmp_path) -> None:
    with pytest.raises(VocabError, match="'nope'"):
        vocab_path("nope")
    missing = tmp_path / "gone.gguf"
    with pytest.raises(VocabError, match=r"gone\.gguf"):
        VocabTokenizer(missing).open()
