"""``run --engine openai``: a real server end to end, an unreachable one refused in one line;
the node's settings take the same server parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from robot_latency.cli import main
from robot_latency.engines.llama_server import free_port
from robot_latency.records import read_records


def _stream(tmp_path: Path, n: int = 6) -> Path:
    path = tmp_path / "commands.jsonl"
    texts = ["pick up the red cup", "go to the kitchen", "stop"]
    path.write_text("".join(json.dumps({"t_ns": i * 50_000_000, "text": texts[i % 3]}) + "\n"
                            for i in range(n)))
    return path


def test_run_refuses_an_unreachable_server_in_one_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    rc = main(["run", "--engine", "openai", "--server-url", url, "--stream",
               str(_stream(tmp_path)), "--asap", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and url in err and "unreachable" in err
    assert not (tmp_path / "run" / "cycles.jsonl").exists()


def test_run_without_a_server_url_names_the_flag(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--engine", "openai", "--stream", str(_stream(tmp_path)), "--asap",
               "--out", str(tmp_path / "run")])
    assert rc == 2 and "--server-url" in capsys.readouterr().err


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_run_against_a_real_server_records_offboard_plans(
        llama_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], api: str) -> None:
    out = tmp_path / "run"
    # The deadline is a hang guard: this is the command's wiring to a real server (every plan
    # the server's, the record saying so), which must not hang on how loaded the host is.
    rc = main(["run", "--engine", "openai", "--server-url", llama_server.url,
               "--server-api", api, "--stream", str(_stream(tmp_path)), "--asap",
               "--deadline-ms", "60000", "--period-ms", "60000", "--out", str(out), "--json"])
    assert rc == 0, capsys.readouterr().err
    records = read_records(out / "cycles.jsonl")
    assert len(records) == 6
    assert all(r.plan_source == "model" for r in records), [r.engine_error for r in records]
    assert all(r.offboard is not None and r.offboard["api"] == api for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "openai"
    assert manifest["engine_info"]["server_kind_in_effect"] == "llamacpp"
    from robot_latency.report.compare import compare_runs, to_markdown

    rows = compare_runs([out])
    assert rows[0].plan_made == "offboard" and rows[0].server_plans is None
    assert to_markdown(rows).splitlines()[2].rstrip(" |").endswith("offboard")


def test_node_settings_take_the_server_parameters(tmp_path: Path) -> None:
    from robot_latency.ros.params import ParamError, planner_settings

    url = f"http://127.0.0.1:{free_port()}/v1"  # nobody there: the node's settings still build
    settings = planner_settings({"engine": "openai", "server_url": url, "server_api": "chat",
                                 "log_dir": str(tmp_path / "log")})
    opts = settings.run.engine_options
    assert opts["server_url"] == url and opts["server_api"] == "chat"
    with pytest.raises(ParamError, match="server_url"):
        planner_settings({"engine": "openai", "log_dir": str(tmp_path / "log2")})
    with pytest.raises(ParamError, match="server_api"):
        planner_settings({"engine": "openai", "server_url": url, "server_api": "x",
                          "log_dir": str(tmp_path / "log3")})
    hybrid = planner_settings({"engine": "hybrid", "server_url": url,
                               "hybrid_policy": "prefer_server",
                               "log_dir": str(tmp_path / "log4")})
    assert hybrid.run.engine_options["hybrid_policy"] == "prefer_server"
    assert hybrid.run.engine_options["onboard_engine"] == "llamacpp"


def test_diagnostics_report_error_while_the_server_has_not_answered() -> None:
    from robot_latency.records import CycleRecord
    from robot_latency.ros.diagnostics import ERROR, OK, DiagnosticsTracker

    tracker = DiagnosticsTracker(deadline_ms=100)
    idle = [CycleRecord(run_id="r", cycle=i, scheduled_ns=i, deadline_ns=i + 10,
                        plan_source="fallback", fallback_reason="no_command") for i in range(3)]
    engine = {"engine": "openai", "server_check_error": "server http://x/v1 is unreachable"}
    report = tracker._engine(idle, engine)
    assert report.level == ERROR and "unreachable" in report.message
    served = [*idle, CycleRecord(run_id="r", cycle=3, scheduled_ns=3, deadline_ns=13,
                                 plan_source="model")]
    assert tracker._engine(served, engine).level == OK
