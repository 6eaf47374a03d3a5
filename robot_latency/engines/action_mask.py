"""The planner's action grammar as a logit mask: constrained decoding where there is no GBNF engine.

ONNX Runtime has no grammar sampler, so the bundled action grammar
(:func:`robot_latency.profiles.actions.actions_gbnf`) is applied as a mask computed by a small state
machine over the step shapes. It works on the bytes of each token's piece, as llama.cpp's grammar
sampler does, so a token that spells part of an action token is allowed exactly when llama.cpp
would allow it; ``<end>`` (any end-of-generation token) only at a step boundary.
"""

from __future__ import annotations

import numpy as np

from robot_latency.profiles.actions import (
    ACTIONS,
    COLORS,
    LOCATION_ACTIONS,
    LOCATIONS,
    NO_SPEED_ACTIONS,
    OBJECT_ACTIONS,
    OBJECTS,
    REFUSE_TOKEN,
    SPEEDS,
)

#: The name engines report for this mask.
GRAMMAR_MASK = "planner-action-mask"


def normalize_gbnf(text: str) -> str:
    """Return GBNF text without comments and with single spaces (to compare two grammars)."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return "\n".join(" ".join(line.split()) for line in lines if line)


class ActionGrammarMask:
    """The planner's action grammar (``root ::= step+ | refuse``) as a logit mask over token ids.

    Matching is on token pieces (bytes, special tokens rendered), like llama.cpp's grammar
    sampler: the state is the grammar position plus the bytes of an action token matched so far.

    Args:
        pieces: every token's piece, by id (``b""`` for tokens that render as nothing).
        eog: the end-of-generation token ids (allowed only at a step boundary).
    """

    # Grammar positions; the "after a step" ones are where <end> may come.
    # REFUSED: after ``<refuse>``, a whole plan by itself: only <end> may follow.
    START, OBJ_OR_COLOR, OBJ, LOC, SPEED_OK, STEP_DONE, REFUSED = range(7)
    _COMPLETE = (SPEED_OK, STEP_DONE, REFUSED)

    def __init__(self, pieces: list[bytes], eog: set[int]) -> None:
        def tok(name: str) -> bytes:
            return f"<{name}>".encode()

        actions = {tok(a): (self.OBJ_OR_COLOR if a in OBJECT_ACTIONS else self.LOC
                            if a in LOCATION_ACTIONS else self.STEP_DONE if a in NO_SPEED_ACTIONS
                            else self.SPEED_OK) for a in ACTIONS}
        colors = {f"<col:{c}>".encode(): self.OBJ for c in COLORS}
        objects = {f"<obj:{o}>".encode(): self.SPEED_OK for o in OBJECTS}
        locations = {f"<loc:{loc}>".encode(): self.SPEED_OK for loc in LOCATIONS}
        speeds = {tok(s): self.STEP_DONE for s in SPEEDS}
        # Next complete token text -> next position, per position.
        self._next: dict[int, dict[bytes, int]] = {
            self.START: {**actions, REFUSE_TOKEN.encode(): self.REFUSED},
            self.OBJ_OR_COLOR: {**colors, **objects},
            self.OBJ: objects,
            self.LOC: locations,
            self.SPEED_OK: {**speeds, **actions},
            self.STEP_DONE: actions,
            self.REFUSED: {},
        }
        charset = set(b"".join(t for table in self._next.values() for t in table))
        self.eog = np.array(sorted(eog), dtype=np.int64)
        # Only tokens made of the grammar's bytes can ever match; the rest are masked always.
        self._candidates = [(i, p) for i, p in enumerate(pieces)
                            if p and i not in eog and set(p) <= charset]
        self._allowed: dict[tuple[int, bytes], np.ndarray] = {}

    def start(self) -> tuple[int, bytes]:
        """Return the state before the first output token."""
        return (self.START, b"")

    def advance(self, state: tuple[int, bytes], piece: bytes) -> tuple[int, bytes] | None:
        """Return the state after ``piece``, or None when the grammar rejects it."""
        pos, partial = state
        for byte in piece:
            partial += bytes((byte,))
            table = self._next[pos]
            if partial in table:
                pos, partial = table[partial], b""
            elif not any(text.startswith(partial) for text in table):
                return None
        return (pos, partial)

    def allowed(self, state: tuple[int, bytes]) -> np.ndarray:
        """Return the sorted token ids the grammar allows next (cached per state)."""
        ids = self._allowed.get(state)
        if ids is None:
            ok = [i for i, p in self._candidates if self.advance(state, p) is not None]
            if state[1] == b"" and state[0] in self._COMPLETE:
                ok.extend(int(e) for e in self.eog)
            ids = np.array(sorted(ok), dtype=np.int64)
            self._allowed[state] = ids
        return ids
