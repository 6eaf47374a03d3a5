"""The keyword fallback planner: commands it can read, and the ones it must not guess."""

from __future__ import annotations

import pytest

from robot_latency.profiles.actions import (
    REFUSE_ACTION,
    Step,
    expand_to_plan,
    is_refusal,
    steps_to_tokens,
    validate_plan,
)
from robot_latency.profiles.rules import rule_plan, rule_plan_json


@pytest.mark.parametrize(("command", "tokens"), [
    ("pick up the red cup and put it on the tray",
     "<pick><col:red><obj:cup><place><loc:tray><end>"),
    ("Stop!", "<stop><end>"),
    ("please stop picking up the cup", "<stop><end>"),  # a stop anywhere wins
    ("go to the charging dock slowly", "<goto><loc:charging_dock><slow><end>"),
    ("bring me the blue bottle from the kitchen", "<pick><col:blue><obj:bottle><give><end>"),
    ("take the box to the garage", "<pick><obj:box><place><loc:garage><end>"),
    ("pick up the cup from the table", "<pick><obj:cup><end>"),
    ("find the green ball then go to the garage quickly",
     "<find><col:green><obj:ball><fast><goto><loc:garage><fast><end>"),
    ("grab the mugs and hand it to me", "<pick><obj:mug><give><end>"),
    ("wait here", "<wait><end>"),
    # "can" is an object and a modal verb: the modal is never read as a target
    ("can you find my phone", "<find><obj:phone><end>"),
    ("Could you bring me the can?", "<pick><obj:can><give><end>"),
    ("you can pick up the can", "<pick><obj:can><end>"),
    ("the robot can fetch the cup", "<pick><obj:cup><end>"),
    ("pick up the cans", "<pick><obj:can><end>"),
])
def test_reads_commands(command: str, tokens: str) -> None:
    steps = rule_plan(command)
    assert steps is not None
    assert "".join(steps_to_tokens(steps)) == tokens
    validate_plan(expand_to_plan(steps))  # always a valid plan


@pytest.mark.parametrize("command", ["", "   ", "\x00\x01", "1234 5678"])
def test_no_words_no_plan(command: str) -> None:
    assert rule_plan(command) is None


@pytest.mark.parametrize("command", ["hello there", "pick it up", "go over there",
                                     "can you help me", "find a scan of the cupboard",
                                     "What's your battery level?", "Dance for me", "go hom"])
def test_refuses_what_it_cannot_read(command: str) -> None:
    # Never guessed into a motion: a refusal, the one-step plan of its own.
    assert rule_plan(command) == [Step(REFUSE_ACTION)]
    assert is_refusal(rule_plan_json(command))
    assert "".join(steps_to_tokens(rule_plan(command))) == "<refuse><end>"


def test_come_here_goes_to_the_operator() -> None:
    assert rule_plan("come here please") == [Step("goto", "operator")]
