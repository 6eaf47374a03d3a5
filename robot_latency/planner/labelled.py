"""The untimed pass without weights: each labelled command's plan, as the model would write it.

The untimed pass (:mod:`robot_latency.planner.untimed`) runs the model to learn each command's
token counts and plan. Without the model's weights (a preset such as ``qwen2.5-0.5b``, or a GGUF
not worth loading), the same facts can be built from the stream's labels, on one assumption:
**the model writes the labelled plan**. Per labelled command:

- the plan is rendered in the profile's output format: the compact action tokens
  (``<pick><col:red><obj:cup><end>``) or JSON in the schema's key order, spelled as the
  decoding grammar allows (no spaces; with no grammar, the spacing of the profile's examples);
- the prompt is the profile's own (system, examples, the user turn in its chat template), and
  its tokens are counted as the llama.cpp engine counts them: the fixed prefix tokenized once
  with BOS, the per-cycle part without, and the tokens shared with what the engine's KV cache
  holds (the prefix evaluated at load, then the previous command's prompt and all but the
  last token of its output) are not prefilled again;
- both are tokenized by the family's real tokenizer (:mod:`robot_latency.profiles.vocab`).

A command without a label is left out of the stream the loop is simulated on (its arrival
dropped), and counted. A label the output format cannot write is left out the same way. A
labelled plan the profile's contract refuses (more steps than a JSON schema allows) is simulated
at its labelled length and counted as no valid plan; one longer than ``max_tokens`` is cut
there, as the engine cuts it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from robot_latency.engines.generate import shared_prefix_len
from robot_latency.planner.untimed import UntimedCommand, UntimedError, UntimedPass, _refusal
from robot_latency.profiles.actions import (
    REFUSE_PLAN,
    PlanParseError,
    Step,
    expand_to_plan,
    steps_to_tokens,
)
from robot_latency.profiles.labels import REFUSE_LABEL, LabelSet
from robot_latency.profiles.profile import Planning
from robot_latency.profiles.vocab import VocabTokenizer
from robot_latency.streams import CommandStream

#: The ``engine`` an untimed pass built from labels names.
LABELS_ENGINE = "labels"


@dataclass(frozen=True)
class LabelledPass:
    """An untimed pass built from labels, and what it left out.

    Attributes:
        untimed: the pass (engine ``labels``), one entry per command of ``stream``.
        stream: the labelled commands (the unlabelled and unwritable ones dropped).
        unlabelled: ids of the commands with no label.
        unwritable: ids of labelled commands whose plan the output format cannot write.
        off_contract: labelled plans the profile's contract refuses (no valid plan).
        output_format: the output format the token counts hold for, in words.
        tokenizer: the vocabulary the counts come from (a file path).
    """

    untimed: UntimedPass
    stream: CommandStream
    unlabelled: tuple[str, ...]
    unwritable: tuple[str, ...]
    off_contract: int
    output_format: str
    tokenizer: str


def _steps(expected: Any) -> list[Step]:
    """The action language's steps of a (possibly partial) label.

    Raises:
        PlanParseError: the label is not a plan of the action language.
    """
    raw = expected.get("steps") if isinstance(expected, dict) else None
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise PlanParseError("a label plan is {\"steps\": [...]}")
    steps = [Step(action=str(s.get("action")), target=s.get("target"), color=s.get("color"),
                  speed=s.get("speed") or "normal") for s in raw]
    steps_to_tokens(steps)  # checks every step
    return steps


def _ordered(value: Any, schema: Any) -> Any:
    """``value`` with each object's keys in its schema's ``properties`` order (the order a
    grammar derived from the schema makes the model write them)."""
    if not isinstance(schema, Mapping):
        return value
    for key in ("oneOf", "anyOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            shaped = [b for b in branches if isinstance(b, Mapping)
                      and ("properties" in b or "items" in b)]
            if shaped:
                return _ordered(value, shaped[0])
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        props = schema["properties"]
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: _ordered(value[k], props.get(k)) for k in keys}
    if isinstance(value, list):
        return [_ordered(v, schema.get("items")) for v in value]
    return value


def render_plan(planning: Planning, expected: Any, *,
                grammar: bool = True) -> tuple[str, dict[str, Any]]:
    """Return (the text the model writes for the labelled plan, the plan object); ``grammar``:
    decoding is constrained by the contract's grammar (the run's ``grammar`` setting).

    Raises:
        PlanParseError: the label cannot be written in the profile's output format.
    """
    contract = planning.contract
    if expected == REFUSE_LABEL:
        steps: list[Step] | None = [Step("refuse")]
        plan = copy.deepcopy(REFUSE_PLAN)
    else:
        try:
            steps = _steps(expected)
            plan = expand_to_plan(steps)
        except PlanParseError:
            if contract.kind == "actions":
                raise
            steps, plan = None, copy.deepcopy(expected)
    if contract.kind == "actions":
        return "".join(steps_to_tokens(steps or [])), plan
    schema = getattr(contract, "schema", None)
    # The grammar fixes one spelling (no spaces, see profiles/contract.py); unconstrained, the
    # model copies the examples' spelling (profiles/profile.py plan_json).
    seps = (",", ":") if grammar and contract.grammar is not None else (", ", ": ")
    return json.dumps(_ordered(plan, schema), separators=seps, ensure_ascii=False), plan


def output_format(planning: Planning, *, grammar: bool = True) -> str:
    """The output format a labelled pass's token counts hold for, in words."""
    contract = planning.contract
    if contract.kind == "actions":
        return f"compact action tokens (profile {planning.profile.name})"
    spelling = "compact JSON, no spaces (the grammar's)" \
        if grammar and contract.grammar is not None \
        else "JSON spaced as the profile's examples"
    return f"{spelling} (profile {planning.profile.name})"


