"""The incremental completeness check of a streamed output agrees with the whole-text check
(:func:`robot_latency.profiles.contract.output_complete`) at every point of a stream, however the
text is cut into pieces."""

from __future__ import annotations

import json

import pytest

from robot_latency.engines.completion import CompletionWatch
from robot_latency.profiles.contract import output_complete

PLAN = {"steps": [{"action": "pick", "target": "cup", "target_kind": "object", "color": "red",
                   "speed": "normal"}, {"action": "say", "target": "a \"quoted\" } ] {",
                                        "target_kind": None, "color": None, "speed": "slow"}]}
TEXTS = [
    ("json", json.dumps(PLAN, separators=(",", ":"))),
    ("json", "  " + json.dumps(PLAN) + " "),
    ("json", '[1, [2, {"a": "\\\\"}], "x\\"]"]'),
    ("json", '{"a": 1}} trailing'),        # never one JSON value
    ("json", '{"a": }'),                    # closes, but is not JSON
    ("json", '"a bare string"'),            # a top-level scalar
    ("actions", "<pick><col:red><obj:cup><end>"),
    ("actions", "<pick><col:red><obj:cup>"),
]


def _first_complete(kind: str, text: str, cut: int) -> int | None:
    """Feed ``text`` in pieces of ``cut`` characters; return the end of the piece where the
    watch first said complete."""
    watch = CompletionWatch(kind)
    for end in range(cut, len(text) + cut, cut):
        if watch.feed(text[end - cut: end]):
            return min(end, len(text))
    return None


@pytest.mark.parametrize(("kind", "text"), TEXTS)
@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_the_watch_agrees_with_the_whole_text_check(kind: str, text: str, cut: int) -> None:
    want = next((end for end in range(cut, len(text) + cut, cut)
                 if output_complete(kind, text[: min(end, len(text))])), None)
    got = _first_complete(kind, text, cut)
    assert got == (None if want is None else min(want, len(text)))


def test_a_kind_without_a_completeness_rule_never_completes() -> None:
    watch = CompletionWatch(None)
    assert not watch.feed("{}") and not watch.feed("<end>")


def test_once_complete_it_stays_complete() -> None:
    watch = CompletionWatch("json")
    assert watch.feed("{}") and watch.feed(" more") and watch.complete
