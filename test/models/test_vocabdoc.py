"""docs/PLANNER.md's vocabulary and step rules are the code's: generated, and checked here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from robot_latency.models import corpus, vocabdoc
from robot_latency.profiles.actions import parse_actions
from robot_latency.profiles.vocabulary import COLORS, LOCATIONS, OBJECTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "PLANNER.md"


def generated_block(text: str) -> str:
    return text.split(vocabdoc.BEGIN, 1)[1].split(vocabdoc.END, 1)[0].lstrip("\n")


def test_the_doc_holds_the_rendering_of_the_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert generated_block(text) == vocabdoc.render(), (
        "docs/PLANNER.md's vocabulary differs from the code: run "
        "`python -m robot_latency.models.vocabdoc --write docs/PLANNER.md`")


def test_every_word_of_the_vocabulary_is_in_the_rendering() -> None:
    block = vocabdoc.render()
    for name in (*COLORS, *OBJECTS, *LOCATIONS):
        assert f"`{name}`" in block, name
    for phrases in corpus.LOCATION_PHRASES.values():
        assert all(f'"{phrase}"' in block for phrase in phrases)


def test_each_example_plan_parses_back_to_its_steps() -> None:
    plans = re.findall(r"`((?:<[a-z_:]+>)+<end>)`", vocabdoc.render())
    assert len(plans) >= 12
    for plan in plans:
        assert parse_actions(plan.removesuffix("<end>")), plan


def test_the_examples_use_the_shipped_corpus_config() -> None:
    config = vocabdoc.shipped_corpus_config()
    assert f"at most {config.max_clauses} clauses" in vocabdoc.render()


def test_write_replaces_only_the_block(tmp_path: Path) -> None:
    doc = tmp_path / "PLANNER.md"
    doc.write_text(f"# head\n\n{vocabdoc.BEGIN}\nstale\n{vocabdoc.END}\ntail\n")
    assert vocabdoc.main(["--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# head\n") and text.endswith(f"{vocabdoc.END}\ntail\n")
    assert generated_block(text) == vocabdoc.render()
    with pytest.raises(ValueError, match="markers"):
        vocabdoc.replace_block("no markers here", "x")
