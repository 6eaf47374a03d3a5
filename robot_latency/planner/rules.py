"""The ``rule`` fallback: a deterministic keyword planner, well under a millisecond per command.

It knows the plan language's vocabulary (actions, colours, objects, locations, speeds) and maps a
plain-English command to steps by keywords, clause by clause ("pick up the red cup and put it on
the tray"). It is no language model: a command it cannot read gives no plan, and the fallback
chain moves on (``hold``, then ``stop``).
"""

from __future__ import annotations

import re

from robot_latency.models.plan import COLORS, LOCATIONS, OBJECTS, Step

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
_CLAUSE_SPLIT = re.compile(r"\b(?:and then|then|and|after that|,)\b|[,;.]")
_WORD = re.compile(r"[a-z]+")

# Location phrases as a person says them ("charging dock" for charging_dock).
_LOCATION_PHRASES = tuple(sorted(((loc.replace("_", " "), loc) for loc in LOCATIONS),
                                 key=lambda p: -len(p[0])))


def _has(text: str, phrase: str) -> bool:
    return re.search(rf"\b{re.escape(phrase)}\b", text) is not None


def _first(text: str, names: tuple[str, ...]) -> str | None:
    """Return the name mentioned earliest in ``text`` (plural 's' allowed), or None."""
    best: tuple[int, str] | None = None
    for name in names:
        m = re.search(rf"\b{re.escape(name)}s?\b", text)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), name)
    return None if best is None else best[1]


def _location(text: str) -> str | None:
    for phrase, loc in _LOCATION_PHRASES:
        if _has(text, phrase):
            return loc
    if _has(text, "me") or _has(text, "here"):
        return "operator"
    return None


def _destination(clause: str) -> str | None:
    """Return the location a clause sends something to ("... to the tray", "bring me ...")."""
    m = re.search(r"\b(?:to|on|onto|into|in)\b(.*)", clause)
    if m is not None:
        loc = _location(m.group(1))
        if loc is not None:
            return loc
    return "operator" if re.search(r"\b(?:bring|give|hand) me\b", clause) else None


def _speed(text: str) -> str:
    if any(_has(text, w) for w in _SLOW):
        return "slow"
    if any(_has(text, w) for w in _FAST):
        return "fast"
    return "normal"


def _clause_steps(clause: str, speed: str) -> list[Step]:
    action = next((a for a, words in _ACTION_WORDS if any(_has(clause, w) for w in words)), None)
    obj, color, loc = _first(clause, OBJECTS), _first(clause, COLORS), _location(clause)
    if action is None:
        # "the red cup to the tray" style fragments: infer from what is named.
        action = "pick" if obj else ("goto" if loc else None)
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
            elif dest == "operator" or _has(clause, "bring"):
                steps.append(Step("give", speed=speed))
        return steps
    if action in ("place", "goto"):
        if loc is None or loc == "operator":
            return [Step("give", speed=speed)] if action == "place" and loc == "operator" else []
        return [Step(action, target=loc, speed=speed)]
    return [Step("give", speed=speed)]


def rule_plan(command: str) -> list[Step] | None:
    """Return the keyword planner's steps for ``command``, or None when it reads nothing.

    Args:
        command: the operator's command, any case; punctuation and filler words are ignored.
    """
    text = " ".join(_WORD.findall(command.lower()))
    if not text:
        return None
    # A stop anywhere in the command wins: it is the safety-relevant reading.
    if any(_has(text, w) for w in ("stop", "halt", "freeze", "abort")):
        return [Step("stop")]
    speed = _speed(text)
    steps: list[Step] = []
    for clause in _CLAUSE_SPLIT.split(text):
        steps.extend(_clause_steps(clause.strip(), speed))
    return steps or None
