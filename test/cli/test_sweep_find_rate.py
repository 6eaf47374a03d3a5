"""``sweep --find-rate``: the highest replay speed this host holds, searched with real runs (the
sim engine; invariants of the answer and its run directories, never timings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.cli.find_rate import run_miss_rate
from robot_latency.planner.capacity import CapacityError, bisect_speed
from robot_latency.streams import Command, write_jsonl

TEXTS = ["pick up the red cup and put it on the tray", "go to the kitchen slowly",
         "bring the blue box to the table"]


def test_bisect_speed_brackets_then_bisects() -> None:
    seen: list[float] = []

    def miss(speed: float) -> float:
        seen.append(speed)
        return 0.0 if speed <= 10 else 0.5

    found = bisect_speed(miss, 0.05, start=1.0, trials=7)
    assert seen[:5] == [1.0, 2.0, 4.0, 8.0, 16.0]  # doubling to the bracket
    assert found.tried == len(seen) == 7
    assert 8.0 <= found.held <= 10 < found.failed <= 16.0
    assert (found.miss_held, found.miss_failed) == (0.0, 0.5)
    seen.clear()
    down = bisect_speed(miss, 0.05, start=64.0, trials=4)
    assert seen[:3] == [64.0, 32.0, 16.0] and down.held == 8.0 and down.failed == 16.0
    with pytest.raises(CapacityError, match="trials"):
        bisect_speed(miss, 0.05, start=1.0, trials=0)


def test_sweep_find_rate_held_and_failed_runs(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # 16 commands 400 ms apart; the sim plans in about 50 ms: at x16 (25 ms apart) every cycle
    # is in time here, at x256 (1.6 ms apart) nearly every one misses; x16 to x512 bracket it
    # in six runs, two more bisect
    cmds = [Command(t_ns=i * 400 * 10**6, text=TEXTS[i % 3], command_id=f"s:{i}")
            for i in range(16)]
    stream = write_jsonl(tmp_path / "stream.jsonl", cmds)
    out = tmp_path / "sweep"
    assert main(["sweep", "--find-rate", "--miss-target", "0.05", "--find-rate-trials", "8",
                 "--stream", str(stream), "--engine", "sim", "--runner", "inline",
                 "--mode", "event", "--deadline-ms", "60", "--speed", "16",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads((out / "find_rate.json").read_text())
    assert 1 <= doc["tried"] <= 8 and len(doc["trials"]) == doc["tried"]
    assert doc["speed_held"] is not None and doc["speed_failed"] is not None
    assert doc["speed_held"] < doc["speed_failed"]
    runs = sorted(p.name for p in (out / "find_rate").iterdir())
    assert runs == sorted(Path(t["run_dir"]).name for t in doc["trials"])
    for trial in doc["trials"]:
        miss, whose = run_miss_rate(out / trial["run_dir"])
        assert (miss, whose) == (trial["miss_rate"], trial["miss_of"])
        assert trial["held"] == (miss <= 0.05)
        manifest = json.loads((out / trial["run_dir"] / "manifest.json").read_text())
        assert manifest["status"] == "finished"
        # every speed tried below the answer held; none tried between it and the failure
        if trial["speed"] < doc["speed_held"]:
            assert trial["held"]
        assert not doc["speed_held"] < trial["speed"] < doc["speed_failed"]
    by_speed = {t["speed"]: t for t in doc["trials"]}
    held, failed = by_speed[doc["speed_held"]], by_speed[doc["speed_failed"]]
    assert held["miss_rate"] == doc["miss_held"] <= 0.05
    assert failed["miss_rate"] == doc["miss_failed"] > 0.05
    assert doc["rate_held_cmd_s"] == pytest.approx(doc["speed_held"] * 2.5)  # 15 gaps in 6 s
    assert f"x{doc['speed_held']:.4g}" in printed and f"x{doc['speed_failed']:.4g}" in printed


def test_sweep_find_rate_one_configuration(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    stream = write_jsonl(tmp_path / "s.jsonl", [Command(t_ns=i * 10**8, text=TEXTS[0],
                                                        command_id=f"a{i}") for i in range(2)])
    assert main(["sweep", "--find-rate", "--stream", str(stream), "--engine", "sim",
                 "--deadlines", "50,60", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--deadlines: --find-rate searches one configuration, got '50,60'")
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()


def test_run_find_rate_is_sweeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # run takes the same search (one configuration by its nature): trials are run directories
    # under OUT/find_rate/, the answer in OUT/find_rate.json, printed with --json
    cmds = [Command(t_ns=i * 400 * 10**6, text=TEXTS[i % 3], command_id=f"r:{i}")
            for i in range(6)]
    stream = write_jsonl(tmp_path / "stream.jsonl", cmds)
    out = tmp_path / "run"
    assert main(["run", "--find-rate", "--find-rate-trials", "2", "--stream", str(stream),
                 "--engine", "sim", "--runner", "inline", "--mode", "event",
                 "--deadline-ms", "60", "--speed", "16", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    doc = json.loads((out / "find_rate.json").read_text())
    assert printed == doc and doc["tried"] == len(doc["trials"]) <= 2
    assert doc["trials"][0]["speed"] == 16.0 and doc["deadline_ms"] == 60.0
    for trial in doc["trials"]:
        assert run_miss_rate(out / trial["run_dir"]) == (trial["miss_rate"], trial["miss_of"])
    assert not (out / "cycles.jsonl").exists()  # no run of its own beside the trials


def test_find_rate_refuses_the_target_answer(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    stream = write_jsonl(tmp_path / "s.jsonl", [Command(t_ns=i * 10**8, text=TEXTS[0],
                                                        command_id=f"a{i}") for i in range(2)])
    assert main(["run", "--find-rate", "--target-answer", "--stream", str(stream), "--engine",
                 "sim", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("robot-latency run: error: --target-answer:")
    assert len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
