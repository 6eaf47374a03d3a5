"""``make demo`` twice keeps both runs: the demo command moves a previous ``--out`` aside to
``OUT.<its time>`` instead of deleting it (the Makefile no longer runs ``rm -rf``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from robot_latency.cli.common import UsageError
from robot_latency.cli.demo import move_aside

ROOT = Path(__file__).resolve().parents[2]


def _previous_run(out: Path, when: float) -> None:
    (out / "Q8_0").mkdir(parents=True)
    (out / "Q8_0" / "cycles.jsonl").write_text('{"cycle": 0}\n')
    (out / "report.md").write_text("# Latency report\n")
    os.utime(out, (when, when))


def test_a_previous_run_is_moved_aside_with_its_time(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "demo"
    when = time.mktime((2026, 12, 1, 21, 33, 0, 0, 0, -1))  # local time, as the name is
    _previous_run(out, when)
    kept = move_aside(out)
    assert kept == tmp_path / "runs" / "demo.20261201T2133"
    assert not out.exists()
    assert (kept / "Q8_0" / "cycles.jsonl").read_text() == '{"cycle": 0}\n'
    assert (kept / "report.md").exists()
    # a second run of the same minute gets a name of its own; nothing is overwritten
    _previous_run(out, when)
    again = move_aside(out)
    assert again == tmp_path / "runs" / "demo.20261201T2133-1"
    assert kept.is_dir() and again.is_dir() and not out.exists()


def test_nothing_to_move(tmp_path: Path) -> None:
    assert move_aside(tmp_path / "absent") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert move_aside(empty) is None and empty.is_dir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match="afile: exists and is not a directory"):
        move_aside(afile)
    assert afile.read_text() == "x"


def test_the_makefile_no_longer_deletes_the_previous_demo() -> None:
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\ndemo: ", 1)[1].split("\n\n", 1)[0]
    assert "rm " not in recipe and "robot-latency demo --out runs/demo" in recipe
