"""One settings path: the CLI and the ROS node build the same run from the same inputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from robot_latency.cli import build_parser
from robot_latency.cli.run_args import run_config_from_args
from robot_latency.models.bundled import bundled_model_path
from robot_latency.planner.budget import CpuBudget
from robot_latency.planner.config import LOOP_FIELDS, RunSettings, SettingsError
from robot_latency.planner.resolve import resolve_run, thread_defaults
from robot_latency.ros.params import ParamError, planner_settings
from robot_latency.streams import Command, read_stream, write_jsonl

TWO = frozenset({0, 1})


@pytest.mark.parametrize(("flags", "params"), [
    ([], {}),
    (["--loop-cpus", "0"], {"loop_cpus": "0"}),
    (["--loop-cpus", "0", "--loop-priority", "50"], {"loop_cpus": "0", "loop_priority": 50}),
    (["--n-threads", "1", "--n-threads-batch", "2", "--profile", "instruct-json",
      "--max-tokens", "40"],
     {"n_threads": 1, "n_threads_batch": 2, "planner_profile": "instruct-json",
      "max_tokens": 40}),
])
def test_cli_and_node_build_the_same_engine_settings(tmp_path: Path, flags: list[str],
                                                     params: dict) -> None:
    stream = read_stream(write_jsonl(tmp_path / "s.jsonl", [Command(0, "stop", "c0")]))
    model = str(bundled_model_path())
    args = build_parser().parse_args([
        "run", "--stream", str(tmp_path / "s.jsonl"), "--model", model, "--mode", "event",
        "--deadline-ms", "300", "--period-ms", "400", "--out", str(tmp_path / "cli"), *flags])
    cli = run_config_from_args(args, tmp_path / "cli", stream, engine="llamacpp", quant=None,
                               device="orin-agx-64gb", deadline_ms=300.0, period_ms=400.0,
                               label=None, cores=TWO)
    node = planner_settings({"model": model, "mode": "event", "deadline_ms": 300,
                             "period_ms": 400, "target_device": "orin-agx-64gb",
                             "log_dir": str(tmp_path / "node"), **params}, cpu_count=2).run
    assert cli.engine_options == node.engine_options
    # the differences by design: the node publishes over DDS and measures the transport
    # margin (its loop's own lateness inside it); the CLI's run publishes to no middleware,
    # keeps no transport margin and learns its publish margin from the loop's lateness
    assert node.settings.transport_margin_ms < 0 and cli.settings.transport_margin_ms == 0
    assert node.settings.publish_margin_ms >= 0 > cli.settings.publish_margin_ms
    loop = replace(node.settings, transport_margin_ms=0.0,
                   publish_margin_ms=cli.settings.publish_margin_ms).loop_config()
    assert cli.settings.loop_config() == loop and set(loop) == set(LOOP_FIELDS)
    assert (cli.engine, cli.model, cli.settings.profile, cli.cpu, cli.host_device,
            cli.target_device, cli.planning.profile.name) == \
        (node.engine, node.model, node.settings.profile, node.cpu, node.host_device,
         node.target_device, node.planning.profile.name)


def test_thread_defaults_follow_the_cpu_budget() -> None:
    assert thread_defaults(CpuBudget(), cores=TWO) == (1, 2)  # unpinned: prefill on all
    assert thread_defaults(CpuBudget(loop_cpus=(0,)), cores=TWO) == (1, 1)
    assert thread_defaults(CpuBudget(loop_cpus=(0,), loop_priority=50), cores=TWO) == (1, 2)
    assert thread_defaults(CpuBudget(engine_cpus=(1,)), cores=TWO) == (1, 1)
    assert thread_defaults(CpuBudget(), cores=frozenset(range(8))) == (7, 8)
    assert thread_defaults(CpuBudget(), cores=frozenset({0})) == (1, 1)


def test_explicit_threads_win_and_prefill_never_has_fewer_than_decode(tmp_path: Path) -> None:
    run, _ = resolve_run(RunSettings(log_dir=tmp_path, n_threads=3), cores=TWO)
    assert (run.engine_options["n_threads"], run.engine_options["n_threads_batch"]) == (3, 3)


def test_profile_prefix_and_budget_go_to_the_llamacpp_engine(tmp_path: Path) -> None:
    spec = RunSettings(max_command_chars=200, log_dir=tmp_path, profile="instruct-json")
    run, _ = resolve_run(spec, cores=TWO)
    opts = run.engine_options
    assert opts["warm_prefix"].startswith("<|im_start|>system")
    assert opts["max_new_tokens"] == 160  # the profile's max_tokens
    assert opts["max_suffix_tokens"] >= 200
    assert run.planning.profile.name == "instruct-json"
    bundled, _ = resolve_run(RunSettings(log_dir=tmp_path), cores=TWO)
    assert "warm_prefix" not in bundled.engine_options  # no fixed prefix to warm


@pytest.mark.parametrize(("spec", "name", "message"), [
    (dict(engine="sim", profile="instruct-json"), "profile", "bundled action language only"),
    (dict(engine="onnx", profile="instruct-json"), "profile", "cannot constrain decoding"),
    (dict(engine="sim", draft_model="d.gguf"), "draft_model", "only the llamacpp engine"),
    (dict(draft_k=4), "draft_k", "needs a draft model"),
    (dict(profile="nosuch"), "profile", "nosuch"),
    (dict(engine="openai"), "server_url", "needs a server URL"),
])
def test_settings_that_cannot_go_together_are_refused(tmp_path: Path, spec: dict, name: str,
                                                      message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        resolve_run(RunSettings(log_dir=tmp_path, **spec))
    assert info.value.name == name


def test_node_names_the_planner_profile_parameter(tmp_path: Path) -> None:
    with pytest.raises(ParamError, match=r"parameter 'planner_profile': .*'nosuch'"):
        planner_settings({"planner_profile": "nosuch", "log_dir": str(tmp_path)})
    with pytest.raises(ParamError, match=r"parameter 'planner_profile': .*bundled action"):
        planner_settings({"planner_profile": "instruct-json", "engine": "sim",
                          "log_dir": str(tmp_path)})
