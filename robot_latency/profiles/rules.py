"""The ``rule`` fallback: a deterministic keyword planner, well under a millisecond per command.

It knows the plan language's vocabulary (actions, colours, objects, locations, speeds) and maps a
plain-English command to steps by keywords, clause by clause ("pick up the red cup and put it on
the tray"). It is no language model: a command in which it reads no step at all ("what's your
battery level?", "dance for me", "go hom") is refused (:data:`REFUSE_PLAN`), never guessed into a
motion. Only an empty command gives no plan, and the fallback chain moves on (``hold``, then
``stop``).
"""

from __future__ import annotations

import re
from typing import Any

from robot_latency.profiles.actions import (
    COLORS,
    LOCATIONS,
    OBJECTS,
    REFUSE_ACTION,
    Step,
    expand_to_plan,
)

# Verb keywords per action, checked in this order (first match in a clause wins).
_ACTION_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stop", ("stop", "halt", "freeze", "abort")),
    ("wait", ("wait", "pause", "hold on", "stay")),
    ("give", ("hand", "give", "deliver")),
    ("place", ("put", "place", "drop", "set", "leave")),
    ("find", ("find", "look for", "search", "locate")),
    ("pick", ("pick", "grab", "take", "get", "fetch", "bring", "lift")),
    ("goto", ("go", "move", "drive", "navigate", "head", "return", "come")),
)
_SLOW = ("slow", "slowly", "carefully", "gently")
_FAST = ("fast", "quickly", "quick", "hurry", "asap")
_STOP_WORDS = ("stop", "halt", "freeze", "abort")
_CLAUSE_SPLIT = re.compile(r"\b(?:and then|then|and|after that)\b")
_WORD = re.compile(r"[a-z]+")


def _any_of(words: tuple[str, ...] | list[str], *, plural: bool = False) -> re.Pattern[str]:
    """Compile one alternation (longest first, so "charging dock" beats "dock")."""
    alts = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(rf"\b({alts}){'s?' if plural else ''}\b")


# Every pattern is compiled once, at import: a command costs a handful of regex scans.
_ACTION_RES = tuple((action, _any_of(list(words))) for action, words in _ACTION_WORDS)
_OBJECT_RE = _any_of(list(OBJECTS), plural=True)
_COLOR_RE = _any_of(list(COLORS))
_LOCATION_NAMES = {loc.replace("_", " "): loc for loc in LOCATIONS}
_LOCATION_RE = _any_of(list(_LOCATION_NAMES))
_OPERATOR_RE = re.compile(r"\b(?:me|here)\b")
_SLOW_RE, _FAST_RE, _STOP_RE = _any_of(_SLOW), _any_of(_FAST), _any_of(_STOP_WORDS)
_BRING_RE = re.compile(r"\bbring\b")
_DEST_RE = re.compile(r"\b(?:to|on|onto|into|in)\b(.*)")
_TO_ME_RE = re.compile(r"\b(?:bring|give|hand) me\b")
# "can" is an object (a can) and a modal verb ("can you find my phone"). A modal is dropped
# before the vocabulary is read: "can"/"could"/"will"/"would" before a pronoun, a pronoun before
# "can", or "can" right before an action verb ("the robot can fetch ...").
_VERBS = "|".join(re.escape(w) for _, words in _ACTION_WORDS for w in words)
_MODAL_RE = re.compile(
    r"\b(?:can|could|would|will)\s+(?:you|u|we|i|it|someone|somebody|the robot)\b"
    r"|\b(?:you|we|i|it)\s+(?:can|cannot)\b|\bcannot\b"
    rf"|\bcan(?=\s+(?:please\s+)?(?:{_VERBS})\b)")


def _first(text: str, pattern: re.Pattern[str]) -> str | None:
    """Return the vocabulary word mentioned earliest in ``text``, or None."""
    m = pattern.search(text)
    return None if m is None else m.group(1)


def _location(text: str) -> str | None:
    m = _LOCATION_RE.search(text)
    if m is not None:
        return _LOCATION_NAMES[m.group(1)]
    return "operator" if _OPERATOR_RE.search(text) else None


def _destination(clause: str) -> str | None:
    """Return the location a clause sends something to ("... to the tray", "bring me ...")."""
    m = _DEST_RE.search(clause)
    if m is not None:
        loc = _location(m.group(1))
        if loc is not None:
            return loc
    return "operator" if _TO_ME_RE.search(clause) else None


def _speed(text: str) -> str:
    if _SLOW_RE.search(text):
        return "slow"
    if _FAST_RE.search(text):
        return "fast"
    return "normal"


def _clause_steps(clause: str, speed: str) -> list[Step]:
    action = next((a for a, pattern in _ACTION_RES if pattern.search(clause)), None)
    obj, color, loc = _first(clause, _OBJECT_RE), _first(clause, _COLOR_RE), _location(clause)
    if action is None:
        # "the red cup to the tray" style fragments: infer from what is named. "me" alone
        # ("dance for me") names no place: nothing to infer from.
        action = "pick" if obj else ("goto" if loc not in (None, "operator") else None)
    if action is None:
        return []
    if action in ("stop", "wait"):
        return [Step(action)]
    if action in ("pick", "find"):
        if obj is None:
            return []
        steps = [Step(action, target=obj, color=color, speed=speed)]
        if action == "pick":
            # "from the kitchen" names where it is; "to/on/into the tray" where it goes.
            dest = _destination(clause)
            if dest is not None and dest != "operator":
                steps.append(Step("place", target=dest, speed=speed))
            elif dest == "operator" or _BRING_RE.search(clause):
                steps.append(Step("give", speed=speed))
        return steps
    if action == "goto" and loc == "operator":
        return [Step("goto", target="operator", speed=speed)]  # "come here"
    if action in ("place", "goto"):
        if loc is None or loc == "operator":
            return [Step("give", speed=speed)] if action == "place" and loc == "operator" else []
        return [Step(action, target=loc, speed=speed)]
    return [Step("give", speed=speed)]


def rule_plan(command: str) -> list[Step] | None:
    """Return the keyword planner's steps for ``command``: a refusal when it reads no step.

    Returns None only for a command with no words at all.

    Args:
        command: the operator's command, any case; punctuation, filler words and modal verbs
            ("can you ...") are ignored; vocabulary words match as whole words only.
    """
    text = " ".join(_WORD.findall(_MODAL_RE.sub(" ", " ".join(_WORD.findall(command.lower())))))
    if not text:
        return None
    # A stop anywhere in the command wins: it is the safety-relevant reading.
    if _STOP_RE.search(text):
        return [Step("stop")]
    speed = _speed(text)
    steps: list[Step] = []
    for clause in _CLAUSE_SPLIT.split(text):
        steps.extend(_clause_steps(clause.strip(), speed))
    return steps or [Step(REFUSE_ACTION)]


def rule_plan_json(command: str) -> dict[str, Any] | None:
    """Return the keyword planner's plan in the expanded JSON form (a refusal when it reads no
    step); None for a command with no words."""
    steps = rule_plan(command)
    return expand_to_plan(steps) if steps else None
