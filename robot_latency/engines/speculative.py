"""Speculative decoding at batch 1: the drafters.

A drafter proposes up to k tokens; the target scores them all in one pass and keeps the longest
prefix its own greedy choice agrees with, plus one token of its own. At temperature 0 the output is
exactly the target's (docs/REFERENCE.md, "Speculative decoding"). The verify loop lives in the
llama.cpp engine, which owns the target's KV cache; this module holds what is independent of it:

* :class:`DraftModelDrafter` — a second, smaller llama.cpp model drafting greedily (with the same
  grammar as the target, which raises acceptance);
* :class:`PromptLookupDrafter` — n-gram lookup in the context (llama-cpp-python's
  ``LlamaPromptLookupDecoding``).

The per-round counters and the alpha / c / speed-up arithmetic are
:class:`robot_latency.stats.SpecStats`, shared with the run summary.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from robot_latency.engines.base import EngineError
from robot_latency.llama_load import LoadPolicy, load_policy, open_llama

log = logging.getLogger(__name__)


class Drafter(Protocol):
    """Proposes tokens to continue ``context`` (prompt and output so far, token ids)."""

    name: str

    def draft(self, context: list[int], k: int, *, grammar: Any = None,
              output_start: int = 0) -> list[int]: ...

    def close(self) -> None: ...


class PromptLookupDrafter:
    """Draft by n-gram lookup in the context (no model; costs microseconds)."""

    name = "prompt_lookup"

    def __init__(self, max_ngram_size: int = 2) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self._find = LlamaPromptLookupDecoding.find_candidate_pred_tokens
        self.max_ngram_size = max_ngram_size

    def draft(self, context: list[int], k: int, *, grammar: Any = None,
              output_start: int = 0) -> list[int]:
        """Return up to k tokens that followed the context's last n-gram earlier in it."""
        ids = np.asarray(context, dtype=np.intc)
        return [int(t) for t in self._find(ids, self.max_ngram_size, k)]

    def close(self) -> None:
        """Nothing to release."""


class DraftModelDrafter:
    """Draft greedily with a second llama.cpp model that shares the target's vocabulary.

    Its KV cache keeps the longest prefix shared with the previous call, so each round only
    evaluates the tokens accepted since. It loads with the target's extra-buffer-type policy
    (``policy``; default: this CPU's, robot_latency.llama_load).
    """

    name = "draft_model"

    def __init__(self, model_path: str, *, n_threads: int = 1, n_ctx: int = 512,
                 target: Any = None, policy: LoadPolicy | None = None) -> None:
        policy = load_policy() if policy is None else policy
        try:
            self.llm = open_llama(policy, model_path=model_path, n_ctx=n_ctx,
                                  n_threads=n_threads, n_threads_batch=n_threads, n_batch=64,
                                  n_ubatch=64, verbose=False)
        except (ValueError, RuntimeError, OSError) as err:
            raise EngineError(f"draft model {model_path}: could not load: {err}") from err
        self.model_path = model_path
        if target is not None:
            self._check_vocab(target)
        self.model_path = model_path

    def _check_vocab(self, target: Any) -> None:
        """The draft's tokens must be the target's first tokens, text for text (an inflated
        target pads the vocabulary with unused tokens the draft never emits)."""
        n_draft, n_target = self.llm.n_vocab(), target.n_vocab()
        if n_draft > n_target:
            raise EngineError(f"draft model {self.model_path}: vocabulary of {n_draft} tokens, "
                              f"larger than the target's {n_target}")
        for i in range(n_draft):
            a, b = self.llm._model.token_get_text(i), target._model.token_get_text(i)
            if a != b:
                raise EngineError(f"draft model {self.model_path}: token {i} is {a!r}, the "
                                  f"target's is {b!r}: the vocabularies must match")

    def _sync(self, context: list[int]) -> None:
        llm = self.llm
        keep = 0
        # Re-evaluate at least the last token: its logits are what the first draft samples from.
        limit = min(llm.n_tokens, len(context) - 1)
        cached = llm.input_ids
        while keep < limit and cached[keep] == context[keep]:
            keep += 1
        if keep < llm.n_tokens:
            llm._ctx.kv_cache_seq_rm(-1, keep, -1)
            llm.n_tokens = keep
        if keep < len(context):
            llm.eval(context[keep:])

    def draft(self, context: list[int], k: int, *, grammar: Any = None,
              output_start: int = 0) -> list[int]:
        """Return k greedy tokens continuing ``context`` (fewer if the model ends).

        Args:
            context: prompt and output token ids; the last one is not yet evaluated anywhere.
            k: tokens to draft.
            grammar: the target's LlamaGrammar; applied here too (state rebuilt from the output).
            output_start: where the output starts in ``context`` (grammar state from there).
        """
        from llama_cpp import _internals

        llm = self.llm
        self._sync(context)
        sampler = _internals.LlamaSampler()
        if grammar is not None:
            sampler.add_grammar(llm._model, grammar)
        sampler.add_greedy()
        for tok in context[output_start:]:
            sampler.accept(tok)
        out: list[int] = []
        for _ in range(k):
            tok = int(sampler.sample(llm._ctx, -1))
            out.append(tok)
            if tok == llm.token_eos():
                break
            llm.eval([tok])
        return out

    def close(self) -> None:
        """Free the draft model."""
        self.llm.close()
