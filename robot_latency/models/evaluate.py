"""Evaluate a planner GGUF with llama.cpp: greedy decoding, exact match, draft acceptance.

Needs llama-cpp-python, not torch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from robot_latency.llama_load import load_policy, open_llama
from robot_latency.models.corpus import Command
from robot_latency.models.tokenizer import Vocab, build_vocab, prompt_tokens
from robot_latency.profiles.actions import PlanParseError, parse_actions

__all__ = ["EvalResult", "GGUFPlanner", "acceptance_rate", "exact_match"]

logger = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """Exact-match evaluation of a planner.

    Attributes:
        n: commands evaluated.
        exact: commands whose output tokens equal the reference plan exactly.
        parsed: outputs that parse as a plan.
        outputs: output token ids per command (``<end>`` included when emitted).
    """

    n: int = 0
    exact: int = 0
    parsed: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def accuracy(self) -> float | None:
        """Return exact / n, or None when nothing was evaluated."""
        return self.exact / self.n if self.n else None


class GGUFPlanner:
    """A planner GGUF under llama.cpp, decoding greedily (a context manager).

    Args:
        path: the GGUF file.
        n_threads: llama.cpp threads.
        n_ctx: context size.
        kv_f32: keep the KV cache in F32 (llama.cpp's default is F16), for exact comparisons.
    """

    def __init__(
        self, path: str | Path, *, n_threads: int = 2, n_ctx: int = 128, kv_f32: bool = False
    ) -> None:
        import llama_cpp

        self.path = Path(path)
        kv: dict[str, Any] = {}
        if kv_f32:
            kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
        self.llm = open_llama(
            load_policy(),
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            logits_all=True,  # keeps every position's logits in llm.scores
            verbose=False,
            **kv,
        )
        self.eos = int(self.llm.token_eos())

    def prompt(self, command: str) -> list[int]:
        """Return the prompt ids of a command (``[<s>, words..., <plan>]``)."""
        return prompt_tokens(self.llm, command)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Return the logits at every position of ``ids`` (shape ``(len(ids), n_vocab)``)."""
        self.llm.reset()
        self.llm.eval(list(ids))
        return np.array(self.llm.scores[: len(ids)], dtype=np.float32)

    def greedy(self, command: str, *, max_new: int = 32) -> list[int]:
        """Decode greedily (argmax over the whole vocabulary) until ``<end>`` or ``max_new``.

        Args:
            command: raw operator text.
            max_new: most tokens to emit.

        Returns:
            The emitted ids, ``<end>`` included when it came.
        """
        self.llm.reset()
        self.llm.eval(self.prompt(command))
        out: list[int] = []
        for _ in range(max_new):
            tok = int(np.argmax(self.llm.scores[self.llm.n_tokens - 1]))
            out.append(tok)
            if tok == self.eos:
                break
            self.llm.eval([tok])
        return out

    def complete(self, command: str, *, grammar: Any = None, max_new: int = 32) -> str:
        """Decode at temperature 0 with llama-cpp-python's sampler, optionally grammar-constrained.

        Args:
            command: raw operator text.
            grammar: a ``llama_cpp.LlamaGrammar`` or None.
            max_new: most tokens to emit.

        Returns:
            The completion text (action tokens; ``<end>`` is EOS and not in the text).
        """
        self.llm.reset()
        out = self.llm.create_completion(
            self.prompt(command), max_tokens=max_new, temperature=0.0, grammar=grammar
        )
        return str(out["choices"][0]["text"])

    def close(self) -> None:
        """Free the model."""
        if self.llm is not None:
            self.llm.close()
            self.llm = None

    def __enter__(self) -> GGUFPlanner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def exact_match(
    planner: GGUFPlanner, commands: Sequence[Command], *, vocab: Vocab | None = None
) -> EvalResult:
    """Decode each command greedily and compare with its reference plan token by token.

    Args:
        planner: the model.
        commands: commands with reference plans.
        vocab: the vocabulary; defaults to ``build_vocab()``.

    Returns:
        The evaluation.
    """
    vocab = vocab or build_vocab()
    res = EvalResult()
    for cmd in commands:
        out = planner.greedy(cmd.text)
        res.outputs.append(out)
        res.n += 1
        res.exact += out == [vocab.id(t) for t in cmd.plan_tokens]
        try:
            parse_actions("".join(vocab.tokens[i] for i in out))
            res.parsed += 1
        except PlanParseError:
            pass
    return res


def acceptance_rate(
    target: GGUFPlanner, draft: GGUFPlanner, commands: Sequence[Command]
) -> float | None:
    """Measure the draft's greedy agreement with the target's own greedy output, per position.

    For each command the target decodes greedily; the draft then reads the prompt plus that output
    (teacher-forced) and predicts each output token. The rate is the fraction of output positions
    (``<end>`` included) where the draft's argmax equals the target's token: the per-token
    acceptance probability of greedy speculative decoding.

    Args:
        target: the target model.
        draft: the draft model (same vocabulary).
        commands: commands to decode.

    Returns:
        The acceptance rate, or None when there were no positions.
    """
    agree = total = 0
    for cmd in commands:
        prompt = target.prompt(cmd.text)
        out = target.greedy(cmd.text)
        logits = draft.logits(prompt + out[:-1])  # position j predicts token j+1
        pred = np.argmax(logits[len(prompt) - 1 :], axis=-1)
        agree += int(np.sum(pred == np.asarray(out)))
        total += len(out)
    return agree / total if total else None
