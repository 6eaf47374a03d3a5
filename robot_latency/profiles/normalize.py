"""Normalization of the operator's text before it reaches the model.

A model must see text in the form it was trained or prompted with. The bundled planner was trained
on lower-case words separated by single spaces with no punctuation (its corpus is written that
way), so a typed "STOP!" must reach it as "stop": fed raw, the capitals and the "!" are tokens it
never saw, and its plan is noise.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_NON_WORD = re.compile(r"[^a-z0-9' ]+")


def normalize_command(text: str) -> str:
    """Normalise a command the way the bundled planner's corpus is written.

    Lower case, plain words (letters, digits, apostrophes), single spaces.

    Args:
        text: raw operator text, e.g. ``"Pick up the RED cup, please!"``.

    Returns:
        e.g. ``"pick up the red cup please"``.
    """
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def strip_only(text: str) -> str:
    """Return the text with surrounding whitespace removed (for models that read raw text)."""
    return text.strip()


#: Normalizers by the name a profile gives.
NORMALIZERS: dict[str, Callable[[str], str]] = {
    "bundled": normalize_command,
    "none": strip_only,
}
