"""The quantization ladder on small random-weight GGUFs written in tmp_path."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from robot_latency.digest import sha256_file
from robot_latency.engines.greedy import plan_accuracy_by_level
from robot_latency.models import ladder

COMMANDS = ["pick up the red cup", "stop", "go to the kitchen slowly", "hand it to me"]


@pytest.fixture(scope="module")
def tiny_gguf(random_llama_gguf: Callable[..., Path]) -> Callable[..., Path]:
    """Write a random llama GGUF with the planner vocabulary (F32, fan-in scaled, context 128):
    by default 256 wide (rows of 256 and 512, whole K-quant blocks), 2 layers, 4 / 2 heads."""
    return functools.partial(random_llama_gguf, dim=256, ffn_dim=512, n_heads=4, n_kv_heads=2,
                             n_layers=2, matrix_std=None, context_length=128)


def file_types(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_gguf):
    d = tmp_path_factory.mktemp("ladder")
    src = tiny_gguf(d / "tiny.gguf")
    man = ladder.build_ladder(src, d / "cache", quants=("F16", "Q8_0", "Q4_K_M", "Q4_0", "Q2_K"),
                              nthread=2)
    return src, man


def test_levels_built_with_real_types(built) -> None:
    _, man = built
    assert man.quants == ["F16", "Q8_0", "Q4_K_M", "Q4_0", "Q2_K"]
    assert man.built == man.quants
    for q, lv in man.levels.items():
        path = man.path(q)
        assert path.name == f"tiny.{q}.gguf"
        assert path.stat().st_size == lv.bytes
        assert lv.sha256 == sha256_file(path)
        assert lv.tensors == file_types(path)  # recorded types are the file's
        assert sum(lv.tensor_types.values()) == len(lv.tensors)
        assert lv.seconds >= 0
    # Rows of 256 and 512: the main type is the preset's own (no fallback).
    assert man.levels["Q8_0"].tensors["blk.0.ffn_up.weight"] == "Q8_0"
    assert man.levels["Q4_0"].tensors["blk.0.attn_q.weight"] == "Q4_0"
    assert man.levels["Q4_K_M"].tensors["blk.0.ffn_gate.weight"] == "Q4_K"
    assert man.levels["F16"].tensors["blk.0.attn_norm.weight"] == "F32"
    assert man.levels["F16"].tensors["blk.0.attn_k.weight"] == "F16"


def test_bpw_ordering(built) -> None:
    _, man = built
    bpw = {q: lv.effective_bpw for q, lv in man.levels.items()}
    assert bpw["F16"] > bpw["Q8_0"] > bpw["Q4_K_M"] > bpw["Q2_K"]
    assert 15 < bpw["F16"] <= 16.1


def test_manifest_file(built) -> None:
    src, man = built
    data = json.loads(man.manifest_path.read_text())
    assert man.manifest_path.name == "tiny.ladder.json"
    assert data["source_sha256"] == sha256_file(src)
    assert data["quants"] == man.quants
    assert set(data["levels"]["Q4_0"]) >= {"file", "bytes", "sha256", "effective_bpw",
                                           "tensor_types", "tensors", "seconds"}


def test_skip_on_match_and_rebuild_on_change(tmp_path, tiny_gguf) -> None:
    src = tiny_gguf(tmp_path / "m.gguf")
    cache = tmp_path / "cache"
    first = ladder.build_ladder(src, cache, quants=("Q8_0", "Q4_0"))
    assert first.built == ["Q8_0", "Q4_0"]
    mtime = first.path("Q4_0").stat().st_mtime_ns
    again = ladder.build_ladder(src, cache, quants=("Q8_0", "Q4_0"))
    assert again.built == []
    assert again.path("Q4_0").stat().st_mtime_ns == mtime
    # One more level: only it is built; the others stay in the manifest.
    more = ladder.build_ladder(src, cache, quants=("Q4_0", "F16"))
    assert more.built == ["F16"]
    assert more.quants == ["F16", "Q8_0", "Q4_0"]
    # A level file of the wrong size is rebuilt.
    with open(more.path("Q8_0"), "ab") as fh:
        fh.write(b"x")
    fixed = ladder.build_ladder(src, cache, quants=("Q8_0",))
    assert fixed.built == ["Q8_0"]
    # A changed source rebuilds everything asked for and drops the stale levels.
    tiny_gguf(src, seed=1)
    changed = ladder.build_ladder(src, cache, quants=("Q8_0", "Q4_0"))
    assert changed.built == ["Q8_0", "Q4_0"]
    assert changed.quants == ["Q8_0", "Q4_0"]
    assert changed.source_sha256 == sha256_file(src)


def test_k_quant_fallback_recorded(tmp_path, tiny_gguf) -> None:
    # Rows of 128 and 192 are not divisible by 256: llama.cpp falls back from the K-quants.
    src = tiny_gguf(tmp_path / "odd.gguf", dim=128, ffn_dim=192, n_heads=2, n_kv_heads=1)
    man = ladder.build_ladder(src, tmp_path / "cache", quants=("Q4_K_M",))
    lv = man.levels["Q4_K_M"]
    assert lv.tensors == file_types(man.path("Q4_K_M"))
    blk = {t for n, t in lv.tensors.items() if n.startswith("blk.") and "norm" not in n}
    assert not blk & {"Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K"}, blk
    assert blk  # and they are quantized types, recorded as read
    assert "F32" in lv.tensor_types


def test_ladder_model_path_and_bad_quant(tmp_path, monkeypatch, tiny_gguf) -> None:
    src = tiny_gguf(tmp_path / "p.gguf")
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "rl"))
    assert ladder.default_cache_dir() == tmp_path / "rl" / "models"
    path = ladder.ladder_model_path(str(src), "q4_0")
    assert path == tmp_path / "rl" / "models" / "p.Q4_0.gguf"
    assert path.is_file()
    with pytest.raises(ladder.LadderError, match="valid: F32, F16, Q8_0"):
        ladder.ladder_model_path(str(src), "Q4_K_X")
    with pytest.raises(ladder.LadderError, match="unknown inflated model"):
        ladder.ladder_model_path("planner-inflated-nope", "F16")
    with pytest.raises(ladder.LadderError, match="unknown model"):
        ladder.ladder_model_path(str(tmp_path / "missing.gguf"), "F16")


def test_a_built_level_is_found_again_without_reading_a_gguf(tmp_path, monkeypatch,
                                                             tiny_gguf) -> None:
    """The check of a built level on a later call takes the source's facts and digest as
    remembered (path, size, mtime), and still rebuilds a level whose file changed size."""
    from robot_latency import digest
    from robot_latency.floor import factstore, ggufinfo

    src = tiny_gguf(tmp_path / "p.gguf")
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "rl"))
    monkeypatch.setattr(factstore, "REMEMBER_METADATA_BYTES", 0)
    monkeypatch.setattr(digest, "REMEMBER_BYTES", 0)
    path = ladder.ladder_model_path(str(src), "Q4_0")
    reads: list[str] = []
    real_reader = ggufinfo.GGUFReader

    def counted(p, *args, **kwargs):
        reads.append(str(p))
        return real_reader(p, *args, **kwargs)

    monkeypatch.setattr(ggufinfo, "GGUFReader", counted)
    monkeypatch.setattr(ggufinfo, "_FACTS_CACHE", {})  # as another process would start
    assert ladder.ladder_model_path(str(src), "Q4_0") == path
    assert reads == []
    with open(path, "ab") as fh:
        fh.write(b"x")
    assert ladder.ladder_model_path(str(src), "Q4_0") == path
    assert reads == [str(path)]  # rebuilt, and the new file read for its types


def test_plan_accuracy_by_level(built) -> None:
    _, man = built
    acc = plan_accuracy_by_level(man, COMMANDS, reference="F16")
    assert list(acc) == man.quants
    assert acc["F16"] == 1.0
    assert all(0.0 <= a <= 1.0 for a in acc.values())
    src_acc = plan_accuracy_by_level(man, COMMANDS[:2], reference="source")
    assert src_acc["F16"] == 1.0  # F32 -> F16 keeps these greedy plans


def test_cli_models_build_and_synth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from robot_latency.cli import main

    cache = tmp_path / "cache"
    assert main(["models", "build", "--cache-dir", str(cache), "--quants", "F16,Q4_0",
                 "--inflate", ""]) == 0
    out = capsys.readouterr().out
    assert "planner.Q4_0.gguf" in out and (cache / "planner.Q4_0.gguf").is_file()
    assert main(["models", "build", "--cache-dir", str(cache), "--quants", "F16,Q4_0",
                 "--inflate", ""]) == 0
    assert "nothing (all current)" in capsys.readouterr().out
    synth_out = tmp_path / "s.gguf"
    assert main(["models", "synth", "--shape", "smollm2-135m", "--quant", "Q4_0",
                 "--out", str(synth_out)]) == 0
    assert "noise" in capsys.readouterr().out and synth_out.stat().st_size > 50e6
    assert main(["models", "build", "--cache-dir", str(cache), "--quants", "Q9"]) == 2
