"""Generate the planner corpus: operator commands in plain English paired with their plans.

Commands come from a small grammar: one to three clauses joined by connectors ("and then",
"after that"), each clause one of a few kinds (go somewhere, pick up / find an object, put it
somewhere, bring something to the operator, stop, wait) with several paraphrase templates, objects
with or without colours, location synonyms, speed modifiers before or after the clause, and polite
prefixes. A speed modifier applies to every step of its own clause (not stop or wait).

Held-out split: a fixed, seeded set of *combinations* never appears in training: some
(colour, object) pairs and some (paraphrase template, location) pairs. Every word and every single
template is seen in training; the held-out commands test whether the model composes them.

Out-of-domain commands (questions, chit-chat, unknown or misspelled places and objects) are
paired with ``<refuse>`` (:mod:`robot_latency.models.ood`), held out the same way.

Everything is deterministic under the seed. Command text is normalised (lower case, words separated
by single spaces, no punctuation): feed the engine ``normalize_command(text)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from robot_latency.models.ood import refusal_commands
from robot_latency.profiles.actions import COLORS, LOCATIONS, OBJECTS, Step, steps_to_tokens
from robot_latency.profiles.normalize import normalize_command

__all__ = [
    "Command",
    "Corpus",
    "CorpusConfig",
    "corpus_config_from_dict",
    "generate_corpus",
    "grammar_words",
    "heldout_keys",
    "normalize_command",
]

# --------------------------------------------------------------------------------------------------
# Grammar data
# --------------------------------------------------------------------------------------------------

LOCATION_PHRASES: dict[str, tuple[str, ...]] = {
    "kitchen": ("the kitchen",),
    "table": ("the table", "the dining table"),
    "tray": ("the tray",),
    "shelf": ("the shelf", "the bookshelf"),
    "charging_dock": ("the charging dock", "the charger", "the dock", "the charging station"),
    "door": ("the door", "the front door"),
    "bin": ("the bin", "the trash bin", "the recycling bin"),
    "sink": ("the sink",),
    "counter": ("the counter", "the kitchen counter"),
    "desk": ("the desk", "my desk"),
    "workbench": ("the workbench", "the bench"),
    "living_room": ("the living room", "the lounge"),
    "garage": ("the garage",),
    "hallway": ("the hallway", "the corridor"),
}
PLACE_PREPS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("table", "tray", "shelf", "counter", "desk", "workbench"), ("on", "onto")),
    **dict.fromkeys(
        ("bin", "sink", "kitchen", "living_room", "garage", "hallway"), ("in", "into", "inside")
    ),
    **dict.fromkeys(("door", "charging_dock"), ("at", "by", "next to")),
}
# The operator is a location only for "goto" ("come here"), never a phrase in other templates.
PLACE_LOCATIONS: tuple[str, ...] = tuple(loc for loc in LOCATIONS if loc != "operator")

GOTO_TEMPLATES = (
    "go to {L}", "move to {L}", "drive to {L}", "head to {L}", "navigate to {L}", "go over to {L}",
    "make your way to {L}", "return to {L}", "head over to {L}",
)  # fmt: skip
GOTO_OPERATOR = ("come here", "come to me", "come back to me", "come back here", "return to me")
PICK_TEMPLATES = (
    "pick up {O}", "pick {O} up", "grab {O}", "take {O}", "get {O}", "lift {O}", "grasp {O}",
    "collect {O}",
)  # fmt: skip
FIND_TEMPLATES = ("find {O}", "look for {O}", "locate {O}", "search for {O}", "go find {O}")
PLACE_TEMPLATES = (
    "put it {P} {L}", "place it {P} {L}", "drop it {P} {L}", "leave it {P} {L}",
    "set it down {P} {L}", "put that {P} {L}",
)  # fmt: skip
GIVE_TEMPLATES = ("give it to me", "hand it to me", "hand it over", "pass it to me")
STOP_TEMPLATES = (
    "stop", "halt", "freeze", "stop moving", "stop right now", "emergency stop", "stop immediately",
)  # fmt: skip
WAIT_TEMPLATES = ("wait", "wait here", "hold on", "pause", "stay there", "wait a moment",
                  "stay put")
PICK_PLACE_TEMPLATES = (
    "put {O} {P} {L}", "place {O} {P} {L}", "move {O} to {L}", "take {O} to {L}",
    "bring {O} to {L}", "carry {O} to {L}", "drop {O} {P} {L}",
)  # fmt: skip
BRING_ME_TEMPLATES = (
    "bring me {O}", "fetch me {O}", "get me {O}", "bring {O} to me", "fetch {O} for me",
    "hand me {O}",
)  # fmt: skip
BRING_FROM_TEMPLATES = ("bring me {O} from {L}", "fetch {O} from {L}", "get me {O} from {L}")
PICK_FROM_TEMPLATES = ("grab {O} from {L}", "pick up {O} from {L}", "collect {O} from {L}")

DETERMINERS = ("the", "the", "the", "the", "a", "that")
SLOW_SUFFIX = ("slowly", "carefully", "gently", "at low speed", "nice and slow")
SLOW_PREFIX = ("slowly", "carefully", "gently")
FAST_SUFFIX = ("quickly", "fast", "at full speed", "as fast as you can", "quick")
FAST_PREFIX = ("quickly", "hurry and")
POLITE_PREFIX = ("please", "robot", "hey robot", "can you", "could you", "robot please", "now")
POLITE_SUFFIX = ("please", "now", "thanks")
CONNECTORS = ("and", "and then", "then", "after that", "and after that", "next")

_ALL_PHRASES: tuple[tuple[str, ...], ...] = (
    GOTO_TEMPLATES, GOTO_OPERATOR, PICK_TEMPLATES, FIND_TEMPLATES, PLACE_TEMPLATES,
    GIVE_TEMPLATES, STOP_TEMPLATES, WAIT_TEMPLATES, PICK_PLACE_TEMPLATES, BRING_ME_TEMPLATES,
    BRING_FROM_TEMPLATES, PICK_FROM_TEMPLATES, DETERMINERS, SLOW_SUFFIX, SLOW_PREFIX,
    FAST_SUFFIX, FAST_PREFIX, POLITE_PREFIX, POLITE_SUFFIX, CONNECTORS, COLORS, OBJECTS,
    ("first",), *LOCATION_PHRASES.values(), *PLACE_PREPS.values(),
)  # fmt: skip

def grammar_words() -> list[str]:
    """Return every word the command grammar can produce, sorted.

    Returns:
        The distinct words (the tokenizer gives each its own token).
    """
    words: set[str] = set()
    for group in _ALL_PHRASES:
        for phrase in group:
            for word in phrase.split():
                if not word.startswith("{"):
                    words.add(word)
    return sorted(words)


# --------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One corpus row.

    Attributes:
        text: the normalised command.
        steps: its plan.
        heldout: True when it uses a held-out combination (never in training).
    """

    text: str
    steps: tuple[Step, ...]
    heldout: bool = False

    @property
    def plan_tokens(self) -> list[str]:
        """Return the plan as action tokens, ending in ``<end>``."""
        return steps_to_tokens(self.steps)

    @property
    def plan_text(self) -> str:
        """Return the plan as the model emits it, e.g. ``"<goto><loc:kitchen>"`` (no ``<end>``)."""
        return "".join(steps_to_tokens(self.steps, end=False))


