"""The one file digest the project records (model files, ladders, exports, run manifests)."""

from __future__ import annotations

import hashlib
import os

#: Read size: large enough that a 500 MB GGUF hashes at disk speed, small enough to stay cheap.
CHUNK_BYTES = 1 << 22


def sha256_file(path: str | os.PathLike[str], *, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Return the hex sha256 of a file's bytes, read in chunks.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()
