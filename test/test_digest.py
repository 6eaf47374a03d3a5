"""A large file's digest is remembered across processes, and hashed again once it changes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from robot_latency import digest


def test_large_file_digest_is_remembered_until_the_file_changes(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest, "REMEMBER_BYTES", 1024)
    f = tmp_path / "model.gguf"
    f.write_bytes(b"a" * 4096)
    first = digest.sha256_file(f)
    assert first == hashlib.sha256(b"a" * 4096).hexdigest()
    entries = json.loads((tmp_path / "cache" / "digests.json").read_text())
    assert entries[os.path.realpath(f)][2] == first
    # Another process finds it in the cache: its entry is taken, not the file re-read.
    entries[os.path.realpath(f)][2] = "0" * 64
    (tmp_path / "cache" / "digests.json").write_text(json.dumps(entries))
    code = ("import sys; from robot_latency import digest; digest.REMEMBER_BYTES = 1024; "
            "print(digest.sha256_file(sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True,
                         check=True, env={**os.environ}).stdout.strip()
    assert out == "0" * 64
    # Written again (same size, new mtime): hashed again, the cache corrected.
    f.write_bytes(b"b" * 4096)
    os.utime(f, ns=(os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns + 10**9))
    assert digest.sha256_file(f) == hashlib.sha256(b"b" * 4096).hexdigest()


def test_small_files_and_an_unwritable_cache(tmp_path: Path, monkeypatch) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    monkeypatch.setenv("ROBOT_LATENCY_CACHE_DIR", str(blocked))
    monkeypatch.setattr(digest, "REMEMBER_BYTES", 1024)
    f = tmp_path / "m.bin"
    f.write_bytes(b"c" * 2048)
    assert digest.sha256_file(f) == hashlib.sha256(b"c" * 2048).hexdigest()
    small = tmp_path / "s.bin"
    small.write_bytes(b"d")
    assert digest.sha256_file(small) == hashlib.sha256(b"d").hexdigest()
