"""The planner's tokenizer: a llama-style SentencePiece (SPM) vocabulary written into GGUF.

The vocabulary is designed, not learned:

* specials ``<unk>`` (UNKNOWN), ``<s>``, ``</s>``, ``<pad>``, ``<end>`` (CONTROL; ``<end>`` is EOS),
* ``<plan>`` and every action token (USER_DEFINED: llama.cpp always splits them out of the input
  text and renders them as their text, which the GBNF grammar matches),
* 256 byte-fallback tokens ``<0x00>`` .. ``<0xFF>`` (BYTE), so any input text tokenizes,
* single characters ``▁ a-z 0-9 '``,
* every prefix ``▁w[:k]`` of every grammar word ``w``.

llama.cpp's SPM tokenizer merges adjacent symbols whose concatenation is in the vocabulary. All
multi-character tokens start with ``▁``, so merging can only grow a word from its start, one
character at a time, through the prefix tokens: each grammar word becomes exactly one token, and
an unknown word becomes its longest known prefix plus characters (or bytes).

Training takes its tokenization from llama.cpp itself (a vocabulary-only GGUF loaded with
``vocab_only=True``), so training and inference agree by construction.

Prompt format (what the engine feeds)::

    tokenize(format_prompt(command), add_bos=True, special=True)
    == [<s>, ▁word, ▁word, ..., <plan>]

and the model then emits action tokens, stopping with ``<end>`` (EOS).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from robot_latency.errors import RobotLatencyError
from robot_latency.models.corpus import grammar_words, normalize_command
from robot_latency.profiles.actions import ACTION_TOKENS, END_TOKEN, PLAN_TOKEN

if TYPE_CHECKING:
    import gguf

__all__ = [
    "SPACE",
    "PlannerTokenizer",
    "TokenizerError",
    "Vocab",
    "build_vocab",
    "format_prompt",
    "prompt_tokens",
    "write_tokenizer_metadata",
    "write_vocab_gguf",
]

logger = logging.getLogger(__name__)

SPACE = "\u2581"  # SentencePiece's word-boundary marker "▁"

# gguf.TokenType values, repeated here so the module imports without gguf.
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6


class TokenizerError(RobotLatencyError, RuntimeError):
    """The tokenizer cannot be built or loaded, or tokenizes differently from its design."""


@dataclass(frozen=True)
class Vocab:
    """A designed vocabulary.

    Attributes:
        tokens: token texts, by id.
        scores: SPM merge scores, by id.
        types: gguf token types, by id.
    """

    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(set(self.tokens)) != len(self.tokens):
            raise TokenizerError("duplicate token texts in the vocabulary")

    @property
    def size(self) -> int:
        """Return the number of tokens."""
        return len(self.tokens)

    def id(self, text: str) -> int:
        """Return the id of a token text.

        Args:
            text: e.g. ``"<end>"`` or ``"▁pick"``.

        Returns:
            The token id.

        Raises:
            KeyError: the text is not a token.
        """
        return self._index()[text]

    def _index(self) -> dict[str, int]:
        cached = self.__dict__.get("_idx")
        if cached is None:
            cached = {t: i for i, t in enumerate(self.tokens)}
            object.__setattr__(self, "_idx", cached)
        return cached

    @property
    def unk_id(self) -> int:
        """Return ``<unk>``'s id."""
        return self.id("<unk>")

    @property
    def bos_id(self) -> int:
        """Return ``<s>``'s id."""
        return self.id("<s>")

    @property
    def pad_id(self) -> int:
        """Return ``<pad>``'s id."""
        return self.id("<pad>")

    @property
    def eos_id(self) -> int:
        """Return ``<end>``'s id (the model's EOS)."""
        return self.id(END_TOKEN)

    @property
    def plan_id(self) -> int:
        """Return ``<plan>``'s id."""
        return self.id(PLAN_TOKEN)

    def output_ids(self) -> list[int]:
        """Return the ids the model may emit after ``<plan>``: action tokens and ``<end>``."""
        return [self.id(t) for t in (*ACTION_TOKENS, END_TOKEN)]


def build_vocab(words: Iterable[str] | None = None) -> Vocab:
    """Build the planner vocabulary.

    Args:
        words: whole words to give one token each; defaults to ``corpus.grammar_words()``.

    Returns:
        The vocabulary (a few hundred tokens).
    """
    words = sorted(set(grammar_words() if words is None else words))
    tokens: list[str] = []
    types: list[int] = []

    def add(text: str, ttype: int) -> None:
        if text not in seen:
            seen.add(text)
            tokens.append(text)
            types.append(ttype)

    seen: set[str] = set()
    add("<unk>", _UNKNOWN)
    add("<s>", _CONTROL)
    add("</s>", _CONTROL)
    add("<pad>", _CONTROL)
    add(END_TOKEN, _CONTROL)
    add(PLAN_TOKEN, _USER_DEFINED)
    for tok in ACTION_TOKENS:
        add(tok, _USER_DEFINED)
    for b in range(256):
        add(f"<0x{b:02X}>", _BYTE)
    for ch in [SPACE, *"abcdefghijklmnopqrstuvwxyz0123456789'"]:
        add(ch, _NORMAL)
    for word in words:
        for k in range(1, len(word) + 1):
            add(SPACE + word[:k], _NORMAL)
    # Scores only order competing merges; merges here never compete, but keep longer pieces
    # preferred, as a trained SPM model would.
    scores = [
        float(len(tok)) - 100.0 if t == _NORMAL else 0.0
        for tok, t in zip(tokens, types, strict=True)
    ]
    return Vocab(tokens=tuple(tokens), scores=tuple(scores), types=tuple(types))


