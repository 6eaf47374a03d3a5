"""The keyword fallback planner: commands it can read, and the ones it must not guess."""

from __future__ import annotations

import pytest

from robot_latency.profiles.actions import expand_to_plan, steps_to_tokens, validate_plan
from robot_latency.profiles.rules import rule_plan


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


@pytest.mark.parametrize("command", ["", "   ", "hello there", "pick it up", "go over there",
                                     "\x00\x01", "1234 5678", "can you help me",
                                     "find a scan of the cupboard"])
def test_does_not_guess(command: str) -> None:
    assert rule_plan(command) is None
