"""``streams``: write command streams, rosbag2 bags of operator commands with an arrival process
or from a recorded JSONL stream."""

from __future__ import annotations

import argparse
from pathlib import Path

from robot_latency.cli.common import UsageError, echo, positive_int


def _from_jsonl(args: argparse.Namespace) -> int:
    """Write the JSONL stream of --from as a rosbag2 bag in --out."""
    from robot_latency.streams.convert import jsonl_to_bag

    if args.shipped or args.process is not None:
        raise UsageError("--from converts a recorded stream: give it without --shipped or "
                         "--process")
    src = Path(args.from_jsonl)
    if src.suffix.lower() != ".jsonl":
        raise UsageError(f"--from {src}: expected a .jsonl command stream")
    done = jsonl_to_bag(src, Path(args.out), topic=args.topic, storage=args.storage,
                        state_topic=args.state_topic,
                        on_bad_line="skip" if args.skip_bad_lines else "error")
    stream = done.stream
    span_s = stream.commands[-1].t_ns / 1e9 if stream.commands else 0.0
    echo(f"wrote {done.bag}: {len(stream.commands)} commands over {span_s:.1f} s on "
         f"{done.topic}" + (f", robot state on {done.state_topic}" if done.state_topic else "")
         + (f"; skipped bad lines {list(stream.skipped_lines)}" if stream.skipped_lines else "")
         + (f"; labels in {done.labels}" if done.labels is not None else ""))
    return 0


def _frames_hz(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--frames-hz {text!r}: not a number") from None
    if not (0 <= value <= 1000):
        raise argparse.ArgumentTypeError(f"--frames-hz {text}: must be in [0, 1000]")
    return value


def cmd_streams_make(args: argparse.Namespace) -> int:
    """Write one stream (or, with --shipped, the streams the project ships) from the corpus,
    or (--from) a recorded JSONL stream as a bag."""
    if args.frames_hz and (args.from_jsonl is not None or args.shipped):
        raise UsageError("--frames-hz draws frames for a --process stream (a JSONL line's "
                         "frame is its \"image\" file)")
    if args.from_jsonl is not None:
        return _from_jsonl(args)
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
        raise UsageError("give --process periodic|poisson|bursty (or --shipped, or --from "
                         "FILE.jsonl)")
    from robot_latency.streams.labelled import corpus_truth, write_corpus_labels

    picked = pick_texts(texts, args.count, seed=args.seed)
    path = make_stream_file(out, picked, process=args.process, rate_hz=args.rate_hz,
                            seed=args.seed, storage=args.storage, topic=args.topic,
                            frames_hz=args.frames_hz)
    labels = write_corpus_labels(path, picked, corpus_truth(corpus))
    echo(f"wrote {path}: {args.count} commands, {args.process} at {args.rate_hz:g} Hz"
         + (f"; camera frames at {args.frames_hz:g} Hz on /camera/image/compressed"
            if args.frames_hz else "") + f"; labels in {labels}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's commands to the ``robot-latency`` parser."""
    p = sub.add_parser("streams", help="command streams: make rosbag2 streams from the corpus")
    ssub = p.add_subparsers(dest="streams_command", required=True, metavar="ACTION")
    sp = ssub.add_parser("make", help="write a rosbag2 (MCAP) command stream",
                         description="Writes operator commands (held-out commands of the "
                                     "demo corpus, short and long mixed) with an arrival "
                                     "process as a rosbag2 bag directory; with --from, a "
                                     "recorded JSONL stream as one (its times kept).")
    sp.add_argument("--out", required=True, help="bag directory to create (--shipped: parent)")
    sp.add_argument("--from", dest="from_jsonl", default=None, metavar="FILE.jsonl",
                    help="a recorded JSONL stream to write as a bag (its times, texts and "
                         "states kept)")
    sp.add_argument("--state-topic", default=None,
                    help="--from: topic of the lines' robot state (default /planner/state; "
                         "written only when a line has a state)")
    sp.add_argument("--skip-bad-lines", action="store_true",
                    help="--from: skip bad lines (reported) instead of stopping")
    sp.add_argument("--shipped", action="store_true", help="the streams the project ships")
    sp.add_argument("--process", choices=("periodic", "poisson", "bursty"), default=None)
    sp.add_argument("--rate-hz", type=float, default=0.5, help="mean commands per second")
    sp.add_argument("--count", type=positive_int, default=60)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    sp.add_argument("--topic", default="/planner/command")
    sp.add_argument("--frames-hz", type=_frames_hz, default=0.0, metavar="N",
                    help="--process: also write a synthetic camera frame (a 128x96 PNG table "
                         "scene) N times a second, as sensor_msgs/CompressedImage on "
                         "/camera/image/compressed; default 0: none")
    sp.set_defaults(func=cmd_streams_make)