def write_tokenizer_metadata(writer: gguf.GGUFWriter, vocab: Vocab) -> None:
    """Write llama.cpp's tokenizer keys (``tokenizer.ggml.*``, SPM "llama" model).

    Args:
        writer: an open GGUF writer, before its header is written.
        vocab: the vocabulary.
    """
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_eot_token_id(vocab.eos_id)
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)


def copy_tokenizer_metadata(writer: gguf.GGUFWriter, source: str | Path) -> int:
    """Copy every ``tokenizer.*`` key of the GGUF ``source`` (a real model's BPE vocabulary, its
    merges, pre-tokenizer, special ids and chat template); return its number of tokens."""
    import gguf as gguf_mod

    from robot_latency.floor.gguf_reader import GGUFReader

    reader = GGUFReader(str(source))
    n_tokens = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            n_tokens = len(value)
        if vtype == gguf_mod.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    return n_tokens


def tokenizer_model(source: str | Path) -> str:
    """Return a GGUF's ``tokenizer.ggml.model`` (``llama``: the planner's own word vocabulary;
    ``gpt2``: a real model's BPE, e.g. Qwen2's)."""
    from robot_latency.floor.gguf_reader import GGUFReader

    field = GGUFReader(str(source)).get_field("tokenizer.ggml.model")
    return str(field.contents()) if field is not None else "llama"


def write_vocab_gguf(path: str | Path, vocab: Vocab | None = None) -> Path:
    """Write a vocabulary-only GGUF (llama hyper-parameters of a 1-layer stub, no tensors).

    Args:
        path: where to write.
        vocab: the vocabulary; defaults to ``build_vocab()``.

    Returns:
        The path written.
    """
    import gguf

    vocab = vocab or build_vocab()
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("robot_latency planner tokenizer")
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(1)
    writer.add_head_count_kv(1)
    writer.add_rope_dimension_count(64)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab.size)
    write_tokenizer_metadata(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def format_prompt(command: str) -> str:
    """Return the prompt text for a command (tokenize it with ``special=True``, ``add_bos=True``).

    Args:
        command: raw operator text.

    Returns:
        ``normalize_command(command) + "<plan>"``, e.g. ``"stop<plan>"``.
    """
    return normalize_command(command) + PLAN_TOKEN


def prompt_tokens(llm: Any, command: str) -> list[int]:
    """Tokenize a command's prompt with a loaded ``llama_cpp.Llama``.

    Args:
        llm: a ``llama_cpp.Llama`` (full model or ``vocab_only``) whose vocabulary is the planner's.
        command: raw operator text.

    Returns:
        ``[<s>, words..., <plan>]`` as ids.
    """
    return list(llm.tokenize(format_prompt(command).encode("utf-8"), add_bos=True, special=True))


class PlannerTokenizer:
    """llama.cpp's tokenizer over the planner vocabulary (a context manager).

    Args:
        vocab: the vocabulary; defaults to ``build_vocab()``.
        workdir: where to write the vocabulary-only GGUF; a temporary directory by default.
    """

    def __init__(self, vocab: Vocab | None = None, *, workdir: str | Path | None = None) -> None:
        import tempfile

        import llama_cpp

        self.vocab = vocab or build_vocab()
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="planner-vocab-")
            workdir = self._tmp.name
        self.path = write_vocab_gguf(Path(workdir) / "planner-vocab.gguf", self.vocab)
        try:
            self._llm = llama_cpp.Llama(str(self.path), vocab_only=True, verbose=False)
        except Exception as err:
            raise TokenizerError(
                f"llama.cpp could not load the vocabulary {self.path}: {err}"
            ) from err

    def encode_prompt(self, command: str) -> list[int]:
        """Tokenize a command's prompt exactly as the engine will.

        Args:
            command: raw operator text.

        Returns:
            ``[<s>, words..., <plan>]`` as ids.
        """
        return prompt_tokens(self._llm, command)

    def encode_prompts(self, commands: Sequence[str]) -> list[list[int]]:
        """Tokenize many prompts (see :meth:`encode_prompt`)."""
        return [self.encode_prompt(c) for c in commands]

    def decode(self, ids: Sequence[int]) -> str:
        """Return the text of token ids (action tokens render as their text)."""
        return "".join(self.vocab.tokens[i] for i in ids).replace(SPACE, " ")

    def check_words(self, words: Iterable[str] | None = None) -> None:
        """Check that every grammar word tokenizes to its own single token.

        Args:
            words: defaults to ``corpus.grammar_words()``.

        Raises:
            TokenizerError: a word does not become one token.
        """
        for word in grammar_words() if words is None else words:
            ids = self.encode_prompt(word)
            expected = [self.vocab.bos_id, self.vocab.id(SPACE + word), self.vocab.plan_id]
            if ids != expected:
                got = [self.vocab.tokens[i] for i in ids]
                raise TokenizerError(f"word {word!r} tokenized as {got}")

    def close(self) -> None:
        """Free llama.cpp's handle and the temporary directory."""
        llm = getattr(self, "_llm", None)
        if llm is not None:
            llm.close()
            self._llm = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> PlannerTokenizer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
