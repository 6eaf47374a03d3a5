"""Out-of-domain commands for the planner corpus: what the robot must refuse, not guess.

An operator types things the action language cannot express: questions ("what's your battery
level"), chit-chat, requests for actions the robot has not got ("dance for me", "open the door"),
places and objects it does not know ("go to the bathroom", "grab the banana"), and misspelled
places and objects ("go to the kitchn"). Each is paired with the one-step plan ``<refuse>``.

Every out-of-domain command holds at least one word that is not a grammar word (the tokenizer
splits it into known prefixes and characters), so "an unknown word" is the signal the model can
learn, and no in-domain command ever carries it.

Held-out split: a fixed, seeded share of each list (phrases, places, objects, verbs) appears only
in held-out commands, so the held-out refusal rate tests commands the model never saw; the
issue's own examples ("what's your battery level", "dance for me", "go hom") are held out too.
Drawn from a random stream of their own (seeded from the corpus seed), so adding them leaves
the in-domain corpus unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from robot_latency.profiles.actions import COLORS, OBJECTS, REFUSE_ACTION, Step

__all__ = ["CHAT", "UNKNOWN_OBJECTS", "UNKNOWN_PLACES", "UNKNOWN_VERBS", "prefix_refusals",
           "refusal_commands"]

#: Questions and chit-chat: nothing to plan.
CHAT: tuple[str, ...] = (
    "what's your battery level", "how are you", "what time is it", "tell me a joke",
    "who are you", "what's the weather like", "sing a song", "dance for me", "do a dance",
    "play some music", "turn on the lights", "open the window", "call my mom", "order a pizza",
    "what can you do", "are you there", "good morning", "thank you", "hello", "hi there",
    "what is your name", "how old are you", "do you like music", "tell me a story",
    "what day is it", "set an alarm", "remind me later", "how far is the moon", "say something",
    "what's two plus two", "are you a robot", "i'm bored", "good night", "nice work",
    "what's for dinner", "how much battery is left", "is it raining outside",
    "what did you see", "show me a trick", "jump up and down", "spin around", "do a backflip",
    "clap your hands", "wave at me", "make me a coffee", "cook dinner", "vacuum the floor",
    "water the plants", "feed the cat", "lock the house", "turn off the tv", "check my email",
    "what's the news", "count to ten", "speak louder", "be quiet", "charge my phone",
    "translate this", "who won the game", "where am i", "do my homework", "laugh",
)  # fmt: skip
#: Places the robot has no map entry for.
UNKNOWN_PLACES: tuple[str, ...] = (
    "the bathroom", "the bedroom", "the attic", "the basement", "the office", "the garden",
    "the balcony", "home", "the roof", "the store", "the park", "the pool", "the porch",
    "the closet", "the library", "the moon", "the window", "upstairs", "downstairs",
    "the laundry room", "the car", "the street", "the school", "the fridge", "the oven",
    "the couch", "the bed", "the stairs", "the pantry", "the yard",
)  # fmt: skip
#: Objects the robot does not know.
UNKNOWN_OBJECTS: tuple[str, ...] = (
    "banana", "keys", "laptop", "cat", "dog", "shoe", "chair", "pen", "knife", "glasses",
    "wallet", "umbrella", "pillow", "blanket", "spoon", "fork", "bag", "hat", "jacket",
    "lamp", "toy", "orange juice", "bread", "cookie", "tablet", "charger cable", "plant",
    "scissors", "candle", "newspaper",
)  # fmt: skip
#: Verbs the robot has no action for, with known objects: "throw the ball".
UNKNOWN_VERBS: tuple[str, ...] = (
    "throw", "wash", "break", "eat", "kick", "paint", "open", "close", "clean", "fold", "cut",
    "fill", "empty", "hide", "shake", "smell", "count", "draw", "lick", "squeeze",
)  # fmt: skip
_GOTO = ("go to {L}", "move to {L}", "drive to {L}", "head to {L}", "navigate to {L}",
         "make your way to {L}", "go over to {L}", "return to {L}")
_PICK = ("pick up the {O}", "grab the {O}", "take the {O}", "get me the {O}", "fetch the {O}",
         "find the {O}", "bring me the {O}", "look for the {O}")
_PLACE = ("put the {O} in {L}", "bring the cup to {L}", "take the box to {L}",
          "put it in {L}", "leave it in {L}")
_POLITE = ("please", "robot", "hey robot", "can you", "could you")
_ISSUE_EXAMPLES = ("what's your battery level", "dance for me", "go hom")
_MISSPELL_TARGETS: tuple[str, ...] = (
    "kitchen", "table", "shelf", "hallway", "garage", "counter", "desk", "sink", "door",
    "workbench", "bottle", "sponge", "towel", "phone", "remote", "apple", "plate", "bowl",
)  # fmt: skip


def _split(items: tuple[str, ...], rng: random.Random, share: float) -> tuple[list[str], list[str]]:
    """Split ``items`` into (train-only, held-out-only) lists, seeded; at least one of each."""
    order = list(items)
    rng.shuffle(order)
    n_held = max(1, round(len(order) * share))
    held = [x for x in order[:n_held] if x not in _ISSUE_EXAMPLES]
    train = [x for x in order[n_held:] if x not in _ISSUE_EXAMPLES]
    return train, held + [x for x in items if x in _ISSUE_EXAMPLES]


def _misspell(word: str, rng: random.Random, known: frozenset[str]) -> str:
    """Return a misspelling of ``word`` (a letter dropped, doubled, swapped or replaced) that is
    no grammar word."""
    for _ in range(20):
        i = rng.randrange(len(word))
        kind = rng.randrange(4)
        if kind == 0 and len(word) > 3:
            out = word[:i] + word[i + 1:]
        elif kind == 1:
            out = word[:i] + word[i] + word[i:]
        elif kind == 2 and i < len(word) - 1:
            out = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        else:
            out = word[:i] + rng.choice("abcdefghijklmnopqrstuvwxyz") + word[i + 1:]
        if out != word and out not in known:
            return out
    return word + "z"


class _Drawer:
    """Draw out-of-domain command texts from one side (train or held-out) of the split."""

    def __init__(self, rng: random.Random, lists: dict[str, list[str]],
                 known: frozenset[str]) -> None:
        self.rng, self.lists, self.known = rng, lists, known

    def pick(self, name: str) -> str:
        items = self.lists[name]
        return items[self.rng.randrange(len(items))]

    def text(self) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.30:
            text = self.pick("chat")
        elif r < 0.48:
            text = rng.choice(_GOTO).format(L=self.pick("places"))
        elif r < 0.64:
            obj = self.pick("objects")
            if rng.random() < 0.3:
                obj = f"{rng.choice(COLORS)} {obj}"
            text = rng.choice(_PICK).format(O=obj)
        elif r < 0.72:
            text = rng.choice(_PLACE).format(O=rng.choice(OBJECTS), L=self.pick("places"))
        elif r < 0.84:
            text = f"{self.pick('verbs')} the {rng.choice(OBJECTS)}"
        else:
            word = rng.choice(_MISSPELL_TARGETS)
            wrong = _misspell(word, rng, self.known)
            if word in OBJECTS:
                text = rng.choice(_PICK).format(O=wrong)
            else:
                text = rng.choice(_GOTO).format(L=f"the {wrong}")
        if rng.random() < 0.2:
            text = f"{rng.choice(_POLITE)} {text}"
        return text


def refusal_commands(
    seed: int, n_train: int, n_heldout: int, *, grammar_words: frozenset[str],
    make: Callable[[str, tuple[Step, ...], bool], object],
) -> tuple[list, list]:
    """Return (train, held-out) out-of-domain commands, each paired with ``<refuse>``.

    Args:
        seed: the corpus seed (a stream of its own is derived from it).
        n_train: distinct training commands.
        n_heldout: distinct held-out commands (no text shared with training).
        grammar_words: the in-domain words; every command here holds a word outside them.
        make: builds one corpus row from ``(text, steps, heldout)``.

    Raises:
        RuntimeError: the lists cannot give that many distinct commands.
    """
    rng = random.Random(seed * 104729 + 17)
    sides: dict[str, dict[str, list[str]]] = {"train": {}, "held": {}}
    for name, items in (("chat", CHAT), ("places", UNKNOWN_PLACES),
                        ("objects", UNKNOWN_OBJECTS), ("verbs", UNKNOWN_VERBS)):
        train, held = _split(items, rng, 0.2)
        sides["train"][name], sides["held"][name] = train, held
    steps = (Step(REFUSE_ACTION),)
    out: dict[str, dict[str, object]] = {"train": {}, "held": {}}
    seen: set[str] = set()
    for side, want in (("train", n_train), ("held", n_heldout)):
        drawer = _Drawer(rng, sides[side], grammar_words)
        if side == "held":
            for text in _ISSUE_EXAMPLES:
                seen.add(text)
                out[side][text] = make(text, steps, True)
        for _ in range(200 * max(want, 1)):
            if len(out[side]) >= want:
                break
            text = drawer.text()
            if text in seen or all(w in grammar_words for w in text.split()):
                continue
            seen.add(text)
            out[side][text] = make(text, steps, side == "held")
        if len(out[side]) < want:
            raise RuntimeError(f"only {len(out[side])} distinct out-of-domain {side} commands")
    return list(out["train"].values()), list(out["held"].values())


def prefix_refusals(rows: Sequence[Any], n: int, *, grammar_words: frozenset[str], seed: int,
                    exclude: frozenset[str], make: Callable[[str, tuple[Step, ...], bool], object]
                    ) -> list:
    """Return ``n`` more out-of-domain training commands whose unknown word is a proper prefix of
    a grammar word ("count", of "counter").

    The planner's tokenizer gives every prefix of a grammar word a token of its own, so such a
    word reads as one known-looking piece, never as the characters other unknown words split
    into; without rows like these the model never sees that piece alone and plans it as the word
    it begins. Each row is a training refusal (``rows``: their ``text`` and ``steps``) with its
    first unknown word replaced by a prefix of at least three letters that is no grammar word.
    Texts in ``exclude`` (held-out and test commands) or already in ``rows`` are never made.
    Drawn from a stream of its own (``seed``), so the corpus itself is unchanged.
    """
    prefixes = sorted({w[:k] for w in grammar_words for k in range(3, len(w))} - grammar_words)
    rng = random.Random(seed * 7919 + 5)
    seen = set(exclude) | {r.text for r in rows}
    candidates = [r for r in rows if any(w not in grammar_words for w in r.text.split())]
    out: list = []
    for _ in range(50 * max(n, 1)):
        if len(out) >= n:
            break
        row = candidates[rng.randrange(len(candidates))]
        words = row.text.split()
        i = next(j for j, w in enumerate(words) if w not in grammar_words)
        words[i] = prefixes[rng.randrange(len(prefixes))]
        text = " ".join(words)
        if text not in seen:
            seen.add(text)
            out.append(make(text, row.steps, False))
    return out
