"""``robot-latency predict --stream``: the answer on the device without a timed run."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.streams import SHIPPED_DIR, read_stream, write_jsonl

SIM = ("--engine", "sim", "--model", "qwen2.5-0.5b", "--device", "orin-nano-8gb")


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))


def _stream(tmp_path: Path, n: int = 10) -> Path:
    full = read_stream(SHIPPED_DIR / "steady_operator")
    return write_jsonl(tmp_path / "s.jsonl", list(full.commands[:n]))


def test_answers_per_level_with_the_curve_and_its_plot(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    stream = _stream(tmp_path)
    plot = tmp_path / "curve.png"
    assert main(["predict", "--stream", str(stream), *SIM, "--quants", "Q8_0", "Q4_0",
                 "--deadline-ms", "120", "--draws", "200", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("On orin-nano-8gb with llamacpp-cuda: s (10 commands")
    assert "| Q8_0 | 10 |" in out and "| Q4_0 | 10 |" in out
    assert "smallest deadline held at 5% ms" in out and "Deadline curve" in out
    assert "prefill calibrated" in out and "leave-one-source-out median error" in out
    assert plot.is_file() and plot.stat().st_size > 0
    # the pass is cached by content hash: a second answer runs no engine and says the same
    assert len(list((tmp_path / "cache" / "untimed").glob("*.json"))) == 2
    assert main(["predict", "--stream", str(stream), *SIM, "--quants", "Q8_0", "Q4_0",
                 "--deadline-ms", "120", "--draws", "200"]) == 0
    again = capsys.readouterr().out
    assert again.split("Deadline curve")[0] == out.split("Deadline curve")[0]


@pytest.mark.parametrize(("argv", "needle"), [
    (("--stream", "/nonexistent/stream.jsonl"), "--stream /nonexistent/stream.jsonl"),
    (("--miss-target", "1.5"), "--miss-target: must be in [0, 1)"),
    (("--speed", "0"), "--speed: must be > 0"),
    (("--deadline-ms", "-3"), "deadline"),
])
def test_bad_input_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         argv: tuple[str, ...], needle: str) -> None:
    stream = _stream(tmp_path, 2)
    base = ["predict", "--stream", str(stream), *SIM, "--quants", "Q4_0"]
    assert main([*base, *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def _json_answer(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    import json

    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_find_rate_holds_at_the_rate_found_and_not_ten_percent_above(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = _stream(tmp_path, 12)
    base = ["predict", "--stream", str(stream), *SIM, "--quants", "Q4_0", "--deadline-ms",
            "150", "--mode", "event", "--draws", "50"]
    (level,) = _json_answer(capsys, [*base, "--find-rate"])["levels"]
    cap = level["capacity"]
    assert cap["miss_target"] == 0.05 and cap["deadline_ms"] == 150.0
    held, failed = cap["speed_held"], cap["speed_failed"]
    assert held is not None and failed is not None and held < failed
    assert cap["rate_held_cmd_s"] == pytest.approx(held * cap["base_rate_cmd_s"])
    # replayed at the speed found, through predict's own path: the target holds; 10% faster not
    (at,) = _json_answer(capsys, [*base, "--speed", repr(held)])["levels"]
    (above,) = _json_answer(capsys, [*base, "--speed", repr(1.1 * held)])["levels"]
    assert at["miss_rate"] <= 0.05 < above["miss_rate"]
    assert at["capacity"] is None  # not asked
    assert main([*base, "--find-rate"]) == 0
    out = capsys.readouterr().out
    assert "Highest command rate held" in out and "first rate that failed" in out


def test_find_rate_needs_two_commands(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    stream = _stream(tmp_path, 1)
    assert main(["predict", "--stream", str(stream), *SIM, "--quants", "Q4_0",
                 "--find-rate"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--find-rate: --stream" in err and "two commands" in err
    assert len(err.splitlines()) == 1
