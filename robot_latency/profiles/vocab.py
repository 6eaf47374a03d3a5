"""Real tokenizers without weights: the vocabulary-only GGUF files shipped in ``data/vocab/``.

A vocabulary-only GGUF (llama.cpp's ``models/ggml-vocab-*.gguf``) holds a model family's tokenizer
and nothing else. llama.cpp loads it with ``vocab_only=True`` and tokenizes exactly as it does for
a full model of that family, so prompt and plan token counts come from the family's real
tokenizer, not from a characters-per-token guess.

Usage::

    with VocabTokenizer.for_family("qwen2") as tok:
        n = tok.count(prompt_text, add_bos=False, special=True)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from robot_latency.errors import RobotLatencyError

__all__ = ["FAMILY_CHAT_FORMATS", "PRESET_TOKENIZERS", "VOCAB_DIR", "VOCAB_FILES", "VocabError",
           "VocabTokenizer", "preset_chat_format", "preset_family", "tokenizer_for_model",
           "vocab_path"]

logger = logging.getLogger(__name__)

VOCAB_DIR = Path(__file__).resolve().parent.parent / "data" / "vocab"

#: family name -> shipped vocabulary-only GGUF (llama-cpp-python 0.3.36's vendor/llama.cpp/models).
VOCAB_FILES: dict[str, str] = {
    "qwen2": "ggml-vocab-qwen2.gguf",
    "llama-bpe": "ggml-vocab-llama-bpe.gguf",
    "phi-3": "ggml-vocab-phi-3.gguf",
}

#: family -> the llama.cpp chat template its instruction-tuned models are prompted with (a
#: built-in template name, :mod:`robot_latency.profiles.chat`): Qwen2.5-Instruct chatml,
#: Llama-3.x-Instruct llama3, Phi-3.5-mini-instruct phi3.
FAMILY_CHAT_FORMATS: dict[str, str] = {
    "qwen2": "chatml",
    "llama-bpe": "llama3",
    "phi-3": "phi3",
}

#: Model presets (floor/shapes.py ids, by prefix) -> the shipped tokenizer family they use. Only
#: families whose tokenizer ships: Qwen2.5 writes with the Qwen2 tokenizer (the same BPE and
#: special tokens); Llama 3, 3.1 and 3.2 share one 128,256-id BPE tokenizer (llama.cpp's
#: ``llama-bpe`` pre-tokenizer); Phi-3.5-mini keeps Phi-3's 32,064-id SentencePiece vocabulary.
#: Left out, because a count from another tokenizer would not be theirs: Qwen3 and the
#: DeepSeek-R1 distills of Qwen2.5 (other special tokens and pre-tokenizer), Llama 2 and
#: TinyLlama (SentencePiece, no chat template of their own in the base models), SmolLM2 and
#: Gemma 2 (no vocabulary file of theirs in llama.cpp's models/).
PRESET_TOKENIZERS: dict[str, str] = {
    "qwen2.5-": "qwen2",
    "llama-3-": "llama-bpe",
    "llama-3.1-": "llama-bpe",
    "llama-3.2-": "llama-bpe",
    "phi-3.5-": "phi-3",
}


class VocabError(RobotLatencyError, ValueError):
    """An unknown tokenizer family, or a vocabulary file that is missing or unreadable."""


def vocab_path(family: str) -> Path:
    """Return the shipped vocabulary-only GGUF of a tokenizer family.

    Raises:
        VocabError: the family is unknown or its file is missing.
    """
    name = VOCAB_FILES.get(family)
    if name is None:
        raise VocabError(f"no shipped tokenizer for family {family!r}; known: "
                         f"{sorted(VOCAB_FILES)}")
    path = VOCAB_DIR / name
    if not path.is_file():
        raise VocabError(f"tokenizer file missing: {path}")
    return path


def preset_family(preset: str) -> str | None:
    """Return the shipped tokenizer family of a model preset id, or None when none ships."""
    key = preset.strip().lower()
    return next((fam for prefix, fam in PRESET_TOKENIZERS.items() if key.startswith(prefix)),
                None)


def preset_chat_format(preset: str) -> str | None:
    """Return the chat template a model preset's instruct model is prompted with (its shipped
    tokenizer family's, :data:`FAMILY_CHAT_FORMATS`), or None for a preset without one."""
    family = preset_family(preset)
    return None if family is None else FAMILY_CHAT_FORMATS.get(family)


def tokenizer_for_model(model: str | Path) -> VocabTokenizer:
    """Return an (unopened) tokenizer for a model: a GGUF file's own vocabulary (loaded
    vocabulary-only, no weights), or the shipped tokenizer of a preset's family.

    Raises:
        VocabError: a preset whose family has no shipped tokenizer (names the families that do).
    """
    if Path(model).is_file():
        return VocabTokenizer(model)
    family = preset_family(str(model))
    if family is None:
        known = ", ".join(p + "*" for p in PRESET_TOKENIZERS)
        raise VocabError(f"model {model}: no shipped tokenizer for it (presets with one: "
                         f"{known}); give its GGUF file, whose vocabulary alone is read "
                         "(predict --from-labels)")
    return VocabTokenizer.for_family(family)


class VocabTokenizer:
    """A llama.cpp tokenizer loaded from a GGUF with ``vocab_only=True`` (no weights)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._llama: Any = None

    @classmethod
    def for_family(cls, family: str) -> VocabTokenizer:
        """Return an (unopened) tokenizer for a shipped family (see :data:`VOCAB_FILES`)."""
        return cls(vocab_path(family))

    def open(self) -> VocabTokenizer:
        """Load the vocabulary (idempotent)."""
        if self._llama is None:
            import llama_cpp

            if not self.path.is_file():
                raise VocabError(f"tokenizer file missing: {self.path}")
            try:
                self._llama = llama_cpp.Llama(model_path=str(self.path), vocab_only=True,
                                              verbose=False)
            except (ValueError, RuntimeError) as err:
                raise VocabError(f"cannot load tokenizer {self.path}: {err}") from err
        return self

    def close(self) -> None:
        """Free the vocabulary."""
        if self._llama is not None:
            self._llama.close()
            self._llama = None

    def __enter__(self) -> VocabTokenizer:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def n_vocab(self) -> int:
        """The vocabulary size (ids ``0 .. n_vocab - 1``)."""
        return int(self.open()._llama.n_vocab())

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        """Return the token ids of ``text`` (``special``: control tokens such as
        ``<|im_start|>`` are parsed as themselves)."""
        return list(self.open()._llama.tokenize(text.encode("utf-8"), add_bos=add_bos,
                                                special=special))

    def count(self, text: str, *, add_bos: bool = False, special: bool = True) -> int:
        """Return how many tokens ``text`` is."""
        return len(self.tokenize(text, add_bos=add_bos, special=special))

    def detokenize(self, ids: Sequence[int]) -> str:
        """Return the text of ``ids`` (special tokens rendered as their text)."""
        return self.open()._llama.detokenize(list(ids), special=True).decode("utf-8",
                                                                             errors="replace")
