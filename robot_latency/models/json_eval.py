"""Evaluate the JSON planner with llama.cpp as a run prompts it: the profile's prompt, the
schema's grammar, greedy decoding.

Each command is tokenized as the llama.cpp engine does (the ``bundled-json`` profile's fixed
prefix on its own, BOS added if the vocabulary asks for one, then the per-cycle part), decoded at
temperature 0 under the GBNF grammar the json contract derives from the schema (llama.cpp's
grammar sampler, which the engine's ``GreedyGrammarSampler`` matches token for token), and parsed
by the contract. A plan is right when its text is exactly the canonical rendering
(:func:`robot_latency.models.json_corpus.plan_text`) of the command's plan. (The engine itself
lives in a layer above this package; test/models/test_json_planner.py runs it too.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.models.corpus import Command
from robot_latency.models.json_corpus import JSON_PROFILE, plan_text
from robot_latency.profiles.actions import is_refusal
from robot_latency.profiles.contract import complete_plan
from robot_latency.profiles.profile import Planning, load_planning

__all__ = ["JsonEvalResult", "JsonPlan", "evaluate_json", "plan_commands"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JsonPlan:
    """One command's answer through the engine.

    Attributes:
        command: the corpus row.
        text: the generated text.
        plan: the parsed plan (None: incomplete or invalid).
        prompt_tokens: the prompt's tokens (prefix and per-cycle part).
        plan_tokens: the tokens generated.
    """

    command: Command
    text: str
    plan: dict[str, Any] | None
    prompt_tokens: int
    plan_tokens: int

    @property
    def exact(self) -> bool:
        """Whether the text is the command's plan, exactly as trained."""
        return self.text == plan_text(self.command)

    @property
    def refused(self) -> bool:
        """Whether the plan is a refusal."""
        return is_refusal(self.plan)


@dataclass
class JsonEvalResult:
    """Exact match and refusals over a set of commands."""

    plans: list[JsonPlan] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.plans)

    @property
    def exact_match(self) -> float | None:
        """Fraction of plans exactly right (None when empty)."""
        return sum(p.exact for p in self.plans) / self.n if self.plans else None

    @property
    def refused(self) -> float | None:
        """Fraction of plans that are refusals (None when empty)."""
        return sum(p.refused for p in self.plans) / self.n if self.plans else None

    @property
    def valid(self) -> float | None:
        """Fraction of outputs the contract accepted (None when empty)."""
        return sum(p.plan is not None for p in self.plans) / self.n if self.plans else None


def plan_commands(model_path: str | Path, commands: Sequence[Command], *,
                  planning: Planning | None = None, n_threads: int = 2) -> JsonEvalResult:
    """Plan each command with the llama.cpp engine under the profile's grammar.

    Args:
        model_path: the full-vocabulary GGUF.
        commands: corpus rows.
        planning: the profile (default: ``bundled-json``).
        n_threads: llama.cpp threads.

    Returns:
        The plans.
    """
    import llama_cpp

    from robot_latency.llama_load import load_policy, open_llama

    planning = planning or load_planning(JSON_PROFILE)
    contract = planning.contract
    grammar = (None if contract.grammar is None
               else llama_cpp.LlamaGrammar.from_string(contract.grammar, verbose=False))
    llm = open_llama(load_policy(), model_path=str(model_path), n_ctx=0, n_threads=n_threads,
                     n_threads_batch=n_threads, verbose=False)
    out = JsonEvalResult()
    try:
        prefix = llm.tokenize(planning.prefix.encode("utf-8"), add_bos=True, special=True)
        for c in commands:
            prompt = planning.build(c.text)
            ids = prefix + llm.tokenize(prompt.suffix.encode("utf-8"), add_bos=False,
                                        special=True)
            res = llm.create_completion(ids, max_tokens=planning.max_tokens, temperature=0.0,
                                        grammar=grammar)
            text = str(res["choices"][0]["text"])
            plan = complete_plan(contract, text)
            n_out = int(res["usage"]["completion_tokens"])  # the end-of-turn token not counted
            out.plans.append(JsonPlan(c, text, plan, len(ids), n_out))
    finally:
        llm.close()
    return out


def evaluate_json(model_path: str | Path, heldout: Sequence[Command],
                  refuse: Sequence[Command], **kwargs: Any) -> dict[str, Any]:
    """Return the figures the manifest records: held-out exact match, out-of-domain commands
    refused, in-domain commands refused, valid outputs, mean plan and prompt tokens."""
    held = plan_commands(model_path, heldout, **kwargs)
    ood = plan_commands(model_path, refuse, **kwargs)

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    return {
        "heldout_n": held.n, "heldout_exact_match": r(held.exact_match),
        "heldout_in_domain_refused": r(held.refused), "heldout_valid": r(held.valid),
        "refuse_n": ood.n, "heldout_refuse_rate": r(ood.refused),
        "mean_plan_tokens": r(sum(p.plan_tokens for p in held.plans) / max(1, held.n)),
        "mean_prompt_tokens": r(sum(p.prompt_tokens for p in held.plans) / max(1, held.n)),
    }
