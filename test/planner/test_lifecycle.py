"""A run end to end: replay a real stream file through the loop into a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from robot_latency.cli import main
from robot_latency.clock import ScriptedClock
from robot_latency.lifetime import popen
from robot_latency.planner.config import RunSettings
from robot_latency.planner.lifecycle import PlannerRun, RunError
from robot_latency.planner.replay import replay
from robot_latency.planner.resolve import resolve_run
from robot_latency.records import read_records
from robot_latency.streams import Command, read_stream, write_bag, write_jsonl

MS = 1_000_000
TEXTS = ["pick up the red cup and put it on the tray", "stop", "go to the kitchen slowly",
         "bring me the blue bottle"]


def _stream(tmp_path: Path, times_ms: list[int], *, kind: str = "jsonl") -> Path:
    cmds = [Command(t_ns=t * MS, text=TEXTS[i % len(TEXTS)], command_id=f"s:{i}")
            for i, t in enumerate(times_ms)]
    if kind == "jsonl":
        return write_jsonl(tmp_path / "stream.jsonl", cmds)
    return write_bag(tmp_path / "bag", cmds, storage=kind)


def _run(tmp_path: Path, **planner: object) -> tuple[PlannerRun, list[dict]]:
    clock = ScriptedClock(start_ns=5 * 10**9)
    plans: list[dict] = []
    cfg, _ = resolve_run(RunSettings(**{
        "period_ms": 100, "deadline_ms": 60, **planner}, log_dir=tmp_path / "run", engine="sim",
        runner="inline", engine_options={"device": "orin-agx-64gb", "seed": 1},
        model="qwen2.5-0.5b", quant="Q4_K_M", target_device="orin-nano-8gb", label="sim test",
        extra={"replay": {"mode": "recorded", "speed": 1.0}}))
    assert cfg.host_device == "orin-agx-64gb"  # the device the sim engine simulates
    return PlannerRun(cfg, publish=plans.append, clock=clock), plans


def test_periodic_replay_writes_a_consistent_run_directory(tmp_path: Path) -> None:
    stream = read_stream(_stream(tmp_path, [0, 250, 260, 700], kind="mcap"))
    run, plans = _run(tmp_path)
    with run:
        n = replay(run.loop, stream)
        summary = run.close()
    records = read_records(tmp_path / "run" / "cycles.jsonl")
    assert n == len(records) == len(plans) == 9  # ticks 0..700 ms, plus one after
    # bag:1 (250 ms) was superseded by bag:2 (260 ms) before the 300 ms tick
    # (a bag's command ids are "<bag name>:<index>")
    assert [r.command_id for r in records] == ["bag:0", "bag:0", "bag:0", "bag:2", "bag:2",
                                               "bag:2", "bag:2", "bag:3", "bag:3"]
    assert summary["mailbox"] == {"received": 4, "dropped": 0, "superseded": 1}
    # reaction latency only on the first cycle that plans a command, from its arrival
    reacted = [r for r in records if r.reaction_ns is not None]
    assert [r.command_id for r in reacted] == ["bag:0", "bag:2", "bag:3"]
    assert reacted[1].reaction_ns > reacted[1].cycle_ns  # arrived 40 ms before its tick
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["cycles"] == len(records) and saved["deadline_misses"] == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["label"] == "sim test"
    assert manifest["model"]["name"] == "Qwen2.5-0.5B"
    assert manifest["floor"]["target"]["device_id"] == "orin-nano-8gb"
    assert manifest["replay"]["mode"] == "recorded"
    # every record carries floor predictions for host and target, and process stats
    assert all(r.floor["target"]["device_id"] == "orin-nano-8gb" for r in records)
    # and the target's answer: TTFT + (tokens out - 1) x ITL, against the cycle's deadline
    asked = [r for r in records if r.token_ns]
    assert asked
    for r in asked:
        p = r.target_pred
        assert p is not None and p["tokens_out"] == r.tokens_out and p["basis"] == "complete"
        assert r.target_e2e_pred_ms == pytest.approx(p["ttft_ms"]
                                                     + (r.tokens_out - 1) * p["itl_ms"])
        lo, hi = r.target_e2e_pred_interval_ms
        assert lo <= r.target_e2e_pred_ms <= hi
        assert r.target_deadline_met_pred == (r.target_e2e_pred_ms <= 60)
    assert all(r.rss_bytes and r.rss_bytes > 0 for r in records)


def test_event_replay_schedules_at_arrival(tmp_path: Path) -> None:
    stream = read_stream(_stream(tmp_path, [0, 250, 252, 700]))
    run, _ = _run(tmp_path, mode="event")
    with run:
        replay(run.loop, stream)
    records = read_records(tmp_path / "run" / "cycles.jsonl")
    start = records[0].scheduled_ns
    assert [(r.scheduled_ns - start) // MS for r in records] == [0, 250, 252, 700]
    assert records[2].queue_wait_ns > 0  # waited for the 250 ms command's cycle


def test_asap_replay_one_cycle_per_command(tmp_path: Path) -> None:
    stream = read_stream(_stream(tmp_path, [0, 5000, 10000]))
    run, _ = _run(tmp_path, mode="event")
    with run:
        assert replay(run.loop, stream, asap=True) == 3
    records = read_records(tmp_path / "run" / "cycles.jsonl")
    assert records[2].scheduled_ns - records[0].scheduled_ns < 1000 * MS  # no waiting


def test_run_directory_errors_are_clear(tmp_path: Path) -> None:
    run, _ = _run(tmp_path)
    run.close()
    with pytest.raises(RunError, match="already holds a run"):
        _run(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    cfg, _ = resolve_run(RunSettings(log_dir=blocker / "run", engine="sim", runner="inline",
                                     engine_options={"device": "orin-agx-64gb"}))
    with pytest.raises(RunError, match="not writable"):
        PlannerRun(cfg, publish=lambda e: None)


def test_cli_run_end_to_end_with_worker_process(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _stream(tmp_path, [0, 100, 200, 300])
    out = tmp_path / "cli-run"
    assert main(["run", "--stream", str(path), "--engine", "sim", "--device", "orin-agx-64gb",
                 "--deadline-ms", "80", "--period-ms", "100", "--speed", "2", "--out", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # the last command at 150 ms (speed 2): ticks at 0 and 100 ms, and one after
    assert summary["cycles"] == len(read_records(out / "cycles.jsonl")) == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runner"] == "process" and manifest["replay"]["speed"] == 2.0
    assert manifest["stream"]["commands"] == 4


def test_cli_run_bad_stream_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t_ns": 0, "text": "stop"}\nnot json\n')
    assert main(["run", "--stream", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and ":2" in err


def test_cli_report_over_two_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _stream(tmp_path, [0, 100, 200, 300])
    runs = []
    for device in ("orin-agx-64gb", "orin-nano-4gb"):
        out = tmp_path / device
        assert main(["run", "--stream", str(path), "--engine", "sim", "--device", device,
                     "--runner", "inline",
                     "--deadline-ms", "60", "--period-ms", "100", "--asap", "--mode", "event",
                     "--label", device, "--out", str(out)]) == 0
        runs.append(str(out))
        printed = capsys.readouterr().out
        recs = read_records(out / "cycles.jsonl")
        model = sum(1 for r in recs if r.plan_source == "model")
        assert (f"plans: {model} from the model, {len(recs) - model} from a fallback, "
                f"of {len(recs)} cycles") in printed
    assert main(["report", *runs, "--out", str(tmp_path / "report")]) == 0
    table = capsys.readouterr().out
    assert "orin-agx-64gb" in table and "orin-nano-4gb" in table
    for name in ("report.md", "comparison.csv", "itl_cdf.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    # the same glob again now holds the report's own directory: left out, not an error
    assert main(["report", *runs, str(tmp_path / "report"), "--out",
                 str(tmp_path / "report")]) == 0
    assert "is the report's own directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_cli_sweep_over_devices_and_deadlines(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _stream(tmp_path, [0, 100, 200])
    out = tmp_path / "sweep"
    assert main(["sweep", "--stream", str(path), "--engine", "sim",
                 "--devices", "orin-agx-64gb,orin-nano-4gb",
                 "--deadlines", "40,80", "--runner", "inline", "--asap", "--mode", "event",
                 "--out", str(out)]) == 0
    table = capsys.readouterr().out
    rows = json.loads((out / "comparison.json").read_text())["rows"]
    assert len(rows) == 4
    assert {r["label"] for r in rows} == {"orin-agx-64gb 40ms", "orin-agx-64gb 80ms",
                                          "orin-nano-4gb 40ms", "orin-nano-4gb 80ms"}
    assert "orin-nano-4gb 40ms" in table
    assert (out / "comparison.csv").read_text().startswith("label,")
    # a slower device never misses less at the same deadline (3 commands, same stream)
    by = {r["label"]: r for r in rows}
    assert by["orin-nano-4gb 40ms"]["model_misses"] >= by["orin-agx-64gb 40ms"]["model_misses"]
    # rerun into the same directory: resumed, every finished point skipped, nothing rerun
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/cycles.jsonl")}
    capsys.readouterr()
    assert main(["sweep", "--stream", str(path), "--engine", "sim",
                 "--devices", "orin-agx-64gb,orin-nano-4gb",
                 "--deadlines", "40,80", "--runner", "inline", "--asap", "--mode", "event",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().err.count("already done; skipped") == 4
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/cycles.jsonl")} == before
    # an interrupted point's leftovers are kept aside and the point runs again
    (out / "orin-agx-64gb_40ms" / "manifest.json").write_text('{"status": "running"}')
    assert main(["sweep", "--stream", str(path), "--engine", "sim",
                 "--devices", "orin-agx-64gb,orin-nano-4gb",
                 "--deadlines", "40,80", "--runner", "inline", "--asap", "--mode", "event",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("already done; skipped") == 3 and "was not finished; moved to" in err
    assert len(list((out / ".incomplete").iterdir())) == 1
    assert json.loads((out / "orin-agx-64gb_40ms" / "manifest.json").read_text())[
        "status"] == "finished"


def test_sweep_checks_every_level_before_running_any(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = _stream(tmp_path, [0])
    out = tmp_path / "sweep"
    assert main(["sweep", "--stream", str(path), "--engine", "sim", "--quants", "Q8_0,Q4_KM",
                 "--runner", "inline", "--asap", "--mode", "event", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--quants: unknown level 'Q4_KM'; valid: F32, F16, Q8_0" in err
    assert not out.exists()  # nothing ran
    assert main(["sweep", "--stream", str(path), "--engine", "sim", "--devices",
                 "orin-agx-64gb,orin-nope", "--out", str(out)]) == 2
    assert "--devices:" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_mid_run_leaves_complete_files(tmp_path: Path, sig: str) -> None:
    import signal
    import subprocess
    import sys
    import time

    path = _stream(tmp_path, [i * 50 for i in range(400)])
    out = tmp_path / "run"
    proc = popen([sys.executable, "-m", "robot_latency.cli", "run", "--engine", "sim",
                             "--stream",
                             str(path), "--device", "orin-agx-64gb", "--deadline-ms", "40",
                             "--period-ms", "50", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until cycles are being written
        log = out / "cycles.jsonl"
        if log.exists() and log.read_text().count("\n") >= 5:
            break
        time.sleep(0.1)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = (out / "cycles.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line parses
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cycles"] == len(lines)
    assert 5 <= len(lines) < 400
    assert json.loads((out / "manifest.json").read_text())["status"] == "finished"


def test_cli_run_llamacpp_on_a_ladder_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    path = _stream(tmp_path, [0, 100, 200])
    out = tmp_path / "q4"
    # A deadline far past the tiny planner's plan time, even on a loaded machine: every cycle's
    # plan is the model's (asap: the cycles run back to back, so it costs no waiting).
    assert main(["run", "--stream", str(path), "--quant", "Q4_0", "--asap", "--mode", "event",
                 "--deadline-ms", "20000", "--period-ms", "20000", "--out", str(out),
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "llamacpp"
    assert manifest["engine_info"]["model_path"].endswith("planner.Q4_0.gguf")
    assert manifest["model"]["quant"] == "Q4_0" and len(manifest["model"]["sha256"]) == 64
    assert summary["cycles"] == 3 and summary["plan_sources"] == {"model": 3}
