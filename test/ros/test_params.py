"""The nodes' parameter tables, validation, diagnostics levels and replay pacing (no ROS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from robot_latency.clock import ScriptedClock
from robot_latency.records import CycleRecord
from robot_latency.ros.diagnostics import (
    ERROR,
    OK,
    WARN,
    DiagnosticsTracker,
    DiagnosticThresholds,
)
from robot_latency.ros.pacing import Pacer, schedule
from robot_latency.ros.params import PLANNER_PARAMS, ParamError, check_update, planner_settings
from robot_latency.ros.replayer_params import REPLAYER_PARAMS, replayer_settings
from robot_latency.streams import Command

JETSON = Path(__file__).resolve().parent.parent / "fixtures" / "jetson"


def test_tables_have_unique_names_and_valid_defaults(tmp_path: Path) -> None:
    for table in (PLANNER_PARAMS, REPLAYER_PARAMS):
        names = [s.name for s in table]
        assert len(names) == len(set(names))
        assert all(s.description for s in table)
    settings = planner_settings({"log_dir": str(tmp_path)})  # every default validates
    assert settings.run.engine == "llamacpp"
    assert settings.run.settings.period_ms == 200.0


def test_sim_engine_simulates_the_target(tmp_path: Path) -> None:
    s = planner_settings({"engine": "sim", "target_device": "orin-agx-64gb",
                          "log_dir": str(tmp_path), "deadline_ms": 80, "period_ms": "100",
                          "fallback": "rule, stop"})
    assert s.run.engine_options == {"device": "orin-agx-64gb", "model": "qwen2.5-0.5b",
                                    "quant": "Q4_K_M"}
    assert s.run.host_device == s.run.target_device == "orin-agx-64gb"
    assert s.run.settings.deadline_ms == 80.0 and s.run.settings.period_ms == 100.0
    assert s.run.settings.fallback == ("rule", "stop")


def test_real_engine_leaves_a_core_to_the_loop(tmp_path: Path) -> None:
    s = planner_settings({"log_dir": str(tmp_path), "n_gpu_layers": -1}, cpu_count=12)
    assert s.run.engine_options["n_threads"] == 11
    assert s.run.engine_options["n_gpu_layers"] == -1
    assert s.run.host_device == "auto"


def test_draft_model_goes_to_the_llamacpp_engine(tmp_path: Path) -> None:
    draft = tmp_path / "d.gguf"
    draft.write_bytes(b"GGUF")
    s = planner_settings({"log_dir": str(tmp_path), "model": "t.gguf",
                          "draft_model": str(draft)})
    assert s.run.engine_options["draft"] == "model"
    assert s.run.engine_options["draft_model_path"] == str(draft.resolve())
    with pytest.raises(ParamError, match=r"parameter 'draft_model': .*nope.gguf: no such file"):
        planner_settings({"log_dir": str(tmp_path), "draft_model": str(tmp_path / "nope.gguf")})


def test_auto_device_is_the_detected_jetson_or_the_default(tmp_path: Path) -> None:
    jetson = planner_settings({"log_dir": str(tmp_path)},
                              sysfs_root=JETSON / "agx-orin-64gb-maxn")
    assert jetson.run.target_device == "orin-agx-64gb"
    other = planner_settings({"log_dir": str(tmp_path)}, sysfs_root=JETSON / "not-jetson")
    assert other.run.target_device == "orin-nano-8gb"


def test_default_log_dir_is_under_ros_home(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("ROS_HOME", str(tmp_path))
    s = planner_settings({"engine": "sim"})
    assert s.run.log_dir.parent == tmp_path / "robot_latency"


@pytest.mark.parametrize(("values", "name"), [
    ({"deadline_ms": 300.0}, "deadline_ms"),          # above the 200 ms period
    ({"deadline_ms": "soon"}, "deadline_ms"),
    ({"period_ms": -5.0}, "period_ms"),
    ({"mode": "sometimes"}, "mode"),
    ({"fallback": "rule,pray"}, "fallback"),
    ({"fallback": []}, "fallback"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"mailbox_capacity": True}, "mailbox_capacity"),
    ({"publish_margin_ms": 150.0}, "publish_margin_ms"),
    ({"target_device": "xavier-nx"}, "target_device"),
    ({"miss_rate_warn": 0.5, "miss_rate_error": 0.1}, "miss_rate_warn"),
    ({"miss_rate_error": 1.5}, "miss_rate_error"),
    ({"draft_model": "draft.gguf"}, "draft_model"),
    ({"engine": " "}, "engine"),
    ({"grammar": "maybe"}, "grammar"),
    ({"deadline": 100.0}, "deadline"),                 # not a parameter at all
])
def test_bad_values_name_the_parameter(values: dict, name: str, tmp_path: Path) -> None:
    with pytest.raises(ParamError) as info:
        planner_settings({"engine": "sim", "log_dir": str(tmp_path), **values})
    assert info.value.name == name
    assert name in str(info.value)


def test_runtime_updates(tmp_path: Path) -> None:
    current = planner_settings({"engine": "sim", "log_dir": str(tmp_path)}).values
    update = check_update(current, {"miss_rate_warn": 0.02, "diagnostics_period_s": 0.5})
    assert update.diagnostics.miss_rate_warn == 0.02
    assert update.diagnostics_period_s == 0.5
    with pytest.raises(ParamError, match="cannot change at run time"):
        check_update(current, {"deadline_ms": 100.0})
    check_update(current, {"deadline_ms": current["deadline_ms"]})  # unchanged: fine
    with pytest.raises(ParamError, match="miss_rate_warn"):
        check_update(current, {"miss_rate_warn": 0.9})  # above miss_rate_error
    with pytest.raises(ParamError, match="diagnostics_period_s"):
        check_update(current, {"diagnostics_period_s": 0.0})


def test_replayer_settings() -> None:
    s = replayer_settings({"bag": "~/bags/x", "speed": 2, "loop_count": 3})
    assert s.bag == Path("~/bags/x").expanduser() and s.speed == 2.0 and s.topic is None
    assert s.min_subscribers == 1
    assert replayer_settings({"bag": "x", "min_subscribers": 2}).min_subscribers == 2
    with pytest.raises(ParamError, match="'min_subscribers'"):
        replayer_settings({"bag": "x", "min_subscribers": 0})
    with pytest.raises(ParamError, match="'bag'"):
        replayer_settings({})
    with pytest.raises(ParamError, match="'speed'"):
        replayer_settings({"bag": "x", "speed": 0.0})


def _record(cycle: int, *, met: bool, reason: str | None = None,
            tokens: tuple[int, ...] = ()) -> CycleRecord:
    scheduled = cycle * 100_000_000
    deadline = scheduled + 80_000_000
    published = deadline - 1 if met else deadline + 5_000_000
    return CycleRecord(run_id="t", cycle=cycle, scheduled_ns=scheduled, deadline_ns=deadline,
                       started_ns=scheduled, published_ns=published,
                       token_ns=[scheduled + t for t in tokens],
                       plan_source="fallback" if reason else "model", fallback_reason=reason)


def test_diagnostic_levels_follow_thresholds() -> None:
    tracker = DiagnosticsTracker(deadline_ms=80.0)
    t = DiagnosticThresholds(miss_rate_warn=0.05, miss_rate_error=0.2, itl_p99_warn_ms=5.0,
                             itl_p99_error_ms=10.0)
    good = [_record(i, met=True, tokens=(10_000_000, 12_000_000)) for i in range(20)]
    mailbox = {"received": 3, "dropped": 0, "superseded": 0}
    reports = {r.name: r for r in tracker.evaluate(good, t, engine={}, mailbox=mailbox)}
    assert [reports[n].level for n in ("deadline", "latency", "engine", "mailbox")] == [OK] * 4
    assert reports["latency"].values["ttft_p99_ms"] == "10.000"

    some = [*good[:18], _record(18, met=False, reason="deadline"),
            _record(19, met=True, reason="engine_error")]
    reports = {r.name: r for r in tracker.evaluate(some, t, engine={},
                                                   mailbox={**mailbox, "dropped": 2})}
    assert reports["deadline"].level == WARN
    assert reports["deadline"].values["fallback.deadline"] == "1"
    assert reports["engine"].level == WARN
    assert reports["mailbox"].level == WARN

    bad = [_record(i, met=False, reason="engine_unavailable") for i in range(5)]
    reports = {r.name: r for r in tracker.evaluate(bad, t, engine={}, mailbox=mailbox)}
    assert reports["deadline"].level == ERROR and reports["engine"].level == ERROR
    assert reports["latency"].values["ttft_p99_ms"] == "n/a"  # no samples: not 0


def test_schedule_is_absolute_and_loops() -> None:
    cmds = [Command(0, "a", "s:0"), Command(1_000, "b", "s:1")]
    sends = schedule(cmds, start_ns=10_000, speed=2.0, loop_count=2, loop_gap_ns=100)
    assert [s.at_ns for s in sends] == [10_000, 10_500, 10_600, 11_100]
    assert [s.play for s in sends] == [0, 0, 1, 1]


def test_a_late_send_does_not_delay_the_next() -> None:
    clock = ScriptedClock(0)
    sent: list[tuple[str, int]] = []

    def send(text: str) -> None:
        sent.append((text, clock()))
        if text == "a":
            clock.advance(150)  # a slow publish

    cmds = [Command(0, "a", "s:0"), Command(100, "b", "s:1"), Command(300, "c", "s:2")]
    pacer = Pacer(schedule(cmds, start_ns=0), send, clock=clock,
                  sleep=lambda s: clock.advance(max(1, round(s * 1e9))))
    report = pacer.run()
    # "b" goes out late (at 150, not 100); "c" still at its own time, 300: no drift.
    assert sent == [("a", 0), ("b", 150), ("c", 300)]
    assert report.sent == 3 and report.lateness_ms == [0.0, 50 / 1e6, 0.0]


def test_the_old_name_device_profile_still_sets_the_target_device(tmp_path: Path) -> None:
    """Renamed to target_device (a device's datasheet, not a profile): the old name keeps working
    for one release, with a note naming the new one; a bad value is reported under the name the
    user wrote."""
    s = planner_settings({"engine": "sim", "device_profile": "orin-agx-64gb",
                          "log_dir": str(tmp_path)})
    assert s.run.settings.target_device == "orin-agx-64gb"
    assert any("'target_device'" in note for note in s.notes)
    with pytest.raises(ParamError) as err:
        planner_settings({"engine": "sim", "device_profile": "xavier-nx",
                          "log_dir": str(tmp_path)})
    assert err.value.name == "device_profile"
    plain = planner_settings({"engine": "sim", "target_device": "orin-agx-64gb",
                              "log_dir": str(tmp_path)})
    assert not any("device_profile" in note for note in plain.notes)