@dataclass(frozen=True)
class CorpusConfig:
    """How much corpus to make and what to hold out.

    Attributes:
        seed: drives every random choice.
        n_train: distinct training commands.
        n_heldout: distinct held-out commands.
        heldout_pairs: how many (colour, object) pairs to hold out.
        heldout_template_fraction: fraction of (template, location) pairs to hold out.
        max_clauses: most clauses per command (1 to 3); each clause is one to three steps.
        n_refuse_train: distinct out-of-domain training commands (plan ``<refuse>``).
        n_refuse_heldout: distinct out-of-domain held-out commands.
    """

    seed: int = 1234
    n_train: int = 20000
    n_heldout: int = 1000
    heldout_pairs: int = 12
    heldout_template_fraction: float = 0.12
    max_clauses: int = 2
    n_refuse_train: int = 3000
    n_refuse_heldout: int = 300


def corpus_config_from_dict(data: dict) -> CorpusConfig:
    """Rebuild a corpus config from a mapping (e.g. a manifest's ``corpus`` entry).

    Args:
        data: a mapping with at least the config's fields; other keys are ignored.

    Returns:
        The config.
    """
    names = CorpusConfig.__dataclass_fields__
    return CorpusConfig(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Corpus:
    """A generated corpus.

    Attributes:
        config: what made it.
        train: training commands (no held-out combination).
        heldout: held-out commands (each with at least one held-out combination).
        refuse_train: out-of-domain training commands, each planned ``<refuse>``.
        refuse_heldout: out-of-domain held-out commands (words and phrases never in training).
    """

    config: CorpusConfig
    train: list[Command] = field(default_factory=list)
    heldout: list[Command] = field(default_factory=list)
    refuse_train: list[Command] = field(default_factory=list)
    refuse_heldout: list[Command] = field(default_factory=list)


Key = tuple[str, str, str]


def heldout_keys(config: CorpusConfig) -> frozenset[Key]:
    """Return the held-out combinations for a config.

    Keys are ``("pair", colour, object)`` and ``("tmpl", template_id, location)``. Every colour,
    object, template and location still appears in training in other combinations.

    Args:
        config: the corpus config (its seed and hold-out sizes).

    Returns:
        The set of held-out keys.
    """
    rng = random.Random(config.seed * 7919 + 1)
    pairs = [(c, o) for c in COLORS for o in OBJECTS]
    keys: set[Key] = set()
    rng.shuffle(pairs)
    used_c: dict[str, int] = {}
    used_o: dict[str, int] = {}
    for c, o in pairs:
        if len([k for k in keys if k[0] == "pair"]) >= config.heldout_pairs:
            break
        if used_c.get(c, 0) >= 2 or used_o.get(o, 0) >= 1:
            continue  # keep every colour and object well covered in training
        keys.add(("pair", c, o))
        used_c[c] = used_c.get(c, 0) + 1
        used_o[o] = used_o.get(o, 0) + 1
    families = {
        "goto": GOTO_TEMPLATES,
        "place": PLACE_TEMPLATES,
        "pickplace": PICK_PLACE_TEMPLATES,
        "bringfrom": BRING_FROM_TEMPLATES,
        "pickfrom": PICK_FROM_TEMPLATES,
    }
    for fam, templates in families.items():
        combos = [(f"{fam}{i}", loc) for i in range(len(templates)) for loc in PLACE_LOCATIONS]
        rng.shuffle(combos)
        for tid, loc in combos[: round(len(combos) * config.heldout_template_fraction)]:
            keys.add(("tmpl", tid, loc))
    return frozenset(keys)


@dataclass
class _Clause:
    text: str
    steps: list[Step]
    keys: set[Key]


class _Generator:
    """Draw random commands from the grammar."""

    def __init__(self, rng: random.Random, max_clauses: int) -> None:
        self.rng = rng
        self.max_clauses = max_clauses

    def choice(self, seq):  # type: ignore[no-untyped-def]
        return seq[self.rng.randrange(len(seq))]

    def obj(self, keys: set[Key]) -> tuple[str, str, str | None]:
        noun = self.choice(OBJECTS)
        det = self.choice(DETERMINERS)
        if self.rng.random() < 0.6:
            color = self.choice(COLORS)
            keys.add(("pair", color, noun))
            return f"{det} {color} {noun}", noun, color
        return f"{det} {noun}", noun, None

    def loc(self) -> tuple[str, str]:
        loc = self.choice(PLACE_LOCATIONS)
        return self.choice(LOCATION_PHRASES[loc]), loc

    def templated(self, fam: str, templates: tuple[str, ...]) -> tuple[str, str]:
        i = self.rng.randrange(len(templates))
        return templates[i], f"{fam}{i}"

    def clause(self, kind: str) -> _Clause:
        keys: set[Key] = set()
        if kind == "goto":
            if self.rng.random() < 0.12:
                return _Clause(self.choice(GOTO_OPERATOR), [Step("goto", "operator")], keys)
            tmpl, tid = self.templated("goto", GOTO_TEMPLATES)
            phrase, loc = self.loc()
            keys.add(("tmpl", tid, loc))
            return _Clause(tmpl.format(L=phrase), [Step("goto", loc)], keys)
        if kind in ("pick", "find"):
            tmpl = self.choice(PICK_TEMPLATES if kind == "pick" else FIND_TEMPLATES)
            phrase, noun, color = self.obj(keys)
            return _Clause(tmpl.format(O=phrase), [Step(kind, noun, color)], keys)
        if kind == "place":
            tmpl, tid = self.templated("place", PLACE_TEMPLATES)
            phrase, loc = self.loc()
            keys.add(("tmpl", tid, loc))
            text = tmpl.format(P=self.choice(PLACE_PREPS[loc]), L=phrase)
            return _Clause(text, [Step("place", loc)], keys)
        if kind == "give":
            return _Clause(self.choice(GIVE_TEMPLATES), [Step("give")], keys)
        if kind == "wait":
            return _Clause(self.choice(WAIT_TEMPLATES), [Step("wait")], keys)
        if kind == "stop":
            return _Clause(self.choice(STOP_TEMPLATES), [Step("stop")], keys)
        if kind == "pickplace":
            tmpl, tid = self.templated("pickplace", PICK_PLACE_TEMPLATES)
            ophrase, noun, color = self.obj(keys)
            lphrase, loc = self.loc()
            keys.add(("tmpl", tid, loc))
            text = tmpl.format(O=ophrase, P=self.choice(PLACE_PREPS[loc]), L=lphrase)
            return _Clause(text, [Step("pick", noun, color), Step("place", loc)], keys)
        if kind == "bringme":
            ophrase, noun, color = self.obj(keys)
            text = self.choice(BRING_ME_TEMPLATES).format(O=ophrase)
            return _Clause(text, [Step("pick", noun, color), Step("give")], keys)
        if kind in ("bringfrom", "pickfrom"):
            templates = BRING_FROM_TEMPLATES if kind == "bringfrom" else PICK_FROM_TEMPLATES
            tmpl, tid = self.templated(kind, templates)
            ophrase, noun, color = self.obj(keys)
            lphrase, loc = self.loc()
            keys.add(("tmpl", tid, loc))
            steps = [Step("goto", loc), Step("pick", noun, color)]
            if kind == "bringfrom":
                steps.append(Step("give"))
            return _Clause(tmpl.format(O=ophrase, L=lphrase), steps, keys)
        raise ValueError(f"unknown clause kind {kind!r}")

    def with_speed(self, clause: _Clause) -> _Clause:
        if all(s.action in ("stop", "wait") for s in clause.steps):
            return clause
        r = self.rng.random()
        if r < 0.7:
            return clause
        speed = "slow" if r < 0.85 else "fast"
        prefix = self.rng.random() < 0.3
        if speed == "slow":
            word = self.choice(SLOW_PREFIX if prefix else SLOW_SUFFIX)
        else:
            word = self.choice(FAST_PREFIX if prefix else FAST_SUFFIX)
        text = f"{word} {clause.text}" if prefix else f"{clause.text} {word}"
        steps = [
            s if s.action in ("stop", "wait") else Step(s.action, s.target, s.color, speed)
            for s in clause.steps
        ]
        return _Clause(text, steps, clause.keys)

    KINDS: tuple[tuple[str, float], ...] = (
        ("goto", 0.20), ("pick", 0.14), ("place", 0.10), ("find", 0.08), ("give", 0.05),
        ("wait", 0.05), ("pickplace", 0.16), ("bringme", 0.10), ("bringfrom", 0.07),
        ("pickfrom", 0.05),
    )  # fmt: skip

    def command(self) -> tuple[str, list[Step], set[Key]]:
        if self.rng.random() < 0.05:
            clause = self.clause("stop")
            clauses = [clause]
        else:
            r = self.rng.random()
            n = min(self.max_clauses, 1 if r < 0.5 else 2 if r < 0.85 else 3)
            kinds, weights = zip(*self.KINDS, strict=True)
            clauses = [
                self.with_speed(self.clause(k)) for k in self.rng.choices(kinds, weights, k=n)
            ]
        parts = [clauses[0].text]
        for c in clauses[1:]:
            parts.append(self.choice(CONNECTORS))
            parts.append(c.text)
        text = " ".join(parts)
        if len(clauses) > 1 and self.rng.random() < 0.1:
            text = f"first {text}"
        elif self.rng.random() < 0.3:
            text = f"{self.choice(POLITE_PREFIX)} {text}"
        if self.rng.random() < 0.1:
            text = f"{text} {self.choice(POLITE_SUFFIX)}"
        steps = [s for c in clauses for s in c.steps]
        keys = set().union(*(c.keys for c in clauses))
        return text, steps, keys


def _iter_commands(config: CorpusConfig) -> Iterator[Command]:
    held = heldout_keys(config)
    gen = _Generator(random.Random(config.seed), config.max_clauses)
    while True:
        text, steps, keys = gen.command()
        yield Command(text=text, steps=tuple(steps), heldout=bool(keys & held))


def generate_corpus(
    config: CorpusConfig | None = None,
    *,
    seed: int | None = None,
    max_draws: int = 2_000_000,
    progress: Callable[[int], None] | None = None,
) -> Corpus:
    """Generate a corpus, deterministic under the seed.

    Args:
        config: sizes and seed; defaults to ``CorpusConfig()``.
        seed: overrides ``config.seed`` when given.
        max_draws: give up after this many random commands.
        progress: called with the number of draws every 100k draws.

    Returns:
        The corpus: ``n_train`` distinct training and ``n_heldout`` distinct held-out commands;
        no held-out text is a training text.

    Raises:
        RuntimeError: the grammar cannot yield enough distinct commands within ``max_draws``.
    """
    config = config or CorpusConfig()
    if seed is not None:
        config = CorpusConfig(**{**config.__dict__, "seed": seed})
    train: dict[str, Command] = {}
    held: dict[str, Command] = {}
    for n, cmd in enumerate(_iter_commands(config), start=1):
        bucket, want = (held, config.n_heldout) if cmd.heldout else (train, config.n_train)
        if len(bucket) < want and cmd.text not in bucket:
            bucket[cmd.text] = cmd
        if len(train) >= config.n_train and len(held) >= config.n_heldout:
            break
        if progress is not None and n % 100_000 == 0:
            progress(n)
        if n >= max_draws:
            raise RuntimeError(
                f"only {len(train)} train / {len(held)} held-out commands after {n} draws"
            )
    refuse_train, refuse_held = refusal_commands(
        config.seed, config.n_refuse_train, config.n_refuse_heldout,
        grammar_words=frozenset(grammar_words()), make=Command)
    return Corpus(config=config, train=list(train.values()), heldout=list(held.values()),
                  refuse_train=refuse_train, refuse_heldout=refuse_held)
