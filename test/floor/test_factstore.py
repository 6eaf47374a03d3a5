"""A GGUF file's facts are remembered across processes, and read again once the file changes.

The files are the tiny llama GGUFs of test/conftest.py (100 tokens: metadata far under the size
that is remembered, so the tests that need remembering lower the bar, as test_digest does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from robot_latency.floor import factstore, ggufinfo
from robot_latency.floor.ggufinfo import facts_from_gguf
from robot_latency.floor.modelfacts import ModelFacts


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store in tmp_path that remembers every file; nothing read earlier in this process."""
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(factstore, "REMEMBER_METADATA_BYTES", 0)
    monkeypatch.setattr(ggufinfo, "_FACTS_CACHE", {})
    return tmp_path / "cache" / "modelfacts"


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget what this process read, as another process would not know it."""
    monkeypatch.setattr(ggufinfo, "_FACTS_CACHE", {})


def _entry(store: Path) -> Path:
    (entry,) = store.glob("*.json")
    return entry


def _rename_in_entry(store: Path, name: str) -> None:
    """Change the remembered name: what comes back from the store, not from the file, shows."""
    entry = _entry(store)
    doc = json.loads(entry.read_text())
    doc["facts"]["name"] = name
    entry.write_text(json.dumps(doc))


def _full_read(path: Path, kv_dtype: str = "f16") -> ModelFacts:
    facts, _ = ggufinfo._facts_from_file(str(path), path.stat().st_size, kv_dtype)
    return facts


def test_remembered_facts_equal_the_full_read(
        tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch,
        tiny_llama_gguf: Callable[..., Path]) -> None:
    path = tiny_llama_gguf(tmp_path / "q8.gguf", matrix_type=gguf.GGMLQuantizationType.Q8_0,
                           embd_type=gguf.GGMLQuantizationType.F16,
                           file_type=gguf.LlamaFileType.MOSTLY_Q8_0)
    first = facts_from_gguf(path)
    assert first == _full_read(path)
    assert _entry(store).is_file()
    _new_process(monkeypatch)
    again = facts_from_gguf(path)
    assert again == first  # every field, the per-tensor table included
    assert again.tensors and again.tensors == first.tensors
    assert again.to_dict(include_tensors=True) == first.to_dict(include_tensors=True)
    # It came from the store: a changed entry shows, in this process and in another.
    _rename_in_entry(store, "from the store")
    _new_process(monkeypatch)
    assert facts_from_gguf(path) == dataclasses.replace(first, name="from the store")
    code = ("import sys; from robot_latency.floor.ggufinfo import facts_from_gguf; "
            "print(facts_from_gguf(sys.argv[1]).name)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         check=True, env={**os.environ}).stdout.strip()
    assert out == "from the store"
    # The path recorded is the one asked for, and each cache type is its own entry.
    _new_process(monkeypatch)
    relative = os.path.relpath(path)
    assert facts_from_gguf(relative).path == relative
    q8 = facts_from_gguf(path, kv_dtype="q8_0")
    assert q8 == _full_read(path, "q8_0") and q8.kv_bytes_per_token < first.kv_bytes_per_token
    assert len(list(store.glob("*.json"))) == 2
    # The oldest entries go once there are more than MAX_ENTRIES.
    monkeypatch.setattr(factstore, "MAX_ENTRIES", 1)
    facts_from_gguf(tiny_llama_gguf(tmp_path / "other.gguf", tied=True))
    assert len(list(store.glob("*.json"))) == 1


def test_a_changed_file_is_read_again(tmp_path: Path, store: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      tiny_llama_gguf: Callable[..., Path]) -> None:
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    first = facts_from_gguf(path)
    # A new modification time (same size, same bytes): read again, the entry rewritten.
    _rename_in_entry(store, "stale")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _new_process(monkeypatch)
    assert facts_from_gguf(path) == first
    assert json.loads(_entry(store).read_text())["facts"]["name"] == first.name
    # Another size (bytes appended after the tensor data), the mtime put back: read again.
    _rename_in_entry(store, "stale")
    mtime_ns = path.stat().st_mtime_ns
    with open(path, "ab") as fh:
        fh.write(b"\0" * 64)
    os.utime(path, ns=(st.st_atime_ns, mtime_ns))
    _new_process(monkeypatch)
    assert facts_from_gguf(path) == first
    # Another file written at the same path: its own facts, not the remembered ones.
    tiny_llama_gguf(path, tied=True)
    _new_process(monkeypatch)
    tied = facts_from_gguf(path)
    assert tied.tied_embeddings and not first.tied_embeddings
    assert tied == _full_read(path)
    # An entry that is not JSON, or has lost a field: read again, never an error.
    _entry(store).write_text("{not json")
    _new_process(monkeypatch)
    assert facts_from_gguf(path) == tied
    doc = json.loads(_entry(store).read_text())
    del doc["facts"]["n_layers"]
    _entry(store).write_text(json.dumps(doc))
    _new_process(monkeypatch)
    assert facts_from_gguf(path) == tied


def test_small_metadata_is_read_each_time_and_a_bad_store_costs_only_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tiny_llama_gguf: Callable[..., Path]) -> None:
    path = tiny_llama_gguf(tmp_path / "m.gguf")
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ggufinfo, "_FACTS_CACHE", {})
    facts = facts_from_gguf(path)  # 100 tokens: under REMEMBER_METADATA_BYTES
    assert not (tmp_path / "cache").exists()
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(blocked))
    monkeypatch.setattr(factstore, "REMEMBER_METADATA_BYTES", 0)
    _new_process(monkeypatch)
    assert facts_from_gguf(path) == facts
