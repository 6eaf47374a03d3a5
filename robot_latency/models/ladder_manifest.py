"""A quantization ladder's records and files: its levels, its manifest and where they live.

One ladder is ``<cache_dir>/<name>.<QUANT>.gguf`` per level and ``<cache_dir>/<name>.ladder.json``
(:class:`LadderManifest`); this module names the levels, reads and writes the manifest and says
where the model cache is. Building the levels and resolving a model name to one is
:mod:`robot_latency.models.ladder`.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robot_latency.digest import cache_root
from robot_latency.errors import RobotLatencyError

__all__ = [
    "LADDER",
    "VALID_QUANTS",
    "LadderError",
    "LadderLevel",
    "LadderManifest",
    "default_cache_dir",
    "level_path",
    "llama_cpp_version",
    "load_ladder_manifest",
    "manifest_path",
    "normalize_quant",
]

logger = logging.getLogger(__name__)

LADDER: tuple[str, ...] = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
"""The levels ``robot-latency models build`` makes, highest precision first."""

VALID_QUANTS: tuple[str, ...] = ("F32", *LADDER)
"""Every level name the ladder accepts (F32 as well, for exact comparisons)."""

_MANIFEST_VERSION = 1


class LadderError(RobotLatencyError, RuntimeError):
    """A ladder level cannot be built, found or evaluated."""


@dataclass(frozen=True)
class LadderLevel:
    """One built level of the ladder.

    Attributes:
        quant: the llama.cpp preset name (``Q4_K_M``).
        file: the file name, relative to the cache directory.
        bytes: file size.
        sha256: file hash.
        effective_bpw: ``8 * tensor bytes / params`` read from the file (facts_from_gguf).
        tensor_types: ``{ggml type: tensors of that type}``, read back from the file.
        tensor_type_bytes: ``{ggml type: bytes of that type}``, read back from the file.
        tensors: ``{tensor name: ggml type}``, read back from the file.
        seconds: wall time the build took (0 when the level is the source itself).
    """

    quant: str
    file: str
    bytes: int
    sha256: str
    effective_bpw: float
    tensor_types: dict[str, int]
    tensor_type_bytes: dict[str, int]
    tensors: dict[str, str]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "quant": self.quant,
            "file": self.file,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "effective_bpw": self.effective_bpw,
            "tensor_types": dict(self.tensor_types),
            "tensor_type_bytes": dict(self.tensor_type_bytes),
            "tensors": dict(self.tensors),
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LadderLevel:
        """Rebuild a level from :meth:`to_dict`'s output."""
        return cls(
            quant=str(data["quant"]),
            file=str(data["file"]),
            bytes=int(data["bytes"]),
            sha256=str(data["sha256"]),
            effective_bpw=float(data["effective_bpw"]),
            tensor_types={str(k): int(v) for k, v in data["tensor_types"].items()},
            tensor_type_bytes={
                str(k): int(v) for k, v in data.get("tensor_type_bytes", {}).items()
            },
            tensors={str(k): str(v) for k, v in data.get("tensors", {}).items()},
            seconds=float(data["seconds"]),
        )


@dataclass
class LadderManifest:
    """A ladder: the source and its built levels.

    Attributes:
        name: file-name stem of every level (``planner``).
        cache_dir: where the levels and the manifest live.
        source: the source GGUF path.
        source_sha256: its hash when the levels were built.
        source_bytes: its size.
        levels: built levels by quant name, in ladder order.
        built: levels this call built (not saved; empty when everything was reused).
    """

    name: str
    cache_dir: Path
    source: str
    source_sha256: str
    source_bytes: int
    levels: dict[str, LadderLevel] = field(default_factory=dict)
    built: list[str] = field(default_factory=list)

    @property
    def manifest_path(self) -> Path:
        """Return ``<cache_dir>/<name>.ladder.json``."""
        return manifest_path(self.cache_dir, self.name)

    @property
    def quants(self) -> list[str]:
        """Return the built levels, highest precision first."""
        return list(self.levels)

    def path(self, quant: str) -> Path:
        """Return the file of a built level.

        Raises:
            LadderError: the level is not built.
        """
        q = normalize_quant(quant)
        if q not in self.levels:
            raise LadderError(f"{self.manifest_path}: level {q} not built (built: {self.quants})")
        return self.cache_dir / self.levels[q].file

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest as JSON-ready data (what ``<name>.ladder.json`` holds)."""
        return {
            "version": _MANIFEST_VERSION,
            "name": self.name,
            "source": self.source,
            "source_sha256": self.source_sha256,
            "source_bytes": self.source_bytes,
            "llama_cpp_python": llama_cpp_version(),
            "quants": self.quants,
            "levels": {q: lv.to_dict() for q, lv in self.levels.items()},
        }

    def save(self) -> Path:
        """Write the manifest atomically; return its path."""
        path = self.manifest_path
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n")
        os.replace(tmp, path)
        return path


def normalize_quant(quant: str) -> str:
    """Return the canonical level name (``q4_k_m`` -> ``Q4_K_M``).

    Raises:
        LadderError: not a ladder level; the message lists the valid names.
    """
    q = str(quant).strip().upper()
    if q not in VALID_QUANTS:
        raise LadderError(f"unknown quant {quant!r}; valid: {', '.join(VALID_QUANTS)}")
    return q


def manifest_path(cache_dir: str | Path, name: str) -> Path:
    """Return ``<cache_dir>/<name>.ladder.json``."""
    return Path(cache_dir) / f"{name}.ladder.json"


def level_path(cache_dir: str | Path, name: str, quant: str) -> Path:
    """Return ``<cache_dir>/<name>.<QUANT>.gguf``."""
    return Path(cache_dir) / f"{name}.{normalize_quant(quant)}.gguf"


def default_cache_dir() -> Path:
    """Return the model cache directory.

    ``$ROBOT_LATENCY_CACHE_DIR/models``, else ``$XDG_CACHE_HOME/robot_latency/models``, else
    ``~/.cache/robot_latency/models`` (the same root as the host-probe cache).
    """
    return cache_root() / "models"


def llama_cpp_version() -> str | None:
    """Return the installed llama-cpp-python's version, None where it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(getattr(llama_cpp, "__version__", None))


def load_ladder_manifest(cache_dir: str | Path, name: str) -> LadderManifest | None:
    """Read ``<cache_dir>/<name>.ladder.json``; None when absent or unreadable."""
    path = manifest_path(cache_dir, name)
    try:
        data = json.loads(path.read_text())
        if data.get("version") != _MANIFEST_VERSION:
            return None
        return LadderManifest(
            name=str(data["name"]),
            cache_dir=Path(cache_dir),
            source=str(data["source"]),
            source_sha256=str(data["source_sha256"]),
            source_bytes=int(data["source_bytes"]),
            levels={q: LadderLevel.from_dict(lv) for q, lv in data["levels"].items()},
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("ignoring unreadable ladder manifest %s: %s", path, err)
        return None

