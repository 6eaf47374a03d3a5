"""The one file digest the project records (model files, ladders, exports, run manifests).

A large file's digest is remembered across processes in ``<cache root>/digests.json`` (the
cache root of the model cache and the host probe: ``$ROBOT_LATENCY_CACHE_DIR``, else
``$XDG_CACHE_HOME/robot_latency``, else ``~/.cache/robot_latency``), keyed by the file's real
path, size and modification time in ns: a file written again gets a new mtime and is hashed
again. Hashing a 1.2 GB GGUF took seconds quiet and over a minute on a busy host, on every
resolve of a ladder level and every untimed-pass key; a file under :data:`REMEMBER_BYTES` is
always hashed, as it costs less than reading the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path

#: Read size: large enough that a 500 MB GGUF hashes at disk speed, small enough to stay cheap.
CHUNK_BYTES = 1 << 22
#: Files at least this large have their digest remembered.
REMEMBER_BYTES = 64 << 20
#: Entries kept in the cache file (the newest win).
MAX_ENTRIES = 512


def cache_root() -> Path:
    """The project's user cache root (the model cache is its ``models/``)."""
    explicit = os.environ.get("ROBOT_LATENCY_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "robot_latency"


def _hash(path: str | os.PathLike[str], chunk_bytes: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def _load(cache: Path) -> dict[str, list]:
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sha256_file(path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Return the hex sha256 of a file's bytes, read in chunks (remembered for large files).

    Raises:
        OSError: the file cannot be read.
    """
    stat = os.stat(path)
    if stat.st_size < REMEMBER_BYTES:
        return _hash(path, chunk_bytes)
    key = os.path.realpath(path)
    cache = cache_root() / "digests.json"
    entry = _load(cache).get(key)
    if isinstance(entry, list) and entry[:2] == [stat.st_size, stat.st_mtime_ns]:
        return str(entry[2])
    digest = _hash(path, chunk_bytes)
    with contextlib.suppress(OSError):  # a cache that cannot be written costs only time
        cache.parent.mkdir(parents=True, exist_ok=True)
        data = _load(cache)
        data.pop(key, None)
        data[key] = [stat.st_size, stat.st_mtime_ns, digest]
        keep = dict(list(data.items())[-MAX_ENTRIES:])
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=".digests-", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(keep, fh)
        os.replace(tmp, cache)
    return digest
