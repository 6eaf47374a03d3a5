"""``streams``: write command streams, rosbag2 bags of operator commands with an arrival process."""

from __future__ import annotations

import argparse
from pathlib import Path

from robot_latency.cli.common import UsageError, echo, positive_int


def cmd_streams_make(args: argparse.Namespace) -> int:
    """Write one stream (or, with --shipped, the streams the project ships) from the corpus."""
    from robot_latency.models.corpus import CorpusConfig, generate_corpus
    from robot_latency.streams import SHIPPED_STREAMS, make_stream_file
    from robot_latency.streams.shipped import pick_texts

    # Held-out commands: the planner never saw them in training.
    corpus = generate_corpus(CorpusConfig())
    texts = [c.text for c in corpus.heldout]
    out = Path(args.out)
    if args.shipped:
        # labelled, a share of them off-vocabulary (to be refused): streams/labelled.py
        from robot_latency.streams.labelled import make_labelled_streams

        for path in make_labelled_streams(out, corpus, storage=args.storage):
            echo(f"wrote {path} (and its labels.jsonl)")
        names = ", ".join(f"{s.name} ({s.process}, {s.rate_hz:g} Hz, {s.n_commands})"
                          for s in SHIPPED_STREAMS)
        echo(f"streams: {names}")
        return 0
    if args.process is None:
        raise UsageError("give --process periodic|poisson|bursty (or --shipped)")
    path = make_stream_file(out, pick_texts(texts, args.count, seed=args.seed),
                            process=args.process, rate_hz=args.rate_hz, seed=args.seed,
                            storage=args.storage, topic=args.topic)
    echo(f"wrote {path}: {args.count} commands, {args.process} at {args.rate_hz:g} Hz")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser("streams", help="command streams: make rosbag2 streams from the corpus")
    ssub = p.add_subparsers(dest="streams_command", required=True, metavar="ACTION")
    sp = ssub.add_parser("make", help="write a rosbag2 (MCAP) command stream",
                         description="Writes operator commands (held-out commands of the "
                                     "demo corpus, short and long mixed) with an arrival "
                                     "process as a rosbag2 bag directory.")
    sp.add_argument("--out", required=True, help="bag directory to create (--shipped: parent)")
    sp.add_argument("--shipped", action="store_true", help="the streams the project ships")
    sp.add_argument("--process", choices=("periodic", "poisson", "bursty"), default=None)
    sp.add_argument("--rate-hz", type=float, default=0.5, help="mean commands per second")
    sp.add_argument("--count", type=positive_int, default=60)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    sp.add_argument("--topic", default="/planner/command")
    sp.set_defaults(func=cmd_streams_make)
