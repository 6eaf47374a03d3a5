"""Whether a streamed output is complete yet, read piece by piece (for a server's stream).

The in-process engines ask :func:`~robot_latency.engines.base.output_done` after each token. A
server streams text in chunks, and asking the same question of the whole text at every chunk
parses all of it again each time (a JSON plan ends many chunks on a ``"``, any of which could
close it). :class:`CompletionWatch` reads each new piece once and keeps what it needs to know:

- ``json``: a scanner over the new characters (inside a string or not, an escape pending, how
  deep the nesting is); the full parse (:func:`~robot_latency.profiles.contract.output_complete`)
  runs only when the top-level object or array closes. A top-level scalar (rare: the contracts
  ask for an object) is checked as the in-process engines check it.
- ``actions``: the end token looked for in the new piece and the few characters before it.

Completeness alone, not validity, as in the in-process engines: nothing the contract allows can
follow, so the stream can stop; the caller judges the plan.
"""

from __future__ import annotations

from robot_latency.engines.base import output_done


class CompletionWatch:
    """Say, piece by piece, when the text streamed so far is a complete output of ``kind``.

    Args:
        kind: the output contract's kind (``json``, ``actions``); None or another kind: never
            complete (only the server's own end stops the stream).
    """

    def __init__(self, kind: str | None) -> None:
        from robot_latency.profiles.actions import END_TOKEN

        self.kind = kind
        self._end_token = END_TOKEN
        self._pieces: list[str] = []
        self._tail = ""          # actions: the last len(END_TOKEN) - 1 characters seen
        self._depth = 0          # json: open objects and arrays
        self._in_string = False
        self._escape = False
        self._top: str | None = None  # json: "container", "scalar", or None (nothing yet)
        self._closed = False     # json: the top-level container closed (complete or broken)
        self.complete = False

    def feed(self, piece: str) -> bool:
        """Take the next streamed ``piece``; return whether the text is now complete."""
        if self.complete or not piece:
            return self.complete
        self._pieces.append(piece)
        if self.kind == "actions":
            window = self._tail + piece
            self.complete = self._end_token in window
            self._tail = window[-(len(self._end_token) - 1):]
        elif self.kind == "json":
            self.complete = self._feed_json(piece)
        return self.complete

    def _feed_json(self, piece: str) -> bool:
        if self._top == "scalar":
            return self._check_whole()
        closed_now = False
        for ch in piece:
            if self._closed:
                if not ch.isspace():
                    return False  # text after the top-level value: never one JSON value
                continue
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
                continue
            if self._top is None:
                if ch.isspace():
                    continue
                if ch not in "{[":
                    self._top = "scalar"
                    return self._check_whole()
                self._top = "container"
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._closed = closed_now = True
        return closed_now and self._check_whole()

    def _check_whole(self) -> bool:
        """The full check, on the whole text (once a container closed; each piece of a
        scalar)."""
        return output_done("json", "".join(self._pieces).encode())
