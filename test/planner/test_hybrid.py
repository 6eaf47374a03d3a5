"""Hedged planning: the onboard engine (its worker process) and a server asked at once; the policy
decides which plan is published and the record keeps both sides and why."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
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
#: Slower still: 1.6 s per token, so LONG's plan (8 tokens) takes 13 s, past SLOWER_CONFIG's
#: 8 s deadline; the engine checks its abort between tokens.
SLOWER_SIM = {**SLOW_SIM, "efficiency": 0.125, "jitter_sigma": 0.0}
SLOWER_CONFIG = RunSettings(period_ms=8000, deadline_ms=8000, publish_margin_ms=100)
LONG = "find the green ball then go to the garage quickly"


@pytest.fixture(scope="module")
def onboard_fast() -> Iterator[ProcessRunner]:
    """The bundled planner in llama.cpp, in its worker process."""
    with ProcessRunner("llamacpp", {"n_threads": 1}) as runner:
        yield runner


@pytest.fixture(scope="module")
def onboard_slow() -> Iterator[ProcessRunner]:
    with ProcessRunner("sim", SLOW_SIM) as runner:
        yield runner


@pytest.fixture(scope="module")
def onboard_slower() -> Iterator[ProcessRunner]:
    with ProcessRunner("sim", SLOWER_SIM) as runner:
        yield runner


def _cycle(onboard: Any, url: str, mode: str, policy: str, *,
           config: RunSettings = CONFIG, command: str = "pick up the red cup",
           profile: str | None = None, published: list[dict[str, Any]] | None = None,
           **server_options: Any) -> CycleRecord:
    planning = load_planning(profile)
    server = create_engine("openai", server_url=url, server_model=mode,
                           contract=planning.contract, **server_options)
    records: list[CycleRecord] = []
    runner = HybridRunner(onboard, server, planning.contract, policy=policy)
    sink = published.append if published is not None else (lambda _e: None)
    loop = PlannerLoop(config, runner, publish=sink, sink=records.append, planning=planning)
    try:
        now = loop.clock()
        return loop.run_cycle(0, now, InboundCommand("c0", command, now))
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
    # Both sides' timings are kept, whichever was published: what the onboard side produced
    # (its first token, when it had one before the server's plan stopped it: on a loaded host
    # it may have had none) and the server's request.
    onboard = race["onboard"]
    assert (onboard["first_token_ns"] is None) == (onboard["tokens"] == 0), onboard
    if published == "onboard":
        assert onboard["first_token_ns"] is not None and onboard["valid"]
    assert race["server"]["started_ns"] is not None


def test_hybrid_run_end_to_end_against_a_real_server(llama_server: Any, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    stream = tmp_path / "commands.jsonl"
    stream.write_text("".join(json.dumps({"t_ns": i, "text": t}) + "\n" for i, t in
                              enumerate(["pick up the red cup", "stop", "go to the kitchen"])))
    out = tmp_path / "run"
    rc = main(["run", "--engine", "hybrid", "--server-url", llama_server.url,
               "--hybrid-policy", "first_valid", "--n-threads", "1", "--stream", str(stream),
               "--asap", "--deadline-ms", "60000", "--period-ms", "60000", "--out", str(out),
               "--json"])  # the deadline is a hang guard: this is the wiring, not the timing
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


# --- a fast real server, a slow onboard engine ----------------------------------------------
@pytest.mark.parametrize("policy", ["first_valid", "prefer_server"])
def test_a_valid_server_plan_stops_the_slow_onboard_engine_under_both_policies(
        onboard_slower: ProcessRunner, llama_server: Any, policy: str) -> None:
    """The onboard model cannot finish by the deadline; the server's plan arrives long before.
    Under either policy it is published and the onboard generation is aborted at once, not
    waited for until the give-up (which made prefer_server fall back with ``deadline``)."""
    rec = _cycle(onboard_slower, llama_server.url, "", policy, config=SLOWER_CONFIG,
                 command=LONG)
    race = _race(rec)
    assert rec.plan_source == "model", (rec.fallback_reason, race)
    assert race["published"] == "server" and race["server"]["valid"]
    assert race["server"]["stop_reason"] in ("done", "complete")
    assert race["onboard"]["status"] == "stopped"
    assert race["onboard"]["stop_reason"] == "aborted"
    # In time: the server's stream ended (stamped as it ended) by the give-up time.
    assert race["server"]["finished_ns"] <= rec.deadline_ns - rec.margin_ns
    assert rec.deadline_met


@pytest.mark.parametrize("policy", ["first_valid", "prefer_server"])
def test_an_inline_onboard_engine_is_stopped_by_the_servers_plan_too(
        llama_server: Any, policy: str) -> None:
    """``--runner inline``: the onboard engine runs in the loop's own thread; the server's valid
    plan stops it at its next abort check (it ignored the request before, and ran to the
    give-up)."""
    from robot_latency.planner.engine import create_planner_engine
    from robot_latency.planner.runner import InlineRunner

    onboard = InlineRunner(create_planner_engine("sim", **SLOWER_SIM))
    try:
        rec = _cycle(onboard, llama_server.url, "", policy,
                     config=SLOWER_CONFIG, command=LONG)
    finally:
        onboard.close()
    race = _race(rec)
    assert rec.plan_source == "model", (rec.fallback_reason, race)
    assert race["published"] == "server"
    assert race["onboard"]["status"] == "stopped"
    assert race["onboard"]["stop_reason"] == "aborted"
    assert rec.deadline_met


# --- a JSON profile ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """llama-cpp-python's server with a context long enough for instruct-json's prompt."""
    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    with LocalServer(bundled_model_path(), n_threads=1, n_ctx=4096,
                     log_path=tmp_path_factory.mktemp("json-server") / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def onboard_json() -> Iterator[ProcessRunner]:
    """The bundled planner in llama.cpp, with room for instruct-json's prompt."""
    with ProcessRunner("llamacpp", {"n_threads": 1, "n_ctx": 4096}) as runner:
        yield runner


