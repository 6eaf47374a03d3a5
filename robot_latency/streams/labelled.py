"""The shipped streams, labelled: held-out commands with their plans, and off-vocabulary ones that
must be refused, each bag with its ``labels.jsonl`` beside it.

The corpus that trained the bundled planner knows the truth: every in-domain text is labelled
with its full plan (the expanded JSON form), every out-of-domain text (a question, chit-chat, an
unknown or misspelled place or object) with ``"refuse"``. Both come from the held-out parts of the
corpus, so the planner never saw a command of the streams in training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from robot_latency.models.corpus import Command as CorpusCommand
from robot_latency.models.corpus import Corpus
from robot_latency.profiles.actions import expand_to_plan
from robot_latency.profiles.labels import LABELS_NAME, REFUSE_LABEL
from robot_latency.streams.arrivals import make_stream_file
from robot_latency.streams.shipped import SHIPPED_STREAMS, StreamSpec, pick_texts

__all__ = ["REFUSE_SHARE", "corpus_label", "corpus_truth", "make_labelled_streams", "mix_refusals",
           "write_corpus_labels"]

#: Share of a shipped stream's commands that are off-vocabulary (labelled ``refuse``).
REFUSE_SHARE = 0.2


def corpus_label(command: CorpusCommand) -> object:
    """Return a corpus row's label: ``"refuse"`` or its full plan in the expanded form."""
    if len(command.steps) == 1 and command.steps[0].action == REFUSE_LABEL:
        return REFUSE_LABEL
    return expand_to_plan(command.steps)


def mix_refusals(texts: list[str], refusals: Sequence[str], *, share: float,
                 seed: int) -> list[str]:
    """Return ``texts`` with a seeded ``share`` of the positions replaced by refusal texts."""
    rng = np.random.default_rng(seed + 7919)
    out = list(texts)
    n = round(len(out) * share)
    for pos in sorted(rng.choice(len(out), size=n, replace=False).tolist()):
        out[pos] = refusals[int(rng.integers(len(refusals)))]
    return out


def make_labelled_streams(out_dir: Path | str, corpus: Corpus, *,
                          specs: Sequence[StreamSpec] = SHIPPED_STREAMS,
                          storage: str = "mcap", share: float = REFUSE_SHARE) -> list[Path]:
    """Write one bag per spec (held-out commands, ``share`` of them off-vocabulary) with its
    ``labels.jsonl`` (one ``{"text", "expected"}`` per distinct text).

    Raises:
        StreamError: a bag cannot be written (e.g. it exists already).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    truth = corpus_truth(corpus)
    in_domain = [c.text for c in corpus.heldout]
    refusals = [c.text for c in corpus.refuse_heldout]
    paths = []
    for spec in specs:
        texts = mix_refusals(pick_texts(in_domain, spec.n_commands, seed=spec.seed), refusals,
                             share=share, seed=spec.seed)
        path = make_stream_file(out_dir / spec.name, texts, process=spec.process,
                                rate_hz=spec.rate_hz, seed=spec.seed, storage=storage,
                                burst_size=spec.burst_size, burst_gap_s=spec.burst_gap_s,
                                frames_hz=spec.frames_hz)
        write_corpus_labels(path, texts, truth)
        paths.append(path)
    return paths


def corpus_truth(corpus: Corpus) -> dict[str, object]:
    """Every held-out text of ``corpus`` (in-domain and off-vocabulary) -> its label."""
    return {c.text: corpus_label(c) for c in (*corpus.heldout, *corpus.refuse_heldout)}


def write_corpus_labels(bag: Path, texts: Sequence[str], truth: dict[str, object]) -> Path:
    """Write ``bag/labels.jsonl``: one ``{"text", "expected"}`` per distinct text of ``texts``
    (each a key of ``truth``, :func:`corpus_truth`)."""
    lines = [json.dumps({"text": t, "expected": truth[t]}) for t in dict.fromkeys(texts)]
    path = bag / LABELS_NAME
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
