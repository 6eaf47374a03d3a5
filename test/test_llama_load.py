"""llama.cpp's load setting per CPU: extra buffer types off where the CPU or build has AMX.

The AMX decision is checked on fixture /proc/cpuinfo files (a Sapphire Rapids Xeon with AMX, an
EPYC with AVX-512 and no AMX, an Orin's arm64 cores), and the setting is checked where it lands:
in the model params of a real llama.cpp model that then decodes, in the engine's recorded info,
and in the server that LocalServer starts.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from robot_latency import llama_load
from robot_latency.engines import GenerationRequest, StopReason, create_engine
from robot_latency.engines.llama_server import LocalServer
from robot_latency.hostcheck import OK, WARN, check_cpu
from robot_latency.llama_load import (
    LlamaLoadError,
    load_policy,
    open_llama,
    read_cpu_features,
)
from robot_latency.models.bundled import bundled_model_path
from robot_latency.profiles.profile import load_planning

FIXTURES = Path(__file__).parent / "fixtures" / "cpuinfo"
XEON = FIXTURES / "xeon-amx.txt"
EPYC = FIXTURES / "epyc-avx512.txt"
ORIN = FIXTURES / "orin-arm64.txt"
#: llama.cpp's system info of a native build on each.
INFO_NATIVE_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
INFO_NO_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | REPACK = 1 |"


def test_flags_read_from_each_kind_of_cpuinfo() -> None:
    xeon, epyc, orin = (read_cpu_features(p) for p in (XEON, EPYC, ORIN))
    assert xeon.amx and {"amx_int8", "amx_tile", "avx512f"} <= xeon.flags
    assert not epyc.amx and "avx512f" in epyc.flags
    assert not orin.amx and {"asimd", "asimddp"} <= orin.flags
    assert "amx_int8" in xeon.reported() and "avx2" in epyc.reported()
    missing = read_cpu_features(FIXTURES / "absent.txt")
    assert missing.flags == frozenset() and "absent.txt" in missing.source


def test_amx_turns_the_extra_buffer_types_off_and_only_amx() -> None:
    amx_cpu = load_policy(features=read_cpu_features(XEON), system_info=INFO_NO_AMX)
    assert not amx_cpu.use_extra_bufts and "amx_int8" in amx_cpu.reason
    amx_build = load_policy(features=read_cpu_features(EPYC), system_info=INFO_NATIVE_AMX)
    assert not amx_build.use_extra_bufts and "AMX_INT8 = 1" in amx_build.reason
    for path in (EPYC, ORIN):
        kept = load_policy(features=read_cpu_features(path), system_info=INFO_NO_AMX)
        assert kept.use_extra_bufts and "REPACK kept" in kept.reason
    forced = load_policy("on", features=read_cpu_features(XEON), system_info=INFO_NATIVE_AMX)
    assert forced.use_extra_bufts
    assert not load_policy("off", features=read_cpu_features(EPYC),
                           system_info=INFO_NO_AMX).use_extra_bufts
    with pytest.raises(LlamaLoadError, match="extra_bufts='sometimes'"):
        load_policy("sometimes")


@pytest.mark.parametrize("use", [True, False])
def test_the_setting_reaches_llama_cpp_and_the_model_decodes(use: bool) -> None:
    policy = load_policy("on" if use else "off")
    llm = open_llama(policy, model_path=str(bundled_model_path()), n_ctx=128, verbose=False)
    try:
        assert bool(llm.model_params.use_extra_bufts) is use
        out = llm.create_completion("pick up the red cup <plan>", max_tokens=6, temperature=0.0)
        assert out["choices"][0]["text"].startswith("<")
    finally:
        llm.close()
    # The patch is gone after the load: a plain Llama gets llama.cpp's own default again.
    import llama_cpp

    assert llama_cpp.llama_model_default_params().use_extra_bufts


def test_engine_on_a_faked_amx_cpu_loads_without_them_and_plans(monkeypatch) -> None:
    monkeypatch.setattr(llama_load, "CPUINFO_PATH", XEON)
    planning = load_planning(None)
    engine = create_engine("llamacpp", n_threads=1, max_new_tokens=planning.max_tokens)
    try:
        assert not engine.llm.model_params.use_extra_bufts
        info = engine.info()
        assert info["extra_bufts"] == "auto" and not info["load_policy"]["use_extra_bufts"]
        prompt = planning.build("pick up the red cup")
        trace = engine.generate(GenerationRequest(
            prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
            grammar=planning.contract.grammar, complete=planning.contract.kind))
        assert trace.stop_reason in (StopReason.DONE, StopReason.COMPLETE)
        assert planning.contract.parse(trace.text)
    finally:
        engine.close()


def test_bad_extra_bufts_option_names_it() -> None:
    from robot_latency.engines import EngineError

    with pytest.raises(EngineError, match="extra_bufts='maybe'"):
        create_engine("llamacpp", extra_bufts="maybe")


def test_doctor_reports_the_cpu_and_the_setting() -> None:
    warn = check_cpu(XEON, INFO_NATIVE_AMX)
    assert warn.status == WARN and "amx_int8" in warn.detail and "off" in warn.detail
    assert warn.fix
    ok = check_cpu(EPYC, INFO_NO_AMX)
    assert ok.status == OK and "avx512f" in ok.detail and "REPACK kept" in ok.detail
    here = check_cpu()
    assert here.name == "cpu" and "llama.cpp built with" in here.detail


def test_local_server_loads_with_the_policy(tmp_path: Path) -> None:
    server = LocalServer(bundled_model_path(), n_threads=1, extra_bufts="off",
                         log_path=tmp_path / "server.log")
    assert server.command()[2:5] == ["robot_latency.engines.llama_serve", "--extra_bufts",
                                     "off"]
    with server.start():
        import httpx

        reply = httpx.post(server.url + "/completions", timeout=60.0, json={
            "prompt": "stop <plan>", "max_tokens": 4, "temperature": 0.0}).json()
        assert reply["choices"][0]["text"]
    assert "extra buffer types off (asked for)" in server.log_text()


def _llama_calls(path: Path) -> list[int]:
    """Lines of ``Llama(...)`` calls in ``path`` that load weights (not ``vocab_only``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else \
            getattr(node.func, "id", "")
        if name == "Llama" and not any(k.arg == "vocab_only" for k in node.keywords):
            lines.append(node.lineno)
    return lines


def test_every_decoding_llama_goes_through_open_llama(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(root)): _llama_calls(p)
             for d in ("robot_latency", "bench", "test") for p in (root / d).rglob("*.py")}
    found = {k: v for k, v in found.items() if v and k != "robot_latency/llama_load.py"}
    assert found == {}, json.dumps(found)
    # The check itself finds a direct construction.
    probe = tmp_path / "probe.py"
    probe.write_text("import llama_cpp\nllm = llama_cpp.Llama(model_path='x')\n"
                     "tok = llama_cpp.Llama('x', vocab_only=True)\n")
    assert _llama_calls(probe) == [2]
