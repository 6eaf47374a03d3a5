"""Hedged planning: the onboard engine (its worker process) and a server asked at once; the policy
decides which plan is published and the record keeps both sides and why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from robot_latency.cli import main
from robot_latency.engines.base import create_engine
from robot_latency.planner.config import RunSettings
from robot_latency.planner.hybrid import HybridRunner
from robot_latency.planner.loop import PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.planner.worker import ProcessRunner
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord, read_records

CONFIG = RunSettings(period_ms=6000, deadline_ms=6000, publish_margin_ms=100)
#: A slow onboard engine: the simulated 70B model on an Orin AGX (over a second per plan).
SLOW_SIM = {"device": "orin-agx-64gb", "model": "llama-2-70b", "quant": "Q4_K_M"}


@pytest.fixture(scope="module")
def onboard_fast() -> Iterator[ProcessRunner]:
    """The bundled planner in llama.cpp, in its worker process."""
    with ProcessRunner("llamacpp", {"n_threads": 1}) as runner:
        yield runner


@pytest.fixture(scope="module")
def onboard_slow() -> Iterator[ProcessRunner]:
    with ProcessRunner("sim", SLOW_SIM) as runner:
        yield runner


def _cycle(onboard: ProcessRunner, url: str, mode: str, policy: str) -> CycleRecord:
    server = create_engine("openai", server_url=url, server_model=mode)
    records: list[CycleRecord] = []
    runner = HybridRunner(onboard, server, load_planning(None).contract, policy=policy)
    loop = PlannerLoop(CONFIG, runner, publish=lambda _e: None, sink=records.append,
                       planning=load_planning(None))
    try:
        now = loop.clock()
        return loop.run_cycle(0, now, InboundCommand("c0", "pick up the red cup", now))
    finally:
        server.close()


def _race(rec: CycleRecord) -> dict[str, Any]:
    assert rec.offboard is not None and "hybrid" in rec.offboard
    return rec.offboard["hybrid"]


def test_first_valid_takes_the_server_and_stops_the_slow_onboard_engine(
        onboard_slow: ProcessRunner, misbehaving_server: Any) -> None:
    rec = _cycle(onboard_slow, misbehaving_server.url, "plan", "first_valid")
    race = _race(rec)
    assert rec.plan_source == "model" and race["published"] == "server"
    assert rec.raw_output == "<pick><col:red><obj:cup>"
    # The onboard engine was stopped by the server's answer, not by the deadline.
    assert race["onboard"]["stop_reason"] == "aborted"
    assert race["server"]["valid"] and race["server"]["first_token_ns"] is not None


def test_first_valid_takes_onboard_when_the_server_stalls_and_closes_its_stream(
        onboard_fast: ProcessRunner, misbehaving_server: Any) -> None:
    rec = _cycle(onboard_fast, misbehaving_server.url, "stall", "first_valid")
    race = _race(rec)
    assert rec.plan_source == "model" and race["published"] == "onboard"
    assert race["onboard"]["valid"] and not race["server"]["valid"]
    assert rec.deadline_met
    assert misbehaving_server.wait_for(("disconnected", "stall"))


@pytest.mark.parametrize(("mode", "published", "fault"), [
    ("plan", "server", None),
    ("http500", "onboard", "server_error"),
    ("bad_plan", "onboard", None),
])
def test_prefer_server(onboard_fast: ProcessRunner, misbehaving_server: Any, mode: str,
                       published: str, fault: str | None) -> None:
    rec = _cycle(onboard_fast, misbehaving_server.url, mode, "prefer_server")
    race = _race(rec)
    assert rec.plan_source == "model" and race["published"] == published
    assert race["policy"] == "prefer_server" and race["why"]
    assert race["server"]["fault"] == fault
    # Both sides' timings are kept, whichever was published.
    assert race["onboard"]["first_token_ns"] is not None
    assert race["server"]["started_ns"] is not None


def test_hybrid_run_end_to_end_against_a_real_server(llama_server: Any, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    stream = tmp_path / "commands.jsonl"
    stream.write_text("".join(json.dumps({"t_ns": i, "text": t}) + "\n" for i, t in
                              enumerate(["pick up the red cup", "stop", "go to the kitchen"])))
    out = tmp_path / "run"
    rc = main(["run", "--engine", "hybrid", "--server-url", llama_server.url,
               "--hybrid-policy", "first_valid", "--n-threads", "1", "--stream", str(stream),
               "--asap", "--deadline-ms", "3000", "--period-ms", "3000", "--out", str(out),
               "--json"])
    assert rc == 0, capsys.readouterr().err
    records = read_records(out / "cycles.jsonl")
    assert len(records) == 3 and all(r.plan_source == "model" for r in records)
    for rec in records:
        race = _race(rec)
        assert race["published"] in ("onboard", "server")
        assert race["onboard"]["started_ns"] is not None
        assert race["server"]["started_ns"] is not None
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"] == "hybrid"
    assert manifest["engine_info"]["runner"] == "hybrid"
    from robot_latency.report.compare import compare_runs

    row = compare_runs([out])[0]
    assert row.plan_made == "hybrid"
    assert row.server_plans == sum(1 for r in records
                                   if _race(r)["published"] == "server")
