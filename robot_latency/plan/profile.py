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
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from robot_latency.errors import RobotLatencyError
from robot_latency.plan import chat
from robot_latency.plan.actions import STOP_STEP_PLAN, PlanParseError
from robot_latency.plan.contract import (
    CONTRACTS,
    ActionsContract,
    ContractError,
    JsonContract,
    OutputContract,
)
from robot_latency.plan.normalize import NORMALIZERS, normalize_command

log = logging.getLogger(__name__)

DEFAULT_PROFILE = "bundled-actions"
RULES = ("bundled", "keywords", "none")
_PLACEHOLDERS = ("command", "state")


class ProfileError(RobotLatencyError, ValueError):
    """A profile that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Example:
    """One few-shot example: a command (normalized like a live one), optional state, the answer."""

    command: str
    plan: str
    state: str | None = None


@dataclass(frozen=True)
class PromptSpec:
    """How the prompt is built.

    Args:
        system: fixed text first (raw format: the start of the prompt; chat: the system turn).
        examples: few-shot examples, rendered after the system text, before the live command.
        user: the per-cycle part, a template with ``{command}`` and optionally ``{state}``.
        state_default: text for ``{state}`` when no robot state has arrived.
        example_separator: raw format only: text after each example's answer.
    """

    system: str = ""
    examples: tuple[Example, ...] = ()
    user: str = "{command}"
    state_default: str = "unknown"
    example_separator: str = "\n"


@dataclass(frozen=True)
class OutputSpec:
    """What the model must write: ``actions`` or ``json`` (with ``schema``), stop strings and
    the token budget."""

    contract: str = "actions"
    schema: str | None = None
    grammar: bool = True
    stop: tuple[str, ...] = ()
    max_tokens: int = 24


@dataclass(frozen=True)
class FallbackSpec:
    """Which fallback applies.

    Args:
        rule: ``bundled`` (the keyword planner of the bundled vocabulary; its plans must satisfy
            the output contract), ``keywords`` (the profile's own word-to-plan map) or ``none``
            (the ``rule`` policy is dropped from the chain: hold, then stop).
        keywords: ordered (phrase, plan) pairs; a command whose words contain the phrase's
            (case and punctuation ignored) gets that plan (first match wins).
        stop_plan: the ``stop`` policy's plan in this profile's output form (None: the bundled
            ``{"steps": [stop]}``).
    """

    rule: str = "bundled"
    keywords: tuple[tuple[str, dict[str, Any]], ...] = ()
    stop_plan: dict[str, Any] | None = None


@dataclass(frozen=True)
class PlannerProfile:
    """A planner profile (see the module docstring); build with :func:`load_profile`."""

    name: str
    description: str = ""
    normalize: str = "bundled"
    chat_format: str = chat.RAW
    prompt: PromptSpec = field(default_factory=PromptSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    fallback: FallbackSpec = field(default_factory=FallbackSpec)
    source: str = ""
    text: str = ""
    sha256: str = ""

    def to_manifest(self) -> dict[str, Any]:
        """Return what a run's manifest records: name, source, sha256 and the YAML text."""
        return {"name": self.name, "source": self.source, "sha256": self.sha256,
                "content": self.text}


# --- loading and validation --------------------------------------------------------------------
_TOP = {"name": str, "description": str, "normalize": str, "chat_format": str, "prompt": dict,
        "output": dict, "fallback": dict}
_PROMPT = {"system": str, "examples": list, "user": str, "state_default": str,
           "example_separator": str}
_EXAMPLE = {"command": str, "plan": str, "state": str}
_OUTPUT = {"contract": str, "schema": str, "grammar": bool, "stop": list, "max_tokens": int}
_FALLBACK = {"rule": str, "keywords": list, "stop_plan": dict}
_KEYWORD = {"phrase": str, "plan": dict}
_TYPE_NAMES = {str: "a string", dict: "a mapping", list: "a list", bool: "true or false",
               int: "an integer"}


def _check(where: str, section: str, data: Any, table: Mapping[str, type], *,
           required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: {section or 'the file'} must be a mapping, got "
                           f"{type(data).__name__}")
    prefix = f"{section}." if section else ""
    for key, value in data.items():
        if key not in table:
            raise ProfileError(f"{where}: unknown key {prefix}{key}; known: "
                               f"{', '.join(prefix + k for k in table)}")
        want = table[key]
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if value is None and key in ("schema", "stop_plan", "state"):
            ok = True
        if not ok:
            raise ProfileError(f"{where}: {prefix}{key} must be {_TYPE_NAMES[want]}, got "
                               f"{type(value).__name__} {value!r:.60}")
    for key in required:
        if key not in data:
            raise ProfileError(f"{where}: {prefix}{key} is required")
    return data


def _check_template(where: str, key: str, template: str) -> None:
    import string

    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ProfileError(f"{where}: {key}: not a valid template: {err}") from err
    bad = [n for n in names if n not in _PLACEHOLDERS]
    if bad:
        raise ProfileError(f"{where}: {key}: unknown placeholder {{{bad[0]}}}; known: "
                           f"{', '.join('{' + p + '}' for p in _PLACEHOLDERS)}")
    if "command" not in names:
        raise ProfileError(f"{where}: {key} must contain {{command}}")


def parse_profile(data: Any, *, where: str, base_dir: Path | None = None,
                  text: str = "") -> PlannerProfile:
    """Build a profile from parsed YAML, checking every key and type.

    Raises:
        ProfileError: an unknown key, a wrong type, an unknown normalizer, chat format, contract
            or rule; the message names ``where`` and the key.
    """
    top = _check(where, "", data, _TOP, required=("name",))
    p = _check(where, "prompt", top.get("prompt", {}), _PROMPT)
    examples = []
    for i, ex in enumerate(p.get("examples", [])):
        e = _check(where, f"prompt.examples[{i}]", ex, _EXAMPLE, required=("command", "plan"))
        examples.append(Example(command=e["command"], plan=e["plan"], state=e.get("state")))
    prompt = PromptSpec(**{k: v for k, v in p.items() if k != "examples"},
                        examples=tuple(examples))
    _check_template(where, "prompt.user", prompt.user)
    o = _check(where, "output", top.get("output", {}), _OUTPUT)
    for i, s in enumerate(o.get("stop", [])):
        if not isinstance(s, str) or not s:
            raise ProfileError(f"{where}: output.stop[{i}] must be a non-empty string")
    output = OutputSpec(**{**o, "stop": tuple(o.get("stop", ()))})
    if output.contract not in CONTRACTS:
        raise ProfileError(f"{where}: output.contract {output.contract!r}: must be one of "
                           f"{', '.join(CONTRACTS)}")
    if output.contract == "json" and not output.schema:
        raise ProfileError(f"{where}: output.schema is required for the json contract")
    if output.schema and base_dir is not None and not Path(output.schema).is_absolute():
        output = OutputSpec(**{**output.__dict__,
                               "schema": str(_schema_path(base_dir, output.schema))})
    if not 1 <= output.max_tokens <= 4096:
        raise ProfileError(f"{where}: output.max_tokens={output.max_tokens}: must be in 1..4096")
    f = _check(where, "fallback", top.get("fallback", {}), _FALLBACK)
    keywords = []
    for i, kw in enumerate(f.get("keywords", [])):
        k = _check(where, f"fallback.keywords[{i}]", kw, _KEYWORD, required=("phrase", "plan"))
        keywords.append((k["phrase"], k["plan"]))
    fallback = FallbackSpec(rule=f.get("rule", "bundled"), keywords=tuple(keywords),
                            stop_plan=f.get("stop_plan"))
    if fallback.rule not in RULES:
        raise ProfileError(f"{where}: fallback.rule {fallback.rule!r}: must be one of "
                           f"{', '.join(RULES)}")
    if fallback.rule == "keywords" and not keywords:
        raise ProfileError(f"{where}: fallback.rule is keywords but fallback.keywords is empty")
    normalize = top.get("normalize", "bundled")
    if normalize not in NORMALIZERS:
        raise ProfileError(f"{where}: normalize {normalize!r}: must be one of "
                           f"{', '.join(NORMALIZERS)}")
    try:
        chat_format = chat.check_format(top.get("chat_format", chat.RAW))
    except chat.ChatFormatError as err:
        raise ProfileError(f"{where}: chat_format: {err}") from err
    return PlannerProfile(name=top["name"], description=top.get("description", ""),
                          normalize=normalize, chat_format=chat_format, prompt=prompt,
                          output=output, fallback=fallback, source=where, text=text,
                          sha256=hashlib.sha256(text.encode()).hexdigest() if text else "")


def _schema_path(base_dir: Path, schema: str) -> Path:
    """Resolve a profile's relative schema path: next to the profile, else a shipped schema of
    that file name (a copied shipped profile keeps working without copying its schema)."""
    local = base_dir / schema
    shipped = _shipped_dir() / schema
    if not local.exists() and Path(schema).name == schema and shipped.is_file():
        log.info("schema %s not next to the profile (%s): the shipped %s is used", schema,
                 base_dir, shipped)
        return shipped
    return local


def _shipped_dir() -> Path:
    return Path(str(resources.files("robot_latency") / "data" / "profiles"))


def shipped_profiles() -> dict[str, Path]:
    """Return the shipped profiles by name (file stem)."""
    return {p.stem: p for p in sorted(_shipped_dir().glob("*.yaml"))}


def load_profile(spec: str | Path | None = None) -> PlannerProfile:
    """Load a profile by shipped name or by path ("" or None: the default, bundled-actions).

    Raises:
        ProfileError: no such profile or file, YAML that does not parse, or a bad key or value
            (the message names the file and the key).
    """
    spec = str(spec).strip() if spec else DEFAULT_PROFILE
    shipped = shipped_profiles()
    path = shipped.get(spec)
    if path is None:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ProfileError(f"planner profile {spec!r}: no such file, and not a shipped "
                               f"profile ({', '.join(shipped)})")
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileError(f"{path}: cannot be read: {err}") from err
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from err
    return parse_profile(data, where=str(path), base_dir=path.parent, text=text)


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
        from robot_latency.plan.rules import rule_plan_json

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