def _key(planning: Planning, stream: CommandStream, labels: dict[str, Any], tokenizer: str,
         max_tokens: int) -> str:
    spec = {"engine": LABELS_ENGINE, "tokenizer": tokenizer, "max_tokens": max_tokens,
            "profile": planning.profile.sha256 or planning.profile.name,
            "chat_format": planning.profile.chat_format,
            "commands": [[c.command_id, c.text, c.state, labels.get(c.command_id)]
                         for c in stream.commands]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()


def labelled_pass(planning: Planning, stream: CommandStream, labels: LabelSet,
                  tokenizer: VocabTokenizer, *, max_tokens: int, max_command_chars: int,
                  grammar: bool = True, warm_prefix: bool = True,
                  model: str | None = None) -> LabelledPass:
    """Build the untimed pass of ``stream`` from its labels (see the module docstring).

    Args:
        planning: the planner profile (prompt, chat format, output contract).
        stream: the commands.
        labels: their labels (by id, or by text).
        tokenizer: the model family's tokenizer (opened here if it is not).
        max_tokens: the output budget: a longer plan is cut there.
        max_command_chars: the loop's refusal of too long a command.
        grammar: decoding is constrained by the contract's grammar (JSON's spelling).
        warm_prefix: the engine evaluates the fixed prefix at load (llama.cpp does).
        model: the model the pass stands for (recorded).

    Raises:
        UntimedError: no command of the stream has a label.
    """
    kept, out, unlabelled, unwritable = [], [], [], []
    off_contract = 0
    by_id: dict[str, Any] = {}
    state: str | None = None
    prefix_text: str | None = None
    prefix_tokens: list[int] = []
    cache: list[int] = []
    for c in stream.commands:
        state = c.state if c.state is not None else state
        label = labels.lookup(c.command_id, c.text)
        if label is None:
            unlabelled.append(c.command_id)
            continue
        if _refusal(c.text, max_command_chars) is not None:
            kept.append(c)
            out.append(UntimedCommand(c.command_id, asked=False, text=""))
            continue
        try:
            text, plan = render_plan(planning, label.expected, grammar=grammar)
        except PlanParseError:
            unwritable.append(c.command_id)
            continue
        kept.append(c)
        by_id[c.command_id] = label.expected
        prompt = planning.build(c.text, state)
        if prompt.prefix:
            if prompt.prefix != prefix_text:
                prefix_text = prompt.prefix
                prefix_tokens = tokenizer.tokenize(prompt.prefix, add_bos=True)
                if warm_prefix and not cache:
                    cache = list(prefix_tokens)
            tokens = prefix_tokens + tokenizer.tokenize(prompt.suffix, add_bos=False)
        else:
            tokens = tokenizer.tokenize(prompt.suffix, add_bos=True)
        keep = shared_prefix_len(cache, tokens)
        written = tokenizer.tokenize(text, add_bos=False)
        cut = len(written) > max_tokens
        written = written[:max_tokens]
        try:
            valid = not cut and planning.contract.validate(plan) is not None
        except PlanParseError:
            valid = False
            off_contract += 1
        out.append(UntimedCommand(
            c.command_id, asked=True, prompt_tokens=len(tokens),
            uncached_prompt_tokens=max(1, len(tokens) - keep), tokens_out=len(written),
            stop_reason="max_tokens" if cut else "complete", plan_valid=valid,
            plan=plan if valid else None, text=tokenizer.detokenize(written) if cut else text))
        # what the engine's KV holds next: this prompt and its output but the last token
        cache = tokens + written[:-1]
    if not kept:
        raise UntimedError(f"{stream.source}: no command has a label ({len(unlabelled)} "
                           "unlabelled): nothing to assume the model writes")
    up = UntimedPass(key=_key(planning, stream, by_id, str(tokenizer.path), max_tokens),
                     engine=LABELS_ENGINE, model=model, profile=planning.profile.name,
                     stream=stream.source, max_tokens=max_tokens, commands=tuple(out))
    return LabelledPass(untimed=up, stream=replace(stream, commands=tuple(kept)),
                        unlabelled=tuple(unlabelled), unwritable=tuple(unwritable),
                        off_contract=off_contract,
                        output_format=output_format(planning, grammar=grammar),
                        tokenizer=str(tokenizer.path))
