"""Planner profiles: everything model-specific about planning, in one YAML file.

A profile says how the operator's text is normalized, how the prompt is built (a fixed prefix of
system text and examples, then the per-cycle command and optional robot state, in that order so the
prefix can be cached), which chat format renders it, what the model must output (the bundled
action tokens, or JSON under a schema) and which fallback applies. Shipped profiles live in
``robot_latency/data/profiles/``; ``robot-latency profiles`` lists them. A profile is named by its
shipped name or by a path to a YAML file; a schema path inside it is relative to that file, and a
bare file name that is not there names a shipped schema (``robot_plan.schema.json``), so a copy of
a shipped profile runs without its schema copied along.

Example (the shipped ``instruct-json``, shortened)::

    name: instruct-json
    normalize: none
    chat_format: chatml
    prompt:
      system: "You plan for a mobile manipulator ... Answer with JSON only."
      examples:
        - {command: "stop", plan: '{"steps": [{"action": "stop", ...}]}'}
      user: "{command}"
    output:
      contract: json
      schema: robot_plan.schema.json
      max_tokens: 96
    fallback:
      rule: bundled

The profile file's sections, checks and loading are :mod:`robot_latency.profiles.profile_file`
(re-exported here); this module builds the prompt and the loop's planning pieces from a profile.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robot_latency.profiles import chat
from robot_latency.profiles.actions import STOP_STEP_PLAN, PlanParseError
from robot_latency.profiles.contract import (
    ActionsContract,
    ContractError,
    JsonContract,
    OutputContract,
)
from robot_latency.profiles.normalize import NORMALIZERS, normalize_command
from robot_latency.profiles.profile_file import (
    DEFAULT_PROFILE,
    RULES,
    Example,
    FallbackSpec,
    OutputSpec,
    PlannerProfile,
    ProfileError,
    PromptSpec,
    load_profile,
    parse_profile,
    shipped_profiles,
)

__all__ = [
    "DEFAULT_PROFILE",
    "RULES",
    "Example",
    "FallbackSpec",
    "OutputSpec",
    "PlannerProfile",
    "Planning",
    "ProfileError",
    "Prompt",
    "PromptSpec",
    "load_planning",
    "load_profile",
    "parse_profile",
    "plan_json",
    "shipped_profiles",
]

log = logging.getLogger(__name__)


# --- the prompt --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    """A cycle's prompt: the fixed ``prefix`` (the same every cycle), then the per-cycle
    ``suffix``."""

    prefix: str
    suffix: str

    @property
    def text(self) -> str:
        return self.prefix + self.suffix


class Planning:
    """A loaded profile, ready for the loop: prompt builder, contract and fallback pieces.

    Raises:
        ProfileError: the contract cannot be built (a schema file missing or invalid), or the
            fallback's plans break the output contract.
    """

    def __init__(self, profile: PlannerProfile) -> None:
        self.profile = profile
        self.normalize: Callable[[str], str] = NORMALIZERS[profile.normalize]
        out = profile.output
        try:
            self.contract: OutputContract = (
                ActionsContract(use_grammar=out.grammar) if out.contract == "actions"
                else JsonContract(str(out.schema), use_grammar=out.grammar))
        except ContractError as err:
            raise ProfileError(f"{profile.source}: output.schema: {err}") from err
        self.max_tokens = out.max_tokens
        self.stop = out.stop
        self.prefix, self._separable = self._render_prefix()
        self.stop_plan = self._checked("fallback.stop_plan",
                                       profile.fallback.stop_plan or STOP_STEP_PLAN)
        self.rule: Callable[[str], dict[str, Any] | None] | None = self._make_rule()

    # prompt
    def _user(self, command: str, state: str | None) -> str:
        p = self.profile.prompt
        return p.user.format(command=self.normalize(command),
                             state=p.state_default if state is None else state)

    def _fixed_messages(self) -> list[chat.Message]:
        p = self.profile.prompt
        msgs = [chat.Message("system", p.system)] if p.system else []
        for ex in p.examples:
            msgs += [chat.Message("user", self._user(ex.command, ex.state)),
                     chat.Message("assistant", ex.plan)]
        return msgs

    def _render_prefix(self) -> tuple[str, bool]:
        p, fmt = self.profile.prompt, self.profile.chat_format
        if fmt == chat.RAW:
            head = p.system
            for ex in p.examples:
                head += self._user(ex.command, ex.state) + ex.plan + p.example_separator
            return head, True
        fixed = self._fixed_messages()
        if not fixed:
            return "", True
        prefix = chat.render(fmt, fixed, add_assistant=False)
        probe = chat.render(fmt, [*fixed, chat.Message("user", self._user("x", None))],
                            add_assistant=True)
        if not probe.startswith(prefix):
            # The template rewrites earlier turns when one is added (e.g. it folds the system
            # text into the first user turn): no fixed prefix; whole prompts are reused as far
            # as they agree.
            log.warning("profile %s: chat format %s has no separable fixed prefix; the whole "
                        "prompt is built each cycle", self.profile.name, fmt)
            return "", False
        return prefix, True

    def build(self, command: str, state: str | None = None) -> Prompt:
        """Return the prompt for one cycle."""
        user = self._user(command, state)
        fmt = self.profile.chat_format
        if fmt == chat.RAW:
            return Prompt(self.prefix, user)
        fixed = self._fixed_messages()
        full = chat.render(fmt, [*fixed, chat.Message("user", user)], add_assistant=True)
        if self._separable and full.startswith(self.prefix):
            return Prompt(self.prefix, full[len(self.prefix):])
        return Prompt("", full)

    def messages(self, command: str, state: str | None = None) -> tuple[tuple[str, str], ...]:
        """Return the cycle's prompt as chat turns (role, content): system, examples, command;
        for a server that applies its own chat template."""
        turns = [*self._fixed_messages(), chat.Message("user", self._user(command, state))]
        return tuple((m.role, m.content) for m in turns)

    def longest_suffix_chars(self, max_command_chars: int) -> int:
        """Return the per-cycle part's length (characters) for the longest allowed command."""
        return len(self.build("x" * max_command_chars).suffix)

    # fallback
    def _checked(self, key: str, plan: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.contract.validate(plan)
        except Exception as err:
            raise ProfileError(f"{self.profile.source}: {key} breaks the output contract: "
                               f"{err}") from err

    def _make_rule(self) -> Callable[[str], dict[str, Any] | None] | None:
        fb = self.profile.fallback
        if fb.rule == "none":
            return None
        if fb.rule == "keywords":
            # Phrases match whole words, case and punctuation ignored, whatever the model is
            # shown: "Stop!" and "STOP" are the same command to a keyword planner.
            table = [(tuple(normalize_command(phrase).split()),
                      self._checked(f"fallback.keywords[{i}].plan", plan))
                     for i, (phrase, plan) in enumerate(fb.keywords)]

            def keywords(command: str) -> dict[str, Any] | None:
                words = normalize_command(command).split()
                for phrase, plan in table:
                    n = len(phrase)
                    if any(tuple(words[i:i + n]) == phrase for i in range(len(words) - n + 1)):
                        return plan
                return None
            return keywords
        from robot_latency.profiles.rules import rule_plan_json

        self._checked("fallback.rule (the bundled rule planner's plans)",
                      rule_plan_json("pick up the red cup and put it on the tray") or {})
        contract = self.contract

        def bundled(command: str) -> dict[str, Any] | None:
            # A rule plan the contract refuses (more steps than its schema allows, say) is no
            # answer: the chain moves on to hold and stop rather than publish it.
            plan = rule_plan_json(command)
            if plan is None:
                return None
            try:
                return contract.validate(plan)
            except PlanParseError:
                return None
        return bundled

    def describe(self) -> dict[str, Any]:
        """Return the profile's manifest entry, with the contract and the prefix."""
        return {**self.profile.to_manifest(), "contract": self.contract.describe(),
                "prefix_chars": len(self.prefix), "prefix_separable": self._separable}


def load_planning(spec: str | Path | None = None) -> Planning:
    """Load a profile and make it ready for the loop (see :class:`Planning`)."""
    return Planning(load_profile(spec))


def plan_json(plan: dict[str, Any]) -> str:
    """Return a plan object as compact JSON (what a few-shot answer looks like)."""
    return json.dumps(plan, separators=(", ", ": "))
