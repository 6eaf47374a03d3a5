"""The planner corpus as an instruct model sees it: chat-templated prompt, JSON plan, Qwen2 ids.

The commands, plans, held-out split and refusals are :mod:`robot_latency.models.corpus`'s; this
module renders each row the way the ``bundled-json`` profile prompts a model:

* prompt: the profile's fixed prefix (Qwen2.5's chat template, chatml, with the system prompt that
  holds the schema in words and a few examples) and the per-cycle part (the command as the user
  turn, then the opening of the assistant turn), built by the profile itself
  (:class:`robot_latency.profiles.profile.Planning`), so training sees the text a run sends;
* answer: the plan as compact JSON in one canonical rendering (:func:`plan_text`: the keys in the
  order the schema-derived grammar writes them, no spaces, which is the only spelling the grammar
  admits), then ``<|im_end|>``. A refusal is the one-step plan ``refuse``
  (:data:`robot_latency.profiles.actions.REFUSE_PLAN`).

Token ids come from Qwen2's real tokenizer (:class:`robot_latency.profiles.vocab.VocabTokenizer`),
tokenized as the llama.cpp engine does: the prefix on its own (BOS added if the vocabulary asks
for one; Qwen2's does not), the per-cycle part after it without BOS.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from robot_latency.models.corpus import Command, Corpus
from robot_latency.profiles.actions import expand_to_plan
from robot_latency.profiles.profile import Planning, load_planning
from robot_latency.profiles.vocab import VocabTokenizer

__all__ = [
    "END_OF_TURN",
    "JSON_PROFILE",
    "TOKENIZER_FAMILY",
    "JsonCorpus",
    "JsonExample",
    "build_json_corpus",
    "plan_text",
]

#: The shipped profile the JSON planner is trained for.
JSON_PROFILE = "bundled-json"
#: The tokenizer family whose ids the model reads and writes.
TOKENIZER_FAMILY = "qwen2"
#: What ends the assistant's turn in chatml (the model is trained to write it after the plan).
END_OF_TURN = "<|im_end|>"


def plan_text(command: Command) -> str:
    """Return the plan of ``command`` as the model writes it: compact JSON, canonical key order.

    Keys follow the schema's ``required`` order (action, target, target_kind, color, speed), the
    order llama-cpp-python's schema-to-grammar converter emits them in.
    """
    return json.dumps(expand_to_plan(command.steps), separators=(",", ":"))


@dataclass(frozen=True)
class JsonExample:
    """One tokenized row (the prefix is shared, see :class:`JsonCorpus`).

    Attributes:
        command: the corpus row.
        suffix: the per-cycle prompt ids (user turn and the assistant turn's opening).
        answer: the plan's ids, ``<|im_end|>`` last.
    """

    command: Command
    suffix: tuple[int, ...]
    answer: tuple[int, ...]


@dataclass(frozen=True)
class JsonCorpus:
    """The corpus rendered for the JSON planner.

    Attributes:
        prefix: the fixed prefix's ids (the same for every row).
        end_of_turn: the id of ``<|im_end|>``.
        train: training rows (refusals included).
        heldout: held-out in-domain rows.
        refuse_heldout: held-out out-of-domain rows (each plan a refusal).
    """

    prefix: tuple[int, ...]
    end_of_turn: int
    train: list[JsonExample]
    heldout: list[JsonExample]
    refuse_heldout: list[JsonExample]


def build_json_corpus(corpus: Corpus, tok: VocabTokenizer,
                      planning: Planning | None = None) -> JsonCorpus:
    """Render and tokenize a corpus for the JSON planner.

    Args:
        corpus: from :func:`robot_latency.models.corpus.generate_corpus`.
        tok: an open Qwen2 tokenizer.
        planning: the profile (default: the shipped ``bundled-json``).

    Returns:
        The tokenized corpus.
    """
    planning = planning or load_planning(JSON_PROFILE)
    end = tok.tokenize(END_OF_TURN, special=True)
    if len(end) != 1:
        raise ValueError(f"{END_OF_TURN} is not one token in {tok.path}")
    prefix = tuple(tok.tokenize(planning.prefix, add_bos=True, special=True))

    def rows(commands: Sequence[Command]) -> list[JsonExample]:
        out = []
        for c in commands:
            prompt = planning.build(c.text)
            if prompt.prefix != planning.prefix:
                raise ValueError(f"{JSON_PROFILE}: the prompt of {c.text!r} has no fixed prefix")
            suffix = tok.tokenize(prompt.suffix, add_bos=False, special=True)
            answer = tok.tokenize(plan_text(c), add_bos=False, special=False) + end
            out.append(JsonExample(c, tuple(suffix), tuple(answer)))
        return out

    return JsonCorpus(prefix=prefix, end_of_turn=end[0],
                      train=rows(corpus.train + corpus.refuse_train),
                      heldout=rows(corpus.heldout), refuse_heldout=rows(corpus.refuse_heldout))
