"""The action language's vocabulary: the actions, objects, colours, locations and speeds, and
the token each one is written as (``<pick>``, ``<col:red>``, ``<obj:cup>``, ``<loc:tray>``).

The parser (:mod:`robot_latency.profiles.actions`) and the schema and grammar
(:mod:`robot_latency.profiles.action_schema`)
are built from these lists, so they cannot drift apart.
"""

from __future__ import annotations

__all__ = [
    "ACTIONS",
    "ACTION_TOKENS",
    "COLORS",
    "END_TOKEN",
    "LOCATIONS",
    "LOCATION_ACTIONS",
    "NO_SPEED_ACTIONS",
    "OBJECTS",
    "OBJECT_ACTIONS",
    "PLAN_TOKEN",
    "REFUSE_ACTION",
    "REFUSE_TOKEN",
    "SPEEDS",
    "SPEED_VALUES",
    "action_token",
    "color_token",
    "location_token",
    "object_token",
]

ACTIONS: tuple[str, ...] = ("pick", "find", "place", "goto", "give", "stop", "wait")
OBJECT_ACTIONS: frozenset[str] = frozenset({"pick", "find"})
LOCATION_ACTIONS: frozenset[str] = frozenset({"place", "goto"})
NO_SPEED_ACTIONS: frozenset[str] = frozenset({"stop", "wait"})
# "Cannot plan": a whole plan of its own (never a step among motions), no target, no speed.
# It is not in ACTIONS, which are the motions a plan may chain.
REFUSE_ACTION = "refuse"

COLORS: tuple[str, ...] = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")
OBJECTS: tuple[str, ...] = (
    "cup", "bottle", "box", "ball", "book", "can", "mug", "plate", "bowl", "apple", "sponge",
    "towel", "phone", "remote",
)  # fmt: skip
LOCATIONS: tuple[str, ...] = (
    "kitchen", "table", "tray", "shelf", "charging_dock", "door", "bin", "sink", "counter",
    "desk", "workbench", "living_room", "garage", "hallway", "operator",
)  # fmt: skip
# Explicit speed tokens; "normal" is the absence of one.
SPEEDS: tuple[str, ...] = ("slow", "fast")
SPEED_VALUES: tuple[str, ...] = ("slow", "normal", "fast")

PLAN_TOKEN = "<plan>"  # separates the command from the plan in the prompt
END_TOKEN = "<end>"  # ends the plan; the GGUF's EOS token
REFUSE_TOKEN = f"<{REFUSE_ACTION}>"  # the planner's refusal: the whole plan, then <end>


def action_token(name: str) -> str:
    """Return the token of action ``name``."""
    return f"<{name}>"


def color_token(name: str) -> str:
    """Return the token of color ``name``."""
    return f"<col:{name}>"


def object_token(name: str) -> str:
    """Return the token of object ``name``."""
    return f"<obj:{name}>"


def location_token(name: str) -> str:
    """Return the token of location ``name``."""
    return f"<loc:{name}>"


ACTION_TOKENS: tuple[str, ...] = (
    tuple(action_token(a) for a in ACTIONS)
    + tuple(color_token(c) for c in COLORS)
    + tuple(object_token(o) for o in OBJECTS)
    + tuple(location_token(loc) for loc in LOCATIONS)
    + tuple(action_token(s) for s in SPEEDS)
    + (REFUSE_TOKEN,)
)
"""Every token the model may emit before ``<end>``, in vocabulary order."""
