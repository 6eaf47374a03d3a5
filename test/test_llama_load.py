"""llama.cpp's load setting per build: extra buffer types off where the build has AMX kernels.

The decision is checked on fixture /proc/cpuinfo files (a Sapphire Rapids Xeon with AMX, an EPYC
with AVX-512 and no AMX, an Orin's arm64 cores) against system-info lines of builds with and
without AMX kernels, and the setting is checked where it lands: in the model params of a real
llama.cpp model that then decodes, in the engine's recorded info, in the server that LocalServer
starts, and in the installed (portable) build loading quantized levels with REPACK on under a
faked AMX CPU.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from robot_latency import llama_load
from robot_latency.engines import GenerationRequest, StopReason, create_engine
from robot_latency.engines.llama_server import LocalServer
from robot_latency.hostcheck import OK, WARN, check_cpu
from robot_latency.llama_load import (
    LlamaLoadError,
    build_has_amx,
    llama_system_info,
    load_policy,
    open_llama,
    read_cpu_features,
)
from robot_latency.models import ladder
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


def test_only_a_build_with_amx_kernels_turns_the_extra_buffer_types_off() -> None:
    amx_build = load_policy(features=read_cpu_features(XEON), system_info=INFO_NATIVE_AMX)
    assert not amx_build.use_extra_bufts and "AMX_INT8 = 1" in amx_build.reason
    # The crash is in the build's AMX kernels: the same AMX CPU with a build without them (the
    # portable one) keeps REPACK, and says why.
    portable = load_policy(features=read_cpu_features(XEON), system_info=INFO_NO_AMX)
    assert portable.use_extra_bufts and "REPACK kept" in portable.reason
    assert "amx_int8" in portable.reason and "no AMX kernels" in portable.reason
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


def _needs_a_build_without_amx_kernels() -> None:
    if build_has_amx(llama_system_info()):
        pytest.skip("the installed llama.cpp has AMX kernels (a native build on an AMX CPU); "
                    "the portable build (make install) has none")


def test_engine_on_a_faked_amx_cpu_keeps_them_with_the_portable_build_and_plans(
        monkeypatch) -> None:
    _needs_a_build_without_amx_kernels()
    monkeypatch.setattr(llama_load, "CPUINFO_PATH", XEON)
    planning = load_planning(None)
    engine = create_engine("llamacpp", n_threads=1, max_new_tokens=planning.max_tokens)
    try:
        assert engine.llm.model_params.use_extra_bufts
        info = engine.info()
        assert info["extra_bufts"] == "auto" and info["load_policy"]["use_extra_bufts"]
        assert "amx_int8" in info["load_policy"]["reason"]
        prompt = planning.build("pick up the red cup")
        trace = engine.generate(GenerationRequest(
            prompt=prompt.suffix, prefix=prompt.prefix, max_tokens=planning.max_tokens,
            grammar=planning.contract.grammar, complete=planning.contract.kind))
        assert trace.stop_reason in (StopReason.DONE, StopReason.COMPLETE)
        assert planning.contract.parse(trace.text)
    finally:
        engine.close()


#: The child: the CPU's flags read from the fixture of an AMX Xeon, the engine built as the planner
#: builds it ("auto"), one generation; a crash in decode ends this child, not the test run.
FAKED_AMX_CHILD = """
import json, sys
from pathlib import Path
from robot_latency import llama_load
from robot_latency.engines import GenerationRequest, create_engine
llama_load.CPUINFO_PATH = Path(sys.argv[2])
engine = create_engine("llamacpp", model_path=sys.argv[1], n_threads=1, max_new_tokens=8)
trace = engine.generate(GenerationRequest(prompt="pick up the red cup <plan>", max_tokens=8))
print(json.dumps({"use": bool(engine.llm.model_params.use_extra_bufts),
                  "tokens": len(trace.token_ns), "error": trace.error,
                  "reason": engine.info()["load_policy"]["reason"]}))
engine.close()
"""


@pytest.fixture(scope="module")
def repack_levels(tmp_path_factory, random_llama_gguf) -> dict[str, Path]:
    """Q4_0 and Q8_0 levels (the types REPACK relayouts) of a random llama with 256-wide rows."""
    d = tmp_path_factory.mktemp("repack")
    write = functools.partial(random_llama_gguf, dim=256, ffn_dim=512, n_heads=4, n_kv_heads=2,
                              n_layers=2, matrix_std=None, context_length=512)
    man = ladder.build_ladder(write(d / "tiny.gguf"), d / "cache", quants=("Q4_0", "Q8_0"),
                              nthread=1)
    return {quant: man.cache_dir / level.file for quant, level in man.levels.items()}


@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0"])
def test_portable_build_decodes_quantized_levels_with_repack_on_a_faked_amx_cpu(
        repack_levels: dict[str, Path], quant: str) -> None:
    _needs_a_build_without_amx_kernels()
    done = subprocess.run([sys.executable, "-c", FAKED_AMX_CHILD, str(repack_levels[quant]),
                           str(XEON)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"{quant}: the child ended with {done.returncode} (negative: the signal that killed "
        f"it): {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["use"] and "amx_int8" in out["reason"], out
    assert out["error"] is None and out["tokens"] >= 1, out


def test_bad_extra_bufts_option_names_it() -> None:
    from robot_latency.engines import EngineError

    with pytest.raises(EngineError, match="extra_bufts='maybe'"):
        create_engine("llamacpp", extra_bufts="maybe")


def test_doctor_reports_the_cpu_the_build_and_the_setting() -> None:
    warn = check_cpu(XEON, INFO_NATIVE_AMX)
    assert warn.status == WARN and "AMX_INT8" in warn.detail and "off" in warn.detail
    assert "make install (the portable build)" in warn.fix
    # The portable build installed on the AMX CPU: REPACK kept, nothing to install.
    portable = check_cpu(XEON, INFO_NO_AMX)
    assert portable.status == OK and "amx_int8" in portable.detail
    assert "no AMX kernels" in portable.detail and "REPACK kept" in portable.detail
    assert "make install" not in portable.line()
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
