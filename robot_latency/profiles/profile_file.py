"""The planner profile file: its sections, their checks, and loading one by name or path.

:func:`load_profile` reads a shipped profile (``robot_latency/data/profiles/``) or a YAML file
and checks every section, naming the file, section and key that is wrong;
:mod:`robot_latency.profiles.profile` (the module docstring shows a profile) turns the loaded
:class:`PlannerProfile` into the prompt builder and contract the loop uses.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from robot_latency.errors import RobotLatencyError
from robot_latency.profiles import chat
from robot_latency.profiles.contract import CONTRACTS
from robot_latency.profiles.normalize import NORMALIZERS

__all__ = [
    "DEFAULT_PROFILE",
    "RULES",
    "Example",
    "FallbackSpec",
    "OutputSpec",
    "PlannerProfile",
    "ProfileError",
    "PromptSpec",
    "load_profile",
    "parse_profile",
    "shipped_profiles",
]

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
