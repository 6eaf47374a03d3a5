"""The shipped-stream specs: remaking them gives readable bags with a short/long mix."""

from __future__ import annotations

import pytest

from robot_latency.streams import (
    SHIPPED_DIR,
    SHIPPED_STREAMS,
    StreamError,
    make_shipped_streams,
    read_stream,
)
from robot_latency.streams.shipped import pick_texts

POOL = [
    "stop",
    "halt",
    "turn left",
    "go back to the charging dock and wait there until the battery is full",
    "pick up the red cup from the kitchen counter and bring it to the table",
    "follow the person in the yellow jacket but keep two metres away",
]


def test_make_shipped_streams_writes_readable_bags(tmp_path):
    bags = make_shipped_streams(tmp_path, POOL)

    assert [b.name for b in bags] == [s.name for s in SHIPPED_STREAMS]
    for bag, spec in zip(bags, SHIPPED_STREAMS, strict=True):
        stream = read_stream(bag)
        assert len(stream.commands) == spec.n_commands
        lengths = {len(c.text) for c in stream.commands}
        assert min(lengths) <= 9 and max(lengths) > 60  # short and long commands both present


def test_same_texts_give_the_same_streams(tmp_path):
    first = [read_stream(b).commands for b in make_shipped_streams(tmp_path / "a", POOL)]
    second = [read_stream(b).commands for b in make_shipped_streams(tmp_path / "b", POOL)]

    assert [[(c.t_ns, c.text) for c in s] for s in first] == [
        [(c.t_ns, c.text) for c in s] for s in second
    ]


def test_existing_bag_is_not_overwritten(tmp_path):
    make_shipped_streams(tmp_path, POOL)

    with pytest.raises(StreamError, match="exists already"):
        make_shipped_streams(tmp_path, POOL)


def test_pick_texts_needs_a_pool():
    with pytest.raises(ValueError, match="at least one"):
        pick_texts([], 3, seed=0)
    assert pick_texts(["only"], 3, seed=0) == ["only"] * 3


def test_shipped_dir_is_inside_the_package():
    assert SHIPPED_DIR.parts[-3:] == ("robot_latency", "data", "streams")