#: The planner's vocabulary spells JSON byte by byte: a 3-step plan is about 290 tokens, which
#: took over 30 s on two cores kept busy: the deadline is a hang guard, as what these tests
#: check (which side's plan counts, which is stopped) must not turn on the host's load.
JSON_CONFIG = RunSettings(period_ms=600_000, deadline_ms=600_000, publish_margin_ms=100,
                          max_tokens=320, profile="instruct-json")


@pytest.mark.parametrize("policy", ["first_valid", "prefer_server"])
def test_a_json_plan_complete_at_its_brace_counts_as_valid_on_both_sides(
        onboard_json: ProcessRunner, json_server: Any, policy: str) -> None:
    """instruct-json's plans end ``complete`` (the closing brace), not ``done``, on both sides.
    Both count: first_valid publishes the first and stops the other; prefer_server the
    server's, with the onboard one judged valid too."""
    rec = _cycle(onboard_json, json_server.url, "", policy, config=JSON_CONFIG,
                 profile="instruct-json")
    race = _race(rec)
    assert rec.plan_source == "model", (rec.fallback_reason, race)
    contract = load_planning("instruct-json").contract
    assert rec.plan == contract.parse(rec.raw_output or "")
    winner, other = race["published"], "server" if race["published"] == "onboard" else "onboard"
    assert race[winner]["valid"] and race[winner]["stop_reason"] == "complete"
    if policy == "prefer_server":
        assert winner == "server"
        # the onboard plan was valid as well, or stopped by the server's
        assert race["onboard"]["valid"] or race["onboard"]["status"] == "stopped"
    else:
        # the slower side was stopped (or had finished too)
        assert race[other]["status"] in ("stopped", "ok", "late")
        if race[other]["status"] != "stopped":
            assert race[other]["stop_reason"] == "complete"


def test_first_valid_stops_a_server_that_never_finishes_after_a_json_onboard_win(
        onboard_json: ProcessRunner, misbehaving_server: Any) -> None:
    """The onboard JSON plan (``complete``) wins: the server's endless stream is closed then,
    instead of waited for until the give-up ("neither plan was valid in time"). The server
    streams for longer than the deadline, and the deadline is a hang guard: the onboard plan
    wins however long it takes on a loaded host, and the server is still streaming then."""
    start = len(misbehaving_server.events)
    rec = _cycle(onboard_json, misbehaving_server.url, "endless", "first_valid",
                 config=JSON_CONFIG, profile="instruct-json")
    race = _race(rec)
    assert rec.plan_source == "model" and race["published"] == "onboard", race
    assert race["onboard"]["stop_reason"] == "complete"
    assert race["server"]["status"] == "stopped"
    end = time.monotonic() + 60  # a hang guard: the closed stream's end reaches the server
    while ("disconnected", "endless") not in misbehaving_server.events[start:] \
            and time.monotonic() < end:
        time.sleep(0.01)
    assert ("disconnected", "endless") in misbehaving_server.events[start:]


# --- the server killed mid-stream -------------------------------------------------------------
def _kill_after_first_chunk(engine: Any, server: Any) -> threading.Thread:
    """SIGKILL ``server`` once the engine's request has streamed its first chunk."""
    started: list[Any] = []
    start = engine.start

    def spy(request: Any) -> Any:
        pending = start(request)
        started.append(pending)
        return pending
    engine.start = spy

    def kill() -> None:
        end = time.monotonic() + 120  # a hang guard
        while (not started or not started[0].state.token_ns) and time.monotonic() < end:
            time.sleep(0.001)
        server.stop()  # SIGKILL to its process group
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("policy", ["first_valid", "prefer_server"])
def test_a_server_killed_mid_stream_is_a_server_error_published_in_time(
        onboard_slower: ProcessRunner, tmp_path: Path, policy: str) -> None:
    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    planning = load_planning(None)
    published: list[dict[str, Any]] = []
    records: list[CycleRecord] = []
    with LocalServer(bundled_model_path(), n_threads=1,
                     log_path=tmp_path / "server.log") as local:
        # A long unconstrained answer (end of text banned), so the kill lands mid-stream.
        server = create_engine("openai", server_url=local.url, grammar=False,
                               contract=planning.contract,
                               request_extra={"logit_bias": {"4": -100.0}})
        runner = HybridRunner(onboard_slower, server, planning.contract, policy=policy)
        loop = PlannerLoop(dataclasses.replace(SLOWER_CONFIG, max_tokens=800, grammar=False),
                           runner, publish=published.append, sink=records.append,
                           planning=planning)
        killer = _kill_after_first_chunk(server, local)
        try:
            now = loop.clock()
            rec = loop.run_cycle(0, now, InboundCommand("c0", LONG, now))
        finally:
            killer.join(timeout=120)
            server.close()
    race = _race(rec)
    assert race["server"]["tokens"] >= 1  # it died mid-stream
    assert race["server"]["fault"] == "server_error" and race["server"]["status"] == "error"
    assert rec.fallback_reason == "server_error" and rec.plan_source == "fallback"
    assert rec.offboard is not None and rec.offboard["fault"] == "server_error"
    assert "stream broken" in (rec.engine_error or "")
    assert rec.plan is not None and rec.deadline_met
    assert len(published) == 1 and published[0]["deadline_met"]
