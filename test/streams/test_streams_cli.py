"""`robot-latency streams make`: bags from the corpus; the shipped streams are what it makes."""

from __future__ import annotations

from pathlib import Path

from robot_latency.cli import main
from robot_latency.streams import SHIPPED_DIR, SHIPPED_STREAMS, read_stream


def test_make_a_stream(tmp_path: Path) -> None:
    out = tmp_path / "bursty"
    assert main(["streams", "make", "--out", str(out), "--process", "bursty", "--count", "12",
                 "--rate-hz", "2", "--seed", "3"]) == 0
    stream = read_stream(out)
    assert len(stream.commands) == 12 and stream.topic == "/planner/command"
    assert all(c.text.strip() for c in stream.commands)


def test_shipped_streams_are_reproducible(tmp_path: Path) -> None:
    assert main(["streams", "make", "--shipped", "--out", str(tmp_path)]) == 0
    for spec in SHIPPED_STREAMS:
        made, shipped = read_stream(tmp_path / spec.name), read_stream(SHIPPED_DIR / spec.name)
        assert len(shipped.commands) == spec.n_commands
        assert [(c.t_ns, c.text) for c in made.commands] == \
            [(c.t_ns, c.text) for c in shipped.commands]


def test_process_required(tmp_path: Path) -> None:
    assert main(["streams", "make", "--out", str(tmp_path / "x")]) == 2
