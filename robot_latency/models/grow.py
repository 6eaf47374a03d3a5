"""Start a build from the shipped weights when the vocabulary is the same or only grew.

A new output token (``<refuse>``, say) shifts the ids of every token after it, so the old
embedding and output rows are copied by token text into the new vocabulary; a new token's rows
start as the mean of the old output tokens' rows (embedding) and as a small copy of it (output).
The blocks are copied as they are. Fine-tuning the grown model on the new corpus teaches the new
token at a fraction of a from-scratch build's steps. The old vocabulary is read from the file
(``tokenizer.ggml.tokens``), so the same call continues training a model whose vocabulary did
not change.
"""

from __future__ import annotations

from pathlib import Path

import torch

from robot_latency.floor.gguf_reader import GGUFReader
from robot_latency.models.export import GGUFShape
from robot_latency.models.tokenizer import Vocab
from robot_latency.models.torch_llama import LlamaModel
from robot_latency.profiles.actions import ACTION_TOKENS

__all__ = ["gguf_tokens", "grown_model"]


def gguf_tokens(path: str | Path) -> tuple[str, ...]:
    """Return the vocabulary a GGUF file carries (``tokenizer.ggml.tokens``).

    Raises:
        ValueError: the file has no ``tokenizer.ggml.tokens``.
    """
    field = GGUFReader(str(path)).fields.get("tokenizer.ggml.tokens")
    if field is None:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens")
    return tuple(bytes(field.parts[i]).decode("utf-8") for i in field.data)


def grown_model(path: str | Path, vocab: Vocab, old_tokens: tuple[str, ...] | None = None
                ) -> LlamaModel:
    """Return the model at ``path`` grown to ``vocab`` (or as it is, where the two agree).

    Args:
        path: a GGUF written by :func:`robot_latency.models.export.export_gguf`.
        vocab: the vocabulary to grow to.
        old_tokens: the file's vocabulary (default: read from the file).

    Raises:
        ValueError: the file's vocabulary size is not ``len(old_tokens)``, or a token of the old
            vocabulary is missing from the new one.
    """
    old = LlamaModel.from_gguf(path)
    if old_tokens is None:
        old_tokens = gguf_tokens(path)
    if old.shape.vocab_size != len(old_tokens):
        raise ValueError(f"{path}: vocabulary of {old.shape.vocab_size} tokens, "
                         f"expected {len(old_tokens)}")
    new_id = {t: i for i, t in enumerate(vocab.tokens)}
    missing = [t for t in old_tokens if t not in new_id]
    if missing:
        raise ValueError(f"{path}: tokens {missing[:5]} are not in the new vocabulary")
    shape = GGUFShape(**{**old.shape.__dict__, "vocab_size": len(vocab.tokens)})
    model = LlamaModel(shape)
    state = old.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            if name in ("token_embd.weight", "output.weight"):
                continue
            model.state_dict()[name].copy_(value)
        ids_old = torch.tensor(range(len(old_tokens)))
        ids_new = torch.tensor([new_id[t] for t in old_tokens])
        acts = torch.tensor([i for i, t in enumerate(old_tokens) if t in ACTION_TOKENS])
        for name, scale in (("token_embd.weight", 1.0), ("output.weight", 0.1)):
            src, dst = state[name], model.state_dict()[name]
            dst.copy_(src[acts].mean(0, keepdim=True).expand_as(dst) * scale)
            dst[ids_new] = src[ids_old]
    return model.eval()
