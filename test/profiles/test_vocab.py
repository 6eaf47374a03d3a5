"""The shipped vocabulary-only tokenizers: real llama.cpp, no weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_latency.profiles.vocab import (
    FAMILY_CHAT_FORMATS,
    VOCAB_FILES,
    VocabError,
    VocabTokenizer,
    preset_chat_format,
    vocab_path,
)


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


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "vocab"


@pytest.mark.parametrize("family", sorted(VOCAB_FILES))
def test_each_shipped_tokenizer_gives_llama_cpps_own_test_vectors(family: str) -> None:
    """llama.cpp's own tokenizer test (tests/test-tokenizer-0: no BOS, specials as text) on its
    own vectors for the file, through the shipped copy: every text gives exactly its ids."""
    name = vocab_path(family).name
    texts = (FIXTURES / f"{name}.inp").read_text(encoding="utf-8").split(
        "\n__ggml_vocab_test__\n")
    lines = (FIXTURES / f"{name}.out").read_text(encoding="utf-8").split("\n")
    # both files end with a separator (a newline): nothing after it
    assert texts.pop() == "" and lines.pop() == ""
    assert len(lines) == len(texts) > 20
    with VocabTokenizer.for_family(family) as tok:
        for text, want in zip(texts, lines, strict=True):
            got = tok.tokenize(text, add_bos=False, special=False)
            assert got == [int(i) for i in want.split()], (family, text)


def test_llama3_and_phi3_vocabularies_and_their_templates() -> None:
    with VocabTokenizer.for_family("llama-bpe") as tok:
        assert tok.n_vocab == 128256
        assert tok.tokenize("<|start_header_id|>", special=True) == [128006]
        assert tok.tokenize("x", add_bos=True)[0] == 128000  # <|begin_of_text|>
    with VocabTokenizer.for_family("phi-3") as tok:
        assert tok.n_vocab == 32064
        assert tok.tokenize("<|user|>", special=True) == [32010]
    assert preset_chat_format("llama-3.2-1b") == "llama3"
    assert preset_chat_format("phi-3.5-mini") == "phi3"
    assert preset_chat_format("qwen2.5-0.5b") == "chatml"
    assert preset_chat_format("smollm2-360m") is None
    # every family's template is one this llama.cpp renders
    from robot_latency.profiles.chat import builtin_templates

    assert set(FAMILY_CHAT_FORMATS.values()) <= set(builtin_templates())
    assert set(FAMILY_CHAT_FORMATS) == set(VOCAB_FILES)
