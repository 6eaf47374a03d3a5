"""A busy host is called out: ``run`` measures the host's load over the run (host_load.json,
summary.json), prints a warning with its reasons when the host was overloaded, and the report
opens with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import robot_latency.hostcheck.load as hostload
from robot_latency.cli import main


def _run(tmp_path: Path, name: str) -> list[str]:
    stream = tmp_path / "s.jsonl"
    stream.write_text("".join(json.dumps({"t_ns": i * 100_000_000, "text": t}) + "\n"
                              for i, t in enumerate(["stop", "go to the kitchen", "stop"])))
    return ["run", "--stream", str(stream), "--engine", "sim", "--runner", "inline", "--asap",
            "--mode", "event", "--out", str(tmp_path / name)]


def test_every_run_records_the_hosts_load(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_run(tmp_path, "quiet")) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "quiet" / "host_load.json").read_text())
    assert doc["cores"] >= 1 and doc["wall_s"] > 0 and doc["own_cpu_share"] > 0
    assert set(doc["thresholds"]) == {"steal_share", "load_per_core", "others_cpu_share"}
    summary = json.loads((tmp_path / "quiet" / "summary.json").read_text())
    assert summary["host_load"]["reasons"] == doc["reasons"]
    assert summary["cycles"] == 3  # the rest of the summary is the run's, untouched


def test_an_overloaded_host_is_called_out_in_summary_and_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Any CPU another process takes now counts as too much: the host is "overloaded" whatever
    # the machine's state (a threshold moved, nothing faked: the figures are measured).
    monkeypatch.setattr(hostload, "OTHERS_SHARE_WARN", -1.0)
    assert main(_run(tmp_path, "busy")) == 0
    out = capsys.readouterr().out
    assert "WARNING: host overloaded during the run: " in out
    assert "other processes used" in out
    summary = json.loads((tmp_path / "busy" / "summary.json").read_text())
    warning = summary["host_load"]["warning"]
    assert warning in summary["warnings"] and summary["host_load"]["overloaded"] is True
    assert main(["report", str(tmp_path / "busy"), "--out", str(tmp_path / "rep")]) == 0
    assert f"WARNING: {tmp_path / 'busy'}: {warning}" in capsys.readouterr().out
    text = (tmp_path / "rep" / "report.md").read_text()
    head = text.split("## Comparison")[0]
    assert "> **Host overloaded** (" in head and warning in head
