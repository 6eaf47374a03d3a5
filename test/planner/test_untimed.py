"""The untimed pass: the real engine, no deadline, the same profile; cached by content hash."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.models.bundled import bundled_model_path
from robot_latency.planner.config import RunSettings
from robot_latency.planner.resolve import resolve_run
from robot_latency.planner.untimed import (
    UntimedError,
    read_untimed,
    run_untimed,
    untimed_key,
)
from robot_latency.streams import SHIPPED_DIR, Command, CommandStream, read_stream


def _stream(n: int = 6) -> CommandStream:
    s = read_stream(SHIPPED_DIR / "steady_operator")
    return replace(s, commands=s.commands[:n])


def test_llamacpp_pass_takes_complete_plans_and_caches(tmp_path: Path) -> None:
    stream = _stream(4)
    settings = RunSettings(log_dir=tmp_path / "run", engine="llamacpp",
                           model=str(bundled_model_path("planner")), n_threads=1)
    run, _ = resolve_run(settings)
    up = run_untimed(run, stream, cache_dir=tmp_path / "cache")
    assert [c.command_id for c in up.commands] == [c.command_id for c in stream.commands]
    for c in up.commands:
        assert c.asked and c.tokens_out >= 1
        assert c.stop_reason in ("done", "complete", "max_tokens")
        # a warmed fixed prefix is not prefilled again (the bundled profile has none)
        assert 1 <= c.uncached_prompt_tokens <= c.prompt_tokens
        assert c.plan_valid == (c.plan is not None)
    assert any(c.plan_valid for c in up.commands)
    cached = tmp_path / "cache" / f"{up.key}.json"
    assert read_untimed(cached) == up
    # a second pass is the cached file: mark it and see the mark come back
    data = json.loads(cached.read_text())
    data["profile"] = "from the cache"
    cached.write_text(json.dumps(data))
    assert run_untimed(run, stream, cache_dir=tmp_path / "cache").profile == "from the cache"


def test_the_key_is_content_not_speed(tmp_path: Path) -> None:
    stream = _stream()
    base = RunSettings(log_dir=tmp_path / "a", engine="sim", model="qwen2.5-0.5b",
                       quant="Q8_0")
    key = untimed_key(resolve_run(base)[0], stream)
    # the host's speed (the device the sim engine plays, its jitter) and the arrival times
    # are not in it
    fast = replace(base, engine_options={"device": "orin-agx-64gb", "jitter_sigma": 0.3})
    slower = replace(stream, commands=tuple(replace(c, t_ns=2 * c.t_ns)
                                            for c in stream.commands))
    assert untimed_key(resolve_run(fast)[0], slower) == key
    # what changes the output is
    assert untimed_key(resolve_run(replace(base, max_tokens=3))[0], stream) != key
    assert untimed_key(resolve_run(replace(base, quant="Q4_0"))[0], stream) != key
    changed = replace(stream, commands=(replace(stream.commands[0], text="stop"),
                                        *stream.commands[1:]))
    assert untimed_key(resolve_run(base)[0], changed) != key


def test_refused_commands_are_not_asked_and_cut_plans_are_judged(tmp_path: Path) -> None:
    stream = CommandStream(name="s", source="s", topic=None, commands=(
        Command(0, "   ", "s:0"), Command(1, "pick the red cup", "s:1"),
        Command(2, "x" * 600, "s:2")))
    run, _ = resolve_run(RunSettings(log_dir=tmp_path / "a", engine="sim", max_tokens=2))
    up = run_untimed(run, stream)
    assert [c.asked for c in up.commands] == [False, True, False]
    cut = up.commands[1]
    assert cut.tokens_out == 2 and cut.stop_reason == "max_tokens" and not cut.plan_valid


def test_a_broken_cache_file_is_named_then_rerun(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    stream = _stream(2)
    run, _ = resolve_run(RunSettings(log_dir=tmp_path / "a", engine="sim"))
    key = untimed_key(run, stream)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"{key}.json").write_text("{not json")
    with pytest.raises(UntimedError, match=f"{key}.json"):
        read_untimed(tmp_path / "cache" / f"{key}.json")
    up = run_untimed(run, stream, cache_dir=tmp_path / "cache")
    assert len(up.commands) == 2 and "running it again" in caplog.text
    assert read_untimed(tmp_path / "cache" / f"{key}.json") == up


def test_a_batched_pass_is_the_one_at_a_time_pass(tmp_path: Path) -> None:
    # the JSON planner: its chat prompt's fixed prefix is warmed and cached; a refused command
    # between asked ones; fewer sequences than commands (slots are handed on)
    s = _stream(5)
    blank = Command(s.commands[1].t_ns, "   ", "s:blank")
    stream = replace(s, commands=(*s.commands[:2], blank, *s.commands[2:]))
    settings = RunSettings(log_dir=tmp_path / "run", engine="llamacpp",
                           model=str(bundled_model_path("planner-json")),
                           profile="bundled-json", n_threads=1)
    run, _ = resolve_run(settings)
    one = run_untimed(run, stream, sequences=1)
    batched = run_untimed(run, stream, sequences=3)
    assert batched == one
    assert [c.asked for c in one.commands] == [True, True, False, True, True, True]
    # the fixed prefix is warmed at load: no command prefills it
    assert all(c.uncached_prompt_tokens < c.prompt_tokens // 2 for c in one.commands if c.asked)
