"""Grammar-constrained greedy sampling for llama.cpp that tests the grammar on the argmax first."""

from __future__ import annotations

import ctypes
from typing import Any


class GreedyGrammarSampler:
    """Grammar-constrained greedy sampling that checks the grammar on the argmax first.

    A grammar sampler in a chain tests every token of the vocabulary against the grammar each
    step, which costs milliseconds at a 150k vocabulary. The argmax of the constrained logits is
    the plain argmax whenever the grammar allows it, so test that one token first and run the
    full constrained pass only when it is rejected (llama.cpp's own common sampler does the
    same). The output is identical to the chain [grammar, greedy].
    """

    def __init__(self, llm: Any, grammar: Any) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        self.chain = _internals.LlamaSampler()
        self.chain.add_grammar(llm._model, grammar)
        self.chain.add_greedy()
        self.greedy = _internals.LlamaSampler()
        self.greedy.add_greedy()
        self._grammar = llama_cpp.llama_sampler_chain_get(self.chain.sampler, 0)
        self._data = (llama_cpp.llama_token_data * 1)()
        self._array = llama_cpp.llama_token_data_array(data=self._data, size=1, selected=-1,
                                                       sorted=False)
        self.full_passes = 0

    def sample(self, ctx: Any, idx: int = -1) -> int:
        """Return the constrained greedy token at batch position ``idx`` and accept it."""
        token = int(self.greedy.sample(ctx, idx))
        self._data[0].id, self._data[0].logit, self._data[0].p = token, 0.0, 0.0
        self._array.size, self._array.selected = 1, -1
        self._llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._array))
        if self._data[0].logit == float("-inf"):  # the grammar rejects the argmax
            self.full_passes += 1
            return int(self.chain.sample(ctx, idx))  # constrained pass; accepts the token
        self.chain.accept(token)
        return token

    def accept(self, token: int) -> None:
        """Advance the grammar over a token chosen elsewhere."""
        self.chain.accept(token)
