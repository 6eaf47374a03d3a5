"""JSONL command streams: good files, bad lines (error or skip), invalid UTF-8."""

from __future__ import annotations

import json
import logging

import pytest

from robot_latency.streams import Command, StreamError, read_stream, write_jsonl


def _lines(*records: object) -> bytes:
    return b"".join(
        (r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records
    )


def test_round_trip_keeps_text_times_and_ids(tmp_path, commands):
    path = write_jsonl(tmp_path / "session.jsonl", commands)

    stream = read_stream(path)

    assert stream.name == "session"
    assert stream.topic is None
    assert stream.commands == tuple(commands)
    assert stream.skipped_lines == ()


def test_ids_default_to_stream_and_index_and_times_become_relative(tmp_path):
    path = tmp_path / "ops.jsonl"
    path.write_bytes(
        _lines({"t_ns": 1_000, "text": "stop"}, {"t_ns": 1_500, "text": "go", "id": "op-7"})
        + b"\n   \n"  # blank lines are not commands
        + _lines({"t_ns": 2_000, "text": "turn"})
    )

    stream = read_stream(path)

    assert stream.commands == (
        Command(0, "stop", "ops:0"),
        Command(500, "go", "op-7"),
        Command(1_000, "turn", "ops:2"),
    )
    assert stream.duration_ns == 1_000


BAD_LINES = {
    "not-json": b"{t_ns: 1, text: stop}",
    "not-object": b"[1, 2]",
    "missing-text": json.dumps({"t_ns": 5}).encode(),
    "missing-t_ns": json.dumps({"text": "stop"}).encode(),
    "t_ns-string": json.dumps({"t_ns": "5", "text": "stop"}).encode(),
    "t_ns-float": json.dumps({"t_ns": 5.0, "text": "stop"}).encode(),
    "t_ns-bool": json.dumps({"t_ns": True, "text": "stop"}).encode(),
    "t_ns-negative": json.dumps({"t_ns": -1, "text": "stop"}).encode(),
    "text-number": json.dumps({"t_ns": 5, "text": 42}).encode(),
    "id-number": json.dumps({"t_ns": 5, "text": "stop", "id": 3}).encode(),
    "duplicate-id": json.dumps({"t_ns": 5, "text": "stop", "id": "a"}).encode(),
    "decreasing": json.dumps({"t_ns": 1, "text": "back in time"}).encode(),
    "invalid-utf8": b'{"t_ns": 5, "text": "go \xff\xfe"}',
}


@pytest.mark.parametrize("bad", list(BAD_LINES.values()), ids=list(BAD_LINES))
def test_bad_line_is_an_error_naming_file_and_line(tmp_path, bad):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(_lines({"t_ns": 2, "text": "ok", "id": "a"}, {"t_ns": 3, "text": "fine"}, bad))

    with pytest.raises(StreamError) as info:
        read_stream(path)

    assert f"{path}:3:" in str(info.value)
    assert "--skip-bad-lines" in str(info.value)  # the way out is named


def test_skip_mode_keeps_good_lines_and_records_bad_ones(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        _lines(
            {"t_ns": 100, "text": "stop"},
            b"garbage",
            {"t_ns": 200, "text": "go"},
            {"t_ns": 150, "text": "too early"},
            b'{"t_ns": 300, "text": "caf\xe9"}',  # latin-1, not UTF-8
            {"t_ns": 400},
            {"t_ns": 500, "text": "turn left"},
        )
    )

    with caplog.at_level(logging.WARNING, logger="robot_latency.streams"):
        stream = read_stream(path, on_bad_line="skip")

    assert [(c.t_ns, c.text) for c in stream.commands] == [
        (0, "stop"),
        (100, "go"),
        (400, "turn left"),
    ]
    assert [c.command_id for c in stream.commands] == ["mixed:0", "mixed:1", "mixed:2"]
    assert stream.skipped_lines == (2, 4, 5, 6)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for lineno in stream.skipped_lines:
        assert any(f"{path}:{lineno}:" in m for m in warned)


def test_invalid_utf8_line_says_so(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(_lines({"t_ns": 1, "text": "ok"}, b'{"t_ns": 2, "text": "\xc3\x28"}'))

    with pytest.raises(StreamError, match=r":2: .*UTF-8"):
        read_stream(path)
    assert read_stream(path, on_bad_line="skip").skipped_lines == (2,)


def test_unusual_texts_are_kept_as_is(tmp_path):
    texts = ["", "   ", "\x00\x07 control \x1b[31m", "line\nbreak\u2028sep", "y" * 1_000_000]
    path = write_jsonl(
        tmp_path / "odd.jsonl", [Command(i, t, f"odd:{i}") for i, t in enumerate(texts)]
    )

    assert [c.text for c in read_stream(path).commands] == texts


def test_unknown_bad_line_policy_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [Command(0, "stop", "a:0")])

    with pytest.raises(ValueError, match="on_bad_line"):
        read_stream(path, on_bad_line="ignore")


def test_write_jsonl_refuses_to_overwrite(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [Command(0, "stop", "a:0")])

    with pytest.raises(StreamError, match="exists already"):
        write_jsonl(path, [])


def test_missing_jsonl_names_the_path(tmp_path):
    with pytest.raises(StreamError, match=r"no_such\.jsonl"):
        read_stream(tmp_path / "no_such.jsonl")
