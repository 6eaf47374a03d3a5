"""The planner loop with the openai engine: every fault ends in the fallback by the deadline with
its own reason in the record; nothing leaks over cycles in which the server dies and comes back.

Deadlines here are generous (hang guards); the assertions are on records and counts.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import psutil
import pytest

from robot_latency.engines.base import create_engine
from robot_latency.engines.llama_server import free_port
from robot_latency.planner.config import RunSettings
from robot_latency.planner.loop import InlineRunner, PlannerLoop
from robot_latency.planner.mailbox import InboundCommand
from robot_latency.profiles.profile import load_planning
from robot_latency.records import CycleRecord

CONFIG = RunSettings(period_ms=1500, deadline_ms=1500, publish_margin_ms=100)
#: For a server that answers (or fails) by itself: a deadline only a hang reaches, so what the
#: cycle records is the server's doing whatever the host's load; the stall alone needs the
#: deadline to come, and it comes whatever the load, since the server never answers.
GUARD = RunSettings(period_ms=60_000, deadline_ms=60_000, publish_margin_ms=100)


class Loop:
    """A loop over one openai engine, collecting its records and published envelopes."""

    def __init__(self, url: str, config: RunSettings = CONFIG, **options: Any) -> None:
        self.engine = create_engine("openai", server_url=url, **options)
        self.records: list[CycleRecord] = []
        self.published: list[dict[str, Any]] = []
        self.loop = PlannerLoop(config, InlineRunner(self.engine), publish=self.published.append,
                                sink=self.records.append, planning=load_planning(None))

    def cycle(self, text: str = "pick up the red cup") -> CycleRecord:
        now = self.loop.clock()
        n = len(self.records)
        return self.loop.run_cycle(n, now, InboundCommand(f"c{n}", text, now))

    def close(self) -> None:
        self.engine.close()


@pytest.mark.parametrize(("mode", "reason"), [
    ("plan", None),
    ("http500", "server_error"),
    ("malformed", "server_malformed"),
    ("error_event", "server_error"),
    ("stall", "deadline"),
    ("no_finish", "invalid_output"),
    ("bad_plan", "invalid_output"),
])
def test_each_server_fault_falls_back_by_the_deadline_with_its_reason(
        misbehaving_server: Any, mode: str, reason: str | None) -> None:
    loop = Loop(misbehaving_server.url, CONFIG if mode == "stall" else GUARD, server_model=mode)
    try:
        rec = loop.cycle()
    finally:
        loop.close()
    assert rec.fallback_reason == reason
    assert rec.plan_source == ("model" if reason is None else "fallback")
    assert rec.plan is not None and rec.deadline_met
    assert rec.offboard is not None and rec.offboard["model"] == mode
    assert len(loop.published) == 1


def test_server_down_falls_back_as_server_unreachable() -> None:
    loop = Loop(f"http://127.0.0.1:{free_port()}/v1")
    try:
        recs = [loop.cycle() for _ in range(3)]
    finally:
        loop.close()
    assert [r.fallback_reason for r in recs] == ["server_unreachable"] * 3
    assert all(r.deadline_met and r.plan is not None for r in recs)
    assert "connect" in (recs[0].engine_error or "")


def test_a_real_server_plans_and_the_record_says_where(llama_server: Any) -> None:
    loop = Loop(llama_server.url, GUARD)
    try:
        rec = loop.cycle("go to the kitchen")
    finally:
        loop.close()
    assert rec.plan_source == "model", rec.engine_error
    assert rec.offboard is not None and rec.offboard["url"] == llama_server.url
    assert rec.offboard["api"] == "completions" and rec.tokens_out == len(rec.token_ns) >= 1
    assert rec.ttft_ns is not None and rec.ttft_ns > 0


def _fds() -> int:
    return psutil.Process(os.getpid()).num_fds()


def test_no_leak_when_the_server_is_killed_and_restarted_midway(llama_server: Any) -> None:
    """A short form of the 1,000-cycle drill (bench/offboard_leak.py runs the long one)."""
    n, kill_at, back_at = 36, 12, 24
    loop = Loop(llama_server.url, GUARD)  # every plan the server's while it is up
    try:
        for _ in range(4):  # warm: connection pool, event loop, first allocations
            loop.cycle()
        threads0, fds0 = threading.active_count(), _fds()
        for i in range(n):
            if i == kill_at:
                llama_server.stop()
            if i == back_at:
                llama_server.start()
            loop.cycle(["pick up the red cup", "stop", "go to the kitchen"][i % 3])
        threads1, fds1 = threading.active_count(), _fds()
    finally:
        loop.close()
        if llama_server.proc is None or llama_server.proc.poll() is not None:
            llama_server.start()
    recs = loop.records[4:]
    assert len(recs) == n and all(r.plan is not None for r in recs)
    down = recs[kill_at:back_at]
    assert all(r.fallback_reason == "server_unreachable" for r in down)
    assert all(r.plan_source == "model" for r in recs[:kill_at])
    assert all(r.plan_source == "model" for r in recs[back_at:])
    # Nothing accumulates: no thread per request, no socket left open per cycle.
    assert threads1 <= threads0
    assert fds1 <= fds0 + 4


def test_a_server_killed_mid_stream_falls_back_as_server_error_in_time(tmp_path: Any) -> None:
    """SIGKILL of the server while it streams: the request in flight ends on the broken stream
    (``server_error``, its fault in the record), not at the deadline; the fallback is published
    in time."""
    import time

    from robot_latency.engines.llama_server import LocalServer
    from robot_latency.models.bundled import bundled_model_path

    with LocalServer(bundled_model_path(), n_threads=1,
                     log_path=tmp_path / "server.log") as server:
        # A long unconstrained answer (end of text banned), so the kill lands mid-stream.
        # The deadline is a hang guard: the stream breaks after its first chunk, however long
        # that chunk takes on a loaded host.
        loop = Loop(server.url, GUARD, grammar=False,
                    request_extra={"logit_bias": {"4": -100.0}})
        loop.loop.max_tokens = 800
        started: list[Any] = []
        start = loop.engine.start

        def spy(request: Any) -> Any:
            started.append(start(request))
            return started[-1]
        loop.engine.start = spy

        def kill() -> None:
            end = time.monotonic() + 120  # a hang guard
            while (not started or not started[0].state.token_ns) and time.monotonic() < end:
                time.sleep(0.001)
            server.stop()  # SIGKILL to its process group
        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        try:
            rec = loop.cycle()
        finally:
            killer.join(timeout=120)
            loop.close()
    assert rec.token_ns, "the server died before it streamed"
    assert rec.fallback_reason == "server_error" and rec.plan_source == "fallback"
    assert rec.offboard is not None and rec.offboard["fault"] == "server_error"
    assert rec.stop_reason == "error" and "stream broken" in (rec.engine_error or "")
    assert rec.plan is not None and rec.deadline_met
    assert len(loop.published) == 1 and loop.published[0]["deadline_met"]
