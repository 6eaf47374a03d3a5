"""A GGUF file's facts remembered across processes, by the file's path, size and mtime.

gguf's reader parses every metadata array into numpy views, one per element: a 151,936-token
vocabulary (tokens, scores and token types) takes 7-9 s on a 2-core host at load 2 and over a
minute on a busy one, and ``predict --stream`` reads each level's file again, as does the
ladder's check of its source. The facts of a file whose metadata is at least
:data:`REMEMBER_METADATA_BYTES` long are therefore written to
``<cache root>/modelfacts/<key digest>.json`` (the cache root of :mod:`robot_latency.digest`),
keyed like a remembered digest: the file's absolute and real path, its size and its modification
time in ns, the KV cache type, and the digest of the code that read them (this module,
:mod:`~robot_latency.floor.ggufinfo` and :mod:`~robot_latency.floor.modelfacts`, and the gguf
package's version). A file written again gets a new mtime and is read again; so is every file
after that code changes. A file with small metadata (the shipped planner's 799 tokens: 50 ms to
read) is read each time: that costs little, and keeps the store to the files it saves time on.
An entry that cannot be read or written costs only time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from robot_latency.digest import cache_root
from robot_latency.floor.errors import ModelInfoError
from robot_latency.floor.modelfacts import ModelFacts, TensorInfo

__all__ = ["MAX_ENTRIES", "REMEMBER_METADATA_BYTES", "recall", "remember", "store_dir"]

logger = logging.getLogger(__name__)

#: Files whose header, metadata and tensor table take at least this many bytes are remembered
#: (a 151,936-token vocabulary padded with ``<unused_N>`` is 4.6 MB of it; the shipped planner's
#: 799 tokens and 39 tensors 21 kB).
REMEMBER_METADATA_BYTES = 256 << 10
#: Entries kept (the least recently written are removed first).
MAX_ENTRIES = 256
_FORMAT = 1


def store_dir() -> Path:
    """Where remembered facts live: ``<cache root>/modelfacts``."""
    return cache_root() / "modelfacts"


_CODE_DIGEST: dict[str, str | None] = {}


def _code_digest() -> str | None:
    """The digest of the code the facts are read by (once per process); None: unreadable, and
    nothing is remembered."""
    if "code" not in _CODE_DIGEST:
        here = Path(__file__).parent
        h = hashlib.sha256()
        try:
            for name in ("ggufinfo.py", "modelfacts.py", Path(__file__).name):
                h.update((here / name).read_bytes())
        except OSError as err:
            logger.debug("facts not remembered: cannot read the reader's code (%s)", err)
            _CODE_DIGEST["code"] = None
            return None
        try:
            h.update(importlib.metadata.version("gguf").encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(b"gguf, version unknown")
        _CODE_DIGEST["code"] = h.hexdigest()
    return _CODE_DIGEST["code"]


def _key(path: str, stat: os.stat_result, kv_dtype: str) -> dict[str, Any]:
    return {"format": _FORMAT, "path": os.path.abspath(path), "real_path": os.path.realpath(path),
            "size_bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "kv_dtype": kv_dtype.strip().lower(), "code": _code_digest()}


def _entry_path(path: str, kv_dtype: str) -> Path:
    # One entry per file and cache type: a file written again replaces its own entry.
    name = json.dumps([os.path.abspath(path), kv_dtype.strip().lower()])
    return store_dir() / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.json"


def _to_json(facts: ModelFacts) -> dict[str, Any]:
    return dataclasses.asdict(facts)


def _from_json(doc: dict[str, Any]) -> ModelFacts:
    tensors = tuple(TensorInfo(name=str(t["name"]), ggml_type=str(t["ggml_type"]),
                               shape=tuple(int(d) for d in t["shape"]),
                               n_elements=int(t["n_elements"]), n_bytes=int(t["n_bytes"]))
                    for t in doc["tensors"])
    return ModelFacts(**{**doc, "tensors": tensors,
                         "tensor_types": {str(k): int(v) for k, v in doc["tensor_types"].items()}})


def recall(path: str, stat: os.stat_result, kv_dtype: str) -> ModelFacts | None:
    """Return the facts remembered for ``path`` as it is now (``stat``), or None."""
    if _code_digest() is None:
        return None
    entry = _entry_path(path, kv_dtype)
    try:
        doc = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != _key(path, stat, kv_dtype):
        return None
    try:
        facts = _from_json(doc["facts"])
    except (KeyError, TypeError, ValueError, AttributeError, ModelInfoError) as err:
        logger.debug("%s: unreadable remembered facts (%r); reading %s again", entry, err, path)
        return None
    return dataclasses.replace(facts, path=path)


def remember(path: str, stat: os.stat_result, kv_dtype: str, facts: ModelFacts) -> None:
    """Write the facts of ``path`` as it was when read (``stat``, taken before the read)."""
    if _code_digest() is None:
        return
    store = store_dir()
    doc = {"key": _key(path, stat, kv_dtype), "facts": _to_json(facts)}
    with contextlib.suppress(OSError):  # a store that cannot be written costs only time
        store.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=store, prefix=".facts-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, _entry_path(path, kv_dtype))
        entries = sorted(store.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
