"""The shipped streams are labelled: every command, from the corpus, off-vocabulary ones too."""

from __future__ import annotations

from pathlib import Path

from robot_latency.models.corpus import CorpusConfig, generate_corpus
from robot_latency.profiles.actions import plan_json_schema
from robot_latency.profiles.labels import default_labels_path, read_labels, stream_labels
from robot_latency.streams import SHIPPED_DIR, SHIPPED_STREAMS, read_stream
from robot_latency.streams.labelled import REFUSE_SHARE, make_labelled_streams, mix_refusals


def test_every_shipped_command_is_labelled_and_a_share_must_be_refused() -> None:
    for spec in SHIPPED_STREAMS:
        bag = SHIPPED_DIR / spec.name
        path = default_labels_path(bag)
        assert path is not None
        stream = read_stream(bag)
        labels = stream_labels(stream.commands, schema=plan_json_schema(), source=str(bag),
                               sidecar=read_labels(path, schema=plan_json_schema()))
        judged = [labels.lookup(c.command_id) for c in stream.commands]
        assert all(label is not None for label in judged)
        refuse = sum(1 for label in judged if label.refuse)
        assert refuse == round(spec.n_commands * REFUSE_SHARE)


def test_the_shipped_labels_are_what_the_corpus_makes(tmp_path: Path) -> None:
    made = make_labelled_streams(tmp_path, generate_corpus(CorpusConfig()))
    for bag in made:
        assert (bag / "labels.jsonl").read_text() == \
            (SHIPPED_DIR / bag.name / "labels.jsonl").read_text()


def test_mix_refusals_replaces_a_seeded_share() -> None:
    texts = [f"go to the {i}" for i in range(20)]
    mixed = mix_refusals(texts, ["hello"], share=0.25, seed=3)
    assert mixed.count("hello") == 5 and mixed == mix_refusals(texts, ["hello"], share=0.25,
                                                               seed=3)
